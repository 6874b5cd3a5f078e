"""Train E models of one architecture in one process, as one batched computation.

Tiny models leave a GPU idle between kernel launches; stacking E members along a new leading
axis (`torch.func.stack_module_state`) and mapping the model over it (`vmap`) turns E small
launches into one larger one. Member e is the model `train` would produce alone with seed
s_e: the same initial weights (drawn after `torch.manual_seed(s_e)`), the same data stream
(its own generator seeded s_e), AdamW acting elementwise, per-member gradient clipping. Only
the rounding of batched kernels differs (tested to tolerance on CPU).

`data="shared"` instead draws one batch of E × B tasks from a single generator (one sampling
call per step: faster, but members no longer match their solo runs).

The training loop is `zoo.running.train.fit`, the one `train` runs: this module only supplies the
vmapped step (a `zoo.running.train.Step`), eager or with `compiled=True` through torch.compile, and
the run folder holds the same resumable safetensors state (the stacked weights, AdamW moments
and every member's generator), so an interrupted ensemble resumes.

On a CUDA device the step (sampling, forward, backward, clipping, lr schedule, AdamW) is
captured once as a CUDA graph and replayed (`GraphedStep`): one launch per step instead of
hundreds, and no host synchronisation between evaluations. The members' generators are
registered with the graph, so each replay draws exactly what the eager step would; the lr comes
from a schedule table indexed on the device. Non-finite losses are then caught at the next
evaluation or checkpoint boundary (the state saved before them is kept), not at the step they occur.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from zoo.running.train import Step, default_device, fit, lr_factor, make_optimizer
from zoo.science.models.base import TrainingHooks

WARMUP_STEPS = 5  # steps left out of the measured rate: compilation, or a CUDA graph's 3 eager steps and its capture


def _safe(name: str) -> str:
    return name.replace(".", "__")


class StackedParameters(TrainingHooks, nn.Module):
    """The members' parameters stacked on axis 0, under the base model's (escaped) names, so
    the optimiser groups and the safetensors state work as for one model."""

    def __init__(self, base: nn.Module, stacked: dict[str, torch.Tensor]):
        super().__init__()
        self.names = list(stacked)
        for name, value in stacked.items():
            self.register_parameter(_safe(name), nn.Parameter(value.detach().clone()))
        hooks = isinstance(base, TrainingHooks)  # a plain module declares none
        self._exempt = {_safe(n) for n in base.no_weight_decay()} if hooks else set()
        self._recurrent = {_safe(n) for n in base.recurrent_parameter_names()} if hooks else set()

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
                   until: int | None = None, progress: bool = True, compiled: bool = False,
                   probe=None) -> EnsembleResult:
    """Train one member per seed; `make_model()` builds an untrained model (called after seeding).

    `steps`: the length of the run (and of its lr schedule); default the recipe's.
    `until`: stop after this step, saving the state (run again to continue the same schedule).
    `cuda_graph`: replay the step as a CUDA graph (default: on for CUDA devices).
    `compiled`: torch.compile the vmapped loss (forward + backward) and the update (not with a CUDA graph).
    `probe(model)` ({name: float}): recorded for each member (unstacked copies) at every eval step (zoo.running.train.fit)."""
    if data not in ("per_member", "shared"):
        raise ValueError(f"data must be 'per_member' or 'shared', got {data!r}")
    if recipe.max_skipped_steps:  # a step is the members' one update: skipping it for one would move the others off their solo runs
        raise ValueError(f"a recipe with max_skipped_steps = {recipe.max_skipped_steps} trains one model at a time "
                         "(zoo.running.train.train), not as an ensemble")
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
                         "batching rule); train its seeds one by one with zoo.running.train.train")
    base = _Predicting(copy.deepcopy(members[0]).to("meta"))
    params, buffers = stack_module_state(members)
    stacked = StackedParameters(members[0], params).to(device)
    opt = make_optimizer(stacked, recipe, capturable=graphed, tensor_lr=compiled)
    generators = [torch.Generator(device=device).manual_seed(s) for s in (seeds if data == "per_member" else seeds[:1])]
    E, B = len(seeds), recipe.batch_size

    def member_loss(p, b, tokens, targets):  # the member's `predict`, with its read-out shortcuts, as `train` runs it
        return task.loss(functional_call(base, (_prefixed(p), _prefixed(b)), (tokens,)), targets)

    def loss(tokens, targets):  # tokens (E, B, T, d_in): each member its own batch → (E,)
        return vmap(member_loss)(stacked.by_name(), buffers, tokens, targets)

    def validation_loss(tokens, targets):  # the shared split, tokens (N, T, d_in) → (E,)
        return vmap(member_loss, in_dims=(0, 0, None, None))(stacked.by_name(), buffers, tokens, targets)

    def clip():
        _clip_per_member(stacked, recipe.grad_clip)

    step = (GraphedStep if graphed else Step)(
        stacked, opt, recipe, generators, sample=lambda: _sample(task, generators, E, B), loss=loss,
        validation_loss=validation_loss, clip=clip if recipe.grad_clip else None, seeds=list(seeds), compiled=compiled,
        warmup=WARMUP_STEPS)

    def probe_members():  # {name: [one value per member]}
        rows = [probe(model) for model in unstack(members[0], stacked, E)]
        return {name: [row[name] for row in rows] for name in rows[0]}

    run = fit(step, recipe, run_dir=run_dir, total=total, until=until, validation_batch=validation_batch,
              progress=progress, probe=None if probe is None else probe_members)
    return EnsembleResult(models=unstack(members[0], stacked, E), steps=run.steps, history=run.history,
                          steps_per_second=run.steps_per_second)


class GraphedStep(Step):
    """One optimiser step captured as a CUDA graph (PyTorch's whole-network capture recipe).

    The first `eager_calls` calls run eagerly on a side stream (they are real training steps; they
    also create AdamW's state and the autograd/cuBLAS workspaces the capture must not allocate),
    the next call captures, and every call from then on is one `replay()`. Gradients are None
    when the capture starts, so the captured backward writes them rather than accumulating. The lr
    comes from a schedule table indexed on the device (the host steps no scheduler), and the loop
    checks the losses only at its eval/checkpoint steps: a check per step would wait on the device."""

    checks_each_step = False
    eager_calls = 3

    def begin(self, start: int, total: int) -> None:
        if not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
            raise RuntimeError(f"torch {torch.__version__} cannot capture a step that draws from its own generators "
                               "(CUDAGraph.register_generator_state is missing); pass cuda_graph=False")
        device = self.opt.param_groups[0]["lr"].device
        schedule = [lr_factor(s, self.recipe, total) for s in range(total)]
        self.schedule = torch.tensor(schedule + schedule[-1:], device=device)  # lr factor per step
        self.peaks = torch.tensor(self.peak_lrs, device=device)  # (groups,)
        self.step_index = torch.tensor([start], device=device)
        self.graph, self.calls, self.side = None, 0, torch.cuda.Stream(device)

    def _body(self) -> torch.Tensor:
        losses = self.forward_backward()
        lrs = self.peaks * self.schedule.index_select(0, self.step_index)  # (groups,)
        for i, group in enumerate(self.opt.param_groups):
            group["lr"].copy_(lrs[i])
        self.update()
        self.step_index.add_(1)
        return losses

    def __call__(self, step: int) -> torch.Tensor:
        if self.graph is not None:
            self.graph.replay()
            return self.losses  # the graph's output tensor, rewritten by each replay
        current = torch.cuda.current_stream()
        self.side.wait_stream(current)  # after the loop's use of the previous step's losses
        if self.calls < self.eager_calls:
            with torch.cuda.stream(self.side):
                losses = self._body()
            self.calls += 1
            current.wait_stream(self.side)  # the loop reads the losses on the current stream
            return losses
        current.wait_stream(self.side)
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        for generator in self.generators:
            self.graph.register_generator_state(generator)
        with torch.cuda.graph(self.graph):
            self.losses = self._body()
        self.graph.replay()  # the capture itself ran nothing
        return self.losses


class _Predicting(nn.Module):
    """`model.predict` as the module's call, so that `functional_call` swaps a member's weights
    into it: ensembles train through the same read-out shortcuts (the query position only) as
    `zoo.running.train.train`. The model's parameter names gain the prefix `model.`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.predict(tokens)


def _prefixed(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"model.{name}": t for name, t in tensors.items()}


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
