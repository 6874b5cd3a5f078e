"""Task kinds, one file each (a `Task` subclass with its `kind`: zoo/science/tasks/base.py), found here like the
model families; frozen.py holds the frozen, content-hashed splits of any task."""

from __future__ import annotations

import importlib
import pkgutil

from zoo.science.tasks.base import Task


def _discover() -> dict[str, type[Task]]:
    """kind → the Task subclass of each module of this package that declares one."""
    kinds: dict[str, type[Task]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Task) and value.__module__ == module.__name__ \
                    and "kind" in vars(value):
                if kinds.setdefault(value.kind, value) is not value:
                    raise ImportError(f"two task classes claim the task kind {value.kind!r}")
    return kinds


TASK_KINDS: dict[str, type[Task]] = _discover()

__all__ = ["TASK_KINDS", "Task"]
