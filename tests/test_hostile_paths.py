"""Writes that stay where they were asked to go, faults that the next run cleans up, and the same caps on
every path. Each test reproduces an attack or a fault and checks that it ends in a one-line error naming
the path or the limit, with nothing written elsewhere and nothing left behind.

| class | case | how it ends |
|---|---|---|
| names → folders | a sweep grid / `--set` value or sweep name with `/`, `\\`, `..`, a leading `.`, NUL, a newline, 300 chars | refused in one line before anything runs |
| foreign folders | `zoo build --out` / `zoo export --out` into a non-empty folder with no zoo checkpoint, --force too | refused, the folder untouched |
| killed swap | a checkpoint left only as `.<name>.old-*` | restored by the next build, export or sweep |
| killed split write | `.data.parquet.<pid>.tmp` in the frozen-split cache | removed by the next load |
| two writers | a second `zoo build` into the --out a first one is writing | refused in one line naming the pid; the first one finishes |
| cache bomb | a few KB data.parquet in the cache declaring 300 000 tasks | refused from its footer (the hub path's caps), set aside, regenerated; RSS flat |
| --state-in | NaN / inf in a saved state | refused unless --nan pass |
| full disk | `zoo stream --output X.npy` on a full filesystem | one line naming the path, no .part left (was SIGBUS, exit 135) |
| hub serve | two `zoo hub serve --dir D` on one fresh folder | the second waits for the first's preparation, says so in one line, then serves |
"""

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import zoo
from export import onnx_export
from zoo.cli import main

ZOO = [sys.executable, "-m", "zoo.cli"]
REPO = Path(__file__).resolve().parents[1]
A = "lsa-gd-zucchet-icl"  # constructed: built in about a second
B = "gated-rnn-gd-zucchet-icl"  # another constructed entry on the same task
RELEASED = REPO / "release" / B  # d_in 6, read-out 3 values, state (batch, 42)


def fake_graphs(ckpt, folder):
    """The ONNX writer's contract (a graph file, returned) without the seconds an export takes."""
    path = Path(folder) / onnx_export.SEQUENCE_FILE
    path.write_bytes(f"graph of {ckpt.entry.name}".encode())
    return [path]


@pytest.fixture
def fast_graphs(monkeypatch):
    monkeypatch.setattr(onnx_export, "export_checkpoint_graphs", fake_graphs)


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(text: str, *needles) -> None:
    text = text.strip()
    assert text.startswith("error: ") and len(text.splitlines()) == 1 and "Traceback" not in text, text
    for needle in needles:
        assert needle in text, (needle, text)


def user_folder(path: Path) -> Path:
    """A folder of someone's own files, two of which have the names a checkpoint's files have."""
    path.mkdir(parents=True)
    (path / "README.md").write_text("my project's readme\n")
    (path / "eval_results.json").write_text('{"mine": true}\n')
    (path / "notes.txt").write_text("mine\n")
    return path


# ---------------------------------------------------------------- 1. names that become folders
SWEEP = """
name = "{name}"
entries = ["{entry}"]
graphs = false
"""

BAD_VALUES = {
    "dotdot-escape": "/../../../victim",
    "slash": "a/b",
    "backslash": "a\\b",
    "dotdot": "..",
    "nul": "x\x00y",
    "newline": "x\ny",
    "long": "a" * 300,
}


@pytest.mark.parametrize("value", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_a_sweep_value_that_is_not_one_folder_name_is_refused_before_anything_runs(value, tmp_path, capsys, fast_graphs):
    """Before: `description = "/../../../victim"` built the checkpoint into tmp/victim, replacing its README.md
    and eval_results.json; a 300-character value failed after the build (File name too long)."""
    victim = user_folder(tmp_path / "victim")
    before = snapshot(victim)
    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP.format(name="hostile", entry=A) + f"[grid]\ndescription = [{json.dumps(value)}]\n")
    out = tmp_path / "sweeps" / "out"
    code = main(["sweep", str(spec), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    one_line(err, "sweep run", "folder name")
    assert snapshot(victim) == before
    assert not out.exists() or list(out.iterdir()) == []  # nothing ran


def test_a_set_value_that_is_not_one_folder_name_is_refused(tmp_path, capsys, fast_graphs):
    victim = user_folder(tmp_path / "victim")
    before = snapshot(victim)
    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP.format(name="hostile", entry=A))
    out = tmp_path / "sweeps" / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--quiet", "--set", "description=/../../../victim"]) == 1
    one_line(capsys.readouterr().err, "/../../../victim", "folder name")
    assert snapshot(victim) == before and (not out.exists() or list(out.iterdir()) == [])


@pytest.mark.parametrize("name", ["../escaped", "a/b", ".hidden", "x\ty", "b" * 300])
def test_a_sweep_name_that_is_not_one_folder_name_is_refused(name, tmp_path, capsys, monkeypatch, fast_graphs):
    """The name is the default output folder, runs/<name>."""
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP.format(name=json.dumps(name)[1:-1], entry=A))
    assert main(["sweep", str(spec), "--quiet"]) == 1
    one_line(capsys.readouterr().err, "sweep name", "folder name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]  # no runs/, no escaped/


def test_every_shipped_sweep_names_plain_folders():
    from zoo.running.sweep import expand, load_spec, path_component

    for spec_file in sorted((REPO / "sweeps").glob("*.toml")):
        spec = load_spec(spec_file)
        assert path_component(spec.name, "sweep name") == spec.name
        assert all(path_component(r.name, "sweep run") == r.name for r in expand(spec))


@pytest.mark.parametrize("command", ["build", "export"])
def test_out_into_a_folder_that_is_not_a_checkpoint_is_refused_even_with_force(command, tmp_path, capsys, fast_graphs):
    """Before: `zoo build ENTRY --out DIR` and `zoo export CKPT --out DIR` replaced DIR's README.md and
    eval_results.json (its notes.txt was carried over beside the checkpoint)."""
    mine = user_folder(tmp_path / "mine")
    before = snapshot(mine)
    if command == "build":
        args = ["build", A, "--out", str(mine), "--quiet"]
    else:
        zoo.build(A, tmp_path / "ckpt", progress=False)
        args = ["export", str(tmp_path / "ckpt"), "--out", str(mine)]
    for force in ([], ["--force"]):
        capsys.readouterr()
        assert main(args + force) == 1
        one_line(capsys.readouterr().err, str(mine), "not a zoo checkpoint")
        assert snapshot(mine) == before and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_force_replaces_only_a_zoo_config(tmp_path, capsys, fast_graphs):
    """A config.json that is not a zoo checkpoint's (not JSON, or someone else's JSON) is not replaced,
    --force or not; an empty folder, or one holding only a resumable training state, is written."""
    for text in ("{", '{"model_type": "bert", "hidden_size": 8}'):
        out = tmp_path / f"other-{len(text)}"
        out.mkdir()
        (out / "config.json").write_text(text)
        for force in ([], ["--force"]):
            assert main(["build", A, "--out", str(out), "--quiet", *force]) == 1
            one_line(capsys.readouterr().err, str(out))
        assert sorted(os.listdir(out)) == ["config.json"] and (out / "config.json").read_text() == text
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["build", A, "--out", str(empty), "--quiet"]) == 0 and zoo.load(empty).entry.name == A


# ---------------------------------------------------------------- 2. faults the next run cleans up
def _aside(folder: Path) -> Path:
    """`folder` renamed aside as a swap does, and left so: a kill between the swap's two renames."""
    aside = folder.with_name(f".{folder.name}.old-0123abcd")
    folder.rename(aside)
    return aside


def test_a_checkpoint_left_aside_by_a_killed_swap_is_restored_before_the_next_build_claims_it(tmp_path, capsys,
                                                                                              fast_graphs):
    """Before: the folder read as absent, so `zoo build A --out DIR` found nothing to refuse; the swap then
    restored B's checkpoint and replaced it with A's, without --force."""
    out = tmp_path / "out"
    zoo.build(B, out, progress=False)
    _aside(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["build", A, "--out", str(out), "--quiet"]) == 1
    one_line(capsys.readouterr().err, str(out), f"entry '{B}'")
    assert zoo.load(out).entry.name == B and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_checkpoint_left_aside_by_a_killed_swap_is_restored_by_a_plain_load(tmp_path, fast_graphs):
    """Before: `zoo.load(DIR)` said there is no such folder (zoo.storage.locate now puts it back first)."""
    out = tmp_path / "ckpt"
    zoo.build(A, out, progress=False)
    _aside(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert zoo.load(out).entry.name == A
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_checkpoint_left_aside_by_a_killed_swap_is_restored_by_export_and_sweep(tmp_path, capsys, fast_graphs):
    """Before: `zoo export DIR` said DIR does not exist; a sweep rebuilt its finished run."""
    out = tmp_path / "ckpt"
    zoo.build(A, out, progress=False)
    _aside(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["export", str(out)]) == 0
    assert zoo.load(out).entry.name == A and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]

    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP.format(name="aside", entry=A))
    sweep = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--out", str(sweep), "--quiet"]) == 0
    _aside(sweep / A)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["sweep", str(spec), "--out", str(sweep), "--quiet"]) == 0
    rows = json.loads((sweep / "results.json").read_text())
    assert [r["status"] for r in rows] == ["cached"] and not any(p.name.startswith(".") for p in sweep.iterdir())


def test_a_killed_split_write_leaves_nothing_the_next_load_keeps(tmp_path, monkeypatch):
    """Before: `.data.parquet.<pid>.tmp` of a killed writer stayed in the cache for good (each writer
    uses its own pid)."""
    from zoo.science.registry import get_task_spec
    from zoo.science.tasks.frozen import load_split

    monkeypatch.setenv("ICL_ZOO_CACHE", str(tmp_path))
    spec = get_task_spec("zucchet-icl")
    folder = tmp_path / "datasets" / "zucchet-icl" / "test"
    folder.mkdir(parents=True)
    stale = folder / ".data.parquet.999999.tmp"
    stale.write_bytes(b"\0" * (1 << 20))  # the killed writer's half-written parquet
    first = load_split("zucchet-icl", "test", spec=spec)  # builds the split
    assert sorted(os.listdir(folder)) == [".lock", "data.parquet"]
    stale.write_bytes(b"\0" * (1 << 20))  # killed again, while another process had the split cached
    again = load_split("zucchet-icl", "test", spec=spec)
    assert again.sha256 == first.sha256 and sorted(os.listdir(folder)) == [".lock", "data.parquet"]


SLOW_BUILD = """
import sys, time
from pathlib import Path
from export import onnx_export
go = Path(sys.argv[2])
def graphs(ckpt, folder):  # the first build is writing its staged folder: wait until told to go on
    (Path(folder) / "model.onnx").write_bytes(b"graph")
    while not go.exists():
        time.sleep(0.05)
    return [Path(folder) / "model.onnx"]
onnx_export.export_checkpoint_graphs = graphs
from zoo.cli import main
sys.exit(main(["build", "{entry}", "--out", sys.argv[1], "--quiet"]))
"""


def test_a_second_build_into_the_same_out_is_refused_and_the_first_finishes(tmp_path, capsys, fast_graphs):
    """Before: the second build's clean-up removed the first's staged folder (the first then failed with
    FileNotFoundError, its work lost) and the second's checkpoint was in --out."""
    out, go = tmp_path / "out", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", SLOW_BUILD.replace("{entry}", B), str(out), str(go)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not any(p.name.startswith(".out.staged-") for p in tmp_path.iterdir()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.1)
        code = main(["build", A, "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        go.touch()
        assert first.wait(timeout=240) == 0, first.communicate()
    finally:
        go.touch()
        first.kill() if first.poll() is None else None
    assert code == 1
    one_line(err, "another zoo build is writing", str(out), f"pid {first.pid}")
    assert zoo.load(out).entry.name == B and sorted(p.name for p in tmp_path.iterdir()) == ["go", "out"]


# ---------------------------------------------------------------- 3. the same caps everywhere
def _bomb(path: Path, n: int = 300_000, x=(11, 10), y=(11, 1)) -> Path:
    """A data.parquet of `n` all-zero tasks, Array2D-declared like the zoo's (compresses to a few KB)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def column(rows, shape):
        flat = pa.array(np.zeros(rows * shape[0] * shape[1], "float32"))
        inner = pa.ListArray.from_arrays(pa.array(np.arange(rows * shape[0] + 1, dtype="i4") * shape[1]), flat)
        return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype="i4") * shape[0]), inner)

    chunk = 10_000
    table = pa.table({"x": column(chunk, x), "y": column(chunk, y)})
    features = {k: {"shape": list(s), "dtype": "float32", "_type": "Array2D"} for k, s in (("x", x), ("y", y))}
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, table.schema, compression="zstd") as w:
        for start in range(0, n, chunk):
            w.write_table(table.slice(0, min(chunk, n - start)))
    return path


LOAD_RSS = """
import resource, sys
from zoo.science.registry import get_task_spec
from zoo.science.tasks.frozen import load_split
split = load_split("linreg-d10-c10", "test", spec=get_task_spec("linreg-d10-c10"))
print(split.sha256, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _load_peak_mib(cache: Path) -> tuple[str, float]:
    env = {**os.environ, "ICL_ZOO_CACHE": str(cache), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", LOAD_RSS], capture_output=True, text=True, env=env, check=True)
    sha, kib = out.stdout.split()
    return sha, int(kib) / 1024


def test_a_cached_split_is_decoded_within_the_hub_paths_caps(tmp_path):
    """Before: a ~6 KB data.parquet in the cache declaring 300 000 tasks was decoded whole (peak RSS
    ~350 MB above a normal load) just to find its hash wrong."""
    from zoo.science.registry import get_task_spec

    expected = get_task_spec("linreg-d10-c10").splits["test"].sha256
    sha, normal = _load_peak_mib(tmp_path / "good")  # generates the split (a cached one's read: test_frozen.py)
    assert sha == expected
    folder = tmp_path / "bad" / "datasets" / "linreg-d10-c10" / "test"
    bomb = _bomb(folder / "data.parquet")
    size = bomb.stat().st_size
    assert size < 200_000
    sha, bombed = _load_peak_mib(tmp_path / "bad")
    print(f"bomb {size} B; peak RSS: generating {normal:.0f} MiB, bomb in cache {bombed:.0f} MiB")
    assert sha == expected
    assert bombed < normal + 40, (bombed, normal)
    kept = sorted(p.name for p in folder.iterdir() if p.name.startswith("data.parquet.mismatch-"))
    assert len(kept) == 1 and (folder / kept[0]).stat().st_size == size  # set aside, never lost


def test_read_cached_split_refuses_a_footer_beyond_the_split(tmp_path):
    from zoo.science.registry import get_task_spec
    from zoo.science.tasks.frozen import DatasetShapeMismatch, read_cached_split

    spec = get_task_spec("linreg-d10-c10")
    cases = {"rows": _bomb(tmp_path / "rows.parquet", 20_000), "shape": _bomb(tmp_path / "shape.parquet", 10_000, x=(11, 11))}
    for why, path in cases.items():
        with pytest.raises(DatasetShapeMismatch) as e:
            read_cached_split(path, spec, "test")
        assert "\n" not in str(e.value) and str(path) in str(e.value), (why, e.value)


def _state(tmp_path: Path, value: float) -> Path:
    path = tmp_path / f"state-{value}.npz"
    h = np.zeros((1, 42), np.float32)
    h[0, 7] = value
    np.savez(path, **{"state_in.0.h": h})
    return path


def _tokens(tmp_path: Path, n: int) -> Path:
    path = tmp_path / f"tokens-{n}.npy"
    np.save(path, np.random.default_rng(0).uniform(-1, 1, (n, 6)).astype(np.float32))
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_state_in_is_refused_unless_nan_pass(value, tmp_path):
    """Before: the NaN went into the model and every output was NaN, exit 0."""
    tokens, state = _tokens(tmp_path, 10), _state(tmp_path, value)
    out = tmp_path / "out.npy"
    run = subprocess.run([*ZOO, "stream", str(RELEASED), "--input", str(tokens), "--output", str(out),
                          "--state-in", str(state), "--quiet"], capture_output=True, text=True, check=False)
    assert run.returncode == 1, run.stderr
    one_line(run.stderr, str(state), "state_in.0.h", "--nan pass")
    assert not out.exists()
    run = subprocess.run([*ZOO, "stream", str(RELEASED), "--input", str(tokens), "--output", str(out),
                          "--state-in", str(state), "--nan", "pass", "--quiet"], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert not np.isfinite(np.load(out)).all()


def test_read_state_refuses_non_finite_values_unless_passed(tmp_path):
    from export.token_io import TokenError, read_state

    state = _state(tmp_path, float("nan"))
    with pytest.raises(TokenError, match="non-finite"):
        read_state(str(state), {"state_in.0.h": (1, 42)})
    assert np.isnan(read_state(str(state), {"state_in.0.h": (1, 42)}, nan="pass")["state_in.0.h"]).any()


# ---------------------------------------------------------------- 4. a full disk, two servers
@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs (needs root and mount); skipped where it cannot be mounted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_npy_output_on_a_full_disk_is_one_line_naming_it(tiny_disk, tmp_path):
    """Before: SIGBUS (exit 135) when the memory map's pages found no space, and a .part file left."""
    tokens = _tokens(tmp_path, 20_000)  # 240 KB of outputs for a 64 KiB disk
    target = tiny_disk / "out.npy"
    run = subprocess.run([*ZOO, "stream", str(RELEASED), "--input", str(tokens), "--output", str(target), "--quiet"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 1, (run.returncode, run.stderr)
    one_line(run.stderr, str(target), "no space")
    assert os.listdir(tiny_disk) == []


def test_a_csv_output_on_a_full_disk_is_one_line_naming_it(tiny_disk, tmp_path):
    tokens = _tokens(tmp_path, 20_000)
    target = tiny_disk / "out.csv"
    run = subprocess.run([*ZOO, "stream", str(RELEASED), "--input", str(tokens), "--output", str(target), "--quiet"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 1, (run.returncode, run.stderr)
    one_line(run.stderr, str(target), "no space")
    assert os.listdir(tiny_disk) == []


def test_a_full_disk_is_found_before_the_npy_output_is_mapped(tmp_path, monkeypatch):
    """The same without a tmpfs: the preallocation fails as on a full disk."""
    from export import token_io

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(token_io.os, "posix_fallocate", full)
    target = tmp_path / "out.npy"
    with pytest.raises(token_io.TokenError) as e:
        token_io.OutputWriter(str(target), (1, 20_000, 3))
    assert str(target) in str(e.value) and "no space" in str(e.value) and "\n" not in str(e.value)
    assert os.listdir(tmp_path) == []


SERVE = """
import sys, time
from pathlib import Path
import zoo.cli.hub as cli_hub
from zoo.publishing.hub_prepare import prepare
release, go = Path(sys.argv[2]), Path(sys.argv[3])
cli_hub.prepare = lambda root: prepare(root, release, datasets=False, progress=False)
while not go.exists():
    time.sleep(0.01)
from zoo.cli import main
sys.exit(main(["hub", "serve", "--dir", sys.argv[1]]))
"""


def test_two_servers_on_one_fresh_hub_folder_both_serve(tmp_path):
    """Before: both prepared the same fresh folder at once; one died on a raw git message
    ("fatal: Unable to create '…/index.lock': File exists" or the like)."""
    import shutil

    from zoo.storage.locate import VERSION, read_index, release_dir

    release = tmp_path / "release"
    index = read_index()
    names = sorted(index["entries"])[:12]
    for name in names:
        shutil.copytree(release_dir() / name, release / name)
    (release / "index.json").write_text(json.dumps({"version": VERSION, "entries": {n: index["entries"][n] for n in names}}))
    hub_dir, go = tmp_path / "hub", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", SERVE, str(hub_dir), str(release), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        time.sleep(3)  # both imported and waiting
        go.touch()
        lines = [p.stdout.readline() for p in procs]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
    assert all(line.startswith("serving the local hub") for line in lines), (lines, results)
    assert all(code == 0 for code, _ in results), results
    waited = [err for _, err in results if err.strip()]
    assert len(waited) <= 1 and all(len(err.strip().splitlines()) == 1 and "waiting" in err for err in waited), results
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "hub", "release"]
