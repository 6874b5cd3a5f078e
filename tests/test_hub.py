"""Hub: publish to a local hub, serve it with the zoo's hub server, pull back with the ordinary clients;
the real-Hub path checked at the HTTP boundary."""

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
from zoo.publishing import hub
from zoo.science.evaluation import evaluate
from zoo.science.tasks.frozen import DatasetHashMismatch, load_split_from_hub
from zoo.storage import locate
from zoo.storage.checkpoint import CheckpointError

MODEL_REPO, DATASET_REPO = "icl-zoo-test/lsa-d10-c10", "icl-zoo-test/linreg-d10-c10"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A trained checkpoint and its task's frozen splits on a local hub served by the zoo's hub server."""
    tmp = tmp_path_factory.mktemp("hub")
    ckpt = zoo.build("lsa-d10-c10", tmp / "ckpt", steps=20, device="cpu", progress=False)
    root = tmp / "hub"
    folder, hashes = hub.dataset_folder("linreg-d10-c10", tmp / "ds")
    ds_rev = hub.publish_local(folder, DATASET_REPO, repo_type="dataset", root=root)
    rev1 = hub.publish_local(tmp / "ckpt", MODEL_REPO, root=root)
    proc, endpoint = hub.start_server(root)
    yield {"ckpt": ckpt, "root": root, "endpoint": endpoint, "rev1": rev1, "ds_rev": ds_rev,
           "hashes": hashes, "tmp": tmp}
    proc.terminate()
    proc.wait(timeout=10)


def test_local_hub_layout_and_history(published):
    repo = published["root"] / "models" / "icl-zoo-test" / "lsa-d10-c10"
    assert (repo / ".git").is_dir() and (repo / "model.safetensors").exists()
    assert not (repo / ".train").exists(), "training state must never be published"
    log = subprocess.run(["git", "log", "--format=%H", "main"], cwd=repo, capture_output=True, text=True).stdout.split()
    assert log[0] == published["rev1"]


def test_pull_through_the_hub_server_is_bit_identical_and_scores_the_same(published, tmp_path):
    folder = locate.resolve_folder(MODEL_REPO, endpoint=published["endpoint"], cache_dir=tmp_path / "hf")
    pulled = zoo.load(folder)
    original = published["ckpt"]
    for (k, a), (_, b) in zip(original.model.state_dict().items(), pulled.model.state_dict().items()):
        assert torch.equal(a, b), k
    split = load_split_from_hub(DATASET_REPO, split="test", endpoint=published["endpoint"],
                                expected_sha256=published["hashes"]["test"]["sha256"])
    metrics = evaluate(pulled.model, pulled.task, split.batch(pulled.task))
    for key in ("test_loss", "gd_loss", "pred_l2_to_gd", "sensitivity_cosine"):
        assert metrics[key] == original.metrics[key], key


def test_cli_eval_with_hf_endpoint_uses_load_dataset(published, tmp_path):
    """A user's view: HF_ENDPOINT set, `zoo eval ORG/NAME --dataset ORG/DS` through the hub server."""
    env = {**os.environ, "HF_ENDPOINT": published["endpoint"], "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-m", "zoo.cli", "eval", MODEL_REPO, "--dataset", DATASET_REPO, "--json"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout)
    assert metrics["test_loss"] == published["ckpt"].metrics["test_loss"]
    assert metrics["dataset_sha256"] == published["hashes"]["test"]["sha256"]


def test_tampered_revision_is_refused_and_old_revision_still_loads(published, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(published["tmp"] / "ckpt", bad, ignore=shutil.ignore_patterns(".train"))
    weights = load_file(str(bad / "model.safetensors"))
    weights["layers.0.w_v"][0, 0] += 0.5
    save_file(weights, str(bad / "model.safetensors"))
    rev2 = hub.publish_local(bad, MODEL_REPO, root=published["root"], message="tampered weights")
    assert rev2 != published["rev1"]
    ep = published["endpoint"]
    with pytest.raises(CheckpointError, match="model.safetensors has SHA-256"):
        zoo.load(locate.resolve_folder(MODEL_REPO, endpoint=ep, cache_dir=tmp_path / "hf"))
    good = zoo.load(locate.resolve_folder(MODEL_REPO, revision=published["rev1"], endpoint=ep, cache_dir=tmp_path / "hf"))
    assert good.metrics == published["ckpt"].metrics
    # put the good revision back on main for the other tests
    hub.publish_local(published["tmp"] / "ckpt", MODEL_REPO, root=published["root"], message="revert")


def test_dataset_with_wrong_expected_hash_is_refused(published):
    with pytest.raises(DatasetHashMismatch):
        load_split_from_hub(DATASET_REPO, split="test", endpoint=published["endpoint"],
                            expected_sha256=published["hashes"]["validation"]["sha256"])


@pytest.mark.parametrize("bad", ["../etc", "org/..", "org/../x", "a/b/c", "org", "/abs/path", "org/.hidden", "o rg/x"])
def test_repo_ids_cannot_escape_the_local_hub(bad, tmp_path):
    with pytest.raises(locate.HubError, match="invalid repo id"):
        hub.publish_local(tmp_path, bad, root=tmp_path / "hub")



def test_import_to_hub_writes_new_repos_in_process_and_commits_again_through_git(tmp_path):
    """`zoo quickstart`'s import: a new repo is written as git objects (no working tree, no git process), holding
    exactly the released files; importing again into the same hub commits through git and, the content being the
    same, makes no new revision. The served repo loads as the released checkpoint."""
    from zoo.publishing import release

    entry = "gated-rnn-student-d4"
    index = locate.read_index()
    root = tmp_path / "hub"
    first = release.import_to_hub(root, only=[entry], progress=False)
    repo = root / "models" / locate.ORG / entry
    assert not (repo / "model.safetensors").exists()  # no working tree: written as objects

    def git(*args):
        return subprocess.run(["git", f"--git-dir={repo / '.git'}", *args], capture_output=True, text=True,
                              check=True).stdout.split()

    assert git("rev-parse", index["version"]) == [first["models"][entry]]
    assert set(git("ls-tree", "--name-only", "main")) == set(index["entries"][entry]["files"])
    (task,) = first["datasets"]
    assert release.import_to_hub(root, only=[entry], progress=False) == first  # no new revision
    assert git("rev-list", "--count", "main") == ["1"]
    with hub.serve(root) as endpoint:
        ckpt = zoo.load(f"{locate.ORG}/{entry}", revision=index["version"], endpoint=endpoint)
        split = load_split_from_hub(f"{locate.ORG}/{task}", split="test", revision=index["version"], endpoint=endpoint)
    assert "verified" in ckpt.trust and ckpt.entry.task == task and split.x.shape[0] > 0

# ---------------------------------------------------------------- the real Hub, at the HTTP boundary
from fake_hub import FakeHub  # noqa: E402


def test_publish_to_real_hub_makes_the_right_calls(published, monkeypatch):
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http

    fake = FakeHub()
    previous = _http._GLOBAL_CLIENT_FACTORY  # restored after: later tests use the real client (redirects etc.)
    set_client_factory(lambda: httpx.Client(transport=httpx.MockTransport(fake)))
    try:
        sha = hub.publish(published["tmp"] / "ckpt", "some-org/lsa", hub="https://hub.test", token="hf_test_token")
    finally:
        set_client_factory(previous)
    assert sha == "b" * 40
    paths = [c[2] for c in fake.calls if c[2] != "/api/agent-harnesses"]
    assert paths[0] == "/api/repos/create"
    assert paths[-1] == "/api/models/some-org/lsa/commit/main"
    assert all(c[1] == "hub.test" for c in fake.calls), "endpoint= must be honoured"
    assert all(c[3] == "Bearer hf_test_token" for c in fake.calls if c[2] != "/api/agent-harnesses")
    committed = dict(fake.committed)
    assert set(committed) >= {"config.json", "model.safetensors", "README.md", "eval_results.json"}
    assert not any(p.startswith(".train") for p in committed)
    assert committed["model.safetensors"] == (published["tmp"] / "ckpt" / "model.safetensors").read_bytes()


def test_stream_a_hub_repo_with_onnx(published, tmp_path, monkeypatch):
    from export.streaming import StreamingSession

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    session = StreamingSession(MODEL_REPO, endpoint=published["endpoint"])
    task = published["ckpt"].task
    b = task.sample(3, seed=2)
    session.reset(3)
    out = session.push(b.tokens.numpy())
    with torch.no_grad():
        ref = published["ckpt"].model(b.tokens)
    np_ref = ref.numpy()
    assert abs(out - np_ref).max() < 1e-5
    card = (published["tmp"] / "ckpt" / "README.md").read_text()
    assert "StreamingSession" in card
