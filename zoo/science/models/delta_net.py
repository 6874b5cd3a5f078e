"""The delta rule as linear attention (DeltaNet: Schlag et al. 2021; Yang et al. 2024): a matrix state that
takes one online gradient-descent step per token on the in-context regression loss ½‖v − S k‖².

Per token e_t (the pairs layout: e_t = (x_t, y_t), the query (x_q, 0)):

    k_t = W_K e_t / ‖W_K e_t‖,  v_t = W_V e_t,  q_t = W_Q e_t,  β_t = σ(w_β · e_t + b_β)   (keys d_k, values d_v)
    o_t = S_{t−1} q_t                                   read first: the prediction from the examples before t
    S_t = S_{t−1} + β_t (v_t − S_{t−1} k_t) k_tᵀ        then learn: the delta rule, S_0 = 0      S: d_v × d_k
    out_t = W_O o_t                                     (d_out = token width; the task reads −out[y] at the query)

Keys are scaled to unit length (DeltaNet's L2 norm; `normalize_keys`): then β‖k‖² = β < 1 and every update
I − β k kᵀ is a contraction. With raw keys a step past β‖k‖² = 2 amplifies the state, and a randomly
initialised layer trained at Zucchet's recipe diverged within 2,000 steps (test loss 3e17). With raw keys
k = x, values v = y, queries q = x and β = η the query's output is S_C x_q, C steps of online GD (LMS) from
S = 0 at rate η: the `online_gd` construction, scored against the task's `online_gd_predict`.

Sequential and parallel forms, side by side (tested to agree; the parallel one is what the ONNX graphs hold):
    sequential  the two lines above, token by token (`step`; `forward` for short prompts, T ≤ 16)
    parallel    S_t = S_{t−1} A_t + B_t with A_t = I − β_t k_t k_tᵀ (d_k × d_k) and B_t = β_t v_t k_tᵀ is an
                affine map of S; maps compose as (P', Q') then (P, Q) = (P'P, Q'P + Q), so ⌈log₂ T⌉ doublings
                (Hillis–Steele, as zoo/science/models/scan.py does for diagonal recurrences) give every prefix
                S_t = S_0 P_t + Q_t at once. Products of the A_t (contractions for 0 < β‖k‖² < 2) keep it
                stable, where inverting the chunk's unit-triangular system by a Neumann series would not be.

Glossary (code → symbols): `w_k, w_v, w_q, w_o` = W_K, W_V, W_Q, W_O; `w_beta, b_beta` = w_β, b_β; state
`0.s` = S_t; `key_dim` = d_k, `value_dim` = d_v.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from zoo.science.models.base import ConstructionRule, Family, ZooModel
from zoo.science.models.scan import EXPORT_MAX_LEN, SHORT_SCAN_LEN, length_guard
from zoo.science.schema import Strict
from zoo.science.tasks.regression import Readout


class DeltaNet(ZooModel):
    # The doublings of an exported graph cover EXPORT_MAX_LEN tokens, and so does its length guard: the
    # chunk and whole-sequence graphs are valid up to that length (the export checks them at two lengths).
    chunk_len = EXPORT_MAX_LEN

    def __init__(self, d_in: int, d_out: int, readout: Readout, *, key_dim: int, value_dim: int,
                 normalize_keys: bool = True, init_std: float | None = None):
        super().__init__(d_in, d_out, readout)
        self.normalize_keys = normalize_keys
        std = init_std or d_in**-0.5
        self.w_k = nn.Parameter(torch.randn(key_dim, d_in) * std)  # (d_k, d_in)
        self.w_q = nn.Parameter(torch.randn(key_dim, d_in) * std)  # (d_k, d_in)
        self.w_v = nn.Parameter(torch.randn(value_dim, d_in) * std)  # (d_v, d_in)
        self.w_beta = nn.Parameter(torch.zeros(d_in))  # β_t = σ(w_β · e_t + b_β): 1/2 at initialisation
        self.b_beta = nn.Parameter(torch.zeros(()))
        self.w_o = nn.Parameter(torch.randn(d_out, value_dim) * (init_std or value_dim**-0.5))  # (d_out, d_v)

    @property
    def key_dim(self) -> int:
        return self.w_k.shape[0]

    @property
    def value_dim(self) -> int:
        return self.w_v.shape[0]

    def _project(self, e: torch.Tensor):
        """Keys, values, queries (…, d_k | d_v | d_k) and rates β (…) of tokens e (…, d_in)."""
        k = e @ self.w_k.T
        if self.normalize_keys:  # eps: a zero token (the padding of a prompt) keeps k = 0, a no-op update
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-12)
        return k, e @ self.w_v.T, e @ self.w_q.T, torch.sigmoid(e @ self.w_beta + self.b_beta)

    # ------------------------------------------------------------------ recurrence
    def state_shapes(self):
        return [("0.s", (self.value_dim, self.key_dim))]

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        k, v, q, beta = self._project(token)  # (B, d_k), (B, d_v), (B, d_k), (B,)
        s = state[0]  # (B, d_v, d_k)
        o = (s @ q.unsqueeze(-1)).squeeze(-1)  # (B, d_v): read before the update
        error = v - (s @ k.unsqueeze(-1)).squeeze(-1)  # (B, d_v): v − S k
        s = s + (beta.unsqueeze(-1) * error).unsqueeze(-1) * k.unsqueeze(-2)
        return o @ self.w_o.T, (s,)

    # ------------------------------------------------------------------ sequence forms
    def forward(self, tokens: torch.Tensor, *, parallel: bool | None = None) -> torch.Tensor:
        return self.forward_chunk(tokens, None, parallel=parallel)[0]

    def forward_chunk(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None, *,
                      parallel: bool | None = None):
        """Outputs (B, T, d_out) from `state` (None: S_0 = 0), and the state after the last token."""
        B, T, _ = tokens.shape
        s0 = state[0] if state is not None else tokens.new_zeros(B, self.value_dim, self.key_dim)
        if parallel is None:
            parallel = torch.compiler.is_exporting() or T > SHORT_SCAN_LEN
        if not parallel:
            outs, st = [], (s0,)
            for token in tokens.unbind(1):
                out, st = self.step(token, st)
                outs.append(out)
            return torch.stack(outs, 1), st
        if torch.compiler.is_exporting():  # an exported graph refuses T past its doublings' bound (a Gather)
            tokens = tokens * length_guard(tokens)
        k, v, q, beta = self._project(tokens)
        states = self.prefix_states(k, v, beta, s0)  # (B, T, d_v, d_k): S_t after token t
        before = torch.cat([s0.unsqueeze(1), states[:, :-1]], dim=1)  # S_{t−1}
        o = (before @ q.unsqueeze(-1)).squeeze(-1)  # (B, T, d_v)
        return o @ self.w_o.T, (states[:, -1],)

    @staticmethod
    def prefix_states(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
        """S_t for t = 1..T from S_0 (B, d_v, d_k), by composing the affine maps S ↦ S A_t + B_t in ⌈log₂ T⌉
        doublings (an exported graph: enough for EXPORT_MAX_LEN, since it cannot branch on its symbolic T;
        doublings past T change nothing)."""
        eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
        bk = beta.unsqueeze(-1) * k  # (B, T, d_k)
        p = eye - bk.unsqueeze(-1) * k.unsqueeze(-2)  # (B, T, d_k, d_k): A_t = I − β k kᵀ
        acc = bk.unsqueeze(-2) * v.unsqueeze(-1)  # (B, T, d_v, d_k): B_t = β v kᵀ
        T = k.shape[1]
        limit = EXPORT_MAX_LEN if torch.compiler.is_exporting() else T
        for doubling in range(math.ceil(math.log2(max(limit, 2)))):
            offset = 2**doubling
            # the maps ending `offset` tokens earlier (the identity (I, 0) before the start) come first
            p_before = F.pad(p - eye, (0, 0, 0, 0, offset, 0))[:, :T] + eye
            acc_before = F.pad(acc, (0, 0, 0, 0, offset, 0))[:, :T]
            acc = acc_before @ p + acc
            p = p_before @ p
        return s0.unsqueeze(1) @ p + acc


# ---------------------------------------------------------------------------- the family
class DeltaNetArch(Strict):
    """A DeltaNet layer (one head) on the pairs layout."""

    type: Literal["delta_net"]
    key_dim: int | None = Field(None, gt=0)  # d_k, width of keys and queries (default: d_x)
    value_dim: int | None = Field(None, gt=0)  # d_v, width of values (default: d_y)
    normalize_keys: bool = True  # keys scaled to unit length (DeltaNet's): every update a contraction
    init_std: float | None = Field(None, gt=0)  # default: 1/sqrt(fan-in)


def build(arch: DeltaNetArch, task) -> DeltaNet:
    if not task.has_gd_reference or task.layout != "pairs":
        raise ValueError("DeltaNet reads (x_t, y_t) pairs and predicts at the query: it needs a linear_regression "
                         "task with layout 'pairs'")
    return DeltaNet(task.token_dim, task.d_out, task.readout, key_dim=arch.key_dim or task.d_x,
                    value_dim=arch.value_dim or task.d_y, normalize_keys=arch.normalize_keys, init_std=arch.init_std)


class OnlineRate(Strict):
    """The knob of the online-GD construction: its rate η, in (0, 1) (β = σ(b_β) = η)."""

    # the step size; "online": the task's normalised-LMS rate 1/(σ_x² d_x) (LinearRegressionTask.online_eta)
    eta: float | Literal["online"] = "online"


def _online_gd_problem(arch: DeltaNetArch, task, source) -> str | None:
    if task.kind != "linear_regression" or task.layout != "pairs":
        return "'online_gd' needs a linear_regression task with layout 'pairs'"
    if (arch.key_dim or task.d_x) != task.d_x or (arch.value_dim or task.d_y) != task.d_y:
        return "'online_gd' needs key_dim = d_x and value_dim = d_y (k = q = x, v = y)"
    if arch.normalize_keys:
        return "'online_gd' needs normalize_keys = false (raw keys k = x: LMS, not its normalised form)"
    eta = task.build().online_eta() if source.eta == "online" else source.eta
    if not 0 < eta < 1:
        return f"'online_gd' takes a rate in (0, 1) (β is a sigmoid), got {eta:g}"
    return None


@torch.no_grad()
def construct_online_gd(model: DeltaNet, task, eta: float) -> DeltaNet:
    """k = q = x, v = y, β = η, W_O = −I on the y channels (the task reads −out there): the query's prediction is
    C steps of online GD from S = 0 at rate η. Writes `model` in place and returns it."""
    d_x, d_y = task.d_x, task.d_y
    for w in (model.w_k, model.w_q):
        w.zero_()[:, :d_x] = torch.eye(d_x)
    model.w_v.zero_()[:, d_x:] = torch.eye(d_y)
    model.w_beta.zero_()
    model.b_beta.fill_(math.log(eta / (1 - eta)))  # σ(b_β) = η
    model.w_o.zero_()[d_x:] = -torch.eye(d_y)
    return model


def _apply_online_gd(model: DeltaNet, task, source, validation_batch=None) -> dict:
    eta = task.online_eta() if source.eta == "online" else float(source.eta)
    construct_online_gd(model, task, eta)
    return {"online_eta": eta}  # scored against one GD step at η* like any model; its own rate is the online one


FAMILY = Family(
    name="delta_net",
    arch=DeltaNetArch,
    build=build,
    constructions={
        "online_gd": ConstructionRule(
            problem=_online_gd_problem, apply=_apply_online_gd, knobs=OnlineRate,
            description="online GD (the delta rule, LMS) over the context, one example per token, read at the query"),
    },
    card="""
A DeltaNet layer (Schlag et al. 2021; Yang et al. 2024): linear attention whose matrix state S is updated by
the delta rule, S_t = S_{t−1} + β_t (v_t − S_{t−1} k_t) k_tᵀ: one online gradient-descent step per token on
½‖v_t − S k_t‖², at a token-dependent rate β_t = σ(w_β · e_t + b_β). Each token first reads o_t = S_{t−1} q_t
(the prediction from the examples before it), then writes. With keys and queries x and values y it is online
gradient descent (least mean squares) over the prompt: the `online_gd` construction. The state is d_v × d_k,
so the model streams in constant memory; its chunk and whole-sequence graphs compose the per-token affine maps
S ↦ S (I − β k kᵀ) + β v kᵀ in ⌈log₂ T⌉ doublings.
""",
)
