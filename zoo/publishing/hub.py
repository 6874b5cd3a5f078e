"""Hub I/O: publish checkpoints and frozen datasets to the real Hugging Face Hub or to a local
hub, serve the local hub with the zoo's read-only hub server, and pull through the ordinary `huggingface_hub` clients.

Local hub: a directory of git repositories laid out like the Hub,

    <root>/models/<org>/<name>     branch main, one commit per publish (history kept)
    <root>/datasets/<org>/<name>

served by `zoo.publishing.hub_server` (a purpose-built, read-only Hugging Face–compatible server over the repos'
git history) on loopback: only valid ids of repos inside the root get through. Then
`snapshot_download(repo_id, endpoint=...)`, `hf_hub_download` and
`datasets.load_dataset(repo_id)` work unchanged. huggingface_hub reads HF_ENDPOINT at import
time, so this module always passes `endpoint=` explicitly.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from zoo.science.paths import cache_dir
from zoo.storage.atomic import writing
from zoo.storage.locate import HubError, validate_repo_id

REPO_TYPES = ("model", "dataset")
NEVER_PUBLISHED = (".train", ".git", ".cache")  # training state and VCS/cache internals stay local


def default_local_hub() -> Path:
    return Path(os.environ.get("ICL_ZOO_LOCAL_HUB") or cache_dir() / "hub")


# ---------------------------------------------------------------- local hub
def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "icl-zoo", "GIT_AUTHOR_EMAIL": "icl-zoo@localhost",
        "GIT_COMMITTER_NAME": "icl-zoo", "GIT_COMMITTER_EMAIL": "icl-zoo@localhost",
    }
    out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        said = " ".join(out.stderr.split())[:300]  # one line, however many git wrote
        raise HubError(f"git {' '.join(args)} failed in {cwd}: {said}")
    return out.stdout.strip()


@contextmanager
def preparing(root: Path):
    """Hold the local hub `root` while it is prepared (its repos created and committed): a second
    `zoo hub serve` on the same folder says in one line that it waits, then finds it prepared."""

    def waiting(holder: str) -> None:
        print(f"waiting for {holder}, which is preparing the local hub {root}", file=sys.stderr, flush=True)

    with writing(root, what="zoo hub serve", wait=True, waiting=waiting):
        yield


def local_repo_path(root: Path, repo_id: str, repo_type: str = "model") -> Path:
    if repo_type not in REPO_TYPES:
        raise HubError(f"repo_type must be one of {REPO_TYPES}, got {repo_type!r}")
    org, name = validate_repo_id(repo_id).split("/")
    path = (Path(root) / f"{repo_type}s" / org / name).resolve()
    if Path(root).resolve() not in path.parents:  # belt and braces against traversal
        raise HubError(f"repo id {repo_id!r} escapes the local hub {root}")
    return path


def publishable_files(folder: Path):
    """The files of `folder` to publish; a symlink or special file is refused, never followed."""
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if any(part in NEVER_PUBLISHED for part in rel.parts):
            continue
        if p.is_symlink():
            raise HubError(f"{p} is a symbolic link; refusing to publish it (copy the file in instead)")
        if p.is_file():
            yield p, rel
        elif not p.is_dir():
            raise HubError(f"{p} is not a regular file; refusing to publish it")


def publish_local(folder: Path, repo_id: str, *, repo_type: str = "model", root: Path | None = None,
                  message: str | None = None) -> str:
    """Commit `folder` as the new revision of `repo_id` on branch main; returns the commit sha.

    The previous revisions stay in the history: nothing is overwritten silently.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise HubError(f"{folder} is not a folder")
    root = Path(root) if root else default_local_hub()
    repo = local_repo_path(root, repo_id, repo_type)
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q", "-b", "main")
    files = list(publishable_files(folder))  # refuses symlinks before anything in the repo changes
    for tracked in _git(repo, "ls-files", "-z").split("\0"):
        if tracked:
            (repo / tracked).unlink(missing_ok=True)
    for src, rel in files:
        dst = repo / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    _git(repo, "add", "-A")
    if not _git(repo, "status", "--porcelain"):
        return _git(repo, "rev-parse", "HEAD")  # identical content: no empty revision
    _git(repo, "commit", "-q", "-m", message or f"Publish {repo_id} from {folder.name}")
    return _git(repo, "rev-parse", "HEAD")


def tag_local(root: Path, repo_id: str, tag: str, *, repo_type: str = "model") -> None:
    """Point tag `tag` of a local-hub repo at its current main (moved if it existed)."""
    _git(local_repo_path(root, repo_id, repo_type), "tag", "-f", tag)


# ---------------------------------------------------------------- real hub
def publish_hub(folder: Path, repo_id: str, *, repo_type: str = "model", endpoint: str | None = None,
                token: str | None = None, private: bool = False, message: str | None = None) -> str:
    """create_repo(exist_ok=True) + upload_folder on the Hub at `endpoint`; returns the commit sha."""
    from huggingface_hub import HfApi

    validate_repo_id(repo_id)
    api = HfApi(endpoint=endpoint, token=token)
    api.create_repo(repo_id, repo_type=repo_type, exist_ok=True, private=private)
    info = api.upload_folder(
        folder_path=str(folder), repo_id=repo_id, repo_type=repo_type,
        commit_message=message or f"Publish {repo_id} with icl-zoo",
        ignore_patterns=[f"{d}/**" for d in NEVER_PUBLISHED],
    )
    return info.oid


def publish(folder: Path, repo_id: str, *, hub: str = "local", repo_type: str = "model", **kwargs) -> str:
    """`hub="local"` (the local hub, optionally `root=`) or a Hub URL / "hf" for huggingface.co."""
    if hub == "local":
        return publish_local(folder, repo_id, repo_type=repo_type, **kwargs)
    endpoint = None if hub in ("hf", "huggingface") else hub
    return publish_hub(folder, repo_id, repo_type=repo_type, endpoint=endpoint, **kwargs)


# ---------------------------------------------------------------- frozen datasets as dataset repos
def dataset_card_data(task_name: str, spec, hashes: dict, shapes: dict) -> dict:
    """A dataset card's metadata, as the Hub reads it: its name, task category and size, the parquet files of each
    split (`configs`), and `dataset_info` (features as `datasets` writes them: two float32 Array2D columns; each
    split's example count and bytes)."""
    # deferred: datasets is heavy, and `zoo hub serve` imports this module without writing a dataset card
    from datasets import Array2D, DatasetInfo, Features, SplitDict, SplitInfo

    total = sum(h["n"] for h in hashes.values())
    size = next(label for bound, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                                          (1_000_000, "100K<n<1M")) if total < bound) if total < 1_000_000 else "n>1M"
    features = Features({name: Array2D(shapes[name], "float32") for name in ("x", "y")})
    splits = SplitDict()
    for split, h in hashes.items():
        splits.add(SplitInfo(name=split, num_examples=h["n"], num_bytes=h["n"] * shapes["row_bytes"]))
    info = DatasetInfo(features=features, splits=splits)._to_yaml_dict()
    info["dataset_size"] = total * shapes["row_bytes"]
    regression = getattr(spec, "kind", None) == "linear_regression"
    return {
        "license": "apache-2.0",
        "pretty_name": f"icl-zoo frozen {'in-context regression' if regression else 'teacher–student'} tasks: {task_name}",
        # each row is numbers in, numbers out: a regression over a table of examples (a teacher's sequences: other)
        "task_categories": ["tabular-regression" if regression else "other"],
        "size_categories": [size],
        "tags": ["icl-zoo", "in-context-learning"],
        "configs": [{"config_name": "default",
                     "data_files": [{"split": s, "path": f"data/{s}-*.parquet"} for s in spec.splits]}],
        "dataset_info": info,
    }


def dataset_folder(task_name: str, out: Path, *, repo: str | None = None, revision: str | None = None,
                   cached_parquet: Callable[[str, str, int, str], bytes | None] | None = None) -> tuple[Path, dict]:
    """A Hub dataset repo folder for a task's frozen splits: parquet per split, hashes, card. The card's
    examples load `repo` (default `icl-zoo/<task>`) at `revision` (default the release's tag). `cached_parquet`
    (task, split, tasks, sha256) → a split's parquet bytes, already checked, or None: the hub's preparation passes
    its checked read of the frozen-split cache (hub_prepare.frozen_parquet); otherwise each split is written."""
    import yaml  # deferred with the rest of a dataset publish

    from zoo.publishing.leaderboard import leaderboard_url
    from zoo.science.registry import get_task_spec
    from zoo.science.tasks.frozen import load_split, save_split
    from zoo.storage.locate import ORG, VERSION

    spec = get_task_spec(task_name)
    out = Path(out)
    hashes = {}
    for split in spec.splits:
        s = load_split(task_name, split, spec=spec)
        (out / "data").mkdir(parents=True, exist_ok=True)
        dst = out / "data" / f"{split}-00000-of-00001.parquet"
        cached = cached_parquet(task_name, split, int(s.x.shape[0]), s.sha256) if cached_parquet else None
        if cached is not None:
            dst.write_bytes(cached)
        else:
            tmp = out / "_tmp"
            save_split(s.x, s.y, tmp)
            os.replace(tmp / "data.parquet", dst)
            shutil.rmtree(tmp)
        hashes[split] = {"sha256": s.sha256, "n": int(s.x.shape[0]), "seed": spec.splits[split].seed}
        shapes = f"x {tuple(s.x.shape[1:])} and y {tuple(s.y.shape[1:])} per row"
        shapes_of = {"x": tuple(s.x.shape[1:]), "y": tuple(s.y.shape[1:]), "row_bytes": (s.x[0].nbytes + s.y[0].nbytes)}
    (out / "hashes.json").write_text(json.dumps({"task": task_name, "splits": hashes}, indent=2))
    repo, revision = repo or f"{ORG}/{task_name}", revision or VERSION
    test_sha256 = hashes.get("test", {}).get("sha256", "")
    hash_rows = "\n".join(f"| {s} | {h['n']} | {h['seed']} | `{h['sha256']}` |" for s, h in hashes.items())
    front_matter = yaml.safe_dump(dataset_card_data(task_name, spec, hashes, shapes_of), sort_keys=False,
                                  allow_unicode=True)
    (out / "README.md").write_text(f"""---
{front_matter}---

# Frozen in-context regression tasks: `{task_name}`

{spec.description}

Leaderboard: [`{task_name}`]({leaderboard_url(task_name)}) ranks the zoo's released models, GD and least squares on the test split; `zoo leaderboard {task_name} --add NAME=MODEL` places yours.

Each row is one task: `x` (C+1, d_x) inputs, the last one the query, and `y` (C+1, d_y) targets.
Generated by icl-zoo from fixed seeds. The identity of a split is the SHA-256 of its canonical
float32 arrays (see `zoo/science/tasks/frozen.py`), checked on every load:

| split | tasks | seed | SHA-256 |
|---|---|---|---|
{hash_rows}

With `datasets` alone, pinned to the release's revision:

```python
from datasets import load_dataset

test = load_dataset("{repo}", revision="{revision}", split="test").with_format("numpy")[:]
x, y = test["x"], test["y"]  # float32 arrays, {shapes}; a model card says how they become tokens
```

With the zoo, which also checks the split's SHA-256 and refuses a mismatch:

```python
from zoo.science.tasks.frozen import load_split_from_hub

split = load_split_from_hub("{repo}", split="test", revision="{revision}",
                            expected_sha256="{test_sha256}")
```
""")
    return out, hashes


# ---------------------------------------------------------------- serve
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_config(root: Path, port: int, workdir: Path) -> Path:
    """The hub server's TOML ([basic] host, port, mirrors-path = [ROOT]) in `workdir`."""
    q = lambda path: json.dumps(Path(path).resolve().as_posix(), ensure_ascii=False)  # a TOML basic string
    cfg = workdir / "hub.toml"
    cfg.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {int(port)}\n'
        f"repos-path = {q(workdir / 'repos')}\n"
        f'mirror-netloc = "127.0.0.1:{int(port)}"\nmirror-lfs-netloc = "127.0.0.1:{int(port)}"\n'
        f"mirrors-path = [{q(root)}]\n"
        "[accessibility]\noffline = true\n"
    )
    return cfg


def check_port_free(port: int) -> None:
    """Refuse a port another server holds: it would answer our health check and we would say "serving"."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as e:
            raise HubError(f"port {port} on 127.0.0.1 is already in use ({e.strerror}); choose another with --port") from None


def start_server(root: Path | None = None, port: int | None = None, *, timeout: float = 60.0,
                 log: Path | None = None, meanwhile: Callable[[], list[str] | None] | None = None
                 ) -> tuple[subprocess.Popen, str]:
    """Start the hub server (`python -m zoo.publishing.hub_server`) over the local hub on 127.0.0.1; returns
    (process, endpoint) once it answers. It serves only GET/HEAD (and the read-only paths-info POST) for a
    valid `ORG/NAME` git repo inside `root` (made absolute here), with a plain revision and file path.

    `meanwhile()` (e.g. preparing the release's model repos) runs while the server process starts, which listens
    only once it has returned: the server's start (about half a second of imports) is not added to the
    preparation's. It returns the keys of the repos it leaves to be prepared afterwards ("datasets/ORG/NAME",
    zoo.publishing.hub_server.pending_key; COLLECTION_KEY for the release's marker), or None: the server holds a
    request for one of them until `announce(proc, "ready", key)` (or answers 503 after `announce(proc, "failed",
    key, why)`), and `done_announcing(proc)` says that no more will come (whatever is still pending has failed)."""
    root = (Path(root) if root else default_local_hub()).resolve()
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    check_port_free(port)
    workdir = Path(tempfile.mkdtemp(prefix="icl-zoo-hub-"))
    cfg = server_config(root, port, workdir)
    log_file = open(log or workdir / "hub.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.publishing.hub_server", "--config", str(cfg), "--log-path", str(workdir / "logs"),
         *(["--hold"] if meanwhile else [])],
        cwd=workdir, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.PIPE if meanwhile else None,
    )
    proc.workdir = workdir  # removed by stop_server
    endpoint = f"http://127.0.0.1:{port}"
    try:
        if meanwhile:
            later = list(meanwhile() or ())
            try:
                proc.stdin.write(b"".join(b"pending %s\n" % _key(k) for k in later) + b"serve\n")
                proc.stdin.flush()
                if not later:
                    proc.stdin.close()
            except BrokenPipeError:  # it exited while starting: _wait_until_up says how, from its log
                pass
        return _wait_until_up(proc, endpoint, log_file, timeout)
    except BaseException:  # Ctrl-C / SIGTERM while starting: the server and its temp folder go too
        stop_server(proc)
        raise


def _key(key: str) -> bytes:
    if not key or any(c.isspace() for c in key):
        raise ValueError(f"{key!r} is not a pending repo's key")
    return key.encode()


def announce(proc: subprocess.Popen, state: str, key: str, reason: str = "") -> bool:
    """Tell the server started with `meanwhile` that the repo `key` it holds requests for is "ready", or has
    "failed" (`reason`: said in one line to whoever asked for it). False when the server has gone."""
    if state not in ("ready", "failed"):
        raise ValueError(f"state must be 'ready' or 'failed', got {state!r}")
    line = b"%s %s" % (state.encode(), _key(key))
    if state == "failed":
        line += b" " + " ".join(reason.split()).encode("utf-8", "replace")
    try:
        proc.stdin.write(line + b"\n")
        proc.stdin.flush()
        return True
    except (BrokenPipeError, ValueError, AttributeError):  # exited, or its input already closed / never opened
        return False


def done_announcing(proc: subprocess.Popen) -> None:
    """No more announcements: what the server still holds as pending has failed."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except BrokenPipeError:
        pass


def _wait_until_up(proc, endpoint: str, log_file, timeout: float):
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HubError(f"the hub server exited with code {proc.returncode}:\n{Path(log_file.name).read_text()[-2000:]}")
        try:
            urllib.request.urlopen(endpoint + "/api/models/zoo-health/check", timeout=1)
            return proc, endpoint
        except urllib.error.HTTPError:
            return proc, endpoint  # it answered (404 for the unknown repo): up
        except OSError:
            time.sleep(0.02)  # it listens within a few ms of its imports: a coarse poll would add to every start
    raise HubError(f"the hub server did not answer on {endpoint} within {timeout:.0f}s")


def stop_server(proc: subprocess.Popen) -> None:
    """Stop the hub server and remove its temporary folder (config, logs)."""
    done_announcing(proc)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    workdir = getattr(proc, "workdir", None)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def serve(root: Path | None = None, port: int | None = None):
    """Context manager: the local hub served by `zoo.publishing.hub_server`; yields the endpoint URL."""
    proc, endpoint = start_server(root, port)
    try:
        yield endpoint
    finally:
        stop_server(proc)
