"""The instantaneous processing of a zoo model as a polynomial (Zucchet et al. Tables 1–2).

An LSA layer processes one token through W_P (W_V x)(W_K x)ᵀ(W_Q x) (degree 3) and a gated RNN
through D g_out(g_in(x̃)) (degree 4). We recover the coefficients of every monomial of degree
≤ 4 by exact least squares on random points (the map *is* such a polynomial, so the fit is
exact up to rounding), then compare models coefficient by coefficient.
"""

from __future__ import annotations

import copy
import itertools

import torch


def monomials(d: int, max_degree: int = 4) -> list[tuple[int, ...]]:
    """Exponent tuples of every monomial in d variables of total degree ≤ max_degree."""
    out = []
    for degree in range(max_degree + 1):
        for combo in itertools.combinations_with_replacement(range(d), degree):
            e = [0] * d
            for i in combo:
                e[i] += 1
            out.append(tuple(e))
    return out


def term_name(exponents: tuple[int, ...], names: list[str]) -> str:
    parts = [n if e == 1 else f"{n}^{e}" for n, e in zip(names, exponents) if e]
    return " ".join(parts) or "1"


def features(x: torch.Tensor, exps: list[tuple[int, ...]]) -> torch.Tensor:
    e = torch.tensor(exps, dtype=x.dtype, device=x.device)  # (M, d)
    return torch.prod(x.unsqueeze(1) ** e.unsqueeze(0), dim=-1)  # (N, M)


def coefficients(fn, d: int, max_degree: int = 4, seed: int = 0) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
    """Coefficients (M, d_out) of the polynomial map `fn` (x (N, d) → (N, d_out)), float64."""
    exps = monomials(d, max_degree)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3 * len(exps), d, generator=g, dtype=torch.float64)
    with torch.no_grad():
        y = fn(x).double()
    phi = features(x, exps)
    coef = torch.linalg.lstsq(phi, y, driver="gelsd").solution
    return coef, exps


def prediction_map(model):
    """x ↦ the task read-out of the model's instantaneous processing (no residual path), in
    float64 on a copy (the caller's model keeps its dtype)."""
    r = model.readout
    model = copy.deepcopy(model).double()
    return lambda x: r.sign * model.instantaneous(x)[..., r.start : r.stop]


def polynomial_distance(coef_a: torch.Tensor, coef_b: torch.Tensor) -> float:
    """Mean over outputs of ‖c_a − c_b‖ / ‖c_b‖ (c_b the reference, e.g. the teacher)."""
    num = (coef_a - coef_b).norm(dim=0)
    den = coef_b.norm(dim=0).clamp_min(1e-300)
    return float((num / den).mean())


def regression_coefficient_table(model, d_x: int, d_y: int, output: int = 0) -> dict:
    """Table 2: coefficients of x_i² y_1 for output unit `output`, and the norm of all the others."""
    coef, exps = coefficients(prediction_map(model), d_x + d_y)
    names = [f"x{i + 1}" for i in range(d_x)] + [f"y{j + 1}" for j in range(d_y)]
    column = coef[:, output]
    table, keep = {}, torch.zeros(len(exps), dtype=torch.bool)
    for i in range(d_x):
        e = [0] * (d_x + d_y)
        e[i] = 2
        e[d_x + output] = 1
        k = exps.index(tuple(e))
        table[term_name(tuple(e), names)] = float(column[k])
        keep[k] = True
    table["residual norm"] = float(column[~keep].norm())
    return table
