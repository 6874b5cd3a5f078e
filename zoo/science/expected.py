"""Check a checkpoint's metrics against its entry's `expected` values.

Each `expected.<key>` of a registry entry is a number with its source (zoo/science/registry.py `Expected`):

- `source = "paper"`: a number the paper prints (its words in `quote`, where in `section`). Only
  these are graded: **meets** / **falls short**.
- `source = "reference"`: a closed form or construction the zoo computes. Shown as **matches the
  reference** / **differs from the reference**, never as a paper verdict.

and a kind of claim:

- `within`: relative (`rel_tol`: |m − v| ≤ rel_tol·|v|) or, for an order-of-magnitude claim, on a
  log scale (`log10_tol`: |log10(m / v)| ≤ log10_tol);
- `at_most` / `at_least`: a bound, with an optional margin (`rel_tol`, or `log10_tol` decades);
- `paired_gd`: the model's loss equals one GD step's. `value` and `gd_value` are the paper's model
  and GD losses; the zoo measures the paired difference (model − GD, task by task on the same test tasks,
  relative to GD's loss) with its standard error, and the claim holds when the difference lies within
  ±(the paper's gap + 2 s.e.). A reference claim gives the zoo's closed form as both values and may declare
  a margin (`rel_tol`) in place of the paper's gap: ±(rel_tol + 2 s.e.) A checkpoint's eval_results.json does not hold the paired
  difference: `paired_gd_measurement` computes it from the frozen test split.

A claim that cannot be measured (no such metric; a non-positive number on a log scale; a score that is blind,
`BLIND_SCORES`) is **not checkable**. The release index, the model cards and tests/test_release.py all call `check`, so a
claim means the same thing everywhere.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

PAIRED_KEYS = ("gd_paired_diff", "gd_paired_se", "gd_paired_n")  # what paired_gd_measurement returns
LABELS = {  # status → what a card and the index say
    ("paper", True): "meets", ("paper", False): "falls short",
    ("reference", True): "matches the reference", ("reference", False): "differs from the reference",
    (None, True): "matches the stated value", (None, False): "differs from the stated value",
}
NOT_CHECKABLE = "not checkable"
# Table 1's scores (1 − R²) → the neuron group each regresses on. A group of at least `score_span` neurons spans every
# quadratic of the input and scores 0 (or rounding noise) whatever it encodes (zoo/science/models/gated_rnn.py
# kv_q_scores): such a score is no measurement
BLIND_SCORES = {"kv_score": "memory_neurons", "q_score": "forget_neurons"}


def blind_score(key: str, measured: float, metrics: dict) -> bool:
    """Is Table 1's score `key`, measured as `measured`, blind in `metrics`: its neuron group at least the
    quadratics' span? An evaluation that predates `score_span` says so only by an exact 0."""
    group, span = metrics.get(BLIND_SCORES[key]), metrics.get("score_span")
    if isinstance(group, int) and isinstance(span, int):
        return group >= span
    return measured <= 0


@dataclass(frozen=True)
class Check:
    metric: str  # the `expected` key
    value: float  # the expected number (the paper's, or the reference's)
    source: str | None  # "paper" | "reference" (None: a checkpoint of an older zoo, unsourced)
    kind: str  # within | at_most | at_least | paired_gd
    tolerance: str  # "±2%", "×/÷ 10", "×10 margin", "gap within ±(0.21% + 2 s.e.); …"
    measured: float | None  # None when the checkpoint has no such metric (paired_gd: the relative gap)
    meets: bool  # the claim holds (a reference: matches)
    status: str  # "meets" | "falls short" | "matches the reference" | "differs from the reference" | "not checkable"
    off_by: str  # how far outside (or inside) the tolerance, in words
    quote: str = ""  # a paper value: the paper's words
    section: str = ""  # a paper value: where they are
    note: str = ""  # the registry's note: how the tolerance was chosen; a reference: what computes it
    paper_claim: str = ""  # a paper value: the sentence that says what the number shows (when the quote is a table cell)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def claim(self) -> str:
        """The expected value and its claim, in words: '0.0945 (±3%)', 'at most 4.97e-08 (×10 margin)'."""
        return claim_text(self.kind, self.value, self.tolerance)

    @property
    def measured_text(self) -> str:
        return measured_text(self.kind, self.measured)


def claim_text(kind: str, value: float, tolerance: str) -> str:
    if kind == "paired_gd":
        return f"equal to one GD step's, paired task by task ({tolerance})"
    bound = {"at_most": "at most ", "at_least": "at least "}.get(kind, "")
    return f"{bound}{value:.4g} ({tolerance})"


def measured_text(kind: str, measured: float | None) -> str:
    if measured is None:
        return "—"
    return f"gap {100 * measured:+.3f}%" if kind == "paired_gd" else f"{measured:.4g}"


def metric_value(key: str, metrics: dict) -> float | None:
    """The measured value an `expected` key refers to (None when the checkpoint has none)."""
    if key == "eta":
        value = metrics.get("construction_eta", metrics.get("gd_eta"))
    elif key.startswith("poly_"):  # poly_x1_sq_y1 → the "x1^2 y1" coefficient of Table 2; poly_residual_norm
        term = key[len("poly_"):].replace("_sq_", "^2 ").replace("_", " ")
        value = (metrics.get("polynomial") or {}).get(term)
    else:
        value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _status(source: str | None, meets: bool) -> str:
    return LABELS[(source, meets)]


def _tolerance_text(exp) -> str:
    """A value's or a bound's tolerance in words: "×/÷ 10", "×10 margin", "±3%", "29.6% margin", "no margin"."""
    if exp.log10_tol is not None:
        return f"×/÷ {10 ** exp.log10_tol:g}" if exp.kind == "within" else f"×{10 ** exp.log10_tol:g} margin"
    rel_tol = exp.rel_tol or 0.0
    return f"±{100 * rel_tol:g}%" if exp.kind == "within" else (f"{100 * rel_tol:g}% margin" if rel_tol else "no margin")


def _one(key: str, exp, metrics: dict) -> Check:
    def make(tol: str, m: float | None, meets: bool | None, off_by: str) -> Check:
        status = NOT_CHECKABLE if meets is None else _status(exp.source, meets)
        return Check(key, exp.value, exp.source, exp.kind, tol, m, bool(meets), status, off_by, exp.quote, exp.section,
                     exp.note, exp.claim)

    if exp.kind == "paired_gd":
        if exp.source == "paper":  # the paper's own gap between its model and GD is the margin
            margin = abs(exp.value / exp.gd_value - 1)
            tol = (f"gap within ±({100 * margin:.2f}% + 2 s.e.); paper {exp.value:g} vs GD {exp.gd_value:g}: "
                   f"{100 * (exp.value / exp.gd_value - 1):+.2f}%")
        else:  # a reference: the closed form as both values, and a declared margin (rel_tol) or none
            margin = exp.rel_tol or 0.0
            tol = f"gap within ±({100 * margin:.2f}% + 2 s.e.)" if margin else "gap within ±2 s.e."
        diff, se, gd = (metrics.get(k) for k in ("gd_paired_diff", "gd_paired_se", "gd_loss"))
        if not all(isinstance(x, (int, float)) for x in (diff, se, gd)) or gd <= 0:
            return make(tol, None, None, "not measured: no paired difference against GD on the test split")
        gap, gap_se = diff / gd, se / gd
        meets = abs(gap) <= margin + 2 * gap_se
        return make(tol, gap, meets, f"gap {100 * gap:+.3f}% ± {100 * gap_se:.3f}% s.e. "
                                     f"over {metrics.get('gd_paired_n', '?')} tasks")

    m, tol = metric_value(key, metrics), _tolerance_text(exp)
    if key in BLIND_SCORES and m is not None and blind_score(key, m, metrics):
        group = metrics.get(BLIND_SCORES[key])
        return make(tol, m, None, f"measured {m:g} on {'its' if group is None else group} neurons, which span every "
                                  "quadratic of the input: the score cannot tell")
    if exp.log10_tol is not None:
        if m is None or m <= 0:
            return make(tol, m, None, "not measured" if m is None
                        else f"measured {m:g}: not positive, no log-scale comparison")
        dev = math.log10(m / exp.value)
        meets = {"within": abs(dev) <= exp.log10_tol, "at_most": dev <= exp.log10_tol,
                 "at_least": dev >= -exp.log10_tol}[exp.kind]
        return make(tol, m, meets, f"{abs(dev):.2f} decades {'above' if dev > 0 else 'below'}")
    rel_tol = exp.rel_tol or 0.0
    if m is None:
        return make(tol, None, None, "not measured")
    rel = (m - exp.value) / abs(exp.value) if exp.value else m
    slack = rel_tol * abs(exp.value)
    meets = {"within": abs(m - exp.value) <= slack, "at_most": m <= exp.value + slack,
             "at_least": m >= exp.value - slack}[exp.kind]
    return make(tol, m, meets, f"{100 * rel:+.2f}%" if exp.value else f"{m:g}")


def check(entry, metrics: dict) -> list[Check]:
    """Every `expected` value of `entry` against `metrics` (eval_results.json, plus the paired
    difference against GD where an entry claims one: `paired_gd_measurement`)."""
    return [_one(key, exp, metrics) for key, exp in entry.expected.items()]


def verdict(checks: list[Check]) -> str:
    """The entry's verdict. Against paper values only: 'meets' (every one holds), 'falls short' (one
    does not), 'meets where checkable' (none fails, some cannot be measured). Without a paper value:
    'matches the reference' / 'differs from the reference', or 'no paper value'."""
    paper = [c for c in checks if c.source == "paper"]
    if paper:
        if any(c.status == "falls short" for c in paper):
            return "falls short"
        return "meets" if all(c.meets for c in paper) else "meets where checkable"
    if not checks:
        return "no paper value"
    what = "the reference" if all(c.source == "reference" for c in checks) else "the stated values"  # None: unsourced
    return f"matches {what}" if all(c.meets for c in checks) else f"differs from {what}"


VERDICTS = ("meets", "falls short", "meets where checkable", "matches the reference", "differs from the reference",
            "matches the stated values", "differs from the stated values", "no paper value")


def needs_paired(entry) -> bool:
    return any(exp.kind == "paired_gd" for exp in entry.expected.values())


def paired_gd_measurement(ckpt, split=None) -> dict:
    """The model's loss minus one GD step's, task by task on the frozen test split (or `split`), with
    the standard error of its mean: {"gd_paired_diff", "gd_paired_se", "gd_paired_n"} in loss units.
    GD is the reference the checkpoint was scored against (zoo.science.evaluation.gd_reference), so the mean of
    the model's per-task losses is its card's test loss."""
    import torch

    from zoo.science.evaluation import gd_reference, tasks_per_pass
    from zoo.science.tasks.frozen import load_split
    from zoo.science.tasks.regression import gd_predict

    task = ckpt.task
    split = split if split is not None else load_split(ckpt.entry.task, "test", spec=ckpt.task_spec)
    batch = split.batch(task)
    ref = gd_reference(ckpt.entry, task, ckpt.construction, recorded=ckpt.metrics)
    eta = task.analytic_eta() if ref.get("eta") is None else ref["eta"]
    model = ckpt.model.eval()
    param = next(model.parameters())
    with torch.no_grad():
        tokens = batch.tokens.to(device=param.device, dtype=param.dtype)
        passes = tokens.split(tasks_per_pass(model, tokens.shape[1]))
        pred = torch.cat([model.predict_query(chunk) for chunk in passes]).double().cpu()
        b64 = task.batch_from_arrays(batch.x.double(), batch.y.double())
        gd = gd_predict(b64, eta, ref.get("gd_steps", 1), ref.get("ridge", 0.0))
        target = b64.query_targets

        def per_task(p):  # the task's loss (½·mean over output coordinates), task by task
            return 0.5 * ((p - target) ** 2).flatten(1).mean(1)

        diff = per_task(pred) - per_task(gd)
    n = diff.numel()
    return {"gd_paired_diff": float(diff.mean()), "gd_paired_se": float(diff.std(unbiased=True) / math.sqrt(n)),
            "gd_paired_n": int(n)}


def measurements(entry, ckpt=None, metrics: dict | None = None) -> dict:
    """What an entry's claims need beyond `metrics` (eval_results.json): the paired difference
    against GD where the entry claims one and `metrics` lacks it, computed from `ckpt` on the frozen
    test split ({} when nothing is needed or no checkpoint is given)."""
    metrics = metrics if metrics is not None else (ckpt.metrics if ckpt is not None else {})
    if not needs_paired(entry) or all(k in metrics for k in PAIRED_KEYS) or ckpt is None:
        return {}
    return paired_gd_measurement(ckpt)
