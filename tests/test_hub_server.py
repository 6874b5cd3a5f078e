"""The local hub server serves its own repos and nothing else: raw hostile request paths (not
normalised by a client) never reach a file or a git history outside the hub root."""

import http.client
import os
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
from huggingface_hub import HfApi, hf_hub_download

from zoo import hub

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


def _raw(endpoint, method, path, body=None):
    """One request with the path sent byte for byte (requests/httpx would normalise '..')."""
    conn = http.client.HTTPConnection(urlparse(endpoint).netloc, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
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


def test_served_root_is_absolute(server):
    toml = (server["proc"].workdir / "olah.toml").read_text()
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
    status, body = _raw(ep, "GET", "/api/models/icl-zoo/x/commits/main")  # (olah's payload lacks what list_repo_commits wants)
    assert status == 200 and server["rev"].encode() in body
    status, body = _raw(ep, "GET", "/icl-zoo/x/resolve/main/config.json")  # the raw form of a good request
    assert (status, body) == (200, b'{"entry": "x"}')
    status, _ = _raw(ep, "GET", "/icl-zoo/missing/resolve/main/config.json")
    assert status == 404
