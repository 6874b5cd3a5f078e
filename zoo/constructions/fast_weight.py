"""The fast-weight network's GD constructions ("Recurrent networks can learn in-context by
gradient descent"), with U = I, V = I so that e_x = x, e_y = y and W_t is a d_y × d_x matrix:

    hebbian_gd   W_t = Σ_{s≤t} y_s x_sᵀ (𝓘 = I, Eq. 13) and D = η I: after t examples the output is
                 η Σ_{s≤t} y_s x_sᵀ x_{t+1}, one GD step from W = 0 on the prefix (sum convention).
                 η fixed (the paper's constant λ: η = 2λ/N), or η*_t per position: D = I/σ_x²,
                 s_t = 1/(t + c) with c = d_x − 2 + κ gives η*_t = 1/(σ_x² (t + d_x − 2 + κ)).
    delta_rule   𝓘_t = I − η x_t x_tᵀ, D = I, β = η: W_t = W_{t−1} + η (y_t − W_{t−1} x_t) x_tᵀ,
                 online GD with one example per step (exact in the one-sample gradient).
"""

from __future__ import annotations

import torch

from zoo.models.fast_weight import FastWeightRNN


@torch.no_grad()
def construct_fast_weight(model: FastWeightRNN, task, construction: str, eta: float | str) -> dict:
    model.u.copy_(torch.eye(task.d_x))
    model.v.copy_(torch.eye(task.d_y))
    if construction == "hebbian_gd" and eta == "analytic":
        model.d.copy_(torch.eye(task.d_y, dtype=torch.float64) / task.x_variance)
        model.offset.fill_(task.d_x - 2 + task.x_kurtosis)
        return {"eta": task.analytic_eta(), "gd_steps": 1, "eta_per_position": True}  # η at the query: η*_C
    model.d.copy_(torch.eye(task.d_y, dtype=torch.float64) * (eta if construction == "hebbian_gd" else 1.0))
    if construction == "delta_rule":  # scored against one GD step at η* like any model; its own rate is the online one
        model.beta.fill_(eta)
        return {"online_eta": float(eta)}
    return {"eta": float(eta), "gd_steps": 1}
