"""`zoo report`: trained models, GD and least squares side by side, per task.

Reads checkpoint folders (or sweep folders, which hold one checkpoint per run), and writes
`report.md` (a table per task) and `report.png` (test loss against the task's GD and
least-squares losses, and the sensitivity cosine to GD) in the output folder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from zoo.checkpoint import CONFIG, EVAL_RESULTS

COLUMNS = ("test_loss", "gd_loss", "lstsq_loss", "pred_l2_to_gd", "sensitivity_cosine", "gd_steps", "polynomial_distance",
           "kv_score", "q_score", "imperfect_memory_effect")
REGRESSION_COLUMNS = ["gd_loss", "gd_steps", "pred_l2_to_gd", "sensitivity_cosine"]
TEACHER_COLUMNS = ["polynomial_distance", "kv_score", "q_score", "imperfect_memory_effect"]  # students of an LSA teacher: no GD reference


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


def collect(paths: list[str | Path]) -> list[dict]:
    rows = []
    for folder in checkpoint_folders(paths):
        config = json.loads((folder / CONFIG).read_text())
        metrics = json.loads((folder / EVAL_RESULTS).read_text()) if (folder / EVAL_RESULTS).exists() else {}
        prov = config.get("provenance", {})
        parameters = sum(math.prod(shape) for shape in config.get("parameters", {}).values())
        rows.append({
            "model": folder.name, "entry": config["entry"]["name"], "arch": config["entry"]["arch"]["type"],
            "task": config["entry"]["task"], "source": config["entry"]["source"]["kind"], "parameters": parameters,
            "steps": prov.get("steps"), "device": prov.get("device"),
            **{k: metrics[k] for k in COLUMNS if k in metrics},
        })
    return rows


def write_report(rows: list[dict], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    tasks = sorted({r["task"] for r in rows})
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
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in group]
        lines.append("")
    md = out / "report.md"
    md.write_text("\n".join(lines))
    return [md, _figure(rows, tasks, out / "report.png")]


def _figure(rows: list[dict], tasks: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 0.45 * max(len(rows), 4) + 1.5 * len(tasks)), squeeze=False)
    for (ax_loss, ax_cos), task in zip(axes, tasks):
        group = sorted((r for r in rows if r["task"] == task), key=lambda r: r.get("test_loss", float("inf")))
        names = [r["model"] for r in group]
        ax_loss.barh(names, [r.get("test_loss", float("nan")) for r in group], color="tab:blue")
        for key, color, label in (("gd_loss", "tab:green", "GD"), ("lstsq_loss", "tab:red", "least squares")):
            if key in group[0]:
                ax_loss.axvline(group[0][key], color=color, ls="--", label=label)
        ax_loss.set_xlim(0, 1.15 * max(max(r.get("test_loss", 0.0) for r in group), group[0].get("gd_loss", 0.0)))
        ax_loss.set_title(f"{task}: test loss (½·MSE)")
        ax_loss.legend(fontsize=8)
        ax_cos.barh(names, [r.get("sensitivity_cosine", float("nan")) for r in group], color="tab:orange")
        ax_cos.axvline(1.0, color="tab:green", ls="--")
        ax_cos.set_xlim(min(0.0, *(r.get("sensitivity_cosine", 0.0) for r in group)), 1.05)
        ax_cos.set_title("sensitivity cosine to GD")
        ax_cos.set_yticklabels([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
