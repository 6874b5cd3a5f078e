"""Training: fresh tasks every step, AdamW + cosine, periodic validation on the frozen split,
resumable training state (safetensors, never pickle), and a NaN guard.

The run directory holds `train_state.safetensors` (weights, AdamW moments, the data
generator's RNG state) and `train_state.json` (step, history). Re-running the same command
after an interruption resumes from it and gives the same weights as an uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

STATE_FILE = "train_state.safetensors"
WARMUP_STEPS = 3  # steps of a call left out of its measured rate: the first compiles (compiled=True) or allocates
META_FILE = "train_state.json"


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; the last good training state was kept on disk."""


@dataclass
class TrainResult:
    steps: int
    history: list[dict] = field(default_factory=list)  # {"step", "train_loss", "val_loss"?}
    resumed_from: int = 0
    steps_per_second: float | None = None  # measured after the first WARMUP_STEPS of this call (compilation, allocation)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def on_cuda(device: str | torch.device | None) -> bool:
    """Would training on `device` (default: `default_device()`) run on CUDA?"""
    return torch.device(device).type == "cuda" if device else torch.cuda.is_available()


def lr_factor(step: int, recipe, total_steps: int) -> float:
    """Multiplier of the peak lr at `step`: linear warm-up, then cosine to final_lr (or constant)."""
    if recipe.warmup_steps and step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    if recipe.schedule == "constant":
        return 1.0
    span = max(1, total_steps - recipe.warmup_steps)
    progress = min(1.0, (step - recipe.warmup_steps) / span)
    floor = recipe.final_lr / recipe.lr
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, recipe, *, capturable: bool = False, tensor_lr: bool = False) -> torch.optim.Optimizer:
    """AdamW; parameters a model lists in `no_weight_decay()` (recurrent λ's ν) are not decayed,
    and with `recipe.recurrent_lr` those in `recurrent_parameter_names()` get that peak lr.

    `recipe.optimizer = "adam_l2"` uses Adam with the decay as an L2 term in the gradient: it is
    then normalised with the gradient, so weights the loss never touches shrink by ~lr per step
    instead of lr·λ·w (Zucchet Table 2's residual terms; reports/zucchet-2023/table-2.md).

    `capturable=True` (for CUDA graphs) keeps AdamW's step counters on the device and makes
    each group's lr a 0-d device tensor that a captured step can rewrite in place.
    `tensor_lr=True` (for a compiled update) makes each group's lr a 0-d tensor too, so the
    schedule rewrites it in place instead of handing the compiled step a new constant (a recompile)."""
    exempt = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    frozen = getattr(recipe, "frozen", lambda name: False)
    for name, p in model.named_parameters():
        if frozen(name):
            p.requires_grad_(False)  # no gradient, no update, no weight decay, not in the clipped norm
    recurrent = set()
    if recipe.recurrent_lr is not None and hasattr(model, "recurrent_parameter_names"):
        recurrent = model.recurrent_parameter_names()
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups.setdefault((name in exempt, name in recurrent), []).append(p)
    param_groups = [
        {"params": params, "weight_decay": 0.0 if no_decay else recipe.weight_decay,
         "lr": recipe.recurrent_lr if is_recurrent else recipe.lr}
        for (no_decay, is_recurrent), params in sorted(groups.items())
    ]
    optimizer = torch.optim.Adam if getattr(recipe, "optimizer", "adamw") == "adam_l2" else torch.optim.AdamW
    lr, options = recipe.lr, {}
    if capturable or tensor_lr:
        device = next(model.parameters()).device if capturable else None  # a compiled step reads a CPU scalar
        for group in param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), device=device)
        lr = torch.tensor(recipe.lr, device=device)
        options = {"capturable": True, "foreach": True} if capturable else {}
    return optimizer(param_groups, lr=lr, betas=tuple(recipe.betas), weight_decay=recipe.weight_decay, **options)


# ---------------------------------------------------------------- resumable state
def save_state(run_dir: Path, model, opt, generator: torch.Generator | list[torch.Generator], step: int,
               history: list[dict]) -> None:
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    opt_sd = opt.state_dict()
    for idx, st in opt_sd["state"].items():
        for key, value in st.items():
            tensors[f"optim.{idx}.{key}"] = torch.as_tensor(value).detach().contiguous()
    if isinstance(generator, list):  # an ensemble: one data stream per member
        tensors.update({f"rng.{i}": g.get_state() for i, g in enumerate(generator)})
    else:
        tensors["rng"] = generator.get_state()
    run_dir.mkdir(parents=True, exist_ok=True)
    # Write both files under temporary names then rename: an interruption mid-write leaves the
    # previous good state intact.
    tmp_state, tmp_meta = run_dir / (STATE_FILE + ".tmp"), run_dir / (META_FILE + ".tmp")
    save_file({k: v.cpu() for k, v in tensors.items()}, str(tmp_state))
    groups = [{k: (v.item() if torch.is_tensor(v) else v) for k, v in g.items()} for g in opt_sd["param_groups"]]
    tmp_meta.write_text(json.dumps({"step": step, "param_groups": groups, "history": history}))
    os.replace(tmp_state, run_dir / STATE_FILE)
    os.replace(tmp_meta, run_dir / META_FILE)


def load_state(run_dir: Path, model, opt, generator: torch.Generator | list[torch.Generator]) -> tuple[int, list[dict]]:
    try:
        return _load_state(run_dir, model, opt, generator)
    except Exception as e:  # a truncated, edited or foreign file: say so, not a traceback from deep inside
        raise ValueError(f"{run_dir}: the resumable training state cannot be restored ({type(e).__name__}: {e}); "
                         f"delete {run_dir} to start this run fresh") from None


def _load_state(run_dir: Path, model, opt, generator) -> tuple[int, list[dict]]:
    tensors = load_file(str(run_dir / STATE_FILE))
    meta = json.loads((run_dir / META_FILE).read_text())
    device = next(model.parameters()).device
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=True)
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value if name == "step" else value.to(device)
    lr_tensors = [g["lr"] for g in opt.param_groups if torch.is_tensor(g["lr"])]
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    if lr_tensors:  # a capturable optimiser: keep its lr tensors (a CUDA graph may hold their addresses)
        for group, lr in zip(opt.param_groups, lr_tensors):
            lr.fill_(group["lr"])
            group["lr"] = lr
    if isinstance(generator, list):
        for i, g in enumerate(generator):
            g.set_state(tensors[f"rng.{i}"])
    else:
        generator.set_state(tensors["rng"])
    return meta["step"], meta["history"]


def _params_finite(model) -> bool:
    """No NaN anywhere, and every trained parameter finite. A frozen parameter may hold ±inf on
    purpose: a construction's log-parametrised λ = 1 is ν = −inf (GD-SSM), and training never moves it."""
    return all(not torch.isnan(p).any() and (not p.requires_grad or torch.isfinite(p).all())
               for p in model.parameters())


class StepClock:
    """Steps per second of a training loop from its `warmup`-th step on: compilation, CUDA-graph
    capture and first allocations are left out, so the rate is what the rest of a long run gets."""

    def __init__(self, start: int, warmup: int, device: torch.device):
        self.start, self.warmup, self.device, self.started = start, warmup, device, None

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def tick(self, step: int) -> None:
        """Call before running `step`."""
        if step == self.start + self.warmup:
            self.started = self._now()

    def rate(self, stop: int) -> float | None:
        """Steps per second up to `stop` (None: the loop never got past its warm-up)."""
        return None if self.started is None else (stop - self.start - self.warmup) / (self._now() - self.started)


# ---------------------------------------------------------------- the step
def step_functions(model, task, recipe, opt, *, compiled: bool = False):
    """(loss_of(tokens, targets) -> loss, update()): one training step is `loss_of`, a finiteness
    check, `backward`, then `update` (gradient clipping and the optimiser step).

    `compiled=True` runs both through `torch.compile` (inductor: on a CPU, generated C++ loops
    that fuse the elementwise work of forward, backward and AdamW; the optimiser needs
    `make_optimizer(tensor_lr=True)`). Sampling stays eager: it draws from an explicit
    generator, so a compiled run sees exactly the eager run's data, and its losses equal the
    eager ones to rounding (tests/test_train.py). Compiling costs ~10–60 s once per run, so it
    pays on long runs only: `zoo build --compile`, and `zoo release build` (default there)."""

    def loss_of(tokens, targets):
        return task.loss(model.predict(tokens), targets)

    def clip():
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)

    if compiled:
        # A fresh cache per run: guards on the previous run's model would pile up to the recompile limit
        # (and the step would fall back to eager). This drops every compiled function of the process.
        torch.compiler.reset()
        loss_of = torch.compile(loss_of, dynamic=False)
    return loss_of, optimizer_update(opt, clip if recipe.grad_clip else None, compiled=compiled)


def can_compile(device: torch.device | str = "cpu") -> bool:
    """Can torch.compile build a training step here? On a CPU inductor writes C++ and needs a compiler
    ($CXX, g++, c++ or clang++ on the PATH); the release build trains eagerly where there is none."""
    import shutil

    if torch.device(device).type == "cuda":
        return True
    return any(shutil.which(c) for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c)


def optimizer_update(opt, clip=None, *, compiled: bool = False):
    """update(): `clip()` (if given), then the optimiser's step; with `compiled`, both through torch.compile.

    It calls the optimiser class's `step`: an lr scheduler replaces the instance's `opt.step` by a
    wrapper defined in torch's lr_scheduler.py, a file torch.compile does not trace, so a compiled
    `opt.step()` would silently run eagerly. What the wrapper records (the step ran, so the
    scheduler's order check passes) is recorded here instead."""
    step = type(opt).step

    def update():
        if clip is not None:
            clip()
        step(opt)

    fast = torch.compile(update, dynamic=False) if compiled else update

    def run():
        fast()
        opt._opt_called = True  # what LRScheduler's wrapper of opt.step sets

    return run


# ---------------------------------------------------------------- loop
def train(
    model,
    task,
    recipe,
    *,
    run_dir: Path,
    validation_batch=None,
    steps: int | None = None,
    seed: int | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
    compiled: bool = False,
) -> TrainResult:
    """Train `model` on fresh batches of `task` with `recipe` (resuming from `run_dir` if it holds
    a state); `compiled=True` runs the step through torch.compile (see `step_functions`)."""
    device = torch.device(device) if device else default_device()
    total = steps or recipe.steps
    seed = recipe.seed if seed is None else seed
    model.to(device)
    opt = make_optimizer(model, recipe, tensor_lr=compiled)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, recipe, total))
    generator = torch.Generator(device=device).manual_seed(seed)
    run_dir = Path(run_dir)

    start, history = 0, []
    if (run_dir / STATE_FILE).exists():
        start, history = load_state(run_dir, model, opt, generator)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, recipe, total), last_epoch=start - 1)
    resumed_from = start
    val = None
    if validation_batch is not None:
        val = (validation_batch.tokens.to(device), validation_batch.targets.to(device))

    loss_of, update = step_functions(model, task, recipe, opt, compiled=compiled)
    bar = tqdm(total=total, initial=start, disable=not progress, desc="train", unit="step", dynamic_ncols=True)
    running, count = 0.0, 0
    step, clock = start, StepClock(start, WARMUP_STEPS, device)
    try:
        for step in range(start, total):
            clock.tick(step)
            batch = task.sample(recipe.batch_size, generator=generator)
            loss = loss_of(batch.tokens, batch.targets)
            if not torch.isfinite(loss):
                raise TrainingDiverged(
                    f"loss is {loss.item()} at step {step}; stopped. The last good training state "
                    f"(step {last_saved_step(run_dir)}) is kept in {run_dir}"
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            update()
            sched.step()
            running += loss.item()
            count += 1
            done = step + 1
            if done % recipe.eval_every == 0 or done == total:
                record = {"step": done, "train_loss": running / count, "lr": float(sched.get_last_lr()[0])}
                running, count = 0.0, 0
                if val is not None:
                    with torch.no_grad():
                        record["val_loss"] = task.loss(model.predict(val[0]), val[1]).item()
                history.append(record)
                bar.set_postfix({k: f"{v:.4g}" for k, v in record.items() if k != "step"})
            if (done % recipe.checkpoint_every == 0 or done == total) and _params_finite(model):
                save_state(run_dir, model, opt, generator, done, history)
            bar.update(1)
    except KeyboardInterrupt:
        bar.close()
        raise KeyboardInterrupt(
            f"interrupted at step {step}; the state of step {last_saved_step(run_dir)} is in {run_dir}: "
            "run the same command again to resume"
        ) from None
    bar.close()
    if not _params_finite(model):  # the loss of the last step was finite, its update was not
        raise TrainingDiverged(f"the weights are NaN/inf after the last step ({total}); the last good training state "
                               f"(step {last_saved_step(run_dir)}) is kept in {run_dir}")
    return TrainResult(steps=total, history=history, resumed_from=resumed_from, steps_per_second=clock.rate(total))


def last_saved_step(run_dir: Path) -> int | str:
    meta = run_dir / META_FILE
    return json.loads(meta.read_text())["step"] if meta.exists() else "none"
