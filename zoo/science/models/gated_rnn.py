"""Gated diagonal linear RNN (Zucchet et al. 2023, Eq. 2), and its dense-recurrence variant.

    x̃_t = [x_t, 1]                                   (an appended 1 instead of biases)
    g(z) = (W_m z) ⊙ (W_x z)                          linear gating (a GLU without the sigmoid)
    h_t = λ ⊙ h_{t−1} + g_in(x̃_t)                     diagonal:  λ = exp(−exp(ν)) ∈ [0, 1]
    h_t = A h_{t−1}   + g_in(x̃_t)                     dense variant
    y_t = D g_out(h_t)

The output at t includes x_t, like a causally masked attention layer that attends to itself.
The instantaneous map x ↦ D g_out(g_in(x̃)) is a degree-4 polynomial (zoo/science/analysis/polynomial.py).
ν = −100 gives a perfect-memory neuron (λ = exp(−e⁻¹⁰⁰) = 1 exactly in float32 and float64) and ν = 20 a
perfect-forget one (λ = exp(−e²⁰) = 0 exactly): the constructions use both. They stand for ν = ∓∞, which give
the same λ but not a finite weight to train from (at +∞ the gradient is e^∞ · 0 = NaN).

Glossary: `w_m_in, w_x_in` = W_m^in, W_x^in (n × (d+1)); `nu` = ν (n); `w_rec` = A (dense variant); `w_m_out, w_x_out` =
W_m^out, W_x^out (m × n); `readout` = D (d_out × m); n = `hidden`, m = `gates`.

Construction `rnn_from_lsa` (end of the file): the RNN that implements a given causal linear
self-attention layer exactly (Zucchet et al., Figure 1 and section 2.2). Full construction,
d² key-value neurons + d query neurons (n = d² + d), m = d² gates:

    kv neuron (i, j):  g_in = (W_V,i x)(W_K,j x),   λ = 1   → S_ij = Σ_{t'≤t} v_i k_j
    query neuron j:    g_in = (W_Q,j x)(1),          λ = 0   → q_j
    gate (i, j):       g_out = S_ij · q_j ;  D sums gates (i, ·) into output i  → y = S q

Compact construction, d(d+1)/2 key-value neurons (needs W_V invertible): the layer only depends
on W_V ⊗ W_KᵀW_Q, so use W_K' = W_V and W_Q' = W_V^{−T} W_Kᵀ W_Q; S = Σ v vᵀ is symmetric and
neuron (i ≤ j) stores v_i v_j. (The paper prints W_V^{−T} W_K^{−T} W_Q; the identity
W_V'ᵀ W_Q' = W_Kᵀ W_Q needs W_Kᵀ, which the tests check numerically.) A layer with an output
projection W_P is handled by folding it into the values: W_V ← W_P W_V.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from zoo.science.models.base import ConstructionRule, Family, WeightsFigure, ZooModel
from zoo.science.models.lsa import ImplementedLSA, implemented_lsa, lsa_problem, lsa_width
from zoo.science.models.scan import last_state, scan
from zoo.science.schema import Strict
from zoo.science.tasks.regression import Readout

PERFECT_MEMORY = -100.0  # ν = −100 → λ = exp(−3.7e-44) = 1 exactly, a finite weight (for ν = −∞)
PERFECT_FORGET = 20.0  # ν = 20 → λ = exp(−4.9e8) = 0 exactly, with a finite gradient (for ν = +∞, whose is NaN)


class GatedLinearRNN(ZooModel):
    residual = False

    def __init__(self, d_in: int, d_out: int, readout: Readout, hidden: int = 80, gates: int | None = None,
                 recurrence: str = "diagonal", init_std: float | None = None, lambda_range: tuple[float, float] = (0.0, 1.0)):
        super().__init__(d_in=d_in, d_out=d_out, readout=readout)
        gates = gates or hidden
        self.recurrence = recurrence
        self.has_parallel_form = recurrence == "diagonal"  # the dense recurrence is a Python loop over T
        std_in = init_std or (d_in + 1) ** -0.5
        std_out = init_std or hidden**-0.5
        self.w_m_in = nn.Parameter(torch.randn(hidden, d_in + 1) * std_in)
        self.w_x_in = nn.Parameter(torch.randn(hidden, d_in + 1) * std_in)
        if recurrence == "diagonal":
            # λ uniform in [r_min, r_max] as in minimal-LRU: ν = log(−log λ)
            lam = torch.empty(hidden).uniform_(*lambda_range).clamp(1e-4, 1 - 1e-4)
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

    @property
    def gates(self) -> int:
        return self.w_m_out.shape[0]

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
            return scan(self.lam().to(u.dtype), u, h0=h0, parallel=parallel)  # λ (n,) broadcasts over (B, T)
        h, hs = (torch.zeros_like(u[:, 0]) if h0 is None else h0), []
        for u_t in u.unbind(1):  # not u[:, t]: see scan.time_steps
            h = h @ self.w_rec.T + u_t
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

    def has_polynomial_map(self) -> bool:
        return True

    def instantaneous(self, x: torch.Tensor) -> torch.Tensor:
        """D g_out(g_in(x̃)): the output for a single token from a zero state."""
        return self.output(self.input_gate(x))

    def family_metrics(self, task, batch) -> dict:
        """Diagonal recurrence only: the memory leak (median 1 − λ of the memory neurons) and, on a task with a
        teacher (`task.teacher_weights()`), Table 1's KV/Q scores and the imperfect-memory effect."""
        if self.recurrence != "diagonal":
            return {}
        metrics = {}
        teacher = task.teacher_weights()
        if teacher is not None:
            metrics.update(kv_q_scores(self, teacher))
            metrics["imperfect_memory_effect"] = imperfect_memory_effect(self, batch.tokens[:512])
        leak = memory_leak(self)
        return metrics if leak is None else {**metrics, "memory_leak": leak}

    # ------------------------------------------------------------------ recurrence
    def state_shapes(self):
        return [("0.h", (self.hidden,))]

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        (h,) = state
        u = self.input_gate(token)
        h = self.lam() * h + u if self.recurrence == "diagonal" else h @ self.w_rec.T + u
        return self.output(h), (h,)


# ---------------------------------------------------------------------------- LSA → RNN
def rnn_size(d: int, compact: bool = False) -> dict[str, int]:
    """The gated RNN that implements a d × d LSA layer: d² (compact: d(d+1)/2) key-value neurons and d
    query neurons, d² gates."""
    return {"hidden": (d * (d + 1) // 2 if compact else d * d) + d, "gates": d * d}


@torch.no_grad()
def rnn_from_lsa(model: GatedLinearRNN, w_v: torch.Tensor, w_k: torch.Tensor, w_q: torch.Tensor, *,
                 compact: bool = False) -> GatedLinearRNN:
    """Set `model` (diagonal, sized by `rnn_size(d, compact)`) to the RNN that computes the causal LSA
    layer (W_V, W_K, W_Q) exactly, in place; returns it (as every construction does)."""
    d = w_v.shape[0]
    dtype = w_v.dtype
    if model.recurrence != "diagonal" or {"hidden": model.hidden, "gates": model.gates} != rnn_size(d, compact):
        raise ValueError(f"the {'compact' if compact else 'full'} construction for d = {d} needs a diagonal gated RNN "
                         f"with {rnn_size(d, compact)}")
    if compact:
        if torch.linalg.matrix_rank(w_v) < d:
            raise ValueError("the compact construction needs an invertible W_V (use the full construction)")
        w_q = torch.linalg.solve(w_v.T, w_k.T @ w_q)  # W_V^{−T} W_Kᵀ W_Q
        w_k = w_v
        pairs = [(i, j) for i in range(d) for j in range(i, d)]
    else:
        pairs = [(i, j) for i in range(d) for j in range(d)]
    kv_index = {p: n for n, p in enumerate(pairs)}
    n_kv = len(pairs)
    zeros = lambda p: torch.zeros(p.shape, dtype=dtype)  # built in the weights' dtype, cast on copy
    w_m_in, w_x_in = zeros(model.w_m_in), zeros(model.w_x_in)
    nu = torch.full((model.hidden,), PERFECT_MEMORY, dtype=dtype)
    for (i, j), n in kv_index.items():
        w_m_in[n, :d], w_x_in[n, :d] = w_v[i], w_k[j]
    for j in range(d):
        w_m_in[n_kv + j, :d] = w_q[j]
        w_x_in[n_kv + j, d] = 1.0  # the appended constant input
        nu[n_kv + j] = PERFECT_FORGET
    w_m_out, w_x_out, readout_matrix = zeros(model.w_m_out), zeros(model.w_x_out), zeros(model.readout_matrix)
    for i in range(d):
        for j in range(d):
            g = i * d + j
            w_m_out[g, kv_index[(min(i, j), max(i, j)) if compact else (i, j)]] = 1.0
            w_x_out[g, n_kv + j] = 1.0
            readout_matrix[i, g] = 1.0
    for name, value in dict(w_m_in=w_m_in, w_x_in=w_x_in, nu=nu, w_m_out=w_m_out, w_x_out=w_x_out,
                            readout_matrix=readout_matrix).items():
        getattr(model, name).copy_(value)
    return model


# ---------------------------------------------------------------------------- pruning
def active_neurons(rnn: GatedLinearRNN, tol: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks of hidden neurons and gates that can influence the output.

    A hidden neuron is dead if its input gating rows are zero (it never receives input) or
    its columns in both output gating matrices are zero (nothing reads it); a gate is dead if
    either of its rows is zero or D never reads it."""
    with torch.no_grad():
        feeds = (rnn.w_m_in.abs().amax(1) > tol) & (rnn.w_x_in.abs().amax(1) > tol)
        read = (rnn.w_m_out.abs().amax(0) > tol) | (rnn.w_x_out.abs().amax(0) > tol)
        hidden = feeds & read
        gates = (rnn.w_m_out[:, hidden].abs().amax(1) > tol) & (rnn.w_x_out[:, hidden].abs().amax(1) > tol) \
            & (rnn.readout_matrix.abs().amax(0) > tol)
    return hidden, gates


@torch.no_grad()
def prune(rnn: GatedLinearRNN, tol: float = 1e-6) -> GatedLinearRNN:
    """An equivalent smaller RNN without the neurons `active_neurons` finds dead."""
    hidden, gates = active_neurons(rnn, tol)
    small = GatedLinearRNN(rnn.d_in, rnn.d_out, rnn.readout, hidden=int(hidden.sum()), gates=int(gates.sum()))
    small = small.to(rnn.w_m_in.dtype)
    small.w_m_in.copy_(rnn.w_m_in[hidden])
    small.w_x_in.copy_(rnn.w_x_in[hidden])
    small.nu.copy_(rnn.nu[hidden])
    small.w_m_out.copy_(rnn.w_m_out[gates][:, hidden])
    small.w_x_out.copy_(rnn.w_x_out[gates][:, hidden])
    small.readout_matrix.copy_(rnn.readout_matrix[:, gates])
    return small


def gated_rnn_matrices(rnn: GatedLinearRNN) -> dict[str, torch.Tensor]:
    """Figure 2.A: the weights of the pruned network, hidden neurons sorted by λ."""
    small = prune(rnn)
    order = torch.argsort(small.lam(), descending=True)
    return {
        "W_m^in": small.w_m_in[order], "W_x^in": small.w_x_in[order], "λ": small.lam()[order].unsqueeze(1),
        "W_m^out": small.w_m_out[:, order], "W_x^out": small.w_x_out[:, order], "D": small.readout_matrix,
    }


# ---------------------------------------------------------------------------- the family
# ---------------------------------------------------------------------------- the family's probes
# Zucchet et al. §3: which neurons remember (λ ≈ 1) or forget (λ ≈ 0), and whether they encode a teacher's
# key-values and queries; `GatedLinearRNN.family_metrics` reports them (zoo/science/analysis/rnn.py prunes).
def r2_score(features: torch.Tensor, targets: torch.Tensor) -> float:
    """R² of the least-squares linear regression (with intercept) of targets on features,
    uniformly averaged over target columns (sklearn's default)."""
    phi = torch.cat([features, torch.ones_like(features[:, :1])], dim=1)
    sol = torch.linalg.lstsq(phi, targets, driver="gelsd").solution
    resid = targets - phi @ sol
    ss_res = (resid**2).sum(0)
    ss_tot = ((targets - targets.mean(0)) ** 2).sum(0).clamp_min(1e-300)
    return float((1 - ss_res / ss_tot).mean())


@torch.no_grad()
def lambda_groups(rnn: GatedLinearRNN, eps: float = 1e-2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masks over the hidden neurons: memory (λ > 1 − eps), forget (λ < eps) and leaky (the rest).
    The paper's "perfect memory" and "perfect forget" neurons are λ = 1 and 0; eps is the zoo's cut-off."""
    lam = rnn.lam()
    memory, forget = lam > 1 - eps, lam < eps
    return memory, forget, ~memory & ~forget


@torch.no_grad()
def kv_q_scores(rnn: GatedLinearRNN, lsa_weights: dict[str, torch.Tensor], *, n: int = 4096, eps: float = 1e-2,
                seed: int = 0) -> dict[str, float]:
    """Table 1's scores: 1 − R² of predicting key-values v kᵀ from the inputs of the active
    λ≈1 neurons, and queries W_Q x from the active λ≈0 neurons.

    Each neuron's input is a quadratic in x, and quadratics in d variables without their constant
    (the regression has an intercept) span only (d + 1)(d + 2)/2 − 1 dimensions (14 for d = 4):
    with that many generic active neurons in a group its score is 0 whatever they encode. The
    scores identify the teacher only for a student whose groups are smaller (the paper's pruned
    ones); `imperfect_memory_effect` and the polynomial distance do not have this blind spot."""
    rnn = copy.deepcopy(rnn).double()
    hidden, _ = active_neurons(rnn)
    memory, forget, _ = lambda_groups(rnn, eps)
    memory, forget = hidden & memory, hidden & forget
    x = torch.randn(n, rnn.d_in, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    u = rnn.input_gate(x)
    w_v, w_k, w_q = (lsa_weights[k].double() for k in ("w_v", "w_k", "w_q"))
    kv = ((x @ w_v.T).unsqueeze(2) * (x @ w_k.T).unsqueeze(1)).flatten(1)
    q = x @ w_q.T
    return {
        "kv_score": 1 - r2_score(u[:, memory], kv) if memory.any() else 1.0,
        "q_score": 1 - r2_score(u[:, forget], q) if forget.any() else 1.0,
        "memory_neurons": int(memory.sum()),
        "forget_neurons": int(forget.sum()),
        # a group of at least this many neurons scores 0 whatever it encodes (the quadratics' span, above)
        "score_span": (rnn.d_in + 1) * (rnn.d_in + 2) // 2 - 1,
        "prunable_neurons": int((~hidden).sum()),
        "prunable_gates": int((~active_neurons(rnn)[1]).sum()),
    }


@torch.no_grad()
def imperfect_memory_effect(rnn: GatedLinearRNN, tokens: torch.Tensor, *, eps: float = 1e-2) -> float:
    """How much the output relies on neurons that neither remember (λ ≈ 1) nor forget (λ ≈ 0):
    ‖f(x) − f_silenced(x)‖ / ‖f(x)‖ over `tokens` (B, T, d), silencing every active neuron with
    eps ≤ λ ≤ 1 − eps at once. The paper's identification assumes this is ~0; a student can reach
    a tiny loss while a band of λ ≈ 0.9–0.99 neurons jointly stands in for perfect memory, and
    then the KV score (over λ > 1 − eps only) stays large."""
    rnn = copy.deepcopy(rnn).double()
    tokens = tokens.double()
    hidden, _ = active_neurons(rnn)
    imperfect = hidden & lambda_groups(rnn, eps)[2]
    out = rnn(tokens)
    silence_hidden(rnn, imperfect)
    return float((rnn(tokens) - out).norm() / out.norm().clamp_min(1e-300))


@torch.no_grad()
def memory_leak(rnn: GatedLinearRNN) -> float | None:
    """Median 1 − λ over the active neurons with λ > 1/2 (None if there are none).

    A memory neuron with λ < 1 weights a context token k steps back by λ^k, and a trained
    network compensates by scaling up its instantaneous coefficients: Table 2's x_i² y_1 then
    exceeds GD's η* by about 1/mean_k λ^k (1 − λ = 0.004 over T = 12 tokens: +2.5%). The loss
    is nearly flat in λ there, so 1 − λ shrinks only as fast as the recurrent ν is moved."""
    hidden, _ = active_neurons(rnn)
    lam = copy.deepcopy(rnn).double().lam()  # 1 − λ in float32 would keep ~3 digits
    memory = hidden & (lam > 0.5)
    return float(torch.quantile(1 - lam[memory], 0.5)) if memory.any() else None


@torch.no_grad()
def silence_hidden(rnn: GatedLinearRNN, index: int | torch.Tensor) -> None:
    """Cut hidden neuron(s) `index` (an index or a mask) off their input: the state stays 0, so no gate
    reads anything from them."""
    rnn.w_m_in[index] = 0
    rnn.w_x_in[index] = 0


class GatedRNNArch(Strict):
    type: Literal["gated_rnn"]
    hidden: int = Field(80, gt=0)  # recurrent neurons |h|
    gates: int | None = Field(None, gt=0)  # output-gating neurons (default: hidden)
    recurrence: Literal["diagonal", "dense"] = "diagonal"  # Eq. 2, or the dense variant of Fig. 4
    init_std: float | None = Field(None, gt=0)  # default: 1/sqrt(fan-in)
    lambda_range: tuple[float, float] = (0.0, 1.0)  # initial λ ~ U(range) (diagonal)


def build(arch: GatedRNNArch, task) -> GatedLinearRNN:
    return GatedLinearRNN(
        d_in=task.token_dim, d_out=task.token_dim, readout=task.readout, hidden=arch.hidden, gates=arch.gates,
        recurrence=arch.recurrence, init_std=arch.init_std, lambda_range=arch.lambda_range,
    )


class RNNFromLSAKnobs(ImplementedLSA):
    compact: bool = False  # d(d+1)/2 key-value neurons instead of d² (section 2.2)


def compact_problem(source) -> str | None:
    """Why the compact construction cannot apply to the LSA `source` names, known before any weights exist."""
    if source.compact and source.lsa == "gd":
        return "compact = true needs an invertible W_V, and θ_GD's W_V has rank d_y (it reads only y): use compact = false"
    return None


def _rnn_from_lsa_problem(arch: GatedRNNArch, task, source) -> str | None:
    problem = lsa_problem(task, source) or compact_problem(source)
    if problem:
        return problem
    d = lsa_width(task)
    if arch.recurrence != "diagonal":
        return "'rnn_from_lsa' needs arch type 'gated_rnn' with diagonal recurrence"
    size = rnn_size(d, source.compact)
    if arch.hidden != size["hidden"] or (arch.gates or arch.hidden) != size["gates"]:
        return (f"the {'compact' if source.compact else 'full'} construction for d={d} needs hidden = {size['hidden']} "
                f"and gates = {size['gates']}")
    return None


def _apply_rnn_from_lsa(model: GatedLinearRNN, task, source, validation_batch=None) -> dict:
    weights, info = implemented_lsa(task, source, validation_batch)
    rnn_from_lsa(model, *weights, compact=source.compact)  # the float64 construction, cast to the model's dtype
    return {**info, "compact": source.compact}


FAMILY = Family(
    name="gated_rnn",
    arch=GatedRNNArch,
    build=build,
    constructions={"rnn_from_lsa": ConstructionRule(_rnn_from_lsa_problem, _apply_rnn_from_lsa,
                                                    "the RNN that implements an LSA layer exactly (θ_GD or the teacher)",
                                                    knobs=RNNFromLSAKnobs)},
    weights=WeightsFigure(lambda rnn: gated_rnn_matrices(rnn) if rnn.recurrence == "diagonal" else None,
                          "pruned weights, neurons sorted by λ (cf. Zucchet Fig. 2.A)",
                          "gating weights, λ and readout of the pruned network"),
    card="""
A gated diagonal linear RNN (Zucchet et al. 2023, Eq. 2): h_t = λ ⊙ h_{t−1} + (W_m x̃_t) ⊙ (W_x x̃_t),
y_t = D ((W_m' h_t) ⊙ (W_x' h_t)). Its instantaneous map is a degree-4 polynomial, and with perfect-memory
(λ = 1) key-value neurons and perfect-forget (λ = 0) query neurons it implements a causal linear
self-attention layer exactly (section 2.2), and so one step of gradient descent on in-context regression.
""",
)
