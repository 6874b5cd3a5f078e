"""How precisely a frozen test split measures a released entry's loss: the standard error of its
test loss over the split's tasks, and of its difference to one GD step on the same tasks (paired).

The registry's `expected.test_loss` tolerances, where a paper gives no spread, are about two of the
split's standard errors (zoo/science/entries/*.toml); the papers do not state their test sets' sizes, so
their own error is not added. The paired difference to GD on the same tasks is far more precise.

    python scripts/test_loss_sampling_error.py [ENTRY ...]   (default: every entry with an expected test loss)
"""

from __future__ import annotations

import sys

import torch

import zoo
from zoo.science.evaluation import gd_reference
from zoo.science.registry import default_registry, get_task_spec
from zoo.science.tasks.frozen import load_split
from zoo.science.tasks.regression import LinearRegressionTask, gd_predict


def per_task_losses(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(model, the GD the entry is scored against): each task's ½·mean squared error, float64."""
    ckpt = zoo.load(name)
    task = ckpt.task
    batch = load_split(ckpt.entry.task, "test", spec=get_task_spec(ckpt.entry.task)).batch(task)
    with torch.no_grad():
        pred = ckpt.model.eval().predict_query(batch.tokens.to(next(ckpt.model.parameters()).dtype)).double()
    b64 = task.batch_from_arrays(batch.x.double(), batch.y.double())
    reference = gd_reference(ckpt.entry, task, ckpt.construction, recorded=ckpt.metrics)  # as rescore scores it
    gd = gd_predict(b64, reference["eta"], reference["gd_steps"], reference["ridge"])
    target = b64.query_targets
    return 0.5 * ((pred - target) ** 2).flatten(1).mean(1), 0.5 * ((gd - target) ** 2).flatten(1).mean(1)


def main(names: list[str]) -> None:
    registry = default_registry()
    names = names or sorted(n for n, e in registry.entries.items() if "test_loss" in e.expected)
    print(f"{'entry':36s} {'tasks':>6s} {'test loss':>10s} {'± s.e.':>9s} {'(rel)':>7s} {'GD loss':>10s} "
          f"{'model − GD':>11s} {'± s.e.':>9s}")
    for name in names:
        entry = registry.entries[name]
        if not isinstance(get_task_spec(entry.task).build(), LinearRegressionTask):
            print(f"{name:36s} (not a regression task: skipped)")
            continue
        model, gd = per_task_losses(name)
        n = model.numel()
        se, diff = model.std().item() / n**0.5, model - gd
        print(f"{name:36s} {n:6d} {model.mean().item():10.5f} {se:9.5f} {100 * se / model.mean().item():6.2f}% "
              f"{gd.mean().item():10.5f} {diff.mean().item():+11.6f} {diff.std().item() / n**0.5:9.6f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1:])
