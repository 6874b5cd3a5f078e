"""Prepare a local hub for `zoo hub serve` once per release, and reuse it while the release is unchanged.

Preparing publishes every released folder as model repo `icl-zoo/<entry>` and each task's frozen
splits as dataset repo `icl-zoo/<task>`, each tagged with the release version, with a progress bar; then it
writes `<hub>/.icl-zoo-release.json`: the key it was prepared for, the version and the repos' commits (the
server lists them as the release's Collection). The key is a SHA-256 of the release's index.json, the set of
tasks, and the sources that make the dataset repos (task definitions, generators and the dataset card): when it
matches and the repos are there, nothing is done and nothing heavy (torch, datasets) is imported, so the
endpoint answers about a second after launch.

The model repos are written from the shipped release's bytes, checked against its index, as git objects
in-process (zoo.publishing.hub_git: no git processes): about a second for an empty hub dir. The dataset repos
come from the cache (below), checked against the hashes the release pins, or without it from the frozen splits,
loaded (or generated from their seeds) through torch: seconds. `Preparation` does the two in that order, so that
`zoo hub serve` answers once the model repos are in place and makes the dataset repos while it serves, holding a
request for one of them until it is ready (zoo.publishing.hub_server; reports/engineering/hub-start.md has the
figures).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
from pathlib import Path

from zoo.publishing.hub_git import remove_staged, write_new_repo
from zoo.publishing.hub_server import RELEASE_MARKER
from zoo.science.paths import cache_dir, safe_name
from zoo.storage.locate import INDEX_JSON, ORG, read_index, release_dir, verify_folder
from zoo.version import __version__

PACKAGE = Path(__file__).parents[1]  # the package folder, zoo/
# What decides a dataset repo's bytes besides the task's name: its definition, its generator, its card (whose
# leaderboard link is leaderboard_url's, from storage/card.py's REPO_URL).
DATASET_SOURCES = ("science/entries/*.toml", "science/tasks/*.py", "publishing/hub.py", "publishing/leaderboard.py",
                   "science/paths.py", "storage/card.py")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def release_tasks(root: Path, index: dict) -> list[str]:
    """The tasks of the released entries, from their config.json (no registry, no torch)."""
    tasks = set()
    for name in index["entries"]:
        try:
            tasks.add(json.loads((root / name / "config.json").read_text())["entry"]["task"])
        except (OSError, ValueError, KeyError, TypeError):
            tasks.add(f"?{name}")  # unreadable: preparation finds out why (verify_folder)
    return sorted(tasks)


def release_key(root: Path | None = None, *, datasets: bool = True) -> tuple[str, dict]:
    """(key, index) of the release in `root`; the key changes whenever the prepared hub would."""
    root = Path(root or release_dir())
    index = read_index(root)
    index_file = root / INDEX_JSON
    doc = {"format": 1, "zoo": __version__, "version": index["version"],
           "index": _sha256(index_file) if index_file.is_file() else None, "datasets": datasets}
    if datasets:
        doc["tasks"] = release_tasks(root, index)
        doc["sources"] = dataset_sources()
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest(), index


def read_marker(hub_root: Path) -> dict | None:
    try:
        marker = json.loads((Path(hub_root) / RELEASE_MARKER).read_text())
        return marker if isinstance(marker, dict) else None
    except (OSError, ValueError):
        return None


def is_prepared(hub_root: Path, key: str) -> bool:
    marker = read_marker(hub_root)
    if not marker or marker.get("key") != key:
        return False
    org = marker.get("org", ORG)
    repos = [("models", n) for n in marker.get("models", {})] + [("datasets", n) for n in marker.get("datasets", {})]
    return all((Path(hub_root) / kind / org / name / ".git").is_dir() for kind, name in repos)


def prepare(hub_root: Path, root: Path | None = None, *, datasets: bool = True, progress: bool = True) -> dict:
    """Make the local hub at `hub_root` serve the release in `root` (default: the shipped one).

    Returns the marker: {"key", "version", "org", "models": {name: commit}, "datasets": {task: commit},
    "prepared_at", "reused"}, and when prepared now "datasets_from_cache": the tasks whose dataset repo came from
    the cache. Reused (fast) when the release is the one last prepared."""
    preparation = Preparation(hub_root, root, datasets=datasets, progress=progress)
    preparation.models()
    preparation.datasets()
    return preparation.finish()


class Preparation:
    """One preparation of a local hub, in the order `zoo hub serve` serves it: `models()` puts the model repos in
    place (a second or so) and returns the tasks whose dataset repo is still to make, `dataset(task)` makes one
    (seconds without the cache: torch, the frozen splits), `finish()` writes the marker. Nothing is reused from
    an interrupted preparation: the marker is removed first and written last. The caller holds
    `zoo.publishing.hub.preparing(hub_root)` throughout."""

    def __init__(self, hub_root: Path, root: Path | None = None, *, datasets: bool = True, progress: bool = True):
        self.hub_root, self.root = Path(hub_root), Path(root or release_dir())
        self.key, self.index = release_key(self.root, datasets=datasets)
        self.with_datasets, self.progress = datasets, progress
        self.pending: list[str] = []  # tasks whose dataset repo is still to make
        self.from_cache: list[str] = []
        self.marker: dict | None = None
        self.reused = False
        self._pins: dict[str, list] = {}  # task -> the splits each released config.json pins
        self._sources: dict[str, str] | None = None

    def models(self) -> list[str]:
        """The model repos, checked against the release's index and written; returns `pending` (a copy)."""
        if is_prepared(self.hub_root, self.key):
            self.reused, self.marker = True, read_marker(self.hub_root)
            return []
        from tqdm.auto import tqdm

        hub_root, root, index = self.hub_root, self.root, self.index
        hub_root.mkdir(parents=True, exist_ok=True)
        (hub_root / RELEASE_MARKER).unlink(missing_ok=True)  # an interrupted preparation is never taken as done
        for kind in ("models", "datasets"):
            remove_staged(hub_root / kind / ORG)  # what an interrupted preparation left staged
        version, names = index["version"], sorted(index["entries"])
        tasks = release_tasks(root, index) if self.with_datasets else []
        if self.progress:
            print(f"preparing the local hub {hub_root} for release {version} (once per release): "
                  f"{len(names)} model repos, {len(tasks)} dataset repos", file=sys.stderr, flush=True)
        self.marker = {"key": self.key, "version": version, "org": ORG, "models": {}, "datasets": {}}
        with tqdm(total=len(names), unit="repo", disable=not self.progress, file=sys.stderr,
                  desc="model repos") as bar:
            for name in names:
                bar.set_postfix_str(name)
                files = released_files(root / name, index["entries"][name])  # read once, checked against the index
                config = json.loads(files["config.json"])
                self._pins.setdefault(config["entry"]["task"], []).append(pinned_splits(config.get("task")))
                self.marker["models"][name] = commit(hub_root, f"{ORG}/{name}", "model", files, self._message,
                                                     version)
                bar.update()
        self.pending = list(tasks)
        return list(tasks)

    @property
    def _message(self) -> str:
        return f"icl-zoo release {self.index['version']}"

    def dataset(self, task: str) -> str:
        """Make the dataset repo of `task` (one of `pending`), from the cache when it checks out; its commit."""
        if task not in self.pending:
            raise ValueError(f"{task} is not a dataset repo this preparation has still to make")
        if self._sources is None:
            self._sources = dataset_sources()
        files, cached = dataset_repo_files(task, self._sources, agreed(self._pins.get(task)))
        sha = commit(self.hub_root, f"{ORG}/{task}", "dataset", files, self._message, self.index["version"])
        self.marker["datasets"][task] = sha
        if cached:
            self.from_cache.append(task)
        self.pending.remove(task)
        return sha

    def datasets(self) -> None:
        """Every pending dataset repo, with a progress bar."""
        from tqdm.auto import tqdm

        with tqdm(total=len(self.pending), unit="repo", disable=not self.progress or not self.pending,
                  file=sys.stderr, desc="dataset repos") as bar:
            for task in list(self.pending):
                bar.set_postfix_str(task)
                self.dataset(task)
                bar.update()

    def finish(self) -> dict:
        """Write the marker (every repo made); returns it as `prepare` does."""
        if self.reused:
            return {**self.marker, "reused": True}
        if self.marker is None or self.pending:
            raise RuntimeError(f"the local hub {self.hub_root} is not prepared yet: "
                               f"{', '.join(self.pending) or 'its model repos'} still to make")
        marker = {**self.marker, "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}
        tmp = self.hub_root / f"{RELEASE_MARKER}.tmp"
        tmp.write_text(json.dumps(marker, indent=1, sort_keys=True))
        os.replace(tmp, self.hub_root / RELEASE_MARKER)
        return {**marker, "datasets_from_cache": list(self.from_cache), "reused": False}


def dataset_repo_files(task: str, sources: dict[str, str], pinned: dict | None) -> tuple[dict[str, bytes], bool]:
    """(files, from the cache?) of `task`'s dataset repo: the cached ones when they check against `pinned` (the
    splits the release pins), else built (torch) and kept in the cache."""
    key = dataset_key(task, sources)
    files = cached_dataset(task, key, pinned)
    if files is not None:
        return files, True
    files = build_dataset(task)
    store_dataset(task, key, files, pinned)
    return files, False


def agreed(pins: list | None) -> dict | None:
    """The splits every released entry of a task pins, when they all pin the same (else None: nothing to check
    a cached dataset repo against, so it is rebuilt)."""
    return pins[0] if pins and all(p == pins[0] for p in pins) else None


def released_files(folder: Path, row: dict) -> dict[str, bytes]:
    """A released entry's files, each read once and checked against its index row (the trust root), as bytes."""
    reader = verify_folder(folder, row)
    names = [*row["files"], *([".gitattributes"] if (folder / ".gitattributes").is_file() else [])]
    return {n: reader.read(n) for n in names}


def commit(hub_root: Path, repo_id: str, repo_type: str, files: dict[str, bytes], message: str, version: str) -> str:
    """`files` as the release's commit of `repo_id`, tagged `version`; returns the commit's sha. A repo that does
    not exist yet is written directly (zoo.publishing.hub_git); one an earlier release prepared gets a new commit
    on its history through git, as `zoo publish` makes one."""
    import tempfile

    from zoo.publishing.hub import local_repo_path, publish_local, tag_local

    repo = local_repo_path(hub_root, repo_id, repo_type)
    if not os.path.lexists(repo):
        return write_new_repo(repo, files, message=message, tag=version)
    with tempfile.TemporaryDirectory() as tmp:
        for rel, data in files.items():
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_bytes(data)
        sha = publish_local(Path(tmp), repo_id, repo_type=repo_type, root=hub_root, message=message)
    tag_local(hub_root, repo_id, version, repo_type=repo_type)
    return sha


def build_dataset(task: str) -> dict[str, bytes]:
    """A task's dataset repo files, made from its frozen splits (zoo.publishing.hub.dataset_folder: torch)."""
    import tempfile

    from zoo.publishing.hub import dataset_folder, publishable_files

    with tempfile.TemporaryDirectory() as tmp:
        folder, _ = dataset_folder(task, Path(tmp) / task, cached_parquet=frozen_parquet)  # the file load_split keeps
        return {rel.as_posix(): p.read_bytes() for p, rel in publishable_files(folder)}


def frozen_parquet(task: str, split: str, n: int, sha256: str) -> bytes | None:
    """The parquet of `task`'s frozen split `split` as the frozen-split cache holds it (zoo.science.tasks.frozen's
    load_split writes `<cache>/datasets/<task>/<split>/data.parquet` through `datasets`), when it reads as `datasets`
    reads it (split_identity) to `n` tasks of content hash `sha256`; else None, and the caller writes it. A dataset
    repo's parquet is then that file's bytes, not a second write of the same arrays through `datasets`."""
    try:
        data = read_capped(cache_dir() / "datasets" / safe_name(task) / split / "data.parquet")
        return data if split_identity(data) == (n, sha256) else None
    except Exception:  # missing, unreadable, another schema (pyarrow has its own error types): written afresh
        return None


# ---------------------------------------------------------------- the dataset repos' cache
# A dataset repo needs torch (the registry, the frozen splits' generators) and seconds of work; its files are
# kept in `<cache>/hub-datasets/<task>/<key>/`, keyed by what makes them, so that preparing an empty hub dir
# again (a new --dir, a removed hub) takes them from there. The cache is untrusted input: an entry is used
# only when it holds exactly the expected regular files (no symlink followed, each size-capped), every split's
# parquet reads as `datasets` reads it (split_identity) to the content hash and task count that the release
# pins (config.json's task, itself hash-checked against release/index.json), hashes.json records exactly those,
# and the card quotes those hashes and no others. The card's prose is not checked beyond that: nothing pins it
# without rendering it, which needs torch. Entries are written whole (zoo.storage.atomic.replace_folder), and a
# task's entries of other keys are removed.
DATASET_CACHE = "hub-datasets"
MAX_CACHED_FILE = 1 << 30  # bytes of one cached file read into memory (a 10,000-task split is a few MB)
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def dataset_sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): _sha256(p) for pattern in DATASET_SOURCES for p in sorted(PACKAGE.glob(pattern))}


def dataset_key(task: str, sources: dict[str, str]) -> str:
    """What a task's dataset repo is made from: the task, the zoo's version (the card's revision) and the sources."""
    doc = {"format": 1, "zoo": __version__, "task": task, "sources": sources}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def pinned_splits(task: dict | None) -> dict | None:
    """{split: {"sha256", "n", "seed"}} as a released config.json's task records them; None when it does not."""
    try:
        pinned = {str(s): {"sha256": v["sha256"], "n": v["n"], "seed": v["seed"]} for s, v in task["splits"].items()}
    except (KeyError, TypeError, AttributeError):
        return None
    ok = all(isinstance(p["sha256"], str) and SHA256.match(p["sha256"]) and type(p["n"]) is int
             and type(p["seed"]) is int and safe_split(s) for s, p in pinned.items())
    return pinned if ok and pinned else None


def safe_split(name: str) -> bool:
    return re.fullmatch(r"[a-z][a-z0-9_]{0,31}", name) is not None


def cache_folder(task: str, key: str) -> Path:
    return cache_dir() / DATASET_CACHE / safe_name(task) / key


def dataset_paths(pinned: dict) -> set[str]:
    return {"README.md", "hashes.json", *(f"data/{s}-00000-of-00001.parquet" for s in pinned)}


def cached_dataset(task: str, key: str, pinned: dict | None) -> dict[str, bytes] | None:
    """The cached files of `task`'s dataset repo, checked (see above); None when there is no usable entry
    (a refused one is said in one line on stderr, then rebuilt)."""
    if pinned is None:
        return None
    folder = cache_folder(task, key)
    if not os.path.lexists(folder):
        return None
    try:
        files = read_tree(folder, dataset_paths(pinned))
        check_dataset(task, files, pinned)
    except Exception as e:  # anything a hostile entry makes the parsers raise (pyarrow has its own types): rebuild
        print(f"warning: the cached dataset repo {folder} is not used ({str(e)[:300]}); rebuilding it",
              file=sys.stderr, flush=True)
        return None
    return files


def read_tree(folder: Path, expected: set[str]) -> dict[str, bytes]:
    """Exactly the files `expected` ("a/b" paths) of `folder`, read without following any symlink, each
    capped at MAX_CACHED_FILE; anything else there (a symlink, a FIFO, another file) refuses the folder."""
    base = cache_dir() / DATASET_CACHE
    parts = folder.relative_to(base).parts
    for p in (base.joinpath(*parts[:i]) for i in range(len(parts) + 1)):  # the cache's folders down to the entry
        if p.is_symlink():
            raise ValueError(f"{p} is a symbolic link")
    found: dict[str, bytes] = {}

    def walk(d: Path, prefix: str) -> None:
        with os.scandir(d) as entries:
            for e in entries:
                rel = prefix + e.name
                if e.is_symlink():
                    raise ValueError(f"{rel} is a symbolic link")
                if e.is_dir(follow_symlinks=False):
                    walk(Path(e.path), rel + "/")
                elif e.is_file(follow_symlinks=False) and rel in expected:
                    found[rel] = read_capped(Path(e.path))
                else:
                    raise ValueError(f"{rel} is not one of the files a dataset repo holds")

    walk(folder, "")
    missing = sorted(expected - set(found))
    if missing:
        raise ValueError(f"{missing[0]} is missing")
    return found


def read_capped(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))  # a FIFO swapped in never blocks
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        data = f.read(MAX_CACHED_FILE + 1)
    if len(data) > MAX_CACHED_FILE:
        raise ValueError(f"{path.name} is larger than {MAX_CACHED_FILE} bytes")
    return data


def check_dataset(task: str, files: dict[str, bytes], pinned: dict) -> None:
    """ValueError unless `files` are a dataset repo of `task` whose data is what `pinned` says (see above)."""
    for split, pin in pinned.items():
        n, sha = split_identity(files[f"data/{split}-00000-of-00001.parquet"])
        if (n, sha) != (pin["n"], pin["sha256"]):
            raise ValueError(f"data/{split}: content hash {sha} over {n} tasks; the release pins {pin['sha256']} "
                             f"over {pin['n']}")
    if json.loads(files["hashes.json"]) != {"task": task, "splits": pinned}:
        raise ValueError("hashes.json does not record the hashes the release pins")
    quoted = set(re.findall(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])", files["README.md"].decode("utf-8")))
    if quoted != {p["sha256"] for p in pinned.values()}:
        raise ValueError("the card does not quote exactly the hashes the release pins")


def split_identity(parquet: bytes) -> tuple[int, str]:
    """(tasks, content hash) of a frozen split's parquet, checked to read as `datasets` reads it: exactly the
    columns x and y, each a float32 Array2D of one shape (every row and every inner list of the same length,
    no nulls) as its `huggingface` schema metadata declares, and nothing else in that metadata. The torch-free
    twin of zoo.science.tasks.frozen's read_parquet_arrays and content_hash (that module imports torch):
    sha256(b"icl-zoo/frozen/v1" ‖ for x, y: shape as little-endian int64s ‖ C-order little-endian float32)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = pq.ParquetFile(pa.BufferReader(parquet))
    if file.schema_arrow.names != ["x", "y"]:
        raise ValueError(f"columns {file.schema_arrow.names}, not x and y")
    table = file.read(use_threads=False)
    h = hashlib.sha256(b"icl-zoo/frozen/v1")
    n, features = table.num_rows, {}
    for name in ("x", "y"):
        column = table.column(name).combine_chunks()
        if isinstance(column.type, pa.ExtensionType):  # datasets' Array2D, where datasets is imported
            column = column.storage
        if not (pa.types.is_list(column.type) and pa.types.is_list(column.type.value_type)
                and column.type.value_type.value_type == pa.float32()):
            raise ValueError(f"column {name} is {column.type}, not the float32 Array2D of a frozen split")
        inner = column.flatten()
        values = inner.flatten()
        rows = len(inner) // n if n else 0
        cols = len(values) // len(inner) if len(inner) else 0
        for lists, size in ((column, rows), (inner, cols)):  # a ragged row would read otherwise than it hashes
            lengths = np.diff(_numpy(lists.offsets, "<i4"))
            if lists.null_count or (lengths != size).any():
                raise ValueError(f"column {name} is not {rows} × {cols} in every row")
        if values.null_count:
            raise ValueError(f"column {name} has nulls")
        a = _numpy(values, "<f4").reshape(n, rows, cols)
        h.update(np.asarray(a.shape, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(a, dtype="<f4"))
        features[name] = {"shape": [rows, cols], "dtype": "float32", "_type": "Array2D"}
    metadata = file.schema_arrow.metadata or {}
    if set(metadata) != {b"huggingface"} or json.loads(metadata[b"huggingface"]) != {"info": {"features": features}}:
        raise ValueError("its schema metadata does not declare exactly its two float32 Array2D features")
    return n, h.hexdigest()


def _numpy(array, dtype: str):
    """A null-free primitive Arrow array's values, without a copy. Not `Array.to_numpy`, whose first call imports
    pandas (0.5 s of a cold start's budget)."""
    import numpy as np

    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * np.dtype(dtype).itemsize)


def store_dataset(task: str, key: str, files: dict[str, bytes], pinned: dict | None) -> None:
    """Keep a dataset repo's files in the cache for the next empty hub dir (written whole, the task's older
    keys removed); only when they record the hashes the release pins (else the next check would refuse them).
    A cache that cannot be written (read-only, full) is said in one line; the preparation goes on."""
    from zoo.storage.atomic import replace_folder

    try:
        if pinned is None or json.loads(files["hashes.json"]) != {"task": task, "splits": pinned}:
            return
        folder = cache_folder(task, key)
        base = cache_dir() / DATASET_CACHE
        if any(p.is_symlink() for p in (base, base / task)):
            raise OSError(f"{base / task} is a symbolic link; not writing through it")
        if folder.is_symlink() or folder.is_file():  # replaced, never written through (replace_folder follows links)
            folder.unlink()

        def write(staged: Path) -> None:
            for rel, data in files.items():
                (staged / rel).parent.mkdir(parents=True, exist_ok=True)
                (staged / rel).write_bytes(data)

        replace_folder(folder, write, keep=lambda name: False)
        for old in folder.parent.iterdir():  # one entry a task: the key that made the release just prepared
            if old.name != key and SHA256.match(old.name) and old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        print(f"warning: could not keep the dataset repo of {task} in the cache ({e})", file=sys.stderr, flush=True)
