"""Score checkpoints on their task's frozen test split and on its validation split (for zucchet-icl
the shifted W* ~ N(0, 2/3), what Zucchet et al.'s Figures 4–5 report), beside one GD step on each:
the rows of reports/zucchet-2023/figure-4b.md and figure-5.md.

    python scripts/released_on_both_splits.py lstm-zucchet-icl gru-zucchet-icl ... --json rows.json
    python scripts/released_on_both_splits.py runs/figure-5-sizes-out/* --json rows.json

A bare name loads from the shipped release, verified against release/index.json; a folder (a sweep
run's checkpoint) is checked against its own manifest (`zoo.load`; `trust` in the rows says which).
Each is scored as `zoo eval <entry> --split test|validation` scores it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import zoo
from zoo.science.evaluation import rescore
from zoo.science.registry import default_registry
from zoo.science.tasks.frozen import load_split


def row(name: str) -> dict:
    ckpt = zoo.load(name)
    spec = default_registry().tasks[ckpt.entry.task]
    test = rescore(ckpt, load_split(ckpt.entry.task, "test", spec=spec))
    val = rescore(ckpt, load_split(ckpt.entry.task, "validation", spec=spec))
    return {"entry": name, "trust": ckpt.trust, "width": ckpt.entry.arch.width,
            "parameters": sum(p.numel() for p in ckpt.model.parameters()), "steps": ckpt.provenance.get("steps") if ckpt.entry.source.kind == "trained" else None,
            "commit": ckpt.provenance.get("git_commit"), "test_loss": test["test_loss"], "test_gd": test.get("gd_loss"),
            "val_loss": val["test_loss"], "val_gd": val.get("gd_loss"), "val_lstsq": val.get("lstsq_loss"),
            "val_cos": val.get("sensitivity_cosine")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entries", nargs="+")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = sorted((row(name) for name in args.entries), key=lambda r: r["val_loss"])
    print("| entry | parameters | steps | test loss | one GD step | validation loss | one GD step | sensitivity cosine (validation) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        steps = "constructed" if r["steps"] is None else f"{r['steps']:,}"
        print(f"| `{r['entry']}` | {r['parameters']:,} | {steps} | {r['test_loss']:.4g} | {r['test_gd']:.4g} | **{r['val_loss']:.4g}** | "
              f"{r['val_gd']:.4g} | {r['val_cos']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
