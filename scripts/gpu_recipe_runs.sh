#!/usr/bin/env bash
# One device call (a 15-minute lease, one GPU) that runs, side by side, what the 2-core CPU cannot. Its runs so far:
# at ed3b43a (one H100) the blogpost-sized softmax transformers softmax-tf-{1..5}l-d5-c10 and seeds 0-2 of 1-4 of
# them; at 3b4762a (one H200) those five entries rebuilt from a commit (bit-identical weights, clean provenance)
# and Figure 7's context axis at C = 2 (1-4 layers) and C = 50 (1-2 layers) (reports/blogpost-2024/figure-7.md,
# runs 5 and 6). What it runs now, four runs side by side (one with three workers) and one process per ENTRY:
#   - Zucchet Table 2's paper-recipe entry on the paper's 4 seeds (sweeps/table-2-paper-recipe.toml, one CUDA-graph
#     ensemble, ~3 min on an H200): reports/zucchet-2023/table-2.md's run 6 ran it at ad59605 before checkpoints
#     recorded the GPU's name and with a stale .git beside the copy (its files say "cuda" and d21ec24-dirty);
#     again from a commit, its raw files name the device and the commit;
#   - ENTRIES, if given, rebuilt at their whole recipe from COMMIT with `zoo release build --force`, one process
#     each (none is short of its recipe or built from a dirty tree today: no default);
#   - seeds 1-2 of the 5-layer blogpost-sized softmax transformer (sweeps/figure-7-blogpost-size.toml);
#   - Figure 7's context axis (sweeps/figure-7-depth-context.toml): 5 layers at C = 2 (seeds 0-2), 3-5 layers at
#     C = 50 (seed 0).
# Sixteen training processes on one GPU (the 3b4762a call) slowed each: the 1-layer release build took 211 s there
# against 47 s beside fewer processes on the H100, and five of the eleven sweep groups did not finish.
# Usage, from the repo root on the device machine:
#   bash scripts/gpu_recipe_runs.sh SECONDS COMMIT [ENTRIES...]
# SECONDS bounds the whole call; COMMIT is the commit the tree was copied from (it goes into every
# checkpoint's provenance; commit first, so the tree is that commit). Carry .whl, and .zoo-cache (frozen splits,
# verified by hash on load) where the 64 MiB tree allows; else the splits are built there (at 2766ae1 the tracked
# tree is 61.8 MB and .whl 3.7 MB of the 67.1 MB a call carries: linreg-d5-c10's splits, 6.9 MB, did not fit). .whl holds
# the cp312 wheels the image lacks, from the repo root here: python3 -m pip download --no-deps --only-binary=:all:
#   --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 -d .whl pydantic==2.13.4
#   pydantic_core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing_extensions==4.15.0 datasets==5.2.0
#   dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0   (datasets' other needs, pandas, xxhash, pyyaml, tqdm,
#   filelock and huggingface-hub, are in the image's package list: /work/.library/device/KINDS.md)
# Everything comes back under $OUT (at most 8 files): the release build (release.tar.gz), the sweeps' checkpoints
# (runs.tar.gz), every process's log (logs.tar.gz), the device's name.
# Two lessons of its first run (at ed3b43a, on an H100) are built in. The image has no `datasets`, which writes a
# frozen split the first time it is built: every split the call needs is built before anything starts, and the
# call stops there if one cannot be (carry .zoo-cache with them, or datasets and its needs as wheels); that run lost
# its LRU, Fig. 5 and Fig. 8 processes to it (Fig. 8 ran on the CPU instead). And the copy there holds a .git at an
# older commit, so provenance read
# "<older>-dirty-<hash of the diff>": GIT_DIR points nowhere, and ICL_ZOO_COMMIT names the commit instead. So
# nothing there can tell a tree with uncommitted changes: commit first and pass that commit. A task variant's split
# (a --set task.n_context override) has no name to build ahead; the preflight's `import datasets` is what it needs
# at run time.
# Each process starts in a session and process group of its own (setsid): the wait follows those pids and the stop
# signals each whole group, a sweep's or build's spawned workers included (they outlive a parent killed alone and
# keep its folders' locks). Each call starts a bare machine: unfinished runs come back with their resumable state in runs.tar.gz (carry it
# back under /tmp/gpu-runs by hand to resume them in a later call).
set -u
budget=${1:?seconds}; export ICL_ZOO_COMMIT=${2:?commit}; shift 2; out=${OUT:?}
entries=${*:-}
RUNS=/tmp/gpu-runs
export ICL_ZOO_CACHE=/tmp/zoo-cache MPLBACKEND=Agg PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1
export GIT_DIR=/nonexistent  # provenance from ICL_ZOO_COMMIT, not from the copy's stale .git
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
if [ -d .zoo-cache ]; then mkdir -p $ICL_ZOO_CACHE && cp -r .zoo-cache/. $ICL_ZOO_CACHE/; fi
mkdir -p $RUNS
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, onnxruntime as o, pyarrow, pydantic; print("torch", torch.__version__, "onnxruntime", o.__version__, "pyarrow", pyarrow.__version__, "pydantic", pydantic.__version__)'
  echo "$(nproc --all) CPUs"; } 2>&1 | tee $out/device.txt

# every named frozen split (linreg-d5-c10's, zucchet-icl's and the ENTRIES' tasks') built, or read from the carried cache, and
# hash-checked before anything trains; the C variants' splits are built by their runs (datasets importable)
tasks=$(python3 -c 'import sys; from zoo.science.registry import get_entry; print(*sorted({"linreg-d5-c10", "zucchet-icl", *(get_entry(e).task for e in sys.argv[1:])}))' $entries) \
  && python3 -m zoo.cli datasets verify $tasks > $out/datasets.log 2>&1 \
  && python3 -c 'import datasets' 2>> $out/datasets.log \
  || { echo "frozen splits not ready (see datasets.log): stopping before any run"; tail -n 5 $out/datasets.log; exit 2; }
pids=()
# one CPU thread per process: a GPU run's CPU work is launching kernels, and up to 16 processes share 16 cores
start() { name=$1; shift; OMP_NUM_THREADS=1 setsid nohup python3 -m zoo.cli "$@" > $RUNS/$name.log 2>&1 < /dev/null & pids+=($!); }
[ -n "$entries" ] && start release release build --only $entries --root $RUNS/release --device cuda --force \
  --workers $(echo $entries | wc -w)
start table-2 sweep sweeps/table-2-paper-recipe.toml --out $RUNS/table-2-paper-recipe --quiet
start figure-7-5l sweep sweeps/figure-7-blogpost-size.toml --only softmax-tf-5l-d5-c10 --seeds 1 2 \
  --out $RUNS/figure-7-blogpost-size-5l --quiet
start figure-7-c2 sweep sweeps/figure-7-depth-context.toml --set task.n_context=2 --only softmax-tf-5l-d5-c10 \
  --out $RUNS/figure-7-depth-context-c2 --quiet
start figure-7-c50 sweep sweeps/figure-7-depth-context.toml --set task.n_context=50 --seeds 0 --workers 3 \
  --only softmax-tf-3l-d5-c10 softmax-tf-4l-d5-c10 softmax-tf-5l-d5-c10 --out $RUNS/figure-7-depth-context-c50 --quiet

running() { for p in "${pids[@]}"; do kill -0 $p 2>/dev/null && return 0; done; return 1; }
while [ $SECONDS -lt $((budget - 25)) ] && running; do sleep 5; done
echo "stopped waiting at ${SECONDS}s"
for p in "${pids[@]}"; do kill -TERM -- -$p 2>/dev/null; done; sleep 2  # each whole group: spawned workers too
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
for f in $(find $RUNS -name train_state.json | sort); do
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(sys.argv[1], 'step', m['step'])" "$f"
done | tee $out/train-states.txt
for f in $RUNS/*.log; do echo "== $f"; tail -c 600 $f | tr "\r" "\n" | tail -n 4; done
(cd $RUNS && tar czf $out/logs.tar.gz *.log)
# the release folder whole (ONNX included, and an unfinished build's resumable state); the sweeps without ONNX
[ -d $RUNS/release ] && (cd $RUNS && tar czf $out/release.tar.gz release)
(cd $RUNS && tar czf $out/runs.tar.gz --exclude='*.log' --exclude='*.onnx' --exclude='release' .)
ls -la $out; echo "done at ${SECONDS}s"
