"""Blogpost Figure 10: "The predictions of the linear transformer converge to the predictions of the
GD-transformer and the gradients of the linear transformer converge to the gradients of the
GD-transformer." From a sweep trained with `track_alignment = true` (sweeps/figure-10-d5.toml), per
context size C: the three alignment metrics along training (mean and min–max over seeds), their final
values (mean ± std), and the blogpost's transcribed traces beside them (plotted-values.json).

Units. The zoo records sums of squares per task (zoo/science/evaluation.py: ‖f − ŷ_GD‖², ‖∂f/∂x_q − W‖²_F).
The blogpost's curves are ½ × the mean over entries: at step 0, where the model's output is ~0, its
prediction error is 0.2433 and its gradient error 0.1456 at D = 5, C = 2, and ½·E[ŷ_GD²] = 0.247,
½·E‖W‖²_F / D = 0.149 on the zoo's split. So the blogpost-unit columns are ½ × the zoo's prediction
error / d_y and ½ × its gradient error / (d_y·D).

    python scripts/figure_10_alignment.py runs/figure-10-d5 --out reports/blogpost-2024/generated/figure-10/d5-5k-cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from zoo.science.analysis import plots
from zoo.storage.checkpoint import read_checkpoint

PLOTTED = Path(__file__).resolve().parents[1] / "reports" / "blogpost-2024" / "plotted-values.json"
METRICS = {"pred_l2_to_gd": "L2 error (predictions)", "sensitivity_l2_to_gd": "L2 error (gradients)",
           "sensitivity_cosine": "Model similarity"}  # zoo key → the blogpost's trace name
THRESHOLD = 1e-3  # "converged": both L2 errors, in the blogpost's units, below this


def blog_units(key: str, value: float, d_x: int, d_y: int) -> float:
    """A zoo metric in the blogpost's units (module docstring)."""
    if key == "pred_l2_to_gd":
        return value / (2 * d_y)
    if key == "sensitivity_l2_to_gd":
        return value / (2 * d_y * d_x)
    return value


def runs(sweep_dir: Path) -> list[dict]:
    rows = []
    for folder in sorted(p for p in sweep_dir.iterdir() if (p / "config.json").is_file()):
        ckpt = read_checkpoint(folder)
        tracked = [h for h in ckpt.history if "pred_l2_to_gd" in h]
        if not tracked:
            continue
        task = ckpt.task
        curve = [{"step": h["step"], **{k: blog_units(k, h[k], task.d_x, task.d_y) for k in METRICS}} for h in tracked]
        reached = next((c["step"] for c in curve
                        if c["pred_l2_to_gd"] < THRESHOLD and c["sensitivity_l2_to_gd"] < THRESHOLD), None)
        rows.append({"run": folder.name, "C": task.n_context, "D": task.d_x, "seed": ckpt.provenance.get("seed"),
                     "steps": ckpt.provenance.get("steps"), "commit": ckpt.provenance.get("git_commit"),
                     "gd_eta": ckpt.metrics.get("gd_eta"), "final": curve[-1], "steps_to_threshold": reached,
                     "test": {k: ckpt.metrics[k] for k in ("test_loss", "gd_loss", *METRICS)}, "curve": curve})
    return rows


def blogpost_traces() -> dict[int, dict[str, dict]]:
    """{C: {zoo key: the blogpost's trace}} for the slider positions transcribed."""
    traces = defaultdict(dict)
    for curve in json.loads(PLOTTED.read_text())["figures"]["figure-10"]["curves"]:
        key = next(k for k, name in METRICS.items() if name == curve["name"])
        traces[curve["setting"]["C"]][key] = curve
    return traces


def spread(values: list[float], fmt: str = ".2e") -> str:
    text = format(statistics.mean(values), fmt)
    return text + (f" ± {format(statistics.stdev(values), fmt)}" if len(values) > 1 else "")


def converged(row: dict) -> bool:
    return row["final"]["pred_l2_to_gd"] < THRESHOLD and row["final"]["sensitivity_l2_to_gd"] < THRESHOLD


def table(rows: list[dict], traces: dict) -> str:
    """Per C: how many seeds end aligned (both L2 errors < THRESHOLD), their final metrics (mean ± std)
    and when they first got there; the other seeds' final metrics one by one."""
    by_c = defaultdict(list)
    for r in rows:
        by_c[r["C"]].append(r)
    lines = [f"| C | steps | seeds aligned (both L2 < {THRESHOLD:g}) | L2 error (predictions) | L2 error (gradients) | "
             "cosine (gradients) | first step both L2 < " f"{THRESHOLD:g} | seeds not aligned: final pred. / grad. L2, cosine | "
             "blogpost at step 4,980: pred. / grad. L2, cosine |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(by_c):
        rs = by_c[c]
        good, bad = [r for r in rs if converged(r)], [r for r in rs if not converged(r)]
        if good:
            finals = {k: [r["final"][k] for r in good] for k in METRICS}
            cells = [spread(finals["pred_l2_to_gd"]), spread(finals["sensitivity_l2_to_gd"]),
                     spread(finals["sensitivity_cosine"], ".6f"), spread([r["steps_to_threshold"] for r in good], ",.0f")]
        else:
            cells = ["—"] * 4
        others = "; ".join(f"seed {r['seed']}: {r['final']['pred_l2_to_gd']:.3g} / {r['final']['sensitivity_l2_to_gd']:.3g}, "
                           f"{r['final']['sensitivity_cosine']:.3f}" for r in bad) or "—"
        blog = traces.get(c)
        blog_text = (f"{blog['pred_l2_to_gd']['final_y']:.3g} / {blog['sensitivity_l2_to_gd']['final_y']:.3g}, "
                     f"{blog['sensitivity_cosine']['final_y']:.6f}") if blog else "not transcribed"
        lines.append(f"| {c} | {rs[0]['steps']:,} | {len(good)} of {len(rs)} | {' | '.join(cells)} | {others} | {blog_text} |")
    return "\n".join(lines)


def figure(rows: list[dict], c: int, traces: dict, path: Path) -> Path:
    """One panel per C as the blogpost draws it: L2 errors (left, log) and cosine (right), one thin line
    per seed (an average would hide a seed that stays on a plateau), the blogpost's mean trace dashed."""
    rs = [r for r in rows if r["C"] == c]
    fig, ax = plots.plt.subplots(figsize=(6.4, 3.8), dpi=120)
    right = ax.twinx()
    for (key, name), colour in zip(METRICS.items(), ("tab:blue", "tab:orange", "k")):
        axis = right if key == "sensitivity_cosine" else ax
        for i, r in enumerate(rs):
            axis.plot([p["step"] for p in r["curve"]], [p[key] for p in r["curve"]], color=colour, lw=1, alpha=0.7,
                      label=f"zoo: {name} (one line per seed)" if i == 0 else None)
        if c in traces and key in traces[c]:
            x, y = zip(*traces[c][key]["points"])
            axis.plot(x, y, color=colour, lw=1.4, ls="--", label=f"blogpost: {name}")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("L2 error to one GD step (blogpost units)")
    ax.grid(alpha=0.3)
    right.set_ylim(-0.05, 1.05)
    right.set_ylabel("cosine (gradients)")
    handles = [h for a in (ax, right) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, ncol=2, loc="upper center",
              bbox_to_anchor=(0.5, -0.17))
    ax.set_title(f"Blogpost Fig. 10 at D = {rs[0]['D']}, C = {c}: {len(rs)} seeds", fontsize=9)
    fig.set_size_inches(6.4, 4.6)
    return plots.save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, help="write results.json, table.md and one alignment-C<C>.png per C here")
    args = parser.parse_args()
    rows, traces = runs(args.sweep_dir), blogpost_traces()
    if not rows:
        raise SystemExit(f"{args.sweep_dir}: no checkpoint with alignment recorded during training "
                         "(train with `track_alignment = true` or --track-alignment)")
    text = table(rows, traces)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(rows, indent=1))
        (args.out / "table.md").write_text(text + "\n")
        for c in sorted({r["C"] for r in rows}):
            figure(rows, c, traces, args.out / f"alignment-C{c}.png")
    print(text)


if __name__ == "__main__":
    main()
