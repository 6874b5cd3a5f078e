"""The one executor on Ray: a small release built on a local Ray cluster (a head with two worker processes,
started once for this module) gives the same index.json rows, file hashes included, as the local backend (the
workers return each entry's files and this process ships them and writes the index); a sweep gives the local
backend's rows."""

from __future__ import annotations

import json

import pytest
from test_sweep import SPEC

from zoo.publishing.release import build_release
from zoo.running.executor import Backend
from zoo.running.sweep import load_spec, run_sweep
from zoo.storage.locate import INDEX_JSON

# Ray is the optional backend, tested only here, in the second line of .ci/run (marker `deep`, beside the
# torch.compile tests), not in the everyday tier: its cluster start is 5-6.5 s of this module's setup, and a
# release and a sweep on it ~45 s of test time in all.
pytestmark = pytest.mark.deep

# constructed (deterministic, no training) and attention (one graph each, model.onnx: ~1.5 s of export, not three)
ENTRIES = ["lsa-gd-2step-d10-c10", "lsa-gd-3step-d10-c10"]
TIMINGS = ("build_seconds", "steps_per_second")  # how long it took, which differs run to run


def _rows(root):
    rows = json.loads((root / INDEX_JSON).read_text())["entries"]
    return {name: {k: v for k, v in row.items() if k not in TIMINGS} for name, row in rows.items()}


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # a head and its two worker processes
    try:
        yield ray
    finally:
        ray.shutdown()


def test_a_release_built_on_ray_has_the_local_rows(tmp_path, ray_cluster):
    local = build_release(tmp_path / "local", only=ENTRIES, threads=1, progress=False, backend=Backend())
    on_ray = build_release(tmp_path / "ray", only=ENTRIES, threads=1, progress=False, backend=Backend("ray"))
    assert sorted(on_ray["entries"]) == sorted(local["entries"]) == sorted(ENTRIES)
    assert _rows(tmp_path / "ray") == _rows(tmp_path / "local")
    assert ray_cluster.cluster_resources().get("CPU") == 2
    for name in ENTRIES:  # the driver shipped each entry whole: no staging or work folder left
        assert sorted(p.name for p in (tmp_path / "ray" / name).iterdir()) == sorted(_rows(tmp_path / "local")[name]["files"])
    assert not [p for p in (tmp_path / "ray").iterdir() if p.name.startswith(".") and p.name != ".work"]


def test_a_sweep_on_ray_has_the_local_rows(tmp_path, ray_cluster):
    (tmp_path / "s.toml").write_text(SPEC)
    spec = load_spec(tmp_path / "s.toml")
    local = run_sweep(spec, tmp_path / "local", progress=False)
    remote = run_sweep(spec, tmp_path / "ray", backend="ray")
    assert [r["run"] for r in remote] == [r["run"] for r in local]
    assert [r["test_loss"] for r in remote] == pytest.approx([r["test_loss"] for r in local], rel=1e-6)
    assert ray_cluster.is_initialized()  # the sweep used this module's cluster and left it running
