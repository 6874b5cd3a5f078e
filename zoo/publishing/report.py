"""`zoo report`: trained models, GD and least squares side by side, per task.

Reads checkpoint folders (or sweep folders, which hold one checkpoint per run), and writes
`report.md` (a table per task), `results.json` (the per-run rows behind it) and `report.png`
(test loss against the task's GD and least-squares losses, and the sensitivity cosine to GD)
in the output folder; sweeps over a task field and tasks predicted at every position
("triples") get a table and a figure of their own, and runs that differ only in their seed a
mean ± std table. Checkpoints that keep their training history get a figure of validation loss
against step and a table of the first evaluation below each decade (how fast each learned). A
`results.json` given instead of checkpoints regenerates the same report from its rows, with no
model loaded.

Two analyses load each checkpoint and add to its row: `input_scales` (Sushma, Tian et al.
Figs. 1D/2D: the loss on inputs x ~ U(−α, α) beside GD's at the training η) and `weights`
(one-layer GD-SSMs against the construction up to their symmetries, Fig. 3).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from pathlib import Path

from zoo.science import metrics
from zoo.science.analysis.plots import POSITION_AXIS, POSITION_CURVES, finish
from zoo.science.expected import claim_text, measured_text
from zoo.storage.checkpoint import CONFIG, EVAL_RESULTS, HISTORY, CheckpointError, read_json

COLUMNS = tuple(metrics.keys())  # every metric a checkpoint may have (zoo/science/metrics.py)
POSITION_KEYS = tuple(POSITION_CURVES)  # loss against position: the model's and its baselines' (zoo/science/evaluation.py)
REGRESSION_COLUMNS = ["gd_loss", "gd_steps", "pred_l2_to_gd", "sensitivity_cosine"]  # a task table's columns
TEACHER_COLUMNS = metrics.keys("teacher", "memory")  # students of an LSA teacher: no GD reference


def checkpoint_folders(paths: list[str | Path]) -> list[Path]:
    """The checkpoint folders in `paths`: each path is one, or holds them one level down."""
    found = []
    for p in map(Path, paths):
        if (p / CONFIG).exists():
            found.append(p)
        elif p.is_dir():
            found.extend(sorted(c for c in p.iterdir() if (c / CONFIG).exists()))
        else:
            raise FileNotFoundError(f"{p}: not a checkpoint folder nor a folder of them")
    return found


def collect(paths: list[str | Path], *, input_scales: list[float] | None = None, weights: bool = False) -> list[dict]:
    """One row per checkpoint (`results.json` files contribute their rows as they are)."""
    rows = []
    for p in map(Path, paths):
        if p.is_file() and p.name == "results.json":
            loaded = json.loads(p.read_text())
            if not isinstance(loaded, list) or not all(isinstance(r, dict) and {"model", "task"} <= r.keys() for r in loaded):
                raise ValueError(f"{p}: not a report's results.json (rows with 'model' and 'task'); a sweep's "
                                 "results.json is read through its checkpoint folders instead: zoo report <sweep folder>")
            rows.extend(loaded)
    folders = checkpoint_folders([p for p in map(Path, paths) if not (p.is_file() and p.name == "results.json")])
    for folder in folders:
        config = json.loads((folder / CONFIG).read_text())
        scores = json.loads((folder / EVAL_RESULTS).read_text()) if (folder / EVAL_RESULTS).exists() else {}
        prov = config.get("provenance", {})
        parameters = sum(math.prod(shape) for shape in config.get("parameters", {}).values())
        rows.append({
            "model": folder.name, "entry": config["entry"]["name"], "arch": config["entry"]["arch"]["type"],
            "task": config["entry"]["task"], "source": config["entry"]["source"]["kind"], "parameters": parameters,
            "steps": prov.get("steps"), "device": prov.get("device"),
            **{k: scores[k] for k in (*COLUMNS, *POSITION_KEYS, "polynomial", "gd_eta") if k in scores},
        })
        curve = validation_curve(folder)
        if curve:
            rows[-1]["val_curve"] = curve
        if input_scales or weights:
            rows[-1].update(_analyses(folder, input_scales, weights))
    return rows


def validation_curve(folder: Path) -> list[list[float]]:
    """[step, validation loss] at each of a checkpoint's evaluations during training (its
    training_history.json, size-checked and contained like every checkpoint file); [] without one.
    Rows with no finite validation loss (evaluations are every `eval_every` steps; a diverged one
    reads NaN) are left out; a history that is not a list of rows is an error naming the file."""
    history = read_json(folder, HISTORY)
    if history is None:
        return []
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        raise CheckpointError(f"{folder / HISTORY}: not a training history (a list of rows)")
    curve = []
    for r in history:
        step, loss = r.get("step"), r.get("val_loss")
        if isinstance(step, int) and isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss):
            curve.append([step, float(loss)])
    return curve


def _analyses(folder: Path, input_scales: list[float] | None, weights: bool) -> dict:
    from zoo.science.evaluation import gd_reference, input_scale_curve
    from zoo.storage.checkpoint import read_checkpoint

    ckpt = read_checkpoint(folder)
    reference = gd_reference(ckpt.entry, ckpt.task, ckpt.construction, recorded=ckpt.metrics)
    out = {}  # an analysis that does not apply to this checkpoint records why instead of stopping the report
    if input_scales:
        try:
            out["input_scale_curve"] = input_scale_curve(ckpt.model, ckpt.task, input_scales, **reference)
        except ValueError as e:
            out["input_scale_curve_not_applicable"] = str(e)
    if weights:
        from zoo.science.analysis.gd_ssm_kernels import compare_with_construction

        try:
            result = compare_with_construction(ckpt.model, ckpt.task, reference.get("eta"))
            out["weights_vs_construction"] = {k: v for k, v in result.items() if k != "matrices"}
        except ValueError as e:
            out["weights_not_applicable"] = str(e)
    return out


def run_line(row: dict) -> str:
    """The run less its seed: `entry--seed3--lr=0.1` → `entry--lr=0.1` (sweep run names)."""
    return re.sub(r"--seed\d+", "", row["model"])


def _by_run_line(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Rows grouped by their run less its seed, in natural order of the run."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(run_line(r), []).append(r)
    return sorted(groups.items(), key=lambda kv: _natural(kv[0]))


def _mean_std_of(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4g}"
    return f"{statistics.mean(values):.4g} ± {statistics.stdev(values):.2g}"  # exact arithmetic: equal values give ± 0


SEED_COLUMNS = {  # key → (label, how to read it from a row)
    **{k: (metrics.label(k), lambda r, k=k: r.get(k)) for k in ("test_loss", "gd_loss", "sensitivity_cosine", "pred_l2_to_gd")},
    "tensor_cosine": ("weights: function-tensor cosine", lambda r: r.get("weights_vs_construction", {}).get("tensor_cosine")),
    "lambda_mean": ("weights: mean Λ", lambda r: r.get("weights_vs_construction", {}).get("lambda_mean")),
}


def _seed_table(rows: list[dict]) -> list[str]:
    """Mean ± std (sample std, n − 1) over the runs that differ only in their seed."""
    groups = _by_run_line(rows)
    if not any(len(g) > 1 for _, g in groups) and not any("weights_vs_construction" in r for r in rows):
        return []
    keys = [k for k, (_, get) in SEED_COLUMNS.items() if any(get(r) is not None for r in rows)]
    lines = ["## mean ± std over seeds", "", "| run | seeds | steps | " + " | ".join(SEED_COLUMNS[k][0] for k in keys) + " |",
             "|" + "---|" * (len(keys) + 3)]
    for line, group in groups:
        cells = []
        for k in keys:
            values = [v for v in map(SEED_COLUMNS[k][1], group) if v is not None]
            cells.append(_mean_std_of(values) if values else "")
        steps = sorted({r.get("steps") for r in group}, key=lambda v: v or 0)
        lines.append(f"| {line} | {len(group)} | {', '.join(_fmt(v) for v in steps)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _input_scale_table(rows: list[dict]) -> list[str]:
    rows = [r for r in rows if "input_scale_curve" in r]
    if not rows:
        return []
    scales = [p["input_scale"] for p in rows[0]["input_scale_curve"]]
    lines = ["## loss against the input scale α (mean ± std over seeds)", "",
             "Inputs x ~ U(−α·a, α·a) for the task's a; 2000 tasks drawn from seed 0, the same for every model "
             "(zoo.science.evaluation.input_scale_curve); GD keeps the training distribution's η.", "",
             "| run | seeds | " + " | ".join(f"α = {_fmt(a)}" for a in scales) + " |", "|" + "---|" * (len(scales) + 2)]
    for line, group in _by_run_line(rows):
        cells = [_mean_std_of([r["input_scale_curve"][i]["test_loss"] for r in group]) for i in range(len(scales))]
        lines.append(f"| {line} | {len(group)} | " + " | ".join(cells) + " |")
        gd = [_fmt(p["gd_loss"]) for p in group[0]["input_scale_curve"]]
        lines.append(f"| GD (as {line} is scored) | | " + " | ".join(gd) + " |")
    return [*lines, ""]


def _input_scale_figure(rows: list[dict], path: Path) -> Path:
    """Every run's loss against the input scale (one line per seed: a seed stuck on a plateau stays
    visible instead of widening a mean's error bar), GD dashed."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    groups = _by_run_line([r for r in rows if "input_scale_curve" in r])
    scales = []
    for i, (line, group) in enumerate(groups):
        scales = [p["input_scale"] for p in group[0]["input_scale_curve"]]
        for j, r in enumerate(group):
            ax.plot(scales, [p["test_loss"] for p in r["input_scale_curve"]], color=f"C{i}", marker="o", ms=3, lw=1,
                    alpha=0.7, label=f"{line} ({len(group)} runs)" if j == 0 else None)
        ax.plot(scales, [p["gd_loss"] for p in group[0]["input_scale_curve"]], color="k" if len(groups) == 1 else f"C{i}",
                ls="--", lw=1.5, label=f"one GD step ({line}'s task)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(scales, [_fmt(a) for a in scales])
    ax.minorticks_off()
    return finish(fig, ax, path, xlabel="input scale α (training: 1)", title="loss on inputs of another scale",
                  legend_size=7, grid=True, dpi=110)


def write_report(rows: list[dict], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    tasks = sorted({r["task"] for r in rows}, key=_natural)
    lines = ["# icl-zoo comparison report", ""]
    for task in tasks:
        group = sorted((r for r in rows if r["task"] == task), key=lambda r: r.get("test_loss", float("inf")))
        regression = any("gd_loss" in r for r in group)
        if regression:
            lines += [f"## {task}", "", f"least squares: {_fmt(group[0].get('lstsq_loss'))}; each row is compared "
                      f"with `gd_steps` steps of GD (loss `gd_loss`)", ""]
        else:
            lines += [f"## {task}", "", "students of an LSA teacher: polynomial distance to the teacher, KV and Q "
                      "scores (1 − R², Zucchet et al. Table 1)", ""]
        cols = ["model", "arch", "source", "parameters", "steps", "device", "test_loss",
                *(REGRESSION_COLUMNS if regression else TEACHER_COLUMNS)]
        if regression and any("memory_leak" in r for r in group):
            cols.append("memory_leak")  # gated RNNs: why Table 2's coefficients exceed η*
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in group]
        lines.append("")
        lines += _polynomial_table(task, group)
    figures = []
    for task in tasks:
        group = [r for r in rows if r["task"] == task and "position_loss" in r]
        if group:
            lines += _position_table(task, group)
            figures.append(_position_figure(task, group, out / f"report-{task}-position.png"))
    for (base, field), variants in _task_scans(rows).items():
        lines += _scan_table(base, field, variants)
        figures.append(_scan_figure(base, field, variants, out / f"report-{base}-{field}.png"))
    for task in tasks:
        # best last validation loss first, in the table and the legend alike
        group = sorted((r for r in rows if r["task"] == task and r.get("val_curve")), key=lambda r: r["val_curve"][-1][1])
        if group:
            lines += _training_table(task, group)
            figures.append(_training_figure(task, group, out / f"report-{task}-training.png"))
    lines += _seed_table(rows)
    if any("input_scale_curve" in r for r in rows):
        lines += _input_scale_table(rows)
        figures.append(_input_scale_figure(rows, out / "report-input-scale.png"))
    md = out / "report.md"
    md.write_text("\n".join(lines))
    raw = out / "results.json"  # the per-run rows the tables and figures are drawn from
    raw.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    return [md, raw, _figure(rows, tasks, out / "report.png"), *figures]


def _polynomial_table(task: str, group: list[dict]) -> list[str]:
    """Zucchet Table 2 for the rows that have it: x_i² y_1 of the instantaneous polynomial and the
    norm of every other coefficient, beside one GD step (η* on each x_i² y_1, nothing else)."""
    rows = [r for r in group if "polynomial" in r]
    if not rows:
        return []
    terms = [t for t in rows[0]["polynomial"] if t != "residual norm"]
    cols = ["model", "steps", *terms, "residual norm", "memory_leak"]
    lines = [f"### {task}: instantaneous polynomial, first output unit (Zucchet et al. Table 2)", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in sorted(rows, key=lambda r: _natural(r["model"])):
        cells = [r["model"], r.get("steps"), *(r["polynomial"].get(t) for t in [*terms, "residual norm"]),
                 r.get("memory_leak")]
        lines.append("| " + " | ".join(map(_fmt, cells)) + " |")
    eta = next((r["gd_eta"] for r in rows if "gd_eta" in r), None)
    if eta is not None:
        lines.append("| one GD step (η*) | | " + " | ".join(_fmt(eta) for _ in terms) + " | 0 | |")
    return [*lines, ""]


def _by_entry(group: list[dict]) -> dict[str, list[list[float]]]:
    """Loss-against-position curves of each entry, one per run (seeds), entries in best-last-position order."""
    curves: dict[str, list[list[float]]] = {}
    for r in sorted(group, key=lambda r: r["position_loss"][-1]):
        curves.setdefault(r["entry"], []).append(r["position_loss"])
    return curves


def _mean_std(curves: list[list[float]]) -> tuple[list[float], list[float]]:
    n = len(curves)
    mean = [sum(c[i] for c in curves) / n for i in range(len(curves[0]))]
    std = [(sum((c[i] - mean[i]) ** 2 for c in curves) / (n - 1)) ** 0.5 if n > 1 else 0.0 for i in range(len(mean))]
    return mean, std


def _position_table(task: str, group: list[dict]) -> list[str]:
    """Loss of the prediction after t examples (the "triples" layout predicts at every position):
    each entry's mean ± std over its runs (seeds), beside the baselines on the same prefix."""
    length = len(group[0]["position_loss"])
    ts = sorted({1, 2, 5, 10, length} & set(range(1, length + 1)))
    lines = [f"## {task}: loss against position (mean ± std over seeds; n = runs)", "",
             "| model | n | " + " | ".join(f"t = {t}" for t in ts) + " |", "|" + "---|" * (len(ts) + 2)]
    for entry, curves in _by_entry(group).items():
        mean, std = _mean_std(curves)
        cells = [f"{mean[t - 1]:.4g} ± {std[t - 1]:.2g}" if len(curves) > 1 else f"{mean[t - 1]:.4g}" for t in ts]
        lines.append(f"| {entry} | {len(curves)} | " + " | ".join(cells) + " |")
    for key, (label, _) in POSITION_CURVES.items():
        if key != "position_loss" and key in group[0]:
            lines.append(f"| {label} | | " + " | ".join(f"{group[0][key][t - 1]:.4g}" for t in ts) + " |")
    return [*lines, ""]


def _position_figure(task: str, group: list[dict], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    t = list(range(1, len(group[0]["position_loss"]) + 1))
    for key, (label, style) in POSITION_CURVES.items():
        if key != "position_loss" and key in group[0]:
            ax.plot(t, group[0][key], label=label, **style)
    lowest = min(min(v) for r in group for k, v in r.items() if k in POSITION_KEYS and k != "position_lstsq_loss")
    for i, (entry, curves) in enumerate(_by_entry(group).items()):
        mean, std = _mean_std(curves)
        ax.plot(t, mean, color=f"C{i % 10}", lw=1.5, marker="o", ms=2.5, label=f"{entry} (n = {len(curves)})")
        if len(curves) > 1:
            ax.fill_between(t, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=f"C{i % 10}", alpha=0.2)
    ax.set_yscale("log")
    ax.set_ylim(bottom=lowest / 3)  # noise-free least squares is exact (~1e-15) once t ≥ d_x
    return finish(fig, ax, path, xlabel=POSITION_AXIS, title=f"{task}: loss against position", legend_size=7,
                  grid=False, dpi=110)


def _training_table(task: str, group: list[dict]) -> list[str]:
    """The first evaluation at which each run's validation loss fell below each decade: how fast it
    learned, which a final loss alone does not show (runs that end level can differ by decades on the way)."""
    lowest = min(loss for r in group for _, loss in r["val_curve"])
    if lowest <= 0:
        return []
    deepest = 1  # 1e-1 … the deepest decade some run got below
    while deepest < 12 and lowest < 10.0 ** -(deepest + 1):
        deepest += 1
    decades = range(max(1, deepest - 9), deepest + 1)  # at most ten columns: the deepest ones
    lines = [f"## {task}: first evaluation below each validation loss", "",
             "| model | steps | last validation loss | " + " | ".join(f"< 1e-{k}" for k in decades) + " |",
             "|" + "---|" * (len(decades) + 3)]
    for r in group:
        first = [next((step for step, loss in r["val_curve"] if loss < 10.0 ** -k), None) for k in decades]
        lines.append(f"| {r['model']} | {_fmt(r.get('steps'))} | {r['val_curve'][-1][1]:.4g} | "
                     + " | ".join("—" if s is None else f"{s:,}" for s in first) + " |")
    return [*lines, "", "(— : not reached)", ""]


def _training_figure(task: str, group: list[dict], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, r in enumerate(group):
        steps, losses = zip(*r["val_curve"])
        ax.plot(steps, losses, color=f"C{i % 10}", lw=1.3, label=r["model"])
    ax.set_yscale("log")
    return finish(fig, ax, path, xlabel="training step", ylabel="validation loss  (½·MSE)",
                  title=f"{task}: validation loss during training", legend_size=7, dpi=110)


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _task_scans(rows: list[dict]) -> dict[tuple[str, str], dict[float, list[dict]]]:
    """Sweeps over one numeric task field: tasks named `base--field=value` (zoo's name for a task
    overridden by a sweep grid), grouped as {(base, field): {value: rows}} when ≥ 2 values."""
    scans: dict = {}
    for r in rows:
        base, _, suffix = r["task"].partition("--")
        field, eq, value = suffix.partition("=")
        if not eq or "--" in value:
            continue
        try:
            v = float(value)
        except ValueError:
            continue
        r = {**r, "line": r["model"].replace(f"--{suffix}", "")}  # the run, less this task field
        scans.setdefault((base, field), {}).setdefault(v, []).append(r)
    for variants in scans.values():
        _drop_shared_overrides([r for g in variants.values() for r in g])
        # one run name in two folders (e.g. two step counts): tell them apart
        clash = {r["line"] for g in variants.values() for r in g if sum(q["line"] == r["line"] for q in g) > 1}
        for g in variants.values():
            for r in g:
                if r["line"] in clash:
                    r["line"] += f" ({r.get('steps')} steps)"
    return {k: dict(sorted(v.items())) for k, v in scans.items() if len(v) >= 2}


def _drop_shared_overrides(rows: list[dict]) -> None:
    """Shorten each row's `line` (entry--override--…) to what tells it apart: an override part is
    dropped when every line of the scan has it, or every line of the same entry (when there are
    two or more); the dropped parts go to `shared`, which the table prints once per entry."""
    split = [r["line"].split("--") for r in rows]
    runs_of: dict[str, set[tuple]] = {}
    for entry, *overrides in split:
        runs_of.setdefault(entry, set()).add(tuple(overrides))
    everywhere = set.intersection(*(set(run) for runs in runs_of.values() for run in runs))
    common = {entry: everywhere | (set.intersection(*map(set, runs)) if len(runs) > 1 else set())
              for entry, runs in runs_of.items()}
    for r, (entry, *overrides) in zip(rows, split):
        r["line"] = "--".join([entry, *(o for o in overrides if o not in common[entry])])
        r["shared"] = (entry, "--".join(o for o in overrides if o in common[entry]))


def _scan_lines(variants: dict[float, list[dict]]) -> list[str]:
    return sorted({r["line"] for g in variants.values() for r in g}, key=_natural)


def _scan_reference(variants: dict[float, list[dict]], key: str) -> list[float | None]:
    """GD's / least squares' loss at each value (the same for every run of a task)."""
    return [next((r[key] for r in g if key in r), None) for g in variants.values()]


def _scan_table(base: str, field: str, variants: dict[float, list[dict]]) -> list[str]:
    values = list(variants)
    head = [f"## {base}: test loss against `task.{field}` (sensitivity cosine to GD)", "",
            "| model | " + " | ".join(_fmt(v) for v in values) + " |", "|" + "---|" * (len(values) + 1)]
    body = []
    for key, label in (("gd_loss", "GD"), ("lstsq_loss", "least squares")):
        reference = _scan_reference(variants, key)
        if any(v is not None for v in reference):
            body.append(f"| {label} | " + " | ".join(map(_fmt, reference)) + " |")
    for line in _scan_lines(variants):
        cells = []
        for g in variants.values():
            r = next((r for r in g if r["line"] == line), None)
            cells.append("" if r is None else f"{_fmt(r.get('test_loss'))}"
                         + (f" ({r['sensitivity_cosine']:.3f})" if "sensitivity_cosine" in r else ""))
        body.append(f"| {line} | " + " | ".join(cells) + " |")
    shared = sorted({r["shared"] for g in variants.values() for r in g if r["shared"][1]})
    notes = [f"All runs of {entry} also have `--{parts}`." for entry, parts in shared]
    return head + body + [""] + ([" ".join(notes), ""] if notes else [])


def _scan_figure(base: str, field: str, variants: dict[float, list[dict]], path: Path) -> Path:
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    values = list(variants)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, style, label in (("gd_loss", dict(color="black", ls="--"), "GD"), ("lstsq_loss", dict(color="tab:red", ls=":"), "least squares")):
        reference = _scan_reference(variants, key)
        if any(v is not None for v in reference):
            ax.plot(values, [float("nan") if v is None else max(v, 1e-16) for v in reference], label=label, lw=2, **style)
    for line in _scan_lines(variants):
        pts = [(v, r["test_loss"]) for v, g in variants.items() for r in g if r["line"] == line and "test_loss" in r]
        ax.plot(*zip(*pts), marker="o", label=line)
    if max(values) / max(min(values), 1e-12) >= 10:
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xticks(values, [_fmt(v) for v in values])
    ax.set_yscale("log")
    shown = [r[k] for g in variants.values() for r in g for k in ("test_loss", "gd_loss") if r.get(k, 0) > 0]
    ax.set_ylim(bottom=0.5 * min(shown))  # least squares reaches ~1e-15 once C ≥ d: let it leave the axes
    return finish(fig, ax, path, xlabel=f"task.{field}", title=f"{base}: loss against {field}", legend_size=7,
                  grid=False, dpi=110)


def _figure(rows: list[dict], tasks: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 0.45 * max(len(rows), 4) + 1.5 * len(tasks)), squeeze=False)
    for (ax_loss, ax_right), task in zip(axes, tasks):
        group = sorted((r for r in rows if r["task"] == task), key=lambda r: r.get("test_loss", float("inf")))
        names = [r["model"] for r in group]
        losses = [r.get("test_loss", float("nan")) for r in group]
        positive = [v for v in losses if v > 0]
        # a task without a GD reference (a teacher to mimic) spans decades: only a log axis shows them all
        log = "gd_loss" not in group[0] or (positive and max(positive) >= 100 * min(positive))
        ax_loss.barh(names, losses, color="tab:blue")
        for key, color, label in (("gd_loss", "tab:green", "GD"), ("lstsq_loss", "tab:red", "least squares")):
            if key in group[0]:
                ax_loss.axvline(group[0][key], color=color, ls="--", label=label)
        if log and positive:
            ax_loss.set_xscale("log")
        else:
            ax_loss.set_xlim(0, 1.15 * max(max(r.get("test_loss", 0.0) for r in group), group[0].get("gd_loss", 0.0)))
        ax_loss.set_title(f"{task}: test loss (½·MSE)")
        if ax_loss.get_legend_handles_labels()[0]:
            ax_loss.legend(fontsize=8)
        if any("sensitivity_cosine" in r for r in group):
            ax_right.barh(names, [r.get("sensitivity_cosine", float("nan")) for r in group], color="tab:orange")
            ax_right.axvline(1.0, color="tab:green", ls="--")
            ax_right.set_xlim(min(0.0, *(r.get("sensitivity_cosine", 0.0) for r in group)), 1.05)
            ax_right.set_title("sensitivity cosine to GD")
            ax_right.set_yticklabels([])
        else:  # no GD to align with: loss against size, as Zucchet et al.'s Figure 5 plots it
            for r in group:
                if r.get("test_loss", 0) > 0 and r.get("parameters"):
                    ax_right.scatter(r["parameters"], r["test_loss"])
                    ax_right.annotate(r["model"], (r["parameters"], r["test_loss"]), fontsize=7,
                                      xytext=(4, 2), textcoords="offset points")
            ax_right.set_yscale("log")
            ax_right.set_xlabel("parameters")
            ax_right.set_title(f"{task}: test loss against parameters")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))


# ---------------------------------------------------------------- reports/README.md: the release's counts
# The counts and the reference table of reports/README.md's "Released checkpoints" come from the release
# index, never by hand: `write_release_summary` rewrites what sits between these two lines, and
# tests/test_readme.py checks that the README's block is `release_summary(read_index())`.
SUMMARY_BEGIN = ("<!-- release summary: generated from release/index.json by "
                 "zoo.publishing.report.write_release_summary; do not edit by hand -->")
SUMMARY_END = "<!-- end of the release summary -->"
PAPER_VERDICTS = ("meets", "falls short", "meets where checkable")


def release_counts(index: dict) -> dict:
    """What reports/README.md says of a release index: entries, trained (full recipe or shorter), constructed,
    entries declaring departures, verdicts against paper values and references, entries with no expected value."""
    rows = list(index["entries"].values())
    trained = [r for r in rows if r["source"] == "trained"]
    short = sorted((r for r in trained if isinstance(r.get("steps"), int) and isinstance(r.get("recipe_steps"), int)
                    and r["steps"] < r["recipe_steps"]), key=lambda r: r["entry"])
    verdicts = [r["verdict"] for r in rows]
    full = [r for r in trained if r not in short]  # what ran the whole recipe, by where it ran
    return {
        "version": index.get("version", ""),
        "entries": len(rows),
        "trained": len(trained),
        "constructed": len(rows) - len(trained),
        "full_recipe": len(trained) - len(short),
        "short": [(r["entry"], r["steps"], r["recipe_steps"]) for r in short],
        "threads": {n: sum(1 for r in full if r.get("threads") == n and r.get("device", "cpu") == "cpu")
                    for n in sorted({r["threads"] for r in full if isinstance(r.get("threads"), int)})},
        "gpus": dict(sorted(Counter(r.get("device_name") or "GPU" for r in full
                                    if r.get("device", "cpu") != "cpu").items())),
        "departures": sum(1 for r in rows if r.get("deviations")),
        "meet": verdicts.count("meets"),
        "fall_short": verdicts.count("falls short"),
        "meet_where_checkable": verdicts.count("meets where checkable"),
        "match_reference": sum(1 for v in verdicts if v.startswith("matches")),
        "differ_reference": sum(1 for v in verdicts if v.startswith("differs")),
        "no_expected": sum(1 for r in rows if not r.get("checks")),
    }


def _steps(row: dict) -> str:
    if row["source"] != "trained":
        return "—"
    return f"{row['steps']:,} / {row['recipe_steps']:,}" if isinstance(row.get("steps"), int) else "—"


def _check_text(check: dict) -> str:
    measured = check.get("measured")
    shown = f"{measured:.5g}" if isinstance(measured, float) and check["kind"] != "paired_gd" else \
        measured_text(check["kind"], measured)
    return f"{check['metric']}: {claim_text(check['kind'], check['value'], check['tolerance'])} → {shown}"


def release_summary(index: dict) -> str:
    """reports/README.md's generated block: the release's counts in words, then every entry checked only
    against a reference the zoo computes (a closed form or a construction), with its claims and status."""
    c = release_counts(index)
    words = {1: "one thread", 2: "two threads"}
    threads = ", ".join([*(f"{n} on {words.get(t, f'{t} threads')}" for t, n in c["threads"].items()),
                         *(f"{n} on {'an' if name[0] in 'AEINOU' else 'a'} {name}" for name, n in c["gpus"].items())])
    short = "; ".join(f"`{name}` ({steps:,} of {recipe:,} steps)" for name, steps, recipe in c["short"])
    lines = [
        f"The release, [`release/INDEX.md`](../release/INDEX.md) ({c['version']}), holds {c['entries']} entries: "
        f"{c['trained']} trained and {c['constructed']} constructed. {c['full_recipe']} of the {c['trained']} trained "
        f"entries ran their full recipe" + (f" ({threads})" if threads else "") + "; "
        + (("the other one holds a shorter run" if len(c["short"]) == 1 else f"the other {len(c['short'])} hold shorter runs")
           + f", said as such in its row{'' if len(c['short']) == 1 else 's'}: {short}. " if c["short"]
           else "none holds a shorter run. ")
        + f"{c['departures']} of the {c['entries']} entries declare departures from the paper's setting or recipe "
        f"(the index's departures column; each card lists them: what the paper says, what the zoo does, why). "
        f"Against numbers the papers print: {c['meet']} meet, {c['fall_short']} fall short"
        + (f", {c['meet_where_checkable']} meet where checkable. " if c["meet_where_checkable"] else ". ")
        + "Against a reference the zoo computes (not paper "
        f"verdicts): {c['match_reference']} match, {c['differ_reference']} differ. {c['no_expected']} entries have "
        "no expected value; their numbers appear on the pages above.",
        "",
        "Checked only against a reference the zoo computes (what computes each one: its card, and the index's notes):",
        "",
        "| entry | source | steps run / recipe | reference (claim) → measured | |",
        "|---|---|---|---|---|",
    ]
    for name, row in sorted(index["entries"].items()):
        checks = row.get("checks") or []
        if checks and all(ch.get("source") == "reference" for ch in checks):
            lines.append(f"| `{name}` | {row['source']} | {_steps(row)} | "
                         f"{'; '.join(_check_text(ch) for ch in checks)} | {row['verdict']} |")
    unchecked = sorted((name, row) for name, row in index["entries"].items()
                       if row["source"] == "constructed" and not row.get("checks"))
    if unchecked:
        lines += ["", "The other constructed entries have no expected value; each beside the GD reference its card "
                  "gives (k steps at the rate its card names; a teacher generates its task, so it has none):", "",
                  "| entry | test loss | GD reference (k steps) | test loss vs reference |", "|---|---|---|---|"]
        for name, row in unchecked:
            test, gd = (v if isinstance(v, float) and math.isfinite(v) else None
                        for v in (row.get("test_loss"), row.get("gd_loss")))
            steps = f" ({row['gd_steps']})" if row.get("gd_steps") else ""
            rel = (test - gd) / gd if test is not None and gd else None
            gap = "—" if rel is None else f"{rel:+.2%}" if abs(rel) >= 5e-5 else f"{rel:+.1e}"  # no "-0.00%"
            lines.append(f"| `{name}` | {'—' if test is None else f'{test:.5g}'} | "
                         f"{'—' if gd is None else f'{gd:.5g}{steps}'} | {gap} |")
    return "\n".join(lines) + "\n"


def write_release_summary(readme: Path, index: dict) -> bool:
    """Rewrite the block between SUMMARY_BEGIN and SUMMARY_END of `readme` (reports/README.md) from `index`;
    True when the file changed. The page's own prose around the block is left as written."""
    text = readme.read_text()
    if text.count(SUMMARY_BEGIN) != 1 or text.count(SUMMARY_END) != 1:
        raise ValueError(f"{readme}: expected one '{SUMMARY_BEGIN}' line and one '{SUMMARY_END}' line")
    head, rest = text.split(SUMMARY_BEGIN + "\n")
    _, tail = rest.split(SUMMARY_END)
    new = head + SUMMARY_BEGIN + "\n" + release_summary(index) + SUMMARY_END + tail
    if new != text:
        readme.write_text(new)
    return new != text


def readme_release_block(readme: Path) -> str:
    """The generated block as reports/README.md holds it (what a test compares with `release_summary`)."""
    text = readme.read_text()
    return text.split(SUMMARY_BEGIN + "\n", 1)[1].split(SUMMARY_END, 1)[0]
