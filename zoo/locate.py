"""Where a checkpoint folder is: a local folder, a Hub repo id `ORG/NAME`, or a bare entry name of
the release shipped with the package (`release/index.json`), hash-verified against that index.

No torch, no registry: the streaming runtime (icl_zoo_export) resolves with this module alone.
`zoo.release.resolve` passes the registry's entry names, so that a registry entry that is not
released gets the registry's error, and `zoo.load` builds the model from what this returns.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Callable, Collection
from pathlib import Path

from zoo.manifest import CheckpointError, contained_file, sha256_file
from zoo.names import safe_name
from zoo.version import __version__

VERSION = f"v{__version__}"  # the git tag of every released repo on a hub
ORG = "icl-zoo"
INDEX_JSON, INDEX_MD = "index.json", "INDEX.md"
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class ReleaseError(ValueError):
    """An entry is not released, a released folder does not match the index, or a build failed."""


class HubError(ValueError):
    """A repo id is invalid, a hub is unreachable, or a publish/pull failed."""


def validate_repo_id(repo_id: str) -> str:
    if not isinstance(repo_id, str) or not REPO_ID.fullmatch(repo_id) or ".." in repo_id or repo_id.endswith((".git", ".")):
        raise HubError(
            f"invalid repo id {repo_id!r}: expected ORG/NAME with letters, digits, '-', '_', '.' "
            "(no '..', no leading '.', at most 96 characters each)"
        )
    return repo_id


def resolve_folder(repo_id: str, *, revision: str | None = None, endpoint: str | None = None,
                   cache_dir=None, token=None) -> Path:
    """The snapshot folder of Hub model repo `repo_id` (downloaded with huggingface_hub)."""
    from huggingface_hub import snapshot_download

    validate_repo_id(repo_id)
    return Path(snapshot_download(repo_id, revision=revision, endpoint=endpoint, cache_dir=cache_dir, token=token))


def release_dir() -> Path:
    """The shipped release: `zoo/_release` in an installed wheel, `release/` in a source tree
    (or the folder in $ICL_ZOO_RELEASE)."""
    if os.environ.get("ICL_ZOO_RELEASE"):
        return Path(os.environ["ICL_ZOO_RELEASE"])
    here = Path(__file__).parent
    for candidate in (here / "_release", here.parent / "release"):
        if (candidate / INDEX_JSON).is_file():
            return candidate
    return here.parent / "release"


def read_index(root: Path | None = None) -> dict:
    """The release index; every entry name in it is a safe name and every row lists its files."""
    path = Path(root or release_dir()) / INDEX_JSON
    if not path.is_file():
        return {"version": VERSION, "entries": {}}
    try:
        index = json.loads(path.read_text())
        for name, row in index["entries"].items():
            safe_name(name, "release entry")
            if row.get("entry") != name or not isinstance(row.get("files"), dict):
                raise ValueError(f"row {name!r} does not name itself or list its files")
            for file in row["files"]:
                safe_name(file.lower(), "released file")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, json.JSONDecodeError) as e:
        raise ReleaseError(f"{path}: not a valid release index ({type(e).__name__}: {str(e)[:200]})") from None
    return index


def verify_folder(folder: Path, row: dict) -> None:
    """Every file the index records for an entry is present, a regular file and has its hash; nothing else is there."""
    folder = Path(folder)
    recorded = row.get("files")
    if not isinstance(recorded, dict):
        raise ReleaseError(f"{folder}: its release index row lists no files")
    present = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    for name, digest in recorded.items():
        try:
            path = contained_file(folder, name)
        except CheckpointError as e:
            raise ReleaseError(str(e)) from None
        got = sha256_file(path)
        if got != digest:
            raise ReleaseError(f"{folder}: {name} has SHA-256 {got}, the release index records {digest}; refusing it")
    extra = sorted(present - set(recorded) - {".gitattributes"})
    if extra:
        raise ReleaseError(f"{folder}: files the release index does not list: {', '.join(extra)}")


def released_folder(name: str, *, revision: str | None = None, endpoint: str | None = None) -> Path:
    """The folder of the released checkpoint `name`, hash-verified against the shipped index.

    From the configured Hub (`endpoint`, or HF_ENDPOINT) when one is set, as repo `icl-zoo/<name>` at
    the release tag; otherwise from the release shipped with the package. Never builds anything."""
    index = read_index()
    row = index["entries"].get(name)
    endpoint = endpoint or os.environ.get("HF_ENDPOINT")
    if endpoint:
        if revision is None and row is None:  # nothing to check a download against: refuse, never trust it
            raise ReleaseError(f"{name!r} is not in the release shipped with this package, so its download from "
                               f"{endpoint} cannot be verified; load it as '{ORG}/{name}' with an explicit revision")
        folder = resolve_folder(f"{ORG}/{name}", revision=revision or index["version"], endpoint=endpoint)
        if row is not None and (revision or index["version"]) == index["version"]:
            verify_folder(folder, row)  # the shipped index is the trust root; another revision is the user's choice
        return folder
    if row is None:
        raise ReleaseError(f"{name!r} is a registry entry but not in the release shipped with this package "
                           f"({release_dir()}); build it with `zoo release build --only {name}` or `zoo build {name}`")
    folder = release_dir() / name
    verify_folder(folder, row)
    return folder


def unknown_name_error(name: str, names: Collection[str]) -> ReleaseError:
    near = difflib.get_close_matches(name, list(names), n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else " (see `zoo list`)"
    return ReleaseError(f"{name!r} is neither a folder, nor a Hub repo id ORG/NAME, nor a released entry{hint}")


def resolve(path_or_repo: str | Path, *, revision: str | None = None, endpoint: str | None = None,
            names: Collection[str] | None = None, unknown: Callable[[str], Exception] | None = None) -> Path:
    """A checkpoint folder from a local folder, a Hub repo id `ORG/NAME` or a bare entry name.

    `names`: the bare names that mean a released checkpoint (default: the shipped index's entries;
    zoo.release passes the registry's). `unknown(name)`: the error for any other bare name."""
    folder = Path(path_or_repo)
    text = str(path_or_repo)
    names = read_index()["entries"] if names is None else names
    if "/" not in text and text in names:  # a bare entry name: the released checkpoint
        if folder.is_dir():
            raise ReleaseError(f"{text!r} names both a registry entry (its released checkpoint) and a local folder; "
                               f"write ./{text} for the folder")
        return released_folder(text, revision=revision, endpoint=endpoint)
    if folder.is_dir():
        return folder
    if "/" not in text:
        raise unknown(text) if unknown is not None else unknown_name_error(text, names)
    return resolve_folder(text, revision=revision, endpoint=endpoint)
