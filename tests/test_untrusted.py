"""Untrusted input: every class of bad file, name or stream ends in a clear error with nothing
written or lost. One test per defect class; the table below is the index of the cases.

| class | case | how it ends |
|---|---|---|
| names → paths | config.json `entry.task = "../../../../tmp/x"` | CheckpointError, nothing written outside the cache |
| names → paths | `--set task.description=x/../../y`, 6 hostile task names | RegistryError / ValueError "not a safe name" |
| names → paths | repo id with a trailing newline | HubError |
| checkpoint files | edited model_step.onnx streamed from a folder | CheckpointError before a session runs |
| checkpoint files | edited construction.eta in config.json | CheckpointError "edited after the weights were saved" |
| checkpoint files | `files` entry `/dev/zero`, `../../etc/passwd`, a symlink out | CheckpointError, nothing hashed or read |
| checkpoint files | an ONNX graph not listed in config.json | CheckpointError |
| publishing | a symlink to /etc/passwd in the folder | HubError, the hub repo unchanged |
| publishing | a hand-written README.md | kept, the source folder untouched |
| resuming builds | other seed / other step count / other entry into the same folder | ValueError "another run" |
| resuming builds | a corrupt training state | ValueError "cannot be restored" |
| training | weights NaN/inf after the last step | TrainingDiverged |
| training | a finite but absurd test loss | warning |
| registry numbers | lr = inf, betas = [2, -1], final_lr > lr, warmup > steps, hidden = true | RegistryError naming the field |
| determinism | the same entry built in two processes | byte-identical files |
| streams | JSON object line, NaN token, wrong width, closed stdin, `| head` | one-line error / clean exit |
| streams | line-by-line: the answer to a line comes before the next line is sent | (works) |
| server | `zoo hub serve` on a busy port; SIGTERM | exit 1 with the port named; the hub server and its temp folder gone |

(Frozen-split cases — tampered caches, task variants, concurrent repair, rebuilds — are in
test_frozen.py; released-folder tampering and hostile archives in test_release.py.)
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo.publishing import hub
from zoo.running.train import TrainingDiverged
from zoo.science.registry import RegistryError, get_entry, with_overrides
from zoo.storage import locate
from zoo.storage.checkpoint import CheckpointError, config_core_sha256, save_weights, sha256_file

ZOO = [sys.executable, "-m", "zoo.cli"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A constructed recurrent checkpoint (fast to build)."""
    folder = tmp_path_factory.mktemp("untrusted") / "ckpt"
    zoo.build("lsa-gd-zucchet-icl", folder, progress=False)
    return folder


def _copy(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(folder, dst)
    return dst


def _resign(folder: Path, config: dict) -> None:
    """Make an edited config self-consistent, as a careful attacker would: re-save the weights
    with its hash and record the new weights hash."""
    from safetensors.torch import load_file

    weights = folder / "model.safetensors"
    save_weights(load_file(str(weights)), weights, config_sha256=config_core_sha256(config))
    config["files"]["model.safetensors"]["sha256"] = sha256_file(weights)
    (folder / "config.json").write_text(json.dumps(config))


# ---------------------------------------------------------------- names that become paths
def test_downloaded_config_cannot_name_a_path(built, tmp_path):
    dst = _copy(built, tmp_path)
    config = json.loads((dst / "config.json").read_text())
    config["entry"]["task"] = "../../../../" + str(tmp_path / "escaped").lstrip("/")
    _resign(dst, config)
    with pytest.raises(CheckpointError, match="not a safe name"):
        zoo.load(dst)
    assert not (tmp_path / "escaped").exists()


def test_sweep_override_cannot_name_a_path():
    with pytest.raises(RegistryError, match="not a safe name"):
        with_overrides(get_entry("lsa-d10-c10"), {"task.description": "x/../../y"})


@pytest.mark.parametrize("repo", ["org/name\n", "org/name\r", " org/name", "org/../x", "org/name.git"])
def test_repo_ids_are_whole_names(repo):
    with pytest.raises(locate.HubError, match="invalid repo id"):
        locate.validate_repo_id(repo)


# ---------------------------------------------------------------- checkpoint files
def test_edited_step_graph_is_refused_before_streaming(built, tmp_path):
    from export.streaming import StreamingSession

    dst = _copy(built, tmp_path)
    graph = bytearray((dst / "model_step.onnx").read_bytes())
    graph[-10] ^= 1
    (dst / "model_step.onnx").write_bytes(bytes(graph))
    with pytest.raises(CheckpointError, match="model_step.onnx has SHA-256"):
        StreamingSession(dst)


def test_edited_config_is_refused(built, tmp_path):
    dst = _copy(built, tmp_path)
    config = json.loads((dst / "config.json").read_text())
    config["construction"]["eta"] = 1.0
    (dst / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="edited after the weights were saved"):
        zoo.load(dst)


@pytest.mark.parametrize("name", ["/dev/zero", "../../etc/passwd", "sub/model.onnx", "link-out"])
def test_file_entries_stay_inside_the_folder(built, tmp_path, name):
    dst = _copy(built, tmp_path)
    if name == "link-out":
        (dst / name).symlink_to("/etc/hostname")
    config = json.loads((dst / "config.json").read_text())
    config["files"][name] = {"sha256": "0" * 64, "bytes": 1}
    (dst / "config.json").write_text(json.dumps(config))
    started = time.monotonic()
    with pytest.raises(CheckpointError, match="plain file name|symbolic link"):
        zoo.load(dst)
    assert time.monotonic() - started < 5  # /dev/zero is never read


def test_unlisted_graph_is_refused(built, tmp_path):
    dst = _copy(built, tmp_path)
    config = json.loads((dst / "config.json").read_text())
    del config["files"]["model_step.onnx"]
    _resign(dst, config)
    with pytest.raises(CheckpointError, match="model_step.onnx is not listed"):
        zoo.load(dst)


# ---------------------------------------------------------------- publishing
def test_publish_refuses_symlinks_and_leaves_the_repo(built, tmp_path):
    dst = _copy(built, tmp_path)
    root = tmp_path / "hub"
    first = hub.publish_local(dst, "me/ckpt", root=root)
    (dst / "secret.txt").symlink_to("/etc/passwd")
    with pytest.raises(locate.HubError, match="symbolic link"):
        hub.publish_local(dst, "me/ckpt", root=root)
    repo = root / "models" / "me" / "ckpt"
    assert not (repo / "secret.txt").exists() and (repo / "model.safetensors").is_file()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert head == first


def test_publish_keeps_a_hand_written_readme(built, tmp_path):
    dst = _copy(built, tmp_path)
    (dst / "README.md").write_text("# my own notes\n")
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    out = subprocess.run([*ZOO, "publish", str(dst), "--repo", "me/ckpt", "--root", str(tmp_path / "hub")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "keeping the hand-written" in out.stdout
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before  # the source folder is untouched
    assert (tmp_path / "hub" / "models" / "me" / "ckpt" / "README.md").read_text() == "# my own notes\n"


# ---------------------------------------------------------------- resuming builds
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume") / "ckpt"  # its training state is what these tests read: no graphs
    zoo.build("lsa-d10-c10", folder, steps=20, seed=0, device="cpu", progress=False, graphs=False)
    return folder


@pytest.mark.parametrize("change", [{"seed": 7}, {"steps": 30}, {"name": "lsa-2l-d10-c10"}])
def test_build_refuses_another_runs_state(trained, tmp_path, change):
    dst = _copy(trained, tmp_path)
    kwargs = {"steps": 20, "seed": 0, "device": "cpu", "progress": False}
    name = change.pop("name", "lsa-d10-c10")
    with pytest.raises(ValueError, match="training state of another run|already holds"):
        zoo.build(name, dst, **{**kwargs, **change})
    assert (dst / ".train" / "train_state.safetensors").is_file()  # nothing lost


def test_corrupt_training_state_is_a_clear_error(trained, tmp_path):
    dst = _copy(trained, tmp_path)
    (dst / ".train" / "train_state.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="cannot be restored.*delete"):
        zoo.build("lsa-d10-c10", dst, steps=20, seed=0, device="cpu", progress=False)


def test_nan_weights_after_the_last_step_are_caught(tmp_path, monkeypatch):
    """The loss of the last step is finite (the NaN guard sees it), its update is not."""
    import zoo.running.train as train

    real = train.make_optimizer

    def poisoned(model, recipe, **kwargs):
        opt = real(model, recipe, **kwargs)

        def to_nan(optimizer, args, kw):
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float("nan"))

        opt.register_step_post_hook(to_nan)
        return opt

    monkeypatch.setattr(train, "make_optimizer", poisoned)
    with pytest.raises(TrainingDiverged, match="NaN/inf after the last step"):
        zoo.build("lsa-d10-c10", tmp_path / "x", steps=1, device="cpu", progress=False)
    assert not (tmp_path / "x" / "model.safetensors").exists()


def test_frozen_infinite_construction_parameters_are_not_divergence(tmp_path):
    """gd-ssm-sine-gd-mlp starts from the GD-SSM construction, whose frozen λ = 1 is ν = −inf."""
    ckpt = zoo.build("gd-ssm-sine-gd-mlp", tmp_path / "x", steps=20, device="cpu", progress=False, graphs=False)
    assert np.isfinite(ckpt.metrics["test_loss"])


def test_absurd_loss_warns():
    from zoo.running.builder import _warn_if_diverged

    with pytest.warns(UserWarning, match="probably diverged"):
        _warn_if_diverged(get_entry("lsa-d10-c10"), {"test_loss": 8.7e25, "gd_loss": 0.83})
    with pytest.raises(ValueError, match="refusing to save"):
        _warn_if_diverged(get_entry("lsa-d10-c10"), {"test_loss": float("nan"), "gd_loss": 0.83})


# ---------------------------------------------------------------- registry numbers
@pytest.mark.parametrize("override, field", [
    ({"source.lr": float("inf")}, "source.lr"), ({"source.betas": [2, -1]}, "betas"),
    ({"source.final_lr": 1.0}, "final_lr"), ({"source.warmup_steps": 10**9}, "warmup_steps"),
    ({"arch.n_layers": True}, "n_layers"),
])
def test_registry_refuses_nonsense_numbers(override, field):
    with pytest.raises(RegistryError, match=field):
        with_overrides(get_entry("lsa-d10-c10"), override)


# ---------------------------------------------------------------- determinism
def test_the_same_build_gives_the_same_bytes(tmp_path):
    """Two processes, hash seeds and dict orders differing: this one, which has run other tests before (and
    exports through conftest's shared exporter table), and a fresh interpreter."""
    zoo.build("gated-rnn-teacher-d4", tmp_path / "a", progress=False)
    code = "import sys, torch, zoo; torch.set_num_threads(int(sys.argv[2])); zoo.build('gated-rnn-teacher-d4', sys.argv[1], progress=False)"
    threads = str(torch.get_num_threads())  # as this process runs now (a release build before may have set it)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "b"), threads], check=True, capture_output=True)
    a = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir() if p.is_file()}
    b = {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir() if p.is_file()}
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), [k for k in a if a[k] != b.get(k)]


# ---------------------------------------------------------------- streams
@pytest.mark.parametrize("text, message", [
    ('{"a": 1}\n', "expected a JSON list of numbers"), ("[1, 2, 3, 0, 0, NaN]\n", "non-finite value"),
    ("[1, 2]\n", "has 2"), ("1,2,x,4,5,6\n", "expected comma-separated numbers"),
])
def test_stream_bad_lines_are_one_line_errors(built, text, message):
    out = subprocess.run([*ZOO, "stream", str(built), "--input", "-"], input="[0,0,0,0,0,0]\n" + text,
                         capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert message in out.stderr and "-:2:" in out.stderr
    assert len(out.stdout.splitlines()) == 1  # the good first line was answered


def test_stream_answers_each_line_as_it_arrives(built):
    proc = subprocess.Popen([*ZOO, "stream", str(built), "--input", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answers = []
        for token in ([1, 0, 0, 1, 0, 0], [0, 1, 0, 0, 1, 0], [0.5, 0.5, 0.5, 0, 0, 0]):
            proc.stdin.write(json.dumps(token) + "\n")
            proc.stdin.flush()
            answers.append(proc.stdout.readline())  # blocks until the answer to this line is written
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert [len(a.strip().split(",")) for a in answers] == [3, 3, 3]
    # one GD step from the two examples (e1, e1), (e2, e2) at η* = 1/14.8: ŷ = η* (0.5, 0.5, 0)
    assert np.allclose([float(v) for v in answers[2].split(",")], [0.5 / 14.8, 0.5 / 14.8, 0], atol=1e-6)


def test_stream_closed_stdin_and_closed_pipe_exit_cleanly(built, tmp_path):
    out = subprocess.run([*ZOO, "stream", str(built), "--input", "-", "--quiet"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == ""
    tokens = tmp_path / "t.npy"
    np.save(tokens, np.random.default_rng(0).normal(size=(50_000, 6)).astype(np.float32))
    out = subprocess.run(" ".join([*ZOO, "stream", str(built), "--input", str(tokens)]) + " | head -1",
                         shell=True, capture_output=True, text=True)
    assert out.returncode == 0 and "Error" not in out.stderr and len(out.stdout.splitlines()) == 1


def test_stream_state_resumes_across_processes(built, tmp_path):
    rng = np.random.default_rng(1)
    tokens = rng.normal(size=(40, 6)).astype(np.float32)
    np.save(tmp_path / "all.npy", tokens)
    np.save(tmp_path / "a.npy", tokens[:25])
    np.save(tmp_path / "b.npy", tokens[25:])
    run = lambda *args: subprocess.run([*ZOO, "stream", str(built), *args], check=True, capture_output=True)
    run("--input", str(tmp_path / "all.npy"), "--output", str(tmp_path / "all.out.npy"))
    run("--input", str(tmp_path / "a.npy"), "--output", str(tmp_path / "a.out.npy"), "--state-out", str(tmp_path / "s.npz"))
    run("--input", str(tmp_path / "b.npy"), "--output", str(tmp_path / "b.out.npy"), "--state-in", str(tmp_path / "s.npz"))
    joined = np.concatenate([np.load(tmp_path / "a.out.npy"), np.load(tmp_path / "b.out.npy")], axis=1)
    np.testing.assert_allclose(joined, np.load(tmp_path / "all.out.npy"), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- server
def test_serve_on_a_busy_port_fails_loudly(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([*ZOO, "hub", "serve", "--dir", str(tmp_path), "--port", str(port), "--no-release"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and f"port {port}" in out.stderr and "already in use" in out.stderr


def test_sigterm_takes_the_hub_server_and_its_temp_folder_down(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([*ZOO, "hub", "serve", "--dir", str(tmp_path / "hub"), "--no-release"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert "serving" in line, proc.stderr.read()
    port = int(line.rsplit(":", 1)[1])
    assert any((tmp_path / "tmp").iterdir())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    hub.check_port_free(port)  # free again for a server (closed connections may linger in TIME_WAIT)
    assert not any((tmp_path / "tmp").iterdir())


# ---------------------------------------------------------------- found by review
def test_metrics_file_must_be_listed_and_verified(built, tmp_path):
    """eval_results.json steers the GD reference of `zoo eval`: it is hashed like the weights."""
    dst = _copy(built, tmp_path)
    metrics = json.loads((dst / "eval_results.json").read_text())
    metrics["gd_eta"] = 10.0
    (dst / "eval_results.json").write_text(json.dumps(metrics))
    with pytest.raises(CheckpointError, match="eval_results.json has SHA-256"):
        zoo.load(dst)
    config = json.loads((dst / "config.json").read_text())
    del config["files"]["eval_results.json"]
    _resign(dst, config)
    with pytest.raises(CheckpointError, match="eval_results.json is not listed"):
        zoo.load(dst)


def test_stream_refuses_to_overwrite_its_input(built, tmp_path):
    tokens = tmp_path / "t.npy"
    np.save(tokens, np.ones((10, 6), np.float32))
    before = tokens.read_bytes()
    out = subprocess.run([*ZOO, "stream", str(built), "--input", str(tokens), "--output", str(tokens)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "is the input file" in out.stderr
    assert tokens.read_bytes() == before


@pytest.mark.parametrize("line", ["[" * 100_000, "9" * 5000 + ",1,1,1,1,1"])
def test_stream_absurd_lines_are_one_line_errors(built, line):
    out = subprocess.run([*ZOO, "stream", str(built), "--input", "-"], input=line + "\n", capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "-:1:" in out.stderr


def test_state_out_writes_exactly_the_named_file(built, tmp_path):
    tokens = tmp_path / "t.npy"
    np.save(tokens, np.ones((5, 6), np.float32))
    subprocess.run([*ZOO, "stream", str(built), "--input", str(tokens), "--output", str(tmp_path / "o.npy"),
                    "--state-out", str(tmp_path / "state")], check=True, capture_output=True)
    assert (tmp_path / "state").is_file() and not (tmp_path / "state.npz").exists()


def test_hub_dataset_without_any_hash_is_refused(built, tmp_path, capsys):
    """`zoo eval --dataset` scores a download only against a hash: the checkpoint's, else the registry's."""
    from zoo.cli import main

    dst = _copy(built, tmp_path)
    config = json.loads((dst / "config.json").read_text())
    config["provenance"]["dataset_hashes"] = {}
    config["entry"]["task"] = "zucchet-icl--n_context=7"  # a variant: the registry records no hash for it
    config["task"]["n_context"] = 7
    for split in config["task"]["splits"].values():
        split["sha256"] = None
    _resign(dst, config)
    code = main(["eval", str(dst), "--dataset", "someone/split", "--endpoint", "http://127.0.0.1:9"])
    assert code == 1 and "cannot be hash-checked; refusing to score it" in capsys.readouterr().err


def test_a_chunk_graph_is_used_only_when_its_checkpoint_lists_it(tmp_path):
    """A step graph file's sibling model_chunk.onnx runs only when the folder's config.json lists
    it with its hash; an unlisted or symlinked one is refused by the folder route and ignored by the
    file route (the scanned step graph runs instead), and another model's chunk graph is refused."""
    import shutil

    import numpy as np

    from export.streaming import StreamError, StreamingSession
    from zoo.storage.checkpoint import CheckpointError
    from zoo.storage.locate import release_dir

    folder = tmp_path / "fw"
    shutil.copytree(release_dir() / "fast-weight-triples", folder)
    other = release_dir() / "fast-weight-hebbian-fixed-triples" / "model_chunk.onnx"  # same state layout
    assert StreamingSession(folder / "model_step.onnx").chunk_path == folder / "model_chunk.onnx"  # listed, verified
    (folder / "model_chunk.onnx").unlink()
    (folder / "model_chunk.onnx").symlink_to(other)
    with pytest.raises(CheckpointError):
        StreamingSession(folder)
    session = StreamingSession(folder / "model_step.onnx")
    assert session.chunk_path is None  # the hostile sibling is not run
    tokens = np.random.default_rng(0).uniform(-1, 1, (1, 5, session.d_in)).astype(np.float32)
    session.reset(1)
    chunked = session.push(tokens)
    session.reset(1)
    stepped = np.stack([session.push(tokens[:, t]) for t in range(5)], axis=1)
    np.testing.assert_allclose(chunked, stepped, rtol=1e-5, atol=1e-6)
    vouched = StreamingSession(folder / "model_step.onnx", chunk=other)  # given explicitly: metadata still checked
    vouched.reset(1)
    with pytest.raises(StreamError, match="not the chunk graph"):
        vouched.push(tokens)


def test_eval_refuses_a_downloaded_validation_split(capsys):
    """`--dataset` downloads the test split only: asking it for the validation split is a clear error, not a silent test score."""
    from zoo.cli import main

    assert main(["eval", "lsa-gd-zucchet-icl", "--split", "validation", "--dataset", "someone/split"]) == 1
    assert "--dataset downloads the test split" in capsys.readouterr().err


@pytest.mark.parametrize("attack", ["deep-config", "huge-config", "deep-safetensors-header", "list-safetensors-header"])
def test_hostile_json_is_a_checkpoint_error(tmp_path, attack):
    """JSON nested deep enough to exhaust the parser's recursion, a config.json too large to read,
    and a safetensors header that is not an object are refused with CheckpointError, not a crash."""
    import struct

    from zoo.storage.manifest import MAX_JSON, CheckpointError, verify_files, weights_metadata

    folder = tmp_path / "ckpt"
    folder.mkdir()
    if attack == "deep-config":
        (folder / "config.json").write_text("[" * 200_000)
    elif attack == "huge-config":
        with open(folder / "config.json", "wb") as f:
            f.truncate(MAX_JSON + 1)  # sparse: the size is refused before a byte is read
    else:
        header = b"[" * 200_000 if attack == "deep-safetensors-header" else b"[1, 2]"
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
        with pytest.raises(CheckpointError, match="safetensors header"):
            weights_metadata(folder / "model.safetensors")
        return
    with pytest.raises(CheckpointError, match="config.json"):
        verify_files(folder)


def test_a_hostile_release_index_is_a_release_error(tmp_path):
    """A release index nested deep enough to exhaust the JSON parser is refused as an invalid index."""
    from zoo.storage.locate import ReleaseError, read_index

    (tmp_path / "index.json").write_text("[" * 200_000)
    with pytest.raises(ReleaseError, match="not a valid release index"):
        read_index(tmp_path)


def test_push_to_hub_cannot_write_the_local_hub():
    """push_to_hub uploads over HTTP (tests/test_conventions.py pushes to a Hub endpoint); the local hub takes no
    uploads, so a push to it says, in one line, what writes it instead."""
    import zoo

    ckpt = zoo.load("lsa-gd-zucchet-icl")
    with pytest.raises(locate.HubError, match=r"^the local hub takes no uploads.*`zoo publish FOLDER --repo me/x`"):
        ckpt.push_to_hub("me/x", endpoint="local")
