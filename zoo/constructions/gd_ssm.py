"""The GD-SSM weights that do L steps of (ridge-regularised) gradient descent (Sushma, Tian et al.).

Window slots are numbered oldest first; slot k of c_t occupies channels [k f, (k+1) f) and
the constant 1 is the last channel. With Λ = Λ̃ = 1 (ν = −∞) and β_l = η:

"products" layout, c_t = (x_t y_t, x_{t+1}), one layer (Eqs. 14–16, Ψ and Θ):
    A c = x_t y_t (Ψ),  B c = 1,  Q c = 1,  R c = x_{t+1} (Θ),  D = 1ᵀ
    → z_t = Σ_{i≤t} x_i y_i,  o_t = η z_tᵀ x_{t+1}: one GD step from w = 0.

"interleaved" layout, s = (x_1,0), (0,y_1), …, (x_q,0), window 3 (Eqs. 17–18, A.1–A.2):
    at an x token the window is [x_j, y_j, x_{j+1}] (C_t of Eq. 21)
    A c = y-channels of slot w−2 (y_j),  B c = x-channels of slot w−3 (x_j)   → Z = Σ y_j x_jᵀ
    Ã c = B̃ c = x-channels of slot w−3                                        → Z̃ = Σ x_j x_jᵀ
    Q c = x-channels of the current slot (x_{t+1}),  R c = 1,  D = I
At a y token the middle slot is an x token whose y-channels are zero, and the oldest slot a
y token whose x-channels are zero, so nothing spurious is accumulated. At the query,
M_L = W_L of L GD steps on the whole context (with ridge ρ: A.4).
"""

from __future__ import annotations

import torch

from zoo.models.gd_ssm import GDSSM


def construction_problem(model_dims: dict, layout: str, d_x: int, d_y: int) -> str | None:
    """Why the GD construction cannot apply (None when it can). `model_dims`: window, n_layers,
    value_dim, key_dim."""
    w, layers, m_v, m_k = (model_dims[k] for k in ("window", "n_layers", "value_dim", "key_dim"))
    if model_dims.get("embed"):
        return "the GD construction reads the raw tokens: no input embedding (a gated unit on the read-out is left to training)"
    if m_v is None or m_k is None:  # unset in the config: the model takes them from the task
        default = (d_x, 1) if layout == "products" else (d_y, d_x)
        m_v, m_k = m_v or default[0], m_k or default[1]
    if layout == "products":
        if layers != 1:
            return "the 'products' layout has no room for Σ x xᵀ: one layer (one GD step) only"
        if (m_v, m_k) != (d_x, 1):
            return f"the 'products' layout needs value_dim = d_x = {d_x} and key_dim = 1"
    elif layout == "interleaved":
        if w < 3:
            return "the 'interleaved' layout needs window ≥ 3 (x_j, y_j, x_{j+1})"
        if (m_v, m_k) != (d_y, d_x):
            return f"the 'interleaved' layout needs value_dim = d_y = {d_y} and key_dim = d_x = {d_x}"
    else:
        return f"no GD-SSM construction for the {layout!r} layout (use 'products' or 'interleaved')"
    return None


@torch.no_grad()
def construct_gd_ssm(model: GDSSM, layout: str, d_x: int, d_y: int, eta: float) -> GDSSM:
    problem = construction_problem(
        {"window": model.window, "n_layers": len(model.layers), "value_dim": model.value_dim, "key_dim": model.key_dim,
         "embed": model.embed is not None, "mlp": model.mlp is not None},
        layout, d_x, d_y,
    )
    if problem:
        raise ValueError(problem)
    f, w = model.d_in, model.window
    const = w * f

    def slot(k: int, channel: int) -> int:
        return k * f + channel

    for name, p in model.named_parameters():
        if not name.startswith("mlp."):  # a gated unit on the read-out keeps its (identity) init, for training
            p.zero_()
    for layer in model.layers:
        layer.nu.fill_(-float("inf"))
        layer.beta.fill_(eta)
        if layer.second_head:
            layer.nu_tilde.fill_(-float("inf"))
    current = w - 1
    if layout == "products":
        layer = model.layers[0]
        for i in range(d_x):
            layer.a[i, slot(current, i)] = 1.0  # Ψ: x_t y_t
            model.r[i, slot(current, d_x + i)] = 1.0  # Θ: x_{t+1}
        layer.b[0, const] = 1.0
        model.q[0, const] = 1.0
        model.d.fill_(1.0)
    else:
        prev, prev2 = w - 2, w - 3
        for layer in model.layers:
            for i in range(d_y):
                layer.a[i, slot(prev, d_x + i)] = 1.0  # y_j
            for j in range(d_x):
                layer.b[j, slot(prev2, j)] = 1.0  # x_j
                if layer.second_head:
                    layer.a_tilde[j, slot(prev2, j)] = 1.0
                    layer.b_tilde[j, slot(prev2, j)] = 1.0
        for j in range(d_x):
            model.q[j, slot(current, j)] = 1.0  # x_{t+1}
        model.r[:, const] = 1.0
        model.d.copy_(torch.eye(d_y))
    return model
