"""The release on a hub: every released folder as model repo `<org>/<entry>` and each task's frozen splits
as dataset repo `<org>/<task>`, tagged with the release version, on the local hub or a real Hub."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.utils import HfHubHTTPError

from zoo.publishing.hub import dataset_folder, publish_hub
from zoo.publishing.hub_prepare import (
    agreed,
    commit,
    dataset_repo_files,
    dataset_sources,
    pinned_splits,
    released_files,
)
from zoo.science.registry import get_entry
from zoo.storage.locate import ORG, read_index, release_dir, validate_repo_id, verify_folder


def import_to_hub(hub_root: Path, root: Path | None = None, *, only: list[str] | None = None, datasets: bool = True,
                  progress: bool = True) -> dict:
    """Publish every released folder as model repo `icl-zoo/<entry>` and each task's frozen splits as
    dataset repo `icl-zoo/<task>` on the local hub at `hub_root`, each tagged with the release version.

    As `zoo hub serve` prepares its hub (zoo.publishing.hub_prepare): each released file read once and checked
    against the release's index, a new repo written in-process (no git processes), a dataset repo taken from the
    zoo's cache when it checks against the hashes the release pins; a repo that exists gets a new commit through
    git, its history kept."""
    root = Path(root or release_dir())
    index = read_index(root)
    version = index["version"]
    message = f"icl-zoo release {version}"
    revisions = {"models": {}, "datasets": {}}
    pins: dict[str, list] = {}  # task -> the splits each imported entry's config.json pins
    entries = {n: r for n, r in sorted(index["entries"].items()) if only is None or n in only}
    for name, row in entries.items():
        files = released_files(root / name, row)
        config = json.loads(files["config.json"])
        pins.setdefault(config["entry"]["task"], []).append(pinned_splits(config.get("task")))
        revisions["models"][name] = commit(hub_root, f"{ORG}/{name}", "model", files, message, version)
    if datasets:
        sources = dataset_sources()
        for task in sorted(pins):
            files, _ = dataset_repo_files(task, sources, agreed(pins[task]))
            revisions["datasets"][task] = commit(hub_root, f"{ORG}/{task}", "dataset", files, message, version)
    if progress:
        print(f"imported release {version}: {len(revisions['models'])} model repos, "
              f"{len(revisions['datasets'])} dataset repos into {hub_root}", flush=True)
    return revisions


def publish_release(org: str, *, hub: str = "hf", root: Path | None = None, token: str | None = None,
                    datasets: bool = True, progress: bool = True) -> dict:
    """Push every released folder (and each task's frozen splits) to a real Hub as `<org>/<name>`,
    tag each with the release version and list them in a Hub Collection."""
    root = Path(root or release_dir())
    index = read_index(root)
    version = index["version"]
    endpoint = None if hub in ("hf", "huggingface") else hub
    api = HfApi(endpoint=endpoint, token=token)
    pushed = []

    def tag(repo: str, kind: str) -> None:  # the version tag points at what was just pushed, moved if it existed
        try:
            api.create_tag(repo, tag=version, repo_type=kind)
        except HfHubHTTPError as e:
            if e.response is None or e.response.status_code != 409:
                raise
            api.delete_tag(repo, tag=version, repo_type=kind)
            api.create_tag(repo, tag=version, repo_type=kind)

    for name, row in sorted(index["entries"].items()):
        repo = validate_repo_id(f"{org}/{name}")
        verify_folder(root / name, row)
        publish_hub(root / name, repo, endpoint=endpoint, token=token, message=f"icl-zoo release {version}")
        tag(repo, "model")
        pushed.append((repo, "model"))
        if progress:
            print(f"  pushed {repo}@{version}", flush=True)
    if datasets:
        for task in sorted({get_entry(n).task for n in index["entries"]}):
            repo = validate_repo_id(f"{org}/{task}")
            with tempfile.TemporaryDirectory() as tmp:
                folder, _ = dataset_folder(task, Path(tmp) / task, repo=repo, revision=version)  # the card's own id and tag
                publish_hub(folder, repo, repo_type="dataset", endpoint=endpoint, token=token,
                            message=f"icl-zoo release {version}")
            tag(repo, "dataset")
            pushed.append((repo, "dataset"))
    collection = api.create_collection(
        title=f"icl-zoo {version}", namespace=org, exists_ok=True,
        description="In-context learning by gradient descent: every icl-zoo entry's checkpoint and frozen datasets.",
    )
    for repo, kind in pushed:
        api.add_collection_item(collection.slug, item_id=repo, item_type=kind, exists_ok=True)
    return {"version": version, "collection": collection.slug, "repos": [r for r, _ in pushed]}
