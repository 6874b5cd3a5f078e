#!/usr/bin/env bash
# Paper-length versions of results that so far ran only short on a 2-core CPU (none of this has run
# yet): teacher-student d = 4 at 1M steps with the paper's ν lr and with 10× it (reports/zucchet-2023/table-1.md),
# Table 2 with four seeds at the paper's own recipe (the -b1 entry, AdamW; table-2.md), Figure 5 over the full size grid (figure-5.md), the context-size
# rows (reports/blogpost-2024/figure-9.md), the GD-SSM baselines, feature dimension and sine waves
# (reports/sushma-tian-2024/), Sushma's Figures 1.C (N = N_x) and 2.C (n_o = f) at the paper's recipe, Zucchet's
# Figures 3.A, 3.B below 16 neurons and 4.A (sweeps/figure-3a.toml, figure-3b-small.toml, figure-4a.toml), and the blogpost's depth sweeps of
# Figures 7–8 and 14–16, and Figures 9–10 at C = 100 (D = 5; under 3.3 steps/s on the CPU).
# From the repo root, stage by stage:
#   launch    the sweep processes in the background (setsid), logs in /tmp/gpu-runs
#   status    each ensemble's step (from its resumable state), the logs' tails, GPU use
#   collect   the finished checkpoints (no training states) as $OUT/runs.tar.gz
# Needs the wheels in .whl (pydantic, datasets; see /work/.library/device/README.md).
set -u
stage=${1:?usage: scripts/gpu_paper_length_runs.sh launch|status|collect}
RUNS=/tmp/gpu-runs
export ICL_ZOO_CACHE=/tmp/zoo-cache MPLBACKEND=Agg PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
zoo() { python3 -m zoo.cli "$@"; }
mkdir -p $RUNS
GDSSM_LR="--set source.lr=3e-3 --set source.recurrent_lr=1.5e-3 --set source.warmup_steps=200"

case $stage in
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
                    zoo sweep sweeps/figure-4a.toml --out $RUNS/figure-4a --quiet;
                    zoo sweep sweeps/figure-3b-small.toml --seeds 0 1 2 3 --out $RUNS/figure-3b-small --quiet"
  start blogpost   "zoo sweep sweeps/figure-10-d5.toml --set task.n_context=100 --out $RUNS/figure-10-d5 --quiet;
                    zoo sweep sweeps/figure-7-8.toml --out $RUNS/figure-7-8 --quiet;
                    zoo sweep sweeps/figure-14-16.toml --out $RUNS/figure-14-16 --quiet"
  start figure-2c  "for f in 2 10 20; do zoo sweep sweeps/gd-ssm-nd-feature-dim.toml --seeds 0 1 2 3 4 --set task.d_x=\$f --set task.d_y=\$f --set arch.value_dim=\$f --set arch.key_dim=\$f --out $RUNS/figure-2c --quiet; done"
  start figure-1c  "for f in 2 5 10 20; do zoo sweep sweeps/gd-ssm-feature-dim-paper.toml --seeds 0 1 2 3 4 --set task.d_x=\$f --set task.n_context=\$f --out $RUNS/figure-1c-paper --quiet; done"
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
