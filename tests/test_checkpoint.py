"""Checkpoint folders: bit-exact round trip, integrity checks, model card."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
from zoo.storage.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def constructed(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "lsa-gd-zucchet-icl"
    return zoo.build("lsa-gd-zucchet-icl", out), out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "lsa-d10-c10"
    return zoo.build("lsa-d10-c10", out, steps=30, device="cpu", progress=False), out


def test_round_trip_is_bit_exact(trained):
    ckpt, out = trained
    loaded = zoo.load(out)
    for (k, a), (k2, b) in zip(ckpt.model.state_dict().items(), loaded.model.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    tokens = ckpt.task.sample(16, seed=0).tokens
    assert torch.equal(ckpt.model(tokens), loaded.model(tokens))
    assert loaded.metrics == json.loads((out / "eval_results.json").read_text())


def test_folder_contents_and_provenance(trained):
    ckpt, out = trained
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["entry"]["name"] == "lsa-d10-c10"
    prov = cfg["provenance"]
    assert prov["steps"] == 30 and prov["seed"] == 0 and prov["zoo_version"] == zoo.__version__
    assert set(prov["dataset_hashes"]) == {"validation", "test"}
    assert "model.safetensors" in cfg["files"]
    assert (out / "loss_curve.png").stat().st_size > 1000
    assert not any(p.suffix in (".bin", ".pt", ".pkl") for p in out.iterdir())


def test_model_card_metadata(constructed):
    from huggingface_hub import ModelCard

    ckpt, out = constructed
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "icl-zoo"
    results = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert results["test_loss"] == pytest.approx(ckpt.metrics["test_loss"])
    assert "| test loss |" in card.text and "@article{zucchet2023gated" in card.text


def test_constructed_checkpoint_is_gd(constructed):
    ckpt, _ = constructed
    m = ckpt.metrics
    assert m["test_loss"] == pytest.approx(m["gd_loss"], rel=1e-5)
    assert m["sensitivity_cosine"] == pytest.approx(1.0, abs=1e-6)
    assert ckpt.construction["eta"] == pytest.approx(1 / 14.8)


def copy(out, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(out, dst)
    return dst


def test_tampered_weights_are_refused(constructed, tmp_path):
    dst = copy(constructed[1], tmp_path)
    weights = load_file(str(dst / "model.safetensors"))
    weights["layers.0.w_p"][0, 0] += 1e-3
    save_file(weights, str(dst / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.safetensors has SHA-256 .* refusing to load"):
        zoo.load(dst)


def test_missing_file_and_wrong_shapes_are_refused(constructed, tmp_path):
    dst = copy(constructed[1], tmp_path)
    (dst / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="file model.safetensors is missing"):
        zoo.load(dst)

    dst2 = copy(constructed[1], tmp_path / "b")
    weights = load_file(str(dst2 / "model.safetensors"))
    weights["layers.0.w_q"] = torch.zeros(5, 5)
    save_file(weights, str(dst2 / "model.safetensors"))
    cfg = json.loads((dst2 / "config.json").read_text())
    from zoo.storage.checkpoint import sha256_file

    cfg["files"]["model.safetensors"]["sha256"] = sha256_file(dst2 / "model.safetensors")  # hash consistent, shape wrong
    (dst2 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"layers.0.w_q has shape \(5, 5\), the architecture needs \(6, 6\)"):
        zoo.load(dst2)


def test_unknown_architecture_is_refused(constructed, tmp_path):
    dst = copy(constructed[1], tmp_path)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["entry"]["arch"]["type"] = "hyena"
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="edited after the weights were saved"):
        zoo.load(dst)
    # A consistent checkpoint from a newer zoo (weights re-saved with its config): refused by name.
    from zoo.storage.checkpoint import config_core_sha256, save_weights, sha256_file

    save_weights(load_file(str(dst / "model.safetensors")), dst / "model.safetensors", config_sha256=config_core_sha256(cfg))
    cfg["files"]["model.safetensors"]["sha256"] = sha256_file(dst / "model.safetensors")
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="not understood by icl-zoo"):
        zoo.load(dst)


# ---------------------------------------------------------------- who writes the ONNX graphs
def test_checkpoint_layer_imports_no_export():
    """zoo.storage.checkpoint saves weights, metrics and config; the export layer above adds the graphs, the builder
    the card: saving renders no card and reads no registry (issue 39). Loading goes through zoo.storage.locate
    (`open_checkpoint`, the one resolver of zoo.load and Checkpoint.from_pretrained), which imports no torch and
    nothing of this module: no circle."""
    import ast
    import inspect

    import zoo.storage.checkpoint

    nodes = list(ast.walk(ast.parse(inspect.getsource(zoo.storage.checkpoint))))  # in-function imports included
    imported = {n.module for n in nodes if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and (m.startswith("export") or m in (
        "zoo.publishing.release", "zoo.publishing.hub", "zoo.storage.card", "zoo.science.expected", "zoo.science.analysis.plots"))}
    import zoo.storage.locate

    locate_nodes = ast.walk(ast.parse(inspect.getsource(zoo.storage.locate)))
    assert not any(isinstance(n, ast.ImportFrom) and n.module == "zoo.storage.checkpoint" for n in locate_nodes)


def test_save_checkpoint_writes_exactly_the_released_files(tmp_path, monkeypatch):
    """zoo.running.builder.save (zoo.storage.save.save_checkpoint with the graphs and card) gives a released checkpoint's folder back
    file for file, graphs hashed in config.json; a plain save_pretrained writes no graphs and drops ones
    left in the folder, and the generated card that listed them (huggingface_hub's short card instead)."""
    from zoo.running.builder import save as save_checkpoint
    from zoo.storage.checkpoint import Checkpoint
    from zoo.storage.locate import release_dir
    from zoo.storage.manifest import GRAPH_FILES, verify_files

    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    name = "gated-rnn-zucchet-icl"  # recurrent: model.onnx, model_step.onnx and model_chunk.onnx
    ckpt = zoo.load(name)
    out = save_checkpoint(ckpt, tmp_path / name, graphs=False)  # `zoo build --no-graphs`: no graph, none listed
    assert not list(out.glob("*.onnx")) and not set(GRAPH_FILES) & set(verify_files(out).config["files"])
    assert "StreamingSession" not in (out / "README.md").read_text()
    from zoo.cli import main

    assert main(["export", str(out)]) == 0  # adds them in place: then the released folder, file for file
    released = sorted(p.name for p in (release_dir() / name).iterdir())
    assert sorted(p.name for p in out.iterdir()) == released
    files = verify_files(out).config["files"]
    assert set(GRAPH_FILES) <= set(files)
    assert "from export.streaming import StreamingSession" in (out / "README.md").read_text()

    ckpt.save_pretrained(out)  # the huggingface_hub path: no graphs, none left behind unhashed or stale
    assert not any((out / g).exists() for g in GRAPH_FILES)
    assert not set(GRAPH_FILES) & set(verify_files(out).config["files"])
    assert "StreamingSession" not in (out / "README.md").read_text()
    assert "library_name: icl-zoo" in (out / "README.md").read_text()
    assert zoo.load(out).metrics == ckpt.metrics
    assert Checkpoint.from_pretrained(str(out)).metrics == ckpt.metrics  # the huggingface_hub way in


def test_a_pinned_commit_is_what_later_checkpoints_record(monkeypatch):
    """A training command pins the commit it started from: a commit made while it trains does not relabel it."""
    from zoo.storage import checkpoint as ck

    monkeypatch.setattr(ck, "_PINNED_COMMIT", None)
    monkeypatch.setattr(ck, "git_commit", lambda: "a" * 40)
    assert ck.pin_source_commit() == "a" * 40
    monkeypatch.setattr(ck, "git_commit", lambda: "b" * 40 + "-dirty-0123456789ab")  # the tree moved on mid-run
    assert ck.pin_source_commit() == "a" * 40  # the first reading stands (the training loop pins again)
    assert ck.provenance(0, 10, "cpu", {})["git_commit"] == "a" * 40
    monkeypatch.setattr(ck, "_PINNED_COMMIT", None)  # a process that pinned nothing reads the tree at save time
    assert ck.provenance(0, 10, "cpu", {})["git_commit"] == "b" * 40 + "-dirty-0123456789ab"


def test_a_dirty_build_names_the_later_commit_that_holds_its_sources(tmp_path, monkeypatch):
    """git_commit hashes a working tree's uncommitted source changes into "<sha>-dirty-<hex>"; commit_with_sources
    finds the later commit whose diff from <sha> hashes the same: the code to rebuild from. An unrelated later
    commit, a change outside the sources, untracked source files, a clean commit and a non-string name none. The
    user's git configuration (prefixes, colour, abbreviation) changes neither the digest nor the answer."""
    import os
    import subprocess

    from zoo.storage.checkpoint import commit_with_sources, git_commit

    for var in [v for v in os.environ if v.startswith("GIT_")]:
        monkeypatch.delenv(var)  # a hook's GIT_DIR would point git elsewhere
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)  # no signing, hooks or diff settings of this machine's user
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")

    def git(*args):
        return subprocess.run(["git", "-c", "commit.gpgsign=false", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    def resolve(recorded):
        commit_with_sources.cache_clear()  # the repository changes between calls
        return commit_with_sources(recorded, tmp_path)

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "model.py").write_text("A = 1\n")
    (tmp_path / "notes.md").write_text("first\n")
    git("add", "-A")
    git("commit", "-qm", "base")
    base = git("rev-parse", "HEAD")
    assert git_commit(tmp_path) == base and resolve(base) is None

    (tmp_path / "zoo" / "model.py").write_text("A = 2\n")  # the build runs on this uncommitted change
    (tmp_path / "notes.md").write_text("edited\n")  # outside the sources: not part of the digest
    recorded = git_commit(tmp_path)
    assert recorded.startswith(base + "-dirty-") and len(recorded) == 40 + 7 + 12
    for key, value in (("diff.mnemonicPrefix", "true"), ("diff.noprefix", "true"), ("color.ui", "always"),
                       ("core.abbrev", "12")):
        git("config", key, value)  # another user's settings: the same tree, the same digest
    assert git_commit(tmp_path) == recorded
    assert resolve(recorded) is None  # nothing committed after the base holds it yet

    (tmp_path / "zoo" / "model.py").write_text("A = 3\n")
    git("commit", "-qam", "something else")  # a later commit with other sources
    assert resolve(recorded) is None
    (tmp_path / "zoo" / "model.py").write_text("A = 2\n")
    git("commit", "-qam", "the build's code")
    holder = git("rev-parse", "HEAD")
    (tmp_path / "zoo" / "model.py").write_text("A = 4\n")
    git("commit", "-qam", "after")
    assert resolve(recorded) == holder
    assert resolve(recorded[:-1] + ("0" if recorded[-1] != "0" else "1")) is None  # another digest

    (tmp_path / "zoo" / "new_family.py").write_text("B = 1\n")  # untracked sources are hashed apart from the diff
    untracked = git_commit(tmp_path)
    git("add", "-A")
    git("commit", "-qm", "adds the family")
    assert resolve(untracked) is None
    assert resolve("unknown") is None and resolve("f" * 40 + "-dirty-" + "0" * 12) is None
    assert resolve(5) is None and resolve(None) is None  # a config.json's value may be anything
