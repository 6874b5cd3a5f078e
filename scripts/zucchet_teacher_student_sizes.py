"""Zucchet et al. Figure 5, teacher–student panel: the LRU variants' losses against parameter count on the
d = 6 LSA teacher, with the training loss beside the held-out one (the caption: "include both training
and validation losses"; on this task both come from one distribution).

    python scripts/zucchet_teacher_student_sizes.py runs/figure-5-ts-*/*/ lru-out-student-d6 lru-in-out-student-d6 \
        --json rows.json --plot sizes.png

(the trailing `/` keeps a sweep folder's results.json and results.md out of the glob).

Each argument is a checkpoint: a bare name loads from the shipped release (verified against release/index.json),
a folder (a sweep run) is checked against its own manifest (`trust` in the rows says which). Each is scored on
its task's frozen test and validation splits as `zoo eval --split test|validation` scores it; its training loss
is the last record of its training history: the mean of the training batches' losses since the record before
(`train_loss_steps` in the rows; 5,000 for these entries).
`--plot-only rows.json …` redraws the figure from saved rows.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

VARIANTS = {  # (arch.variant, arch.n_layers) → the paper's label
    ("out", 1): "LRU Out", ("in_out", 1): "LRU In+Out", ("in_skip", 1): "LRU In+Skip",
    ("out", 2): "LRU Out, 2 layers", ("in_out", 2): "LRU In+Out, 2 layers",
}
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
    plain = arch.type == "lru" and not getattr(arch, "residual", False) and getattr(arch, "hidden", None) in (None, arch.width)
    if ckpt.entry.task != "teacher-student-d6" or not plain or key not in VARIANTS:
        raise SystemExit(f"{name}: not an LRU variant of Figure 5 ({', '.join(VARIANTS.values())}; no residual, hidden = "
                         "width) on teacher-student-d6")
    spec = default_registry().tasks[ckpt.entry.task]
    test = rescore(ckpt, load_split(ckpt.entry.task, "test", spec=spec))
    val = rescore(ckpt, load_split(ckpt.entry.task, "validation", spec=spec))
    history = [r for r in (ckpt.history or []) if isinstance(r, dict) and "train_loss" in r]
    last = history[-1] if history else {}
    before = history[-2]["step"] if len(history) > 1 else 0
    return {"entry": name, "label": VARIANTS[key], "trust": ckpt.trust, "width": arch.width,
            "parameters": sum(p.numel() for p in ckpt.model.parameters()), "steps": ckpt.provenance.get("steps"),
            "seed": ckpt.entry.source.seed, "commit": ckpt.provenance.get("git_commit"),
            "train_loss": last.get("train_loss"), "train_loss_at": last.get("step"),
            "train_loss_steps": last["step"] - before if last else None,
            "val_loss": val["test_loss"], "test_loss": test["test_loss"]}


def read_rows(path: Path) -> list[dict]:
    """The rows of one `--json` file of this script (read as the sizes plot reads its rows), or a one-line exit
    naming what is wrong."""
    from zucchet_sizes_plot import read_rows as read_row_list  # this script's sibling: scripts/ is on sys.path

    rows = read_row_list(path, FIELDS)
    for i, r in enumerate(rows):
        if r["label"] not in VARIANTS.values():
            raise SystemExit(f"{path}: row {i} has an unknown variant {r['label']!r}")
        for f in ("parameters", "steps"):
            if not isinstance(r[f], int) or isinstance(r[f], bool) or r[f] <= 0:
                raise SystemExit(f"{path}: row {i}'s {f} is {r[f]!r}, not a positive integer")
        for f in ("train_loss", "val_loss", "test_loss"):
            v = r[f]
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0):
                raise SystemExit(f"{path}: row {i}'s {f} is {v!r}, not a positive finite number (or null)")
        if "seed" in r and not (r["seed"] is None or isinstance(r["seed"], int)):
            raise SystemExit(f"{path}: row {i}'s seed is {r['seed']!r}, not an integer")
    return rows


def draw(rows: list[dict]):
    """The figure: training and validation loss against parameters, a line per variant, length and seed."""
    from zoo.science.analysis.plots import plt

    lines = defaultdict(lambda: defaultdict(list))  # label → (steps, seed) → rows: one line per seed and length
    for r in rows:
        lines[r["label"]][(r["steps"], r.get("seed"))].append(r)
    seeds = len({r.get("seed") for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9), sharey=True)
    panels = [("train_loss", "training loss (since the history's previous record)"),
              ("val_loss", "validation loss (frozen split)")]
    for ax, (key, title) in zip(axes, panels):
        for i, label in enumerate(VARIANTS.values()):
            for (steps, seed), points in sorted(lines[label].items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
                points = [r for r in sorted(points, key=lambda r: r["parameters"]) if r[key] is not None]
                full = steps >= 1_000_000
                length = f"{steps / 1e6:g}M steps" if full else f"{steps / 1000:g}k steps"
                ax.plot([r["parameters"] for r in points], [r[key] for r in points], color=f"C{i}",
                        marker="*" if full else "o", ms=10 if full else 5, ls="none" if full else "-",
                        label=f"{label}, {length}" + (f", seed {seed}" if seeds > 1 else ""))
        ax.set(xscale="log", yscale="log", xlabel="parameters", title=title)
        ax.xaxis.set_minor_formatter(plt.NullFormatter())  # the decade labels only: minor ones overlap
    axes[0].set_ylabel("½·MSE to the teacher's output\n(zero predictor 1.812)")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Zucchet et al. Fig. 5, teacher–student (d = 6): LRU variants against parameter count, "
                 f"{'one seed' if seeds == 1 else f'{seeds} seeds, one line each'}", fontsize=10)
    return fig


def plot(rows: list[dict], out: Path) -> Path:
    from zoo.science.analysis.plots import save

    return save(draw(rows), out)


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
    if not args.plot_only:
        for r in rows:
            if not isinstance(r["steps"], int):
                raise SystemExit(f"{r['entry']}: records no step count (a constructed or foreign checkpoint)")
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
