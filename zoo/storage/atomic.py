"""Write a folder or a small file whole or not at all.

A checkpoint folder is consistent only as a whole: config.json records the hash of every file, and
the weights the hash of config.json. Written in place, a kill between two files leaves a folder that
every loader refuses and that no command can repair (each starts by loading it). `replace_folder`
writes the new version into `.<name>.staged-XXXXXXXX/<name>` beside the folder (same parent, so the
same filesystem: renames are atomic; the same name, which the card may quote), then renames the old
folder aside to `.<name>.old-XXXXXXXX`, the staged one in, and removes the old one. A failed write
removes the staged folder and leaves the folder untouched; a failed swap renames the old folder back. A kill between the two renames (the
only moment the folder is absent) is undone by the next `replace_folder` of that folder, which also
removes what killed writers left. One writer per folder at a time.

Standard library only, no zoo imports: the checkpoint writer (zoo.storage.save), the
builder and the release all use it, and export must not import the builder.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import warnings
from collections.abc import Callable
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
    _recover(folder)
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
