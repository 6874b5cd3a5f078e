#!/usr/bin/env bash
# Paper-length versions of results that ran only short on a 2-core CPU: teacher-student d = 4 at 1M steps with the
# paper's ν lr and with 10× it (reports/zucchet-2023/table-1.md), Table 2 with four seeds at the paper's own recipe
# (the -b1 entry, AdamW; table-2.md: its `lease` stage has run, on an H200), Figure 5 over the full size grid
# (figure-5.md), the context-size rows (reports/blogpost-2024/figure-9.md), the GD-SSM baselines, feature dimension
# and sine waves (reports/sushma-tian-2024/), Zucchet's
# Figures 3.A and 3.B below 16 neurons (sweeps/figure-3a.toml, figure-3b-small.toml), Figure 4.A's seeds 1-2 for a
# spread (sweeps/figure-4a.toml; seed 0 of all six students is released at the full 1M steps), the blogpost's depth
# sweeps of Figures 7–8 and 14–16, and Figure 10 at C = 100 (D = 5). Sushma's Figures 1.C at N = N_x and 2.C at
# f = 2, 10, 20 (5 seeds each, 300k steps), Figure 9 at C = 100 and the LRU In+Out student have since run on the CPU.
# From the repo root, stage by stage:
#   lease SECONDS COMMIT  one device call of at most SECONDS (a 15-minute lease): benchmarks/streaming_gpu.py
#             (1,024 streams on CUDA), Table 2 at the paper's recipe (4 seeds, 300k steps); everything comes back
#             under $OUT (unfinished runs with their resumable state). (The GRU d = 6 student it also built has since
#             run its whole recipe on the CPU.)
#             COMMIT is the commit the tree was copied from (the copy has no .git; it goes in provenance).
#             Carry .whl (pydantic and its needs) and .zoo-cache (the frozen splits, verified by hash on load).
#   launch    the sweep processes in the background (setsid), logs in /tmp/gpu-runs
#   status    each ensemble's step (from its resumable state), the logs' tails, GPU use
#   collect   the finished checkpoints (no training states) as $OUT/runs.tar.gz
# Needs pydantic and its needs as wheels in .whl (downloaded with pip download for the machine's Python).
set -u
stage=${1:?usage: scripts/gpu_paper_length_runs.sh launch|status|collect}
RUNS=/tmp/gpu-runs
export ICL_ZOO_CACHE=/tmp/zoo-cache MPLBACKEND=Agg PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
if [ -d .zoo-cache ] && [ ! -d $ICL_ZOO_CACHE ]; then mkdir -p $ICL_ZOO_CACHE && cp -r .zoo-cache/. $ICL_ZOO_CACHE/; fi
zoo() { python3 -m zoo.cli "$@"; }
mkdir -p $RUNS
GDSSM_LR="--set source.lr=3e-3 --set source.recurrent_lr=1.5e-3 --set source.warmup_steps=200"

case $stage in
lease)
  budget=${2:?seconds}; export ICL_ZOO_COMMIT=${3:?commit}; out=${OUT:?}
  start() { name=$1; shift; setsid nohup bash -c "$(declare -f zoo); $*" >$RUNS/$name.log 2>&1 < /dev/null & }
  running() { pgrep -f "zoo.cli $1" > /dev/null; }
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, onnxruntime as o, pyarrow; print("torch", torch.__version__, "onnxruntime", o.__version__, o.get_available_providers(), "pyarrow", pyarrow.__version__)'
    nproc; } 2>&1 | tee $out/device.txt
  timeout 150 python3 benchmarks/streaming_gpu.py --json $out/streaming-gpu.json 2>&1 | tee $out/streaming-gpu.log | tail -n 12
  echo "streaming done at ${SECONDS}s"
  start table-2 "zoo sweep sweeps/table-2-paper-recipe.toml --out $RUNS/table-2-paper-recipe --quiet"
  sleep 20
  while [ $SECONDS -lt $((budget - 30)) ] && running sweep; do sleep 5; done
  echo "table 2 sweep ended or stopped at ${SECONDS}s"
  pkill -f zoo.cli; sleep 3
  for f in $RUNS/*/.ensembles/*/train_state.json; do [ -e "$f" ] && python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(sys.argv[1], m['step'])" "$f"; done
  for f in $RUNS/*.log; do echo "== $f"; tail -c 400 $f | tr "\r" "\n" | tail -n 3; done
  # unfinished runs keep their training state
  (cd $RUNS && tar czf $out/runs.tar.gz --exclude='*.onnx' .)
  ls -la $out; echo "done at ${SECONDS}s"
  ;;
launch)
  start() { name=$1; shift; setsid nohup bash -c "$(declare -f zoo); $*" >$RUNS/$name.log 2>&1 < /dev/null & }
  start ts           "zoo sweep sweeps/teacher-student-d4.toml --out $RUNS/ts --quiet"   # B.1: ν at the lr
  start ts-nu-lr-1e-2 "zoo sweep sweeps/teacher-student-d4.toml --set source.recurrent_lr=1e-2 --out $RUNS/ts-nu-lr-1e-2 --quiet"
  start table-2    "zoo sweep sweeps/table-2-paper-recipe.toml --out $RUNS/table-2-paper-recipe --quiet;
                    zoo sweep sweeps/gd-ssm-feature-dim.toml --steps 100000 --seeds 0 1 2 --out $RUNS/feature-dim --quiet;
                    zoo sweep sweeps/gd-ssm-feature-dim-key.toml --steps 100000 --seeds 0 1 2 --out $RUNS/feature-dim-key --quiet;
                    zoo sweep sweeps/gd-ssm-sine.toml --steps 30000 $GDSSM_LR --out $RUNS/sine --quiet"
  start figure-5   "zoo sweep sweeps/figure-5.toml --ensemble --steps 30000 --out $RUNS/figure-5 --quiet"
  start gd-ssm     "zoo sweep sweeps/gd-ssm.toml --steps 20000 $GDSSM_LR --out $RUNS/gd-ssm --quiet;
                    zoo sweep sweeps/context-size.toml --steps 5000 --out $RUNS/context-size --quiet"
  start figure-3a  "zoo sweep sweeps/figure-3a.toml --out $RUNS/figure-3a --quiet;
                    zoo sweep sweeps/figure-4a.toml --seeds 1 2 --out $RUNS/figure-4a --quiet;
                    zoo sweep sweeps/figure-3b-small.toml --seeds 0 1 2 3 --out $RUNS/figure-3b-small --quiet"
  start blogpost   "zoo sweep sweeps/figure-10-d5.toml --set task.n_context=100 --out $RUNS/figure-10-d5 --quiet;
                    zoo sweep sweeps/figure-7-8.toml --out $RUNS/figure-7-8 --quiet;
                    zoo sweep sweeps/figure-14-16.toml --out $RUNS/figure-14-16 --quiet"
  sleep ${2:-60}; tail -n 3 $RUNS/*.log
  ;;
status)
  sleep ${2:-0}
  for f in $RUNS/*/.ensembles/*/train_state.json; do
    [ -e "$f" ] && python3 -c "import json,sys; m=json.load(open(sys.argv[1])); h=m['history'][-1] if m['history'] else {}; print(*sys.argv[1].split('/')[3:6:2], m['step'], h.get('val_loss'))" "$f"
  done
  for d in $RUNS/*/; do echo "$d: $(ls -d $d*/ 2>/dev/null | wc -l) finished"; done
  tail -n 2 $RUNS/*.log; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  ;;
collect)
  sleep ${2:-0}
  (cd $RUNS && tar czf ${OUT:?}/runs.tar.gz --exclude='.ensembles/*/train_state.safetensors' --exclude='*.onnx' .)
  ls -la $OUT
  ;;
esac
