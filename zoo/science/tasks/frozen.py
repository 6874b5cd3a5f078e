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

from zoo.science.paths import cache_dir, safe_name
from zoo.science.tasks.regression import LinearRegressionTask, TaskBatch

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
    import pyarrow as pa
    from datasets import Dataset, DatasetInfo, Features

    _quiet_datasets()

    folder.mkdir(parents=True, exist_ok=True)
    columns = {"x": _array2d_column(x), "y": _array2d_column(y)}
    features = Features({name: _array2d_feature(a) for name, a in (("x", x), ("y", y))})
    ds = Dataset(pa.table(columns), info=DatasetInfo(features=features))
    # Write under a private name, then rename: a reader in another process (two sweeps sharing
    # the cache) sees either no file or the whole file, never a half-written one.
    tmp = folder / f".data.parquet.{os.getpid()}.tmp"
    ds.to_parquet(str(tmp))
    os.replace(tmp, folder / "data.parquet")
    return content_hash(x, y)


def _array2d_feature(a: np.ndarray):
    from datasets import Array2D

    return Array2D(shape=a.shape[1:], dtype="float32")


def _array2d_column(a: np.ndarray):
    """datasets' Array2D column (list<list<float32>> storage) built from the array's memory in one go:
    the same Arrow data, hence the same parquet bytes, as `Dataset.from_dict`, which converts row by
    row in Python (8× slower: 0.55 s against 0.07 s for 10,000 rows of 11 × 8)."""
    import pyarrow as pa

    n, rows, cols = a.shape
    flat = pa.array(np.ascontiguousarray(a, dtype="<f4").reshape(-1))
    inner = pa.ListArray.from_arrays(pa.array(np.arange(0, n * rows * cols + 1, cols, dtype=np.int32)), flat)
    outer = pa.ListArray.from_arrays(pa.array(np.arange(0, n * rows + 1, rows, dtype=np.int32)), inner)
    return pa.ExtensionArray.from_storage(_array2d_feature(a)(), outer)  # the feature's Arrow extension type


def read_parquet_arrays(path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    # Read from the file's bytes on this thread. `pq.read_table` starts Arrow's IO thread pool, whose
    # native threads can abort the interpreter at exit ("terminate called without an active exception",
    # apache/arrow#34314): 1 of 60 processes in the concurrent-repair test did. A split is a few MB.
    return _arrays_from_bytes(Path(path).read_bytes())


def _arrays_from_bytes(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return _arrays_from_table(pq.ParquetFile(pa.BufferReader(data)).read(columns=["x", "y"], use_threads=False))


def _arrays_from_table(table) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa

    out = []
    for name in ("x", "y"):
        column = table.column(name).combine_chunks()  # list<list<float32>>: the Array2D layout
        if isinstance(column.type, pa.ExtensionType):  # datasets registers Array2D as an Arrow extension
            column = column.storage
        n, rows = len(column), len(column[0]) if len(column) else 0
        flat = column.flatten().flatten()
        if flat.null_count == 0 and pa.types.is_float32(flat.type):  # a frozen split: its floats read in place
            flat = np.frombuffer(flat.buffers()[1], dtype="<f4")[flat.offset : flat.offset + len(flat)]
        else:  # another file (nulls become NaN; the hash check refuses it). Arrow's to_numpy imports pandas: 0.3 s
            flat = flat.to_numpy(zero_copy_only=False)
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
    """The frozen split `split` of task `task_name`, whose registry spec (zoo.science.registry.get_task_spec)
    is `spec`: from the cache (built on first use from the spec's seed), hash-checked against it.

    A split with no registered hash (a task variant such as `--set task.n_context=20`) is checked
    against the hash of the split regenerated from its seed: a cached copy is never trusted as is."""
    if split not in spec.splits:
        raise KeyError(f"task {task_name!r} has no split {split!r}; it has {sorted(spec.splits)}")
    s = spec.splits[split]
    folder = cache_dir() / "datasets" / safe_name(task_name) / split
    size = _expected_size(spec, split)  # the cached file is decoded within these, as a download is
    path = folder / "data.parquet"
    name = f"{task_name}/{split}"
    generated = None
    expected = s.sha256
    if expected is None:
        generated = _generate_verified(spec, s, name)
        expected = content_hash(*generated)
    if not rebuild and path.is_file():
        try:  # another process may be repairing it right now, or it is unreadable: the locked path below
            x, y = read_cached_split(path, spec, split, size=size)
        except Exception:
            x = y = None
        if x is not None and (got := content_hash(x, y)) == expected:
            if _stale_writes(folder):  # a killed writer's: removed under the lock, which every writer holds
                with _locked(folder):
                    _remove_stale_writes(folder)
            return FrozenSplit(name=name, x=x, y=y, sha256=got)
    with _locked(folder):  # build, rebuild or repair; the first process does it, the others find it done
        _remove_stale_writes(folder)
        old_hash = None
        if path.is_file():
            try:
                x, y = read_cached_split(path, spec, split, size=size)
                old_hash = content_hash(x, y)
            except Exception:  # not a parquet file, another schema, another size: set aside like an edited copy
                with open(path, "rb") as f:
                    old_hash = "unreadable-" + hashlib.file_digest(f, "sha256").hexdigest()
            if old_hash == expected and not rebuild:
                return FrozenSplit(name=name, x=x, y=y, sha256=old_hash)
        x, y = generated or _generate_verified(spec, s, name)  # refuses, touching nothing, if it cannot match
        if old_hash is not None and old_hash != expected:
            _set_aside(path, old_hash, name, expected, s.seed)
        save_split(x, y, folder)
        x, y = read_cached_split(path, spec, split, size=size)
    return FrozenSplit(name=name, x=x, y=y, sha256=verify(x, y, expected, name))


STALE_WRITE = ".data.parquet.*.tmp"  # save_split's private name: a killed writer's half-written file


def _stale_writes(folder: Path) -> list[Path]:
    return sorted(folder.glob(STALE_WRITE))


def _remove_stale_writes(folder: Path) -> None:
    """Under the folder's lock, which every writer of the cache holds while it writes: any private file
    left there is a killed writer's."""
    for p in _stale_writes(folder):
        p.unlink(missing_ok=True)


def read_cached_split(path: Path, spec, split: str, *, size=None) -> tuple[np.ndarray, np.ndarray]:
    """The arrays of the cached `path`, decoded only once its size and footer fit `spec`'s split (the task
    count and x/y shapes `_expected_size` gives), with the checks a download gets (`_check_footer`); refused
    (DatasetShapeMismatch, one line naming the file) otherwise. A cache is as writable as a download."""
    n, shapes = size if size is not None else _expected_size(spec, split)
    where = f"cached frozen split {path}"
    limit = _byte_limit(n, shapes)  # the footer check's bound, applied before anything is read past it
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise DatasetShapeMismatch(f"{where}: more than {limit} bytes, far more than {n} tasks of x {shapes[0]}, "
                                   f"y {shapes[1]} need; refusing to decode it")
    rows, _ = _check_footer(path, where, shapes, data=data)  # read from these bytes, as decoded below
    if rows != n:
        raise DatasetShapeMismatch(f"{where}: its parquet declares {rows} tasks; the split has {n} — refusing to decode it")
    x, y = _arrays_from_bytes(data)
    if (x.shape, y.shape) != ((n, *shapes[0]), (n, *shapes[1])):  # a footer that lied about its pages
        raise DatasetShapeMismatch(f"{where}: decoded x {x.shape}, y {y.shape}, not the {n} tasks of x {shapes[0]}, "
                                   f"y {shapes[1]} its footer declares")
    return x, y


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


# What a download may cost before anything is decoded. Parquet is compressed: 70 KB of it can declare
# 300 000 constant tasks, which cost 750 MB of RSS (and left a 150–170 MB Arrow cache) when `datasets`
# decoded them just to find the hash wrong. A caller that names the task gets its split's exact size and
# shapes; one that has only a hash gets these ceilings, ten times the zoo's largest split (10 000 tasks;
# 1.1 M float32 values in one array).
MAX_TASKS = 100_000
MAX_VALUES = 2**24  # float32 values in x, and again in y (64 MiB each)


class DatasetShapeMismatch(DatasetHashMismatch):
    """A downloaded split is not shaped as expected (rows, columns, types, array shapes); refused undecoded."""


def load_split_from_hub(repo_id: str, *, split: str = "test", revision: str | None = None,
                        expected_sha256: str | None = None, endpoint: str | None = None,
                        spec=None) -> FrozenSplit:
    """A frozen split published as a Hub dataset repo, hash-checked against `expected_sha256` (the caller's:
    the registry's hash, or a checkpoint's claim; None: hashed, not checked).

    The repo's parquet and README are fetched by `snapshot_download` (from `endpoint`, else HF_ENDPOINT)
    into a temporary folder that is deleted on return, refused or not. The split's files are the ones
    `datasets.load_dataset` would read (the card's `configs`, else datasets' default layout); their
    footers are checked against the expected task count and `x`/`y` shapes, and only then are they
    decoded (pyarrow) and hashed. Expected: the size and shapes of `spec`'s split (the task's registry
    spec, zoo.science.registry.get_task_spec: pass it when the task is known), else the files' declared Array2D
    shapes within MAX_TASKS and MAX_VALUES.
    """
    import tempfile

    from huggingface_hub import snapshot_download

    name = f"{repo_id}@{revision or 'main'}/{split}"
    n, shapes = _expected_size(spec, split)
    with tempfile.TemporaryDirectory(prefix="icl-zoo-dataset-") as tmp:
        folder = Path(os.path.abspath(snapshot_download(
            repo_id, repo_type="dataset", revision=revision, endpoint=endpoint, cache_dir=Path(tmp) / "hub",
            allow_patterns=["*.parquet", "README.md"])))
        files = _split_files(folder, split, name, Path(tmp) / "datasets")
        footers = [_check_footer(f, f"frozen split {name} ({f.relative_to(folder)})", shapes) for f in files]
        rows = sum(r for r, _ in footers)
        shapes = footers[0][1]
        if any(s != shapes for _, s in footers):
            raise DatasetShapeMismatch(f"frozen split {name}: its files declare different shapes {[s for _, s in footers]}")
        values = rows * max(int(np.prod(s)) for s in shapes)
        if (n is not None and rows != n) or not 0 < rows <= MAX_TASKS or values > MAX_VALUES:
            want = f"{n} tasks" if n is not None else f"1 to {MAX_TASKS} tasks and at most {MAX_VALUES} values per array"
            raise DatasetShapeMismatch(f"frozen split {name}: its parquet declares {rows} tasks of x {shapes[0]}, "
                                       f"y {shapes[1]}; expected {want} — refusing to decode it")
        try:
            parts = [read_parquet_arrays(f) for f in files]
        except Exception as e:  # noqa: BLE001 -- a footer that lied about its pages, however it fails
            raise DatasetShapeMismatch(f"frozen split {name}: its parquet does not decode as it declares: {e}") from None
    x, y = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
    if (x.shape, y.shape) != ((rows, *shapes[0]), (rows, *shapes[1])):  # a footer that lied about its pages
        raise DatasetShapeMismatch(f"frozen split {name}: decoded x {x.shape}, y {y.shape}, not the "
                                   f"{rows} tasks of x {shapes[0]}, y {shapes[1]} its footer declares")
    return FrozenSplit(name=name, x=x, y=y, sha256=verify(x, y, expected_sha256, name))


def _expected_size(spec, split: str):
    """(task count or None, (x row shape, y row shape) or None) of `spec`'s split."""
    if spec is None:
        return None, None
    b = spec.build().sample(1, seed=0)
    n = spec.splits[split].n if split in spec.splits else None
    return n, (tuple(b.x.shape[1:]), tuple(b.y.shape[1:]))


def _split_files(folder: Path, split: str, name: str, scratch: Path) -> list[Path]:
    """The parquet files of `split` in a downloaded dataset repo, resolved as `datasets` resolves them."""
    import datasets

    _quiet_datasets()
    try:  # reads the card's YAML and lists files; decodes nothing (its lock file goes to `scratch`)
        found = datasets.load_dataset_builder(str(folder), cache_dir=str(scratch)).config.data_files or {}
    except Exception as e:  # noqa: BLE001 -- whatever a hostile card makes `datasets` raise
        raise DatasetShapeMismatch(f"frozen split {name}: cannot list the repo's data files: {e}") from None
    files = [Path(os.path.abspath(f)) for f in found.get(split, [])]
    if not files or any(f.suffix != ".parquet" or not f.is_relative_to(folder) for f in files):
        raise DatasetShapeMismatch(f"frozen split {name}: expected parquet files for split {split!r} in the repo, "
                                   f"found {[str(f) for f in files] or 'none'} (splits: {sorted(found)})")
    return files


def _byte_limit(rows: int, shapes) -> int:
    """The most bytes a split file of `rows` tasks with x, y row `shapes` may take: its float32 values twice over,
    plus 1 MiB for the footer and page headers."""
    return 8 * rows * sum(a * b for a, b in shapes) + 2**20


def _check_footer(path: Path, where: str, shapes, *, data: bytes | None = None) -> tuple[int, tuple]:
    """(rows, (x row shape, y row shape)) from a parquet file's footer, refused unless x and y are
    float32 Array2D columns of the `shapes` expected (else the declared ones) whose value counts and
    file size fit them. Reads the footer only (of `data`, the file's bytes, when given)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    want = "columns x, y as float32 Array2D features" + (f" of shapes {shapes[0]}, {shapes[1]}" if shapes else "")
    try:
        pf = pq.ParquetFile(path if data is None else pa.BufferReader(data))
        meta, schema = pf.metadata, pf.schema_arrow
    except (OSError, ValueError, pa.ArrowException) as e:
        raise DatasetShapeMismatch(f"{where}: not a parquet file with {want} ({type(e).__name__}: {e})") from None
    try:  # the features `datasets` wrote beside the table
        declared = json.loads((schema.metadata or {}).get(b"huggingface", b"{}"))["info"]["features"]
    except (ValueError, KeyError, TypeError):
        declared = {}
    got = []
    for column in ("x", "y"):
        t = schema.field(column).type if column in schema.names else None
        t = t.storage_type if isinstance(t, pa.ExtensionType) else t
        f = declared.get(column) if isinstance(declared, dict) else None
        f = f if isinstance(f, dict) else {}
        shape = tuple(f["shape"]) if isinstance(f.get("shape"), list) else None
        ok = (t is not None and pa.types.is_list(t) and pa.types.is_list(t.value_type)
              and t.value_type.value_type == pa.float32() and f.get("_type") == "Array2D" and f.get("dtype") == "float32"
              and shape is not None and len(shape) == 2 and all(type(d) is int and d > 0 for d in shape))
        if not ok:
            raise DatasetShapeMismatch(f"{where}: expected {want}; column {column!r} is {t} declared {f}")
        got.append(shape)
    got = tuple(got)
    if shapes is not None and got != tuple(shapes):
        raise DatasetShapeMismatch(f"{where}: declares x {got[0]}, y {got[1]}; expected {want}")
    rows = meta.num_rows
    for column, shape in zip(("x", "y"), got):  # every value the reader will decode is counted in the footer
        leaves = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == column]
        count = sum(meta.row_group(g).column(i).num_values for g in range(meta.num_row_groups) for i in leaves)
        if count != rows * shape[0] * shape[1]:
            raise DatasetShapeMismatch(f"{where}: column {column!r} holds {count} values, not the "
                                       f"{rows} × {shape[0]} × {shape[1]} of {rows} tasks of shape {shape}")
    size = path.stat().st_size if data is None else len(data)  # read whole before decoding
    if size > _byte_limit(rows, got):
        raise DatasetShapeMismatch(f"{where}: {size} bytes is far more than {rows} tasks of x {got[0]}, y {got[1]} need")
    return rows, got
