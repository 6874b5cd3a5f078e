"""Zucchet et al. Figure 3 as the paper draws it: a trained gated RNN's loss against its number of
hidden neurons, one point per seed.

- Panel A (teacher–student, `--panel a`): the test loss itself; identification means it falls
  towards 0.
- Panel B (ICL regression, `--panel b`): the test loss minus one optimal GD step's ("the difference
  between the prediction loss of the RNN and the optimal loss obtained after one step of gradient
  descent").

Reads a report's results.json (`zoo report <sweep folder> --out <folder>` on a sweep over
`arch.hidden`, e.g. sweeps/figure-3a.toml or sweeps/figure-3b-small.toml); the neuron count is
parsed from the run name (`--hidden=<n>`).

    python scripts/figure_3_size_sweep.py reports/zucchet-2023/generated/figure-3b/below-16-100k-cpu/results.json --panel b --plot out.png
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from zoo.science.analysis import plots

PANELS = {
    "a": ("test loss (½·MSE)", "Zucchet Fig. 3.A: student gated RNN on the d = 6 teacher"),
    "b": ("test loss − one GD step", "Zucchet Fig. 3.B: trained gated RNN vs one GD step"),
}


def values_by_size(rows: list[dict], panel: str) -> dict[int, list[float]]:
    """hidden → [the panel's quantity per seed]"""
    values = defaultdict(list)
    for row in rows:
        match = re.search(r"--hidden=(\d+)", row["model"])
        if not match or "test_loss" not in row:
            continue
        if panel == "a":
            values[int(match.group(1))].append(row["test_loss"])
        elif "gd_loss" in row:
            values[int(match.group(1))].append(row["test_loss"] - row["gd_loss"])
    return dict(sorted(values.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--panel", choices=sorted(PANELS), required=True)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    values = values_by_size(json.loads(args.results.read_text()), args.panel)
    if not values:
        raise SystemExit(f"{args.results}: no rows with a `--hidden=<n>` run name for panel {args.panel}")
    ylabel, title = PANELS[args.panel]
    print(f"| hidden | {ylabel} per seed | mean |")
    print("|---|---|---|")
    for hidden, per_seed in values.items():
        print(f"| {hidden} | {', '.join(f'{v:.3g}' for v in per_seed)} | {statistics.fmean(per_seed):.3g} |")
    if args.plot:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for hidden, per_seed in values.items():
            ax.scatter([hidden] * len(per_seed), per_seed, color="tab:blue")
        ax.plot(list(values), [statistics.fmean(v) for v in values.values()], color="tab:blue", alpha=0.5,
                label="mean over seeds (points: seeds)")
        smallest = min(abs(v) for per_seed in values.values() for v in per_seed if v != 0)
        if any(v <= 0 for per_seed in values.values() for v in per_seed):
            # a seed at (or, by sampling error, just below) GD's loss: linear near 0, log beyond
            ax.set_yscale("symlog", linthresh=smallest)
        else:
            ax.set_yscale("log")
        ax.set_xticks(list(values))
        plots.finish(fig, ax, args.plot, xlabel="hidden neurons", ylabel=ylabel, title=title)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
