"""Blogpost Figure 7 at C = 10 by depth: the zoo's blogpost-sized softmax transformers (mean ± std over seeds)
beside the blogpost's plotted values and bands (reports/blogpost-2024/plotted-values.json), and one GD step.

    python scripts/figure_7_depth.py reports/blogpost-2024/generated/figure-7/blogpost-size-h100/results.json \
        --plot reports/blogpost-2024/generated/figure-7/blogpost-size-h100/depth.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from zoo.science.analysis.plots import plt, save


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--plot", type=Path, required=True)
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    depths = range(1, 6)
    zoo_mean, zoo_std = [], []
    for k in depths:
        row = results["summary"][f"{k} layers"]
        zoo_mean.append(row.get("mean", row.get("value")))
        zoo_std.append(row.get("std", 0.0))
    plotted = [results["blogpost_plotted_c10"][f"Transformer ({k} layers)"] for k in depths]
    gd = next(iter(results["released"].values()))["gd_loss"]

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.errorbar(list(depths), zoo_mean, yerr=zoo_std, marker="o", capsize=3,
                label="zoo, mean ± std (3 seeds; 5 layers: 1 seed)")
    ax.plot(list(depths), [p["value"] for p in plotted], marker="s", color="C1", label="blogpost, plotted")
    ax.fill_between(list(depths), [p["band"][0] for p in plotted], [p["band"][1] for p in plotted], color="C1",
                    alpha=0.2, label="blogpost, plotted band")
    ax.axhline(gd, color="k", ls="--", lw=1, label=f"one GD step (zoo's frozen test split, {gd:.4f})")
    ax.set(yscale="log", xlabel="layers", ylabel="test loss at C = 10 (D = 5)", xticks=list(depths),
           title="Blogpost Fig. 7: softmax transformers by depth")
    ax.legend(fontsize=7)
    print(f"wrote {save(fig, args.plot)}")


if __name__ == "__main__":
    main()
