"""Names that become path components (task names, cache folders, released files), validated before
they touch a path, and the zoo's cache folder. Standard library only, so every layer, the torch-free
ones included, can use it."""

from __future__ import annotations

import os
import re
from pathlib import Path

SAFE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.=-]{0,199}$")


def safe_name(name: str, what: str = "task name") -> str:
    """A name that may become a path component: lowercase letters, digits and - _ . =, no '..'.
    Task names come from registry files, sweep overrides and downloaded config.json files alike."""
    if not isinstance(name, str) or not SAFE_NAME.match(name) or ".." in name:
        raise ValueError(f"{what} {name!r} is not a safe name (lowercase letters, digits, '-', '_', '.', '='; "
                         "no '/', no '..'); refusing to use it as a path")
    return name


def cache_dir() -> Path:
    """icl-zoo's cache: frozen splits, the default local hub ($ICL_ZOO_CACHE, else ~/.cache/icl-zoo)."""
    root = os.environ.get("ICL_ZOO_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "icl-zoo"
    return Path(root)
