"""Check a checkpoint's metrics against its entry's `expected` paper values.

Each `expected.<key>` of a registry entry is a number from the paper with a tolerance: relative
(`rel_tol`: |m − v| ≤ rel_tol·|v|) or, for an order-of-magnitude claim, on a log scale
(`log10_tol`: |log10(m / v)| ≤ log10_tol). The release index, the model cards and
tests/test_release.py all call `check`, so a tolerance means the same thing everywhere.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Check:
    metric: str  # the `expected` key
    paper: float  # the paper's value
    tolerance: str  # "±2%" or "×/÷ 10"
    measured: float | None  # None when the checkpoint has no such metric
    meets: bool
    off_by: str  # how far outside (or inside) the tolerance, in words

    def as_dict(self) -> dict:
        return asdict(self)


def metric_value(key: str, metrics: dict) -> float | None:
    """The measured value an `expected` key refers to (None when the checkpoint has none)."""
    if key == "eta":
        value = metrics.get("construction_eta", metrics.get("gd_eta"))
    elif key.startswith("poly_"):  # poly_x1_sq_y1 → the "x1^2 y1" coefficient of Table 2
        term = key[len("poly_"):].replace("_sq_", "^2 ").replace("_", " ")
        value = (metrics.get("polynomial") or {}).get(term)
    else:
        value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def check(entry, metrics: dict) -> list[Check]:
    out = []
    for key, exp in entry.expected.items():
        m = metric_value(key, metrics)
        if exp.log10_tol is not None:
            tol = f"×/÷ {10 ** exp.log10_tol:g}"
            if m is None or m <= 0:
                out.append(Check(key, exp.value, tol, m, False,
                                 "not measured" if m is None else f"measured {m:g}: not positive, no log-scale comparison"))
                continue
            dev = math.log10(m / exp.value)
            meets = abs(dev) <= exp.log10_tol
            out.append(Check(key, exp.value, tol, m, meets, f"{abs(dev):.2f} decades {'above' if dev > 0 else 'below'}"))
        else:
            tol = f"±{100 * exp.rel_tol:g}%"
            if m is None:
                out.append(Check(key, exp.value, tol, None, False, "not measured"))
                continue
            rel = (m - exp.value) / abs(exp.value) if exp.value else m
            meets = abs(m - exp.value) <= exp.rel_tol * abs(exp.value)
            out.append(Check(key, exp.value, tol, m, meets, f"{100 * rel:+.2f}%"))
    return out


def verdict(checks: list[Check]) -> str:
    """'meets', 'falls short' or 'no paper value'."""
    if not checks:
        return "no paper value"
    return "meets" if all(c.meets for c in checks) else "falls short"
