"""Prepare a local hub for `zoo hub serve` once per release, and reuse it while the release is unchanged.

Preparing publishes every released folder as model repo `icl-zoo/<entry>` and each task's frozen
splits as dataset repo `icl-zoo/<task>` (zoo.publishing.hub.publish_local), each tagged with the release
version, with a progress bar; then it writes `<hub>/.icl-zoo-release.json`: the key it was
prepared for, the version and the repos' commits (the server lists them as the release's
Collection). The key is a SHA-256 of the release's index.json, the set of tasks, and the sources
that make the dataset repos (task definitions, generators and the dataset card): when it matches and
the repos are there, nothing is done and nothing heavy (torch, datasets) is imported, so the
endpoint answers about a second after launch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from zoo.publishing.hub_server import RELEASE_MARKER
from zoo.storage.locate import INDEX_JSON, ORG, read_index, release_dir
from zoo.version import __version__

PACKAGE = Path(__file__).parents[1]  # the package folder, zoo/
# What decides a dataset repo's bytes besides the task's name: its definition, its generator, its card.
DATASET_SOURCES = ("science/entries/*.toml", "science/tasks/*.py", "publishing/hub.py", "publishing/leaderboard.py", "science/paths.py")


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
        doc["sources"] = {str(p.relative_to(PACKAGE)): _sha256(p)
                          for pattern in DATASET_SOURCES for p in sorted(PACKAGE.glob(pattern))}
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
    "prepared_at", "reused"}. Reused (fast) when the release is the one last prepared."""
    hub_root, root = Path(hub_root), Path(root or release_dir())
    key, index = release_key(root, datasets=datasets)
    if is_prepared(hub_root, key):
        return {**read_marker(hub_root), "reused": True}
    return {**_prepare(hub_root, root, index, key, datasets=datasets, progress=progress), "reused": False}


def _prepare(hub_root: Path, root: Path, index: dict, key: str, *, datasets: bool, progress: bool) -> dict:
    import tempfile

    from tqdm.auto import tqdm

    hub_root.mkdir(parents=True, exist_ok=True)
    (hub_root / RELEASE_MARKER).unlink(missing_ok=True)  # an interrupted preparation is never taken as done
    version, names = index["version"], sorted(index["entries"])
    tasks = release_tasks(root, index) if datasets else []
    if progress:
        print(f"preparing the local hub {hub_root} for release {version} (once per release): "
              f"{len(names)} model repos, {len(tasks)} dataset repos", file=sys.stderr, flush=True)
    from zoo.publishing.hub import dataset_folder, publish_local, tag_local
    from zoo.storage.locate import verify_folder

    marker = {"key": key, "version": version, "org": ORG, "models": {}, "datasets": {}}
    message = f"icl-zoo release {version}"
    with tqdm(total=len(names) + len(tasks), unit="repo", disable=not progress, file=sys.stderr,
              desc="preparing") as bar:
        for name in names:
            bar.set_postfix_str(name)
            verify_folder(root / name, index["entries"][name])
            marker["models"][name] = publish_local(root / name, f"{ORG}/{name}", root=hub_root, message=message)
            tag_local(hub_root, f"{ORG}/{name}", version)
            bar.update()
        for task in tasks:
            bar.set_postfix_str(task)
            with tempfile.TemporaryDirectory() as tmp:
                folder, _ = dataset_folder(task, Path(tmp) / task)
                marker["datasets"][task] = publish_local(folder, f"{ORG}/{task}", repo_type="dataset",
                                                         root=hub_root, message=message)
            tag_local(hub_root, f"{ORG}/{task}", version, repo_type="dataset")
            bar.update()
    marker["prepared_at"] = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    tmp = hub_root / f"{RELEASE_MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=1, sort_keys=True))
    os.replace(tmp, hub_root / RELEASE_MARKER)
    return marker
