"""The local hub server serves its own repos and nothing else: raw hostile request paths (not
normalised by a client) never reach a file or a git history outside the hub root. And it answers
the ordinary read calls of huggingface_hub and datasets (a table of calls against a hub prepared
from one released entry), while every write is refused."""

import hashlib
import http.client
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pytest
from huggingface_hub import (
    HfApi,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RevisionNotFoundError

from zoo.publishing import hub

SECRET = b"TOP-SECRET-5f1d2c outside the hub"
SECRET_COMMIT = "SECRET-COMMIT-9a7e outside the hub"
MODEL, DATASET = "icl-zoo/x", "icl-zoo/ds"


def _git(cwd, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """<tmp> is a git checkout holding secret.txt; the hub is <tmp>/hub, served as the RELATIVE path 'hub'."""
    tmp = tmp_path_factory.mktemp("hub-server")
    (tmp / "secret.txt").write_bytes(SECRET)
    _git(tmp, "init", "-q", "-b", "main")
    _git(tmp, "add", "secret.txt")
    _git(tmp, "commit", "-q", "-m", SECRET_COMMIT)
    model = tmp / "src-model"
    model.mkdir()
    (model / "README.md").write_text("# x\n")
    (model / "config.json").write_text('{"entry": "x"}')
    data = tmp / "src-ds" / "data" / "sub"
    data.mkdir(parents=True)
    (tmp / "src-ds" / "README.md").write_text("# ds\n")
    (data / "train.csv").write_text("a,b\n1,2\n")
    rev = hub.publish_local(model, MODEL, root=tmp / "hub")
    hub.publish_local(tmp / "src-ds", DATASET, repo_type="dataset", root=tmp / "hub")
    (tmp / "hub" / "models" / "evil").mkdir()
    (tmp / "hub" / "models" / "evil" / "link").symlink_to(tmp)  # a git repo, but outside the hub
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        proc, endpoint = hub.start_server(Path("hub"))
    try:
        yield {"endpoint": endpoint, "tmp": tmp, "rev": rev, "proc": proc}
    finally:
        hub.stop_server(proc)


def _raw(endpoint, method, path, body=None, headers=None):
    """One request with the path sent byte for byte (requests/httpx would normalise '..')."""
    conn = http.client.HTTPConnection(urlparse(endpoint).netloc, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


HOSTILE = [
    ("GET", "/../../resolve/main/secret.txt"),
    ("GET", "/%2e%2e/%2e%2e/resolve/main/secret.txt"),
    ("GET", "/%2E%2E/%2E%2E/resolve/main/secret.txt"),
    ("GET", "/%252e%252e/%252e%252e/resolve/main/secret.txt"),
    ("GET", "/..%5c..%5c/resolve/main/secret.txt"),
    ("GET", "/..\\..\\/resolve/main/secret.txt"),
    ("GET", "/models/..%2f..%2f/resolve/main/secret.txt"),
    ("GET", "/models/../../resolve/main/secret.txt"),
    ("GET", "/datasets/../../resolve/main/secret.txt"),
    ("GET", "/datasets/%2e%2e/%2e%2e/resolve/main/secret.txt"),
    ("GET", "/..%2f../resolve/main/secret.txt"),
    ("GET", "/evil/link/resolve/main/secret.txt"),
    ("GET", "/icl-zoo/x/resolve/main/../../../secret.txt"),
    ("GET", "/icl-zoo/x/resolve/main/%2e%2e/%2e%2e/%2e%2e/secret.txt"),
    ("GET", "/icl-zoo/x/resolve/main/..%2f..%2f..%2fsecret.txt"),
    ("GET", "/icl-zoo/x/resolve/main//etc/passwd"),
    ("GET", "/icl-zoo/x/resolve/main/README.md%00"),
    ("GET", "/icl-zoo/x/resolve/..%2f..%2f..%2fmain/README.md"),
    ("GET", "/api/models/../../commits/main"),
    ("GET", "/api/models/%2e%2e/%2e%2e/commits/main"),
    ("GET", "/api/models/%252e%252e/%252e%252e/commits/main"),
    ("GET", "/api/models/..%2f../commits/main"),
    ("GET", "/api/models/../.."),
    ("GET", "/api/models/../../revision/main"),
    ("GET", "/api/models/../../tree/main"),
    ("GET", "/api/datasets/%2e%2e/%2e%2e/tree/main?recursive=true"),
    ("GET", "/api/models/evil/link/commits/main"),
    ("GET", "/api/models/icl-zoo/x/../../../../commits/main"),
    ("GET", "/api/models/icl-zoo/x/tree/main/..%2f..%2f..%2f..%2f"),
    ("GET", "/api/models/icl-zoo/x/revision/..%2f..%2fmain"),
    ("GET", "/api/models/icl-zoo/x/tree/main/%2e%2e/%2e%2e"),
    ("GET", "/api/models/evil/link"),
    ("GET", "/api/models/evil/link/refs"),
    ("GET", "/api/models/evil/link/tree/main"),
    ("GET", "/api/collections/../../secret.txt"),
    ("GET", "/api/collections/%2e%2e/%2e%2e"),
    ("POST", "/api/models/../../paths-info/main"),
    ("POST", "/api/models/evil/link/paths-info/main"),
    ("POST", "/api/models/icl-zoo/x/commit/main"),
    ("POST", "/api/repos/create"),
    ("PATCH", "/api/models/icl-zoo/x/settings"),
    ("HEAD", "/../../resolve/main/secret.txt"),
    ("HEAD", "/%2e%2e/%2e%2e/resolve/main/secret.txt"),
    ("POST", "/api/models/icl-zoo/x/paths-info/main"),
    ("PUT", "/icl-zoo/x/resolve/main/README.md"),
    ("DELETE", "/icl-zoo/x/resolve/main/README.md"),
]


def test_hostile_requests_never_reach_outside_the_hub(server):
    let_through = []
    for method, path in HOSTILE:
        status, body = _raw(server["endpoint"], method, path, body=SECRET if method in ("POST", "PUT") else None)
        if status == 200 or SECRET in body or SECRET_COMMIT.encode() in body:
            let_through.append((method, path, status, body[:200]))
        assert 400 <= status < 500, (method, path, status, body[:200])
    assert not let_through


def test_paths_and_commits_outside_the_hub_are_not_found(server):
    ep, tmp = server["endpoint"], server["tmp"]
    outside = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp, capture_output=True, text=True, check=True).stdout.strip()
    for path in (f"/icl-zoo/x/resolve/{outside}/secret.txt", f"/api/models/icl-zoo/x/revision/{outside}",
                 f"/api/models/icl-zoo/x/commits/{outside}", f"/api/models/icl-zoo/x/tree/{outside}"):
        status, body = _raw(ep, "GET", path)
        assert status == 404 and SECRET not in body and SECRET_COMMIT.encode() not in body, (path, status)
    form = b"paths=secret.txt&paths=../../secret.txt&paths=..%2f..%2fsecret.txt&expand=true"
    for repo in ("icl-zoo/x", "evil/link"):
        status, body = _raw(ep, "POST", f"/api/models/{repo}/paths-info/main", body=form,
                            headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert (status, body) == (200, b"[]") if repo == "icl-zoo/x" else status == 404, (repo, status, body)


def test_served_root_is_absolute(server):
    toml = (server["proc"].workdir / "hub.toml").read_text()
    assert f'mirrors-path = ["{(server["tmp"] / "hub").resolve().as_posix()}"]' in toml


def test_the_hub_s_own_repos_still_download(server, tmp_path):
    ep = server["endpoint"]
    path = hf_hub_download(MODEL, "config.json", endpoint=ep, cache_dir=tmp_path)
    assert Path(path).read_text() == '{"entry": "x"}'
    path = hf_hub_download(MODEL, "README.md", revision=server["rev"], endpoint=ep, cache_dir=tmp_path)
    assert Path(path).read_text() == "# x\n"
    path = hf_hub_download(DATASET, "data/sub/train.csv", repo_type="dataset", endpoint=ep, cache_dir=tmp_path)
    assert Path(path).read_text() == "a,b\n1,2\n"
    api = HfApi(endpoint=ep)
    assert sorted(api.list_repo_files(DATASET, repo_type="dataset")) == ["README.md", "data/sub/train.csv"]
    tree = list(api.list_repo_tree(DATASET, path_in_repo="data/sub", repo_type="dataset"))  # tree/main/data%2Fsub
    assert [f.path for f in tree] == ["data/sub/train.csv"]
    status, body = _raw(ep, "GET", "/api/models/icl-zoo/x/commits/main")
    assert status == 200 and server["rev"].encode() in body
    status, body = _raw(ep, "GET", "/icl-zoo/x/resolve/main/config.json")  # the raw form of a good request
    assert (status, body) == (200, b'{"entry": "x"}')
    status, _ = _raw(ep, "GET", "/icl-zoo/missing/resolve/main/config.json")
    assert status == 404


# ---------------------------------------------------------------- conformance: a hub prepared from the release
ENTRY = "gated-rnn-student-d4"  # small, with safetensors + ONNX graphs + figures; its task's splits are small
ORG_ENTRY = f"icl-zoo/{ENTRY}"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _front_matter(text: str) -> dict:
    import yaml

    return yaml.safe_load(text.split("---\n", 2)[1])


def _parameters(path: Path) -> dict[str, int]:
    """Parameters per dtype, read with the safetensors library (independently of the server)."""
    from safetensors import safe_open

    counts: dict[str, int] = {}
    with safe_open(str(path), framework="numpy") as f:
        for key in f.keys():  # noqa: SIM118  (a safe_open handle, not a dict)
            t = f.get_slice(key)
            counts[t.get_dtype()] = counts.get(t.get_dtype(), 0) + int(np.prod(t.get_shape()))
    return counts


@pytest.fixture(scope="module")
def release_hub(tmp_path_factory):
    """A one-entry release (ENTRY's released folder and an index of its files) prepared into a hub with
    zoo.publishing.hub_prepare (model repo + its task's dataset repo, tagged with the version), then a second
    commit on the model's main, and another organisation's repo; served by `zoo.publishing.hub.start_server`."""
    from zoo.publishing.hub_prepare import prepare
    from zoo.storage.locate import VERSION, release_dir

    tmp = tmp_path_factory.mktemp("release-hub")
    release = tmp / "release"
    shutil.copytree(release_dir() / ENTRY, release / ENTRY)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((release / ENTRY).iterdir())}
    (release / "index.json").write_text(json.dumps({"version": VERSION, "entries": {ENTRY: {"entry": ENTRY, "files": files}}}))
    root = tmp / "hub"
    marker = prepare(root, release, progress=False)
    again = prepare(root, release, progress=False)
    task = json.loads((release / ENTRY / "config.json").read_text())["entry"]["task"]

    edited = tmp / "edited"
    shutil.copytree(release / ENTRY, edited)
    (edited / "NOTES.md").write_text("a later commit on main\n")
    main = hub.publish_local(edited, ORG_ENTRY, root=root, message="Add notes\n\nbody of the message")
    other = tmp / "other"
    other.mkdir()
    (other / "README.md").write_text("---\ntags:\n- icl-zoo\n---\n# not ours\n")
    hub.publish_local(other, "other-org/gated-rnn-student-d4-copy", root=root)

    proc, endpoint = hub.start_server(root)
    try:
        yield SimpleNamespace(
            endpoint=endpoint, api=HfApi(endpoint=endpoint), root=root, folder=release / ENTRY, files=files,
            version=VERSION, task=task, dataset=f"icl-zoo/{task}", tagged=marker["models"][ENTRY], main=main,
            marker=marker, again=again, card=_front_matter((release / ENTRY / "README.md").read_text()),
            tmp=tmp, proc=proc,
        )
    finally:
        hub.stop_server(proc)


def test_prepare_once_per_release(release_hub):
    h = release_hub
    assert h.marker["reused"] is False and h.again["reused"] is True and h.again["key"] == h.marker["key"]
    assert set(h.marker["models"]) == {ENTRY} and set(h.marker["datasets"]) == {h.task}
    from zoo.publishing.hub_prepare import is_prepared, release_key

    assert is_prepared(h.root, h.marker["key"])
    changed = h.tmp / "release-changed"
    shutil.copytree(h.folder.parent, changed)
    (changed / "index.json").write_text((changed / "index.json").read_text() + "\n")
    assert release_key(changed)[0] != h.marker["key"]  # any change to index.json prepares again


def _git_out(repo: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={repo / '.git'}", *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_repo_written_without_git_is_the_one_git_writes(tmp_path):
    """zoo.publishing.hub_git writes a new repo's commit in-process (one pack, packed refs): git checks it whole and
    finds the tree `git add` makes of the same files, main and the tag; `zoo publish` then commits on top of it."""
    from zoo.publishing.hub_git import write_new_repo

    files = {"README.md": b"# x\n", "config.json": b"{}", "data/test-00000-of-00001.parquet": os.urandom(200_000),
             "data-x": b"", "data/sub/a.bin": b"a" * 70_000, "copy.md": b"# x\n"}
    src = tmp_path / "src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    root = tmp_path / "hub"
    hub.publish_local(src, "org/by-git", root=root)
    direct = root / "models" / "org" / "direct"
    commit = write_new_repo(direct, files, message="icl-zoo release v9", tag="v9")
    subprocess.run(["git", f"--git-dir={direct / '.git'}", "fsck", "--strict", "--full"], check=True, capture_output=True)
    assert _git_out(direct, "rev-parse", "main^{tree}") == _git_out(root / "models/org/by-git", "rev-parse", "main^{tree}")
    assert _git_out(direct, "rev-parse", "main", "v9").split() == [commit, commit]
    assert _git_out(direct, "log", "--format=%an <%ae>|%s") == "icl-zoo <icl-zoo@localhost>|icl-zoo release v9"
    for rel, data in files.items():
        assert subprocess.run(["git", f"--git-dir={direct / '.git'}", "cat-file", "blob", f"v9:{rel}"],
                              capture_output=True, check=True).stdout == data
    (src / "NOTES.md").write_text("later\n")
    later = hub.publish_local(src, "org/direct", root=root, message="Add notes")
    assert _git_out(direct, "rev-list", "main").split() == [later, commit]
    assert _git_out(direct, "diff", "--name-only", commit, later) == "NOTES.md"
    with pytest.raises(FileExistsError):
        write_new_repo(direct, files, message="again")
    for bad in ({"../x": b""}, {"a/.git/config": b""}, {"a": b"", "a/b": b""}, {"/abs": b""}):
        with pytest.raises(ValueError):
            write_new_repo(root / "models" / "org" / "bad", bad, message="m")
    assert sorted(p.name for p in (root / "models" / "org").iterdir()) == ["by-git", "direct"]  # nothing left staged


def test_split_identity_reads_as_the_frozen_splits_do(tmp_path):
    """The torch-free check of a cached dataset repo's parquet gives zoo.science.tasks.frozen's content hash."""
    from zoo.publishing.hub_prepare import split_identity
    from zoo.science.tasks.frozen import content_hash, save_split

    gen = np.random.default_rng(0)
    x, y = gen.standard_normal((7, 5, 3), dtype=np.float32), gen.standard_normal((7, 5, 2), dtype=np.float32)
    save_split(x, y, tmp_path)
    assert split_identity((tmp_path / "data.parquet").read_bytes()) == (7, content_hash(x, y))


def _rewrite_parquet(path: Path, change) -> None:
    """The split at `path` rewritten with `change(columns, metadata)` applied (a valid parquet file)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    columns = {n: table.column(n).combine_chunks() for n in table.column_names}
    metadata = dict(table.schema.metadata)
    change(columns, metadata)
    pq.write_table(pa.table(columns).replace_schema_metadata(metadata), path)


def _one_value_changed(columns, metadata):
    x = columns["x"].storage if isinstance(columns["x"].type, pa.ExtensionType) else columns["x"]
    values = x.flatten().flatten().to_numpy().copy()
    values[0] += 1
    inner = pa.ListArray.from_arrays(x.flatten().offsets, pa.array(values))
    columns["x"] = pa.ListArray.from_arrays(x.offsets, inner)


def _ragged(columns, metadata):
    """The same values in the same order (so the same bytes to hash), the first two rows' boundary moved."""
    x = columns["x"].storage if isinstance(columns["x"].type, pa.ExtensionType) else columns["x"]
    offsets = x.offsets.to_numpy().copy()
    offsets[1] += 1
    columns["x"] = pa.ListArray.from_arrays(pa.array(offsets), x.flatten())


def _float16_declared(columns, metadata):
    metadata[b"huggingface"] = metadata[b"huggingface"].replace(b'"float32"', b'"float16"', 1)


CACHE_TAMPERING = {
    "a value changed": lambda e: _rewrite_parquet(e / "data" / "test-00000-of-00001.parquet", _one_value_changed),
    "rows made ragged": lambda e: _rewrite_parquet(e / "data" / "test-00000-of-00001.parquet", _ragged),
    "another dtype declared": lambda e: _rewrite_parquet(e / "data" / "test-00000-of-00001.parquet", _float16_declared),
    "not parquet": lambda e: (e / "data" / "test-00000-of-00001.parquet").write_bytes(b"PAR1 not really"),
    "hashes.json edited": lambda e: (e / "hashes.json").write_text((e / "hashes.json").read_text().replace('"seed": ', '"seed": 1')),
    "card quotes another hash": lambda e: (e / "README.md").write_text(
        (e / "README.md").read_text() + "\nexpected_sha256=" + "0" * 64 + "\n"),
    "a file missing": lambda e: (e / "hashes.json").unlink(),
    "a file too many": lambda e: (e / "data" / "evil.py").write_text("import os\n"),
    "a symlink": lambda e: ((e / "README.md").rename(e.parent / "elsewhere.md"),
                            (e / "README.md").symlink_to(e.parent / "elsewhere.md")),
    "a FIFO": lambda e: ((e / "README.md").unlink(), os.mkfifo(e / "README.md")),
}


@pytest.fixture(scope="module")
def dataset_cache(release_hub, tmp_path_factory):
    """The cached dataset repo the release_hub preparation kept (its task's only entry), and what pins it."""
    from zoo.publishing import hub_prepare as hp

    h = release_hub
    (entry,) = (Path(os.environ["ICL_ZOO_CACHE"]) / hp.DATASET_CACHE / h.task).iterdir()
    pristine = tmp_path_factory.mktemp("pristine") / entry.name
    shutil.copytree(entry, pristine)
    pinned = hp.pinned_splits(json.loads((h.folder / "config.json").read_text())["task"])
    return SimpleNamespace(key=entry.name, pristine=pristine, pinned=pinned)


@pytest.mark.parametrize("tamper", list(CACHE_TAMPERING))
def test_a_cached_dataset_repo_that_does_not_check_out_is_refused(release_hub, dataset_cache, tamper, tmp_path,
                                                                 monkeypatch, capsys):
    from zoo.publishing import hub_prepare as hp

    monkeypatch.setenv("ICL_ZOO_CACHE", str(tmp_path / "cache"))
    entry = hp.cache_folder(release_hub.task, dataset_cache.key)
    shutil.copytree(dataset_cache.pristine, entry)
    assert hp.cached_dataset(release_hub.task, dataset_cache.key, dataset_cache.pinned) is not None  # as kept
    CACHE_TAMPERING[tamper](entry)
    assert hp.cached_dataset(release_hub.task, dataset_cache.key, dataset_cache.pinned) is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: the cached dataset repo {entry} is not used (") and line.endswith("rebuilding it")


def test_an_empty_hub_dir_takes_the_dataset_repos_from_the_cache(release_hub, dataset_cache, tmp_path, monkeypatch):
    """A new hub dir gets the dataset repo from the cache (the same files: the same tree as the first preparation's);
    with the cache entry itself a symlink, or its data changed, the repo is rebuilt and the cache entry rewritten."""
    from zoo.publishing import hub_prepare as hp

    h = release_hub
    monkeypatch.setenv("ICL_ZOO_CACHE", str(tmp_path / "cache"))
    entry = hp.cache_folder(h.task, dataset_cache.key)
    shutil.copytree(dataset_cache.pristine, entry)
    if hp.dataset_key(h.task, hp.dataset_sources()) != dataset_cache.key:
        pytest.skip("a dataset source changed since the fixture prepared the hub (files edited meanwhile)")

    def tree(root: Path) -> str:
        return _git_out(root / "datasets" / h.dataset, "rev-parse", f"{h.version}^{{tree}}")

    marker = hp.prepare(tmp_path / "hub-1", h.folder.parent, progress=False)
    assert marker["reused"] is False and marker["datasets_from_cache"] == [h.task]
    assert tree(tmp_path / "hub-1") == tree(h.root)
    assert marker["models"][ENTRY] == _git_out(tmp_path / "hub-1" / "models" / ORG_ENTRY, "rev-parse", h.version)

    shutil.move(entry, tmp_path / "real-entry")
    entry.symlink_to(tmp_path / "real-entry", target_is_directory=True)
    _rewrite_parquet(tmp_path / "real-entry" / "data" / "test-00000-of-00001.parquet", _one_value_changed)
    marker = hp.prepare(tmp_path / "hub-2", h.folder.parent, progress=False)
    assert marker["datasets_from_cache"] == [] and tree(tmp_path / "hub-2") == tree(h.root)
    assert not entry.is_symlink() and hp.cached_dataset(h.task, dataset_cache.key, dataset_cache.pinned) is not None



def test_a_dataset_repo_s_parquet_is_the_frozen_split_cache_s_file(release_hub, tmp_path):
    """A split is written through `datasets` once, into the frozen-split cache: the dataset repo holds that file's
    bytes (checked: its content hash and schema), the bytes writing the same arrays again would give."""
    from zoo.publishing.hub_prepare import frozen_parquet
    from zoo.science.registry import get_task_spec
    from zoo.science.tasks.frozen import load_split, save_split

    h = release_hub
    split = load_split(h.task, "test", spec=get_task_spec(h.task))
    cached = frozen_parquet(h.task, "test", len(split.x), split.sha256)
    save_split(split.x, split.y, tmp_path / "again")
    assert cached is not None and cached == (tmp_path / "again" / "data.parquet").read_bytes()
    served = subprocess.run(["git", f"--git-dir={h.root / 'datasets' / h.dataset / '.git'}", "show",
                             f"{h.version}:data/test-00000-of-00001.parquet"], capture_output=True, check=True).stdout
    assert served == cached
    assert frozen_parquet(h.task, "test", len(split.x), "0" * 64) is None  # not the pinned content: written afresh
    assert frozen_parquet(h.task, "no_such_split", len(split.x), split.sha256) is None

def _model_listing(h):
    api = h.api
    assert [m.id for m in api.list_models(author="icl-zoo")] == [ORG_ENTRY]
    assert sorted(m.id for m in api.list_models(search="student-d4")) == [ORG_ENTRY, "other-org/gated-rnn-student-d4-copy"]
    assert [m.id for m in api.list_models(search="student-d4", author="icl-zoo")] == [ORG_ENTRY]
    tag = next(t for t in h.card["tags"] if t != "icl-zoo")  # the other org's repo has only "icl-zoo"
    assert [m.id for m in api.list_models(filter=tag)] == [ORG_ENTRY]
    assert [m.id for m in api.list_models(filter=[tag, "onnx"], author="icl-zoo")] == [ORG_ENTRY]
    assert list(api.list_models(filter="no-such-tag")) == [] and list(api.list_models(search="nothing-like-it")) == []
    (m,) = api.list_models(author="icl-zoo", cardData=True)
    assert m.pipeline_tag == h.card.get("pipeline_tag") and m.card_data.get("tags") == h.card["tags"]


def _dataset_listing(h):
    assert [d.id for d in h.api.list_datasets(author="icl-zoo")] == [h.dataset]
    assert [d.id for d in h.api.list_datasets(search=h.task)] == [h.dataset]
    assert [d.id for d in h.api.list_datasets(filter="format:parquet")] == [h.dataset]


def _model_info(h):
    latest, tagged = h.api.model_info(ORG_ENTRY), h.api.model_info(ORG_ENTRY, revision=h.version)
    assert (latest.sha, tagged.sha) == (h.main, h.tagged) and latest.sha != tagged.sha
    assert h.api.model_info(ORG_ENTRY, revision=h.tagged).sha == h.tagged
    for info in (latest, tagged):
        assert set(h.card["tags"]) <= set(info.tags)  # what the card says, plus what the Hub derives:
        assert {"safetensors", "onnx", f"license:{h.card['license']}"} | {f"dataset:{d}" for d in h.card["datasets"]} <= set(info.tags)
        assert info.pipeline_tag == h.card.get("pipeline_tag") and info.library_name == h.card["library_name"]
        assert info.card_data.to_dict()["model-index"] == h.card["model-index"]
        assert info.config == json.loads((h.folder / "config.json").read_text())
        params = _parameters(h.folder / "model.safetensors")
        assert info.safetensors.parameters == params and info.safetensors.total == sum(params.values()) > 0
        assert info.author == "icl-zoo" and info.private is False and info.last_modified is not None
    assert sorted(s.rfilename for s in tagged.siblings) == sorted(h.files)
    assert sorted(s.rfilename for s in latest.siblings) == sorted([*h.files, "NOTES.md"])
    blobs = {s.rfilename: s for s in h.api.model_info(ORG_ENTRY, revision=h.version, files_metadata=True).siblings}
    assert blobs["model.safetensors"].lfs.sha256 == h.files["model.safetensors"]  # the release index's hash
    assert blobs["config.json"].lfs is None and blobs["config.json"].size == (h.folder / "config.json").stat().st_size
    only = h.api.model_info(ORG_ENTRY, expand=["safetensors", "pipeline_tag"])
    assert only.safetensors.total == tagged.safetensors.total and only.tags is None


def _dataset_info(h):
    latest, tagged = h.api.dataset_info(h.dataset), h.api.dataset_info(h.dataset, revision=h.version)
    assert latest.sha == tagged.sha == h.marker["datasets"][h.task]
    assert {"icl-zoo", "in-context-learning", "license:apache-2.0", "format:parquet"} <= set(latest.tags)
    assert latest.card_data.to_dict()["configs"][0]["config_name"] == "default"
    assert {s.rfilename for s in latest.siblings} >= {"README.md", "hashes.json", "data/test-00000-of-00001.parquet"}


def _repo_exists(h):
    api = h.api
    assert api.repo_exists(ORG_ENTRY) and api.repo_exists(h.dataset, repo_type="dataset")
    assert not api.repo_exists("icl-zoo/no-such-entry") and not api.repo_exists(ORG_ENTRY, repo_type="dataset")
    assert api.revision_exists(ORG_ENTRY, h.version) and api.revision_exists(ORG_ENTRY, h.tagged)
    assert not api.revision_exists(ORG_ENTRY, "v9.9.9") and not api.revision_exists(ORG_ENTRY, "0" * 40)
    # full ref names resolve; a name with '/' the repo does not hold is RevisionNotFound, not a bad path
    assert api.model_info(ORG_ENTRY, revision=f"refs/tags/{h.version}").sha == h.tagged
    assert api.model_info(ORG_ENTRY, revision="refs/heads/main").sha == h.main
    for missing in ("refs/pr/1", "refs/convert/parquet", "refs/heads/no-such-branch"):
        assert not api.revision_exists(ORG_ENTRY, missing)
        with pytest.raises(RevisionNotFoundError):
            hf_hub_download(ORG_ENTRY, "config.json", revision=missing, endpoint=h.endpoint, cache_dir=h.tmp / "hf-cache")
    assert api.file_exists(ORG_ENTRY, "NOTES.md") and not api.file_exists(ORG_ENTRY, "NOTES.md", revision=h.version)


def _refs(h):
    refs = h.api.list_repo_refs(ORG_ENTRY)
    assert [(b.name, b.ref, b.target_commit) for b in refs.branches] == [("main", "refs/heads/main", h.main)]
    assert [(t.name, t.ref, t.target_commit) for t in refs.tags] == [(h.version, f"refs/tags/{h.version}", h.tagged)]
    assert refs.converts == [] and h.api.list_repo_refs(ORG_ENTRY, include_pull_requests=True).pull_requests == []


def _commits(h):
    commits = h.api.list_repo_commits(ORG_ENTRY)
    assert [c.commit_id for c in commits] == [h.main, h.tagged]
    assert (commits[0].title, commits[0].message) == ("Add notes", "body of the message")
    assert commits[1].title == f"icl-zoo release {h.version}" and commits[0].authors == ["icl-zoo"]
    assert commits[0].created_at >= commits[1].created_at
    assert [c.commit_id for c in h.api.list_repo_commits(ORG_ENTRY, revision=h.version)] == [h.tagged]


def _tree(h):
    api = h.api
    root = {e.path: e for e in api.list_repo_tree(ORG_ENTRY, revision=h.version)}
    assert set(root) == set(h.files)
    assert root["model.safetensors"].lfs.sha256 == h.files["model.safetensors"] and root["README.md"].lfs is None
    ds = {e.path: type(e).__name__ for e in api.list_repo_tree(h.dataset, repo_type="dataset")}
    assert ds["data"] == "RepoFolder" and "data/test-00000-of-00001.parquet" not in ds
    deep = {e.path: e for e in api.list_repo_tree(h.dataset, repo_type="dataset", recursive=True, expand=True)}
    assert type(deep["data"]).__name__ == "RepoFolder" and deep["data/test-00000-of-00001.parquet"].size > 0
    assert deep["README.md"].last_commit.oid == h.marker["datasets"][h.task]
    assert [e.path for e in api.list_repo_tree(h.dataset, path_in_repo="data", repo_type="dataset")] == \
        [f"data/{s}-00000-of-00001.parquet" for s in ("test", "validation")]
    assert sorted(api.list_repo_files(ORG_ENTRY)) == sorted([*h.files, "NOTES.md"])
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree(ORG_ENTRY, path_in_repo="no-such-folder"))


def _paths_info(h):
    got = h.api.get_paths_info(h.dataset, ["data", "README.md", "no/such/file"], repo_type="dataset", expand=True)
    assert [(type(e).__name__, e.path) for e in got] == [("RepoFolder", "data"), ("RepoFile", "README.md")]
    assert got[1].last_commit.oid == h.marker["datasets"][h.task]
    (st,) = h.api.get_paths_info(ORG_ENTRY, "model.safetensors", revision=h.version)
    assert st.lfs.sha256 == h.files["model.safetensors"] and st.size == (h.folder / "model.safetensors").stat().st_size


def _downloads(h):
    cache = h.tmp / "hf-cache"
    path = Path(hf_hub_download(ORG_ENTRY, "model.safetensors", revision=h.version, endpoint=h.endpoint, cache_dir=cache))
    assert path.read_bytes() == (h.folder / "model.safetensors").read_bytes()
    assert path.resolve().name == h.files["model.safetensors"]  # the cache's blob is named by the ETag: the SHA-256
    meta = get_hf_file_metadata(hf_hub_url(ORG_ENTRY, "config.json", revision=h.version, endpoint=h.endpoint))
    assert meta.commit_hash == h.tagged and meta.size == (h.folder / "config.json").stat().st_size
    assert meta.etag == git_blob_sha1((h.folder / "config.json").read_bytes())  # a plain file's ETag: its git oid
    snap = Path(snapshot_download(ORG_ENTRY, revision=h.version, endpoint=h.endpoint, cache_dir=cache))
    assert snap.name == h.tagged
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in snap.iterdir()} == h.files
    latest = Path(snapshot_download(ORG_ENTRY, endpoint=h.endpoint, cache_dir=cache))
    assert latest.name == h.main and (latest / "NOTES.md").is_file()
    data = hf_hub_download(h.dataset, "hashes.json", repo_type="dataset", endpoint=h.endpoint, cache_dir=cache)
    assert json.loads(Path(data).read_text())["task"] == h.task


def _ranges(h):
    path = f"/datasets/{h.dataset}/resolve/{h.version}/data/test-00000-of-00001.parquet"
    whole = _raw(h.endpoint, "GET", path)[1]
    assert whole[:4] == whole[-4:] == b"PAR1"
    assert _raw(h.endpoint, "GET", path, headers={"Range": "bytes=0-3"}) == (206, b"PAR1")
    assert _raw(h.endpoint, "GET", path, headers={"Range": "bytes=-4"}) == (206, b"PAR1")
    assert _raw(h.endpoint, "GET", path, headers={"Range": "bytes=100-199"}) == (206, whole[100:200])
    assert _raw(h.endpoint, "GET", path, headers={"Range": f"bytes={len(whole)}-"})[0] == 416
    import pyarrow.parquet as pq
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem(endpoint=h.endpoint)  # reads by Range requests
    with fs.open(f"datasets/{h.dataset}@{h.version}/data/test-00000-of-00001.parquet", block_size=1 << 16) as f:
        table = pq.ParquetFile(f).read()
    assert table.equals(pq.read_table(pa.BufferReader(whole)))


DATASETS_SCRIPT = """
import json, sys
import datasets
repo, revision = sys.argv[1], sys.argv[2]
stream = datasets.load_dataset(repo, split="test", streaming=True, revision=revision)
rows = list(stream)
full = datasets.load_dataset(repo, split="test", revision=revision)
print(json.dumps({"n": len(rows), "first_x": rows[0]["x"], "full_n": full.num_rows, "full_first_x": full[0]["x"]}))
"""


def _datasets_load(h):
    """`datasets` pointed at the hub through HF_ENDPOINT, as a user does, in a fresh process."""
    import pyarrow.parquet as pq

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_ENDPOINT=h.endpoint, HF_HOME=str(h.tmp / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1")
    out = subprocess.run([sys.executable, "-c", DATASETS_SCRIPT, h.dataset, h.version], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    hashes = json.loads(_raw(h.endpoint, "GET", f"/datasets/{h.dataset}/resolve/main/hashes.json")[1])
    table = pq.read_table(pa.BufferReader(_raw(h.endpoint, "GET", f"/datasets/{h.dataset}/resolve/main/data/test-00000-of-00001.parquet")[1]))
    assert got["n"] == got["full_n"] == hashes["splits"]["test"]["n"] == table.num_rows
    assert got["first_x"] == got["full_first_x"] == table.column("x")[0].as_py()


def _collection(h):
    (listed,) = h.api.list_collections(owner="icl-zoo")
    assert list(h.api.list_collections(owner="someone-else")) == []
    c = h.api.get_collection(listed.slug)
    assert c.slug == listed.slug and c.slug.startswith("icl-zoo/") and h.version in c.title
    assert (c.owner if isinstance(c.owner, str) else c.owner["name"]) == "icl-zoo"
    assert [(i.item_type, i.item_id) for i in c.items] == [("model", ORG_ENTRY), ("dataset", h.dataset)]
    with pytest.raises(HfHubHTTPError):
        h.api.get_collection("icl-zoo/no-such-collection-0123")


def _writes_refused(h):
    api = HfApi(endpoint=h.endpoint, token="hf_not_a_real_token")
    attempts = [
        lambda: api.create_repo("icl-zoo/new"),
        lambda: api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=ORG_ENTRY),
        lambda: api.create_tag(ORG_ENTRY, tag="v9"),
        lambda: api.delete_repo(ORG_ENTRY),
        lambda: api.create_collection("mine", namespace="icl-zoo"),
    ]
    for attempt in attempts:
        with pytest.raises(HfHubHTTPError) as e:
            attempt()
        assert 400 <= e.value.response.status_code < 500
    assert h.api.list_repo_commits(ORG_ENTRY)[0].commit_id == h.main  # nothing moved
    for method, path in [("PUT", f"/{ORG_ENTRY}/resolve/main/README.md"), ("DELETE", f"/api/models/{ORG_ENTRY}"),
                         ("POST", f"/api/models/{ORG_ENTRY}/commit/main"), ("PATCH", f"/api/models/{ORG_ENTRY}/settings")]:
        assert 400 <= _raw(h.endpoint, method, path, body=b"{}")[0] < 500


CALLS = {
    "list_models (author, search, filter)": _model_listing,
    "list_datasets (author, search, filter)": _dataset_listing,
    "model_info (with and without revision; card, config, safetensors)": _model_info,
    "dataset_info (with and without revision)": _dataset_info,
    "repo_exists / revision_exists / file_exists": _repo_exists,
    "list_repo_refs": _refs,
    "list_repo_commits": _commits,
    "list_repo_tree / list_repo_files": _tree,
    "get_paths_info (POST paths-info)": _paths_info,
    "hf_hub_download / snapshot_download with etags": _downloads,
    "Range requests / pyarrow over HfFileSystem": _ranges,
    "datasets.load_dataset (streaming and not)": _datasets_load,
    "list_collections / get_collection": _collection,
    "writes refused": _writes_refused,
}


@pytest.mark.parametrize("call", list(CALLS))
def test_hub_call(release_hub, call):
    CALLS[call](release_hub)


def test_the_library_snippet_of_the_readme_runs_as_written(release_hub, tmp_path):
    """README's "On the Hugging Face Hub" snippet (the one the Hub would show for `library_name: icl-zoo`), with
    <entry> filled in, loads the served repo from an empty folder as a torch module in eval mode."""
    from markdown_it import MarkdownIt

    h = release_hub
    assert h.card["library_name"] == "icl-zoo"
    text = (Path(__file__).parents[1] / "README.md").read_text()
    section = text.split("#### On the Hugging Face Hub", 1)[1]
    snippet = next(t.content for t in MarkdownIt("commonmark").parse(section) if t.type == "fence")  # its first
    assert 'zoo.from_pretrained("icl-zoo/<entry>")' in snippet
    code = snippet.replace("<entry>", ENTRY) + "print(type(model).__mro__[-2].__name__, model.training)\n"
    from zoo.publishing.hub_prepare import prepare

    prepare(tmp_path / "hub", h.folder.parent, progress=False)  # the release alone (release_hub's main moved on)
    with hub.serve(tmp_path / "hub") as endpoint:
        env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf")}
        out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Module", "False"]


# ---------------------------------------------------------------- hostile repos and requests
def _bomb(levels: int) -> bytes:
    """A card whose front matter is a "billion laughs": 9**levels strings from a few hundred bytes of aliases."""
    names = "abcdefghijkl"[:levels]
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]" for prev, cur in itertools.pairwise(names)]
    return ("---\n" + "\n".join(lines) + "\n---\n# bomb\n").encode()


def _rss(proc) -> int:
    import psutil

    return psutil.Process(proc.pid).memory_info().rss


def _request(endpoint, method, path, host: str | None, timeout: float = 30):
    """One request whose Host header is `host` exactly (None: no Host header at all)."""
    conn = http.client.HTTPConnection(urlparse(endpoint).netloc, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_card_front_matter_refuses_yaml_aliases_and_deep_nesting():
    from zoo.publishing.hub_server import card_data

    assert card_data(b"---\nlicense: mit\ntags:\n- a\n- b\n---\n# ok\n") == {"license": "mit", "tags": ["a", "b"]}
    assert card_data(b"---\nlicense: &l mit\nalso: *l\n---\n") == {}  # an alias: the card has no metadata
    assert card_data(_bomb(7)) == {}  # 287 bytes; before: 3.9 s and 0.5 GB, 9 levels many GB
    assert card_data(b"---\nx: " + b"[" * 5000 + b"]" * 5000 + b"\n---\n") == {}  # nesting past any card's depth
    assert card_data(b"---\nx: " + b"9" * 5000 + b"\n---\n") == {}  # past int()'s digit limit: unreadable, not a 500


def test_a_yaml_bomb_card_costs_the_server_neither_time_nor_memory(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "README.md").write_bytes(_bomb(7))
    hub.publish_local(src, "evil/bomb", root=tmp_path / "hub")
    proc, endpoint = hub.start_server(tmp_path / "hub")
    try:
        before = _rss(proc)
        for _ in range(3):  # every request, not only the first
            status, body = _raw(endpoint, "GET", "/api/models/evil/bomb")
            assert status == 200 and json.loads(body)["cardData"] == {}
        assert HfApi(endpoint=endpoint).model_info("evil/bomb").id == "evil/bomb"
        grown = _rss(proc) - before
    finally:
        hub.stop_server(proc)
    assert grown < 100 << 20, f"the server grew {grown >> 20} MiB"


def _lfs_repo(tmp_path):
    from zoo.publishing.hub_server import Hub, repo_dir

    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    data = os.urandom(4096)
    (src / "w.onnx").write_bytes(data)  # an LFS kind: its ETag is the SHA-256
    hub.publish_local(src, "org/lfs", root=tmp_path / "hub")
    h = Hub(tmp_path / "hub")
    return h, repo_dir(h.root, "models", "org/lfs"), git_blob_sha1(data), hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("sidecar", ["", "\n", "zz", "0" * 63, "g" * 64, '"; x', "0" * 65, "A" * 64 + "\n" + "0" * 64])
def test_a_malformed_hash_sidecar_is_recomputed_not_trusted(tmp_path, sidecar):
    from zoo.publishing.hub_server import Hub

    h, repo, oid, sha = _lfs_repo(tmp_path)
    side = h.blobs / f"{oid}.sha256"
    side.write_text(sidecar)
    assert Hub(h.root).sha256(repo, oid) == sha  # a fresh Hub: nothing memoised
    assert side.read_text() == sha  # and the sidecar is repaired


CRASH_MID_WRITE = """
import resource, sys
from pathlib import Path
from zoo.publishing.hub_server import Hub, repo_dir
h = Hub(Path(sys.argv[1]))
repo = repo_dir(h.root, "models", "org/lfs")
h.blob_file(repo, sys.argv[2])  # the blob is cached; then no file may grow past 10 bytes: the next write dies
resource.setrlimit(resource.RLIMIT_FSIZE, (10, 10))
h.sha256(repo, sys.argv[2])
"""


def test_a_sidecar_write_cut_short_leaves_no_sidecar_behind(tmp_path):
    """A server killed while writing a sidecar (here: by a file-size limit, SIGXFSZ) must not leave a
    truncated one for the next server to trust. Before: write_text truncated first, so "" was left: `ETag: ""`."""
    from zoo.publishing.hub_server import Hub

    h, repo, oid, sha = _lfs_repo(tmp_path)
    out = subprocess.run([sys.executable, "-c", CRASH_MID_WRITE, str(h.root), oid], capture_output=True, timeout=60,
                         check=False)
    assert out.returncode != 0  # it did die mid-write
    side = h.blobs / f"{oid}.sha256"
    assert not side.exists() or side.read_text() == sha, repr(side.read_text())
    assert Hub(h.root).sha256(repo, oid) == sha


def test_an_empty_sidecar_never_becomes_an_empty_etag(tmp_path):
    h, _, oid, sha = _lfs_repo(tmp_path)
    (h.blobs / f"{oid}.sha256").write_text("")
    proc, endpoint = hub.start_server(tmp_path / "hub")
    try:
        meta = get_hf_file_metadata(hf_hub_url("org/lfs", "w.onnx", endpoint=endpoint))
    finally:
        hub.stop_server(proc)
    assert meta.etag == sha


def _evil_repos(server) -> dict[str, Path]:
    """Repos inside the hub whose git data is outside it: the secret checkout's history."""
    tmp, root = server["tmp"], server["tmp"] / "hub" / "models" / "evil2"
    secret_git = tmp / ".git"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp, capture_output=True, text=True, check=True).stdout.strip()
    if not root.exists():
        root.mkdir(parents=True)
        (root / "gitlink").mkdir()  # a real folder whose .git is a symlink to the checkout's
        (root / "gitlink" / ".git").symlink_to(secret_git)
        (root / "gitfile").mkdir()  # .git as a file: "gitdir: <elsewhere>"
        (root / "gitfile" / ".git").write_text(f"gitdir: {secret_git}\n")
        alt = root / "alternates"  # its own .git, its objects borrowed from the checkout's
        alt.mkdir()
        _git(alt, "init", "-q", "-b", "main")
        (alt / ".git" / "objects" / "info" / "alternates").write_text(f"{secret_git / 'objects'}\n")
        _git(alt, "update-ref", "refs/heads/main", commit)
        bare = root / "bare-alternates"  # a bare repo, the same
        bare.mkdir()
        _git(bare, "init", "-q", "--bare", "-b", "main")
        (bare / "objects" / "info" / "alternates").write_text(f"{secret_git / 'objects'}\n")
        _git(bare, "update-ref", "refs/heads/main", commit)
        linked = root / "objects-link"  # a bare repo whose object store is a symlink
        linked.mkdir()
        _git(linked, "init", "-q", "--bare", "-b", "main")
        shutil.rmtree(linked / "objects")
        (linked / "objects").symlink_to(secret_git / "objects")
        _git(linked, "update-ref", "refs/heads/main", commit)
        (root / "not-a-repo" / ".git").mkdir(parents=True)  # git would search the folders above: the checkout
    return {name: root / name for name in ("gitlink", "gitfile", "alternates", "bare-alternates", "objects-link",
                                           "not-a-repo")}


def test_a_repo_whose_git_data_is_outside_the_hub_is_not_served(server):
    ep = server["endpoint"]
    leaked = []
    for name in _evil_repos(server):
        for path in (f"/evil2/{name}/resolve/main/secret.txt", f"/api/models/evil2/{name}",
                     f"/api/models/evil2/{name}/commits/main", f"/api/models/evil2/{name}/tree/main",
                     f"/api/models/evil2/{name}/refs"):
            status, body = _raw(ep, "GET", path)
            if status != 404 or SECRET in body or SECRET_COMMIT.encode() in body:
                leaked.append((name, path, status, body[:80]))
    assert not leaked
    assert all(m.id.split("/")[0] != "evil2" for m in HfApi(endpoint=ep).list_models())


LOOPBACK_HOSTS = ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}", "[::1]:{port}", "127.0.0.1", "localhost"]
FOREIGN_HOSTS = ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", "localhost.evil.example",
                 "127.0.0.2:{port}", "0.0.0.0:{port}", "localhost:{port}@evil.example", "localhost:x", "[::1]x",
                 "", "localhost, evil.example", None]


def test_only_loopback_host_names_are_answered(server):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends `Host: evil.example`."""
    ep = server["endpoint"]
    port = urlparse(ep).port
    for host in LOOPBACK_HOSTS:
        status, body = _request(ep, "GET", "/icl-zoo/x/resolve/main/config.json", host.format(port=port))
        assert (status, body) == (200, b'{"entry": "x"}'), host
    answered = []
    for host in FOREIGN_HOSTS:
        shown = host if host is None else host.format(port=port)
        for method, path in (("GET", "/icl-zoo/x/resolve/main/config.json"), ("GET", "/api/models/icl-zoo/x"),
                             ("HEAD", "/icl-zoo/x/resolve/main/config.json")):
            status, body = _request(ep, method, path, shown)
            if not 400 <= status < 500 or b"entry" in body:
                answered.append((shown, method, path, status))
    assert not answered


def test_unknown_revisions_leave_nothing_behind_and_the_memo_is_bounded(tmp_path):
    from zoo.publishing import hub_server
    from zoo.publishing.hub_server import Hub, Refused, repo_dir

    src = tmp_path / "src"
    src.mkdir()
    (src / "README.md").write_text("# x\n")
    hub.publish_local(src, "org/x", root=tmp_path / "hub")
    h = Hub(tmp_path / "hub")
    repo = repo_dir(h.root, "models", "org/x")
    h.info("models", "org/x", repo, h.resolve(repo, None))
    kept = len(h._memo)
    for i in range(200):  # distinct commit-shaped revisions the repo does not hold
        with pytest.raises(Refused):
            h.resolve(repo, f"{i:040x}")
    assert len(h._memo) == kept
    bound = getattr(hub_server, "MEMO_ENTRIES", 4096)
    for i in range(3 * bound):
        h.memo(("k", i), lambda i=i: i)
    assert len(h._memo) <= bound
    assert h.memo(("k", 3 * bound - 1), lambda: None) == 3 * bound - 1  # the newest stay


# ---------------------------------------------------------------- repos still being prepared while the server serves
def _wait_for_log(log: Path, text: str, count: int = 1, limit: float = 120.0) -> None:
    """Until the server's log holds `text` `count` times (a bounded poll: the test fails past `limit`, nothing
    is timed)."""
    import time

    deadline = time.monotonic() + limit
    while log.read_text(errors="replace").count(text) < count:
        assert time.monotonic() < deadline, f"the server never logged {text!r}:\n{log.read_text()[-2000:]}"
        time.sleep(0.05)


def test_a_dataset_request_during_preparation_waits_then_succeeds(tmp_path):
    """`zoo hub serve` answers once the model repos are there and makes the dataset repos afterwards: a request for a
    dataset repo still being made (its info, a listing of datasets, a file) is held until it is ready, then answered
    as usual. The repo does not exist when the requests are sent, so a server that did not wait would answer 404."""
    import threading

    from zoo.publishing.hub_git import write_new_repo
    from zoo.publishing.hub_server import pending_key

    root, log = tmp_path / "hub", tmp_path / "server.log"
    write_new_repo(root / "models" / "icl-zoo" / "m", {"README.md": b"# m\n"}, message="m", tag="v1")
    key = pending_key("datasets", "icl-zoo/d")
    proc, endpoint = hub.start_server(root, log=log, meanwhile=lambda: [key])
    api, results = HfApi(endpoint=endpoint), {}

    def call(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # reported by the asserts below
            results[name] = e

    calls = {"info": lambda: api.dataset_info("icl-zoo/d"),
             "listing": lambda: [d.id for d in api.list_datasets(author="icl-zoo")],
             "file": lambda: Path(hf_hub_download("icl-zoo/d", "data/train.csv", repo_type="dataset",
                                                  endpoint=endpoint, cache_dir=tmp_path / "hf")).read_bytes()}
    threads = [threading.Thread(target=call, args=item) for item in calls.items()]
    try:
        for t in threads:
            t.start()
        _wait_for_log(log, f"waiting for {key}", count=len(calls))  # all three are held by the server
        assert [m.id for m in api.list_models(author="icl-zoo")] == ["icl-zoo/m"]  # the rest is served meanwhile
        sha = write_new_repo(root / "datasets" / "icl-zoo" / "d", {"README.md": b"# d\n", "data/train.csv": b"a\n1\n"},
                             message="d", tag="v1")
        assert hub.announce(proc, "ready", key)
        for t in threads:
            t.join(timeout=300)
    finally:
        hub.stop_server(proc)
    assert not any(isinstance(r, Exception) for r in results.values()), results
    assert results["info"].sha == sha and results["listing"] == ["icl-zoo/d"] and results["file"] == b"a\n1\n"



SERVE_MODELS_FIRST = """
import sys, time
from pathlib import Path
import zoo.cli.hub as cli_hub
from zoo.publishing import hub_prepare
release, go = Path(sys.argv[2]), Path(sys.argv[3])

class Held(hub_prepare.Preparation):  # its dataset repos wait for the test's go
    def dataset(self, task):
        while not go.exists():
            time.sleep(0.01)
        return super().dataset(task)

cli_hub.prepare = lambda root: Held(root, release, progress=False)
from zoo.cli import main
sys.exit(main(["hub", "serve", "--dir", sys.argv[1], "--port", sys.argv[4]]))
"""


def test_zoo_hub_serve_answers_before_its_dataset_repos_are_made(release_hub, tmp_path):
    """`zoo hub serve` on a new hub dir listens once the model repos are written; a dataset request sent before its
    repo is made is held, then answered with the repo the preparation made; the collection follows."""
    import threading

    h = release_hub
    hub_dir, go, port = tmp_path / "hub", tmp_path / "go", hub.free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE_MODELS_FIRST, str(hub_dir), str(h.folder.parent), str(go),
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("serving the local hub"), proc.stderr.read()
        api = HfApi(endpoint=f"http://127.0.0.1:{port}")
        assert not (hub_dir / "datasets" / h.dataset).exists()  # held: not made yet
        result = {}

        def ask():
            try:
                result["info"] = api.dataset_info(h.dataset)
            except Exception as e:  # said by the assert below
                result["info"] = e

        asked = threading.Thread(target=ask)
        asked.start()
        assert [m.id for m in api.list_models(author="icl-zoo")] == [ORG_ENTRY]  # served meanwhile
        assert asked.is_alive()  # the dataset request is held (it cannot end before its repo exists)
        go.touch()
        asked.join(timeout=300)
        (collection,) = api.list_collections(owner="icl-zoo")  # held until the marker is written
        assert {i.item_id for i in api.get_collection(collection.slug).items} == {ORG_ENTRY, h.dataset}
        marker = json.loads((hub_dir / ".icl-zoo-release.json").read_text())
        assert not isinstance(result["info"], Exception), result
        assert result["info"].sha == marker["datasets"][h.task]
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "error" not in err, err

def test_a_failed_preparation_is_said_in_one_line_and_answered_503(tmp_path, capsys):
    """A dataset repo whose preparation fails: `zoo hub serve` says so in one line and goes on serving; a request
    for it (or for the listing of datasets, or the release's collection) gets 503 with that reason in one line."""
    from zoo.cli.hub import prepare_datasets
    from zoo.publishing.hub_git import write_new_repo
    from zoo.publishing.hub_server import COLLECTION_KEY, pending_key

    root = tmp_path / "hub"
    write_new_repo(root / "models" / "icl-zoo" / "m", {"README.md": b"# m\n"}, message="m", tag="v1")

    class Failing:  # a Preparation whose one dataset repo cannot be written
        pending, from_cache, progress, hub_root = ["d"], [], False, root

        def dataset(self, task):
            raise OSError(28, "No space left on device")

        def finish(self):
            raise AssertionError("no marker is written when a dataset repo failed")

    proc, endpoint = hub.start_server(root, meanwhile=lambda: [pending_key("datasets", "icl-zoo/d"), COLLECTION_KEY])
    try:
        assert prepare_datasets(Failing(), proc) == ["d"]
        said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        for path in ("/api/datasets/icl-zoo/d", "/api/datasets/icl-zoo/d/tree/main",
                     "/datasets/icl-zoo/d/resolve/main/x", "/api/datasets?author=icl-zoo",
                     "/api/collections?owner=icl-zoo"):
            conn = http.client.HTTPConnection(urlparse(endpoint).netloc, timeout=60)
            conn.request("GET", path)
            resp = conn.getresponse()
            body, retry_after = resp.read(), resp.getheader("retry-after")
            conn.close()
            assert resp.status == 503 and retry_after is None, (path, resp.status, body)  # failed: retrying won't help
            message = json.loads(body)["error"]
            assert "could not be prepared" in message and "\n" not in message, (path, message)
        with pytest.raises(HfHubHTTPError, match="No space left on device"):
            HfApi(endpoint=endpoint).dataset_info("icl-zoo/d")
        assert [m.id for m in HfApi(endpoint=endpoint).list_models(author="icl-zoo")] == ["icl-zoo/m"]
    finally:
        hub.stop_server(proc)
    assert len(said) == 1 and "icl-zoo/d" in said[0] and "No space left on device" in said[0], said


def _asgi(app, method: str, path: str) -> tuple[int, dict]:
    """One request through the ASGI app in this process: (status, headers)."""
    import asyncio

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"host", b"127.0.0.1")]}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}


def test_a_repo_still_being_prepared_past_the_bound_is_a_503_with_retry_after(tmp_path):
    from zoo.publishing.hub_server import App, Pending, pending_key

    (tmp_path / "hub").mkdir()
    pending = Pending([pending_key("datasets", "icl-zoo/d")])
    app = App(tmp_path / "hub", pending=pending, wait_s=0, wait_resolve_s=0)
    for path in ("/api/datasets/icl-zoo/d", "/datasets/icl-zoo/d/resolve/main/x", "/api/datasets"):
        status, headers = _asgi(app, "GET", path)
        assert status == 503 and headers["retry-after"] == "5", (path, headers)
        assert "still being prepared" in headers["x-error-message"]
    assert _asgi(app, "GET", "/api/models/icl-zoo/m")[0] == 404  # what is not pending is answered at once
    assert _asgi(app, "GET", "/api/datasets/icl-zoo/other")[0] == 404


def test_the_preparing_process_s_lines_and_its_end():
    from zoo.publishing.hub_server import Pending, Route

    pending = Pending(["datasets/o/a", "datasets/o/b", "datasets/o/c", "collection"])
    pending.follow(["ready datasets/o/a\n", "failed datasets/o/b OSError: disk\tfull\n", "nonsense\n"])  # then EOF
    assert pending.state({"datasets/o/a"}) is None
    assert pending.state({"datasets/o/b"}) == ("failed", "datasets/o/b: OSError: disk full")
    kind, reason = pending.state({"datasets/o/c"})
    assert kind == "failed" and "stopped before it was ready" in reason  # its input ended: nothing more will come
    assert pending.needed(Route("list", "models")) == set()
    assert pending.needed(Route("list", "datasets")) == {"datasets/o/b", "datasets/o/c"}  # a ready one is forgotten
    assert pending.needed(Route("collections")) == {"datasets/o/b", "datasets/o/c", "collection"}
