"""Hostile Hub datasets: a download is checked against the expected split size and shapes before it
is decoded, refused in one line, and leaves nothing behind; `zoo eval --dataset` checks a registered
task's download against the registry's hash, never the checkpoint's own claim.

| case | how it ends |
|---|---|
| parquet bomb: 300 000 constant tasks in ~70 KB, hash only | DatasetShapeMismatch (MAX_TASKS), nothing decoded or cached |
| the same, the task known (its registry spec) | DatasetShapeMismatch "expected 10000 tasks" |
| shards each under the cap, over it together | DatasetShapeMismatch |
| wrong declared shapes; shapes that lie about the values; float64; flat lists; no x/y; no Array2D; not parquet | one-line DatasetShapeMismatch naming repo and file |
| a card whose data_files point outside the repo | DatasetShapeMismatch |
| the bomb served by the hub server | refused, nothing left in the temp dir |
| rigged checkpoint (claims a rigged split's hash) of a registered task | registry hash used; warning; mismatch refused |
| the same for a task the registry does not know | the claim used, and the result says so |
"""

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zoo.science.tasks import frozen
from zoo.science.tasks.frozen import (
    DatasetHashMismatch,
    DatasetShapeMismatch,
    content_hash,
    load_split_from_hub,
    save_split,
)

LINREG = "linreg-d10-c10"  # registered: 10 000 test tasks, x (11, 10), y (11, 1)


def _column(n: int, shape: tuple, dtype="float32"):
    flat = pa.array(np.zeros(n * shape[0] * shape[1], dtype))
    inner = pa.ListArray.from_arrays(pa.array(np.arange(n * shape[0] + 1, dtype="i4") * shape[1]), flat)
    return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype="i4") * shape[0]), inner)


def _write(path: Path, n: int, x=(11, 10), y=(11, 1), *, declared="same", chunk=10_000, dtype="float32", columns=None):
    """A parquet of `n` all-zero tasks (compresses to almost nothing), written `chunk` rows at a time.
    `declared`: the Array2D shapes in its `datasets` metadata ("same": the real ones; None: no metadata)."""
    declared = (x, y) if declared == "same" else declared
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"x": _column(min(n, chunk), x, dtype), "y": _column(min(n, chunk), y, dtype)})
    if columns is not None:
        table = table.select(columns)
    if declared is not None:
        features = {k: {"shape": list(s), "dtype": "float32", "_type": "Array2D"} for k, s in zip(("x", "y"), declared)}
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    with pq.ParquetWriter(path, table.schema, compression="zstd") as w:
        for start in range(0, n, chunk):
            w.write_table(table.slice(0, min(chunk, n - start)))
    return path


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """repo id -> local folder, served through a stand-in for `snapshot_download` that copies the folder
    into the cache_dir it is given (as the real one would download it). Every temporary file and the
    `datasets` default cache are redirected under tmp_path, to check nothing is left behind."""
    import datasets
    import huggingface_hub

    repos: dict[str, Path] = {}
    calls = []

    def snapshot_download(repo_id, *, repo_type=None, revision=None, endpoint=None, cache_dir=None, allow_patterns=None):
        assert repo_type == "dataset" and cache_dir is not None
        calls.append(Path(cache_dir))
        dst = Path(cache_dir) / "snapshots" / "0"
        shutil.copytree(repos[repo_id], dst)
        return str(dst)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    yield repos, calls
    assert calls and not any(c.exists() for c in calls)
    assert list((tmp_path / "tmp").iterdir()) == [] and not (tmp_path / "datasets-cache").exists()


@pytest.fixture
def no_decoding(monkeypatch):
    def refuse(path):
        raise AssertionError(f"{path} was decoded")

    monkeypatch.setattr(frozen, "read_parquet_arrays", refuse)


def _registry_hash(task=LINREG, split="test"):
    from zoo.science.registry import get_task_spec

    return get_task_spec(task).splits[split].sha256


def _one_line(e: pytest.ExceptionInfo, *needles):
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, ValueError)
    for needle in needles:
        assert needle in msg, (needle, msg)


# ---------------------------------------------------------------- size
def test_bomb_with_only_a_hash_is_refused_before_decoding(hub, tmp_path, no_decoding):
    repos, _ = hub
    path = _write(tmp_path / "bomb" / "data" / "test-00000-of-00001.parquet", 300_000)
    assert path.stat().st_size < 200_000  # the attack: a few KB on the wire, 300 000 tasks declared
    repos["evil/bomb"] = tmp_path / "bomb"
    with pytest.raises(DatasetShapeMismatch) as e:
        load_split_from_hub("evil/bomb", expected_sha256="0" * 64)
    _one_line(e, "evil/bomb", "300000 tasks", f"1 to {frozen.MAX_TASKS} tasks", "refusing to decode")


def test_bomb_with_a_values_budget_is_refused(hub, tmp_path, no_decoding):
    """Few tasks, each huge: the MAX_VALUES cap, not MAX_TASKS, stops it."""
    repos, _ = hub
    _write(tmp_path / "wide" / "data" / "test-00000-of-00001.parquet", 2_000, x=(100, 100), y=(1, 1), chunk=500)
    repos["evil/wide"] = tmp_path / "wide"
    with pytest.raises(DatasetShapeMismatch) as e:
        load_split_from_hub("evil/wide", expected_sha256="0" * 64)
    _one_line(e, "2000 tasks", f"at most {frozen.MAX_VALUES} values")


def test_a_known_task_gets_its_exact_size(hub, tmp_path, no_decoding):
    from zoo.science.registry import get_task_spec

    repos, _ = hub
    _write(tmp_path / "more" / "data" / "test-00000-of-00001.parquet", 10_001)
    repos["evil/more"] = tmp_path / "more"
    with pytest.raises(DatasetShapeMismatch) as e:
        load_split_from_hub("evil/more", expected_sha256=_registry_hash(), spec=get_task_spec(LINREG))
    _one_line(e, "10001 tasks", "expected 10000 tasks")


def test_shards_are_counted_together(hub, tmp_path, no_decoding, monkeypatch):
    monkeypatch.setattr(frozen, "MAX_TASKS", 1_000)
    repos, _ = hub
    for i in range(2):
        _write(tmp_path / "shards" / "data" / f"test-0000{i}-of-00002.parquet", 600)
    repos["evil/shards"] = tmp_path / "shards"
    with pytest.raises(DatasetShapeMismatch) as e:
        load_split_from_hub("evil/shards", expected_sha256="0" * 64)
    _one_line(e, "1200 tasks", "1 to 1000 tasks")


# ---------------------------------------------------------------- schema
SCHEMAS = {
    "other shapes than the task's": ({"x": (13, 3), "y": (13, 3)}, "declares x (13, 3), y (13, 3); expected columns x, y"),
    "declared shapes that lie": ({"x": (11, 300), "declared": ((11, 10), (11, 1))}, "holds 33000 values, not the 10 × 11 × 10"),
    "float64": ({"dtype": "float64"}, "expected columns x, y as float32 Array2D features of shapes (11, 10), (11, 1)"),
    "no Array2D metadata": ({"declared": None}, "expected columns x, y as float32 Array2D"),
    "no y column": ({"columns": ["x"]}, "column 'y' is None"),
    "1-D rows": ({"x": (1, 110), "declared": ((110,), (11, 1))}, "expected columns x, y as float32 Array2D"),
}


@pytest.mark.parametrize("case", sorted(SCHEMAS))
def test_wrong_schema_is_a_one_line_error(hub, tmp_path, no_decoding, case):
    from zoo.science.registry import get_task_spec

    kwargs, needle = SCHEMAS[case]
    repos, _ = hub
    _write(tmp_path / "odd" / "data" / "test-00000-of-00001.parquet", 10, **kwargs)
    repos["evil/odd"] = tmp_path / "odd"
    with pytest.raises(DatasetShapeMismatch) as e:
        load_split_from_hub("evil/odd", spec=get_task_spec(LINREG))
    _one_line(e, "evil/odd", "data/test-00000-of-00001.parquet", needle)


def test_not_parquet_at_all(hub, tmp_path, no_decoding):
    repos, _ = hub
    (tmp_path / "junk" / "data").mkdir(parents=True)
    (tmp_path / "junk" / "data" / "test-00000-of-00001.parquet").write_bytes(b"PAR1" + b"\0" * 100)
    repos["evil/junk"] = tmp_path / "junk"
    with pytest.raises(DatasetShapeMismatch) as e:
        load_split_from_hub("evil/junk", expected_sha256="0" * 64)
    _one_line(e, "evil/junk", "not a parquet file with columns x, y")


@pytest.mark.parametrize("pattern", ["../outside/*.parquet", "{outside}/*.parquet"])
def test_a_card_cannot_point_outside_the_repo(hub, tmp_path, no_decoding, pattern):
    repos, _ = hub
    _write(tmp_path / "outside" / "test.parquet", 10)
    (tmp_path / "escape").mkdir()
    pattern = pattern.format(outside=tmp_path / "outside")
    (tmp_path / "escape" / "README.md").write_text(
        f"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: test\n    path: {pattern}\n---\n")
    repos["evil/escape"] = tmp_path / "escape"
    with pytest.raises(DatasetShapeMismatch) as e:
        load_split_from_hub("evil/escape", expected_sha256="0" * 64)
    _one_line(e, "evil/escape")


def test_an_honest_split_still_loads_and_nothing_is_cached(hub, tmp_path):
    repos, _ = hub
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((50, 11, 10)).astype("f4"), rng.standard_normal((50, 11, 1)).astype("f4")
    save_split(x, y, tmp_path / "w")
    (tmp_path / "good" / "data").mkdir(parents=True)
    shutil.move(tmp_path / "w" / "data.parquet", tmp_path / "good" / "data" / "test-00000-of-00001.parquet")
    repos["me/good"] = tmp_path / "good"
    split = load_split_from_hub("me/good", expected_sha256=content_hash(x, y))
    assert np.array_equal(split.x, x) and np.array_equal(split.y, y)
    with pytest.raises(DatasetHashMismatch, match="does not match the expected"):
        load_split_from_hub("me/good", expected_sha256="0" * 64)


def test_bomb_through_the_served_hub(tmp_path, monkeypatch):
    """End to end: the bomb published to a local hub, served by the zoo's hub server, pulled by huggingface_hub."""
    from zoo.publishing import hub as zoo_hub
    from zoo.science.registry import get_task_spec

    _write(tmp_path / "bomb" / "data" / "test-00000-of-00001.parquet", 300_000)
    root = tmp_path / "hub"
    zoo_hub.publish_local(tmp_path / "bomb", "evil/bomb", repo_type="dataset", root=root)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with zoo_hub.serve(root) as endpoint, pytest.raises(DatasetShapeMismatch) as e:
        load_split_from_hub("evil/bomb", endpoint=endpoint, expected_sha256=_registry_hash(), spec=get_task_spec(LINREG))
    _one_line(e, "evil/bomb@main/test", "300000 tasks", "expected 10000 tasks")
    assert list((tmp_path / "tmp").iterdir()) == []


# ---------------------------------------------------------------- zoo eval --dataset: whose hash
def _rigged_checkpoint(tmp_path: Path, rigged: str, task: str | None = None) -> Path:
    """The released θ_GD on zucchet-icl, its config claiming `rigged` as its test split's hash (and,
    with `task`, renamed to a task the registry does not know), re-signed as a careful attacker would."""
    from safetensors.torch import load_file

    from zoo.storage.checkpoint import config_core_sha256, save_weights, sha256_file
    from zoo.storage.locate import release_dir

    dst = tmp_path / "ckpt"
    shutil.copytree(release_dir() / "lsa-gd-zucchet-icl", dst)
    config = json.loads((dst / "config.json").read_text())
    config["provenance"]["dataset_hashes"]["test"] = rigged
    config["task"]["splits"]["test"]["sha256"] = rigged
    if task is not None:
        config["entry"]["task"] = task
    weights = dst / "model.safetensors"
    save_weights(load_file(str(weights)), weights, config_sha256=config_core_sha256(config))
    config["files"]["model.safetensors"]["sha256"] = sha256_file(weights)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture
def rigged_split(monkeypatch):
    """All-zero tasks (any model scores 0.0 on them), served by a stand-in for load_split_from_hub that
    refuses, as the real one does, any expected hash but their own."""
    x = np.zeros((64, 13, 3), "f4")
    y = np.zeros((64, 13, 3), "f4")
    sha = content_hash(x, y)
    calls = []

    def fake(repo_id, *, split="test", revision=None, expected_sha256=None, endpoint=None, spec=None):
        calls.append({"expected_sha256": expected_sha256, "spec": spec})
        return frozen.FrozenSplit(name=f"{repo_id}/{split}", x=x, y=y,
                                  sha256=frozen.verify(x, y, expected_sha256, f"{repo_id}/{split}"))

    monkeypatch.setattr(frozen, "load_split_from_hub", fake)
    return sha, calls


def test_a_registered_task_is_checked_against_the_registry_not_the_checkpoint(tmp_path, rigged_split, capsys):
    from zoo.cli import main
    from zoo.science.registry import get_task_spec

    sha, calls = rigged_split
    ckpt = _rigged_checkpoint(tmp_path, sha)
    code = main(["eval", str(ckpt), "--dataset", "evil/rigged", "--json"])
    err = capsys.readouterr().err
    assert code == 1 and "does not match the expected" in err  # the rigged split is refused, never scored
    assert calls[0]["expected_sha256"] == _registry_hash("zucchet-icl") != sha
    assert calls[0]["spec"] == get_task_spec("zucchet-icl")
    assert f"warning: the checkpoint claims zucchet-icl/test has SHA-256 {sha}" in err


def test_an_unknown_task_falls_back_on_the_claim_and_says_so(tmp_path, rigged_split, capsys):
    from zoo.cli import main
    from zoo.science.registry import default_registry

    sha, calls = rigged_split
    task = "zoo-test-unregistered-task"
    ckpt = _rigged_checkpoint(tmp_path, sha, task=task)
    try:
        code = main(["eval", str(ckpt), "--dataset", "evil/rigged", "--json"])
    finally:
        default_registry().tasks.pop(task, None)  # cmd_eval registers the checkpoint's own task spec
    out = capsys.readouterr().out
    assert code == 0 and calls[0]["expected_sha256"] == sha
    metrics = json.loads(out)
    assert metrics["test_loss"] == 0.0  # what a rigged split buys: hence the label below
    assert "checkpoint's own claim" in metrics["dataset_checked_against"]
    assert "not checked against the registry" in metrics["dataset_checked_against"]
