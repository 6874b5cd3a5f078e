"""Frozen task datasets: N tasks from a seed, saved as parquet through `datasets`, content-hashed.

The identity of a split is SHA-256 over its canonical arrays, not `datasets`' fingerprint
(which hashes the transform history, not the data):

    sha256( b"icl-zoo/frozen/v1" ‖ for a in (x, y): shape as little-endian int64s ‖ a as
            C-contiguous little-endian float32 bytes )

Loading recomputes the hash and refuses a mismatch, so a tampered or regenerated-differently
split can never be scored silently.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from zoo.names import safe_name
from zoo.tasks.regression import LinearRegressionTask, TaskBatch

HASH_DOMAIN = b"icl-zoo/frozen/v1"


class DatasetHashMismatch(ValueError):
    """A frozen split's content hash is not the one the registry (or the caller) expects."""


def content_hash(x: np.ndarray, y: np.ndarray) -> str:
    h = hashlib.sha256(HASH_DOMAIN)
    for a in (x, y):
        a = np.ascontiguousarray(a, dtype="<f4")
        h.update(np.asarray(a.shape, dtype="<i8").tobytes())
        h.update(a.tobytes())
    return h.hexdigest()


def cache_dir() -> Path:
    root = os.environ.get("ICL_ZOO_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "icl-zoo"
    return Path(root)


@dataclass
class FrozenSplit:
    name: str  # "<task>/<split>"
    x: np.ndarray  # (N, C+1, d_x) float32
    y: np.ndarray  # (N, C+1, d_y) float32
    sha256: str

    def batch(self, task: LinearRegressionTask, dtype=torch.float32, device="cpu") -> TaskBatch:
        x = torch.from_numpy(self.x).to(device=device, dtype=dtype)
        y = torch.from_numpy(self.y).to(device=device, dtype=dtype)
        return task.batch_from_arrays(x, y)


def generate_split(task: LinearRegressionTask, seed: int, n: int, w_std: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    # Inputs come from the CPU generator (the same bytes on every machine and torch build); any
    # computed targets are computed in float64 and rounded, since float32 matmuls round differently
    # on different CPUs/BLAS (the float32 teacher targets hashed differently on the H100 machine).
    b = task.sample(n, seed=seed, w_std=w_std)
    return b.x.numpy().astype("<f4"), b.y.numpy().astype("<f4")


def _quiet_datasets() -> None:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def save_split(x: np.ndarray, y: np.ndarray, folder: Path) -> str:
    """Write data.parquet (explicit Array2D features) and return the content hash."""
    from datasets import Array2D, Dataset, Features

    _quiet_datasets()

    folder.mkdir(parents=True, exist_ok=True)
    features = Features({
        "x": Array2D(shape=x.shape[1:], dtype="float32"),
        "y": Array2D(shape=y.shape[1:], dtype="float32"),
    })
    ds = Dataset.from_dict({"x": x, "y": y}, features=features)
    # Write under a private name, then rename: a reader in another process (two sweeps sharing
    # the cache) sees either no file or the whole file, never a half-written one.
    tmp = folder / f".data.parquet.{os.getpid()}.tmp"
    ds.to_parquet(str(tmp))
    os.replace(tmp, folder / "data.parquet")
    return content_hash(x, y)


def read_parquet_arrays(path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Read from the file's bytes on this thread. `pq.read_table` starts Arrow's IO thread pool, whose
    # native threads can abort the interpreter at exit ("terminate called without an active exception",
    # apache/arrow#34314): 1 of 60 processes in the concurrent-repair test did. A split is a few MB.
    data = pa.BufferReader(Path(path).read_bytes())
    return _arrays_from_table(pq.ParquetFile(data).read(columns=["x", "y"], use_threads=False))


def _arrays(ds) -> tuple[np.ndarray, np.ndarray]:
    """x, y of a `datasets.Dataset` (its Arrow table, without a Python round trip per row)."""
    return _arrays_from_table(ds.data.table)


def _arrays_from_table(table) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa

    out = []
    for name in ("x", "y"):
        column = table.column(name).combine_chunks()  # list<list<float32>>: the Array2D layout
        if isinstance(column.type, pa.ExtensionType):  # datasets registers Array2D as an Arrow extension
            column = column.storage
        n, rows = len(column), len(column[0]) if len(column) else 0
        flat = column.flatten().flatten().to_numpy(zero_copy_only=False)
        out.append(np.array(flat.reshape(n, rows, -1), dtype="<f4", copy=True))  # writable, owns its memory
    return out[0], out[1]


def verify(x: np.ndarray, y: np.ndarray, expected: str | None, name: str) -> str:
    got = content_hash(x, y)
    if expected is not None and got != expected:
        raise DatasetHashMismatch(
            f"frozen split {name}: content hash {got} does not match the expected {expected}; "
            "the data was modified or generated differently — refusing to use it"
        )
    return got


@contextmanager
def _locked(folder: Path):
    """An exclusive lock on a cache folder: concurrent processes repair or build a split one at a time."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_split(task_name: str, split: str, *, spec, rebuild: bool = False) -> FrozenSplit:
    """The frozen split `split` of task `task_name`, whose registry spec (zoo.registry.get_task_spec)
    is `spec`: from the cache (built on first use from the spec's seed), hash-verified against it.

    A split with no registered hash (a task variant such as `--set task.n_context=20`) is checked
    against the hash of the split regenerated from its seed: a cached copy is never trusted as is."""
    if split not in spec.splits:
        raise KeyError(f"task {task_name!r} has no split {split!r}; it has {sorted(spec.splits)}")
    s = spec.splits[split]
    folder = cache_dir() / "datasets" / safe_name(task_name) / split
    path = folder / "data.parquet"
    name = f"{task_name}/{split}"
    generated = None
    expected = s.sha256
    if expected is None:
        generated = _generate_verified(spec, s, name)
        expected = content_hash(*generated)
    if not rebuild and path.is_file():
        try:  # another process may be repairing it right now, or it is unreadable: the locked path below
            x, y = read_parquet_arrays(path)
        except Exception:
            x = y = None
        if x is not None and (got := content_hash(x, y)) == expected:
            return FrozenSplit(name=name, x=x, y=y, sha256=got)
    with _locked(folder):  # build, rebuild or repair; the first process does it, the others find it done
        old_hash = None
        if path.is_file():
            try:
                x, y = read_parquet_arrays(path)
                old_hash = content_hash(x, y)
            except Exception:  # not a parquet file, or another schema: set aside like an edited copy
                old_hash = "unreadable-" + hashlib.sha256(path.read_bytes()).hexdigest()
            if old_hash == expected and not rebuild:
                return FrozenSplit(name=name, x=x, y=y, sha256=old_hash)
        x, y = generated or _generate_verified(spec, s, name)  # refuses, touching nothing, if it cannot match
        if old_hash is not None and old_hash != expected:
            _set_aside(path, old_hash, name, expected, s.seed)
        save_split(x, y, folder)
        x, y = read_parquet_arrays(path)
    return FrozenSplit(name=name, x=x, y=y, sha256=verify(x, y, expected, name))


def _generate_verified(spec, s, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The split generated from its seed; refused before anything is written if it does not hash
    to the registry's value (this machine generates it differently)."""
    x, y = generate_split(spec.build(), s.seed, s.n, s.w_std)
    verify(x, y, s.sha256, name)
    return x, y


def _set_aside(path: Path, old_hash: str, name: str, expected: str, seed: int) -> None:
    """A cached split whose hash is not the expected one (edited, or written by an older zoo) is only
    a cache: it is regenerated, and the old file kept beside it as `.mismatch-<hash>`, never lost."""
    import warnings

    aside = path.with_name(f"{path.name}.mismatch-{old_hash.removeprefix('unreadable-')[:12]}")
    os.replace(path, aside)
    warnings.warn(f"frozen split {name}: the cached copy had content hash {old_hash}, not {expected}; "
                  f"regenerated it from seed {seed} (the old file is kept as {aside})", stacklevel=3)


def load_split_from_hub(repo_id: str, *, split: str = "test", revision: str | None = None,
                        expected_sha256: str | None = None, endpoint: str | None = None) -> FrozenSplit:
    """A frozen split published as a Hub dataset repo, loaded with `datasets.load_dataset`, hash-verified.

    Without `endpoint`, `load_dataset(repo_id)` talks to HF_ENDPOINT as users expect. With one
    (datasets fixes its endpoint at import time), the repo is fetched by `snapshot_download`
    from that endpoint into the HF cache and `load_dataset` reads the snapshot.
    """
    import datasets

    _quiet_datasets()
    source = repo_id
    if endpoint is not None:
        from huggingface_hub import snapshot_download

        source = snapshot_download(repo_id, repo_type="dataset", revision=revision, endpoint=endpoint)
    ds = datasets.load_dataset(source, split=split, revision=None if endpoint else revision)
    x, y = _arrays(ds)
    name = f"{repo_id}@{revision or 'main'}/{split}"
    return FrozenSplit(name=name, x=x, y=y, sha256=verify(x, y, expected_sha256, name))
