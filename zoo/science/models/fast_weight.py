"""The recurrent network of "Recurrent networks can learn in-context by gradient descent"
(shared/papers/002): a fast-weight (matrix-state) recurrence fed triples s_t = [x_t, y_t, x_{t+1}].

Embeddings and state (the paper's Eqs. 12–14, with E = [e_x(t), e_y(t), e_x(t+1)]):

    e_x(t) = U x_t,   e_y(t) = V y_t                                      U: d_u × d_x, V: d_v × d_y
    W_t = W_{t−1} 𝓘_t + e_y(t) e_x(t)ᵀ                                    W: d_v × d_u, W_0 = 0   (13)
    out_t = s_t · D W_t e_x(t+1)                                          a prediction of y_{t+1} (14)

`update` chooses 𝓘_t:
    "hebbian"  𝓘_t = I, the paper's approximation of Eq. 7's I − λ(2/N) X Xᵀ: W_t = Σ_{s≤t} e_y e_xᵀ,
               a linear recurrence with a parallel (cumulative-sum) form
    "delta"    𝓘_t = I − β e_x(t) e_x(t)ᵀ with the sum scaled by β: the exact one-sample gradient step
               W_t = W_{t−1} + β (e_y(t) − W_{t−1} e_x(t)) e_x(t)ᵀ (online GD, the delta rule / LMS),
               which the paper's approximation drops; input-dependent, so it is stepped in time
`position_scale` multiplies the output after t examples by s_t = 1 / (t + c) (c learned; s_t = 1
without it): one GD step on the prefix with the optimal η*_t ∝ 1/(t + d_x − 2 + κ) needs it.

D (d_out × d_v) reads the prediction out; the paper leaves it implicit (V = I, D = I).

Glossary: `u, v` = U, V; `d` = D; `beta` = β (delta rule); `offset` = c; `key_dim` = d_u,
`value_dim` = d_v; the state `W` is the paper's W[t], `count` is t.

Constructions (end of the file), with U = I, V = I so that e_x = x, e_y = y and W_t is d_y × d_x:

    hebbian_gd   W_t = Σ_{s≤t} y_s x_sᵀ (𝓘 = I, Eq. 13) and D = η I: after t examples the output is
                 η Σ_{s≤t} y_s x_sᵀ x_{t+1}, one GD step from W = 0 on the prefix (sum convention).
                 η fixed (the paper's constant λ: η = 2λ/N), or η*_t per position: D = I/σ_x²,
                 s_t = 1/(t + c) with c = d_x − 2 + κ gives η*_t = 1/(σ_x² (t + d_x − 2 + κ)).
    delta_rule   𝓘_t = I − η x_t x_tᵀ, D = I, β = η: W_t = W_{t−1} + η (y_t − W_{t−1} x_t) x_tᵀ,
                 online GD with one example per step (exact in the one-sample gradient).
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from zoo.science.models.base import ConstructionRule, Family, GDRate, ZooModel
from zoo.science.schema import Strict
from zoo.science.tasks.regression import Readout

UPDATES = ("hebbian", "delta")


class FastWeightRNN(ZooModel):
    def __init__(self, d_x: int, d_y: int, d_out: int, readout: Readout, *, key_dim: int | None = None,
                 value_dim: int | None = None, update: str = "hebbian", position_scale: bool = False,
                 init_std: float | None = None):
        super().__init__(d_in=2 * d_x + d_y, d_out=d_out, readout=readout)
        if update not in UPDATES:
            raise ValueError(f"update must be one of {UPDATES}, got {update!r}")
        self.d_x, self.d_y = d_x, d_y
        self.update, self.position_scale = update, position_scale
        self.has_parallel_form = update == "hebbian"  # the delta rule is a Python loop over T
        key_dim, value_dim = key_dim or d_x, value_dim or d_y
        self.u = nn.Parameter(torch.randn(key_dim, d_x) * (init_std or d_x**-0.5))
        self.v = nn.Parameter(torch.randn(value_dim, d_y) * (init_std or d_y**-0.5))
        self.d = nn.Parameter(torch.randn(d_out, value_dim) * (init_std or value_dim**-0.5))
        if update == "delta":
            self.beta = nn.Parameter(torch.tensor(0.1))
        if position_scale:
            self.offset = nn.Parameter(torch.tensor(float(d_x + 1)))

    @property
    def key_dim(self) -> int:
        return self.u.shape[0]

    @property
    def value_dim(self) -> int:
        return self.v.shape[0]

    def _embed(self, tokens: torch.Tensor):
        """(…, 2 d_x + d_y) triples → e_x(t), e_y(t), e_x(t+1)."""
        d_x, d_y = self.d_x, self.d_y
        x, y, x_next = tokens[..., :d_x], tokens[..., d_x : d_x + d_y], tokens[..., d_x + d_y :]
        return x @ self.u.T, y @ self.v.T, x_next @ self.u.T

    def _read(self, read: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """D (s_t · W_t e_x(t+1)) for reads (…, d_v) after `count` (…) examples."""
        if self.position_scale:
            read = read / (count + self.offset).unsqueeze(-1)
        return read @ self.d.T

    # ------------------------------------------------------------------ sequence form
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_chunk(tokens, None)[0]

    def forward_chunk(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        ex, ey, eq = self._embed(tokens)  # (B, T, d_u), (B, T, d_v), (B, T, d_u)
        B, T, _ = tokens.shape
        w0 = state[0] if state is not None else None  # (B, d_v, d_u)
        n0 = state[1] if state is not None and self.position_scale else tokens.new_zeros(B, 1)
        count = n0 + torch.arange(1, T + 1, device=tokens.device, dtype=tokens.dtype)  # (B, T)
        if self.update == "hebbian":
            w = torch.cumsum(ey.unsqueeze(-1) * ex.unsqueeze(-2), dim=1)  # (B, T, d_v, d_u): Σ_{s≤t} e_y e_xᵀ
            if w0 is not None:
                w = w + w0.unsqueeze(1)
            read = (w @ eq.unsqueeze(-1)).squeeze(-1)  # (B, T, d_v)
            last = w[:, -1]
        else:
            last = w0 if w0 is not None else ex.new_zeros(B, self.value_dim, self.key_dim)
            reads = []
            for t in range(T):
                last = self._delta(last, ex[:, t], ey[:, t])
                reads.append((last @ eq[:, t].unsqueeze(-1)).squeeze(-1))
            read = torch.stack(reads, dim=1)
        new_state = (last, count[:, -1:]) if self.position_scale else (last,)
        return self._read(read, count), new_state  # (B, T, d_out)

    def _delta(self, w: torch.Tensor, ex: torch.Tensor, ey: torch.Tensor) -> torch.Tensor:
        residual = ey - (w @ ex.unsqueeze(-1)).squeeze(-1)  # (B, d_v): e_y − W e_x
        return w + self.beta * residual.unsqueeze(-1) * ex.unsqueeze(-2)

    # ------------------------------------------------------------------ recurrence
    def state_shapes(self):
        w = ("0.w", (self.value_dim, self.key_dim))  # W_t, the fast weights
        return [w, ("0.count", (1,))] if self.position_scale else [w]  # count: t, for s_t = 1/(t + c)

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        ex, ey, eq = self._embed(token)  # (B, d_u), (B, d_v), (B, d_u)
        w = state[0]
        w = w + ey.unsqueeze(-1) * ex.unsqueeze(-2) if self.update == "hebbian" else self._delta(w, ex, ey)
        count = (state[1] if self.position_scale else token.new_zeros(token.shape[0], 1)) + 1  # (B, 1)
        out = self._read((w @ eq.unsqueeze(-1)).squeeze(-1), count.squeeze(-1))
        return out, ((w, count) if self.position_scale else (w,))


# ---------------------------------------------------------------------------- the family
class FastWeightArch(Strict):
    """The fast-weight network of "Recurrent networks can learn in-context by gradient descent"."""

    type: Literal["fast_weight"]
    update: Literal["hebbian", "delta"] = "hebbian"  # W += e_y e_xᵀ (Eq. 13, 𝓘 = I), or the exact delta rule 𝓘_t = I − β e_x e_xᵀ
    key_dim: int | None = Field(None, gt=0)  # d_u, width of e_x = U x (default: d_x)
    value_dim: int | None = Field(None, gt=0)  # d_v, width of e_y = V y (default: d_y)
    position_scale: bool = False  # scale the output after t examples by 1/(t + c): GD with η*_t per position
    init_std: float | None = Field(None, gt=0)  # default: 1/sqrt(fan-in)


def build(arch: FastWeightArch, task) -> FastWeightRNN:
    if getattr(task, "layout", None) != "triples":
        raise ValueError("the fast-weight network reads triples [x_t, y_t, x_{t+1}]: it needs a task with layout 'triples'")
    return FastWeightRNN(
        d_x=task.d_x, d_y=task.d_y, d_out=task.d_out, readout=task.readout, key_dim=arch.key_dim,
        value_dim=arch.value_dim, update=arch.update, position_scale=arch.position_scale, init_std=arch.init_std,
    )


def _problem(construction: str, arch: FastWeightArch, task, source) -> str | None:
    if task.kind != "linear_regression" or task.layout != "triples":
        return f"'{construction}' needs arch type 'fast_weight' on a linear_regression task with layout 'triples'"
    if (arch.key_dim or task.d_x) != task.d_x or (arch.value_dim or task.d_y) != task.d_y:
        return f"'{construction}' needs key_dim = d_x and value_dim = d_y (U = I, V = I)"
    update = "hebbian" if construction == "hebbian_gd" else "delta"
    if arch.update != update:
        return f"'{construction}' needs update = '{update}'"
    if construction == "hebbian_gd" and arch.position_scale != (source.eta == "analytic"):
        return "'hebbian_gd' with eta = 'analytic' (η*_t per position) needs position_scale = true; a fixed η needs false"
    if construction == "delta_rule" and (not isinstance(source.eta, float) or arch.position_scale):
        return "'delta_rule' needs a fixed eta (the online step size) and position_scale = false"
    return None


@torch.no_grad()
def construct_fast_weight(model: FastWeightRNN, task, construction: str, eta: float | str) -> FastWeightRNN:
    """Set `model` to `construction` ("hebbian_gd" at a fixed η or η*_t per position, or "delta_rule" at
    the online rate η) in place; returns it (as every construction does)."""
    model.u.copy_(torch.eye(task.d_x))
    model.v.copy_(torch.eye(task.d_y))
    if construction == "hebbian_gd" and eta == "analytic":
        model.d.copy_(torch.eye(task.d_y, dtype=torch.float64) / task.x_variance)
        model.offset.fill_(task.d_x - 2 + task.x_kurtosis)
        return model
    model.d.copy_(torch.eye(task.d_y, dtype=torch.float64) * (eta if construction == "hebbian_gd" else 1.0))
    if construction == "delta_rule":
        model.beta.fill_(eta)
    return model


def _apply(construction: str, model: FastWeightRNN, task, source, validation_batch=None) -> dict:
    construct_fast_weight(model, task, construction, source.eta)
    if construction == "delta_rule":  # scored against one GD step at η* like any model; its own rate is the online one
        return {"online_eta": float(source.eta)}
    if source.eta == "analytic":
        return {"eta": task.analytic_eta(), "gd_steps": 1, "eta_per_position": True}  # η at the query: η*_C
    return {"eta": float(source.eta), "gd_steps": 1}


def _rule(construction: str, description: str) -> ConstructionRule:
    return ConstructionRule(
        problem=functools.partial(_problem, construction),
        apply=functools.partial(_apply, construction),
        description=description,
        knobs=GDRate,
    )


FAMILY = Family(
    name="fast_weight",
    arch=FastWeightArch,
    build=build,
    constructions={
        "hebbian_gd": _rule("hebbian_gd", "one GD step from W = 0 on the prefix, at a fixed η or η*_t per position"),
        "delta_rule": _rule("delta_rule", "online GD, one example per step (the delta rule)"),
    },
    card="""
The recurrent network of "Recurrent networks can learn in-context by gradient descent": tokens are
triples s_t = [x_t, y_t, x_{t+1}], embedded as e_x = U x and e_y = V y; a matrix state (fast
weights) is updated W_t = W_{t−1}𝓘 + e_y(t) e_x(t)ᵀ (the note's Eq. 13) and the output
W_t e_x(t+1) predicts y_{t+1} at every position (Eq. 14), as soon as x_{t+1} arrives. With
U = V = I and 𝓘 = I (the note's approximation of Eq. 7's I − λ(2/N)XXᵀ), W_t = Σ_{s≤t} y_s x_sᵀ and
the output is one gradient-descent step from W = 0 on the prefix; with the exact one-example
𝓘_t = I − η x_t x_tᵀ it is online gradient descent (the delta rule). The state is the learned weight
matrix itself, so the model streams token by token in constant memory.
""",
)
