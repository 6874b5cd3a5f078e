"""A one-layer GD-SSM's weights up to its symmetries, beside the construction's (Sushma, Tian et
al. Figures 3 and 5 compare "learned weights ... with the GD-SSM parameters from our construction").

Raw weights cannot be compared: many weight settings compute the same function. With the window
vector c_t (zoo/science/models/gd_ssm.py) and Λ = 1, output channel k at the query q is

    o_k = Σ_v D_kv (r_v·c_q) β Σ_t (a_v·c_t) (c_tᵀ Bᵀ Q c_q) = Σ_t (c_qᵀ V_k c_t)(c_tᵀ K c_q)

    K   = Bᵀ Q                      (c × c)    keys against the query: the local attention C_t Q C_tᵀ
    V_k = β Σ_v D_kv r_v a_vᵀ        (c × c)    values through the gated read-out to output k

K is unchanged by any invertible mixing of the key channels (B → P B, Q → P⁻ᵀ Q); V_k by
permuting or rescaling the value channels (a_v, r_v, D_·v) and by β. One scalar is left,
(V, K) → (s V, K / s), so K is shown at unit Frobenius norm with the sign that agrees with the
construction's. The function itself depends on the tensor T_k = V_k ⊗ K, symmetrised over the two
query slots and the two context slots (c_q and c_t each enter twice).

One more freedom comes from the window. The sum runs over every position, so a product of two
context channels taken from window slots (s, s′) adds up the same token pairs as the one taken
from (s + 1, s′ + 1) one position later: over interleaved tokens, y_j xᵀ_j is read at the x-token
window [x_j, y_j, x_{j+1}] (slots 1 and 0, the construction's choice) as well as at the y-token
window [y_{j−1}, x_j, y_j] (slots 2 and 1). `function_tensor` therefore folds each context pair
onto its slot offset (a channel paired with the constant onto its channel); the two readings then
coincide up to the sequence's first and last window. Coefficients the task's tokens never
exercise (a query channel that is always zero at the query, a context pair that never occurs in
one window) are not determined by training either; `tensor_cosine` compares the folded tensors
on the rest, found from a sample of the task's windows.

Glossary (code → paper): `a, b` = the value and key projections of the local attention window
C_t (the paper's Ψ-like map and its partner), `q` = the query projection, `r` = Θ (the
multiplicative read-out), `d` = the output map, `Λ = exp(−exp(ν))` the recurrence (its
diagonal mean is what the paper's Figure 3.B shows).
"""

from __future__ import annotations

import copy

import torch

from zoo.science.models.gd_ssm import GDSSM, construct_gd_ssm


def kernels(model: GDSSM) -> dict[str, torch.Tensor]:
    """K (c, c), V (d_out, c, c) and Λ (m_v, m_k) of a one-layer GD-SSM without an embedding or
    a gated unit (float64)."""
    if len(model.layers) != 1 or model.embed is not None or model.mlp is not None:
        raise ValueError("the kernels are defined for one linear GD-SSM layer on the raw tokens")
    layer = model.layers[0]
    a, b, q, r, d = (p.detach().double() for p in (layer.a, layer.b, model.q, model.r, model.d))
    beta = layer.beta.detach().double()
    key = b.T @ q  # (c, c)
    value = beta * torch.einsum("kv,vi,vj->kij", d, r, a)  # (d_out, c, c): query side i, context side j
    lam = torch.exp(-torch.exp(layer.nu.detach().double()))  # (m_v, m_k)
    return {"K": key, "V": value, "lambda": lam, "window": model.window, "features": model.feature_dim}


def _context_pair_index(window: int, f: int) -> torch.Tensor:
    """For each context pair (j, l) of window channels (c, c): its class after folding the window
    shift, numbered (slot offset, channel, channel), then (constant, channel), (channel,
    constant), (constant, constant)."""
    const = window * f
    c = const + 1
    index = torch.empty(c, c, dtype=torch.long)
    for j in range(c):
        for m in range(c):
            if j < const and m < const:
                offset = j // f - m // f + window - 1  # 0 … 2w − 2
                index[j, m] = (offset * f + j % f) * f + m % f
            elif j == const and m == const:
                index[j, m] = (2 * window - 1) * f * f + 2 * f
            elif j == const:
                index[j, m] = (2 * window - 1) * f * f + m % f
            else:
                index[j, m] = (2 * window - 1) * f * f + f + j % f
    return index


def function_tensor(k: dict) -> torch.Tensor:
    """T[o, i, (j, l), m]: the coefficient of c_q,i c_t,j c_t,l c_q,m in o (Λ = 1), symmetrised over
    the query pair (i, m) and the context pair (j, l), context pairs folded over the window shift."""
    t = torch.einsum("oij,lm->oijlm", k["V"], k["K"])
    t = 0.5 * (t + t.permute(0, 4, 2, 3, 1))
    t = 0.5 * (t + t.permute(0, 1, 3, 2, 4))
    w, f = k["window"], k["features"]
    index = _context_pair_index(w, f).flatten()  # (c·c,)
    o, c = t.shape[0], t.shape[1]
    flat = t.permute(0, 1, 4, 2, 3).reshape(o, c, c, c * c)  # (o, i, m, j·l)
    folded = flat.new_zeros(o, c, c, (2 * w - 1) * f * f + 2 * f + 1)
    return folded.index_add_(3, index, flat)


def active_coefficients(model: GDSSM, task, n: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Which query channels (c,) and folded context pairs are ever non-zero on `task`'s windows."""
    tokens = task.sample(n, seed=seed, dtype=torch.float64).tokens
    with torch.no_grad():
        c, _ = model.windows(tokens)  # (n, T, c); no parameters read without an embedding
    query = (c[:, -1] != 0).any(0)
    pairs = (c.unsqueeze(-1) * c.unsqueeze(-2) != 0).flatten(0, 1).any(0)  # (c, c)
    w, f = model.window, model.feature_dim
    folded = torch.zeros((2 * w - 1) * f * f + 2 * f + 1, dtype=torch.bool)
    folded[_context_pair_index(w, f)[pairs]] = True
    return query, folded


def _cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x * y).sum() / (x.norm() * y.norm()).clamp_min(1e-300))


def compare(model: GDSSM, construction: GDSSM, active: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """Trained against constructed: the cosine of the function tensors (on the `active` coefficients
    only, when given: the comparison that means "same function"), and the raw cosines of K and of
    each V_k (no fold, no mask: they show where the weights put the computation, and differ for the
    same function read at another window slot). K and V are brought to the construction's gauge for
    the figure (unit-norm K of the agreeing sign, V scaled to match). Also the trained Λ's mean and range."""
    mine, ref = kernels(model), kernels(construction)
    t_mine, t_ref = function_tensor(mine), function_tensor(ref)
    if active is not None:
        query, pairs = active
        t_mine, t_ref = (t[:, query][:, :, query][..., pairs] for t in (t_mine, t_ref))
    scale = mine["K"].norm().clamp_min(1e-300)
    sign = 1.0 if (mine["K"] * ref["K"]).sum() >= 0 else -1.0
    key = sign * mine["K"] / scale
    value = sign * mine["V"] * scale
    ref_scale = ref["K"].norm()
    ref_key, ref_value = ref["K"] / ref_scale, ref["V"] * ref_scale
    lam = mine["lambda"]
    return {
        "key_cosine": _cosine(key, ref_key),
        "value_cosine": [_cosine(v, rv) for v, rv in zip(value, ref_value)],
        "tensor_cosine": _cosine(t_mine, t_ref),
        "value_norm_ratio": float(value.norm() / ref_value.norm()),
        "lambda_mean": float(lam.mean()),
        "lambda_min": float(lam.min()),
        "lambda_max": float(lam.max()),
        "matrices": {"K": key, "V": value, "K_construction": ref_key, "V_construction": ref_value, "lambda": lam},
    }


def compare_with_construction(model: GDSSM, task, eta: float | None = None) -> dict:
    """`compare` against the construction of the same shape on `task` (one GD step at `eta`,
    default the analytic η*); the caller's model is left as it is."""
    if not isinstance(model, GDSSM) or not task.has_gd_reference:
        raise ValueError(f"weights against the construction: defined for a GD-SSM on in-context regression, "
                         f"not a {type(model).__name__} on {type(task).__name__}")
    reference = copy.deepcopy(model).double()
    construct_gd_ssm(reference, task.layout, task.d_x, task.d_y, task.analytic_eta() if eta is None else eta)
    return compare(model, reference, active_coefficients(model, task))
