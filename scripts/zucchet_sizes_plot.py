"""Zucchet et al. Figures 4.B and 5 on the ICL task: loss against parameter count, one line per
architecture, on the frozen test split (the training distribution, W* ~ N(0, 1/3)) and on the shifted
validation split (W* ~ N(0, 2/3), what the paper's figures report), beside one GD step on each.

    python scripts/zucchet_sizes_plot.py rows.json [more.json ...] --plot sizes.png

The rows are `scripts/released_on_both_splits.py --json` output (released entries and sweep run folders). Rows of
one architecture at one parameter count are seeds: the point is their mean, the bar their standard deviation, and
the legend gives the number of seeds at each size, smallest first.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from zoo.science.analysis.plots import plt, save

NAMES = {  # entry name in a row (a bare name or a run folder) → the paper's label
    "lru-out-2l-zucchet-icl": "LRU Out, 2 layers", "lru-in-out-zucchet-icl": "LRU In+Out",
    "lru-in-skip-zucchet-icl": "LRU In+Skip", "lru-out-zucchet-icl": "LRU Out",
    "gru-zucchet-icl": "GRU", "lstm-zucchet-icl": "LSTM",
}


def label(entry: str) -> str:
    base, *parts = Path(entry).name.split("--")  # a run folder is "<entry>--seed0--width=16[--n_layers=2]"
    if base not in NAMES:
        raise SystemExit(f"{entry}: not one of the size-swept entries ({', '.join(NAMES)})")
    layers = [p.removeprefix("n_layers=") for p in parts if p.startswith("n_layers=")]
    if not layers or base == "lru-out-2l-zucchet-icl" and layers == ["2"]:
        return NAMES[base]
    one_layer_lrus = ("lru-in-out-zucchet-icl", "lru-in-skip-zucchet-icl", "lru-out-zucchet-icl")
    if base not in one_layer_lrus or layers[0] not in ("1", "2"):
        raise SystemExit(f"{entry}: n_layers={layers[0]} is not a Figure 5 variant of {base}")
    return NAMES[base] + (", 2 layers" if layers[0] == "2" else "")


FIELDS = ("entry", "parameters", "test_loss", "val_loss", "test_gd", "val_gd")


def read_rows(path: Path, fields: tuple[str, ...] = FIELDS) -> list[dict]:
    """The rows of one `released_on_both_splits.py --json` file (or another script's rows, each with `fields`),
    or a one-line exit naming what is wrong."""
    try:
        rows = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path}: not a readable JSON file of rows ({type(e).__name__})") from None
    if not isinstance(rows, list) or not rows:
        raise SystemExit(f"{path}: expected a non-empty JSON list of rows")
    for i, r in enumerate(rows):
        missing = [f for f in fields if not isinstance(r, dict) or f not in r]
        if missing:
            raise SystemExit(f"{path}: row {i} lacks {', '.join(missing)}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path, nargs="+")
    parser.add_argument("--plot", type=Path, required=True)
    args = parser.parse_args()
    rows = [r for path in args.rows for r in read_rows(path)]
    lines = defaultdict(list)
    for r in rows:
        lines[label(r["entry"])].append(r)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9), sharey=True)
    for ax, (key, gd_key, title) in zip(axes, [("test_loss", "test_gd", "test split (training distribution)"),
                                                ("val_loss", "val_gd", "shifted validation split (the paper's)")]):
        for i, (name, points) in enumerate(sorted(lines.items())):
            sizes = sorted({r["parameters"] for r in points})
            losses = [[r[key] for r in points if r["parameters"] == n] for n in sizes]  # the seeds at each size
            means = [statistics.fmean(v) for v in losses]
            stds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in losses]
            # on a log axis a bar below zero vanishes: the lower bar stops at the lowest seed, and every seed is a dot
            lower = [min(s, m - min(v)) for s, m, v in zip(stds, means, losses)]
            seeds = "/".join(str(len(v)) for v in losses)
            ax.errorbar(sizes, means, yerr=[lower, stds], marker="o", color=f"C{i}", capsize=3,
                        label=f"{name} (seeds {seeds})")
            ax.scatter([n for n, v in zip(sizes, losses) for _ in v], [x for v in losses for x in v], s=9,
                       color=f"C{i}", alpha=0.45, zorder=3)
        gd = rows[0][gd_key]  # one task, one split: the same GD reference in every row
        ax.axhline(gd, color="k", ls="--", lw=1, label="one GD step")
        ax.annotate(f"one GD step, {gd:.4f}", (0.02, gd), xycoords=("axes fraction", "data"), xytext=(0, 3),
                    textcoords="offset points", fontsize=7)
        ax.set(xscale="log", yscale="log", xlabel="parameters", title=title)
    axes[0].set_ylabel("loss (½·MSE) at 300k steps, mean ± std\nover seeds (dots: each seed)")
    axes[1].legend(fontsize=7)
    fig.suptitle("Zucchet et al. Figs. 4.B / 5: ICL loss against parameter count", fontsize=10)
    print(f"wrote {save(fig, args.plot)}")


if __name__ == "__main__":
    main()
