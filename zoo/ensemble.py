"""Train E models of one architecture in one process, as one batched computation.

Tiny models leave a GPU idle between kernel launches; stacking E members along a new leading
axis (`torch.func.stack_module_state`) and mapping the model over it (`vmap`) turns E small
launches into one larger one. Member e is the model `train` would produce alone with seed
s_e: the same initial weights (drawn after `torch.manual_seed(s_e)`), the same data stream
(its own generator seeded s_e), AdamW acting elementwise, per-member gradient clipping. Only
the rounding of batched kernels differs (tested to tolerance on CPU).

`data="shared"` instead draws one batch of E × B tasks from a single generator (one sampling
call per step: faster, but members no longer match their solo runs).

`compiled=True` (CPU) runs the vmapped loss and its backward, and the AdamW update, through
torch.compile, as `zoo.train.step_functions` does for one model.

The run folder holds the same resumable safetensors state as `train` (the stacked weights,
AdamW moments and every member's generator), so an interrupted ensemble resumes.

On a CUDA device the step (sampling, forward, backward, clipping, lr schedule, AdamW) is
captured once as a CUDA graph and replayed: one launch per step instead of hundreds, and no
host synchronisation between evaluations. The members' generators are registered with the
graph, so each replay draws exactly what the eager step would; the lr comes from a schedule
table indexed on the device. Non-finite losses are then caught at the next evaluation or
checkpoint boundary (the state saved before them is kept), not at the step they occur.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from zoo.train import (STATE_FILE, StepClock, TrainingDiverged, last_saved_step, default_device, load_state, lr_factor,
                        make_optimizer, optimizer_update, save_state)

WARMUP_STEPS = 5  # steps left out of the measured rate: compilation, or a CUDA graph's 3 eager steps and its capture


def _safe(name: str) -> str:
    return name.replace(".", "__")


class StackedParameters(nn.Module):
    """The members' parameters stacked on axis 0, under the base model's (escaped) names, so
    the optimiser groups and the safetensors state work as for one model."""

    def __init__(self, base: nn.Module, stacked: dict[str, torch.Tensor]):
        super().__init__()
        self.names = list(stacked)
        for name, value in stacked.items():
            self.register_parameter(_safe(name), nn.Parameter(value.detach().clone()))
        self._exempt = {_safe(n) for n in (base.no_weight_decay() if hasattr(base, "no_weight_decay") else set())}
        self._recurrent = {_safe(n) for n in getattr(base, "recurrent_parameter_names", lambda: set())()}

    def by_name(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, _safe(n)) for n in self.names}

    def no_weight_decay(self) -> set[str]:
        return self._exempt

    def recurrent_parameter_names(self) -> set[str]:
        return self._recurrent


@dataclass
class EnsembleResult:
    models: list[nn.Module]
    steps: int
    history: list[dict] = field(default_factory=list)  # {"step", "train_loss": [E], "val_loss": [E]}
    steps_per_second: float | None = None  # optimiser steps (of all E members at once) after the warm-up steps


def init_members(make_model, seeds: list[int]) -> list[nn.Module]:
    members = []
    for seed in seeds:
        torch.manual_seed(seed)
        members.append(make_model())
    return members


def train_ensemble(make_model, task, recipe, seeds: list[int], *, run_dir: Path, validation_batch=None,
                   steps: int | None = None, device=None, data: str = "per_member", cuda_graph: bool | None = None,
                   until: int | None = None, progress: bool = True, compiled: bool = False) -> EnsembleResult:
    """Train one member per seed; `make_model()` builds an untrained model (called after seeding).

    `steps`: the length of the run (and of its lr schedule); default the recipe's.
    `until`: stop after this step, saving the state (run again to continue the same schedule).
    `cuda_graph`: replay the step as a CUDA graph (default: on for CUDA devices).
    `compiled`: torch.compile the vmapped loss (forward + backward) and the update (not with a CUDA graph)."""
    if data not in ("per_member", "shared"):
        raise ValueError(f"data must be 'per_member' or 'shared', got {data!r}")
    device = torch.device(device) if device else default_device()
    graphed = device.type == "cuda" if cuda_graph is None else cuda_graph
    if graphed and compiled:
        raise ValueError("compiled=True is for eager launches; a CUDA-graph step is replayed whole already (cuda_graph=False)")
    if graphed and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a CUDA device, got {device}")
    total = steps or recipe.steps
    members = [m.to(device) for m in init_members(make_model, seeds)]
    if not getattr(members[0], "vmappable", True):
        raise ValueError(f"{type(members[0]).__name__} with these blocks cannot be vmapped (fused kernels without a "
                         "batching rule); train its seeds one by one with zoo.train.train")
    base = copy.deepcopy(members[0]).to("meta")
    params, buffers = stack_module_state(members)
    stacked = StackedParameters(members[0], params).to(device)
    opt = make_optimizer(stacked, recipe, capturable=graphed, tensor_lr=compiled)
    peak_lrs = [float(g["lr"]) for g in opt.param_groups]
    generators = [torch.Generator(device=device).manual_seed(s) for s in (seeds if data == "per_member" else seeds[:1])]
    run_dir = Path(run_dir)
    start, history = 0, []
    if (run_dir / STATE_FILE).exists():
        start, history = load_state(run_dir, stacked, opt, generators)

    def member_loss(p, b, tokens, targets):
        return task.loss(base.readout(functional_call(base, (p, b), (tokens,))), targets)

    batched_loss = vmap(member_loss)
    if compiled:
        torch.compiler.reset()  # a fresh cache per run (see zoo.train.step_functions)
        batched_loss = torch.compile(batched_loss, dynamic=False)
    E, B = len(seeds), recipe.batch_size
    val = None
    if validation_batch is not None:
        val = (validation_batch.tokens.to(device), validation_batch.targets.to(device))
    running = torch.zeros(E, device=device)  # summed training losses since the last record

    def forward_backward():
        tokens, targets = _sample(task, generators, E, B)
        losses = batched_loss(stacked.by_name(), buffers, tokens, targets)  # (E,)
        losses.sum().backward()  # members are independent: each gets its own gradient
        if recipe.grad_clip:
            _clip_per_member(stacked, recipe.grad_clip)
        running.add_(losses.detach())
        return losses

    if graphed:
        advance = _GraphedStep(forward_backward, opt, generators, peak_lrs,
                               [lr_factor(s, recipe, total) for s in range(total)], start)
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, recipe, total), last_epoch=start - 1)
        step_optimizer = optimizer_update(opt, compiled=compiled)  # clipping is in forward_backward

        def advance(step):
            opt.zero_grad(set_to_none=True)
            losses = forward_backward()
            if not torch.isfinite(losses).all():
                bad = [seeds[i] for i in torch.nonzero(~torch.isfinite(losses)).flatten().tolist()]
                raise TrainingDiverged(f"loss of member(s) with seed {bad} is not finite at step {step}; the last "
                                       f"good ensemble state (step {last_saved_step(run_dir)}) is kept in {run_dir}")
            step_optimizer()
            sched.step()

    stop = total if until is None else min(until, total)
    count, step, clock = 0, start, StepClock(start, WARMUP_STEPS, device)
    bar = tqdm(total=total, initial=start, disable=not progress, desc=f"train ×{E}", unit="step", dynamic_ncols=True)
    try:
        for step in range(start, stop):
            clock.tick(step)
            advance(step)
            count += 1
            done = step + 1
            is_eval = done % recipe.eval_every == 0 or done == total
            is_checkpoint = done % recipe.checkpoint_every == 0 or done == stop
            if not (is_eval or is_checkpoint):
                bar.update(1)
                continue
            _check_finite(stacked, running, seeds, done, run_dir)
            if is_eval:
                record = {"step": done, "train_loss": (running / count).tolist(),
                          "lr": peak_lrs[0] * lr_factor(done, recipe, total)}  # the next step's, as in `train`
                running.zero_()
                count = 0
                if val is not None:
                    with torch.no_grad():
                        record["val_loss"] = vmap(member_loss, in_dims=(0, 0, None, None))(
                            stacked.by_name(), buffers, *val).tolist()
                history.append(record)
                bar.set_postfix({"mean_loss": f"{sum(record['train_loss']) / E:.4g}"})
            if is_checkpoint:
                save_state(run_dir, stacked, opt, generators, done, history)
            bar.update(1)
    except KeyboardInterrupt:
        bar.close()
        raise KeyboardInterrupt(f"interrupted at step {step}; the ensemble state of step {last_saved_step(run_dir)} is in "
                                f"{run_dir}: run the same command again to resume") from None
    bar.close()
    return EnsembleResult(models=unstack(members[0], stacked, E), steps=max(start, stop), history=history,
                          steps_per_second=clock.rate(stop))


class _GraphedStep:
    """One optimiser step captured as a CUDA graph (PyTorch's whole-network capture recipe).

    The first `warmup` calls run eagerly on a side stream (they are real training steps; they
    also create AdamW's state and the autograd/cuBLAS workspaces the capture must not allocate),
    the next call captures, and every call from then on is one `replay()`. Gradients are set to
    None before the capture, so the captured backward writes them rather than accumulating."""

    def __init__(self, forward_backward, opt, generators: list[torch.Generator], peak_lrs: list[float],
                 schedule: list[float], start: int, warmup: int = 3):
        if not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
            raise RuntimeError(f"torch {torch.__version__} cannot capture a step that draws from its own generators "
                               "(CUDAGraph.register_generator_state is missing); pass cuda_graph=False")
        self.forward_backward, self.opt, self.generators, self.warmup = forward_backward, opt, generators, warmup
        device = opt.param_groups[0]["lr"].device
        self.schedule = torch.tensor(schedule + [schedule[-1]], device=device)  # lr factor per step
        self.peaks = torch.tensor(peak_lrs, device=device)
        self.step_index = torch.tensor([start], device=device)
        self.graph, self.calls = None, 0
        self._side = torch.cuda.Stream(device)
        self._side.wait_stream(torch.cuda.current_stream(device))

    def _body(self):
        self.forward_backward()
        lrs = self.peaks * self.schedule.index_select(0, self.step_index)  # (groups,)
        for i, group in enumerate(self.opt.param_groups):
            group["lr"].copy_(lrs[i])
        self.opt.step()
        self.step_index.add_(1)

    def __call__(self, step: int) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        if self.calls < self.warmup:
            with torch.cuda.stream(self._side):
                self.opt.zero_grad(set_to_none=True)
                self._body()
            self.calls += 1
            return
        torch.cuda.current_stream().wait_stream(self._side)
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        for generator in self.generators:
            self.graph.register_generator_state(generator)
        with torch.cuda.graph(self.graph):
            self._body()
        self.graph.replay()  # the capture itself ran nothing


def _check_finite(stacked, running: torch.Tensor, seeds: list[int], step: int, run_dir: Path) -> None:
    """Raise (saving nothing) if a member's recent losses or its weights are not finite."""
    bad = ~torch.isfinite(running)
    for p in stacked.parameters():
        bad |= ~torch.isfinite(p.detach().reshape(len(seeds), -1)).all(1)
    if bad.any():
        members = [seeds[i] for i in torch.nonzero(bad).flatten().tolist()]
        raise TrainingDiverged(f"member(s) with seed {members} went non-finite by step {step}; the last good "
                               f"ensemble state (step {last_saved_step(run_dir)}) is kept in {run_dir}")


def _sample(task, generators, E: int, B: int):
    if len(generators) == E:
        batches = [task.sample(B, generator=g) for g in generators]
        return torch.stack([b.tokens for b in batches]), torch.stack([b.targets for b in batches])
    b = task.sample(E * B, generator=generators[0])
    return b.tokens.view(E, B, *b.tokens.shape[1:]), b.targets.view(E, B, *b.targets.shape[1:])


@torch.no_grad()
def _clip_per_member(stacked: StackedParameters, max_norm: float) -> None:
    grads = [p.grad for p in stacked.parameters() if p.grad is not None]
    norms = torch.sqrt(sum((g.reshape(g.shape[0], -1) ** 2).sum(1) for g in grads))  # (E,)
    scale = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))


@torch.no_grad()
def unstack(template: nn.Module, stacked: StackedParameters, E: int) -> list[nn.Module]:
    """E independent models shaped like `template`, holding the ensemble's trained weights."""
    weights, device = stacked.by_name(), next(stacked.parameters()).device
    models = []
    for e in range(E):
        model = copy.deepcopy(template).to(device)
        for name, p in model.named_parameters():
            p.copy_(weights[name][e])
        models.append(model)
    return models
