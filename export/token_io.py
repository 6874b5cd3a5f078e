"""Token streams in and outputs out, for `zoo stream`: constant memory, one line at a time.

Inputs: a .npy file (T, d_in) or (B, T, d_in), read memory-mapped in chunks; or text, one token
per line, as CSV (`0.1,0.2,…`) or JSON (`[0.1, 0.2, …]`), from a file or stdin (`-`), each line
processed and answered as it arrives. Every malformed line is an error that names its line
number. Non-finite values (NaN, ±inf) are refused by default (`nan="refuse"`) or passed to the
model as they are (`nan="pass"`: the outputs, and the state from then on, are then NaN too).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import numpy as np

CHUNK = 1000  # tokens per push when reading .npy files


class TokenError(ValueError):
    """A token line or file is malformed."""


def is_array_file(source: str) -> bool:
    return source != "-" and Path(source).suffix == ".npy"


def read_tokens(source: str) -> np.ndarray:
    """A whole token file as (B, T, d_in) float32 (for small inputs and tests; `zoo stream` iterates)."""
    if is_array_file(source):
        arr = np.load(source, allow_pickle=False)  # never unpickle
    else:
        with open_text(source) as lines:
            rows = [token for _, token in iter_lines(lines, source, d_in=None, nan="pass")]
        arr = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1) if rows else np.zeros((0, 0), np.float32)
    return as_batch(np.asarray(arr, dtype=np.float32), source)


def as_batch(arr: np.ndarray, source: str) -> np.ndarray:
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise TokenError(f"{source}: tokens must be (T, d_in) or (B, T, d_in), got shape {arr.shape}")
    return arr


def open_text(source: str) -> TextIO:
    if source == "-":
        return _NoClose(sys.stdin)
    try:
        return open(source, encoding="utf-8")
    except OSError as e:
        raise TokenError(f"{source}: cannot read it ({e.strerror})") from None


class _NoClose:
    """stdin in a with-block without closing it."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        return False


def parse_line(line: str, where: str) -> np.ndarray:
    """One token from a JSON list or a CSV row."""
    text = line.strip()
    if text.startswith(("[", "{")) or text.startswith('"'):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise TokenError(f"{where}: not valid JSON ({e.msg})") from None
        except (RecursionError, ValueError) as e:  # absurd nesting, 5000-digit integers
            raise TokenError(f"{where}: not a token ({type(e).__name__})") from None
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            kind = type(value).__name__ if not isinstance(value, list) else "list with non-numbers"
            raise TokenError(f"{where}: expected a JSON list of numbers (one token), got a {kind}")
        return np.asarray(value, dtype=np.float32)
    try:
        return np.asarray([float(v) for v in text.split(",")], dtype=np.float32)
    except ValueError:
        raise TokenError(f"{where}: expected comma-separated numbers or a JSON list, got {text[:60]!r}") from None


def _numbered(lines, source: str):
    number = 0
    try:
        for number, line in enumerate(lines, 1):
            yield number, line
    except UnicodeDecodeError:
        raise TokenError(f"{source}:{number + 1}: not UTF-8 text (a binary file? .npy inputs need the .npy suffix)") from None


def iter_lines(lines, source: str, *, d_in: int | None, nan: str = "refuse") -> Iterator[tuple[int, np.ndarray]]:
    """(line number, token (d_in,)) for every non-empty line, checked as it is read."""
    if nan not in ("refuse", "pass"):
        raise ValueError(f"nan must be 'refuse' or 'pass', got {nan!r}")
    width = d_in
    for number, line in _numbered(lines, source):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        token = parse_line(line, where)
        if width is None:
            width = token.shape[0]
        if token.shape != (width,):
            raise TokenError(f"{where}: a token has {width} values (d_in), this line has {token.shape[0]}")
        if nan == "refuse" and not np.isfinite(token).all():
            raise TokenError(f"{where}: non-finite value (NaN or inf); pass --nan pass to feed it to the model anyway")
        yield number, token


def iter_array_chunks(source: str, *, d_in: int, nan: str = "refuse") -> tuple[tuple[int, int, int], Iterator[np.ndarray]]:
    """(shape (B, T, d_in), chunks (B, ≤CHUNK, d_in)) of a .npy file, memory-mapped: constant memory at any length."""
    try:
        arr = np.load(source, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise TokenError(f"{source}: not a readable .npy array ({e})") from None
    arr = as_batch(arr, source)
    if arr.dtype.kind not in "fiu":
        raise TokenError(f"{source}: tokens must be real numbers, got dtype {arr.dtype}")
    if arr.shape[2] != d_in:
        raise TokenError(f"{source}: tokens have {arr.shape[2]} values, the model takes d_in = {d_in}")

    def chunks():
        for start in range(0, arr.shape[1], CHUNK):
            chunk = np.asarray(arr[:, start : start + CHUNK], dtype=np.float32)
            if nan == "refuse" and not np.isfinite(chunk).all():
                t = start + int(np.argwhere(~np.isfinite(chunk))[0][1])
                raise TokenError(f"{source}: non-finite value at token {t}; pass --nan pass to feed it anyway")
            yield chunk

    return arr.shape, chunks()


class OutputWriter:
    """Outputs as CSV rows (one per step; batch > 1: the streams side by side) on stdout or a file,
    or into a .npy file of known shape."""

    def __init__(self, target: str | None, shape: tuple[int, int, int] | None = None):
        self.target = target
        self.npy = None
        self.t = 0
        if target and Path(target).suffix == ".npy":
            if shape is None:
                raise TokenError(f"{target}: .npy output needs a .npy input (its length must be known up front)")
            self.npy = np.lib.format.open_memmap(target, mode="w+", dtype=np.float32, shape=shape)
            self.out = None
        else:
            self.out = open(target, "w") if target else sys.stdout

    def write(self, values: np.ndarray, *, flush: bool = False) -> None:
        """values (B, T, k)."""
        if self.npy is not None:
            self.npy[:, self.t : self.t + values.shape[1]] = values
        else:
            rows = values.transpose(1, 0, 2).reshape(values.shape[1], -1)
            np.savetxt(self.out, rows, delimiter=",", fmt="%.8g")
            if flush:
                self.out.flush()
        self.t += values.shape[1]

    def close(self) -> None:
        if self.npy is not None:
            self.npy.flush()
        elif self.target:
            self.out.close()
        else:
            self.out.flush()


def write_outputs(values: np.ndarray, target: str | None) -> None:
    """(B, T, k) outputs at once to .npy or CSV."""
    writer = OutputWriter(target, tuple(values.shape))
    writer.write(values)
    writer.close()
