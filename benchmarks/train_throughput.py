"""Training throughput of every trained family: model-steps per second, eager vs compiled vs ensembles.

    python benchmarks/train_throughput.py                              # every family, CPU
    python benchmarks/train_throughput.py --families gated_rnn mamba --members 8 64
    python benchmarks/train_throughput.py --device cuda --members 1 8 64 256

Each family is measured on one trained registry entry (the first of its arch type, or
--entries), at that entry's batch and sequence length, in one run:

    plain      `zoo.running.train.train` on one model in the forms the zoo trained with before its
               speed-ups: the prediction read from the full forward pass (`readout(model(tokens))`,
               none of the read-out shortcuts some families' `predict` takes), every scan in
               the doubling form (`scan(parallel=True)`) and GRU layers in torch's fused kernel
               (not `GRUSequence`); the baseline every ratio is against
    eager      the same with the family's `predict` and `scan`'s choice of form
    compiled   the same with compiled=True (torch.compile of forward + backward and of the
               clipped AdamW update; `zoo release build` trains this way)
    ens E      `zoo.running.ensemble.train_ensemble` with E members, per-member data streams (vmap)
    ens E sh   the same with one shared sampling call per step (data="shared")
    ens E c    (and "sh c") the same, compiled
    ens E cg   per-member streams, the whole step replayed as one CUDA graph (CUDA only)
    ens E sh cg  the same with every member's tasks drawn inside the graph from one generator
               (one sampling launch for E × B tasks, not E)

model-steps/s = E × optimiser steps per second. `train` and `train_ensemble` time
themselves after their first few steps (compilation, graph capture and allocation left
out). The hardware floor is FLOPs of one model-step (torch's
FlopCounterMode, forward + backward) against the device's measured matmul peak, or the bytes
the AdamW update moves against the measured copy bandwidth, whichever bounds first; "% of
floor" says how close a configuration gets. Families whose fused kernels have no vmap rule
(LSTM, GRU, bi-LSTM) have no ensemble rows.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

import zoo
from zoo.running.ensemble import train_ensemble
from zoo.running.train import train
from zoo.science.models import classic_rnn, create_model
from zoo.science.models import scan as scan_module
from zoo.science.registry import get_entry, get_task_spec


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def matmul_peak(device, dtype=torch.float32) -> float:
    """FLOP/s of a square product in `dtype` on this device, measured now."""
    n = 2048 if device.type == "cuda" else 1024
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    reps = 20 if device.type == "cuda" else 3
    # the best of 5 timings: on a shared machine a single one reads a neighbour's load as a lower peak
    return max(2 * n**3 * reps / timed(lambda: [a @ b for _ in range(reps)], device) for _ in range(5))


def measured_peaks(device) -> tuple[float, float]:
    """(float32 matmul FLOP/s, copy bytes/s) of this device, measured now."""
    flops = matmul_peak(device)
    reps = 20 if device.type == "cuda" else 3
    x = torch.empty(2**26 if device.type == "cuda" else 2**24, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    bandwidth = max(2 * x.numel() * 4 * reps / timed(lambda: [y.copy_(x) for _ in range(reps)], device) for _ in range(5))
    return flops, bandwidth


def flops_per_model_step(model, task, batch: int, device) -> float:
    """Forward + backward FLOPs of one step, counted by torch; LSTM layers, whose fused kernels (oneDNN,
    cuDNN) it does not count, are added by hand: 4 gates × h × (in + h) multiply-adds per token and
    direction, × 3 for the backward."""
    b = task.sample(batch, seed=0, device=device)
    with FlopCounterMode(display=False) as counter:
        task.loss(model.predict(b.tokens), b.targets).backward()
    total = float(counter.get_total_flops())
    tokens = b.tokens.shape[0] * b.tokens.shape[1]
    for lstm in (m for m in model.modules() if isinstance(m, torch.nn.LSTM)):
        directions = 2 if lstm.bidirectional else 1
        for layer in range(lstm.num_layers):
            fan_in = lstm.input_size if layer == 0 else lstm.hidden_size * directions
            total += 3 * 2 * 4 * lstm.hidden_size * (fan_in + lstm.hidden_size) * tokens * directions
    return total


@contextlib.contextmanager
def doubling_scans():
    """Every `scan` in the doubling form while inside (what it ran before it chose by length and width),
    and GRU layers trained through torch's fused kernel (before `classic_rnn.GRUSequence`)."""
    short, wide = scan_module.SHORT_SCAN_LEN, scan_module.WIDE_SCAN_CHANNELS
    written_out = classic_rnn.WRITTEN_OUT_GRU_TRAINS
    scan_module.SHORT_SCAN_LEN, scan_module.WIDE_SCAN_CHANNELS = 0, float("inf")
    classic_rnn.WRITTEN_OUT_GRU_TRAINS = False
    try:
        yield
    finally:
        scan_module.SHORT_SCAN_LEN, scan_module.WIDE_SCAN_CHANNELS = short, wide
        classic_rnn.WRITTEN_OUT_GRU_TRAINS = written_out


def family_entries(families: list[str] | None) -> dict[str, str]:
    """arch type → the first trained registry entry of that type."""
    chosen: dict[str, str] = {}
    for entry in zoo.list_entries(source="trained"):
        if not entry.source.init:  # a run started from a construction is not the family's plain cost
            chosen.setdefault(entry.arch.type, entry.name)
    if families:
        unknown = sorted(set(families) - set(chosen))
        if unknown:
            raise SystemExit(f"no trained entry of arch type {unknown}; known: {sorted(chosen)}")
        chosen = {f: chosen[f] for f in families}
    return chosen


def row(tag: str, rate: float, members: int, base: float, floor: float) -> None:
    print(f"{tag:>16} {rate:10.1f} {rate * members:14.1f} {rate * members / base:8.2f} {100 * rate * members / floor:10.2f}",
          flush=True)


def bench_entry(label: str, entry_name: str, args, device, peak_flops: float, peak_bw: float) -> None:
    entry = get_entry(entry_name)
    task = get_task_spec(entry.task).build()
    recipe = entry.source.model_copy(update={"eval_every": 10**9, "checkpoint_every": 10**9, "warmup_steps": 0})

    def make():
        return create_model(entry.arch, task)

    tmp = tempfile.mkdtemp()
    model = make().to(device)
    params = sum(p.numel() for p in model.parameters())
    flops = flops_per_model_step(model, task, recipe.batch_size, device)
    bytes_adam = params * 4 * 7  # read w, g, m, v; write w, m, v
    floor = min(peak_flops / flops, peak_bw / bytes_adam)
    tokens = task.sample(1, seed=0).tokens.shape[1]
    print(f"\n{label} ({entry_name}): {params:,} parameters, batch {recipe.batch_size} × {tokens} tokens, "
          f"{flops / 1e6:.2f} MFLOP per model-step; floor ≈ {floor:,.0f} model-steps/s "
          f"(compute {peak_flops / flops:,.0f}, AdamW bytes {peak_bw / bytes_adam:,.0f})")
    print(f"{'configuration':>16} {'steps/s':>10} {'model-steps/s':>14} {'× plain':>8} {'% of floor':>10}", flush=True)

    def solo(compiled: bool, plain: bool = False) -> float:
        torch.manual_seed(0)
        model = make()
        if plain:  # an instance attribute shadows the family's predict
            model.predict = lambda tokens: model.readout(model(tokens))
        with doubling_scans() if plain else contextlib.nullcontext():
            result = train(model, task, recipe, run_dir=f"{tmp}/solo-{compiled}-{plain}", steps=args.steps,
                           device=device, progress=False, compiled=compiled)
        return result.steps_per_second

    base = solo(False, plain=True)
    # doing the FLOPs the step does now, no float32 implementation beats the floor: past this ratio only
    # an algebraic saving (fewer FLOPs) or lower precision speeds it up
    print(f"{'':>16} ceiling at these FLOPs: floor ÷ plain = {floor / base:.1f}×")
    row("plain", base, 1, base, floor)
    row("eager", solo(False), 1, base, floor)
    if not args.no_compile:
        row("compiled", solo(True), 1, base, floor)
    if not model.vmappable:
        return
    variants = [("per_member", False, False, ""), ("shared", False, False, " sh")]
    if not args.no_compile:
        variants += [("per_member", False, True, " c"), ("shared", False, True, " sh c")]
    if device.type == "cuda":  # the whole step as one graph: per-member generators, or one generator for all members
        variants += [("per_member", True, False, " cg"), ("shared", True, False, " sh cg")]
    for members in args.members:
        if members * recipe.batch_size > args.max_ensemble_tasks:
            print(f"{'ens ' + str(members):>16}   skipped: {members} × batch {recipe.batch_size} tasks a step "
                  f"> --max-ensemble-tasks {args.max_ensemble_tasks}")
            continue
        for data, graph, compiled, suffix in variants:
            if data == "shared" and members == 1:
                continue
            # graph replays are cheap: give them more steps so the rate is well above timer noise
            n = args.steps * (5 if graph else 1) // (1 if device.type == "cuda" else max(1, members // 8))
            result = train_ensemble(make, task, recipe, list(range(members)), run_dir=f"{tmp}/ens-{members}{suffix}",
                                    steps=max(20, n), device=device, data=data, cuda_graph=graph, compiled=compiled,
                                    progress=False)
            row(f"ens {members}{suffix}", result.steps_per_second, members, base, floor)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--members", type=int, nargs="*", default=[8], help="ensemble sizes (none: no ensemble rows)")
    p.add_argument("--steps", type=int, default=60, help="timed optimiser steps per configuration")
    p.add_argument("--families", nargs="+", metavar="ARCH_TYPE", help="default: every trained family of the registry")
    p.add_argument("--entries", nargs="+", metavar="ENTRY", help="measure these entries instead of one per family")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core)")
    p.add_argument("--max-ensemble-tasks", type=int, default=4096,
                   help="skip ensembles drawing more tasks a step (members × batch) than this (batch-2048 entries)")
    p.add_argument("--no-compile", action="store_true", help="leave out the compiled rows (they compile once per family)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    peak_flops, peak_bw = measured_peaks(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    # bfloat16 is printed beside, not used: every floor here is float32's, because a bfloat16 step does not
    # give the float32 run's losses to rounding (issue 20's condition on every speed-up)
    bf16 = matmul_peak(device, torch.bfloat16)
    print(f"device: {name}; torch {torch.__version__}; measured matmul peak {peak_flops / 1e9:.1f} GFLOP/s "
          f"(bfloat16 {bf16 / 1e9:.1f}, {bf16 / peak_flops:.1f}× float32), copy {peak_bw / 1e9:.1f} GB/s")
    targets = {e: e for e in args.entries} if args.entries else family_entries(args.families)
    for label, entry_name in targets.items():
        bench_entry(label, entry_name, args, device, peak_flops, peak_bw)


if __name__ == "__main__":
    main()
