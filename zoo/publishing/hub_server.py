"""The local hub's HTTP server: a small, read-only Hugging Face Hub over the git repositories of a
local hub (`python -m zoo.publishing.hub_server --config hub.toml`, started by `zoo.publishing.hub.start_server`).

    <root>/models/<org>/<name>       git repos (zoo.publishing.hub.publish_local): branches, tags, history
    <root>/datasets/<org>/<name>
    <root>/.icl-zoo-release.json     written by zoo.publishing.hub_prepare: the release, served as a Collection

It answers the read calls of `huggingface_hub` and `datasets`, in the Hub's JSON shapes:

    GET  /api/{models,datasets}                       list_models / list_datasets (author, search, filter, ...)
    GET  /api/{type}/ORG/NAME[/revision/REV]          model_info / dataset_info / repo_exists
    GET  /api/{type}/ORG/NAME/refs                    list_repo_refs
    GET  /api/{type}/ORG/NAME/commits/REV             list_repo_commits
    GET  /api/{type}/ORG/NAME/tree/REV[/PATH]         list_repo_tree, list_repo_files, HfFileSystem.ls
    POST /api/{type}/ORG/NAME/paths-info/REV          get_paths_info (the one POST: a read)
    GET  /api/collections[/ORG/SLUG]                  list_collections / get_collection
    GET|HEAD [/datasets]/ORG/NAME/resolve/REV/PATH    hf_hub_download, snapshot_download, Range reads

Repos still being prepared: `zoo hub serve` starts the server once the model repos are in place and makes the
dataset repos afterwards (seconds, the first time: their frozen splits are generated through torch). It names
them on the server's stdin before the server listens ("pending datasets/ORG/NAME", then "serve"), and says when
each is done ("ready KEY" or "failed KEY MESSAGE"; end of input: what is still pending has failed). A request that
needs one of them (its info, refs, commits, tree, paths-info or files; a listing of its type; the collection,
which waits for the release's marker, key "collection") waits until it is ready: plain `huggingface_hub` and
`datasets` calls work unchanged, they take longer. The wait is bounded (PENDING_WAIT_S; PENDING_WAIT_RESOLVE_S for
a file, under huggingface_hub's 10 s metadata timeout, which retries a 503 after its Retry-After); past it the
answer is 503 with Retry-After, and a repo whose preparation failed is answered 503 with the failure in one line
(no Retry-After: it will not change while this server runs).

Model info comes from the card's YAML front matter (tags, pipeline_tag, library_name, cardData,
model-index), config.json and the safetensors headers (parameter counts per dtype), with the tags
the Hub derives (file formats, license:, dataset:, base_model:). Files of the kinds the Hub keeps
in LFS (weights, graphs, parquet, images) are described as LFS files: their ETag is the SHA-256.

Why not olah: it answered none of the listing, search or collection calls, 401 for `model_info`
without a revision, a commit list without authors and no Range requests; fronting it would mean
reimplementing most routes anyway. Everything is read through the git CLI (`ls-tree`, `cat-file`,
`log`, `for-each-ref`), never through a working tree; blobs are copied once into a content-addressed
cache (`<root>/.served-blobs/<git oid>`) and served from there with Range support.

Safety: one parser reads the *raw* request path, percent-decodes each part once (anything still
holding '%', a backslash or a control character is refused) and yields the route the handlers use,
so nothing is checked in one form and used in another. Only GET/HEAD (and POST for paths-info) get
through, and only with a loopback `Host` (localhost, 127.0.0.1, [::1]: a DNS-rebinding page sends its own
name); a repo is served only when it is a valid `ORG/NAME`, a real (non-symlinked) git repository
inside the root whose git data is its own (no symlinked or gitfile `.git`, no alternates, no symlinked
object store), read with an explicit `--git-dir` (git never searches the folders above); a revision must
be a branch, a tag or a commit of that repo, and a file path is looked up in the commit's tree listing,
never on the file system. Card front matter is parsed without YAML anchors or aliases (a "billion
laughs" card has no metadata), hash sidecars are written whole (temp file + rename) and trusted only
when they hold a SHA-256, and what is memoised is a bounded LRU that never keeps a miss.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote

from zoo.storage.locate import HubError, validate_repo_id

REPO_TYPES = ("models", "datasets")
# A revision is a git ref name: '/'-separated components, each starting with a letter or digit (so
# no '.', '..' or empty part), as the Hub's own "refs/pr/1", "refs/convert/parquet" or "release/v1".
REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,7}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
RELEASE_MARKER = ".icl-zoo-release.json"  # written by zoo.publishing.hub_prepare
BLOB_CACHE = ".served-blobs"
MAX_BODY = 1 << 20  # a paths-info form
MAX_META = 4 << 20  # a card or config.json read to describe a repo
# What the Hub keeps in LFS (its default .gitattributes, plus binary images): served with a SHA-256 ETag.
LFS_SUFFIXES = (".safetensors", ".onnx", ".parquet", ".arrow", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".npy",
                ".npz", ".pkl", ".pickle", ".msgpack", ".tflite", ".zip", ".gz", ".tgz", ".tar", ".xz", ".zst",
                ".7z", ".png", ".jpg", ".jpeg", ".gif", ".webp")
LFS_MIN_SIZE = 10 << 20
FRONT_MATTER = re.compile(r"\A\s*---\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", re.DOTALL)
MAX_FRONT_MATTER = 256 << 10  # a card's YAML (the release's are ~1 KiB); past it, the card has no metadata here
MAX_YAML_DEPTH = 32  # nested mappings/lists in a card's YAML (the Hub's model-index: 5)
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # what a hash sidecar must hold, exactly, to be trusted
LIST_WORKERS = 4  # repos described at once for a listing (git processes, mostly waiting on each other)
MEMO_ENTRIES = 1024  # what a commit determines (tree, history, info, hashes), least recently used dropped first
LOOPBACK_HOST = re.compile(r"(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?", re.IGNORECASE)  # fullmatch
PENDING_WAIT_S = 120.0  # how long an API request waits for a repo still being prepared (the clients set no timeout)
PENDING_WAIT_RESOLVE_S = 8.0  # a file's: huggingface_hub gives up its first HEAD after 10 s, then retries on 503
RETRY_AFTER_S = 5
COLLECTION_KEY = "collection"  # the pending key of the release's marker (the Collection is read from it)


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after = status, message, code, retry_after


def not_found(what: str = "repo") -> Refused:
    code, message = {"repo": ("RepoNotFound", "Repository not found"),
                     "revision": ("RevisionNotFound", "Revision not found"),
                     "entry": ("EntryNotFound", "Entry not found")}[what]
    return Refused(404, message, code)


# ---------------------------------------------------------------- the one request parser
@dataclass(frozen=True)
class Route:
    kind: str  # list | collections | collection | info | refs | commits | tree | paths-info | resolve
    repo_type: str = ""  # "models" | "datasets"
    repo_id: str = ""
    revision: str | None = None
    path: str = ""  # a file or folder path inside the repo ("" = its root)
    slug: str = ""


def _decode(raw: str, what: str) -> str:
    """One percent-decoding of `raw`; refused when the result is not plain (still '%', '\\', control chars)."""
    try:
        text = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise Refused(400, f"{what} is not valid UTF-8") from None
    if "%" in text or "\\" in text or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise Refused(400, f"{what} holds '%', a backslash or a control character")
    return text


def _segment(raw: str, what: str) -> str:
    text = _decode(raw, what)
    if text in ("", ".", "..") or "/" in text:
        raise Refused(400, f"{what} must be one plain path segment")
    return text


def _revision(raw: str) -> str:
    rev = _decode(raw, "revision")
    if not REVISION.match(rev) or ".." in rev:
        raise not_found("revision")  # not a ref name git could hold
    return rev


def _file_path(raw_parts: list[str], what: str = "file path") -> str:
    text = _decode("/".join(raw_parts), what)
    if any(part in ("", ".", "..") for part in text.split("/")):
        raise Refused(400, f"{what} must be relative, without '.', '..' or empty parts")
    return text


def _repo_id(org_raw: str, name_raw: str) -> str:
    org, name = _segment(org_raw, "organisation"), _segment(name_raw, "repo name")
    try:
        return validate_repo_id(f"{org}/{name}")
    except HubError:
        raise not_found() from None


def parse(method: str, raw_path: bytes, path: str) -> Route:
    """The route of a request, or `Refused` (see the module docstring)."""
    if method not in ("GET", "HEAD", "POST"):
        raise Refused(405, "the local hub is read-only")
    try:
        raw = raw_path.decode("ascii")
    except UnicodeDecodeError:
        raise Refused(400, "the request path is not ASCII") from None
    raw = raw.split("?", 1)[0]
    if not raw.startswith("/") or unquote(raw) != path:
        raise Refused(400, "the request path is not in canonical form")
    parts = raw[1:].split("/")
    writes = Refused(405, "the local hub is read-only: POST only for paths-info, which reads")
    try:
        route = _api_route(parts[1:]) if parts[0] == "api" else _resolve_route(parts)
    except Refused:
        if method == "POST":
            raise writes from None
        raise
    if (method == "POST") != (route.kind == "paths-info"):
        raise writes
    return route


def _api_route(parts: list[str]) -> Route:
    head = _segment(parts[0], "route") if parts else ""
    if head == "collections":
        if len(parts) == 1:
            return Route("collections")
        if len(parts) == 3:
            org, slug = _segment(parts[1], "organisation"), _segment(parts[2], "collection")
            if SLUG.match(org) and SLUG.match(slug):
                return Route("collection", slug=f"{org}/{slug}")
        raise Refused(404, "Collection not found")
    if head not in REPO_TYPES:
        raise Refused(404, "unknown route")
    if len(parts) == 1:
        return Route("list", head)
    if len(parts) < 3:
        raise Refused(404, "unknown route")
    repo_id, rest = _repo_id(parts[1], parts[2]), parts[3:]
    if not rest:
        return Route("info", head, repo_id)
    action = _segment(rest[0], "route")
    if action == "refs" and len(rest) == 1:
        return Route("refs", head, repo_id)
    if action in ("revision", "commits", "paths-info") and len(rest) == 2:
        return Route("info" if action == "revision" else action, head, repo_id, _revision(rest[1]))
    if action == "tree" and len(rest) >= 2:
        inner = rest[2:]
        path = _file_path(inner) if inner and inner != [""] else ""  # `tree/REV/` lists the root
        return Route("tree", head, repo_id, _revision(rest[1]), path)
    raise Refused(404, "unknown route")


def _resolve_route(parts: list[str]) -> Route:  # [/datasets]/ORG/NAME/resolve/REV/PATH
    repo_type = "models"
    if parts[0] == "datasets":
        repo_type, parts = "datasets", parts[1:]
    if len(parts) < 5 or parts[2] != "resolve":
        raise Refused(404, "unknown route")
    if _segment(parts[0], "organisation") in REPO_TYPES + ("api", "repos", "spaces"):
        raise Refused(404, "unknown route")
    repo_id = _repo_id(parts[0], parts[1])
    return Route("resolve", repo_type, repo_id, _revision(parts[3]), _file_path(parts[4:]))


def repo_dir(root: Path, repo_type: str, repo_id: str) -> Path:
    """The repo's git directory (`<repo>/.git`, or the repo itself when bare): a real git repository (no
    symlink on the way) inside `root` whose git data is its own, else 404."""
    path = root / repo_type / repo_id
    try:
        inside = path.resolve() == path and root in path.parents and path.is_dir()  # `root` is resolved
        git_dir = _own_git_dir(path) if inside else None
    except OSError:
        git_dir = None
    if git_dir is None:
        raise not_found()
    return git_dir


def _own_git_dir(path: Path) -> Path | None:
    """The git directory of the repo at `path` when everything git reads lies inside it: a real `.git`
    folder (not a symlink, not a "gitdir:" file) or a bare layout, whose HEAD, config, refs and object
    store are not symlinks, with no alternates (objects borrowed from another store) and no commondir
    (a linked worktree's); None otherwise."""
    dot = path / ".git"
    if dot.is_symlink() or (os.path.lexists(dot) and not dot.is_dir()):
        return None
    git_dir = dot if dot.is_dir() else path
    objects = git_dir / "objects"
    if not (objects.is_dir() and (git_dir / "HEAD").is_file()):
        return None
    for name in ("HEAD", "config", "refs", "packed-refs", "objects", "objects/info", "objects/pack"):
        if (git_dir / name).is_symlink():
            return None
    for name in ("commondir", "objects/info/alternates", "objects/info/http-alternates"):
        if os.path.lexists(git_dir / name):
            return None
    for folder in (objects, objects / "pack"):  # the fan-out folders and packs: none of them a symlink
        with os.scandir(folder) if folder.is_dir() else contextlib.nullcontext(()) as entries:
            if any(e.is_symlink() for e in entries):
                return None
    return git_dir


# ---------------------------------------------------------------- git, read-only
# Nothing of the caller's git environment (GIT_DIR, GIT_OBJECT_DIRECTORY, GIT_ALTERNATE_OBJECT_DIRECTORIES, ...)
# reaches the server's git: each call names its repo's git directory itself.
GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "GIT_LITERAL_PATHSPECS": "1",
           "GIT_NO_REPLACE_OBJECTS": "1", "GIT_ATTR_NOSYSTEM": "1", "LC_ALL": "C"}


def git(repo: Path, *args: str, stdout=subprocess.PIPE) -> bytes:
    """git on the repo whose git directory is `repo` (as `repo_dir` gives it): never discovered, so never a
    repository above it."""
    out = subprocess.run(["git", f"--git-dir={repo}", *args], stdout=stdout, stderr=subprocess.PIPE, env=GIT_ENV,
                         check=False, cwd=repo)
    if out.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed in {repo}: {out.stderr.decode(errors='replace').strip()[:300]}")
    return out.stdout


def iso(timestamp: str | int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(int(timestamp)))


@dataclass(frozen=True)
class Entry:
    type: str  # "file" | "directory"
    oid: str
    size: int
    path: str


class Hub:
    """The repos under `root`, read through git; what a commit determines is computed once."""

    def __init__(self, root: Path, blobs: Path | None = None):
        self.root = Path(root).resolve()
        self.blobs = blobs or _blob_cache(self.root)
        self._memo: OrderedDict = OrderedDict()  # an LRU of at most MEMO_ENTRIES
        self._lock = threading.Lock()

    def memo(self, key, compute, keep=None):
        """compute(), remembered under `key` (when `keep(value)`, if given): the least recently used of more
        than MEMO_ENTRIES are dropped, so no stream of distinct requests grows the server."""
        with self._lock:
            if key in self._memo:
                self._memo.move_to_end(key)
                return self._memo[key]
        value = compute()
        if keep is None or keep(value):
            with self._lock:
                self._memo[key] = value
                self._memo.move_to_end(key)
                while len(self._memo) > MEMO_ENTRIES:
                    self._memo.popitem(last=False)
        return value

    # refs and revisions
    def refs(self, repo: Path) -> dict:
        out = git(repo, "for-each-ref", "--format=%(refname)%09%(objectname)%09%(*objectname)", "refs/heads", "refs/tags")
        refs = {"branches": {}, "tags": {}}
        for line in out.decode().splitlines():
            ref, obj, peeled = (line.split("\t") + ["", ""])[:3]
            kind, _, name = ref[len("refs/"):].partition("/")
            refs["branches" if kind == "heads" else "tags"][name] = peeled or obj
        return refs

    def resolve(self, repo: Path, revision: str | None) -> str:
        revision = revision or "main"
        refs = self.refs(repo)
        if revision in refs["branches"]:
            return refs["branches"][revision]
        if revision in refs["tags"]:
            return refs["tags"][revision]
        for prefix, kind in (("refs/heads/", "branches"), ("refs/tags/", "tags")):  # a full ref name
            if revision.startswith(prefix) and revision[len(prefix):] in refs[kind]:
                return refs[kind][revision[len(prefix):]]
        # any other name, e.g. the Hub's refs/pr/1 or refs/convert/parquet: no such ref here (RevisionNotFound)
        if COMMIT.match(revision) and self.memo(("is-commit", repo, revision), lambda: self._is_commit(repo, revision),
                                                keep=bool):  # a miss is not remembered: no entry per unknown name
            return revision
        raise not_found("revision")

    @staticmethod
    def _is_commit(repo: Path, oid: str) -> bool:
        try:
            return git(repo, "cat-file", "-t", oid).strip() == b"commit"
        except RuntimeError:
            return False

    # what a commit holds
    def tree(self, repo: Path, commit: str) -> dict[str, Entry]:
        def compute():
            entries = {}
            for record in git(repo, "ls-tree", "-r", "-t", "-l", "-z", commit).split(b"\0"):
                if not record:
                    continue
                meta, _, name = record.partition(b"\t")
                mode, kind, oid, size = meta.decode().split()
                path = name.decode("utf-8", errors="surrogateescape")
                if kind == "tree":
                    entries[path] = Entry("directory", oid, 0, path)
                elif kind == "blob" and mode in ("100644", "100755"):  # no symlinks, no submodules
                    entries[path] = Entry("file", oid, int(size), path)
            return entries
        return self.memo(("tree", repo, commit), compute)

    def history(self, repo: Path, commit: str) -> list[dict]:
        def compute():
            out = git(repo, "log", "--format=%H%x1f%an%x1f%at%x1f%B%x1e", commit).decode(errors="replace")
            commits = []
            for record in out.split("\x1e"):
                fields = record.strip("\n").split("\x1f")
                if len(fields) == 4:
                    sha, author, at, body = fields
                    title, _, message = body.strip().partition("\n")
                    commits.append({"id": sha, "title": title, "message": message.strip(),
                                    "authors": [{"user": author, "avatar": None}], "date": iso(at)})
            return commits
        return self.memo(("history", repo, commit), compute)

    def last_commit(self, repo: Path, commit: str, path: str) -> dict:
        def compute():
            out = git(repo, "log", "-1", "--format=%H%x1f%at%x1f%s", commit, "--", path).decode(errors="replace")
            sha, at, title = out.strip().split("\x1f", 2)
            return {"id": sha, "title": title, "date": iso(at)}
        return self.memo(("last", repo, commit, path), compute)

    def blob_file(self, repo: Path, oid: str) -> Path:
        """The blob's bytes as a file of the content-addressed cache (written once, atomically)."""
        path = self.blobs / oid
        if path.is_symlink() or not path.is_file():  # the cache's own files only
            self.blobs.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.blobs, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    git(repo, "cat-file", "blob", oid, stdout=f)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return path

    def sha256(self, repo: Path, oid: str) -> str:
        """The blob's SHA-256 (its LFS oid and ETag), from its sidecar `<oid>.sha256` when that holds exactly
        64 hex digits, else computed and the sidecar written whole (temp file, then rename)."""
        def compute():
            side = self.blobs / f"{oid}.sha256"
            cached = _read_sidecar(side)
            if cached is not None:
                return cached
            h = hashlib.sha256()
            with open(self.blob_file(repo, oid), "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            digest = h.hexdigest()
            _write_whole(side, digest.encode())
            return digest
        return self.memo(("sha256", oid), compute)

    def small_file(self, repo: Path, entry: Entry | None):
        if entry is None or entry.type != "file" or entry.size > MAX_META:
            return None
        return git(repo, "cat-file", "blob", entry.oid)  # read once per commit's `info`, which is memoised

    # the Hub's JSON shapes
    def entry_json(self, repo: Path, commit: str, e: Entry, expand: bool = False) -> dict:
        out = {"type": e.type, "oid": e.oid, "size": e.size, "path": e.path}
        if e.type == "file" and is_lfs(e):
            sha = self.sha256(repo, e.oid)
            out["lfs"] = {"oid": sha, "size": e.size, "pointerSize": pointer_size(sha, e.size)}
        if expand:
            out["lastCommit"] = self.last_commit(repo, commit, e.path)
        return out

    def info(self, repo_type: str, repo_id: str, repo: Path, commit: str) -> dict:
        """Everything `model_info` / `dataset_info` may return for this commit (`select` picks from it)."""
        def compute():
            info = dict(self.summary(repo_type, repo_id, repo, commit))
            if repo_type == "models":
                tree = self.tree(repo, commit)
                files = sorted((e for e in tree.values() if e.type == "file"), key=lambda e: e.path)
                config = json_file(self.small_file(repo, tree.get("config.json")))
                params = self.parameters(repo, [e for e in files if e.path.endswith(".safetensors")])
                info.update({"config": config,
                             "safetensors": {"parameters": params, "total": sum(params.values())} if params else None})
            return info
        return self.memo(("info", repo_type, repo, commit), compute)

    def summary(self, repo_type: str, repo_id: str, repo: Path, commit: str) -> dict:
        """`info` without what only model_info shows (config.json, the safetensors' parameter counts): what a
        listing shows by default, read with two git processes fewer a repo."""
        def compute():
            tree = self.tree(repo, commit)
            files = sorted((e for e in tree.values() if e.type == "file"), key=lambda e: e.path)
            history = self.history(repo, commit)
            card = card_data(self.small_file(repo, tree.get("README.md")))
            org = repo_id.split("/")[0]
            info = {
                "_id": hashlib.sha1(f"{repo_type}/{repo_id}".encode()).hexdigest()[:24], "id": repo_id,
                "author": org, "sha": commit, "lastModified": history[0]["date"], "createdAt": history[-1]["date"],
                "private": False, "gated": False, "disabled": False, "downloads": 0, "downloadsAllTime": 0,
                "likes": 0, "trendingScore": 0, "tags": [], "cardData": card,
                "siblings": [{"rfilename": e.path} for e in files],
                "usedStorage": sum(e.size for e in files),
            }
            if repo_type == "models":
                info.update({
                    "modelId": repo_id, "library_name": card.get("library_name"),
                    "pipeline_tag": card.get("pipeline_tag"), "model-index": card.get("model-index"), "spaces": [],
                })
            else:
                info.update({"key": "", "description": None, "citation": None, "mainSize": info["usedStorage"]})
            info["tags"] = derived_tags(repo_type, card, [e.path for e in files])
            return info
        return self.memo(("summary", repo_type, repo, commit), compute)

    def parameters(self, repo: Path, files: list[Entry]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in files:
            for dtype, n in safetensors_parameters(self.blob_file(repo, e.oid)).items():
                counts[dtype] = counts.get(dtype, 0) + n
        return counts

    def siblings_with_blobs(self, repo: Path, commit: str) -> list[dict]:
        tree = self.tree(repo, commit)
        out = []
        for e in sorted((e for e in tree.values() if e.type == "file"), key=lambda e: e.path):
            j = self.entry_json(repo, commit, e)
            lfs = j.get("lfs")
            out.append({"rfilename": e.path, "size": e.size, "blobId": e.oid,
                        **({"lfs": {"sha256": lfs["oid"], "size": e.size, "pointerSize": lfs["pointerSize"]}}
                           if lfs else {})})
        return out

    def repos(self, repo_type: str):
        """(repo_id, folder) of every servable repo of this type, sorted by id."""
        base = self.root / repo_type
        for org in sorted(base.iterdir()) if base.is_dir() else ():
            for name in sorted(org.iterdir()) if org.is_dir() and not org.is_symlink() else ():
                try:
                    repo_id = validate_repo_id(f"{org.name}/{name.name}")
                    yield repo_id, repo_dir(self.root, repo_type, repo_id)
                except (HubError, Refused):
                    continue

    def release(self) -> dict | None:
        try:
            marker = json.loads((self.root / RELEASE_MARKER).read_text())
            return marker if isinstance(marker, dict) and marker.get("version") else None
        except (OSError, ValueError):
            return None


def _blob_cache(root: Path) -> Path:
    path = root / BLOB_CACHE
    try:
        path.mkdir(exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="icl-zoo-hub-blobs-"))


def _read_sidecar(side: Path) -> str | None:
    """A sidecar's SHA-256 when it is a plain file holding exactly 64 lowercase hex digits, else None."""
    try:
        if side.is_symlink():
            return None
        with open(side, "rb") as f:
            text = f.read(65)
    except OSError:
        return None
    return text.decode("ascii") if SHA256_HEX.fullmatch(text.decode("ascii", errors="replace")) else None


def _write_whole(path: Path, data: bytes) -> None:
    """`data` at `path`, written under a temporary name in the same folder and renamed over it: a reader
    (another request, another server) sees the old file or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_lfs(e: Entry) -> bool:
    return e.path.lower().endswith(LFS_SUFFIXES) or e.size >= LFS_MIN_SIZE


def pointer_size(sha: str, size: int) -> int:
    return len(f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n")


def card_data(text: bytes | None) -> dict:
    """The YAML front matter of a card (the Hub's cardData), {} when it has none."""
    import yaml

    if not text:
        return {}
    m = FRONT_MATTER.match(text.decode("utf-8", errors="replace"))
    if not m or len(m.group(1)) > MAX_FRONT_MATTER:
        return {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        if not _plain_yaml(yaml.parse(m.group(1), Loader=loader)):
            return {}
        data = yaml.load(m.group(1), Loader=loader)  # a safe loader, on YAML checked plain above
        return json.loads(json.dumps(data, default=str)) if isinstance(data, dict) else {}  # JSON-clean (dates)
    except (yaml.YAMLError, ValueError, RecursionError, OverflowError):  # e.g. an int past int()'s digit limit
        return {}


def _plain_yaml(events) -> bool:
    """Whether a YAML event stream is plain data: no anchor and no alias (a few hundred bytes of aliases
    expand to billions of nodes once they are copied out), nesting at most MAX_YAML_DEPTH deep."""
    import yaml

    depth = 0
    for event in events:
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            return False
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                return False
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return True


def json_file(text: bytes | None):
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def safetensors_parameters(path: Path) -> dict[str, int]:
    """Parameters per dtype from a safetensors header (8-byte little-endian length, then JSON)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= 100_000_000:
                return {}
            header = json.loads(f.read(n))
        counts: dict[str, int] = {}
        for name, t in header.items():
            if name != "__metadata__":
                counts[t["dtype"]] = counts.get(t["dtype"], 0) + math.prod(t["shape"])
        return counts
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _as_list(value) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def derived_tags(repo_type: str, card: dict, files: list[str]) -> list[str]:
    """The card's tags plus those the Hub derives: library, file formats, pipeline, datasets, base
    models, license (for datasets: formats and license)."""
    tags: list[str] = []
    if repo_type == "models":
        tags += _as_list(card.get("library_name"))
        tags += [fmt for fmt, suffix in (("safetensors", ".safetensors"), ("onnx", ".onnx"))
                 if any(f.endswith(suffix) for f in files)]
        tags += _as_list(card.get("tags")) + _as_list(card.get("pipeline_tag"))
        tags += [f"dataset:{d}" for d in _as_list(card.get("datasets"))]
        tags += [f"base_model:{b}" for b in _as_list(card.get("base_model"))]
    else:
        tags += _as_list(card.get("tags"))
        tags += [f"format:{fmt}" for fmt in ("parquet", "arrow", "csv") if any(f.endswith("." + fmt) for f in files)]
    tags += [f"license:{lic}" for lic in _as_list(card.get("license"))]
    return list(dict.fromkeys(tags))


# ---------------------------------------------------------------- handlers (blocking; run in a thread)
LIST_DEFAULT = ("_id", "id", "modelId", "author", "sha", "lastModified", "createdAt", "private", "gated",
                "disabled", "downloads", "likes", "trendingScore", "tags", "pipeline_tag", "library_name", "key")


def _flag(params, name: str) -> bool:
    return any(v.lower() in ("1", "true", "yes") for v in params.getlist(name))


def _expand(params) -> list[str]:
    return params.getlist("expand") + params.getlist("expand[]")


def select(info: dict, expand: list[str], base=None) -> dict:
    if expand:
        return {k: v for k, v in info.items() if k in ("_id", "id") or k in expand}
    return {k: v for k, v in info.items() if base is None or k in base}


def handle_list(hub: Hub, route: Route, params):
    author, search = params.get("author"), (params.get("search") or "").lower()
    filters = params.getlist("filter")
    pipeline_tag = params.get("pipeline_tag")
    expand = _expand(params)
    heavy = _flag(params, "config") or any(k in ("config", "safetensors") for k in expand)
    describe = hub.info if heavy else hub.summary  # the other fields need no config.json or safetensors header

    def info(item):
        repo_id, repo = item
        try:
            return describe(route.repo_type, repo_id, repo, hub.resolve(repo, None))
        except (Refused, RuntimeError):
            return None  # no main branch (or a broken repo): not listed

    candidates = [(repo_id, repo) for repo_id, repo in hub.repos(route.repo_type)
                  if not (author and repo_id.split("/")[0].lower() != author.lower() or search not in repo_id.lower())]
    # Describing a repo the first time takes a few git processes; a release's ~70 repos listed at once are what
    # a fresh server's first answer waits for, so they are described side by side (the memo is thread-safe).
    with ThreadPoolExecutor(LIST_WORKERS) as pool:
        infos = list(pool.map(info, candidates))
    rows = [i for i in infos if i is not None and all(f in i["tags"] for f in filters)
            and (not pipeline_tag or i.get("pipeline_tag") == pipeline_tag)]
    sort = params.get("sort")
    if sort in ("lastModified", "createdAt", "id", "downloads", "likes", "trendingScore"):
        rows.sort(key=lambda r: r.get(sort) or 0, reverse=params.get("direction", "-1") == "-1")
    limit = params.get("limit")
    if limit and limit.isdigit():
        rows = rows[: int(limit)]
    extra = ["cardData"] * _flag(params, "cardData") + ["config"] * _flag(params, "config")
    if _flag(params, "full"):
        extra += ["siblings", "cardData", "usedStorage"]
    base = LIST_DEFAULT + tuple(extra)
    return [select(r, expand, base) for r in rows]


def handle_info(hub: Hub, route: Route, repo: Path, params):
    commit = hub.resolve(repo, route.revision)
    info = dict(hub.info(route.repo_type, route.repo_id, repo, commit))
    if _flag(params, "blobs"):
        info["siblings"] = hub.siblings_with_blobs(repo, commit)
    return select(info, _expand(params))


def handle_refs(hub: Hub, route: Route, repo: Path, params):
    refs = hub.refs(repo)
    def rows(kind, prefix):
        return [{"name": n, "ref": f"{prefix}{n}", "targetCommit": c} for n, c in sorted(refs[kind].items())]
    out = {"branches": rows("branches", "refs/heads/"), "tags": rows("tags", "refs/tags/"), "converts": []}
    if params.get("include_prs"):
        out["pullRequests"] = []
    return out


def handle_tree(hub: Hub, route: Route, repo: Path, params):
    commit = hub.resolve(repo, route.revision)
    tree = hub.tree(repo, commit)
    if route.path and (route.path not in tree or tree[route.path].type != "directory"):
        raise not_found("entry")
    prefix = route.path + "/" if route.path else ""
    recursive, expand = _flag(params, "recursive"), _flag(params, "expand")
    entries = [e for p, e in sorted(tree.items())
               if p.startswith(prefix) and (recursive or "/" not in p[len(prefix):])]
    return [hub.entry_json(repo, commit, e, expand) for e in entries]


def handle_paths_info(hub: Hub, route: Route, repo: Path, body: bytes, content_type: str):
    commit = hub.resolve(repo, route.revision)
    if "json" in content_type:
        try:
            doc = json.loads(body)
            paths, expand = doc.get("paths"), bool(doc.get("expand"))
        except (ValueError, AttributeError):
            raise Refused(400, "the body is not a JSON object") from None
    else:
        try:
            form = parse_qs(body.decode("utf-8"), strict_parsing=False)
        except UnicodeDecodeError:
            raise Refused(400, "the body is not UTF-8") from None
        paths, expand = form.get("paths"), any(v.lower() in ("1", "true") for v in form.get("expand", []))
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        raise Refused(400, "paths-info takes a form (or JSON) with one or more `paths`")
    tree = hub.tree(repo, commit)
    return [hub.entry_json(repo, commit, tree[p.strip("/")], expand) for p in dict.fromkeys(paths) if p.strip("/") in tree]


def collection(hub: Hub) -> dict | None:
    """The release as the Hub Collection `<org>/icl-zoo-<version>-<id>` of its model and dataset repos."""
    release = hub.release()
    if release is None:
        return None
    org, version = release.get("org", "icl-zoo"), str(release["version"])
    key = hashlib.sha1(str(release.get("key", version)).encode()).hexdigest()[:24]
    items = [{"_id": hashlib.sha1(f"{kind}/{org}/{name}".encode()).hexdigest()[:24], "id": f"{org}/{name}",
              "type": kind, "position": i, "repoType": kind, "author": org}
             for i, (kind, name) in enumerate([("model", m) for m in sorted(release.get("models", {}))]
                                              + [("dataset", d) for d in sorted(release.get("datasets", {}))])]
    return {"slug": f"{org}/icl-zoo-{re.sub(r'[^A-Za-z0-9]+', '-', version).strip('-')}-{key}",
            "title": f"icl-zoo {version}", "description": release.get("description")
            or "In-context learning by gradient descent: every icl-zoo entry's checkpoint and frozen datasets.",
            "owner": {"name": org, "fullname": org, "type": "org", "_id": hashlib.sha1(org.encode()).hexdigest()[:24]},
            "items": items, "lastUpdated": release.get("prepared_at") or iso(time.time()),
            "position": 0, "private": False, "theme": "indigo", "upvotes": 0, "gating": False}


def handle_collections(hub: Hub, route: Route, params):
    c = collection(hub)
    if route.kind == "collection":
        if c is None or c["slug"] != route.slug:
            raise Refused(404, "Collection not found")
        return c
    owners = params.getlist("owner")
    items = params.getlist("item")
    if c is None or owners and c["owner"]["name"] not in owners:
        return []
    if items and not any(i.split("/", 1)[-1] in {x["id"] for x in c["items"]} for i in items):
        return []
    return [{k: v for k, v in c.items() if k != "position"}]  # list_collections numbers them itself


# ---------------------------------------------------------------- repos still being prepared
def pending_key(repo_type: str, repo_id: str) -> str:
    """How the preparing process names a repo it has yet to make: "datasets/ORG/NAME" (repo_type as in routes)."""
    return f"{repo_type}/{repo_id}"


class Pending:
    """The repos announced as still being prepared, and those whose preparation failed (key -> one-line reason).
    Updated from the thread that reads the preparing process's lines; read by the requests that wait."""

    def __init__(self, keys=()):
        self._lock = threading.Lock()
        self._pending: set[str] = set(keys)
        self._failed: dict[str, str] = {}

    def add(self, key: str) -> None:
        with self._lock:
            self._pending.add(key)

    def ready(self, key: str) -> None:
        with self._lock:
            self._pending.discard(key)

    def fail(self, key: str, reason: str) -> None:
        with self._lock:
            if key in self._pending:
                self._pending.discard(key)
                self._failed[key] = " ".join(reason.split())[:500] or "the preparation failed"

    def stop(self, reason: str) -> None:
        """The preparing process is gone: whatever it had not finished has failed."""
        with self._lock:
            for key in self._pending:
                self._failed[key] = reason
            self._pending.clear()

    def needed(self, route: Route) -> set[str]:
        """The announced keys (pending or failed) that `route` depends on."""
        with self._lock:
            known = self._pending | set(self._failed)
        if not known:
            return set()
        if route.kind in ("collections", "collection"):
            return known
        if route.kind == "list":
            return {k for k in known if k.startswith(route.repo_type + "/")}
        key = pending_key(route.repo_type, route.repo_id)
        return {key} if key in known else set()

    def state(self, keys: set[str]) -> tuple[str, str] | None:
        """None when every key is ready; ("failed", "KEY: reason") for a failed one; else ("pending", KEY)."""
        with self._lock:
            for key in sorted(keys):
                if key in self._failed:
                    return "failed", f"{key}: {self._failed[key]}"
            waiting = sorted(keys & self._pending)
        return ("pending", waiting[0]) if waiting else None

    def follow(self, lines) -> None:
        """Apply the preparing process's lines ("ready KEY", "failed KEY REASON") until they end."""
        for line in lines:
            verb, _, rest = line.strip().partition(" ")
            key, _, reason = rest.partition(" ")
            if verb == "ready" and key:
                self.ready(key)
            elif verb == "failed" and key:
                self.fail(key, reason)
        self.stop("the preparation stopped before it was ready (see the output of `zoo hub serve`)")


def _what(key: str) -> str:
    if key == COLLECTION_KEY:
        return "the release's collection"
    kind, _, repo_id = key.partition("/")
    return f"the {kind.rstrip('s')} repo {repo_id}"


# ---------------------------------------------------------------- ASGI
class App:
    def __init__(self, root: Path, blobs: Path | None = None, pending: Pending | None = None, *,
                 wait_s: float = PENDING_WAIT_S, wait_resolve_s: float = PENDING_WAIT_RESOLVE_S):
        self.hub = Hub(root, blobs)
        self.pending = pending or Pending()
        self.wait_s, self.wait_resolve_s = wait_s, wait_resolve_s

    async def wait_until_prepared(self, route: Route, method: str) -> None:
        """Hold a request whose repos are still being prepared until they are (see the module docstring)."""
        keys = self.pending.needed(route)
        if not keys:
            return
        import asyncio  # deferred: the server process has it (uvicorn); the module's importers (every CLI) need not

        deadline = time.monotonic() + (self.wait_resolve_s if route.kind == "resolve" else self.wait_s)
        said = False
        while (state := self.pending.state(keys)) is not None:
            kind, detail = state
            if kind == "failed":
                key, _, reason = detail.partition(": ")
                raise Refused(503, f"{_what(key)} could not be prepared: {reason}; restart `zoo hub serve` to try "
                                   "again")
            if time.monotonic() >= deadline:
                raise Refused(503, f"{_what(detail)} is still being prepared; retry in a few seconds",
                              retry_after=RETRY_AFTER_S)
            if not said:
                print(f"waiting for {detail}, being prepared: {method} {route.kind}", file=sys.stderr, flush=True)
                said = True
            await asyncio.sleep(0.02)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] in ("lifespan.startup", "lifespan.shutdown"):
                    await send({"type": message["type"] + ".complete"})
                    if message["type"] == "lifespan.shutdown":
                        return
            return
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        from starlette.concurrency import run_in_threadpool
        from starlette.datastructures import QueryParams
        from starlette.responses import FileResponse, JSONResponse

        method = scope["method"]
        try:
            check_host(scope.get("headers", []))
            route = parse(method, scope.get("raw_path") or b"", scope["path"])
            await self.wait_until_prepared(route, method)
            body = await _read_body(receive) if method == "POST" else b""
            params = QueryParams(scope.get("query_string", b""))
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            kind, payload = await run_in_threadpool(self.handle, route, params, body, headers.get("content-type", ""))
        except Refused as e:
            print(f"{e.status} {method} {scope.get('raw_path')!r}: {e.message}", file=sys.stderr, flush=True)
            body = json.dumps({"error": e.message}).encode()
            hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"x-error-message", e.message.encode("ascii", "replace"))]
            if e.code or e.status == 404:
                hdrs.append((b"x-error-code", (e.code or "RepoNotFound").encode()))
            if e.retry_after is not None:
                hdrs.append((b"retry-after", str(int(e.retry_after)).encode()))
            await send({"type": "http.response.start", "status": e.status, "headers": hdrs})
            await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})
            return
        if kind == "file":
            path, hdrs = payload
            response = FileResponse(path, headers=hdrs, media_type="application/octet-stream")
        else:
            response = JSONResponse(payload)
        await response(scope, receive, send)

    def handle(self, route: Route, params, body: bytes, content_type: str):
        hub = self.hub
        if route.kind == "list":
            return "json", handle_list(hub, route, params)
        if route.kind in ("collections", "collection"):
            return "json", handle_collections(hub, route, params)
        repo = repo_dir(hub.root, route.repo_type, route.repo_id)
        if route.kind == "info":
            return "json", handle_info(hub, route, repo, params)
        if route.kind == "refs":
            return "json", handle_refs(hub, route, repo, params)
        if route.kind == "commits":
            return "json", hub.history(repo, hub.resolve(repo, route.revision))
        if route.kind == "tree":
            return "json", handle_tree(hub, route, repo, params)
        if route.kind == "paths-info":
            return "json", handle_paths_info(hub, route, repo, body, content_type)
        commit = hub.resolve(repo, route.revision)  # resolve
        entry = hub.tree(repo, commit).get(route.path)
        if entry is None or entry.type != "file":
            raise not_found("entry")
        etag = hub.sha256(repo, entry.oid) if is_lfs(entry) else entry.oid
        hdrs = {"etag": f'"{etag}"', "x-repo-commit": commit, "cache-control": "public, max-age=31536000"
                if route.revision == commit else "no-cache"}
        if is_lfs(entry):
            hdrs.update({"x-linked-etag": f'"{etag}"', "x-linked-size": str(entry.size)})
        return "file", (hub.blob_file(repo, entry.oid), hdrs)


def check_host(headers) -> None:
    """One `Host` header naming the loopback (localhost, 127.0.0.1 or [::1], any port), else 403: a page on
    another site whose name was rebound to 127.0.0.1 (DNS rebinding) sends its own name and is refused."""
    hosts = [v.decode("latin-1") for k, v in headers if k.lower() == b"host"]
    if len(hosts) != 1 or not LOOPBACK_HOST.fullmatch(hosts[0]):
        raise Refused(403, "the local hub answers only requests to localhost, 127.0.0.1 or [::1] "
                           "(its Host header names another host)")


async def _read_body(receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_BODY:
            raise Refused(413, "request body too large")
        if not message.get("more_body"):
            return body


def main(argv: list[str] | None = None) -> None:
    import argparse
    import tomllib

    p = argparse.ArgumentParser(description="a read-only Hugging Face Hub over an icl-zoo local hub")
    p.add_argument("--config", help="TOML with [basic] host, port and mirrors-path = [ROOT] (zoo.publishing.hub.start_server)")
    p.add_argument("--root")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int)
    p.add_argument("--log-path", help="(accepted for compatibility; logs go to stdout/stderr)")
    p.add_argument("--hold", action="store_true",
                   help="load everything, then wait for a line 'serve' on stdin before listening (the caller prepares "
                        "the repos meanwhile; end of input: exit without serving); lines 'pending KEY' before it name "
                        "the repos still to come, and the lines after it say when each is 'ready' or has 'failed'")
    args = p.parse_args(argv)
    root, host, port = args.root, args.host, args.port
    if args.config:
        basic = tomllib.loads(Path(args.config).read_text()).get("basic", {})
        mirrors = basic.get("mirrors-path") or []
        if len(mirrors) != 1:
            raise SystemExit("the local hub server takes exactly one mirrors-path")
        root, host, port = root or mirrors[0], basic.get("host", host), port or basic.get("port")
    if not root or not port:
        raise SystemExit("give --root and --port, or --config")
    import uvicorn

    # what the first request would import otherwise (App.__call__ defers them for the module's importers)
    from starlette import concurrency, datastructures, responses  # noqa: F401

    pending = Pending()
    if args.hold:
        while True:
            line = sys.stdin.readline()
            verb, _, key = line.strip().partition(" ")
            if verb == "pending" and key:
                pending.add(key)
            elif verb == "serve":
                break
            else:  # the caller gave up (or failed) preparing
                return
        threading.Thread(target=pending.follow, args=(sys.stdin,), name="pending", daemon=True).start()
    root = Path(root).resolve()
    if not root.is_dir():
        raise SystemExit(f"no such folder: {root}")
    uvicorn.run(App(root, pending=pending), host=host, port=int(port), log_level="info", lifespan="off")


if __name__ == "__main__":
    main()
