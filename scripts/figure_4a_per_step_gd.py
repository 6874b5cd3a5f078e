"""Sushma, Tian et al. Figure 4.A against the strongest multi-step GD: released checkpoints beside k GD steps
with a rate each (fitted on the validation split) and k steps sharing one rate, on the frozen test split.

Each layer of the paper's multi-step construction (A.2) has its own step size, so a k-layer GD-SSM can express
k GD steps with a rate each; the open benchmark's references (zoo/publishing/benchmark.py: `per_step_etas`,
`best_eta`) give both. Every difference is paired task by task on the same test tasks, with its standard error.

    python scripts/figure_4a_per_step_gd.py [--steps 2] [--out FILE.json] [ENTRY ...]
    (default: gd-ssm-nd-2layer gd-ssm-nd-2layer-gd-init gd-ssm-gd-nd-2step)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import zoo
from zoo.publishing.benchmark import (
    PER_STEP_KEY,
    gd_predict_per_step,
    load_frozen,
    mean_se,
    per_task_loss,
    split_references,
)
from zoo.science.tasks.regression import gd_predict

ENTRIES = ["gd-ssm-nd-2layer", "gd-ssm-nd-2layer-gd-init", "gd-ssm-gd-nd-2step"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entries", nargs="*", default=ENTRIES)
    parser.add_argument("--steps", type=int, default=2, choices=(2, 3))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    task_name = zoo.load(args.entries[0]).entry.task
    _, task, test = load_frozen(task_name, "test")
    refs = split_references(task, test)
    b64, target = refs.b64, refs.b64.query_targets
    per_step = next(k for k in refs.metrics[PER_STEP_KEY] if k["steps"] == args.steps)
    shared = next(k for k in refs.metrics["gd_k_steps"] if k["steps"] == args.steps)
    reference = per_task_loss(gd_predict_per_step(b64, per_step["etas"]), target)
    shared_losses = per_task_loss(gd_predict(b64, shared["eta"], args.steps), target)
    rows = {}
    for name in args.entries:
        ckpt = zoo.load(name)
        if ckpt.entry.task != task_name:
            raise SystemExit(f"{name} is on {ckpt.entry.task}, not {task_name}")
        model = ckpt.model.eval()
        with torch.no_grad():
            pred = model.predict_query(test.batch(task).tokens.to(next(model.parameters()).dtype)).double()
        losses = per_task_loss(pred, target)
        rows[name] = {"test_loss": mean_se(losses)[0],
                      "vs_per_step": dict(zip(("diff", "se"), mean_se(losses - reference))),
                      "vs_shared": dict(zip(("diff", "se"), mean_se(losses - shared_losses)))}
    result = {"task": task_name, "split": test.name, "split_sha256": test.sha256, "steps": args.steps,
              "per_step": {"etas": per_step["etas"], "tuned_on": per_step["tuned_on"], "loss": per_step["loss"]},
              "shared": {"eta": shared["eta"], "loss": shared["loss"]}, "models": rows}
    print(f"{args.steps} GD steps, a rate each (η = {', '.join(f'{e:.4g}' for e in per_step['etas'])}, fitted on "
          f"{per_step['tuned_on']}): {per_step['loss']:.4f};  sharing one rate (η = {shared['eta']:.4g}): "
          f"{shared['loss']:.4f}")
    for name, row in rows.items():
        d, s = row["vs_per_step"]["diff"] / per_step["loss"], row["vs_per_step"]["se"] / per_step["loss"]
        print(f"  {name}: {row['test_loss']:.4f}  vs a rate each {100 * d:+.2f}% ± {100 * s:.2f}%  "
              f"vs one rate {100 * row['vs_shared']['diff'] / shared['loss']:+.1f}%")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
