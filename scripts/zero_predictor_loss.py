"""The zero predictor's loss (ŷ = 0 at the query) on a regression task's frozen split: the level a model
that learned nothing in context sits at (e.g. S5 and the one-layer linear transformer on Sushma Figure 6's
interleaved tokens, reports/sushma-tian-2024/figure-6.md). Mean ± standard error over the split's tasks of
½·(mean over outputs of y_q²), the zoo's test loss with the prediction set to 0.

    python scripts/zero_predictor_loss.py TASK [TASK ...] [--split test]
"""

from __future__ import annotations

import argparse

from zoo.science.registry import RegistryError, get_task_spec
from zoo.science.tasks.frozen import load_split
from zoo.science.tasks.regression import LinearRegressionTask


def zero_predictor_loss(task_name: str, split: str = "test") -> tuple[float, float, int]:
    """(mean, standard error, tasks) of the zero predictor's loss on the frozen split, float64."""
    spec = get_task_spec(task_name)
    task = spec.build()
    if not isinstance(task, LinearRegressionTask):
        raise RegistryError(f"task {task_name!r} is not a regression task: it has no query to predict")
    batch = load_split(task_name, split, spec=spec).batch(task)
    per_task = 0.5 * (batch.query_targets.double() ** 2).mean(-1)  # (tasks,)
    return per_task.mean().item(), (per_task.std() / len(per_task) ** 0.5).item(), len(per_task)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", nargs="+", help="regression task names (`zoo list` shows them)")
    parser.add_argument("--split", default="test", choices=["test", "validation"])
    args = parser.parse_args()
    for name in args.tasks:
        try:
            mean, se, n = zero_predictor_loss(name, args.split)
        except RegistryError as err:
            parser.error(str(err))
        print(f"{name} ({args.split}, {n:,} tasks): zero predictor {mean:.6f} ± {se:.6f}")
