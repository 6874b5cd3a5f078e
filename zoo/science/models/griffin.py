"""Griffin (De et al. 2024): RG-LRU recurrent blocks mixed with local (sliding-window)
attention, as a baseline of Sushma, Tian et al. Both have constant-size state.

Recurrent block (two branches, block input x_t ∈ R^w, recurrence width e):

    g_t = GeLU(W_g x_t) ;  u_t = causal depthwise conv_k(W_u x_t)_t
    r_t = σ(W_a u_t + b_a),  i_t = σ(W_i u_t + b_i)                  recurrence and input gates
    log a_t = −c · r_t ⊙ softplus(−Λ)       (a_t = σ(Λ)^{c r_t}, c = 8)
    h_t = a_t ⊙ h_{t−1} + √(1 − a_t²) ⊙ (i_t ⊙ u_t)                  RG-LRU
    out_t = W_o (g_t ⊙ h_t)

Local attention block (one head, window W, the current token included):

    out_t = W_o Σ_{s = t−W+1..t, s ≥ 1} softmax_s(q_tᵀ k_s / √d_k) v_s

its state is the last W−1 keys and values and which of those slots are filled. The original
adds RMSNorm and MLP blocks; the zoo's comparison models have no norms (as Zucchet et al.).

Glossary: `lam` = Λ, `c` = 8; `w_g, w_u, w_o` = the branch projections; `gate_a, gate_i` =
(W_a, b_a), (W_i, b_i); `window` = W.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zoo.science.models.base import RecurrentBlock
from zoo.science.models.scan import causal_depthwise_conv, scan, with_history

RG_LRU_C = 8.0


class GriffinRecurrentBlock(RecurrentBlock):
    def __init__(self, width: int, expand: int = 1, conv_kernel: int = 4, r_min: float = 0.9, r_max: float = 0.999):
        super().__init__()
        e = expand * width
        self.inner, self.kernel = e, conv_kernel
        self.w_g = nn.Linear(width, e)
        self.w_u = nn.Linear(width, e)
        self.conv = nn.Conv1d(e, e, conv_kernel, groups=e)
        self.gate_a = nn.Linear(e, e)
        self.gate_i = nn.Linear(e, e)
        # a^c uniform in [r_min, r_max] at r = 1, as in the paper
        a = torch.empty(e).uniform_(r_min**2, r_max**2) ** (1 / RG_LRU_C)
        self.lam = nn.Parameter(torch.log(a / (1 - a)))  # σ(Λ) = a
        self.w_o = nn.Linear(e, width)

    def _recurrence_terms(self, u: torch.Tensor):
        log_a = -RG_LRU_C * torch.sigmoid(self.gate_a(u)) * F.softplus(-self.lam)
        a = torch.exp(log_a)
        b = torch.sqrt(torch.clamp(1 - a * a, min=1e-12)) * torch.sigmoid(self.gate_i(u)) * u
        return a, b

    def forward_chunk(self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        B, T, _ = x.shape
        g = F.gelu(self.w_g(x))
        conv_in, h0 = state if state is not None else (x.new_zeros(B, self.kernel - 1, self.inner), None)
        u, conv_in = with_history(conv_in, self.w_u(x))  # (B, k − 1 + T, e): the conv's inputs, earlier ones first
        u = causal_depthwise_conv(u, self.conv)  # (B, T, e)
        a, b = self._recurrence_terms(u)
        h = scan(a, b, h0=h0)  # (B, T, e)
        return self.w_o(g * h), (conv_in, h[:, -1])

    def state_shapes(self):
        return [("conv", (self.kernel - 1, self.inner)), ("h", (self.inner,))]

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]):
        conv_in, h = state
        g = F.gelu(self.w_g(x))
        window = torch.cat([conv_in, self.w_u(x).unsqueeze(1)], dim=1)  # (B, k, e)
        u = causal_depthwise_conv(window, self.conv)[:, 0]  # (B, e)
        a, b = self._recurrence_terms(u)
        h = a * h + b
        return self.w_o(g * h), (window[:, 1:], h)


class LocalAttentionBlock(RecurrentBlock):
    chunk_len = 256  # a chunk attends within itself through a (T, W − 1 + T) mask
    def __init__(self, width: int, window: int = 8, head_dim: int | None = None):
        super().__init__()
        self.window, self.head_dim = window, head_dim or width
        self.qkv = nn.Linear(width, 3 * self.head_dim, bias=False)
        self.w_o = nn.Linear(self.head_dim, width, bias=False)

    def forward_chunk(self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (B, T, d)
        B, T, _ = x.shape
        if state is None:
            w = self.window - 1
            keys, values, filled = k.new_zeros(B, w, self.head_dim), v.new_zeros(B, w, self.head_dim), x.new_zeros(B, w)
        else:
            keys, values, filled = state  # (B, W−1, d), (B, W−1, d), (B, W−1) oldest first
        (keys, new_keys), (values, new_values) = with_history(keys, k), with_history(values, v)  # (B, W−1+T, d)
        filled, new_filled = with_history(filled, x.new_ones(B, T))  # (B, W−1+T)
        t = torch.arange(T, device=x.device) + self.window - 1  # the queries' slots
        lag = t.unsqueeze(1) - torch.arange(keys.shape[1], device=x.device)  # [t, s] = t − s
        allowed = (lag >= 0) & (lag < self.window) & (filled.unsqueeze(1) > 0)  # (B, T, W−1+T)
        scores = (q @ keys.transpose(1, 2)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = self.w_o(torch.softmax(scores, dim=-1) @ values)
        return out, (new_keys, new_values, new_filled)

    def forward_last(self, x: torch.Tensor) -> torch.Tensor:
        """(B, width) at the last position: its query against the keys and values of the last W tokens."""
        q, k, v = self.qkv(x[:, -self.window :]).chunk(3, dim=-1)  # (B, min(W, T), d)
        scores = (k @ q[:, -1].unsqueeze(-1)).squeeze(-1) / math.sqrt(self.head_dim)  # (B, min(W, T))
        return self.w_o((torch.softmax(scores, dim=-1).unsqueeze(1) @ v).squeeze(1))

    def state_shapes(self):
        w, d = self.window - 1, self.head_dim
        return [("keys", (w, d)), ("values", (w, d)), ("filled", (w,))]

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]):
        keys, values, filled = state  # (B, W−1, d), (B, W−1, d), (B, W−1) oldest first
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        keys = torch.cat([keys, k.unsqueeze(1)], dim=1)  # (B, W, d)
        values = torch.cat([values, v.unsqueeze(1)], dim=1)
        filled = torch.cat([filled, torch.ones_like(filled[:, :1])], dim=1)
        scores = (keys @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(self.head_dim)  # (B, W)
        scores = scores.masked_fill(filled == 0, float("-inf"))
        out = (torch.softmax(scores, dim=-1).unsqueeze(1) @ values).squeeze(1)
        return self.w_o(out), (keys[:, 1:], values[:, 1:], filled[:, 1:])
