"""The interface every zoo model follows, and what a model family declares.

    forward(tokens (B, T, d_in)) -> out (B, T, d_out)       causal unless the model says not
    predict(tokens)               -> the task's query read-out (B, d_y)
    state_shapes()                -> [(name, shape without the batch)]: the one declaration of the state
    step(token (B, d_in), state)  -> (out (B, d_out), new state)
    forward_chunk(tokens, state)  -> (out (B, T, d_out), state after the last token)
`state_names`, `init_state` (zeros) and `check_state` derive from `state_shapes`. `forward`
equals `step` iterated from `init_state`, and `forward_chunk` from any state equals `step`
iterated from it (tests/test_recurrence.py, for every recurrent registry entry, and against the
exported ONNX graphs): `forward_chunk` is the parallel form of a stream, exported as the chunk
graph that streams long inputs in few runs. Models whose memory grows with the sequence (softmax
attention, or attention that lets earlier tokens see later ones) set `recurrent = False` and
`state_shapes` raises.

A family (one file in zoo/science/models/) ends with a `FAMILY = Family(...)`: its arch config schema, the
`build(arch, task)` that turns a validated config into a module, the analytic constructions it
supports with their applicability rules and knobs (the source fields each takes), and its model-card prose. zoo/science/models/__init__.py lists the
families; the registry, `create_model` and `zoo.science.constructions.construct` dispatch through that table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import nn

from zoo.science.schema import Strict
from zoo.science.tasks.regression import Readout

StateShapes = list[tuple[str, tuple[int, ...]]]


class NotRecurrentError(TypeError):
    """Raised by `state_shapes`/`init_state`/`step` on models that have no constant-size state."""


class TrainingHooks:
    """What the training loop asks of what it trains (a zoo model, or an ensemble's stacked parameters): which
    parameters skip weight decay and which take a recipe's `recurrent_lr`. A plain torch module has neither."""

    def no_weight_decay(self) -> set[str]:
        """Parameter names trained without weight decay (e.g. the recurrence's ν, as the papers exempt it)."""
        return set()

    def recurrent_parameter_names(self) -> set[str]:
        """Parameter names a recipe's `recurrent_lr` applies to (the recurrence's own parameters). A family with
        none returns the empty set, and the registry refuses a `recurrent_lr` for it."""
        return set()


class ZooModel(TrainingHooks, nn.Module):
    """The base of every family's model. Besides the interface above, it declares every optional hook a family
    may override, with its meaning and its default; generic code (training, evaluation, export) calls these and
    never probes for attributes or branches on a concrete family."""

    # ---- capabilities (class attributes, or set per instance in __init__)
    recurrent: bool = True  # constant-size state: init_state / step / forward_chunk work (False: softmax attention)
    # `forward` and `forward_chunk` run the whole time axis as tensor ops (scans, matmuls), so a graph traced at
    # one length is valid at every length up to `chunk_len`. False: a Python loop over T or a fused kernel fixes
    # the traced length: the chunk graph is the step graph scanned over time, and the sequence graph takes only
    # the task's length. The export checks the claim (export/onnx_export.py runs every graph at two lengths).
    has_parallel_form: bool = True
    chunk_len: int = 1024  # the longest chunk the exported chunk graph takes (its scans' doublings)
    max_tokens: int | None = None  # the longest sequence the model reads (a position table's rows); None: any
    vmappable: bool = True  # torch.func.vmap runs it (ensembles); fused LSTM/GRU kernels have no batching rule
    compile_pays: bool = True  # a torch.compile'd training step is faster (not so around fused LSTM/GRU kernels)

    # ---- training hooks: no_weight_decay, recurrent_parameter_names (TrainingHooks)

    # ---- analysis hooks
    def has_polynomial_map(self) -> bool:
        """The query's prediction is an explicit polynomial of the context (`instantaneous`), e.g. one LSA layer:
        evaluation then reports its coefficients (Zucchet Table 2) and its distance to a teacher's (Table 1)."""
        return False

    def instantaneous(self, x: torch.Tensor) -> torch.Tensor:
        """The map whose polynomial coefficients the analysis reads (only where `has_polynomial_map()`)."""
        raise NotImplementedError(f"{type(self).__name__} has no instantaneous polynomial map")

    def family_metrics(self, task, batch) -> dict:
        """Metrics only this family has, measured on a frozen split (e.g. the gated RNN's memory leak, and its
        key/value and query scores against a teacher's weights): merged into the generic evaluation."""
        return {}

    def __init__(self, d_in: int, d_out: int, readout: Readout):
        super().__init__()
        self.d_in = d_in
        self.d_out = d_out
        self.readout = readout

    def predict(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.readout(self(tokens))

    def predict_query(self, tokens: torch.Tensor) -> torch.Tensor:
        """The query's prediction (B, d_y), also for tasks that predict at every position."""
        return self.readout.query(self(tokens))

    def state_shapes(self) -> StateShapes:
        """[(name, shape without the batch dimension)] of the state, in `step`'s order."""
        raise NotRecurrentError(f"{type(self).__name__} has no recurrent state")

    def state_names(self) -> list[str]:
        return [name for name, _ in self.state_shapes()]

    def init_state(self, batch: int) -> tuple[torch.Tensor, ...]:
        """The zero state, in the parameters' dtype and device."""
        p = self._param_like()
        return tuple(p.new_zeros(batch, *shape) for _, shape in self.state_shapes())

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        raise NotRecurrentError(f"{type(self).__name__} has no recurrent state")

    def forward_chunk(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        """`forward` continued from `state` (None: the zero state); also returns the state after the last token."""
        raise NotRecurrentError(f"{type(self).__name__} has no recurrent state")

    def check_state(self, state: tuple[torch.Tensor, ...], batch: int) -> None:
        """Clear error for a state of the wrong arity or shape (streaming runtimes call this)."""
        shapes = self.state_shapes()
        if len(state) != len(shapes):
            raise ValueError(f"expected {len(shapes)} state tensors {self.state_names()}, got {len(state)}")
        for (name, shape), got in zip(shapes, state):
            if tuple(got.shape) != (batch, *shape):
                raise ValueError(f"state '{name}' has shape {tuple(got.shape)}, expected {(batch, *shape)}")

    def _param_like(self) -> torch.Tensor:
        return next(self.parameters())


class RecurrentBlock(nn.Module):
    """A block of a deep sequence model (models/stack.py). Its state interface is the model's:
    `state_shapes()`, `step(x (B, h), state)`, `forward_chunk(x (B, T, h), state | None)`."""

    recurrent = True  # has a constant-size state and `step`
    has_parallel_form = True  # `forward` exports with a symbolic sequence length
    chunk_len = 1024  # the longest chunk the exported chunk graph takes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_chunk(x, None)[0]

    def forward_last(self, x: torch.Tensor) -> torch.Tensor:
        """The output at the last position only (B, h): what a read-out of the last token needs.
        A block that can skip work for it overrides this (the bi-LSTM's backward direction)."""
        return self(x)[:, -1]

    def forward_chunk(self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        raise NotImplementedError

    def state_shapes(self) -> StateShapes:
        raise NotImplementedError

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]):
        raise NotImplementedError


# ---------------------------------------------------------------------------- families
class NoKnobs(Strict):
    """The knobs of a construction that takes none: `source = { kind = "constructed", construction = NAME }`."""


class GDRate(Strict):
    """The knob of a construction that does gradient descent at a rate η."""

    # GD rate (sum convention); "analytic": Zucchet C.2 (1 step); "line_search": best on the validation split for this many steps
    eta: float | Literal["analytic", "line_search"] = "analytic"


@dataclass(frozen=True)
class ConstructionRule:
    """An analytic construction a family supports.

    knobs: the pydantic schema (a `Strict` model, fields with defaults) of the parameters an entry
        gives it beside `kind` and `construction`, e.g. `GDRate` (`eta`); the registry validates a
        constructed entry's `source` against it, so a new construction declares its knobs here and
        nowhere else.
    problem(arch, task_spec, source) -> why it cannot apply to this arch config and task spec
        (None when it can); the registry calls it when it validates an entry.
    apply(model, task, source, validation_batch) -> sets the built model's weights and returns
        the hyper-parameters used (e.g. {"eta": …}), recorded in the checkpoint.

    The math an `apply` calls has one shape in every family: `construct(model, <weights or rates>) ->
    model`, writing the given model's weights in place and returning that model (construct_gd_lsa,
    construct_gd_ssm, rnn_from_lsa, lstm_from_lsa, lstm_from_gated_rnn, lru_from_gated_rnn, retention_from_lsa,
    construct_fast_weight).
    """

    problem: Callable[..., str | None]
    apply: Callable[..., dict]
    description: str = ""  # one line: what the weights compute
    arch_types: tuple[str, ...] = ()  # the arch types it applies to, where not every type of its family
    knobs: type[Strict] = NoKnobs  # the source fields it takes (`source.<knob>`), with their defaults
    exact: bool = True  # the weights compute what the construction says exactly (False: an approximation, e.g. a linearisation)


@dataclass(frozen=True)
class WeightsFigure:
    """The weight matrices a model card draws for a family (weights.png)."""

    matrices: Callable[[ZooModel], dict[str, torch.Tensor] | None]  # None: nothing to draw for this model
    title: str  # after the entry's name
    alt: str  # the figure's alt text


def one_gd_step(arch) -> tuple[int, float]:
    return 1, 0.0


def no_token_limit(arch) -> tuple[str, int] | None:
    return None


@dataclass(frozen=True)
class Family:
    name: str
    arch: type  # the pydantic config schema; its `type` Literal lists the arch types it builds
    build: Callable[..., ZooModel]  # build(arch, task) -> the untrained model
    constructions: dict[str, ConstructionRule] = field(default_factory=dict)
    card: str = ""  # model-card prose: what the architecture is and computes (markdown)
    weights: WeightsFigure | None = None  # the card's weight figure
    # (GD steps, ridge) a model of this family is scored against when no construction says otherwise
    gd_reference: Callable[..., tuple[int, float]] = one_gd_step
    # (arch field, rows) of a position table that bounds the prompts a model of this arch reads; None: any length
    token_limit: Callable[..., tuple[str, int] | None] = no_token_limit

    @property
    def arch_types(self) -> tuple[str, ...]:
        return get_args(self.arch.model_fields["type"].annotation)
