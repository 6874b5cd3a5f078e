"""Where one entry's training step spends its time: torch.profiler over a few dozen steps.

    python benchmarks/profile_step.py griffin-1d --members 32 --compiled      # a compiled ensemble, shared sampling
    python benchmarks/profile_step.py gru-zucchet-icl                         # one model, eager

The profiled run follows an unprofiled warm-up run of the same configuration, so the caches
(inductor's compiled code, the allocator) are warm; a compiled run still traces its new model
once, which shows as dynamo rows. Prints model-steps/s of the profiled run and the ops sorted by
their own CPU (or CUDA) time.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from zoo.running.ensemble import train_ensemble
from zoo.running.train import train
from zoo.science.models import create_model
from zoo.science.registry import get_entry, get_task_spec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("entry")
    p.add_argument("--members", type=int, default=1, help="ensemble size (1: `zoo.running.train.train` on one model)")
    p.add_argument("--compiled", action="store_true")
    p.add_argument("--steps", type=int, default=40, help="profiled optimiser steps")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", type=int, default=25)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    entry = get_entry(args.entry)
    task = get_task_spec(entry.task).build()
    recipe = entry.source.model_copy(update={"eval_every": 10**9, "checkpoint_every": 10**9, "warmup_steps": 0})
    tmp = tempfile.mkdtemp()

    def run(tag: str) -> float:
        if args.members == 1:
            torch.manual_seed(0)
            result = train(create_model(entry.arch, task), task, recipe, run_dir=f"{tmp}/{tag}", steps=args.steps,
                           device=device, progress=False, compiled=args.compiled)
        else:
            result = train_ensemble(lambda: create_model(entry.arch, task), task, recipe, list(range(args.members)),
                                    run_dir=f"{tmp}/{tag}", steps=args.steps, device=device, data="shared",
                                    compiled=args.compiled, cuda_graph=False, progress=False)
        return result.steps_per_second * args.members

    run("warm-up")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        rate = run("profiled")
    print(f"{args.entry}: {args.members} member(s), {'compiled' if args.compiled else 'eager'}, "
          f"{rate:,.1f} model-steps/s while profiled")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows))


if __name__ == "__main__":
    main()
