"""Frozen datasets: content hash, parquet round trip, tamper detection."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from zoo.registry import get_task_spec
from zoo.tasks.frozen import (
    DatasetHashMismatch, cache_dir, content_hash, generate_split, load_split, read_parquet_arrays, save_split,
)


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
    import zoo.tasks.frozen as frozen

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
