#!/usr/bin/env bash
# The H100 runs behind reports/zucchet-2023/{table-2,table-1,figure-3b}.md, reports/blogpost-2024/figure-8.md and
# reports/engineering/train-throughput-h100.md (commit da4c9af), stage by stage, from the repo root:
#   check                      CUDA-graph tests + benchmarks/train_throughput.py on cuda
#   launch STEPS_FIG3 STEPS_TS  the long sweeps, in the background (setsid), logs in /tmp/gpu-runs
#   status                     each run's step (from its resumable state) and the logs' tails
#   collect                    the finished checkpoints (no training states) as $OUT/runs.tar.gz
# The image's python3 has torch; pydantic, datasets (and pyarrow ≥ 24 where older) travel as
# wheels in .whl and .whl-pa (pip download for the machine's Python).
set -u
stage=${1:?usage: scripts/gpu_paper_runs.sh check|launch|status|collect}
RUNS=/tmp/gpu-runs
export ICL_ZOO_CACHE=/tmp/zoo-cache MPLBACKEND=Agg PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  python3 -c 'import pyarrow, sys; sys.exit(int(pyarrow.__version__.split(".")[0]) < 24)' \
    || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-pa/*.whl || exit 1
fi
zoo() { python3 -m zoo.cli "$@"; }
mkdir -p $RUNS

case $stage in
check)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, pyarrow, datasets, pydantic; print("torch", torch.__version__, "pyarrow", pyarrow.__version__)'
  python3 -m pytest -q -p no:cacheprovider tests/test_ensemble.py 2>&1 | tee ${OUT:-/tmp}/tests.log | tail -15
  python3 benchmarks/train_throughput.py --device cuda --members 1 8 64 256 --steps 100 2>&1 | tee ${OUT:-/tmp}/throughput.log
  ;;
launch)
  fig3=${2:?steps for figure 3b}; ts=${3:?steps for teacher-student}
  start() { name=$1; shift; setsid nohup bash -c "$(declare -f zoo); $*" >$RUNS/$name.log 2>&1 < /dev/null & }
  start table-2 "zoo sweep sweeps/table-2.toml --out $RUNS/table-2"
  start teacher-student "zoo sweep sweeps/teacher-student.toml --out $RUNS/teacher-student --steps $ts"
  start figure-3b "zoo sweep sweeps/figure-3b.toml --ensemble --out $RUNS/figure-3b --steps $fig3"
  start blogpost "zoo sweep sweeps/comparisons-blogpost.toml --ensemble --out $RUNS/blogpost"
  sleep 5; tail -n 3 $RUNS/*.log
  ;;
status)
  for f in $RUNS/*/.ensembles/*/train_state.json; do
    [ -e "$f" ] && python3 -c "import json,sys; m=json.load(open(sys.argv[1])); h=m['history'][-1] if m['history'] else {}; print(sys.argv[1].split('/')[3], sys.argv[1].split('/')[5], m['step'], h.get('val_loss'))" "$f"
  done
  ls $RUNS/*/results.md 2>/dev/null; tail -n 2 $RUNS/*.log; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  ;;
collect)
  (cd $RUNS && tar czf ${OUT:?}/runs.tar.gz --exclude='.ensembles/*/train_state.safetensors' .)
  ls -la $OUT
  ;;
esac
