"""Blogpost Figure 7's context axis at the blogpost's sizes: the zoo's softmax transformers of 1–5 layers
(D = 5), each trained and tested at its own context size C, beside the blogpost's plotted values and bands
(reports/blogpost-2024/plotted-values.json) and one GD step at the same C.

    python scripts/figure_7_context.py runs/figure-7-depth-context-c2/*/ runs/figure-7-depth-context-c50/*/ \
        --c10 reports/blogpost-2024/generated/figure-7/blogpost-size-h100/results.json \
        --json reports/blogpost-2024/generated/figure-7/depth-context-h200/results.json \
        --plot reports/blogpost-2024/generated/figure-7/depth-context-h200/context.png

Each run folder is loaded with `zoo.load` (checked against its own manifest) and re-scored here on its task's
frozen test split (a C variant's split is built from linreg-d5-c10's seeds and its hash recorded), as
`zoo eval FOLDER` scores it. `--c10` adds C = 10 from Figure 7's depth run (its recorded test losses: seeds 0–2
of 1–4 layers, and the released 5-layer seed).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import shlex
import statistics
import sys
from pathlib import Path

import zoo
from zoo.cli.evaluate import register_variant_task
from zoo.science.analysis.plots import plt, save
from zoo.science.evaluation import rescore
from zoo.science.tasks.frozen import load_split

PLOTTED = Path(__file__).resolve().parents[1] / "reports/blogpost-2024/plotted-values.json"
BASE_TASK = "linreg-d5-c10"  # the blogpost's plotted D = 5; a C variant is named linreg-d5-c10--n_context=C
RUN_NAME = re.compile(r"softmax-tf-([1-5])l-d5-c10(?:--seed(\d+))?")  # Figure 7's depth run: a sweep run or an entry


def score(folder: Path) -> dict:
    try:
        ckpt = zoo.load(str(folder))
    except Exception as e:  # a folder that is not a checkpoint, or fails its manifest: one line, no traceback
        raise SystemExit(f"{folder}: not a loadable checkpoint: {e}") from None
    task = ckpt.entry.task
    variant = task == BASE_TASK or task.startswith(BASE_TASK + "--n_context=")
    if not variant or ckpt.entry.arch.n_layers not in range(1, 6):
        raise SystemExit(f"{folder}: a {ckpt.entry.arch.n_layers}-layer model on {task}, not Figure 7's 1-5 layers on "
                         f"{BASE_TASK} or one of its C variants")
    spec = register_variant_task(ckpt)  # a C variant carries its task spec
    split = load_split(task, "test", spec=spec)
    metrics = rescore(ckpt, split)
    prov = ckpt.provenance
    return {"run": folder.name, "layers": ckpt.entry.arch.n_layers, "n_context": spec.n_context,
            "seed": prov["seed"], "steps": prov["steps"], "recipe_steps": ckpt.entry.source.steps,
            "test_loss": metrics["test_loss"], "gd_loss": metrics["gd_loss"], "lstsq_loss": metrics["lstsq_loss"],
            "recorded_test_loss": ckpt.metrics.get("test_loss"), "dataset_sha256": split.sha256,
            "commit": prov["git_commit"], "device_name": prov.get("device_name"), "trust": ckpt.trust}


def c10_rows(path: Path) -> list[dict]:
    """C = 10 from Figure 7's depth run: its recorded test losses (seeds 0–2 of 1–4 layers; 5 layers: the
    released seed), not re-scored here."""
    rows = []
    try:
        results = json.loads(path.read_text())
        for where, runs in (("sweep", results["runs"]), ("released", results["released"])):
            for name, r in runs.items():
                layers, seed = RUN_NAME.fullmatch(name).groups()
                layers, seed = int(layers), int(seed) if seed is not None else r["seed"]
                if where == "released" and any(x["layers"] == layers for x in rows):
                    continue  # the sweep's seeds of this depth are there already
                rows.append({"run": name, "layers": layers, "n_context": 10, "seed": seed, "steps": r["steps"],
                             "test_loss": float(r["test_loss"]), "gd_loss": float(r["gd_loss"]),
                             "source": f"{path}" + (" (released)" if where == "released" else "")})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # AttributeError: a name RUN_NAME refuses
        raise SystemExit(f"{path}: not Figure 7's depth results.json ({type(e).__name__}: {e})") from None
    return rows


@functools.cache
def plotted_curve(layers: int) -> dict:
    """The blogpost's plotted Figure 7 curve of a depth (its points and band), read once per run of the script."""
    curves = json.loads(PLOTTED.read_text())["figures"]["figure-7"]["curves"]
    curve = next((k for k in curves if k["setting"]["layers"] == layers), None)
    if curve is None:
        raise SystemExit(f"the blogpost plots 1-5 layers, not {layers}")
    return curve


def plotted_at(layers: int, c: int) -> dict | None:
    curve = plotted_curve(layers)
    value = dict((int(x), y) for x, y in curve["points"]).get(c)
    band = next(([lo, hi] for x, lo, hi in curve["band_points"] if int(x) == c), None)
    return None if value is None else {"value": value, "band": band}


def summarise(rows: list[dict]) -> dict:
    seen = [(r["layers"], r["n_context"], r["seed"]) for r in rows]
    if len(set(seen)) != len(seen):
        raise SystemExit(f"a run given twice (layers, C, seed): {sorted({k for k in seen if seen.count(k) > 1})}")
    out = {}
    for layers, c in sorted({(r["layers"], r["n_context"]) for r in rows}):
        group = sorted((r for r in rows if (r["layers"], r["n_context"]) == (layers, c)), key=lambda r: r["seed"])
        losses = [r["test_loss"] for r in group]
        out[f"{layers} layers, C = {c}"] = {
            "layers": layers, "n_context": c, "seeds": [r["seed"] for r in group], "test_losses": losses,
            "mean": statistics.fmean(losses), "std": statistics.stdev(losses) if len(losses) > 1 else None,
            "gd_loss": group[0]["gd_loss"], "blogpost_plotted": plotted_at(layers, c)}
    return out


def plot(summary: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.2, 4.2))
    contexts = sorted({s["n_context"] for s in summary.values()})
    for layers in sorted({s["layers"] for s in summary.values()}):
        color = f"C{layers - 1}"
        mine = [s for s in summary.values() if s["layers"] == layers]
        ax.errorbar([s["n_context"] for s in mine], [s["mean"] for s in mine], yerr=[s["std"] or 0 for s in mine],
                    marker="o", color=color, capsize=3, label=f"zoo, {layers} layer{'s' * (layers > 1)}")
        points = plotted_curve(layers)["points"]
        ax.plot([x for x, _ in points], [y for _, y in points], color=color, ls=":", lw=1)
    gd = {s["n_context"]: s["gd_loss"] for s in summary.values()}
    ax.plot(contexts, [gd[c] for c in contexts], "k--", lw=1, label="one GD step (zoo's frozen test splits)")
    ax.plot([], [], color="grey", ls=":", lw=1, label="blogpost, plotted (C = 2 … 98)")
    ax.set(yscale="log", xlabel="context size C (trained and tested at C)", ylabel="test loss (D = 5)",
           title="Blogpost Fig. 7: softmax transformers by C and depth")
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="sweep run folders (checkpoints)")
    parser.add_argument("--c10", type=Path, help="Figure 7's depth results.json (C = 10)")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--plot", type=Path, required=True)
    args = parser.parse_args()
    rows = [score(f) for f in dict.fromkeys(f.resolve() for f in args.runs)]  # a folder named twice counts once
    for r in rows:
        recorded = r["recorded_test_loss"]
        recorded = f"{recorded:.6g}" if isinstance(recorded, float) and math.isfinite(recorded) else "—"
        print(f"{r['run']}: {r['steps']:,} steps, test loss {r['test_loss']:.6g} (recorded {recorded}), "
              f"GD {r['gd_loss']:.6g}")
    if args.c10:
        rows += c10_rows(args.c10)
    summary = summarise(rows)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "scripts/figure_7_context.py", *sys.argv[1:]])  # as run, to run again
    args.json.write_text(json.dumps({"source": command, "runs": rows, "summary": summary}, indent=1) + "\n")
    print("| layers | C | seeds | test loss per seed | mean ± std | blogpost plotted (band) | one GD step |\n"
          "|---|---|---|---|---|---|---|")
    for s in summary.values():
        p = s["blogpost_plotted"]
        spread = f"{s['mean']:.4g} ± {s['std']:.2g}" if s["std"] is not None else f"{s['mean']:.4g}"
        band = f"{p['value']:.3g} ({p['band'][0]:.3g}–{p['band'][1]:.3g})" if p else "—"
        per_seed = " / ".join(f"{x:.4g}" for x in s["test_losses"])
        print(f"| {s['layers']} | {s['n_context']} | {len(s['seeds'])} | {per_seed} | {spread} | {band} | {s['gd_loss']:.4g} |")
    print(f"wrote {args.json}, {plot(summary, args.plot)}")


if __name__ == "__main__":
    main()
