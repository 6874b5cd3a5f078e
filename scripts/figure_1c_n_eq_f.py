"""Sushma, Tian et al. Figure 1.C at the caption's setting, N = N_x: the sweep folders' rows as one table, one JSON
and one figure (test loss against f, each seed beside one GD step and the zero predictor).

    for f in 2 5 10; do zoo sweep sweeps/gd-ssm-feature-dim-n-eq-f.toml --set task.d_x=$f --set task.n_context=$f \
        --steps 30000 --seeds 0 1 2 3 4 --out runs/gd-ssm-n-eq-f/f-$f; done      # and f = 20 at --steps 60000
    python scripts/figure_1c_n_eq_f.py runs/gd-ssm-n-eq-f --out reports/sushma-tian-2024/generated/figure-1c/n-eq-f

A folder `f-F` (or `f-F-…`, e.g. more seeds trained into another folder) holds the runs at f = N = F.
`--trained F=RESULTS` adds trained rows of one f from a `zoo report` results.json (rows named `<entry>--seed<k>`),
e.g. the paper-recipe run of Figure 1.A–B, whose task is already f = N = 10. A trained
seed "reaches GD" when its test loss is within 1% of one GD step's and its sensitivity cosine to GD is ≥ 0.99
(the plateau runs sit at cosines 0.37–0.64). Prints the markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

REACHES = (1.01, 0.99)  # (loss ≤ this × one GD step's, cosine ≥ this)


def trained_row(row: dict) -> dict:
    """One trained run's fields, from a sweep row ("run", "seed") or a `zoo report` row ("model": "<entry>--seed<k>")."""
    seed = row["seed"] if "seed" in row else int(re.fullmatch(r".*--seed(\d+)", row["model"]).group(1))
    return {"seed": seed, **{k: row[k] for k in ("test_loss", "sensitivity_cosine", "pred_l2_to_gd")}}


def gather(root: Path, extra: dict[int, Path] | None = None) -> dict[int, dict]:
    """{f: {"gd_loss", "construction", "steps", "trained": [rows by seed]}} from the sweep folders under `root`,
    with the trained rows of `extra` ({f: a `zoo report` results.json}) added."""
    found: dict[int, dict] = {}
    for f, path in (extra or {}).items():
        point = found.setdefault(f, {"trained": []})
        for row in json.loads(path.read_text()):
            if row.get("source") != "trained":  # a constructed row of the same report: the folders give it
                continue
            point.update(gd_loss=row["gd_loss"], steps=row["steps"])
            point["trained"].append(trained_row(row))
    for folder in sorted(root.iterdir()):
        match = re.fullmatch(r"f-(\d+)(-.+)?", folder.name)
        if not match or not (folder / "results.json").is_file():
            continue
        f = int(match.group(1))
        point = found.setdefault(f, {"trained": []})
        for row in json.loads((folder / "results.json").read_text()):
            if row["run"].startswith("gd-ssm-gd-1d"):
                point.update(gd_loss=row["gd_loss"], construction=row["test_loss"])
            else:
                point["steps"] = row["steps"]
                point["trained"].append(trained_row(row))
    for point in found.values():
        point.setdefault("construction", None)
        point["trained"].sort(key=lambda r: r["seed"])
        for row in point["trained"]:
            row["reaches_gd"] = (row["test_loss"] <= REACHES[0] * point["gd_loss"]
                                 and row["sensitivity_cosine"] >= REACHES[1])
    return dict(sorted(found.items()))


def mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{values[0]:.4f}"


def construction(point: dict) -> str:
    return "—" if point["construction"] is None else f"{point['construction']:.4f}"


def table(points: dict[int, dict]) -> str:
    lines = ["| f = N | steps | zero predictor | one GD step (= construction) | trained, per seed: test loss (cosine) | "
             "reach GD | mean ± std, all seeds | mean ± std, those at GD | at GD vs one step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for f, p in points.items():
        at = [r["test_loss"] for r in p["trained"] if r["reaches_gd"]]
        seeds = ", ".join(f"{r['seed']}: " + (f"**{r['test_loss']:.4f}** ({r['sensitivity_cosine']:.4f})" if r["reaches_gd"]
                                               else f"{r['test_loss']:.4f} ({r['sensitivity_cosine']:.2f})")
                          for r in p["trained"])
        gap = f"{100 * (statistics.mean(at) / p['gd_loss'] - 1):+.2f}%" if at else "—"
        lines.append(f"| {f} | {p['steps'] // 1000}k | {f / 6:.3f} | {p['gd_loss']:.4f} ({construction(p)}) | {seeds} | "
                     f"{len(at)} of {len(p['trained'])} | {mean_std([r['test_loss'] for r in p['trained']])} | "
                     f"{mean_std(at)} | {gap} |")
    return "\n".join(lines) + "\n"


def figure(points: dict[int, dict], path: Path, title: str) -> Path:
    from zoo.science.analysis.plots import plt, save

    fig, ax = plt.subplots(figsize=(6, 3.8))
    fs = list(points)
    ax.plot(fs, [f / 6 for f in fs], "k:", label="zero predictor (f/6)")
    ax.plot(fs, [points[f]["gd_loss"] for f in fs], "k--", marker="s", ms=4, label="one GD step = construction")
    for reached, style, label in ((True, "o", "trained seed at GD"), (False, "x", "trained seed off GD")):
        xs = [f for f in fs for r in points[f]["trained"] if r["reaches_gd"] is reached]
        ys = [r["test_loss"] for f in fs for r in points[f]["trained"] if r["reaches_gd"] is reached]
        ax.scatter(xs, ys, marker=style, s=28, label=label, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(fs, [str(f) for f in fs])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("input size f = number of examples N")
    ax.set_ylabel("test loss (½·MSE)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder of the sweep folders f-F")
    parser.add_argument("--out", type=Path, help="write table.md, rows.json and loss-vs-f.png here")
    parser.add_argument("--trained", action="append", default=[], metavar="F=RESULTS",
                        help="trained rows at f = N = F from a `zoo report` results.json (repeatable)")
    parser.add_argument("--title", default="Sushma, Tian et al. Fig. 1.C at N = N_x: 1-D GD-SSM, 5 seeds")
    args = parser.parse_args()
    extra = {int(f): Path(path) for f, path in (item.split("=", 1) for item in args.trained)}
    points = gather(args.root, extra)
    print(table(points), end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(table(points))
        (args.out / "rows.json").write_text(json.dumps(points, indent=1) + "\n")
        print(f"wrote {figure(points, args.out / 'loss-vs-f.png', args.title)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
