"""Training throughput: model-steps per second, one model at a time vs vmapped ensembles.

    python benchmarks/train_throughput.py                       # CPU, small sizes
    python benchmarks/train_throughput.py --device cuda --members 1 8 64 256

For each model (the Zucchet gated RNN with 80 neurons on the ICL task, and a one-layer LSA,
both at batch 64) it measures, in one run:

    eager      `zoo.train.train` on one model (the baseline every ratio is against)
    ens E      `zoo.ensemble.train_ensemble` with E members, per-member data streams, eager launches
    ens E sh   the same with one shared sampling call per step (data="shared")
    ens E cg   per-member streams, the whole step replayed as one CUDA graph (CUDA only;
               the default of train_ensemble on a GPU)

model-steps/s = E × optimiser steps per second, timed as the difference between a run of n
and of 3n steps, so start-up, graph capture and the final copy-out cancel. It also prints a hardware floor: FLOPs of one
model-step (torch's FlopCounterMode, forward + backward) against the device's measured matmul
peak, and the bytes the AdamW update must move against its measured copy bandwidth; the
smaller of the two bounds is the most model-steps/s the device could sustain.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from zoo.ensemble import train_ensemble
from zoo.models import create_model
from zoo.registry import get_entry, get_task_spec, with_overrides
from zoo.train import train

MODELS = {  # label → (entry, overrides)
    "gated-rnn-80": ("gated-rnn-zucchet-icl", {"arch.hidden": 80, "source.batch_size": 64}),
    "lsa-1l": ("lsa-d10-c10", {"source.batch_size": 64}),
}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def steps_per_second(run, steps: int, device) -> float:
    run(max(5, steps // 10))  # warm-up (allocations, kernel selection)
    return 2 * steps / (timed(lambda: run(3 * steps), device) - timed(lambda: run(steps), device))


def measured_peaks(device) -> tuple[float, float]:
    """(matmul FLOP/s, copy bytes/s) of this device, measured now."""
    n = 2048 if device.type == "cuda" else 1024
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b
    reps = 20 if device.type == "cuda" else 3
    flops = 2 * n**3 * reps / timed(lambda: [a @ b for _ in range(reps)], device)
    x = torch.empty(2**26 if device.type == "cuda" else 2**24, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    bandwidth = 2 * x.numel() * 4 * reps / timed(lambda: [y.copy_(x) for _ in range(reps)], device)
    return flops, bandwidth


def flops_per_model_step(model, task, batch: int, device) -> float:
    b = task.sample(batch, seed=0, device=device)
    with FlopCounterMode(display=False) as counter:
        task.loss(model.predict(b.tokens), b.targets).backward()
    return float(counter.get_total_flops())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--members", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--steps", type=int, default=40, help="timed optimiser steps per configuration")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = p.parse_args()
    device = torch.device(args.device)
    peak_flops, peak_bw = measured_peaks(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {name}; measured matmul peak {peak_flops / 1e9:.1f} GFLOP/s, copy {peak_bw / 1e9:.1f} GB/s")

    for label in args.models:
        entry_name, overrides = MODELS[label]
        entry = with_overrides(get_entry(entry_name), overrides)
        task = get_task_spec(entry.task).build()
        recipe = entry.source.model_copy(update={"eval_every": 10**9, "checkpoint_every": 10**9, "warmup_steps": 0})

        def make():
            return create_model(entry.arch, task)

        tmp = tempfile.mkdtemp()

        def eager(n):
            torch.manual_seed(0)
            train(make(), task, recipe, run_dir=f"{tmp}/eager-{n}", steps=n, device=device, progress=False)

        base = steps_per_second(eager, args.steps, device)
        model = make().to(device)
        params = sum(p.numel() for p in model.parameters())
        flops = flops_per_model_step(model, task, recipe.batch_size, device)
        bytes_adam = params * 4 * 7  # read w, g, m, v; write w, m, v
        floor = min(peak_flops / flops, peak_bw / bytes_adam)
        print(f"\n{label}: {params} parameters, batch {recipe.batch_size}, {flops / 1e6:.2f} MFLOP per model-step; "
              f"floor ≈ {floor:,.0f} model-steps/s (compute {peak_flops / flops:,.0f}, AdamW bytes {peak_bw / bytes_adam:,.0f})")
        print(f"{'configuration':>16} {'steps/s':>10} {'model-steps/s':>14} {'× eager':>8} {'% of floor':>10}")
        print(f"{'eager':>16} {base:10.1f} {base:14.1f} {1.0:8.2f} {100 * base / floor:10.2f}")
        variants = [("per_member", False, ""), ("shared", False, " sh")]
        if device.type == "cuda":
            variants.append(("per_member", True, " cg"))
        for members in args.members:
            for data, graph, suffix in variants:
                if data == "shared" and members == 1:
                    continue

                def ensemble(n, members=members, data=data, graph=graph):
                    train_ensemble(make, task, recipe, list(range(members)), run_dir=f"{tmp}/ens-{members}-{data}-{graph}-{n}",
                                   steps=n, device=device, data=data, cuda_graph=graph, progress=False)

                # graph replays are cheap: give them more steps so the difference is well above timer noise
                n = args.steps * (5 if graph else 1) // (1 if device.type == "cuda" else max(1, members // 8))
                rate = steps_per_second(ensemble, max(5, n), device)
                tag = f"ens {members}{suffix}"
                print(f"{tag:>16} {rate:10.1f} {rate * members:14.1f} {rate * members / base:8.2f} {100 * rate * members / floor:10.2f}")


if __name__ == "__main__":
    main()
