"""The release: every registry entry's checkpoint is shipped, served by the local hub, pulled with plain
huggingface_hub, hash-verified, re-scored to its card's number and streamed through ONNX against torch."""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch
from stream_parity import linearised

import zoo
from zoo.publishing import hub, release
from zoo.science.evaluation import loss_alone, rescore
from zoo.science.expected import PAIRED_KEYS, check, verdict
from zoo.science.models import FAMILY_OF_TYPE
from zoo.science.registry import RegistryError, default_registry
from zoo.science.tasks.frozen import load_split_from_hub
from zoo.storage import locate
from zoo.storage.checkpoint import read_checkpoint

INDEX = locate.read_index()
RELEASED = sorted(INDEX["entries"])
# Card numbers reproduce to 1e-6 relative: the same float32 kernels, only the summation order differs
# between machines. One construction is ill-conditioned in float32: the LSTM ≈ LSA (Zucchet A.2) reads
# its answer out of O(ε) changes of saturating gates scaled back by 1/ε² = 1e4 (ε = 0.01), so the
# rounding of oneDNN's fused LSTM kernel, whose code path depends on the CPU's instruction set, moves
# its loss by 0.2% (0.094400 on the build machine, 0.094229 on a 2-core AVX2 Xeon, code of fed1d02 and
# of today alike). Its float64 model is checked against GD in tests/test_families.py and test_export.py.
RESCORE_REL = {"lstm-gd-zucchet-icl": 5e-3}
STREAMED = 64  # test prompts streamed per entry (the re-score uses the whole split)


def test_every_registry_entry_is_released_and_current():
    registry = default_registry().entries
    assert RELEASED == sorted(registry), f"not released: {sorted(set(registry) - set(RELEASED))}"
    assert INDEX["version"] == locate.VERSION
    stale = [n for n, row in INDEX["entries"].items() if row["fingerprint"] != release.entry_fingerprint(n)]
    assert not stale, f"built from an older recipe/arch/task: {stale}; rebuild with `zoo release build`"
    for name, row in INDEX["entries"].items():  # the arch type, and the family module that builds it
        arch_type = registry[name].arch.type
        assert (row["arch"], row["family"]) == (arch_type, FAMILY_OF_TYPE[arch_type].name), name
        # the verdicts are those of the registry's current expected values, sources, kinds and tolerances, on the
        # released measurements (eval_results.json, and what refresh measured beyond it: the paired gap to GD)
        metrics = json.loads((locate.release_dir() / name / "eval_results.json").read_text())
        remeasured = row.get("remeasured") or {}
        assert set(remeasured) <= set(PAIRED_KEYS), (name, remeasured)
        checks = check(registry[name], {**metrics, **remeasured})
        assert row["checks"] == [c.as_dict() for c in checks], f"{name}: run `zoo release refresh`"
        assert row["verdict"] == verdict(checks), name
        assert row.get("deviations") == [d.what for d in registry[name].deviation], f"{name}: run `zoo release refresh`"
        card = (locate.release_dir() / name / "README.md").read_text()  # and the card says the same
        for c in checks:
            assert f"({c.tolerance}) → measured {c.measured_text}: **{c.status}** ({c.off_by})" in card, (name, c)
            if c.source == "paper":  # graded against the paper, quoted
                assert f"“{c.quote}”" in card and c.status in ("meets", "falls short", "not checkable"), (name, c)
            else:  # a reference is never a paper verdict
                assert c.source == "reference" and c.status.endswith("the reference") or c.status == "not checkable", (name, c)
        for d in registry[name].deviation:  # every declared departure, in full
            assert d.zoo in card and d.paper in card, (name, d.id)
        history = (locate.release_dir() / name / "training_history.json")
        skipped = sum(r.get("skipped", 0) for r in json.loads(history.read_text())) if history.exists() else 0
        assert (f"{skipped:,} of its steps were skipped" in card) == (skipped > 0), f"{name}: run `zoo release refresh`"
    assert (locate.release_dir() / locate.INDEX_MD).read_text() == release.index_markdown(INDEX), \
        "INDEX.md is not what index.json generates: run `zoo release refresh`"


def test_every_released_row_was_built_from_a_commit():
    """The shipped release is built from commits: no row records "<sha>-dirty-<hex>" (a build from uncommitted
    code, which `zoo release build` records rather than refuses; checkpoint.commit_with_sources, tested in
    test_checkpoint.py, names the later commit holding such sources). Such a row is rebuilt from a commit
    before it ships (`zoo release build --only NAME --force` on a clean tree), as the five GPU-built
    softmax-tf-*-d5-c10 were at 3b4762a."""
    dirty = sorted(name for name, row in INDEX["entries"].items()
                   if not row.get("commit") or "-dirty-" in row["commit"])
    assert not dirty, f"built from uncommitted code (or no commit recorded): {dirty}; rebuild them from a commit"


def test_release_size_is_within_budget():
    total = sum(p.stat().st_size for p in locate.release_dir().rglob("*") if p.is_file())
    assert total < 40 * 2**20, f"release is {total / 2**20:.1f} MiB (budget 40 MiB)"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The shipped release imported into a fresh local hub and served by the zoo's hub server."""
    root = tmp_path_factory.mktemp("release-hub")
    release.import_to_hub(root / "hub", progress=False)
    with hub.serve(root / "hub") as endpoint:
        yield {"endpoint": endpoint, "cache": root / "hf-cache", "splits": {}}


def _test_split(served, ckpt):
    task = ckpt.entry.task
    if task not in served["splits"]:  # one download per task: sizes and schema, then the registry's content hash
        spec = default_registry().tasks[task]
        served["splits"][task] = load_split_from_hub(
            f"{locate.ORG}/{task}", split="test", revision=INDEX["version"], endpoint=served["endpoint"],
            expected_sha256=spec.splits["test"].sha256, spec=spec)
    return served["splits"][task]


@pytest.mark.parametrize("name", RELEASED)
def test_released_entry_pulls_rescores_and_streams(served, name):
    from huggingface_hub import snapshot_download

    row = INDEX["entries"][name]
    folder = Path(snapshot_download(f"{locate.ORG}/{name}", revision=INDEX["version"], endpoint=served["endpoint"],
                                    cache_dir=served["cache"]))
    locate.verify_folder(folder, row)  # every file, config.json and the card included
    ckpt = read_checkpoint(folder)
    card = json.loads((folder / "eval_results.json").read_text())

    # The card's number, reproduced on the frozen split pulled with datasets.load_dataset. Same torch
    # and float32 kernels: only the summation order can differ between machines (~1e-7 relative).
    split = _test_split(served, ckpt)
    constructed = ckpt.entry.source.kind == "constructed"
    # a trained entry's card number needs its loss alone (the Jacobians of released checkpoints: test_benchmark.py)
    metrics = rescore(ckpt, split) if constructed else {"test_loss": loss_alone(ckpt.model, ckpt.task, split.batch(ckpt.task))}
    assert metrics["test_loss"] == pytest.approx(card["test_loss"], rel=RESCORE_REL.get(name, 1e-6), abs=1e-12)
    assert row["test_loss"] == card["test_loss"]
    assert f"{card['test_loss']:.6g}" in (folder / "README.md").read_text()
    if constructed:  # constructions must meet their paper values and match their references
        failed = [c for c in check(default_registry().entries[name], metrics) if not c.meets]
        assert not failed, failed

    # ONNX against torch on the test prompts: whole-sequence graph, and the step graph token by token.
    # fp32 graphs vs the fp32 torch model: rounding differences of a few ulps times the output scale.
    tokens = split.batch(ckpt.task).tokens[:STREAMED]
    with torch.no_grad():
        reference = ckpt.model.float()(tokens).numpy()
        exact = copy.deepcopy(ckpt.model).double()(tokens.double()).numpy()
    sequence = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    (out,) = sequence.run(None, {"tokens": tokens.numpy()})
    graphs = [out]
    if (folder / "model_step.onnx").exists():
        from export.streaming import StreamingSession

        session = StreamingSession(folder)
        session.reset(tokens.shape[0])
        graphs.append(np.stack([session.push(tokens[:, t].numpy()) for t in range(tokens.shape[1])], axis=1))
        assert session.chunk_path == folder / "model_chunk.onnx", "a recurrent entry ships its chunk graph"
        # The shipped chunk graph (the session's "parallel") at ≤ 8 streams, all positions at once (triples: every
        # prediction). Named alone: a default session would first time it against the graphs it derives from the step
        # graph (~0.5 s an entry; the choice and those graphs: test_streaming_many.py, test_export.py), and would run a
        # first push shorter than PROBE_MIN_T through the step graph instead.
        few = 4
        chunked = StreamingSession(folder, graphs=("parallel",))
        chunked.reset(few)
        graphs.append(np.concatenate([chunked.push(tokens[:few].numpy()), out[few:]]))  # rows past `few`: as above
    else:
        assert not getattr(ckpt.model, "recurrent", False), "a recurrent entry must ship its step graph"
    for got in graphs:
        if linearised(ckpt.entry):
            # Read out with weights 16/ε³ ≈ 1.6e7 (4/ε² twice for two layers): fp32 rounding is amplified by design;
            # the graphs must be as close to the float64 model as the fp32 torch model is.
            rel = lambda x: np.sqrt(((x - exact) ** 2).mean() / (exact**2).mean())  # noqa: E731
            assert rel(got) < 0.05 and rel(got) < 2 * rel(reference), (rel(got), rel(reference))
        else:
            np.testing.assert_allclose(got, reference, atol=1e-4 * max(1.0, float(np.abs(reference).max())), rtol=0)


def test_plain_clients_with_hf_endpoint(served, tmp_path):
    """What a new user types, with HF_ENDPOINT pointing at the served release (read at import time,
    hence a fresh process): datasets.load_dataset, zoo.load, StreamingSession, zoo pull, a bare name."""
    import os
    import subprocess
    import sys

    code = f"""
import datasets, numpy as np, zoo
from export.streaming import StreamingSession
ds = datasets.load_dataset("icl-zoo/zucchet-icl", split="test", revision="{INDEX['version']}")
ckpt = zoo.load("icl-zoo/gated-rnn-zucchet-icl", revision="{INDEX['version']}")
bare = zoo.load("gated-rnn-zucchet-icl")  # HF_ENDPOINT set: from the hub, at the release tag, index-verified
session = StreamingSession("icl-zoo/gated-rnn-zucchet-icl", revision="{INDEX['version']}")
batch = ckpt.task.sample(3, seed=0)
session.reset(3)
gap = np.abs(session.predict(session.push(batch.tokens.numpy())[:, -1]) - ckpt.model.predict(batch.tokens).detach().numpy()).max()
print(len(ds), bare.metrics["test_loss"] == ckpt.metrics["test_loss"], gap < 1e-5)
"""
    env = {**os.environ, "HF_ENDPOINT": served["endpoint"], "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["10000", "True", "True"], out.stdout
    pull = subprocess.run([sys.executable, "-m", "zoo.cli", "pull", "icl-zoo/lsa-gd-zucchet-icl", "--revision",
                           INDEX["version"]], env=env, capture_output=True, text=True, timeout=300)
    assert pull.returncode == 0 and f"verified against release {INDEX['version']}" in pull.stdout, pull.stderr[-2000:]


# ---------------------------------------------------------------- loading by bare name, offline
def test_bare_name_loads_the_shipped_release_offline(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    name = "gated-rnn-zucchet-icl"
    ckpt = zoo.load(name)
    assert ckpt.entry.name == name
    assert ckpt.metrics["test_loss"] == INDEX["entries"][name]["test_loss"]
    assert zoo.load(name).model.state_dict().keys() == ckpt.model.state_dict().keys()


def test_unknown_bare_name_suggests_registry_names():
    with pytest.raises(RegistryError, match="did you mean gated-rnn-zucchet-icl"):
        zoo.load("gated-rnn-zuchet-icl")


def test_bare_name_never_rebuilds(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("ICL_ZOO_RELEASE", str(tmp_path / "empty"))
    with pytest.raises(locate.ReleaseError, match="not in the release shipped"):
        zoo.load("lsa-gd-zucchet-icl")
    assert not (tmp_path / "empty").exists()


def test_bare_name_and_local_folder_of_the_same_name_is_ambiguous(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(locate.release_dir() / "gated-rnn-gd-zucchet-icl", tmp_path / "gated-rnn-zucchet-icl")
    with pytest.raises(locate.ReleaseError, match="write ./gated-rnn-zucchet-icl"):
        zoo.load("gated-rnn-zucchet-icl")
    assert zoo.load("./gated-rnn-zucchet-icl").entry.name == "gated-rnn-gd-zucchet-icl"  # the folder, asked for


@pytest.fixture
def small_release(tmp_path):
    """A copy of two released entries with their index rows."""
    root = tmp_path / "release"
    names = ["lsa-gd-zucchet-icl", "gated-rnn-zucchet-icl"]
    for n in names:
        shutil.copytree(locate.release_dir() / n, root / n)
    index = {"version": INDEX["version"], "entries": {n: INDEX["entries"][n] for n in names}}
    (root / locate.INDEX_JSON).write_text(json.dumps(index))
    return root


@pytest.mark.parametrize("tamper", ["card", "config", "extra-file", "symlink"])
def test_tampered_released_folder_is_refused(small_release, monkeypatch, tamper):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("ICL_ZOO_RELEASE", str(small_release))
    folder = small_release / "lsa-gd-zucchet-icl"
    if tamper == "card":
        (folder / "README.md").write_text("# edited\n")
    elif tamper == "config":
        config = json.loads((folder / "config.json").read_text())
        config["construction"]["eta"] = 1.0
        (folder / "config.json").write_text(json.dumps(config))
    elif tamper == "extra-file":
        (folder / "payload.py").write_text("print('hi')\n")
    else:
        target = folder / "README.md"
        target.unlink()
        target.symlink_to("/etc/hostname")
    with pytest.raises(locate.ReleaseError):
        zoo.load("lsa-gd-zucchet-icl")
    zoo.load("gated-rnn-zucchet-icl")  # the untouched entry still loads


# ---------------------------------------------------------------- cards
STREAMING_IMPORT = "from export.streaming import StreamingSession"
LEGACY_STREAMING_IMPORT = "from export import StreamingSession"


def test_card_template_imports_the_streaming_package_by_its_name():
    from zoo.storage.card import templates_dir

    template = (templates_dir() / "card.md.j2").read_text()
    assert STREAMING_IMPORT in template and LEGACY_STREAMING_IMPORT not in template


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


@pytest.mark.parametrize("name", ["gated-rnn-zucchet-icl", "lsa-gd-d10-c10", "softmax-tf-1l-d10-c10"])
def test_card_snippets_run_verbatim(name, monkeypatch, capsys):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    card = (locate.release_dir() / name / "README.md").read_text()
    head = card.split("---", 2)[2][:1500]  # the first lines: what, which paper, measured vs paper
    assert "**What it does.**" in head and "**Addresses**" in head and "**Measured**" in head
    assert "pipeline_tag" not in card and "arxiv:" in card
    blocks = _python_blocks(card)
    assert blocks, "a card without a usage snippet"
    monkeypatch.chdir(locate.release_dir() / name)  # as in the downloaded repo folder
    assert LEGACY_STREAMING_IMPORT not in card  # rendered after the rename to export
    # The dataset-row snippet needs the dataset repo from a hub: tests/test_card_contract.py runs it against the
    # repo's files (offline here); every other block runs verbatim.
    from_dataset = [b for b in blocks if "load_dataset(" in b]
    assert len(from_dataset) == 1 and "import onnxruntime" in from_dataset[0]
    blocks = [b for b in blocks if b not in from_dataset]
    namespace: dict = {}
    for block in blocks:  # in order, as a reader would paste them
        exec(compile(block, f"{name}/README.md", "exec"), namespace)
    plain = [b for b in blocks if "import onnxruntime" in b]
    if (locate.release_dir() / name / "model_step.onnx").exists():  # recurrent: a zoo-free ONNX snippet
        assert len(plain) == 1 and not any(m in plain[0] for m in ("import zoo", "from zoo", "export import"))
        exec(compile(plain[0], f"{name}/README.md", "exec"), {})  # on its own, with nothing else imported
    printed = capsys.readouterr().out
    assert f"{INDEX['entries'][name]['test_loss']}"[:8] in printed  # rescore printed the card's loss


def _onnx_snippet(card: str) -> str:
    block = card.split("<!-- onnx-snippet -->")[1].split("<!-- /onnx-snippet -->")[0]
    return block.split("```python\n")[1].split("```")[0]


def _run_card_snippet(served, name: str, folder: Path) -> None:
    """A card's "no zoo code" snippet, pasted unmodified into a fresh interpreter (`python -I`: no user site, no
    PYTHONPATH) in an empty folder, with an empty Hugging Face cache and only HF_ENDPOINT pointing at the served
    release: it fetches its dataset and graph itself and must print the card's test loss."""
    from zoo.storage.card import ONNX_TOLERANCE

    code = _onnx_snippet((locate.release_dir() / name / "README.md").read_text())
    assert "zoo" not in code.replace("icl-zoo/", "").replace("icl_zoo.", ""), "the snippet must need no zoo code"
    assert f'hf_hub_download("{locate.ORG}/{name}", "model.onnx")' in code
    folder.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(folder), "HF_ENDPOINT": served["endpoint"],
           "HF_HOME": str(folder / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-I", "-c", code], cwd=folder, capture_output=True, text=True, timeout=900,
                         env=env, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = float(run.stdout.strip().splitlines()[-1])
    card_loss = INDEX["entries"][name]["test_loss"]
    stated = float(re.search(r"on this card, to within ±([0-9.e+-]+)", code).group(1))  # what the card promises
    # 1e-3 of the loss plus 3× the model's float32 rounding: never more than 1% of it, bar losses at rounding level
    assert 0.95 * ONNX_TOLERANCE * card_loss <= stated <= max(0.01 * card_loss, 1e-12), (name, stated, card_loss)  # 2 digits
    assert abs(printed - card_loss) <= stated, (printed, card_loss, stated)


# Fast whole-sequence graphs in the default run, one per layout family of snippet; every card with -m slow
SNIPPET_ENTRIES = ["lsa-d10-c10", "gated-rnn-zucchet-icl", "gd-ssm-1d", "gated-rnn-student-d4"]


@pytest.mark.parametrize("name", SNIPPET_ENTRIES)
def test_card_snippet_runs_verbatim_from_an_empty_folder(served, name, tmp_path):
    _run_card_snippet(served, name, tmp_path / "empty")


@pytest.mark.slow
@pytest.mark.parametrize("name", RELEASED)
def test_every_card_snippet_runs_verbatim(served, name, tmp_path):
    _run_card_snippet(served, name, tmp_path / "empty")


# ---------------------------------------------------------------- archive
def test_archive_roundtrip_and_hostile_members(small_release, tmp_path):
    archive = release.write_archive(small_release, tmp_path / "release.tar.gz")
    dest = release.unpack_archive(archive, tmp_path / "unpacked" / "release")
    for name, row in json.loads((small_release / locate.INDEX_JSON).read_text())["entries"].items():
        locate.verify_folder(dest / name, row)

    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(small_release / locate.INDEX_JSON, arcname="release/../../escaped.json")
    with pytest.raises(locate.ReleaseError, match="refusing archive member"):
        release.unpack_archive(evil, tmp_path / "other" / "release")
    assert not (tmp_path / "escaped.json").exists()

    stray = tmp_path / "stray.tar.gz"  # a member no index row vouches for is never installed
    (tmp_path / "empty-index.json").write_text(json.dumps({"version": INDEX["version"], "entries": {}}))
    with tarfile.open(stray, "w:gz") as tar:
        tar.add(tmp_path / "empty-index.json", arcname="release/index.json")
        tar.add(small_release / "lsa-gd-zucchet-icl" / "config.json", arcname="release/other-entry/config.json")
    with pytest.raises(locate.ReleaseError, match="not covered by its index: other-entry"):
        release.unpack_archive(stray, tmp_path / "third" / "release")
    assert not (tmp_path / "third").exists()

    index = json.loads((small_release / locate.INDEX_JSON).read_text())
    index["entries"]["../../victim"] = {"entry": "../../victim", "files": {}}
    (small_release / locate.INDEX_JSON).write_text(json.dumps(index))
    with pytest.raises(locate.ReleaseError, match="not a valid release index"):
        locate.read_index(small_release)


# ---------------------------------------------------------------- the real Hub, at the HTTP boundary
from fake_hub import FakeHub  # noqa: E402


def test_release_publish_pushes_tags_and_collects(small_release):
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http

    fake = FakeHub()
    previous = _http._GLOBAL_CLIENT_FACTORY
    set_client_factory(lambda: httpx.Client(transport=httpx.MockTransport(fake)))
    try:
        out = release.publish_release("org", hub="https://hub.test", root=small_release, token="hf_test", progress=False)
    finally:
        set_client_factory(previous)
    paths = fake.paths
    assert out["repos"] == ["org/gated-rnn-zucchet-icl", "org/lsa-gd-zucchet-icl", "org/zucchet-icl"]
    for repo, kind in (("org/gated-rnn-zucchet-icl", "models"), ("org/lsa-gd-zucchet-icl", "models"),
                       ("org/zucchet-icl", "datasets")):
        assert f"/api/{kind}/{repo}/commit/main" in paths
        assert f"/api/{kind}/{repo}/tag/main" in paths
    assert paths.count("/api/collections/org/icl-zoo-v0-1/items") == 3


def test_eval_scores_the_shifted_validation_split(capsys, monkeypatch):
    """Zucchet's Figs. 4–5 report W* ~ N(0, 2/3), the task's frozen validation split: `zoo eval
    --split validation` scores a released checkpoint there (hash-checked), GD's loss doubling with
    the variance of W*."""
    from zoo.cli import main

    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert main(["eval", "gated-rnn-gd-zucchet-icl", "--split", "validation", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dataset"] == "zucchet-icl/validation"
    assert out["dataset_sha256"] == zoo.science.registry.get_task_spec("zucchet-icl").splits["validation"].sha256
    test = INDEX["entries"]["gated-rnn-gd-zucchet-icl"]["test_loss"]
    assert out["test_loss"] == pytest.approx(out["gd_loss"], rel=1e-4)  # the construction is GD
    assert out["test_loss"] == pytest.approx(2 * test, rel=0.05)  # ½ σ_W² … : twice the variance of W*
