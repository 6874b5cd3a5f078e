"""Training steps/s from a checkpoint's weights with denormal floats kept (torch's default) and
flushed to zero (what the training commands do on a CPU), in the same run.

    python benchmarks/denormals.py [ENTRY] [--revision REV] [--steps N] [--threads T ...]

Training can leave weights at denormal sizes (0 < |w| < 1.2e-38 in float32): Adam with an L2 decay
drives the weights its loss never reaches there. x86 computes on denormals in microcode, so every
matmul that reads them slows down. The checkpoint is the released ENTRY (default
gated-rnn-zucchet-icl), or with --revision the folder the release held at that git revision (e.g.
fe77cf1~1, whose 58,400-step gated-rnn-zucchet-icl, built before training flushed, kept 75% of its
weights denormal). It prints the fraction of denormal weights, then the eager training loop's rate
(`zoo.running.train.train`, the entry's recipe and batch, from those weights; the denormal weights stay
denormal under it) both ways and their ratio. Each measurement runs in a fresh process that sets
the flag before torch starts its threads, so every thread has it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

MEASURE = r"""
import contextlib, copy, json, sys, tempfile
import torch
path, threads, flush, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
torch.set_flush_denormal(flush)  # before any op: the intra-op threads inherit it
torch.set_num_threads(threads)
import zoo, zoo.running.train
ckpt = zoo.load(path)
weights = torch.cat([p.detach().flatten() for p in ckpt.model.parameters()])
denormal = ((weights != 0) & (weights.abs() < torch.finfo(torch.float32).tiny)).float().mean().item()
if not flush:  # the loop as it was: no flush of its own
    zoo.running.train.denormals_flushed = lambda device: contextlib.nullcontext()
recipe = ckpt.entry.source.model_copy(update={"eval_every": 10**9, "checkpoint_every": 10**9})
with tempfile.TemporaryDirectory() as run_dir:
    result = zoo.running.train.train(copy.deepcopy(ckpt.model), ckpt.task, recipe, run_dir=run_dir,
                             steps=zoo.running.train.WARMUP_STEPS + steps, device="cpu", progress=False)
print(json.dumps({"rate": result.steps_per_second, "denormal": denormal}))
"""


def measure(path: Path, threads: int, flush: bool, steps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(threads), "1" if flush else "0", str(steps)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def checkpoint_folder(entry: str, revision: str | None, tmp: Path) -> Path:
    """The released folder of `entry`, now or at git `revision` (extracted into `tmp`)."""
    repo = Path(__file__).resolve().parents[1]
    if revision is None:
        return repo / "release" / entry
    archive = subprocess.run(["git", "archive", "--format=tar", revision, f"release/{entry}"], cwd=repo,
                             capture_output=True, check=True).stdout
    (tmp / "a.tar").write_bytes(archive)
    with tarfile.open(tmp / "a.tar") as tar:
        tar.extractall(tmp, filter="data")
    return tmp / "release" / entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("entry", nargs="?", default="gated-rnn-zucchet-icl")
    parser.add_argument("--revision", help="git revision whose release folder to load (default: the current release)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint_folder(args.entry, args.revision, Path(tmp))
        print(f"{args.entry}{f' at {args.revision}' if args.revision else ''}", flush=True)
        for threads in args.threads:
            kept, flushed = measure(path, threads, False, args.steps), measure(path, threads, True, args.steps)
            print(f"  {threads} thread(s): {100 * kept['denormal']:.1f}% of the weights denormal | kept "
                  f"{kept['rate']:8.1f} steps/s | flushed {flushed['rate']:8.1f} steps/s | {flushed['rate'] / kept['rate']:.2f}×",
                  flush=True)


if __name__ == "__main__":
    main()
