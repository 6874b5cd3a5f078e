"""Zucchet et al. Figure 3.B as the paper draws it: the trained gated RNN's test loss minus one GD
step's, against the number of hidden neurons, one point per seed. Reads a report's results.json
(`zoo report <sweep folder> --out <folder>` on a sweep over `arch.hidden`, e.g.
sweeps/figure-3b-small.toml); the neuron count is parsed from the run name (`--hidden=<n>`).

    python scripts/figure_3b_transition.py reports/zucchet-2023/figure-3b/below-16-100k-cpu/results.json --plot out.png
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from zoo.analysis import plots


def gaps_by_size(rows: list[dict]) -> dict[int, list[float]]:
    """hidden → [test loss − GD loss per seed]"""
    gaps = defaultdict(list)
    for row in rows:
        match = re.search(r"--hidden=(\d+)", row["model"])
        if match and "test_loss" in row and "gd_loss" in row:
            gaps[int(match.group(1))].append(row["test_loss"] - row["gd_loss"])
    return dict(sorted(gaps.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    gaps = gaps_by_size(json.loads(args.results.read_text()))
    print("| hidden | loss − GD per seed | mean |")
    print("|---|---|---|")
    for hidden, values in gaps.items():
        print(f"| {hidden} | {', '.join(f'{v:.3g}' for v in values)} | {statistics.fmean(values):.3g} |")
    if args.plot:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for hidden, values in gaps.items():
            ax.scatter([hidden] * len(values), values, color="tab:blue")
        ax.plot(list(gaps), [statistics.fmean(v) for v in gaps.values()], color="tab:blue", alpha=0.5, label="mean over seeds (points: seeds)")
        ax.set_yscale("log")
        ax.set_xticks(list(gaps))
        plots.finish(fig, ax, args.plot, xlabel="hidden neurons", ylabel="test loss − one GD step",
                     title="Zucchet Fig. 3.B: trained gated RNN vs one GD step")
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
