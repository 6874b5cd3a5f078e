"""Training: fresh tasks every step, AdamW + cosine, periodic validation on the frozen split,
resumable training state (safetensors, never pickle), and a NaN guard.

The run directory holds `train_state.safetensors` (weights, AdamW moments, the data
generator's RNG state) and `train_state.json` (step, history). Re-running the same command
after an interruption resumes from it and gives the same weights as an uninterrupted run.

One loop, `fit`, trains one model (`train`) and a vmapped ensemble of seeds (zoo/running/ensemble.py)
alike: resume, eval and checkpoint cadence, history rows, progress, the Ctrl-C message and the
divergence checks live there; what a step computes (one model, E stacked members, eager,
compiled or replayed as a CUDA graph) is a `Step` handed to it.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from zoo.science.models.base import TrainingHooks
from zoo.storage.checkpoint import pin_source_commit

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
    exempt = model.no_weight_decay() if isinstance(model, TrainingHooks) else set()  # a plain module declares none
    frozen = getattr(recipe, "frozen", lambda name: False)
    for name, p in model.named_parameters():
        if frozen(name):
            p.requires_grad_(False)  # no gradient, no update, no weight decay, not in the clipped norm
    hooks = isinstance(model, TrainingHooks)
    recurrent = model.recurrent_parameter_names() if recipe.recurrent_lr is not None and hooks else set()
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
               history: list[dict], *, skipped_after_last_row: int = 0) -> None:
    """The resumable state after `step` steps; `skipped_after_last_row`: steps skipped since the
    history's last row (a checkpoint between eval steps), which a resumed run still counts."""
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
    meta = {"step": step, "param_groups": groups, "history": history}
    if skipped_after_last_row:
        meta["skipped_after_last_row"] = skipped_after_last_row
    tmp_meta.write_text(json.dumps(meta))
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
class Step:
    """One optimiser step of what `fit` trains: one model (`train`), or E members stacked on a leading
    axis and vmapped (zoo/running/ensemble.py). The loop around it is the same for both; what differs is
    handed in: `sample()` draws a step's (tokens, targets) from `generators`, `loss(tokens, targets)`
    is the training loss (one model: 0-d; E members: (E,)), `validation_loss` the same on the shared
    validation split, `clip()` clips the gradients. `module`, `opt` and `generators` are what the run
    folder saves and restores. `seeds` names an ensemble's members (None: one model).

    A step runs eagerly, or with `compiled=True` its loss (forward, and so its backward) and its
    update (clipping + the optimiser step) go through torch.compile (inductor: on a CPU, generated C++
    loops that fuse the elementwise work of forward, backward and AdamW; the optimiser needs
    `make_optimizer(tensor_lr=True)`). Sampling stays eager: it draws from explicit generators, so a
    compiled run sees exactly the eager run's data, and its losses equal the eager ones to rounding
    (tests/test_train.py). Compiling costs ~10–60 s once per run, so it pays on long runs only:
    `zoo build --compile`, and `zoo release build` (default there). A step replayed as a CUDA graph
    is a subclass (zoo.running.ensemble.GraphedStep). Models that cannot be vmapped or compiled (fused
    LSTM/GRU kernels) take the eager step."""

    checks_each_step = True  # the loop checks every step's losses (a graph replay: only at eval/checkpoint steps)
    skipped = False  # the last call left the weights as they were (a non-finite loss or gradient)

    def __init__(self, module: torch.nn.Module, opt, recipe, generators: torch.Generator | list[torch.Generator], *,
                 sample, loss, validation_loss, clip=None, seeds: list[int] | None = None, compiled: bool = False,
                 warmup: int = WARMUP_STEPS):
        self.module, self.opt, self.recipe, self.generators = module, opt, recipe, generators
        self.sample, self.validation_loss, self.seeds, self.warmup = sample, validation_loss, seeds, warmup
        self.members = 1 if seeds is None else len(seeds)
        self.peak_lrs = [float(g["lr"]) for g in opt.param_groups]  # read before a resumed state replaces the lrs
        if compiled:
            # A fresh cache per run: guards on the previous run's model would pile up to the recompile limit
            # (and the step would fall back to eager). This drops every compiled function of the process.
            torch.compiler.reset()
            loss = torch.compile(loss, dynamic=False)
        self.loss = loss
        self.update = optimizer_update(opt, clip, compiled=compiled)

    def _finite_gradients(self) -> bool:
        """Are the gradients finite? Checked only for a recipe that skips: it costs a sync per step,
        and without skipping a non-finite gradient shows as non-finite weights at the next check."""
        if not self.recipe.max_skipped_steps:
            return True
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        return bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))

    def begin(self, start: int, total: int) -> None:
        """Called once before the first step of a call: `start` (> 0 when resumed) of a `total`-step schedule."""
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_factor(s, self.recipe, total),
                                                       last_epoch=start - 1)

    def forward_backward(self) -> torch.Tensor:
        """Draw a batch, compute the loss and its gradients; returns the losses (E,), detached."""
        tokens, targets = self.sample()
        losses = self.loss(tokens, targets)
        self.opt.zero_grad(set_to_none=True)
        losses.sum().backward()  # the members are independent: each gets its own gradient
        return losses.detach().reshape(self.members)

    def __call__(self, step: int) -> torch.Tensor:
        """Run optimiser step number `step`; returns the losses (E,) computed before the update. A
        non-finite loss is not applied (`self.skipped`): the model keeps its last finite weights, and
        the loop stops. With a recipe that skips (`max_skipped_steps`), a finite loss whose gradient
        overflows is not applied either (AMP's GradScaler checks the gradients), the lr schedule
        moves on, and the loop counts the skip."""
        losses = self.forward_backward()
        self.skipped = self.checks_each_step and not (torch.isfinite(losses).all() and self._finite_gradients())
        if self.skipped:
            self.opt._opt_called = True  # as after an update: LambdaLR would warn that it steps before the optimiser
            self.sched.step()
            return losses
        self.update()
        self.sched.step()
        return losses


def can_compile(device: torch.device | str = "cpu") -> bool:
    """Can torch.compile build a training step here? On a CPU inductor writes C++ and needs a compiler
    ($CXX, g++, c++ or clang++ on the PATH); the release build trains eagerly where there is none."""
    import shutil

    if torch.device(device).type == "cuda":
        return True
    return any(shutil.which(c) for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c)


@dataclass(frozen=True)
class TrainingMode:
    """How a run, or E seeds of one run, trains on a device: the one decision that `zoo build`,
    `zoo sweep` and `zoo release build` share (`training_mode`)."""

    ensemble: bool  # through zoo.running.ensemble: E vmapped members; on a GPU even one, so its step can be a graph
    graphed: bool  # each step replayed as one CUDA graph (ensembles on a GPU)
    compiled: bool  # the step through torch.compile (eager launches only)


def training_mode(model, recipe, device, *, members: int = 1, compile: bool = False) -> TrainingMode:
    """The `TrainingMode` for `model` trained with `recipe` on `device`, `members` seeds at once.

    - Ensemble: the model can be vmapped (fused LSTM/GRU kernels cannot), the recipe does not skip
      overflowing steps (`max_skipped_steps`: each member's step is checked alone), and there are
      several members, or one on a GPU.
    - Graphed: an ensemble on a GPU.
    - Compiled, when asked (`compile`): not graphed, the model says compiling pays
      (`compile_pays`), and a compiler is there (`can_compile`: on a CPU without one, eager)."""
    skips = bool(getattr(recipe, "max_skipped_steps", 0))
    ensemble = getattr(model, "vmappable", True) and not skips and (members > 1 or on_cuda(device))
    graphed = ensemble and on_cuda(device)
    compiled = compile and not graphed and getattr(model, "compile_pays", True) and can_compile(device or default_device())
    return TrainingMode(ensemble=ensemble, graphed=graphed, compiled=compiled)


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


# ---------------------------------------------------------------- the loop
def denormals_are_flushed() -> bool:
    """Does this thread flush denormal floats to zero (torch.set_flush_denormal)?"""
    return torch.tensor(1e-40).item() == 0.0  # float32 cannot hold 1e-40 but as a denormal


def flush_denormals_in_this_process() -> None:
    """Flush denormals on this thread before torch starts its intra-op threads, which then inherit
    the flag (see `denormals_flushed`): the training commands call it first thing."""
    torch.set_flush_denormal(True)


@contextmanager
def denormals_flushed(device: torch.device):
    """On a CPU, run the block with denormal floats (0 < |x| < 1.2e-38 in float32) flushed to zero.
    x86 computes on them in microcode, 10-100× slower than on normal floats, and training makes them:
    Adam with an L2 decay leaves the weights its loss no longer reaches at denormal sizes (the
    58,400-step `gated-rnn-zucchet-icl` had 78% of `w_m_out` there; benchmarks/denormals.py measures
    what that costs). A value that small changes no loss beyond rounding. The flag (x86's MXCSR) is
    per thread: it is set here on this thread, and a thread started later inherits it, but torch's
    intra-op threads keep what they had when they started. So with more than one thread the training
    commands set it before those exist (`flush_denormals_in_this_process`); a library caller gets it on
    this thread. The thread's previous setting is restored after."""
    previous = denormals_are_flushed()
    flushed = device.type == "cpu" and not previous and torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if flushed:
            torch.set_flush_denormal(False)


def fit(step: Step, recipe, *, run_dir: Path, total: int, until: int | None = None, validation_batch=None,
        progress: bool = True, probe=None) -> TrainResult:
    """The training loop of one model and of an ensemble alike: resume from `run_dir`'s state, run
    `step` up to `until` (default: the end of the `total`-step schedule), record the mean training
    loss (and the validation loss) every `recipe.eval_every` steps, save the state every
    `recipe.checkpoint_every` steps and at the stop, and stop with TrainingDiverged before a
    non-finite loss or weight is recorded or saved (the state on disk stays the last good one).

    `probe()`, when given, is called at every eval step and its metrics ({name: value}, one value
    per member as a list for an ensemble) join that step's history row: how a model's behaviour,
    not only its loss, changes during training (the blogpost's Figure 10: `zoo.science.evaluation.alignment_probe`).
    It must not change the weights or draw from the training generators."""
    pin_source_commit()  # the checkpoints saved after this run name the code it ran, not a later commit
    run_dir = Path(run_dir)
    device = next(step.module.parameters()).device
    start, history = 0, []
    if (run_dir / STATE_FILE).exists():
        start, history = load_state(run_dir, step.module, step.opt, step.generators)
    step.begin(start, total)
    val = None
    if validation_batch is not None:
        val = (validation_batch.tokens.to(device), validation_batch.targets.to(device))
    # a history row holds one number per metric for one model, a list (one per member) for an ensemble
    row_value = (lambda t: t.item()) if step.seeds is None else (lambda t: t.tolist())
    stop = total if until is None else min(until, total)
    running, count = torch.zeros(step.members, dtype=torch.float64, device=device), 0  # losses summed since the last row
    skipped_since = skipped_after_last_row(run_dir) if start else 0  # steps skipped since the last row
    skipped = sum(row.get("skipped", 0) for row in history) + skipped_since  # in all
    desc = "train" if step.seeds is None else f"train ×{step.members}"
    bar = tqdm(total=total, initial=start, disable=not progress, desc=desc, unit="step", dynamic_ncols=True)
    at, clock = start, StepClock(start, step.warmup, device)
    try:
        with denormals_flushed(device):
            for at in range(start, stop):
                clock.tick(at)
                losses = step(at)  # (E,)
                if step.skipped:  # Step did not apply it
                    if skipped < recipe.max_skipped_steps:
                        skipped, skipped_since = skipped + 1, skipped_since + 1
                    else:
                        finite = torch.isfinite(losses)
                        _stop_if(~finite if not finite.all() else torch.ones_like(finite),
                                 step, run_dir, "the loss" if not finite.all() else "the gradient",
                                 f"is not finite at step {at} ({row_value(losses)})"
                                 + (f"; {skipped} steps were skipped already, the recipe's max_skipped_steps"
                                    if recipe.max_skipped_steps else ""))
                else:
                    running += losses
                    count += 1
                done = at + 1
                is_eval = done % recipe.eval_every == 0 or done == total
                is_checkpoint = done % recipe.checkpoint_every == 0 or done == stop
                if not (is_eval or is_checkpoint):
                    bar.update(1)
                    continue
                _stop_if(~torch.isfinite(running) | _nonfinite_weights(step, device), step, run_dir, "the loss or weights",
                         f"are NaN/inf after {'the last step' if done == total else f'step {done}'}")
                if is_eval:
                    record = {"step": done, "train_loss": row_value(running / count) if count else None,
                              "lr": step.peak_lrs[0] * lr_factor(done, recipe, total)}  # the lr of the next step
                    if skipped_since:
                        record["skipped"] = skipped_since
                    running.zero_()
                    count = skipped_since = 0
                    if val is not None:
                        with torch.no_grad():
                            record["val_loss"] = row_value(step.validation_loss(*val).reshape(step.members))
                    if probe is not None:
                        record.update(probe())
                    history.append(record)
                    bar.set_postfix({k: f"{(sum(v) / len(v) if isinstance(v, list) else v):.4g}"  # an ensemble's mean
                                     for k, v in record.items() if k != "step" and v is not None})
                if is_checkpoint:
                    save_state(run_dir, step.module, step.opt, step.generators, done, history,
                               skipped_after_last_row=skipped_since)
                bar.update(1)
    except KeyboardInterrupt:
        bar.close()
        raise KeyboardInterrupt(
            f"interrupted at step {at}; the training state of step {last_saved_step(run_dir)} is in {run_dir}: "
            "run the same command again to resume"
        ) from None
    bar.close()
    return TrainResult(steps=max(start, stop), history=history, resumed_from=start, steps_per_second=clock.rate(stop))


def _nonfinite_weights(step: Step, device) -> torch.Tensor:
    """(E,) which members hold a NaN anywhere, or a trained parameter ±inf. A frozen parameter may hold
    ±inf on purpose: a construction's log-parametrised λ = 1 is ν = −inf (GD-SSM), and training never moves it."""
    bad = torch.zeros(step.members, dtype=torch.bool, device=device)
    for p in step.module.parameters():
        rows = p.detach().reshape(step.members, -1)  # one row per member (stacked on axis 0); one model: one row
        bad |= (~torch.isfinite(rows) if p.requires_grad else rows.isnan()).any(1)
    return bad


def _stop_if(bad: torch.Tensor, step: Step, run_dir: Path, subject: str, problem: str) -> None:
    """Raise TrainingDiverged if any member is flagged in `bad` (E,), naming an ensemble's members by seed."""
    if not bad.any():
        return
    who = "" if step.seeds is None else f" of member(s) with seed {[step.seeds[i] for i in bad.nonzero().flatten().tolist()]}"
    raise TrainingDiverged(f"{subject}{who} {problem}; stopped. The last good training state "
                           f"(step {last_saved_step(run_dir)}) is kept in {run_dir}")


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
    probe=None,
) -> TrainResult:
    """Train `model` on fresh batches of `task` with `recipe` (resuming from `run_dir` if it holds
    a state); `compiled=True` runs the step through torch.compile (see `Step`); `probe(model)`
    ({name: float}) is recorded in the history at every eval step (see `fit`)."""
    device = torch.device(device) if device else default_device()
    seed = recipe.seed if seed is None else seed
    model.to(device)
    generator = torch.Generator(device=device).manual_seed(seed)

    def sample():
        batch = task.sample(recipe.batch_size, generator=generator)
        return batch.tokens, batch.targets

    def loss(tokens, targets):  # tokens (B, T, d_in) → ()
        return task.loss(model.predict(tokens), targets)

    def clip():
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)

    step = Step(model, make_optimizer(model, recipe, tensor_lr=compiled), recipe, generator, sample=sample, loss=loss,
                validation_loss=loss, clip=clip if recipe.grad_clip else None, compiled=compiled)
    return fit(step, recipe, run_dir=run_dir, total=steps or recipe.steps, validation_batch=validation_batch,
               progress=progress, probe=None if probe is None else (lambda: probe(model)))


def skipped_after_last_row(run_dir: Path) -> int:
    """Steps skipped since the saved history's last row (see `save_state`)."""
    meta = run_dir / META_FILE
    return int(json.loads(meta.read_text()).get("skipped_after_last_row", 0)) if meta.exists() else 0


def last_saved_step(run_dir: Path) -> int | str:
    meta = run_dir / META_FILE
    return json.loads(meta.read_text())["step"] if meta.exists() else "none"
