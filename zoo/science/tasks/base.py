"""What every task kind declares. A task kind is one file of zoo/science/tasks/ holding a frozen dataclass that
subclasses `Task` and sets `kind`: the package finds it (`TASK_KINDS`), the registry derives its `[tasks.NAME]`
schema from its dataclass fields, and generic code asks it these questions instead of checking its class.

    kind                    the registry's `kind = "..."` of its tasks
    has_gd_reference        GD steps and least squares are defined on it (the regression baselines)
    teacher_weights()       a teacher's weights the student is compared with, or None
    predicts_every_position the model predicts at every position (else at the query only)
    prediction_dim          channels of one prediction

Besides these, a task samples batches (`sample`), turns a frozen row into tokens (`batch_from_arrays`), states
its token layout (`token_layout`), its read-out (`readout`) and its loss (`loss`).
"""

from __future__ import annotations

from typing import ClassVar


class Task:
    kind: ClassVar[str]  # the registry's task kind
    has_gd_reference: ClassVar[bool] = False  # GD and least squares are defined on it (zoo.science.evaluation)

    def teacher_weights(self, dtype=None) -> dict | None:
        """The teacher's weights a student is compared with (teacher–student tasks); None: no teacher."""
        return None

    @property
    def predicts_every_position(self) -> bool:
        raise NotImplementedError

    @property
    def prediction_dim(self) -> int:
        raise NotImplementedError
