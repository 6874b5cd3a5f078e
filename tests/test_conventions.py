"""The conventions of other model hubs, kept to the zoo's one loading path.

| convention | what holds | test |
|---|---|---|
| huggingface_hub `Checkpoint.from_pretrained` | the resolver of `zoo.load`: a tampered released repo refused, a genuine one verified | test_from_pretrained_checks_released_repos_against_the_trust_root |
| | only the checkpoint's own files fetched (zoo.load too): a hostile repo's extras never reach the cache | test_only_the_checkpoints_own_files_are_downloaded |
| | config.json parsed capped, from the hashed bytes: a list or deep nesting is a CheckpointError | test_hostile_config_is_a_checkpoint_error |
| | a bare entry name loads the release; a missing path fails at once, in one line | test_from_pretrained_takes_a_bare_entry_name, test_a_missing_path_fails_at_once |
| timm `list_models` / `create_model` | in dir(zoo); `import zoo` loads no torch | test_list_models_and_create_model |
| torch.hub | hubconf.py: one entry point per registry entry; load gives the released module | test_torch_hub_lists_and_loads_the_entries |
| `save_pretrained` | says which graphs it leaves out (card and warning); the module round-trips | test_save_pretrained_names_what_it_leaves_out, test_the_module_round_trips |
| `push_to_hub` | create_repo + upload_folder on any endpoint; the local hub says `zoo publish` | test_push_to_hub_uploads_the_saved_folder, test_push_to_the_local_hub_says_what_to_use |
"""

import importlib.util
import inspect
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from fake_hub import FakeHub
from test_trust_root import (
    _own_hf_cache,  # noqa: F401  (autouse: this test's own huggingface_hub cache)
    _publish,
    double_chunk_initializer,
    rewrite_hashes,
)

import zoo
from zoo.publishing import hub
from zoo.storage.checkpoint import Checkpoint, CheckpointError
from zoo.storage.locate import ORG, HubError, ReleaseError, read_index, release_dir
from zoo.storage.manifest import GRAPH_FILES, SELF_CONSISTENT

ROOT = Path(__file__).resolve().parents[1]
INDEX = read_index()
VERSION = INDEX["version"]
VERIFIED = f"verified against release {VERSION}"
TAMPERED = "gated-rnn-zucchet-icl"  # recurrent: three graphs
EXTRA = "lsa-gd-zucchet-icl"  # the released files plus evil.py and pytorch_model.bin
GENUINE = "gated-rnn-gd-zucchet-icl"  # the release, untouched
OUTSIDER = "someone/copy"  # not released: self-consistent, with stray files beside the checkpoint
STRAYS = ("evil.py", "pytorch_model.bin", "evil.png")  # (evil.png under sub/: only top-level files are a checkpoint's)
HOSTILE_CONFIGS = {"list": "[1, 2]", "deep": "[" * 200_000}  # config.json: not an object; nested past the recursion limit


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A hostile hub (served by `zoo hub serve`'s server): a tampered, self-consistent copy of a released entry at
    the release tag, a released entry with stray files, a genuine released entry, an outside repo with strays,
    and a repo whose config.json is a list (the folders beside it: that one, and one nested 200,000 deep)."""
    tmp = tmp_path_factory.mktemp("conventions-hub")
    root = tmp / "hub"
    tampered = tmp / "tampered"
    shutil.copytree(release_dir() / TAMPERED, tampered)
    double_chunk_initializer(tampered)
    rewrite_hashes(tampered)
    _publish(root, tampered, f"{ORG}/{TAMPERED}")
    extra = tmp / "extra"
    shutil.copytree(release_dir() / EXTRA, extra)
    (extra / "evil.py").write_text("raise SystemExit('ran')\n")
    (extra / "pytorch_model.bin").write_bytes(b"\x80\x04not a pickle the zoo would ever read")
    _publish(root, extra, f"{ORG}/{EXTRA}")
    _publish(root, release_dir() / GENUINE, f"{ORG}/{GENUINE}")
    outsider = tmp / "outsider"
    shutil.copytree(release_dir() / EXTRA, outsider)
    (outsider / "evil.py").write_text("raise SystemExit('ran')\n")
    (outsider / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    (outsider / "sub").mkdir()
    (outsider / "sub" / "evil.png").write_bytes(b"not a figure")
    hub.publish_local(outsider, OUTSIDER, root=root)
    for kind, text in HOSTILE_CONFIGS.items():
        folder = tmp / f"{kind}-config"
        folder.mkdir()
        (folder / "config.json").write_text(text)
        (folder / "model.safetensors").write_bytes(b"\x00" * 16)
    hub.publish_local(tmp / "list-config", "someone/list-config", root=root)
    with hub.serve(root) as endpoint:
        yield endpoint, tmp


@pytest.fixture(scope="module")
def served_tmp(served):
    """The folders the served repos were published from."""
    return served[1]


def cached_files(tmp_path) -> set[str]:
    """Names of every file huggingface_hub put in this test's cache (_own_hf_cache)."""
    cache = tmp_path / "hf-cache"
    return {p.name for p in cache.rglob("*") if p.is_file() or p.is_symlink()} if cache.exists() else set()


# ---------------------------------------------------------------- one loading path
@pytest.mark.parametrize("how", ["endpoint", "HF_ENDPOINT"])
def test_from_pretrained_checks_released_repos_against_the_trust_root(served, how, monkeypatch):
    endpoint = served[0]
    kwargs = {"endpoint": endpoint} if how == "endpoint" else {}
    if how == "HF_ENDPOINT":
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(ReleaseError, match="is not the released"):
        Checkpoint.from_pretrained(f"{ORG}/{TAMPERED}", revision=VERSION, **kwargs)
    genuine = Checkpoint.from_pretrained(f"{ORG}/{GENUINE}", revision=VERSION, **kwargs)
    assert genuine.trust == VERIFIED == zoo.load(f"{ORG}/{GENUINE}", revision=VERSION, endpoint=endpoint).trust


@pytest.mark.parametrize("load", ["zoo.load", "Checkpoint.from_pretrained"])
def test_only_the_checkpoints_own_files_are_downloaded(served, load, tmp_path):
    """A released repo with files its index row does not list is refused before anything is fetched; from a repo
    outside the release only its top-level checkpoint files are fetched (no stray code, pickle or sub-folder)."""
    loader = zoo.load if load == "zoo.load" else Checkpoint.from_pretrained
    with pytest.raises(ReleaseError, match="evil.py, pytorch_model.bin"):
        loader(f"{ORG}/{EXTRA}", revision=VERSION, endpoint=served[0])
    assert cached_files(tmp_path).isdisjoint(STRAYS), "a refused repo's stray files were downloaded"
    ckpt = loader(OUTSIDER, endpoint=served[0])
    assert ckpt.trust == SELF_CONSISTENT
    cached = cached_files(tmp_path)
    assert cached.isdisjoint(STRAYS) and {"config.json", "model.safetensors"} <= cached


# (Not "deep" from the hub: the local hub server itself parses config.json for model_info, and answers 500.)
@pytest.mark.parametrize("config, where", [("list", "hub"), ("list", "folder"), ("deep", "folder")])
def test_hostile_config_is_a_checkpoint_error(served, served_tmp, config, where):
    """config.json is parsed once, size- and depth-capped, from the bytes that were hashed: a list and a nesting
    200,000 deep are CheckpointErrors, never huggingface_hub's own parse (AttributeError, RecursionError)."""
    target = f"someone/{config}-config" if where == "hub" else served_tmp / f"{config}-config"
    for loader in (zoo.load, Checkpoint.from_pretrained):
        with pytest.raises(CheckpointError, match="config.json"):
            loader(target, endpoint=served[0])


def test_from_pretrained_takes_a_bare_entry_name(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    started = time.monotonic()
    ckpt = Checkpoint.from_pretrained(EXTRA)  # the release shipped with the package, offline
    assert time.monotonic() - started < 10
    assert ckpt.trust == VERIFIED and ckpt.entry.name == EXTRA
    with pytest.raises(ValueError, match="not a registry entry"):
        Checkpoint.from_pretrained("lsa-gd-zucchet-icll")


@pytest.mark.parametrize("path", ["./nope", "/tmp/icl-zoo-nope/x", "../nope/x/y"])
def test_a_missing_path_fails_at_once(path):
    for loader in (zoo.load, Checkpoint.from_pretrained, zoo.from_pretrained):
        started = time.monotonic()
        with pytest.raises(HubError, match="^no such folder: ") as caught:
            loader(path)
        assert time.monotonic() - started < 2 and "\n" not in str(caught.value)


# ---------------------------------------------------------------- timm
def test_list_models_and_create_model():
    assert {"list_models", "create_model", "list_entries", "get_entry"} <= set(dir(zoo))
    registry = [e.name for e in zoo.list_entries()]
    assert zoo.list_models() == sorted(registry)
    lsa = zoo.list_models("lsa-*")
    assert lsa and all(n.startswith("lsa-") for n in lsa) and lsa == [n for n in registry if n.startswith("lsa-")]
    assert zoo.list_models("*zucchet-icl", pretrained=True) == [n for n in registry if n.endswith("zucchet-icl")
                                                                 and n in INDEX["entries"]]
    assert zoo.list_models(pretrained=True) == sorted(set(registry) & set(INDEX["entries"]))
    untrained = zoo.create_model(TAMPERED)
    pretrained = zoo.create_model(TAMPERED, pretrained=True)
    assert type(untrained) is type(pretrained) and not pretrained.training
    shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes(untrained) == shapes(pretrained)
    tokens = zoo.load(TAMPERED).task.sample(4, seed=0).tokens
    assert torch.equal(pretrained(tokens), zoo.from_pretrained(TAMPERED)(tokens))
    loaded = subprocess.run([sys.executable, "-c", "import sys, zoo; print('torch' in sys.modules)"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False", "import zoo must stay light"


# ---------------------------------------------------------------- torch.hub
def test_torch_hub_lists_and_loads_the_entries():
    if "source" in inspect.signature(torch.hub.list).parameters:
        listed = torch.hub.list(str(ROOT), source="local")
    else:  # torch.hub.list reads only GitHub repos (torch 2.13): what it does with the module it imports
        spec = importlib.util.spec_from_file_location("hubconf", ROOT / "hubconf.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        listed = [f for f in dir(module) if callable(getattr(module, f)) and not f.startswith("_")]
    assert sorted(listed) == sorted(n.replace("-", "_") for n in zoo.list_models())
    model = torch.hub.load(str(ROOT), TAMPERED.replace("-", "_"), source="local")
    assert isinstance(model, torch.nn.Module) and not model.training
    tokens = zoo.load(TAMPERED).task.sample(4, seed=0).tokens
    assert torch.equal(model(tokens), zoo.from_pretrained(TAMPERED)(tokens))
    untrained = torch.hub.load(str(ROOT), TAMPERED.replace("-", "_"), source="local", pretrained=False)
    assert type(untrained) is type(model) and not torch.equal(untrained(tokens), model(tokens))


# ---------------------------------------------------------------- save_pretrained
def test_save_pretrained_names_what_it_leaves_out(tmp_path):
    ckpt = zoo.load(TAMPERED)
    with pytest.warns(UserWarning, match=r"without model.onnx, model_step.onnx, model_chunk.onnx .*`zoo export "):
        ckpt.save_pretrained(tmp_path / "x")
    card = (tmp_path / "x" / "README.md").read_text()
    assert "Left out: model.onnx, model_step.onnx, model_chunk.onnx" in card and "`zoo export FOLDER`" in card
    assert not list((tmp_path / "x").glob("*.onnx"))
    bilstm = zoo.load("bilstm-d10-c10")  # not recurrent (its backward pass reads the whole sequence): model.onnx only
    with pytest.warns(UserWarning, match=r"without model.onnx \("):
        bilstm.save_pretrained(tmp_path / "y")
    assert "Left out: model.onnx**" in (tmp_path / "y" / "README.md").read_text()
    for name, saved in ((TAMPERED, ckpt), ("bilstm-d10-c10", bilstm)):  # what the release build's exporter wrote
        assert saved.graphs_left_out() == [g for g in GRAPH_FILES if g in INDEX["entries"][name]["files"]]


def test_the_module_round_trips(tmp_path):
    model = zoo.from_pretrained(TAMPERED)
    ckpt = zoo.load(TAMPERED)
    tokens = ckpt.task.sample(8, seed=3).tokens
    with pytest.warns(UserWarning, match="zoo export"):
        model.save_pretrained(tmp_path / "saved")
    back = zoo.from_pretrained(tmp_path / "saved")
    assert torch.equal(back(tokens), model(tokens))
    assert zoo.load(tmp_path / "saved").metrics == ckpt.metrics  # the loaded weights, with their metrics
    with torch.no_grad():  # fine-tuned: saved, but never with the metrics of the weights it was loaded with
        next(model.parameters()).add_(0.01)
    with pytest.warns(UserWarning) as caught:
        model.save_pretrained(tmp_path / "tuned")
    assert any("changed since they were loaded" in str(w.message) for w in caught)
    tuned = zoo.load(tmp_path / "tuned")
    assert torch.equal(tuned.model(tokens), model(tokens)) and tuned.metrics == {}


# ---------------------------------------------------------------- push_to_hub
def test_push_to_hub_uploads_the_saved_folder(tmp_path):
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http

    fake = FakeHub()
    previous = _http._GLOBAL_CLIENT_FACTORY
    set_client_factory(lambda: httpx.Client(transport=httpx.MockTransport(fake)))
    ckpt = zoo.load(TAMPERED)
    try:
        with pytest.warns(UserWarning, match="model_step.onnx"):
            info = ckpt.push_to_hub("some-org/gated", endpoint="https://hub.test", token="hf_test_token")
    finally:
        set_client_factory(previous)
    assert info.oid == "b" * 40
    assert fake.paths[0] == "/api/repos/create" and fake.paths[-1] == "/api/models/some-org/gated/commit/main"
    assert all(c[1] == "hub.test" for c in fake.calls)
    committed = dict(fake.committed)
    with pytest.warns(UserWarning):
        ckpt.save_pretrained(tmp_path / "local")
    assert set(committed) == {p.name for p in (tmp_path / "local").iterdir()}
    assert committed["model.safetensors"] == (tmp_path / "local" / "model.safetensors").read_bytes()
    assert b"Left out: model.onnx, model_step.onnx, model_chunk.onnx" in committed["README.md"]


def test_push_to_the_local_hub_says_what_to_use(served):
    ckpt = zoo.load(EXTRA)
    for endpoint in (served[0], "local"):
        with pytest.raises(HubError, match=r"zoo publish FOLDER --repo me/x` writes it into the local hub") as caught:
            ckpt.push_to_hub("me/x", endpoint=endpoint)
        assert "\n" not in str(caught.value)
