"""Token streams in and outputs out, for `zoo stream`: constant memory, one line at a time.

Inputs: a .npy file (T, d_in) or (B, T, d_in), read memory-mapped in chunks; or text, one token
per line, as CSV (`0.1,0.2,…`) or JSON (`[0.1, 0.2, …]`), from a file or stdin (`-`), each line
processed and answered as it arrives. Every malformed line is an error that names its line
number. Non-finite values (NaN, ±inf) are refused by default (`nan="refuse"`) or passed to the
model as they are (`nan="pass"`: the outputs, and the state from then on, are then NaN too).
A text line longer than a token of d_in numbers can take is refused before it is read whole.

Outputs: CSV rows on stdout as they are computed, or a .npy / CSV file written beside its target
and renamed onto it only when the stream ends well (a failed or interrupted run leaves no file,
and an existing one as it was). A .npy output's blocks are allocated before it is memory-mapped: a
full disk is a one-line error naming the file, never a SIGBUS. A saved state (.npz) is checked
against the graph's state names and shapes from its headers before any array is read, and its values
are refused when non-finite, as tokens are (`nan="pass"` restores them as they are).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import sys
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import numpy as np

NPY_PUSH_TOKENS = 1 << 16  # most tokens per stream per push when reading .npy files (the session cuts them into its own runs)
NPY_PUSH_VALUES = 1 << 20  # most values per push from a .npy file (4 MiB of float32): many streams get fewer tokens
# A text token is d_in numbers; no number needs more than MAX_VALUE_CHARS characters ("-1.2345678901234567e-308"
# takes 24), so a line longer than max_line_chars(d_in) is refused before the rest of it is read.
MAX_VALUE_CHARS = 64
LINE_SLACK = 64  # brackets, surrounding whitespace and the line end
UNKNOWN_WIDTH_LINE = 1 << 20  # the longest line while the width is not yet known (read_tokens' first line)
STATE_MEMBER_SLACK = 1 << 14  # a saved state's member: its .npy header (numpy caps it at 10,000 bytes) and zip entry


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


def max_line_chars(d_in: int) -> int:
    """The longest text line a token of d_in numbers may take: each number at most MAX_VALUE_CHARS
    characters with a separator and a space after it, plus LINE_SLACK."""
    return d_in * (MAX_VALUE_CHARS + 2) + LINE_SLACK


def _line_limit(d_in: int | None) -> list:
    """[most characters of a line, why]."""
    if d_in is None:
        return [UNKNOWN_WIDTH_LINE, "the most read before the token width is known"]
    return [max_line_chars(d_in), f"the most a token of {d_in} numbers takes (at most {MAX_VALUE_CHARS} characters each)"]


def _numbered(lines, source: str, limit: list):
    """(line number, line) with each line read up to limit[0] characters: a longer one is refused
    without reading the rest of it into memory (the limit may tighten as the width becomes known)."""
    readline = getattr(lines, "readline", None)
    if readline is None:  # a plain iterable of strings: already in memory
        rest = iter(lines)
        readline = lambda _limit: next(rest, "")
    number = 0
    try:
        while True:
            line = readline(limit[0] + 1)
            if not line:
                return
            number += 1
            if len(line) > limit[0] and line[-1] != "\n":
                raise TokenError(f"{source}:{number}: line longer than {limit[0]} characters, {limit[1]}; refusing it")
            yield number, line
    except UnicodeDecodeError:
        raise TokenError(f"{source}:{number + 1}: not UTF-8 text (a binary file? .npy inputs need the .npy suffix)") from None


def iter_lines(lines, source: str, *, d_in: int | None, nan: str = "refuse") -> Iterator[tuple[int, np.ndarray]]:
    """(line number, token (d_in,)) for every non-empty line, checked as it is read; a line longer
    than a token of d_in numbers can take (max_line_chars) is refused before it is read whole."""
    if nan not in ("refuse", "pass"):
        raise ValueError(f"nan must be 'refuse' or 'pass', got {nan!r}")
    width = d_in
    limit = _line_limit(d_in)
    for number, line in _numbered(lines, source, limit):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        token = parse_line(line, where)
        if width is None:
            width = token.shape[0]
            limit[:] = _line_limit(width)
        if token.shape != (width,):
            raise TokenError(f"{where}: a token has {width} values (d_in), this line has {token.shape[0]}")
        if nan == "refuse" and not np.isfinite(token).all():
            raise TokenError(f"{where}: non-finite value (NaN or inf); pass --nan pass to feed it to the model anyway")
        yield number, token


def iter_array_chunks(source: str, *, d_in: int, nan: str = "refuse") -> tuple[tuple[int, int, int], Iterator[np.ndarray]]:
    """(shape (B, T, d_in), chunks (B, ≤NPY_PUSH_TOKENS, d_in)) of a .npy file, memory-mapped: constant memory at any length.
    Each chunk is a view of one float32 buffer refilled for the next: use it (or copy it) before
    asking for the next one."""
    try:
        arr = np.load(source, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise TokenError(f"{source}: not a readable .npy array ({e})") from None
    arr = as_batch(arr, source)
    if arr.dtype.kind not in "fiu":
        raise TokenError(f"{source}: tokens must be real numbers, got dtype {arr.dtype}")
    if arr.shape[2] != d_in:
        raise TokenError(f"{source}: tokens have {arr.shape[2]} values, the model takes d_in = {d_in}")

    step = max(1, min(NPY_PUSH_TOKENS, NPY_PUSH_VALUES // max(1, arr.shape[0] * d_in)))  # many streams: fewer tokens per push

    def chunks():
        buffer = np.empty((arr.shape[0], step, d_in), np.float32)  # one buffer, refilled: no allocation per push
        for start in range(0, arr.shape[1], step):
            n = min(step, arr.shape[1] - start)
            chunk = buffer[:, :n]
            chunk[...] = arr[:, start : start + n]  # read (and cast) from the memory map into the buffer
            if nan == "refuse" and not np.isfinite(chunk).all():
                t = start + int(np.argwhere(~np.isfinite(chunk))[0][1])
                raise TokenError(f"{source}: non-finite value at token {t}; pass --nan pass to feed it anyway")
            yield chunk

    return arr.shape, chunks()


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_error(target, e: OSError) -> TokenError:
    """An OSError while writing `target`, said in one line that names it (a full disk, a quota, a read-only
    file system)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return TokenError(f"{target}: no space left on its disk to write it ({e.strerror}); nothing was written")
    return TokenError(f"{target}: cannot write it ({e.strerror or e})")


def _allocated_npy(path: Path, shape: tuple[int, ...], target) -> np.memmap:
    """A float32 .npy of `shape` at `path` (an empty file), its blocks allocated on the disk before it is
    memory-mapped: writing into a map whose page finds no space is a SIGBUS that kills the process (no
    except, no finally: the .part file stays); an allocation that finds none is an OSError, said here."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False,
              "shape": tuple(int(d) for d in shape)}
    try:
        with open(path, "r+b") as f:
            np.lib.format.write_array_header_1_0(f, header)
            size = f.tell() + int(np.prod(shape, dtype=np.int64)) * 4
            f.flush()
            _allocate(f.fileno(), size)
        return np.lib.format.open_memmap(path, mode="r+")
    except OSError as e:
        raise write_error(target, e) from None


def _allocate(fd: int, size: int) -> None:
    """Reserve `size` bytes of disk for `fd` (posix_fallocate; where a file system cannot, zeros written)."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
    zeros = bytes(1 << 20)
    offset = os.lseek(fd, 0, os.SEEK_END)
    while offset < size:
        offset += os.pwrite(fd, zeros[: min(len(zeros), size - offset)], offset)


class PendingFile:
    """A file written under a temporary name beside `target` (symlinks followed, as open() would) and
    renamed onto it by commit(): the target holds its old contents or the whole new file, never a
    part; discard() removes the temporary file. A target that exists and is not a regular file (a
    pipe, a terminal, /dev/null) is written directly (`direct`): there is nothing to rename there."""

    def __init__(self, target: str | Path):
        try:
            mode = os.stat(target).st_mode  # through symlinks: /dev/stdout, a link to a file
        except OSError:
            mode = None
        if mode is not None and stat.S_ISDIR(mode):
            raise TokenError(f"{target}: is a folder, not a file to write")
        self.direct = mode is not None and not stat.S_ISREG(mode)
        if self.direct:
            self.path = self.target = Path(target)
            return
        self.target = Path(os.path.realpath(target))
        try:
            mode = stat.S_IMODE(self.target.stat().st_mode) if self.target.exists() else _default_mode()
            fd, name = tempfile.mkstemp(dir=self.target.parent, prefix=f".{self.target.name[:64]}.", suffix=".part")
        except OSError as e:
            raise TokenError(f"{target}: cannot write it ({e.strerror})") from None
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        self.path = Path(name)

    def commit(self) -> None:
        if not self.direct:
            os.replace(self.path, self.target)

    def discard(self) -> None:
        if not self.direct:
            self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def signals_unwind():
    """SIGTERM and SIGHUP raise SystemExit(128 + signal) while the block runs, so that `finally` and
    `except` clauses (a PendingFile's discard) run instead of the process dying where it stands."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum, frame):
        raise SystemExit(128 + signum)

    signals = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    previous = {sig: signal.signal(sig, unwind) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class OutputWriter:
    """Outputs as CSV rows (one per step; batch > 1: the streams side by side) on stdout or a file,
    or into a .npy file of known shape. A file is written beside its target and renamed onto it by
    close(); abort() removes it, leaving an existing target untouched (see PendingFile)."""

    def __init__(self, target: str | None, shape: tuple[int, int, int] | None = None):
        self.target = target
        self.npy = None
        self.out = None
        self.pending = None
        self.t = 0
        if target and Path(target).suffix == ".npy":
            if shape is None:
                raise TokenError(f"{target}: .npy output needs a .npy input (its length must be known up front)")
            self.pending = PendingFile(target)
            if self.pending.direct:
                raise TokenError(f"{target}: .npy output must go to a regular file")
            try:
                self.npy = _allocated_npy(self.pending.path, shape, target)
            except BaseException:
                self.pending.discard()
                raise
        elif target:
            self.pending = PendingFile(target)
            try:
                self.out = open(self.pending.path, "w")  # noqa: SIM115 - open until close() or abort()
            except OSError as e:
                self.pending.discard()
                raise write_error(target, e) from None
            except BaseException:
                self.pending.discard()
                raise
        else:
            self.out = sys.stdout
        self.live = self.pending is None or self.pending.direct  # a reader sees each row as it is written

    def write(self, values: np.ndarray, *, flush: bool = False) -> None:
        """values (B, T, k)."""
        if self.pending is None or self.pending.direct:
            self._write(values, flush=flush)
            return
        try:
            self._write(values, flush=flush)
        except OSError as e:  # a full disk: one line naming the file
            raise write_error(self.target, e) from None

    def _write(self, values: np.ndarray, *, flush: bool) -> None:
        if self.npy is not None:
            self.npy[:, self.t : self.t + values.shape[1]] = values
        else:
            rows = values.transpose(1, 0, 2).reshape(values.shape[1], -1)
            np.savetxt(self.out, rows, delimiter=",", fmt="%.8g")
            if flush and self.live:
                self.out.flush()
        self.t += values.shape[1]

    def close(self) -> None:
        """Finish the output: a file is renamed onto its target only now."""
        try:
            self._close()
        except OSError as e:
            if self.pending is None or self.pending.direct:
                raise
            raise write_error(self.target, e) from None

    def _close(self) -> None:
        if self.npy is not None:
            self.npy.flush()
            self.npy = None
        elif self.pending is not None:
            self.out.close()
        else:
            self.out.flush()
        if self.pending is not None:
            self.pending.commit()

    def abort(self) -> None:
        """Stop without a result: the temporary file is removed, an existing target left as it was."""
        self.npy = None
        try:
            if self.pending is not None:
                if self.out is not None:
                    self.out.close()
            elif self.out is not None:
                self.out.flush()
        except OSError:  # a closed pipe: nothing more to say to it
            pass
        finally:
            if self.pending is not None:
                self.pending.discard()


def read_state(path: str, expected: dict[str, tuple[int, ...]], *, nan: str = "refuse") -> dict[str, np.ndarray]:
    """A state saved by `zoo stream --state-out` (.npz), checked against the graph's state names and
    shapes (`expected`) from the zip directory and each member's .npy header before any array is
    read: a file that does not fit is refused at the cost of its headers, and one that fits costs
    the state's own size. Members are real-number arrays (never pickles, never object dtypes).
    Non-finite values (NaN, ±inf) are refused as non-finite tokens are (`nan="refuse"`), or restored
    as they are (`nan="pass"`)."""
    if nan not in ("refuse", "pass"):
        raise ValueError(f"nan must be 'refuse' or 'pass', got {nan!r}")
    try:
        info = os.stat(path)
    except OSError as e:
        raise TokenError(f"{path}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise TokenError(f"{path}: not a regular file; --state-in takes the .npz that --state-out wrote")
    budget = {name: int(np.prod(shape, dtype=object)) * 8 + STATE_MEMBER_SLACK for name, shape in expected.items()}
    if info.st_size > sum(budget.values()) + STATE_MEMBER_SLACK:
        raise TokenError(f"{path}: {info.st_size} bytes, more than a state of this graph takes "
                         f"({', '.join(f'{k} {v}' for k, v in expected.items())}); not a saved state of this model")
    members = {f"{name}.npy": name for name in expected}
    state = {}
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            names = [e.filename for e in entries]
            if sorted(names) != sorted(members):
                shown = ", ".join(n.removesuffix(".npy") for n in names[:8]) + (", …" if len(names) > 8 else "")
                raise TokenError(f"{path}: holds the arrays [{shown}]; the graph's state is exactly "
                                 f"[{', '.join(expected)}]")
            for entry in entries:
                name = members[entry.filename]
                shape = expected[name]
                if entry.file_size > budget[name]:
                    raise TokenError(f"{path}: array {name!r} declares {entry.file_size} bytes uncompressed, more than "
                                     f"a {shape} array takes; refusing it")
                with archive.open(entry) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        got, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                    elif version == (2, 0):
                        got, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                    else:
                        raise TokenError(f"{path}: array {name!r} has .npy format {version}; expected 1.0 or 2.0")
                    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None \
                            or dtype.kind not in "fiu" or dtype.itemsize > 8:
                        raise TokenError(f"{path}: array {name!r} has dtype {dtype}; a state holds real numbers")
                    if tuple(got) != tuple(shape):
                        raise TokenError(f"{path}: state {name!r} has shape {tuple(got)}, the graph's is {tuple(shape)}")
                    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    data = f.read(size + 1)  # to the end when it fits, which checks the member's CRC
                    if len(data) != size:
                        raise TokenError(f"{path}: array {name!r} holds {'more' if len(data) > size else 'fewer'} "
                                         f"bytes than its header's {shape} {dtype}")
                state[name] = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C").copy()
                if nan == "refuse" and not np.isfinite(state[name]).all():
                    at = tuple(int(i) for i in np.argwhere(~np.isfinite(state[name]))[0])
                    raise TokenError(f"{path}: state {name!r} holds a non-finite value (NaN or inf) at {at}; "
                                     "pass --nan pass to restore it anyway")
    except TokenError:
        raise
    except (zipfile.BadZipFile, zlib.error, ValueError, EOFError, OSError, NotImplementedError) as e:
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise TokenError(f"{path}: not a readable .npz state ({detail})") from None
    return state
