"""Writes that a kill or an error cannot leave half done: `zoo export` and `zoo build` stage a checkpoint
beside its folder and swap it in whole (zoo.storage.atomic), `zoo build` refuses to replace another run's
checkpoint without --force, and `zoo release build` survives a corrupt run.json record."""

import json
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import zoo
from export import onnx_export
from zoo.cli import main
from zoo.publishing import release
from zoo.storage import atomic

A = "lsa-gd-zucchet-icl"  # constructed: built in about a second
B = "gated-rnn-gd-zucchet-icl"  # another constructed entry on the same task
TRAINED = "lsa-1l-gdssm-1d"  # a trained entry small enough for a few steps in a test


def fake_graphs(ckpt, folder):
    """The ONNX writer's contract (a graph file, returned) without the seconds an export takes."""
    path = Path(folder) / onnx_export.SEQUENCE_FILE
    path.write_bytes(f"graph of {ckpt.entry.name}".encode())
    return [path]


@pytest.fixture(autouse=True)
def _fast_graphs(monkeypatch):
    monkeypatch.setattr(onnx_export, "export_checkpoint_graphs", fake_graphs)


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


class Killed(BaseException):
    """What a kill looks like from inside the process: nothing after it runs but `finally` blocks."""


def _raise(*_args, **_kwargs):
    raise Killed


# ---------------------------------------------------------------- 1. zoo export
def newer_graphs(ckpt, folder):
    """A newer exporter's graphs: other bytes than the ones config.json records."""
    path = Path(folder) / onnx_export.SEQUENCE_FILE
    path.write_bytes(f"graph of {ckpt.entry.name}, exported again".encode())
    return [path]


@pytest.mark.parametrize("where", ["graphs", "config"])
def test_an_export_killed_midway_leaves_the_old_checkpoint_loadable(where, tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    zoo.build(A, folder, progress=False)
    (folder / "notes.txt").write_text("mine")  # a file the zoo does not own
    before = snapshot(folder)
    if where == "graphs":  # killed after the weights and a new graph are written
        monkeypatch.setattr(onnx_export, "export_checkpoint_graphs", lambda *a: _raise(newer_graphs(*a)))
    else:  # after the weights, graphs and metrics: config.json, which records their hashes, is written last
        monkeypatch.setattr(onnx_export, "export_checkpoint_graphs", newer_graphs)
        monkeypatch.setattr("zoo.storage.checkpoint.write_config", _raise)
    with pytest.raises(Killed):
        main(["export", str(folder)])
    assert snapshot(folder) == before and leftovers(folder) == []
    assert zoo.load(folder).entry.name == A

    monkeypatch.undo()  # the writer works again: a second export goes through
    monkeypatch.setattr(onnx_export, "export_checkpoint_graphs", newer_graphs)
    assert main(["export", str(folder)]) == 0
    assert zoo.load(folder).entry.name == A and leftovers(folder) == []
    assert (folder / onnx_export.SEQUENCE_FILE).read_bytes().endswith(b"exported again")
    assert (folder / "notes.txt").read_text() == "mine"  # carried over into the new version


def test_an_export_killed_by_sigkill_is_undone_by_the_next_save(tmp_path):
    """A real kill (no `except`, no `finally`) in the middle of the export, in another process."""
    folder = tmp_path / "ckpt"
    zoo.build(A, folder, progress=False)
    before = snapshot(folder)
    script = textwrap.dedent(f"""
        import os, signal
        from export import onnx_export
        def graphs(ckpt, folder):  # a newer exporter's graph, then the kill
            (folder / "model.onnx").write_bytes(b"exported again")
            os.kill(os.getpid(), signal.SIGKILL)
        onnx_export.export_checkpoint_graphs = graphs
        from zoo.cli import main
        main(["export", {str(folder)!r}])
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == -9, run.stderr
    assert snapshot(folder) == before and zoo.load(folder).entry.name == A
    # the killed writer's lock file and staged folder, taken over and removed by the next save
    assert len(leftovers(folder)) == 2 and leftovers(folder)[0] == ".ckpt.lock"
    assert main(["export", str(folder)]) == 0 and leftovers(folder) == []


def test_the_card_names_the_folder_not_its_staging(tmp_path):
    """A variant's card loads it by its folder's name: the staged copy is written under that name too."""
    folder = tmp_path / "my-variant"
    zoo.build(A, folder, progress=False, overrides={"arch.init_std": 0.03})  # not the registry's definition
    card = (folder / "README.md").read_text()
    assert 'zoo.load("my-variant")' in card and "staged" not in card


def test_a_kill_between_the_two_renames_is_undone(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "f").write_text("old")
    aside = tmp_path / ".ckpt.old-0123abcd"  # renamed aside; the kill came before the staged one was renamed in
    folder.rename(aside)
    (tmp_path / ".ckpt.staged-89abcdef").mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Killed):
            atomic.replace_folder(folder, _raise)
    assert (folder / "f").read_text() == "old" and leftovers(folder) == []
    assert any("restored the previous version" in str(w.message) for w in caught)


def test_a_failed_swap_puts_the_old_folder_back(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "f").write_text("old")
    real_rename = atomic.os.rename

    def rename(src, dst):
        if ".ckpt.staged-" in str(src):
            raise OSError("disk full")
        real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename)
    with pytest.raises(OSError, match="disk full"):
        atomic.replace_folder(folder, lambda staged: (staged / "f").write_text("new"))
    assert (folder / "f").read_text() == "old" and leftovers(folder) == []


# ---------------------------------------------------------------- 2. zoo build --out
def test_build_refuses_another_entrys_checkpoint_unless_forced(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["build", A, "--out", str(out), "--quiet"]) == 0
    (out / "notes.txt").write_text("about A")
    before = snapshot(out)
    capsys.readouterr()

    assert main(["build", B, "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(out) in err and f"entry '{A}'" in err and "--force" in err
    assert snapshot(out) == before and zoo.load(out).entry.name == A

    assert main(["build", B, "--out", str(out), "--quiet", "--force"]) == 0
    assert zoo.load(out).entry.name == B and leftovers(out) == []
    fresh = tmp_path / "fresh"
    zoo.build(B, fresh, progress=False)
    assert sorted(snapshot(out)) == sorted(snapshot(fresh))  # nothing of A is left: its notes neither
    card = (out / "README.md").read_text()
    assert B in card and A not in card


def test_export_out_refuses_another_entrys_checkpoint_unless_forced(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    zoo.build(A, a, progress=False)
    zoo.build(B, b, progress=False)
    (b / "notes.txt").write_text("about B")
    before = snapshot(b)
    assert main(["export", str(a), "--out", str(b)]) == 1
    assert f"entry '{B}'" in capsys.readouterr().err and snapshot(b) == before
    assert main(["export", str(a), "--out", str(b), "--force"]) == 0
    assert zoo.load(b).entry.name == A and sorted(snapshot(b)) == sorted(snapshot(a))


def test_build_refuses_an_unreadable_config_and_rebuilds_its_own_entry(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{")  # someone's file: a zoo save never leaves a half-written config.json
    for force in (False, True):  # --force replaces only a zoo checkpoint (tests/test_hostile_paths.py)
        with pytest.raises(ValueError, match="not a zoo checkpoint's.*--force or not"):
            zoo.build(A, out, progress=False, force=force)
    assert (out / "config.json").read_text() == "{"
    (out / "config.json").unlink()  # its owner clears the folder
    zoo.build(A, out, progress=False)
    (out / "notes.txt").write_text("mine")
    zoo.build(A, out, progress=False)  # the same entry again: a rebuild, no --force needed
    assert zoo.load(out).entry.name == A and (out / "notes.txt").read_text() == "mine"


def test_a_trained_build_resumes_in_its_folder_and_refuses_another_seed(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr("zoo.running.builder.save_checkpoint", _raise)  # killed after training, before the save
    with pytest.raises(Killed):
        zoo.build(TRAINED, out, steps=4, device="cpu", progress=False)
    monkeypatch.undo()
    monkeypatch.setattr(onnx_export, "export_checkpoint_graphs", fake_graphs)
    first = zoo.build(TRAINED, out, steps=4, device="cpu", progress=False)  # resumes .train/: no --force
    assert first.history and first.provenance["steps"] == 4
    again = zoo.build(TRAINED, out, steps=4, device="cpu", progress=False)  # the same run, finished: resumed again
    assert again.provenance["steps"] == 4 and (out / ".train" / "run.json").is_file()
    before = snapshot(out)
    with pytest.raises(ValueError, match=f"another run of entry '{TRAINED}' \\(seed"):
        zoo.build(TRAINED, out, steps=4, device="cpu", progress=False, seed=first.provenance["seed"] + 1)
    assert snapshot(out) == before
    other = zoo.build(TRAINED, out, steps=4, device="cpu", progress=False, seed=first.provenance["seed"] + 1,
                      force=True)
    assert zoo.load(out).provenance["seed"] == other.provenance["seed"]
    record = json.loads((out / ".train" / "run.json").read_text())
    assert record["seed"] == other.provenance["seed"]  # the other seed's state was discarded, not resumed


# ---------------------------------------------------------------- 3. zoo release build: .work/<entry>/run.json
class Built(Exception):
    pass


@pytest.fixture
def release_build(tmp_path, monkeypatch):
    """build_entry up to its training call, which records what it was asked and stops."""
    calls = []

    def build(name, out, **kwargs):
        calls.append({"steps": kwargs.get("steps"), "left": sorted(p.name for p in Path(out).parent.iterdir())})
        raise Built

    monkeypatch.setattr("zoo.running.builder.build", build)

    def run():
        with pytest.raises(Built):
            release.build_entry(TRAINED, tmp_path, time_budget=None, device="cpu", threads=None, compiled=False)
        return calls[-1]

    return tmp_path / release.WORK / TRAINED, run


@pytest.mark.parametrize("marker", [b"", b"{\"steps\": 5", b"\xff\xfe", b"[]", b"{\"steps\": \"5\", \"fingerprint\": 1}",
                                    b"{\"steps\": true, \"fingerprint\": \"x\"}", b"{}"])
def test_a_corrupt_release_marker_is_discarded_with_a_warning(marker, release_build):
    work, run = release_build
    (work / "ckpt" / ".train").mkdir(parents=True)
    (work / "ckpt" / ".train" / "train_state.json").write_text("{}")
    (work / "run.json").write_bytes(marker)
    with pytest.warns(UserWarning, match=re.escape(f"{work / 'run.json'}: corrupt run record")):
        call = run()
    assert call["steps"] == zoo.get_entry(TRAINED).source.steps and call["left"] == ["run.json"]  # started afresh
    written = json.loads((work / "run.json").read_text())  # the one run-record schema (zoo.running.builder.claim_run_dir)
    assert written == {"entry": TRAINED, "definition": release.entry_fingerprint(TRAINED),
                       "seed": zoo.get_entry(TRAINED).source.seed, "steps": call["steps"]}


def test_a_valid_release_marker_still_resumes(release_build):
    work, run = release_build
    (work / "ckpt").mkdir(parents=True)
    (work / "run.json").write_text(json.dumps({"entry": TRAINED, "definition": release.entry_fingerprint(TRAINED),
                                               "seed": zoo.get_entry(TRAINED).source.seed, "steps": 7}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call = run()
    assert call["steps"] == 7 and call["left"] == ["ckpt", "run.json"]


def test_write_text_is_all_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    path.write_text("old")
    monkeypatch.setattr(atomic.os, "replace", _raise)
    with pytest.raises(Killed):
        atomic.write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["run.json"]
