"""Reverse-engineering gated RNNs (Zucchet et al. section 3): which neurons remember (λ ≈ 1),
which forget (λ ≈ 0), whether they linearly encode key-values and queries (KV / Q scores),
and which neurons can be pruned without changing the function."""

from __future__ import annotations

import copy
from typing import Callable

import torch

from zoo.science.models.gated_rnn import GatedLinearRNN, active_neurons, gated_rnn_matrices, prune  # noqa: F401  (re-exported)


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


@torch.no_grad()
def silence_gate(rnn: GatedLinearRNN, index: int) -> None:
    """Cut gate `index` off the read-out: D never reads it."""
    rnn.readout_matrix[:, index] = 0


@torch.no_grad()
def prune_by_function(rnn: GatedLinearRNN, loss: Callable[[GatedLinearRNN], float], *, hidden: int, gates: int,
                      groups: list[tuple[torch.Tensor, int]] | None = None) -> tuple[GatedLinearRNN, list[dict]]:
    """Greedy pruning by function (the zoo's, not the paper's exact-zero pruning `prune`): silence the
    hidden neuron whose silencing raises `loss(rnn)` least, one at a time, until `hidden` are left;
    then the gates the same way down to `gates`. `groups` (masks over the hidden neurons, each with how
    many of it to keep; `hidden` is then unused) prunes each group to its own count instead, each cut
    the least harmful among the groups still too large. Returns the smaller RNN and the curve of
    (hidden, gates, loss) after each cut."""
    rnn = copy.deepcopy(rnn)
    alive_hidden, alive_gates = active_neurons(rnn)
    groups = groups if groups is not None else [(torch.ones_like(alive_hidden), hidden)]
    curve = [{"hidden": int(alive_hidden.sum()), "gates": int(alive_gates.sum()), "loss": loss(rnn)}]

    def cut(alive: torch.Tensor, candidates: torch.Tensor, silence) -> None:
        trials = []
        for i in candidates.nonzero().flatten().tolist():
            trial = copy.deepcopy(rnn)
            silence(trial, i)
            trials.append((loss(trial), i))
        best_loss, best = min(trials)
        silence(rnn, best)
        alive[best] = False
        now_hidden, now_gates = active_neurons(rnn)
        curve.append({"hidden": int(now_hidden.sum()), "gates": int(now_gates.sum()), "loss": best_loss})

    while True:
        too_large = [mask for mask, keep in groups if int((alive_hidden & mask).sum()) > keep]
        if not too_large:
            break
        cut(alive_hidden, alive_hidden & torch.stack(too_large).any(0), silence_hidden)
    alive_gates = active_neurons(rnn)[1]  # gates that only read silenced neurons are dead already
    while int(alive_gates.sum()) > gates:
        cut(alive_gates, alive_gates.clone(), silence_gate)
    return prune(rnn), curve
