"""Mamba (Gu & Dao 2023): a selective state-space block, as a baseline of Sushma, Tian et al.

Per time step, with block input x_t ∈ R^w, expanded width e and state size N:

    (u_t, z_t)   = W_in x_t                              u, z ∈ R^e
    u_t          = SiLU(causal depthwise conv_k(u)_t)
    (δ_t, B_t, C_t) = W_x u_t                            δ ∈ R^r, B_t, C_t ∈ R^N   (selective)
    Δ_t          = softplus(W_dt δ_t + b_dt)             ∈ R^e
    h_t          = exp(Δ_t ⊗ A) ⊙ h_{t−1} + (Δ_t ⊗ B_t) ⊙ u_t        h ∈ R^{e×N}, A = −exp(A_log)
    y_t          = h_t C_t + D ⊙ u_t
    out_t        = W_out (y_t ⊙ SiLU(z_t))

`forward` runs the recurrence (input-dependent a_t = exp(Δ_t A)) with the scan `scan` picks
(sequential at the zoo's short prompts: the e·N-wide state makes each doubling pass costly)
or the one `parallel` forces; `step` keeps the last k−1 conv inputs and h.

Glossary: `in_proj` = W_in, `conv` = conv_k, `x_proj` = W_x, `dt_proj` = (W_dt, b_dt),
`a_log` = A_log, `d` = D, `out_proj` = W_out; e = `expand`·w, N = `state_size`, r = `dt_rank`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zoo.science.models.base import RecurrentBlock
from zoo.science.models.scan import causal_depthwise_conv, scan, with_history


class MambaBlock(RecurrentBlock):
    def __init__(self, width: int, state_size: int = 16, expand: int = 2, conv_kernel: int = 4, dt_rank: int | None = None):
        super().__init__()
        e = expand * width
        self.inner, self.state_size, self.kernel = e, state_size, conv_kernel
        self.dt_rank = dt_rank or math.ceil(width / 16)
        self.in_proj = nn.Linear(width, 2 * e, bias=False)
        self.conv = nn.Conv1d(e, e, conv_kernel, groups=e, padding=0)
        self.x_proj = nn.Linear(e, self.dt_rank + 2 * state_size, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, e)
        # Δ initialised in [1e-3, 1e-1] through the inverse softplus of the bias (as in Mamba)
        dt = torch.exp(torch.empty(e).uniform_(math.log(1e-3), math.log(1e-1)))
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.a_log = nn.Parameter(torch.log(torch.arange(1, state_size + 1, dtype=torch.float32)).repeat(e, 1))  # (e, N)
        self.d = nn.Parameter(torch.ones(e))
        self.out_proj = nn.Linear(e, width, bias=False)

    def _selective(self, u: torch.Tensor):
        """Δ ⊗ A and (Δ ⊗ B) ⊙ u, C for conv outputs u (…, e)."""
        dt_raw, b, c = self.x_proj(u).split([self.dt_rank, self.state_size, self.state_size], dim=-1)
        dt = F.softplus(self.dt_proj(dt_raw))  # (…, e)
        a = torch.exp(dt.unsqueeze(-1) * -torch.exp(self.a_log))  # (…, e, N)
        bu = (dt * u).unsqueeze(-1) * b.unsqueeze(-2)  # (…, e, N)
        return a, bu, c

    def forward(self, x: torch.Tensor, *, parallel: bool | None = None) -> torch.Tensor:
        return self.forward_chunk(x, None, parallel=parallel)[0]

    def forward_chunk(self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None, *, parallel: bool | None = None):
        B, T, _ = x.shape
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, e)
        conv_in, h0 = state if state is not None else (u.new_zeros(B, self.kernel - 1, self.inner), None)
        u, conv_in = with_history(conv_in, u)  # (B, k − 1 + T, e): the conv's inputs, earlier ones first
        u = F.silu(causal_depthwise_conv(u, self.conv))  # (B, T, e)
        a, bu, c = self._selective(u)
        h0 = None if h0 is None else h0.flatten(1)
        h = scan(a.flatten(2), bu.flatten(2), h0=h0, parallel=parallel).view(B, T, self.inner, self.state_size)  # (B, T, e, N)
        y = (h * c.unsqueeze(-2)).sum(-1) + self.d * u  # h_t C_t: (B, T, e); elementwise, so a compiled step fuses it
        return self.out_proj(y * F.silu(z)), (conv_in, h[:, -1])

    def state_shapes(self):
        return [("conv", (self.kernel - 1, self.inner)), ("h", (self.inner, self.state_size))]

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]):
        conv_in, h = state  # (B, k−1, e), (B, e, N)
        u, z = self.in_proj(x).chunk(2, dim=-1)
        window = torch.cat([conv_in, u.unsqueeze(1)], dim=1)  # (B, k, e)
        u = F.silu(causal_depthwise_conv(window, self.conv)[:, 0])  # (B, e)
        a, bu, c = self._selective(u)
        h = a * h + bu
        y = (h @ c.unsqueeze(-1)).squeeze(-1) + self.d * u
        return self.out_proj(y * F.silu(z)), (window[:, 1:], h)
