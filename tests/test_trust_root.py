"""The shipped release index is the trust root: a hostile hub serves self-consistent tampered copies of
released entries at the release tag, and every path that yields a released entry (zoo.load by repo id
or bare name at any revision, zoo pull, zoo stream, StreamingSession, the quickstart) refuses them; a
repo that is not released loads as self-consistent only and says so, never as "verified"."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from safetensors.torch import load_file, save_file

import zoo
from zoo.cli import main
from zoo.publishing import hub
from zoo.storage.locate import ORG, ReleaseError, locate, read_index, release_dir
from zoo.storage.manifest import SELF_CONSISTENT, CheckpointError, verify_files

INDEX = read_index()
VERSION = INDEX["version"]
TAMPERED = "gated-rnn-zucchet-icl"  # the quickstart's entry: recurrent, with step and chunk graphs
EXTRA_FILE = "lsa-gd-zucchet-icl"
EDITED_CARD = "gated-rnn-gd-zucchet-icl"
OUTSIDER = "someone/gated-rnn-copy"  # not a released repo: self-consistent only


def rewrite_hashes(folder: Path) -> None:
    """What an attacker does after editing a file: record the new hashes in config.json (the weights
    record the hash of config.json without its file list, so they still agree)."""
    config = json.loads((folder / "config.json").read_text())
    for name in config["files"]:
        raw = (folder / name).read_bytes()
        config["files"][name] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def double_chunk_initializer(folder: Path) -> None:
    model = onnx.load(str(folder / "model_chunk.onnx"))
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        if value.dtype == np.float32 and value.size > 1 and np.abs(value).max() > 0:
            init.CopyFrom(numpy_helper.from_array(2 * value, init.name))
            break
    onnx.save(model, str(folder / "model_chunk.onnx"))


def _publish(root: Path, folder: Path, repo_id: str) -> None:
    hub.publish_local(folder, repo_id, root=root)
    hub.tag_local(root, repo_id, VERSION)  # it claims to be the release


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-hub")
    root = tmp / "hub"
    tampered = tmp / "tampered"
    shutil.copytree(release_dir() / TAMPERED, tampered)
    double_chunk_initializer(tampered)
    rewrite_hashes(tampered)
    assert verify_files(tampered).release is None  # self-consistent: its own config.json agrees with it
    _publish(root, tampered, f"{ORG}/{TAMPERED}")

    extra = tmp / "extra"
    shutil.copytree(release_dir() / EXTRA_FILE, extra)
    (extra / "evil.py").write_text("raise SystemExit('ran')\n")
    (extra / "pytorch_model.bin").write_bytes(b"\x80\x04not a pickle the zoo would ever read")
    _publish(root, extra, f"{ORG}/{EXTRA_FILE}")

    card = tmp / "card"
    shutil.copytree(release_dir() / EDITED_CARD, card)
    text = (card / "README.md").read_text()
    loss = json.loads((card / "eval_results.json").read_text())["test_loss"]
    (card / "README.md").write_text(text.replace(repr(loss), "0.001"))
    _publish(root, card, f"{ORG}/{EDITED_CARD}")

    outsider = tmp / "outsider"
    shutil.copytree(tampered, outsider)
    (outsider / "evil.py").write_text("raise SystemExit('ran')\n")
    hub.publish_local(outsider, OUTSIDER, root=root)

    edited_card_outsider = tmp / "outsider-card"
    shutil.copytree(card, edited_card_outsider)
    hub.publish_local(edited_card_outsider, "someone/edited-card", root=root)

    with hub.serve(root) as endpoint:
        yield {"endpoint": endpoint, "tmp": tmp}


@pytest.fixture(autouse=True)
def _own_hf_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_ENDPOINT", raising=False)


@pytest.mark.parametrize("revision", [VERSION, "main", None])
def test_tampered_release_repo_is_refused_by_repo_id(hostile, revision):
    with pytest.raises(ReleaseError, match="is not the released"):
        zoo.load(f"{ORG}/{TAMPERED}", revision=revision, endpoint=hostile["endpoint"])


@pytest.mark.parametrize("revision", [None, "main"])
def test_tampered_release_repo_is_refused_by_bare_name(hostile, revision):
    with pytest.raises(ReleaseError, match="is not the released"):
        zoo.load(TAMPERED, revision=revision, endpoint=hostile["endpoint"])


def test_stream_session_refuses_the_tampered_repo(hostile):
    from export.streaming import StreamingSession

    with pytest.raises(ReleaseError, match="is not the released"):
        StreamingSession(f"{ORG}/{TAMPERED}", revision=VERSION, endpoint=hostile["endpoint"])


def test_cli_pull_and_stream_refuse_it(hostile, tmp_path, capsys):
    ep = hostile["endpoint"]
    assert main(["pull", f"{ORG}/{TAMPERED}", "--revision", VERSION, "--endpoint", ep]) == 1
    out = capsys.readouterr()
    assert "verified" not in out.out and "is not the released" in out.err
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.zeros((2, 5, 6), np.float32))
    assert main(["stream", f"{ORG}/{TAMPERED}", "--input", str(tokens), "--output", str(tmp_path / "out.npy"),
                 "--revision", VERSION, "--endpoint", ep]) == 1
    assert "is not the released" in capsys.readouterr().err
    assert not (tmp_path / "out.npy").exists()


def test_quickstart_refuses_a_tampered_hub(hostile, tmp_path, monkeypatch):
    from zoo.publishing import quickstart

    def import_tampered(root, only=None, progress=False):  # the hub the demo serves holds the attacker's copy
        shutil.copytree(hostile["tmp"] / "hub", root, dirs_exist_ok=True)

    monkeypatch.setattr("zoo.publishing.release.publish.import_to_hub", import_tampered)  # `release.import_to_hub`
    with pytest.raises(ReleaseError, match="is not the released"):
        quickstart.run_release(tmp_path / "qs", entry=TAMPERED)


def test_unknown_files_in_a_released_repo_are_refused(hostile):
    with pytest.raises(ReleaseError, match="evil.py"):
        zoo.load(f"{ORG}/{EXTRA_FILE}", revision=VERSION, endpoint=hostile["endpoint"])


def test_an_edited_card_of_a_released_repo_is_refused(hostile):
    with pytest.raises(ReleaseError, match="README.md"):
        zoo.load(f"{ORG}/{EDITED_CARD}", revision=VERSION, endpoint=hostile["endpoint"])


def test_a_repo_outside_the_release_is_self_consistent_only(hostile, capsys):
    ckpt = zoo.load(OUTSIDER, endpoint=hostile["endpoint"])
    assert ckpt.trust == SELF_CONSISTENT and "verified" not in ckpt.trust
    folder = locate(OUTSIDER, endpoint=hostile["endpoint"]).folder
    assert not (folder / "evil.py").exists(), "a file the checkpoint does not list is never even downloaded"
    assert main(["pull", OUTSIDER, "--endpoint", hostile["endpoint"]]) == 0
    out = capsys.readouterr().out
    assert SELF_CONSISTENT in out and "verified" not in out


def test_a_card_that_misreports_its_metrics_is_refused_outside_the_release(hostile):
    with pytest.raises(CheckpointError, match="the card reports test_loss"):
        zoo.load("someone/edited-card", endpoint=hostile["endpoint"])


def test_local_copies_are_verified_only_while_they_are_the_release(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(release_dir() / TAMPERED, copy)
    assert zoo.load(copy).trust == f"verified against release {VERSION}"
    double_chunk_initializer(copy)
    rewrite_hashes(copy)
    assert zoo.load(copy).trust == SELF_CONSISTENT


def test_released_weights_must_record_their_config_hash(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(release_dir() / EXTRA_FILE, copy)
    save_file(load_file(copy / "model.safetensors"), copy / "model.safetensors")  # no metadata at all
    rewrite_hashes(copy)
    verify_files(copy)  # a folder of someone's own may predate the key
    with pytest.raises(CheckpointError, match="icl_zoo.config_sha256"):
        verify_files(copy, release=VERSION)


def test_publish_uploads_only_the_checkpoints_files(tmp_path, capsys):
    folder = tmp_path / "ckpt"
    shutil.copytree(release_dir() / EXTRA_FILE, folder)
    (folder / "evil.py").write_text("print('pwned')\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "pytorch_model.bin").write_bytes(b"pickle")
    assert main(["publish", str(folder), "--repo", "me/ckpt", "--root", str(tmp_path / "hub")]) == 0
    assert "not published (not part of the checkpoint): evil.py, sub" in capsys.readouterr().out
    repo = tmp_path / "hub" / "models" / "me" / "ckpt"
    published = {p.name for p in repo.iterdir() if p.name != ".git"}
    assert published == set(read_index()["entries"][EXTRA_FILE]["files"])


def test_the_from_scratch_demo_publishes_under_its_own_name():
    """`zoo quickstart --from-scratch` publishes the LSA it trains and loads it back by repo id: under
    `icl-zoo/` it would be a released entry's name, and the trust root would (rightly) refuse it."""
    from zoo.publishing import quickstart

    org, name = quickstart.OWN_REPO.split("/")
    assert org.lower() != ORG and name in INDEX["entries"]  # the entry's own name, under another org
