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
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.base import ZooModel
from zoo.tasks.regression import Readout

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
        self.dynamic_time = update == "hebbian"  # the delta rule is a Python loop over T
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
    def state_names(self) -> list[str]:
        return ["0.w", "0.count"] if self.position_scale else ["0.w"]

    def init_state(self, batch: int) -> tuple[torch.Tensor, ...]:
        p = self._param_like()
        w = p.new_zeros(batch, self.value_dim, self.key_dim)
        return (w, p.new_zeros(batch, 1)) if self.position_scale else (w,)

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        ex, ey, eq = self._embed(token)  # (B, d_u), (B, d_v), (B, d_u)
        w = state[0]
        w = w + ey.unsqueeze(-1) * ex.unsqueeze(-2) if self.update == "hebbian" else self._delta(w, ex, ey)
        count = (state[1] if self.position_scale else token.new_zeros(token.shape[0], 1)) + 1  # (B, 1)
        out = self._read((w @ eq.unsqueeze(-1)).squeeze(-1), count.squeeze(-1))
        return out, ((w, count) if self.position_scale else (w,))
