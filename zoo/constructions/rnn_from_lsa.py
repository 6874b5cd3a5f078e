"""A gated diagonal linear RNN (Eq. 2) that implements a given linear self-attention layer
exactly (Zucchet et al., Figure 1 and section 2.2).

Full construction, d² key-value neurons + d query neurons (n = d² + d), m = d² gates:
    kv neuron (i, j):  g_in = (W_V,i x)(W_K,j x),   λ = 1   → S_ij = Σ_{t'≤t} v_i k_j
    query neuron j:    g_in = (W_Q,j x)(1),          λ = 0   → q_j
    gate (i, j):       g_out = S_ij · q_j ;  D sums gates (i, ·) into output i  → y = S q

Compact construction, d(d+1)/2 key-value neurons (needs W_V invertible): the layer only depends
on W_V ⊗ W_KᵀW_Q, so use W_K' = W_V and W_Q' = W_V^{−T} W_Kᵀ W_Q; S = Σ v vᵀ is symmetric and
neuron (i ≤ j) stores v_i v_j. (The paper prints W_V^{−T} W_K^{−T} W_Q; the identity
W_V'ᵀ W_Q' = W_Kᵀ W_Q needs W_Kᵀ, which the tests check numerically.)

A layer with an output projection W_P is handled by folding it into the values: W_V ← W_P W_V.
"""

from __future__ import annotations

import torch

from zoo.models.gated_rnn import GatedLinearRNN

PERFECT_MEMORY = float("-inf")  # ν = −∞ → λ = exp(−exp(−∞)) = 1
PERFECT_FORGET = float("inf")  # ν = +∞ → λ = 0


def lsa_weights(lsa) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if len(lsa.layers) != 1 or lsa.loops != 1 or lsa.attention != "causal" or lsa.residual:
        raise ValueError("a gated RNN implements one causal LSA layer without residual (Zucchet et al. Eq. 1)")
    layer = lsa.layers[0]
    return layer.w_p @ layer.w_v, layer.w_k, layer.w_q


@torch.no_grad()
def rnn_from_lsa(w_v: torch.Tensor, w_k: torch.Tensor, w_q: torch.Tensor, readout, *, compact: bool = False) -> GatedLinearRNN:
    d = w_v.shape[0]
    dtype = w_v.dtype
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
    hidden, gates = n_kv + d, d * d
    rnn = GatedLinearRNN(d, d, readout, hidden=hidden, gates=gates).to(dtype)
    zeros = torch.zeros_like
    w_m_in, w_x_in = zeros(rnn.w_m_in), zeros(rnn.w_x_in)
    nu = torch.full((hidden,), PERFECT_MEMORY, dtype=dtype)
    for (i, j), n in kv_index.items():
        w_m_in[n, :d], w_x_in[n, :d] = w_v[i], w_k[j]
    for j in range(d):
        w_m_in[n_kv + j, :d] = w_q[j]
        w_x_in[n_kv + j, d] = 1.0  # the appended constant input
        nu[n_kv + j] = PERFECT_FORGET
    w_m_out, w_x_out, readout_matrix = zeros(rnn.w_m_out), zeros(rnn.w_x_out), zeros(rnn.readout_matrix)
    for i in range(d):
        for j in range(d):
            g = i * d + j
            w_m_out[g, kv_index[(min(i, j), max(i, j)) if compact else (i, j)]] = 1.0
            w_x_out[g, n_kv + j] = 1.0
            readout_matrix[i, g] = 1.0
    for name, value in dict(w_m_in=w_m_in, w_x_in=w_x_in, nu=nu, w_m_out=w_m_out, w_x_out=w_x_out,
                            readout_matrix=readout_matrix).items():
        getattr(rnn, name).copy_(value)
    return rnn
