"""θ_GD: the LSA weights that make one layer do one step of gradient descent (von Oswald et al.).

For tokens e = (x, y) ∈ R^{d_x + d_y}:

    W_K = W_Q = [[I_{d_x}, 0], [0, 0]]     (keys and queries read x only)
    W_V       = [[0, 0], [W_0, −I_{d_y}]]  (values carry the residual W_0 x − y)
    W_P       = η · I                       (η in the zoo's sum convention = η_blog / C)

so the query token (x_q, 0) leaves the layer as (x_q, −(W_0 + η Σ_i (y_i − W_0 x_i) x_iᵀ) x_q):
minus the one-step-GD prediction, which is why the task's read-out sign is −1. Context
tokens leave as (x_i, y_i − W_1 x_i), the residuals of the updated model, so stacking L such
layers with W_0 = 0 (attention over the context, query excluded) is L steps of GD.
"""

from __future__ import annotations

import torch

from zoo.models.lsa import LinearSelfAttention


def gd_lsa_weights(d_x: int, d_y: int, eta: float, w0: torch.Tensor | None = None, dtype=torch.float64):
    d = d_x + d_y
    w_kq = torch.zeros(d, d, dtype=dtype)
    w_kq[:d_x, :d_x] = torch.eye(d_x, dtype=dtype)
    w_v = torch.zeros(d, d, dtype=dtype)
    if w0 is not None:
        w_v[d_x:, :d_x] = w0.to(dtype)
    w_v[d_x:, d_x:] = -torch.eye(d_y, dtype=dtype)
    w_p = eta * torch.eye(d, dtype=dtype)
    return {"w_q": w_kq, "w_k": w_kq.clone(), "w_v": w_v, "w_p": w_p}


@torch.no_grad()
def construct_gd_lsa(model: LinearSelfAttention, d_x: int, eta: float) -> LinearSelfAttention:
    """Set every layer of `model` to θ_GD with learning rate η (multi-layer: one GD step each)."""
    d_y = model.d_in - d_x
    weights = gd_lsa_weights(d_x, d_y, eta)
    for layer in model.layers:
        for name, value in weights.items():
            getattr(layer, name).copy_(value)
    return model
