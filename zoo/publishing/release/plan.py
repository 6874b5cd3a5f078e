"""What a release build will run: each entry's definition fingerprint, its training rate measured here,
its run length under a time budget, its training mode, and `zoo release plan`'s cost table."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from zoo.running.train import WARMUP_STEPS, can_compile, default_device, train
from zoo.running.train import training_mode as mode_of  # this module's training_mode is the release's rule
from zoo.science import models
from zoo.science.registry import definition_sha256, get_entry, get_task_spec, list_entries

PROBE_STEPS = 20  # training steps timed to choose a run length under --time-budget
MIN_STEPS = 200  # a budgeted run is never shorter than this


def entry_fingerprint(name: str) -> str:
    """The registry's current `definition_sha256` of entry `name`; a release built from another is stale."""
    entry = get_entry(name)
    return definition_sha256(entry.model_dump(mode="json"), get_task_spec(entry.task).model_dump(mode="json"))


def measure_rate(name: str, device: str, steps: int = PROBE_STEPS, *, compiled: bool = False,
                 graphed: bool | None = None) -> float:
    """Training steps per second of entry `name` at its recipe's batch on `device`, trained the way the
    build will train it (`training_mode`: on a GPU a one-member ensemble replayed as a CUDA graph, else
    one model, compiled with `compiled`): a short run timed after its warm-up steps (compilation, the
    graph's capture). Timing the eager one-model step instead underestimated a graphed GPU build ~10x."""
    # Deferred: the builder stack (ONNX export, checkpoint saving) loads only where a rate is measured
    from zoo.running.builder import _prepare
    from zoo.running.ensemble import train_ensemble

    entry, _, task, validation, _, _ = _prepare(name, None)
    if graphed is None:  # else the caller decided the mode (`compiled` is then the decision, not a wish)
        graphed, compiled = training_mode(name, device, compiled)
    recipe = entry.source.model_copy(update={"eval_every": 10**9, "checkpoint_every": 10**9})
    with tempfile.TemporaryDirectory() as tmp:
        if graphed:
            result = train_ensemble(lambda: models.create_model(entry.arch, task), task, recipe, [0],
                                    run_dir=Path(tmp), steps=WARMUP_STEPS + steps, device=device, progress=False)
        else:
            torch.manual_seed(0)
            result = train(models.create_model(entry.arch, task), task, recipe, run_dir=Path(tmp),
                           steps=WARMUP_STEPS + steps, device=device, progress=False, compiled=compiled)
    return result.steps_per_second


def run_length(name: str, device: str, time_budget: float | None, compiled: bool = False,
               graphed: bool | None = None) -> tuple[int, float | None]:
    """(steps, measured steps/s): the recipe's steps, or fewer when they do not fit `time_budget` seconds."""
    recipe_steps = get_entry(name).source.steps
    if time_budget is None:
        return recipe_steps, None
    rate = measure_rate(name, device, compiled=compiled, graphed=graphed)
    affordable = max(MIN_STEPS, int(time_budget * rate) // 100 * 100)
    return min(recipe_steps, affordable), rate


def training_mode(name: str, device: str, compiled: bool = True, model=None) -> tuple[bool, bool]:
    """(graphed, compiled): how the release build trains entry `name` on `device`, one seed at a
    time: zoo.running.train.training_mode on its untrained `model` (built here when not given; the rule
    `zoo build` and `zoo sweep` use)."""
    entry = get_entry(name)
    model = model if model is not None else models.create_model(entry.arch, get_task_spec(entry.task).build())
    mode = mode_of(model, entry.source, device, compile=compiled)
    return mode.graphed, mode.compiled


def print_plan(*, device: str | None = None, only: list[str] | None = None, threads: int | None = None,
               compiled: bool = True) -> list[dict]:
    """Measure each trained entry's steps/s here, eager and (with `compiled`) as `zoo release build`
    trains it (compiled unless its model says compiling does not pay), and print its recipe-length
    cost each way and the whole zoo's total: what the release build can afford. (On a GPU the entries
    the build replays as CUDA graphs are timed eagerly here: their cost is an upper bound.)"""
    if threads:
        torch.set_num_threads(threads)
    device = device or str(default_device())
    if compiled and not can_compile(device):
        print("no C++ compiler on the PATH ($CXX, g++, c++, clang++): torch.compile cannot build the step here, "
              "so the release build trains eagerly; measuring eager only")
        compiled = False
    names = only or [e.name for e in list_entries(source="trained")]
    rows, totals = [], {"eager": 0.0, "compiled": 0.0}
    print(f"({device}, {torch.get_num_threads()} threads; recipe-length cost in hours)")
    print(f"{'entry':34} {'recipe steps':>12} {'eager steps/s':>14} {'eager h':>8}"
          + (f" {'compiled steps/s':>17} {'compiled h':>11} {'×':>6}" if compiled else ""))
    for name in names:
        steps = get_entry(name).source.steps
        row = {"entry": name, "recipe_steps": steps, "eager_steps_per_second": measure_rate(name, device)}
        row["eager_seconds"] = steps / row["eager_steps_per_second"]
        totals["eager"] += row["eager_seconds"]
        line = f"{name:34} {steps:>12,} {row['eager_steps_per_second']:>14.1f} {row['eager_seconds'] / 3600:>8.2f}"
        if compiled:
            row["compiled_steps_per_second"] = (measure_rate(name, device, compiled=True) if training_mode(name, device)[1]
                                                else row["eager_steps_per_second"])  # the build does not compile it
            row["compiled_seconds"] = steps / row["compiled_steps_per_second"]
            totals["compiled"] += row["compiled_seconds"]
            line += (f" {row['compiled_steps_per_second']:>17.1f} {row['compiled_seconds'] / 3600:>11.2f}"
                     f" {row['compiled_steps_per_second'] / row['eager_steps_per_second']:>6.2f}")
        rows.append(row)
        print(line, flush=True)
    summary = f"{'whole zoo (trained entries, one after another)':61} {totals['eager'] / 3600:>8.2f}"
    if compiled:
        summary += f" {'':>17} {totals['compiled'] / 3600:>11.2f} {totals['eager'] / totals['compiled']:>6.2f}"
    print(summary)
    return rows
