"""Reading token streams (.npy, CSV, JSON lines) and writing outputs, for `zoo stream`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def read_tokens(source: str) -> np.ndarray:
    """Tokens as (B, T, d_in) float32 from a .npy file, a CSV file (one token per row) or JSON
    lines (one token per line, a list of d_in numbers; '-' reads stdin)."""
    if source != "-" and Path(source).suffix == ".npy":
        arr = np.load(source, allow_pickle=False)  # never unpickle
    elif source != "-" and Path(source).suffix == ".csv":
        arr = np.loadtxt(source, delimiter=",", dtype=np.float32, ndmin=2)
    else:
        lines = (sys.stdin if source == "-" else open(source)).read().splitlines()
        try:
            arr = np.asarray([json.loads(line) for line in lines if line.strip()], dtype=np.float32)
        except (json.JSONDecodeError, ValueError) as e:
            raise ValueError(f"{source}: expected JSON lines, one token (a list of numbers) per line: {e}") from None
    arr = np.asarray(arr, dtype=np.float32)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise ValueError(f"{source}: tokens must be (T, d_in) or (B, T, d_in), got shape {arr.shape}")
    return arr


def write_outputs(values: np.ndarray, target: str | None) -> None:
    """(B, T, k) outputs to .npy, or CSV (batch 1: one row per step) on stdout / a file."""
    if target and Path(target).suffix == ".npy":
        np.save(target, values)
        return
    rows = values.reshape(-1, values.shape[-1]) if values.shape[0] == 1 else values.transpose(1, 0, 2).reshape(values.shape[1], -1)
    out = open(target, "w") if target else sys.stdout
    np.savetxt(out, rows, delimiter=",", fmt="%.8g")
    if target:
        out.close()
