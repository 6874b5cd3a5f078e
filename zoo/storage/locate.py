"""Where a checkpoint folder is, and how far it can be trusted: a local folder, a Hub repo id
`ORG/NAME`, or a bare entry name of the release shipped with the package (`release/index.json`).

The shipped index is the trust root: a released entry, however it is reached, is checked file by
file against it ("verified against release vX"); anything else is checked only against its own
config.json ("self-consistent, not checked against a release"). `locate` returns the files it
read and hashed, so that what is parsed is what was checked.

From a hub, only the checkpoint's own files are ever fetched: the repo's file list is read first, and a
released entry's repo holding a file its index row does not list is refused before anything is downloaded;
any other repo is downloaded with exactly its top-level checkpoint files (`CHECKPOINT_PATTERNS`).

No torch, no registry: the streaming runtime (export) locates with this module alone;
`zoo.load` and `Checkpoint.from_pretrained` (zoo.storage.checkpoint.open_checkpoint) pass the registry's
entry names, so that a registry entry that is not released gets the registry's error.
"""

from __future__ import annotations

import difflib
import fnmatch
import glob
import json
import os
import re
from collections.abc import Callable, Collection
from pathlib import Path

from zoo.science.paths import safe_name
from zoo.storage.atomic import recover_folder
from zoo.storage.manifest import (
    CONFIG,
    EVAL_RESULTS,
    GRAPH_FILES,
    HISTORY,
    MAX_JSON,
    WEIGHTS,
    CheckpointError,
    FileReader,
    VerifiedFolder,
    verify_files,
)
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


# What a checkpoint repo may hold: a repo that is not released is downloaded with these only, so that
# nothing else in it (evil.py, pytorch_model.bin, sub/…) is ever fetched, let alone read.
CHECKPOINT_PATTERNS = [CONFIG, WEIGHTS, EVAL_RESULTS, HISTORY, *GRAPH_FILES, "README.md", "*.png"]


def resolve_folder(repo_id: str, *, revision: str | None = None, endpoint: str | None = None,
                   cache_dir=None, token=None, allow_patterns: list[str] | None = None,
                   force_download: bool = False, local_files_only: bool = False) -> Path:
    """The snapshot folder of Hub model repo `repo_id` (downloaded with huggingface_hub)."""
    from huggingface_hub import snapshot_download

    validate_repo_id(repo_id)
    return Path(snapshot_download(repo_id, revision=revision, endpoint=endpoint, cache_dir=cache_dir, token=token,
                                  allow_patterns=allow_patterns, force_download=force_download,
                                  local_files_only=local_files_only))


def repo_files(repo_id: str, *, revision: str | None = None, endpoint: str | None = None, token=None) -> list[str]:
    """The paths of every file in Hub model repo `repo_id` at `revision`, read from the hub's file list
    (model_info's siblings): nothing is downloaded. A revision the repo does not have is a HubError naming the
    revisions it has (`no_such_revision`)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RevisionNotFoundError

    api = HfApi(endpoint=endpoint, token=token)
    try:
        info = api.model_info(validate_repo_id(repo_id), revision=revision)
    except RevisionNotFoundError:
        raise no_such_revision(api, repo_id, revision) from None
    return [s.rfilename for s in info.siblings or []]


MAX_REFS_SHOWN = 8  # branches (and as many tags) named in one error line


def no_such_revision(api, repo_id: str, revision: str | None) -> HubError:
    """The one-line error for a revision `repo_id` does not have: its branches and tags (list_repo_refs), and those
    close to `revision` as a suggestion; the repo itself exists, so no other repo is suggested. The names come from
    the hub: each is shown on one line, at most 100 characters."""
    where = f"{repo_id} on {api.endpoint}"
    try:
        refs = api.list_repo_refs(repo_id)
        branches, tags = (sorted(" ".join(str(r.name).split())[:100] for r in kind) for kind in (refs.branches, refs.tags))
    except Exception as e:  # the refs could not be listed (a hub without the route, the network): say so, in one line
        return HubError(f"{where} has no revision {revision!r} (its branches and tags could not be listed: "
                        f"{type(e).__name__})")

    def shown(names: list[str]) -> str:
        if not names:
            return "none"
        return ", ".join(names[:MAX_REFS_SHOWN]) + (f" and {len(names) - MAX_REFS_SHOWN} more" if len(names) > MAX_REFS_SHOWN else "")

    near = difflib.get_close_matches(str(revision), branches + tags, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return HubError(f"{where} has no revision {revision!r}; its branches: {shown(branches)}; its tags: {shown(tags)}{hint}")


def is_checkpoint_file(path: str) -> bool:
    """A top-level file a checkpoint may hold (`CHECKPOINT_PATTERNS`); nothing in a sub-folder."""
    return "/" not in path and any(fnmatch.fnmatchcase(path, p) for p in CHECKPOINT_PATTERNS)


def download_checkpoint(repo_id: str, *, row: dict | None = None, source: str | None = None,
                        version: str | None = None, revision: str | None = None, endpoint: str | None = None,
                        **download) -> Path:
    """The snapshot folder of a checkpoint repo holding only the checkpoint's own files, filtered before
    anything is fetched. `row`: the release index row of a released entry; a repo with a file the row does
    not list is refused (ReleaseError naming `source`) with nothing downloaded, and only the row's files are
    fetched. Otherwise exactly the repo's top-level checkpoint files (`is_checkpoint_file`) are fetched.
    `download`: cache_dir, token, force_download, local_files_only (then no file list is read: the cache
    holds only what an earlier call let through, and the checks that follow see the folder). `endpoint`: default
    HF_ENDPOINT as set now, so that the file list and the files come from the same hub."""
    validate_repo_id(repo_id)
    endpoint = endpoint or os.environ.get("HF_ENDPOINT", "").rstrip("/") or None
    wanted = (lambda f: f in row["files"]) if row is not None else is_checkpoint_file
    if download.get("local_files_only"):
        names = list(row["files"]) if row is not None else CHECKPOINT_PATTERNS
        return resolve_folder(repo_id, revision=revision, endpoint=endpoint, allow_patterns=names, **download)
    listed = repo_files(repo_id, revision=revision, endpoint=endpoint, token=download.get("token"))
    extra = sorted(f for f in listed if not wanted(f) and f != ".gitattributes")
    if row is not None and extra:
        shown = ", ".join(extra[:8]) + (f" and {len(extra) - 8} more" if len(extra) > 8 else "")
        raise ReleaseError(f"{source or repo_id} is not the released {row['entry']} of icl-zoo {version} (it holds files "
                           f"the release index does not list: {shown}; refusing it, nothing was downloaded)")
    names = [glob.escape(f) for f in listed if wanted(f)]  # exact names, as patterns: '[' in a name stays itself
    return resolve_folder(repo_id, revision=revision, endpoint=endpoint, allow_patterns=names, **download)


def release_dir() -> Path:
    """The shipped release: `zoo/_release` in an installed wheel, `release/` in a source tree
    (or the folder in $ICL_ZOO_RELEASE)."""
    if os.environ.get("ICL_ZOO_RELEASE"):
        return Path(os.environ["ICL_ZOO_RELEASE"])
    here = Path(__file__).parents[1]  # the package folder, zoo/
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


def verify_folder(folder: Path, row: dict, reader: FileReader | None = None) -> FileReader:
    """Every file the index records for an entry is present, a regular file and has its hash; nothing
    else is there. Returns the reader that holds the bytes it hashed (each file is read once)."""
    folder = Path(folder)
    reader = reader or FileReader(folder)
    recorded = row.get("files")
    if not isinstance(recorded, dict):
        raise ReleaseError(f"{folder}: its release index row lists no files")
    present = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    for name, digest in recorded.items():
        try:
            got = reader.sha256(name)
        except CheckpointError as e:
            raise ReleaseError(str(e)) from None
        if got != digest:
            raise ReleaseError(f"{folder}: {name} has SHA-256 {got}, the release index records {digest}; refusing it")
    extra = sorted(present - set(recorded) - {".gitattributes"})
    if extra:
        raise ReleaseError(f"{folder}: files the release index does not list: {', '.join(extra)}; refusing it")
    return reader


def verify_release(folder: Path, row: dict, version: str, *, source: str | None = None) -> VerifiedFolder:
    """A released entry's folder checked against the shipped index row (the trust root), then against its
    own config.json, every file hashed once. `source` names where it came from in the error."""
    try:
        reader = verify_folder(folder, row)
    except ReleaseError as e:
        if source is None:
            raise
        raise ReleaseError(f"{source} is not the released {row['entry']} of icl-zoo {version} ({e}). A different "
                           f"version of that repo is not trusted: download it yourself and load the folder, which is "
                           f"checked only for self-consistency") from None
    return verify_files(folder, reader=reader, release=version)


def verify_local(folder: Path, index: dict | None = None) -> VerifiedFolder:
    """A local folder checked against its own config.json; when it holds exactly a released entry's
    files with the shipped index's hashes, it counts as that release (a copy of it)."""
    folder = Path(folder)
    reader = FileReader(folder)
    verified = verify_files(folder, reader=reader)
    index = read_index() if index is None else index
    entry = verified.config.get("entry")
    row = index["entries"].get(entry.get("name")) if isinstance(entry, dict) and isinstance(entry.get("name"), str) else None
    present = {p.name for p in folder.iterdir()} - {".gitattributes"}
    if row is None or present != set(row["files"]):
        return check_card(verified, reader)
    try:
        verify_folder(folder, row, reader)
    except ReleaseError:  # the user's own edit of a released folder: theirs to load, but not the release
        return check_card(verified, reader)
    return verify_files(folder, reader=reader, release=index["version"])


CARD = "README.md"


def check_card(verified: VerifiedFolder, reader: FileReader) -> VerifiedFolder:
    """A card that a checkpoint carries but no release vouches for must render its checkpoint's own
    numbers: every model-index metric equals eval_results.json's value of the same key. (The hashes
    of a self-consistent folder can be recomputed by anyone; this keeps its card honest to it.)"""
    if not (verified.folder / CARD).exists():
        return verified
    from huggingface_hub import ModelCard

    where = verified.folder / CARD
    try:
        card = ModelCard(reader.read(CARD, MAX_JSON).decode("utf-8"))
        results = card.data.eval_results or []
    except (CheckpointError, UnicodeDecodeError, ValueError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{where}: not a readable model card ({type(e).__name__}: {str(e)[:200]})") from None
    metrics = verified.json(EVAL_RESULTS) or {}
    for result in results:
        value = metrics.get(result.metric_type) if isinstance(metrics, dict) else None
        if not isinstance(value, (int, float)) or result.metric_value != value:
            raise CheckpointError(f"{where}: the card reports {result.metric_type} = {result.metric_value!r}, but "
                                  f"{EVAL_RESULTS} records {value!r}; refusing a card that does not render its metrics")
    return verified


def _fetch_released(name: str, index: dict, *, revision: str | None, endpoint: str | None,
                    **download) -> tuple[Path, str]:
    """(folder, where it came from) of released entry `name`: from the configured Hub (`endpoint`, or
    HF_ENDPOINT) as `icl-zoo/<name>` (at the release tag unless `revision` says otherwise), else the
    release shipped with the package. Whichever: it is then checked against the shipped index."""
    endpoint = endpoint or os.environ.get("HF_ENDPOINT")
    if endpoint:
        revision = revision or index["version"]
        source = f"{ORG}/{name}@{revision} from {endpoint}"
        return download_checkpoint(f"{ORG}/{name}", row=index["entries"][name], source=source, version=index["version"],
                                   revision=revision, endpoint=endpoint, **download), source
    return release_dir() / name, None


def released_folder(name: str, *, revision: str | None = None, endpoint: str | None = None) -> Path:
    """The folder of the released checkpoint `name`, hash-verified against the shipped index. Never builds."""
    return locate(name, revision=revision, endpoint=endpoint).folder


def unknown_name_error(name: str, names: Collection[str]) -> ReleaseError:
    near = difflib.get_close_matches(name, list(names), n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else " (see `zoo list`)"
    return ReleaseError(f"{name!r} is neither a folder, nor a Hub repo id ORG/NAME, nor a released entry{hint}")


def looks_like_path(text: str) -> bool:
    """A path a person typed (./x, ../x, /x, ~/x, a/b/c, x\\y), never a repo id ORG/NAME or a bare name."""
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text


def locate(path_or_repo: str | Path, *, revision: str | None = None, endpoint: str | None = None,
           names: Collection[str] | None = None, unknown: Callable[[str], Exception] | None = None,
           **download) -> VerifiedFolder:
    """A checkpoint from a local folder, a Hub repo id `ORG/NAME` or a bare entry name, read and checked.

    The shipped `release/index.json` is the trust root for every released entry, whatever the path: a
    bare name (from the package or a hub, at any revision) and `icl-zoo/<entry>` (any revision) must
    match its row, file for file, or are refused. Any other repo or folder is checked only against its
    own config.json (`VerifiedFolder.release is None`: self-consistent, not checked against a release);
    from another repo only the checkpoint's own files are downloaded.

    `names`: the bare names that mean a released checkpoint (default: the shipped index's entries;
    zoo.load passes the registry's). `unknown(name)`: the error for any other bare name. `download`:
    cache_dir, token, force_download, local_files_only for a repo on a hub (huggingface_hub's meaning).
    A path that is no folder here (./x, /x/y, a/b/c) fails at once: it is never asked of a hub."""
    text = str(path_or_repo)
    folder = Path(text).expanduser() if text.startswith("~") else Path(path_or_repo)
    index = read_index()
    names = index["entries"] if names is None else names
    if "/" not in text and text in names:  # a bare entry name: the released checkpoint
        if folder.is_dir():
            raise ReleaseError(f"{text!r} names both a registry entry (its released checkpoint) and a local folder; "
                               f"write ./{text} for the folder")
        row = index["entries"].get(text)
        if row is None:
            raise ReleaseError(f"{text!r} is a registry entry but not in the release shipped with this package "
                               f"({release_dir()}); build it with `zoo release build --only {text}` or `zoo build {text}`")
        folder, source = _fetch_released(text, index, revision=revision, endpoint=endpoint, **download)
        return verify_release(folder, row, index["version"], source=source)
    if folder.is_dir() or recover_folder(folder):  # a checkpoint a killed swap left aside is put back first
        return verify_local(folder, index)
    if looks_like_path(text):
        what = "not a folder" if folder.exists() else "no such folder"
        raise HubError(f"{what}: {text} (a path, so not looked up as a repo id ORG/NAME or an entry name)")
    if "/" not in text:
        raise unknown(text) if unknown is not None else unknown_name_error(text, names)
    org, name = validate_repo_id(text).split("/")
    row = index["entries"].get(name) if org.lower() == ORG else None
    if row is not None:  # a released entry's repo: a file the release does not list is refused before any download
        source = f"{text}@{revision or 'main'}"
        folder = download_checkpoint(text, row=row, source=source, version=index["version"], revision=revision,
                                     endpoint=endpoint, **download)
        return verify_release(folder, row, index["version"], source=source)
    folder = download_checkpoint(text, revision=revision, endpoint=endpoint, **download)
    reader = FileReader(folder)
    return check_card(verify_files(folder, reader=reader), reader)


def resolve(path_or_repo: str | Path, **kwargs) -> Path:
    """The folder `locate` checked (see there)."""
    return locate(path_or_repo, **kwargs).folder
