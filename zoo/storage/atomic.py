"""Write a folder or a small file whole or not at all.

A checkpoint folder is consistent only as a whole: config.json records the hash of every file, and
the weights the hash of config.json. Written in place, a kill between two files leaves a folder that
every loader refuses and that no command can repair (each starts by loading it). `replace_folder`
writes the new version into `.<name>.staged-XXXXXXXX/<name>` beside the folder (same parent, so the
same filesystem: renames are atomic; the same name, which the card may quote), then renames the old
folder aside to `.<name>.old-XXXXXXXX`, the staged one in, and removes the old one. A failed write
removes the staged folder and leaves the folder untouched; a failed swap renames the old folder back. A kill between the two renames (the
only moment the folder is absent) is undone by the next `replace_folder` of that folder, which also
removes what killed writers left; so does `recover_folder`, which a reader of the folder may call.

One writer per folder at a time: `writing(folder)` holds an exclusive lock (fcntl.flock on `.<name>.lock`
beside the folder, holding the writer's pid) for as long as a writer works on it; `replace_folder` takes it,
and `zoo build` holds it from its first check of the folder to its save. A second writer is refused in one
line naming the first one's pid (or waits, `wait=True`). The lock dies with its process: a killed writer's
lock file is taken over by the next writer, and removed when it is done.

Standard library only, no zoo imports: the checkpoint writer (zoo.storage.save), the
builder and the release all use it, and export must not import the builder.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def replace_folder(folder: str | Path, write: Callable[[Path], T], *, keep: Callable[[str], bool] = lambda name: True) -> T:
    """Replace `folder` by what `write(staged)` writes into an empty staged folder, plus the entries of
    the old folder that `write` did not write and `keep(name)` accepts (copied: the old folder stays
    whole until the swap). Returns what `write` returns. Raises NotADirectoryError for a file."""
    folder = Path(os.path.realpath(folder))  # a symlinked folder is replaced where it lives, not the link
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, not a folder; refusing to replace it")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with writing(folder):  # what _recover removes is then a dead writer's, never a live one's
        _recover(folder)
        return _replace(folder, write, keep)


def _replace(folder: Path, write: Callable[[Path], T], keep: Callable[[str], bool]) -> T:
    staging = _sibling(folder, "staged")
    staged = staging / folder.name
    try:
        staged.mkdir(parents=True)  # honours the umask, as the folder's first mkdir did
        result = write(staged)
        if folder.is_dir():
            shutil.copymode(folder, staged)
            _carry_over(folder, staged, keep)
        swap(folder, staged)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # empty after a swap; a failed write's files otherwise
    return result


def swap(folder: Path, staged: Path) -> None:
    """Rename `staged` to `folder`, the old `folder` (if any) aside first and removed after; if the
    second rename fails the old folder is put back."""
    folder = Path(folder)
    if not folder.exists():
        os.rename(staged, folder)
        return
    old = _sibling(folder, "old")
    os.rename(folder, old)
    try:
        os.rename(staged, folder)
    except BaseException:
        os.rename(old, folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_text(path: str | Path, text: str) -> None:
    """`path.write_text(text)` through a temporary file renamed over it: a reader (or the next run after
    a kill) sees the old text or the new one, never an empty or half-written file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class FolderBusy(RuntimeError):
    """Another process is writing the folder (it holds the folder's lock)."""


_held = threading.local()  # lock paths this thread holds → how many `writing` blocks hold each


@contextmanager
def writing(folder: str | Path, *, what: str = "zoo process", wait: bool = False,
            waiting: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold the lock of `folder` (symlinks resolved) while the block writes it: fcntl.flock on `.<name>.lock`
    beside it, which records `what` holds it and its pid. Held already (by another process, or another
    thread): FolderBusy "another zoo build is writing DIR (lock held by pid N)", or with `wait` block until
    it is free (`waiting(holder)` is called first, holder as "zoo build (pid N)"). Re-entrant in one thread.
    The lock file is removed on leaving; one a killed writer left is taken over."""
    real = Path(os.path.realpath(folder))
    lock = real.with_name(f".{real.name}.lock")
    counts = _held.__dict__.setdefault("counts", {})
    if counts.get(lock):
        counts[lock] += 1
        try:
            yield real
        finally:
            counts[lock] -= 1
        return
    real.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(lock, folder, what, wait, waiting)
    counts[lock] = 1
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {what}\n".encode(), 0)
        yield real
    finally:
        del counts[lock]
        try:  # removed while still held: a process that opened it meanwhile sees another inode, and retries
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)


def _acquire(lock: Path, folder, what: str, wait: bool, waiting) -> int:
    """An open descriptor of `lock` that holds its flock and is still the file at that path."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                if not wait:
                    raise FolderBusy(f"another {holder[1]} is writing {folder} (lock held by pid {holder[0]}); "
                                     "wait for it to finish, or write another folder") from None
                if waiting is not None:
                    waiting(f"{holder[1]} (pid {holder[0]})")
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)  # the holder removed it as we took it over: lock the one at the path now


def _holder(fd: int) -> tuple[str, str]:
    """(pid, what) the lock file `fd` records; ("?", "zoo process") when it holds nothing readable yet."""
    try:
        pid, _, what = os.pread(fd, 200, 0).decode("utf-8", "replace").strip().partition(" ")
    except OSError:
        pid = what = ""
    return (pid if pid.isdigit() else "?"), (what.strip() or "zoo process")


def recover_folder(folder: str | Path) -> bool:
    """Put back a folder that a killed `replace_folder` left renamed aside (`.<name>.old-*`, the folder
    itself absent), as the next `replace_folder` would; readers call it before taking the folder as
    missing. Nothing is done while a live writer holds the folder (it is between its two renames).
    Returns whether the folder was restored."""
    real = Path(os.path.realpath(folder))
    if real.exists() or real.is_symlink() or not real.parent.is_dir() or not _leftovers(real, "old"):
        return False
    try:
        with writing(real):
            _recover(real)
    except (FolderBusy, OSError):
        return False
    return real.is_dir()


def _sibling(folder: Path, kind: str) -> Path:
    return folder.with_name(f".{folder.name}.{kind}-{secrets.token_hex(4)}")


def _leftovers(folder: Path, kind: str) -> list[Path]:
    pattern = re.compile(rf"\.{re.escape(folder.name)}\.{kind}-[0-9a-f]{{8}}")
    return [p for p in folder.parent.iterdir() if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]


def _recover(folder: Path) -> None:
    """Undo what a killed `replace_folder` left: the old folder renamed aside with nothing swapped in
    is renamed back (the new version never finished); staged and old copies are removed."""
    olds = sorted(_leftovers(folder, "old"), key=lambda p: p.stat().st_ctime)
    if olds and not folder.exists():
        restored = olds.pop()  # the most recently renamed aside
        os.rename(restored, folder)
        warnings.warn(f"{folder}: restored the previous version from {restored.name}, left by an interrupted save",
                      stacklevel=3)
    for leftover in olds + _leftovers(folder, "staged"):
        shutil.rmtree(leftover, ignore_errors=True)


def _carry_over(old: Path, staged: Path, keep: Callable[[str], bool]) -> None:
    for entry in os.scandir(old):
        src, dst = Path(entry.path), staged / entry.name
        if not keep(entry.name) or dst.exists() or dst.is_symlink():  # what `write` wrote wins
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif entry.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        elif entry.is_file():
            shutil.copy2(src, dst)
        else:  # a FIFO or device: copying would block or read forever
            warnings.warn(f"{src} is not a regular file or folder; not carried over to the new {old.name}", stacklevel=4)
