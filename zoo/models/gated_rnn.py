"""Gated diagonal linear RNN (Zucchet et al. 2023, Eq. 2), and its dense-recurrence variant.

    x̃_t = [x_t, 1]                                   (an appended 1 instead of biases)
    g(z) = (W_m z) ⊙ (W_x z)                          linear gating (a GLU without the sigmoid)
    h_t = λ ⊙ h_{t−1} + g_in(x̃_t)                     diagonal:  λ = exp(−exp(ν)) ∈ [0, 1]
    h_t = A h_{t−1}   + g_in(x̃_t)                     dense variant
    y_t = D g_out(h_t)

The output at t includes x_t, like a causally masked attention layer that attends to itself.
The instantaneous map x ↦ D g_out(g_in(x̃)) is a degree-4 polynomial (zoo/analysis/polynomial.py).
ν = −∞ gives a perfect-memory neuron (λ = 1) and ν = +∞ a perfect-forget neuron (λ = 0):
the constructions use both exactly.

Glossary: `w_m_in, w_x_in` = W_m^in, W_x^in (n × (d+1)); `nu` = ν (n); `w_rec` = A (dense variant); `w_m_out, w_x_out` =
W_m^out, W_x^out (m × n); `readout` = D (d_out × m); n = `hidden`, m = `gates`.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.base import ZooModel
from zoo.models.scan import last_state, scan
from zoo.tasks.regression import Readout


class GatedLinearRNN(ZooModel):
    residual = False

    def __init__(self, d_in: int, d_out: int, readout: Readout, hidden: int = 80, gates: int | None = None,
                 recurrence: str = "diagonal", init_std: float | None = None, nu_range: tuple[float, float] = (0.0, 1.0)):
        super().__init__(d_in=d_in, d_out=d_out, readout=readout)
        gates = gates or hidden
        self.recurrence = recurrence
        self.dynamic_time = recurrence == "diagonal"  # the dense recurrence is a Python loop over T
        std_in = init_std or (d_in + 1) ** -0.5
        std_out = init_std or hidden**-0.5
        self.w_m_in = nn.Parameter(torch.randn(hidden, d_in + 1) * std_in)
        self.w_x_in = nn.Parameter(torch.randn(hidden, d_in + 1) * std_in)
        if recurrence == "diagonal":
            # λ uniform in [r_min, r_max] as in minimal-LRU: ν = log(−log λ)
            lam = torch.empty(hidden).uniform_(*nu_range).clamp(1e-4, 1 - 1e-4)
            self.nu = nn.Parameter(torch.log(-torch.log(lam)))
        elif recurrence == "dense":
            self.w_rec = nn.Parameter(torch.randn(hidden, hidden) * hidden**-0.5 * 0.5)  # A
        else:
            raise ValueError(f"recurrence must be 'diagonal' or 'dense', got {recurrence!r}")
        self.w_m_out = nn.Parameter(torch.randn(gates, hidden) * std_out)
        self.w_x_out = nn.Parameter(torch.randn(gates, hidden) * std_out)
        self.readout_matrix = nn.Parameter(torch.randn(d_out, gates) * gates**-0.5)

    @property
    def hidden(self) -> int:
        return self.w_m_in.shape[0]

    def lam(self) -> torch.Tensor:
        return torch.exp(-torch.exp(self.nu))  # (n,) in [0, 1]

    def recurrent_parameter_names(self) -> set[str]:
        """ν: trained without weight decay (paper, B.1) and, with a recipe's `recurrent_lr`, at
        that peak lr. Memory neurons approach λ = 1 only as fast as ν moves (1 − λ ≈ e^ν), and the
        loss is nearly flat there, so the step count decides how close to 1 they get."""
        return {"nu"} if self.recurrence == "diagonal" else set()

    def no_weight_decay(self) -> set[str]:
        return self.recurrent_parameter_names()

    def input_gate(self, x: torch.Tensor) -> torch.Tensor:
        x1 = torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)  # (..., d+1)
        return (x1 @ self.w_m_in.T) * (x1 @ self.w_x_in.T)  # (..., n)

    def output(self, h: torch.Tensor) -> torch.Tensor:
        return ((h @ self.w_m_out.T) * (h @ self.w_x_out.T)) @ self.readout_matrix.T  # (..., d_out)

    def forward(self, tokens: torch.Tensor, *, parallel: bool | None = None) -> torch.Tensor:
        return self.forward_chunk(tokens, None, parallel=parallel)[0]

    def forward_chunk(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None, *, parallel: bool | None = None):
        h = self.hidden_states(tokens, None if state is None else state[0], parallel=parallel)  # (B, T, n)
        return self.output(h), (h[:, -1],)  # (B, T, d_out), ((B, n),)

    def hidden_states(self, tokens: torch.Tensor, h0: torch.Tensor | None, *, parallel: bool | None = None) -> torch.Tensor:
        """h_1 … h_T (B, T, n) from h_0 (B, n) (None: zeros)."""
        u = self.input_gate(tokens)  # (B, T, n)
        if self.recurrence == "diagonal":
            return scan(self.lam().to(u.dtype).expand_as(u), u, h0=h0, parallel=parallel)
        h, hs = (torch.zeros_like(u[:, 0]) if h0 is None else h0), []
        for t in range(u.shape[1]):
            h = h @ self.w_rec.T + u[:, t]
            hs.append(h)
        return torch.stack(hs, dim=1)

    def predict(self, tokens: torch.Tensor) -> torch.Tensor:
        """The read-out. With one query position, D g_out runs at that position only (the other
        outputs are never read, and g_out's two n × m products are most of the FLOPs), and the
        diagonal recurrence there is one weighted sum h_q = Σ_t λ^{q−t} ⊙ g_in(x̃_t), not a scan."""
        if self.readout.position is None:
            return super().predict(tokens)
        end = self.readout.query_end(tokens.shape[1])
        if self.recurrence == "diagonal":
            u = self.input_gate(tokens[:, :end])  # (B, q, n)
            h = last_state(self.lam().to(u.dtype), u)  # (B, n)
        else:
            h = self.hidden_states(tokens[:, :end], None)[:, -1]
        return self.readout.channels(self.output(h))  # (B, d_y)

    def instantaneous(self, x: torch.Tensor) -> torch.Tensor:
        """D g_out(g_in(x̃)): the output for a single token from a zero state."""
        return self.output(self.input_gate(x))

    # ------------------------------------------------------------------ recurrence
    def state_names(self) -> list[str]:
        return ["0.h"]

    def init_state(self, batch: int) -> tuple[torch.Tensor, ...]:
        return (self._param_like().new_zeros(batch, self.hidden),)

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        (h,) = state
        u = self.input_gate(token)
        h = self.lam() * h + u if self.recurrence == "diagonal" else h @ self.w_rec.T + u
        return self.output(h), (h,)
