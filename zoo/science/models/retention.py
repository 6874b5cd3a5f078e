"""Retention (Sun et al. 2023, RetNet): linear attention whose state decays by a scalar γ per head.

One layer of H heads of width d_h on tokens e_t ∈ R^d; per head h:

    q_t = W_Q^h e_t,   k_t = W_K^h e_t,   v_t = W_V^h e_t                 (d_h each)
    S_t = γ_h S_{t−1} + v_t k_tᵀ          S_0 = 0                         (d_h × d_h)   (1)
    o_t = S_t q_t                                                        (d_h)         (2)
    out_t = W_O [o_t^1; …; o_t^H]          (+ e_t with `residual`)        (d)

Recurrent form: (1)–(2), one token at a time; the state is the matrix S of every head, whatever the
stream's length. Parallel form (the same outputs, every position at once), per head:

    O = ((Q Kᵀ) ⊙ D) V,      D_ts = γ^{t−s} for s ≤ t, 0 for s > t                       (3)

and continued from a state S_in reached by earlier tokens (a chunk of length T, t = 0 … T−1):
o_t = γ^{t+1} S_in q_t + Σ_{s≤t} D_ts (k_sᵀ q_t) v_s, and S_out = γ^T S_in + Σ_s γ^{T−1−s} v_s k_sᵀ.

γ_h = exp(−exp(ν_h)) ∈ (0, 1]; ν = −∞ gives γ = 1 exactly. At γ = 1, S_t = Σ_{s≤t} v_s k_sᵀ and a
head is causal linear self-attention (zoo/science/models/lsa.py, attention = "causal", residual = false:
Zucchet et al. Eq. 1), so every construction of an LSA layer carries over: `retention_from_lsa`
puts the LSA layer (θ_GD at η, or an lsa_teacher task's teacher) into head 0 with W_O = I, the
other heads off. With θ_GD that is one step of gradient descent on the in-context least-squares
loss (von Oswald et al. 2023, Proposition 1); the query token (x_q, 0) leaves as (·, −ŷ_GD), hence
the task's read-out sign −1. Left out of RetNet: the group norm, the swish output gate and the xPos
rotation, each of which would break that equivalence; γ is a parameter here (RetNet fixes
γ_h = 1 − 2^{−5−h}, the default initial value), left as initialised with `source.freeze = ["nu"]`.

Glossary: e = `tokens` (B, T, d); `w_q, w_k, w_v` = W_Q, W_K, W_V of every head stacked (H·d_h, d);
`w_o` = W_O (d, H·d_h); `nu` = ν (H,), γ = `gamma()`; S = the state `0.S` (B, H, d_h, d_h);
D = `decay_mask`; H = `heads`, d_h = `head_dim`, d = d_x + d_y the token width.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from zoo.science.models.base import ConstructionRule, Family, WeightsFigure, ZooModel
from zoo.science.models.lsa import ImplementedLSA, implemented_lsa, lsa_problem, lsa_width
from zoo.science.schema import Strict
from zoo.science.tasks.regression import Readout


def retnet_gammas(heads: int) -> torch.Tensor:
    """RetNet's multi-scale decays γ_h = 1 − 2^{−5−h} (Sun et al. 2023, section 2.2), h = 0 … H−1."""
    return 1 - 2.0 ** (-5 - torch.arange(heads, dtype=torch.float64))


class Retention(ZooModel):
    chunk_len = 256  # a chunk attends within itself through a (T, T) mask: keep it small

    def __init__(self, d: int, readout: Readout, heads: int = 1, head_dim: int | None = None,
                 gamma: float | None = None, residual: bool = False, init_std: float | None = None):
        super().__init__(d_in=d, d_out=d, readout=readout)
        self.heads, self.head_dim, self.residual = heads, head_dim or d, residual
        width = heads * self.head_dim
        std_in, std_out = init_std or d**-0.5, init_std or width**-0.5
        self.w_q = nn.Parameter(torch.randn(width, d) * std_in)
        self.w_k = nn.Parameter(torch.randn(width, d) * std_in)
        self.w_v = nn.Parameter(torch.randn(width, d) * std_in)
        self.w_o = nn.Parameter(torch.randn(d, width) * std_out)
        gammas = retnet_gammas(heads) if gamma is None else torch.full((heads,), float(gamma), dtype=torch.float64)
        self.nu = nn.Parameter(torch.log(-torch.log(gammas)).float())  # γ = 1 → ν = −∞

    def gamma(self) -> torch.Tensor:
        return torch.exp(-torch.exp(self.nu))  # (H,) in (0, 1]

    def no_weight_decay(self) -> set[str]:
        """ν: a decay pulling it to 0 would pull every γ to e⁻¹ (as the gated RNN's ν, Zucchet B.1)."""
        return {"nu"}

    def recurrent_parameter_names(self) -> set[str]:
        return {"nu"}

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(…, H·d_h) → (…, H, d_h)."""
        return x.unflatten(-1, (self.heads, self.head_dim))

    def _qkv(self, e: torch.Tensor):
        return self._split(e @ self.w_q.T), self._split(e @ self.w_k.T), self._split(e @ self.w_v.T)

    def _out(self, o: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """W_O [o^1; …; o^H] (+ e): o (…, H, d_h) → (…, d)."""
        out = o.flatten(-2) @ self.w_o.T
        return e + out if self.residual else out

    def decay_mask(self, T: int, like: torch.Tensor) -> torch.Tensor:
        """D (H, T, T): D_ts = γ^{t−s} = exp(−(t − s) e^ν) for s ≤ t, else 0 (exact 1 on the diagonal, and everywhere at γ = 1)."""
        t = torch.arange(T, device=like.device, dtype=like.dtype)
        lag = t.unsqueeze(1) - t.unsqueeze(0)  # (T, T): t − s
        rate = torch.exp(self.nu).to(like.dtype).view(-1, 1, 1)  # (H, 1, 1): −log γ
        return torch.exp(torch.where(lag >= 0, -lag * rate, -math.inf))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_chunk(tokens, None)[0]

    def forward_chunk(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        """The parallel form (3), continued from `state` (None: S = 0)."""
        e = tokens  # (B, T, d)
        T = e.shape[1]
        q, k, v = (x.transpose(1, 2) for x in self._qkv(e))  # (B, H, T, d_h)
        mask = self.decay_mask(T, e)  # (H, T, T)
        o = ((q @ k.transpose(-1, -2)) * mask) @ v  # (B, H, T, d_h): Σ_s D_ts (k_sᵀ q_t) v_s
        rate = torch.exp(self.nu).to(e.dtype).view(-1, 1, 1)  # (H, 1, 1)
        t = torch.arange(T, device=e.device, dtype=e.dtype).view(1, -1, 1)  # (1, T, 1)
        to_end = mask[:, -1].unsqueeze(-1)  # (H, T, 1): γ^{T−1−s}
        s_new = (v * to_end).transpose(-1, -2) @ k  # (B, H, d_h, d_h): Σ_s γ^{T−1−s} v_s k_sᵀ
        if state is not None:
            (s_in,) = state  # (B, H, d_h, d_h)
            o = o + torch.exp(-(t + 1) * rate) * (q @ s_in.transpose(-1, -2))  # γ^{t+1} S_in q_t
            s_new = s_new + torch.exp(-(t[:, -1:] + 1) * rate) * s_in  # γ^T S_in
        return self._out(o.transpose(1, 2), e), (s_new,)  # (B, T, d), ((B, H, d_h, d_h),)

    def predict(self, tokens: torch.Tensor) -> torch.Tensor:
        """The read-out. With one query position q, only o_q is read: S_q q_q with the state as one
        weighted sum, S_q = Σ_{s≤q} γ^{q−s} v_s k_sᵀ, so o_q = Σ_s γ^{q−s} (k_sᵀ q_q) v_s (no T × T mask)."""
        if self.readout.position is None:
            return super().predict(tokens)
        e = tokens[:, : self.readout.query_end(tokens.shape[1])]  # (B, q, d)
        q = self._split(e[:, -1] @ self.w_q.T)  # (B, H, d_h): the query's only
        k, v = self._split(e @ self.w_k.T), self._split(e @ self.w_v.T)  # (B, q, H, d_h)
        lag = torch.arange(e.shape[1] - 1, -1, -1, device=e.device, dtype=e.dtype).unsqueeze(1)  # (q, 1): q − s
        weight = torch.exp(-lag * torch.exp(self.nu).to(e.dtype)) * (k * q.unsqueeze(1)).sum(-1)  # (B, q, H): γ^{q−s} k_sᵀ q_q
        o = (weight.unsqueeze(-1) * v).sum(1)  # (B, H, d_h)
        return self.readout.channels(self._out(o, e[:, -1]))  # (B, d_y)

    def has_polynomial_map(self) -> bool:
        return True

    def instantaneous(self, x: torch.Tensor) -> torch.Tensor:
        """W_O [(W_V^h x)(W_K^h x)ᵀ(W_Q^h x)]_h for single tokens x (…, d): the layer's degree-3 kernel
        (γ does not enter: one token from the zero state)."""
        q, k, v = self._qkv(x)  # (…, H, d_h)
        return self._out((k * q).sum(-1, keepdim=True) * v, torch.zeros_like(x))

    # ---------------------------------------------------------------- recurrence
    def state_shapes(self):
        return [("0.S", (self.heads, self.head_dim, self.head_dim))]  # S = Σ γ^{t−s} v_s k_sᵀ per head

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        """(1)–(2) for one token (B, d) with state S (B, H, d_h, d_h)."""
        (s,) = state
        q, k, v = self._qkv(token)  # (B, H, d_h)
        s = self.gamma().to(s.dtype).view(-1, 1, 1) * s + v.unsqueeze(-1) * k.unsqueeze(-2)  # γ S + v kᵀ
        o = (s @ q.unsqueeze(-1)).squeeze(-1)  # (B, H, d_h): S q
        return self._out(o, token), (s,)


# ---------------------------------------------------------------------------- construction
@torch.no_grad()
def retention_from_lsa(model: Retention, w_pv: torch.Tensor, w_k: torch.Tensor, w_q: torch.Tensor) -> Retention:
    """Head 0 = the causal LSA layer (W_P W_V, W_K, W_Q) (each d × d) at γ = 1, read out by W_O = I;
    the other heads (and the rest of head 0's width) are zero."""
    d = w_q.shape[0]
    for p in (model.w_q, model.w_k, model.w_v, model.w_o):
        p.zero_()
    model.w_q[:d].copy_(w_q)
    model.w_k[:d].copy_(w_k)
    model.w_v[:d].copy_(w_pv)
    model.w_o[:, :d].copy_(torch.eye(d))
    model.nu.fill_(-math.inf)  # γ = 1 in every head
    return model


def _from_lsa_problem(arch: RetentionArch, task, source) -> str | None:
    problem = lsa_problem(task, source)
    if problem:
        return problem
    d = lsa_width(task)
    if arch.residual or arch.gamma != 1:
        return "'retention_from_lsa' needs gamma = 1 and residual = false: then a head is causal LSA (Zucchet Eq. 1)"
    if (arch.head_dim or d) < d:
        return f"'retention_from_lsa' needs head_dim ≥ d = {d}"
    return None


def _apply_from_lsa(model: Retention, task, source, validation_batch=None) -> dict:
    weights, info = implemented_lsa(task, source, validation_batch)  # θ_GD at the entry's η, or the teacher
    retention_from_lsa(model, *weights)
    return info


def retention_matrices(model: Retention) -> dict[str, torch.Tensor]:
    """Per head, the products that identify θ_GD up to symmetry, W_Kᵀ W_Q and W_O W_V; and γ."""
    out = {}
    for h in range(model.heads):
        rows = slice(h * model.head_dim, (h + 1) * model.head_dim)
        out[f"head {h}: W_Kᵀ W_Q"] = model.w_k[rows].T @ model.w_q[rows]
        out[f"head {h}: W_O W_V"] = model.w_o[:, rows] @ model.w_v[rows]
    out["γ per head"] = model.gamma().unsqueeze(0)
    return out


# ---------------------------------------------------------------------------- the family
class RetentionArch(Strict):
    type: Literal["retention"]
    heads: int = Field(1, ge=1)  # H
    head_dim: int | None = Field(None, gt=0)  # d_h (default: the token width d)
    gamma: float | None = Field(None, gt=0, le=1)  # initial γ of every head; None: RetNet's 1 − 2^{−5−h}
    residual: bool = False  # out = e + W_O o; False: out = W_O o (Zucchet Eq. 1's LSA layer)
    init_std: float | None = Field(None, gt=0)  # N(0, init_std²) weights; default 1/sqrt(fan-in)


def build(arch: RetentionArch, task) -> Retention:
    return Retention(d=task.token_dim, readout=task.readout, heads=arch.heads, head_dim=arch.head_dim,
                     gamma=arch.gamma, residual=arch.residual, init_std=arch.init_std)


FAMILY = Family(
    name="retention",
    arch=RetentionArch,
    build=build,
    constructions={"retention_from_lsa": ConstructionRule(
        _from_lsa_problem, _apply_from_lsa, "retention at γ = 1 = a causal LSA layer (θ_GD or the teacher), in head 0",
        knobs=ImplementedLSA)},
    weights=WeightsFigure(retention_matrices, "weight products per head, and γ",
                          "W_K^T W_Q and W_O W_V of every head, and each head's decay γ"),
    card="""
Retention (Sun et al. 2023, RetNet), one layer of H heads: per head the state is a matrix that
decays by a scalar γ each token, S_t = γ S_{t−1} + v_t k_tᵀ, and the output is o_t = S_t q_t, read
out by W_O; in parallel form O = ((Q Kᵀ) ⊙ D) V with D_ts = γ^{t−s} (s ≤ t). At γ = 1 a head is
causal linear self-attention, so von Oswald et al.'s θ_GD carries over: one head with
W_K = W_Q = [[I,0],[0,0]], W_V = η[[0,0],[0,−I]] and W_O = I computes one step of gradient descent
on the in-context least-squares loss. RetNet's group norm, swish gate and xPos rotation are left
out (each would break that equivalence); γ = exp(−exp(ν)) is a parameter, starting at RetNet's
1 − 2^{−5−h}.
""",
)
