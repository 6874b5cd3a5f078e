"""Frozen datasets: content hash, parquet round trip, tamper detection."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from zoo.science.registry import get_task_spec
from zoo.science.tasks.frozen import (
    DatasetHashMismatch,
    cache_dir,
    content_hash,
    generate_split,
    read_parquet_arrays,
    save_split,
)
from zoo.science.tasks.frozen import load_split as _load_split


def load_split(name, split, **kwargs):
    """The registry's split: frozen.py knows no registry, the caller passes the task's spec."""
    return _load_split(name, split, spec=get_task_spec(name), **kwargs)


def test_registry_hash_is_reproduced_from_the_seed():
    spec = get_task_spec("zucchet-icl")
    s = spec.splits["test"]
    x, y = generate_split(spec.build(), s.seed, s.n, s.w_std)
    assert x.shape == (10_000, 13, 3) and x.dtype == np.float32
    assert content_hash(x, y) == s.sha256


def test_parquet_has_explicit_array2d_features_and_round_trips(tmp_path):
    spec = get_task_spec("zucchet-icl")
    x, y = generate_split(spec.build(), 5, 100)
    digest = save_split(x, y, tmp_path)
    schema = pq.read_schema(tmp_path / "data.parquet")
    assert "Array2D" in schema.metadata[b"huggingface"].decode()
    x2, y2 = read_parquet_arrays(tmp_path / "data.parquet")
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert content_hash(x2, y2) == digest


@pytest.mark.parametrize("shapes", [((40, 11, 5), (40, 11, 3)), ((7, 33, 6), (7, 33, 6)), ((1, 2, 1), (1, 2, 1))])
def test_save_split_writes_the_bytes_datasets_writes(shapes, tmp_path):
    """The columnar writer is a fast path of `Dataset.from_dict` (the reference): the same parquet bytes."""
    from datasets import Array2D, Dataset, Features

    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(s).astype("<f4") for s in shapes)
    features = Features({k: Array2D(shape=a.shape[1:], dtype="float32") for k, a in (("x", x), ("y", y))})
    Dataset.from_dict({"x": x, "y": y}, features=features).to_parquet(str(tmp_path / "reference.parquet"))
    save_split(x, y, tmp_path / "fast")
    assert (tmp_path / "fast" / "data.parquet").read_bytes() == (tmp_path / "reference.parquet").read_bytes()


def test_hash_sees_one_flipped_bit():
    x = np.zeros((2, 3, 4), np.float32)
    y = np.zeros((2, 3, 1), np.float32)
    h = content_hash(x, y)
    x.view(np.uint8)[0, 0, 0] ^= 1
    assert content_hash(x, y) != h
    assert content_hash(np.zeros((3, 2, 4), np.float32), np.zeros((3, 2, 1), np.float32)) != h  # shape counts


def test_tampered_split_on_disk_is_regenerated_and_kept_aside():
    split = load_split("zucchet-icl", "validation")
    path = cache_dir() / "datasets" / "zucchet-icl" / "validation" / "data.parquet"
    x = split.x.copy()
    x.view(np.uint8)[0, 0, 0] ^= 1  # flip the lowest bit of one float
    save_split(x, split.y, path.parent)
    tampered = content_hash(x, split.y)
    with pytest.warns(UserWarning, match="regenerated it from seed"):
        healed = load_split("zucchet-icl", "validation")
    assert healed.sha256 == split.sha256 and np.array_equal(healed.x, split.x)  # never the tampered data
    aside = path.with_name(f"data.parquet.mismatch-{tampered[:12]}")
    kept_x, _ = read_parquet_arrays(aside)  # nothing lost: the edited file is still there
    assert content_hash(kept_x, split.y) == tampered
    aside.unlink()


def test_split_this_machine_generates_differently_is_refused(monkeypatch):
    import zoo.science.tasks.frozen as frozen

    split = load_split("zucchet-icl", "validation")
    path = cache_dir() / "datasets" / "zucchet-icl" / "validation" / "data.parquet"
    before = path.read_bytes()
    x = split.x.copy()
    x.view(np.uint8)[0, 0, 0] ^= 1
    save_split(x, split.y, path.parent)
    edited = path.read_bytes()
    real = frozen.generate_split
    monkeypatch.setattr(frozen, "generate_split", lambda *a: (lambda xy: (xy[0] + 1, xy[1]))(real(*a)))
    with pytest.raises(DatasetHashMismatch, match="does not match the expected"):
        load_split("zucchet-icl", "validation")
    assert path.read_bytes() == edited  # refused without touching the cache
    path.write_bytes(before)


def test_task_variant_split_is_hash_checked_on_reload():
    """A variant has no registered hash: its cached copy is checked against the split regenerated
    from its seed, so a cached split with y = 0 (which would score loss 0) is never used."""
    from zoo.science.registry import task_variant

    name = task_variant("zucchet-icl", {"n_context": 7})
    split = load_split(name, "test")
    path = cache_dir() / "datasets" / name / "test" / "data.parquet"
    save_split(split.x, np.zeros_like(split.y), path.parent)
    with pytest.warns(UserWarning, match="regenerated it from seed"):
        again = load_split(name, "test")
    assert again.sha256 == split.sha256 and np.array_equal(again.y, split.y)


def test_rebuild_keeps_a_tampered_copy():
    split = load_split("zucchet-icl", "test")
    path = cache_dir() / "datasets" / "zucchet-icl" / "test" / "data.parquet"
    x = split.x.copy()
    x[0, 0, 0] += 1
    save_split(x, split.y, path.parent)
    with pytest.warns(UserWarning, match="kept as"):
        load_split("zucchet-icl", "test", rebuild=True)
    assert path.with_name(f"data.parquet.mismatch-{content_hash(x, split.y)[:12]}").is_file()


@pytest.mark.parametrize("bad", ["../../../../tmp/x", "x/../../y", "/etc", "A B", "..", "zucchet-icl/../x"])
def test_task_names_never_become_paths_unchecked(bad, tmp_path):
    from zoo.science.paths import safe_name

    with pytest.raises(ValueError, match="not a safe name"):
        safe_name(bad)


def test_concurrent_loads_of_a_tampered_split_all_succeed():
    """Three processes open the same tampered cached split at once: one repairs it under a lock,
    the others wait and read the repaired copy (none crashes)."""
    import os
    import subprocess
    import sys

    split = load_split("zucchet-icl", "validation")
    path = cache_dir() / "datasets" / "zucchet-icl" / "validation" / "data.parquet"
    x = split.x.copy()
    x[0, 0, 0] += 1
    save_split(x, split.y, path.parent)
    code = ("import warnings; warnings.simplefilter('ignore'); from zoo.science.tasks.frozen import load_split; "
            "from zoo.science.registry import get_task_spec; "
            "print(load_split('zucchet-icl', 'validation', spec=get_task_spec('zucchet-icl')).sha256)")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ)) for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [r[1][-500:] for r in results]
    assert {r[0].strip() for r in results} == {split.sha256}


def test_unreadable_cached_split_is_set_aside_and_rebuilt():
    split = load_split("zucchet-icl", "test")
    path = cache_dir() / "datasets" / "zucchet-icl" / "test" / "data.parquet"
    path.write_bytes(b"not a parquet file")
    with pytest.warns(UserWarning, match="kept as"):
        again = load_split("zucchet-icl", "test")
    assert again.sha256 == split.sha256
    assert any(p.name.startswith("data.parquet.mismatch-") for p in path.parent.iterdir())


def test_frozen_knows_no_registry():
    """Frozen datasets sit below the registry (the science floor's import-linter contract, tests/test_layers.py):
    the registry's task spec comes from the caller, and without one loading refuses."""
    import zoo.science.tasks.frozen as frozen

    with pytest.raises(TypeError, match="spec"):
        frozen.load_split("zucchet-icl", "test")  # a name alone is not enough


def test_a_cached_split_with_a_null_float_reads_as_nan_and_is_regenerated():
    """A frozen split's float32 columns are read in place; a file with a null among them takes Arrow's converting
    path instead (the null becomes NaN), so its hash is wrong: set aside, regenerated from the seed."""
    import pyarrow as pa

    split = load_split("zucchet-icl", "validation")
    path = cache_dir() / "datasets" / "zucchet-icl" / "validation" / "data.parquet"
    table = pq.read_table(path)
    column = table.column("x").combine_chunks()
    storage = column.storage if isinstance(column.type, pa.ExtensionType) else column
    values = storage.flatten().flatten().to_numpy()
    holed = pa.array(values, mask=np.arange(values.size) == 0)  # the first float of the first task: null
    inner = pa.ListArray.from_arrays(storage.flatten().offsets, holed)
    outer = pa.ListArray.from_arrays(storage.offsets, inner)
    x = pa.ExtensionArray.from_storage(column.type, outer) if isinstance(column.type, pa.ExtensionType) else outer
    pq.write_table(table.set_column(table.schema.get_field_index("x"), table.schema.field("x"), x), path)
    read_x, read_y = read_parquet_arrays(path)
    assert np.isnan(read_x[0, 0, 0]) and np.array_equal(read_x.reshape(-1)[1:], split.x.reshape(-1)[1:])
    with pytest.warns(UserWarning, match="regenerated it from seed"):
        healed = load_split("zucchet-icl", "validation")
    assert healed.sha256 == split.sha256 and np.array_equal(healed.x, split.x)
    aside = path.with_name(f"data.parquet.mismatch-{content_hash(read_x, read_y)[:12]}")
    assert aside.is_file()  # nothing lost
    aside.unlink()
