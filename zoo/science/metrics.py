"""Every scalar metric the zoo reports, declared once: its key in `eval_results.json`, its label,
and its group. Evaluation writes them (zoo/science/evaluation.py); cards, reports and sweeps read this table
for their columns and labels.

Groups: `loss` (the model's own), `reference` (what the task's GD and least squares reach, the
same for every model on a split), `alignment` (the blogpost's three metrics against GD),
`teacher` (Zucchet et al. Table 1, students of an LSA teacher), `memory` (gated RNNs' λ).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    key: str  # the key in eval_results.json
    label: str  # how cards and reports name it
    group: str  # loss | reference | alignment | teacher | memory
    in_sweeps: bool = False  # a column of a sweep's results table


METRICS = (
    Metric("test_loss", "Test loss (½·MSE)", "loss", in_sweeps=True),
    Metric("gd_loss", "GD loss", "reference", in_sweeps=True),
    Metric("lstsq_loss", "least-squares loss", "reference", in_sweeps=True),
    Metric("gd_steps", "GD steps", "reference"),
    Metric("pred_l2_to_gd", "L2 prediction gap to θ_GD", "alignment", in_sweeps=True),
    Metric("sensitivity_l2_to_gd", "L2 sensitivity gap to θ_GD", "alignment"),
    Metric("sensitivity_cosine", "Sensitivity cosine to θ_GD", "alignment", in_sweeps=True),
    Metric("polynomial_distance", "Polynomial distance to the teacher", "teacher", in_sweeps=True),
    Metric("kv_score", "KV score (1 − R²)", "teacher"),
    Metric("q_score", "Q score (1 − R²)", "teacher"),
    Metric("imperfect_memory_effect", "output share of 0 < λ < 1 neurons", "teacher"),
    Metric("memory_leak", "1 − λ of memory neurons (median)", "memory"),
)
BY_KEY = {m.key: m for m in METRICS}


def keys(*groups: str) -> list[str]:
    """The metric keys of these groups (all when none), in declaration order."""
    return [m.key for m in METRICS if not groups or m.group in groups]


def label(key: str) -> str:
    return BY_KEY[key].label
