"""Zucchet et al. Figure 5, teacher–student panel: the LRU variants' losses against parameter count on the
d = 6 LSA teacher, with the training loss beside the held-out one (the caption: "include both training
and validation losses"; on this task both come from one distribution).

    python scripts/zucchet_teacher_student_sizes.py runs/figure-5-ts-*/* lru-out-student-d6 lru-in-out-student-d6 \
        --json rows.json --plot sizes.png

Each argument is a checkpoint: a bare name loads from the shipped release (verified against release/index.json),
a folder (a sweep run) is checked against its own manifest (`trust` in the rows says which). Each is scored on
its task's frozen test and validation splits as `zoo eval --split test|validation` scores it; its training loss
is the last record of its training history (the mean over the last evaluation interval: 5,000 steps).
`--plot-only rows.json …` redraws the figure from saved rows.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

VARIANTS = {("out", 1): "LRU Out", ("in_out", 1): "LRU In+Out", ("in_skip", 1): "LRU In+Skip",
            ("out", 2): "LRU Out, 2 layers"}  # (arch.variant, arch.n_layers) → the paper's label
FIELDS = ("entry", "label", "parameters", "steps", "train_loss", "val_loss", "test_loss")


def row(name: str) -> dict:
    import zoo
    from zoo.science.evaluation import rescore
    from zoo.science.registry import default_registry
    from zoo.science.tasks.frozen import load_split

    try:
        ckpt = zoo.load(name)
    except (ValueError, OSError) as e:  # the zoo's loading errors (HubError, CheckpointError, …) are ValueErrors
        raise SystemExit(f"{name}: {e}") from None
    arch = ckpt.entry.arch
    key = (getattr(arch, "variant", None), getattr(arch, "n_layers", 1))
    if ckpt.entry.task != "teacher-student-d6" or arch.type != "lru" or key not in VARIANTS:
        raise SystemExit(f"{name}: not an LRU variant of Figure 5 ({', '.join(VARIANTS.values())}) on teacher-student-d6")
    spec = default_registry().tasks[ckpt.entry.task]
    test = rescore(ckpt, load_split(ckpt.entry.task, "test", spec=spec))
    val = rescore(ckpt, load_split(ckpt.entry.task, "validation", spec=spec))
    history = ckpt.history or []
    last = history[-1] if history else {}
    return {"entry": name, "label": VARIANTS[key], "trust": ckpt.trust, "width": arch.width,
            "parameters": sum(p.numel() for p in ckpt.model.parameters()), "steps": ckpt.provenance.get("steps"),
            "seed": ckpt.entry.source.seed, "commit": ckpt.provenance.get("git_commit"),
            "train_loss": last.get("train_loss"), "train_loss_at": last.get("step"),
            "val_loss": val["test_loss"], "test_loss": test["test_loss"]}


def read_rows(path: Path) -> list[dict]:
    """The rows of one `--json` file of this script, or a one-line exit naming what is wrong."""
    try:
        rows = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path}: not a readable JSON file of rows ({type(e).__name__})") from None
    if not isinstance(rows, list) or not rows:
        raise SystemExit(f"{path}: expected a non-empty JSON list of rows")
    for i, r in enumerate(rows):
        missing = [f for f in FIELDS if not isinstance(r, dict) or f not in r]
        if missing:
            raise SystemExit(f"{path}: row {i} lacks {', '.join(missing)}")
        if r["label"] not in VARIANTS.values():
            raise SystemExit(f"{path}: row {i} has an unknown variant {r['label']!r}")
    return rows


def plot(rows: list[dict], out: Path) -> Path:
    from zoo.science.analysis.plots import plt, save

    lines = defaultdict(lambda: defaultdict(list))  # label → steps → rows
    for r in rows:
        lines[r["label"]][r["steps"]].append(r)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9), sharey=True)
    panels = [("train_loss", "training loss (last 5,000 steps)"), ("val_loss", "validation loss (frozen split)")]
    for ax, (key, title) in zip(axes, panels):
        for i, label in enumerate(VARIANTS.values()):
            for steps, points in sorted(lines[label].items()):
                points = sorted(points, key=lambda r: r["parameters"])
                full = steps is not None and steps >= 1_000_000
                ax.plot([r["parameters"] for r in points], [r[key] for r in points], color=f"C{i}",
                        marker="*" if full else "o", ms=10 if full else 5, ls="none" if full else "-",
                        label=f"{label}, {steps / 1e6:g}M steps" if full else f"{label}, {steps / 1000:g}k steps")
        ax.set(xscale="log", yscale="log", xlabel="parameters", title=title)
    axes[0].set_ylabel("½·MSE to the teacher's output\n(zero predictor 1.812)")
    axes[1].legend(fontsize=7)
    fig.suptitle("Zucchet et al. Fig. 5, teacher–student (d = 6): LRU variants against parameter count, one seed",
                 fontsize=10)
    return save(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="*", help="run folders or released entry names")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--plot", type=Path, help="draw loss against parameters here")
    parser.add_argument("--plot-only", type=Path, nargs="+", metavar="ROWS", help="redraw from saved --json files")
    args = parser.parse_args()
    if bool(args.checkpoints) == bool(args.plot_only):
        parser.error("give checkpoints to score, or --plot-only ROWS.json to redraw")
    rows = ([r for p in args.plot_only for r in read_rows(p)] if args.plot_only else
            sorted((row(name) for name in args.checkpoints), key=lambda r: (r["label"], r["steps"] or 0, r["parameters"])))
    print("| variant | parameters | steps | training loss | validation loss | test loss | checkpoint |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        fmt = lambda v: "—" if v is None or not math.isfinite(v) else f"{v:.4g}"  # noqa: E731
        print(f"| {r['label']} | {r['parameters']:,} | {r['steps']:,} | {fmt(r['train_loss'])} | {fmt(r['val_loss'])} | "
              f"{fmt(r['test_loss'])} | `{r['entry']}` |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.plot:
        print(f"wrote {plot(rows, args.plot)}")


if __name__ == "__main__":
    main()
