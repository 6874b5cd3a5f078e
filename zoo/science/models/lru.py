"""Diagonal complex linear recurrences: the LRU (Orvieto et al. 2023, as in Zucchet et al. A.1)
with its three gating variants, and S5 (Smith et al. 2023) as used by Sushma, Tian et al.

LRU layer, per time step (h complex, n neurons; x the block input of width w):

    u_t = x_t                                   "out"      (LRU Out: the original)
    u_t = σ(W_m^in x_t) ⊙ (W_x^in x_t)           "in_out", "in_skip"   (extra input gating)
    h_t = λ ⊙ h_{t−1} + γ ⊙ (B u_t)                                          (Eq. 6)
    ỹ_t = Re[C h_t] + D ⊙ u_t                                                (Eq. 7, read as below)
    y_t = σ(W_m ỹ_t) ⊙ (W_x ỹ_t)                "out", "in_out"           (GLU, Eq. 8)
    y_t = σ(W_m x_t) ⊙ (W_x ỹ_t)                "in_skip": the m branch sees the input
    λ = exp(−exp(ν_log) + i exp(θ_log)),  γ = exp(γ_log)                       (Eq. 9)

S5 layer (zero-order-hold discretisation of a continuous diagonal SSM, timescale Δ):

    Λ = −exp(ν_log) + i θ,  λ = exp(Λ Δ),  B̄ = (λ − 1)/Λ · B,  Δ = exp(log_Δ)
    h_t = λ ⊙ h_{t−1} + B̄ u_t ;  y_t = GELU(Re[C h_t] + D ⊙ u_t)

The paper prints Eq. 7 as ỹ_{t+1} = Re[C h_t] + D x_{t+1}, the state before the update; the zoo reads the
updated state, as the LRU of Orvieto et al. does and as Eq. 2's gated RNN (y_t from h_t, which includes x_t)
needs for the constructions of Table 3 (stack_constructions.py).

Complex numbers are (re, im) pairs in a trailing axis of size 2 (see models/scan.py), so the
models export to ONNX; the state of a layer is `h` of shape (n, 2).

Glossary: `nu_log, theta_log, gamma_log` = ν^log, θ^log, γ^log; `b, c` = B, C as (…, 2) real
pairs; `d` = D; `w_m, w_x` = W_m, W_x; `w_m_in, w_x_in` = the input gating; n = `hidden`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.science.models.base import RecurrentBlock
from zoo.science.models.scan import complex_mul, scan

LRU_VARIANTS = ("out", "in_out", "in_skip")


def _complex_linear(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """weight (n, w, 2) applied to a real x (…, w) → (…, n, 2)."""
    return torch.stack([x @ weight[..., 0].T, x @ weight[..., 1].T], dim=-1)


def _from_polar(modulus: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
    """modulus · e^{i phase} as (re, im) pairs → (…, 2)."""
    return torch.stack([modulus * torch.cos(phase), modulus * torch.sin(phase)], dim=-1)


def _real_part_of_product(weight: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Re[C h] for C (w, n, 2) and h (…, n, 2) → (…, w)."""
    return h[..., 0] @ weight[..., 0].T - h[..., 1] @ weight[..., 1].T


class DiagonalComplexBlock(RecurrentBlock):
    """What LRU and S5 share: a complex diagonal recurrence driven by B u, read out by Re[C h] + D u."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.b = nn.Parameter(torch.randn(hidden, width, 2) / math.sqrt(2 * width))
        self.c = nn.Parameter(torch.randn(width, hidden, 2) / math.sqrt(hidden))
        self.d = nn.Parameter(torch.randn(width))

    def log_lam(self) -> torch.Tensor:  # (n, 2): log λ = (log|λ|, arg λ)
        raise NotImplementedError

    def lam(self) -> torch.Tensor:  # (n, 2)
        log_modulus, phase = self.log_lam().unbind(-1)
        return _from_polar(torch.exp(log_modulus), phase)

    def drive(self, u: torch.Tensor) -> torch.Tensor:  # (…, n, 2): the input term of the recurrence
        raise NotImplementedError

    def mix_input(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def mix_output(self, y_tilde: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_chunk(self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        u = self.mix_input(x)  # (B, T, w)
        h0 = None if state is None else state[0]  # (B, n, 2)
        h = scan(self.lam(), self.drive(u), complex_pairs=True, h0=h0)  # (B, T, n, 2)
        return self.mix_output(_real_part_of_product(self.c, h) + self.d * u, x), (h[:, -1],)

    def forward_last(self, x: torch.Tensor) -> torch.Tensor:
        """(B, w) at the last position, from the zero state: h_T = Σ_t λ^{T−1−t} ⊙ drive_t, one weighted
        sum with the powers exp((T−1−t) log λ) in closed form, and Re[C h] and the gates for the one
        position, where `forward` scans every h_t and reads each out."""
        u = self.mix_input(x)  # (B, T, w)
        k = torch.arange(x.shape[1] - 1, -1, -1, dtype=x.dtype, device=x.device)  # T−1−t
        log_power = k[:, None, None] * self.log_lam()  # (T, n, 2): log λ^{T−1−t}
        # λ^0 = 1 also where λ = 0 (log|λ| = −inf, and 0 · −inf is NaN)
        powers = _from_polar(torch.where(k[:, None] > 0, torch.exp(log_power[..., 0]), 1.0), log_power[..., 1])  # (T, n, 2)
        h = complex_mul(powers, self.drive(u)).sum(1)  # (B, n, 2)
        return self.mix_output(_real_part_of_product(self.c, h) + self.d * u[:, -1], x[:, -1])

    def state_shapes(self):
        return [("h", (self.hidden, 2))]

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]):
        (h,) = state
        u = self.mix_input(x)
        h = complex_mul(self.lam(), h) + self.drive(u)
        return self.mix_output(_real_part_of_product(self.c, h) + self.d * u, x), (h,)


class LRUBlock(DiagonalComplexBlock):
    def __init__(self, width: int, hidden: int, variant: str = "out", r_min: float = 0.0, r_max: float = 1.0,
                 max_phase: float = 2 * math.pi):
        super().__init__(width, hidden)
        if variant not in LRU_VARIANTS:
            raise ValueError(f"LRU variant must be one of {LRU_VARIANTS}, got {variant!r}")
        self.variant = variant
        # Orvieto et al.'s ring initialisation: |λ| uniform in [r_min, r_max] by area, phase in [0, max_phase]
        radius_sq = torch.empty(hidden).uniform_(r_min**2 + 1e-4, r_max**2 - 1e-4)
        self.nu_log = nn.Parameter(torch.log(-0.5 * torch.log(radius_sq)))
        self.theta_log = nn.Parameter(torch.log(torch.empty(hidden).uniform_(1e-3, max_phase)))
        self.gamma_log = nn.Parameter(torch.log(torch.sqrt(1 - radius_sq)))  # normalises the input
        self.w_m = nn.Parameter(torch.randn(width, width) / math.sqrt(width))
        self.w_x = nn.Parameter(torch.randn(width, width) / math.sqrt(width))
        if variant != "out":
            self.w_m_in = nn.Parameter(torch.randn(width, width) / math.sqrt(width))
            self.w_x_in = nn.Parameter(torch.randn(width, width) / math.sqrt(width))

    def log_lam(self) -> torch.Tensor:
        return torch.stack([-torch.exp(self.nu_log), torch.exp(self.theta_log)], dim=-1)

    def drive(self, u: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.gamma_log).unsqueeze(-1) * _complex_linear(self.b, u)

    def mix_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.variant == "out":
            return x
        return torch.sigmoid(x @ self.w_m_in.T) * (x @ self.w_x_in.T)

    def mix_output(self, y_tilde: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        gate = x if self.variant == "in_skip" else y_tilde
        return torch.sigmoid(gate @ self.w_m.T) * (y_tilde @ self.w_x.T)


class S5Block(DiagonalComplexBlock):
    def __init__(self, width: int, hidden: int, dt_range: tuple[float, float] = (1e-3, 1e-1)):
        super().__init__(width, hidden)
        # S4D-Lin initialisation: Λ_n = −½ + iπn
        self.nu_log = nn.Parameter(torch.full((hidden,), math.log(0.5)))
        self.theta = nn.Parameter(math.pi * torch.arange(hidden, dtype=torch.float32))
        self.log_dt = nn.Parameter(torch.empty(hidden).uniform_(math.log(dt_range[0]), math.log(dt_range[1])))

    def _continuous(self) -> tuple[torch.Tensor, torch.Tensor]:
        dt = torch.exp(self.log_dt)
        return -torch.exp(self.nu_log) * dt, self.theta * dt  # Λ Δ as (re, im)

    def log_lam(self) -> torch.Tensor:
        return torch.stack(self._continuous(), dim=-1)  # λ = exp(Λ Δ)

    def drive(self, u: torch.Tensor) -> torch.Tensor:
        # ZOH: B̄ = (λ − 1)/Λ · B; with ΛΔ = z, (λ − 1)/Λ = Δ (e^z − 1)/z
        re, im = self._continuous()
        lam = self.lam()
        numerator = torch.stack([lam[..., 0] - 1, lam[..., 1]], dim=-1)
        denominator = torch.stack([re, im], dim=-1) / torch.exp(self.log_dt).unsqueeze(-1)  # Λ
        norm = (denominator**2).sum(-1, keepdim=True)
        inverse = torch.stack([denominator[..., 0], -denominator[..., 1]], dim=-1) / norm
        factor = complex_mul(numerator, inverse)  # (n, 2)
        return complex_mul(factor, _complex_linear(self.b, u))

    def mix_output(self, y_tilde: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(y_tilde)
