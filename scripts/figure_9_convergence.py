"""Blogpost Figure 9, second sentence: "This behavior is observed for all context sizes, though the
convergence is faster for larger C." For every trained run of a Figure 9 sweep (sweeps/figure-9.toml),
the first validation step at which the trained LSA's loss is within 5% and within 1% of one GD step's
loss on the same frozen validation split (η from the run's card), per context size C: mean ± std over seeds.

    python scripts/figure_9_convergence.py runs/figure-9 [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from zoo.science.analysis import plots
from zoo.science.tasks.frozen import load_split
from zoo.science.tasks.regression import gd_predict
from zoo.storage.checkpoint import read_checkpoint

TOLERANCES = (0.05, 0.01)


def first_step_within(history: list[dict], target: float, tol: float) -> int | None:
    return next((row["step"] for row in history if row.get("val_loss", float("inf")) <= (1 + tol) * target), None)


def convergence(sweep_dir: Path) -> list[dict]:
    rows = []
    for folder in sorted(p for p in sweep_dir.iterdir() if (p / "config.json").is_file()):
        ckpt = read_checkpoint(folder)
        if ckpt.entry.source.kind != "trained" or not ckpt.history:
            continue
        task = ckpt.task
        batch = load_split(ckpt.entry.task, "validation", spec=ckpt.task_spec).batch(task)
        gd_val = task.loss(gd_predict(batch, ckpt.metrics["gd_eta"]), batch.query_targets).item()
        row = {"run": folder.name, "C": task.n_context, "seed": ckpt.provenance.get("seed"),
               "gd_val_loss": gd_val, "final_val_loss": ckpt.history[-1]["val_loss"], "steps": ckpt.history[-1]["step"]}
        row.update({f"steps_to_{round(tol * 100)}pct": first_step_within(ckpt.history, gd_val, tol) for tol in TOLERANCES})
        row["curve"] = [[h["step"], h["val_loss"] / gd_val - 1] for h in ckpt.history if "val_loss" in h]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    by_c = defaultdict(list)
    for r in rows:
        by_c[r["C"]].append(r)
    lines = ["| C | seeds | GD val. loss | final val. loss (mean ± std) | steps to ≤ 5% above GD | steps to ≤ 1% above GD |",
             "|---|---|---|---|---|---|"]

    def spread(values):
        reached = [v for v in values if v is not None]
        if not reached:
            return "not reached"
        text = f"{statistics.mean(reached):,.0f}" + (f" ± {statistics.stdev(reached):,.0f}" if len(reached) > 1 else "")
        return text + ("" if len(reached) == len(values) else f" ({len(values) - len(reached)} not reached)")

    for c in sorted(by_c):
        rs = by_c[c]
        finals = [r["final_val_loss"] for r in rs]
        final = f"{statistics.mean(finals):.4g}" + (f" ± {statistics.stdev(finals):.2g}" if len(finals) > 1 else "")
        lines.append(f"| {c} | {len(rs)} | {rs[0]['gd_val_loss']:.4g} | {final} | {spread([r['steps_to_5pct'] for r in rs])} | "
                     f"{spread([r['steps_to_1pct'] for r in rs])} |")
    return "\n".join(lines)


def figure(rows: list[dict], path: Path) -> Path:
    """(validation loss − GD's) / GD's against the step, one line per seed, a colour per C."""
    fig, ax = plots.plt.subplots(figsize=(6.4, 3.8), dpi=120)
    contexts = sorted({r["C"] for r in rows})
    colours = plots.plt.cm.viridis([i / max(1, len(contexts) - 1) for i in range(len(contexts))])
    for c, colour in zip(contexts, colours):
        for i, r in enumerate(r for r in rows if r["C"] == c):
            steps, gap = zip(*r["curve"])
            ax.plot(steps, [max(g, 1e-5) for g in gap], color=colour, lw=1, alpha=0.8, label=f"C = {c}" if i == 0 else None)
    for tol in TOLERANCES:
        ax.axhline(tol, color="grey", lw=0.6, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation loss / one GD step's − 1")
    ax.set_title("Blogpost Fig. 9: a trained 1-layer LSA converges to one GD step (3 seeds per C)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return plots.save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--json", type=Path, help="write the per-run rows here")
    parser.add_argument("--plot", type=Path, help="draw every run's gap to GD against the step here")
    args = parser.parse_args()
    rows = convergence(args.sweep_dir)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.plot:
        figure(rows, args.plot)
    print(table(rows))


if __name__ == "__main__":
    main()
