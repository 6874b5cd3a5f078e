"""`zoo stream` and StreamingSession against hostile inputs: each case reproduces an attack and checks
that it ends in a one-line error, in bounded memory, with no partial file written or existing file lost.

| class | case | how it ends |
|---|---|---|
| output files | a stream that fails mid-way, a bad input line, Ctrl-C, SIGTERM | no --output / --state-out file; an existing one untouched |
| text input | a 24 MB line | refused at line 1 after reading max_line_chars(d_in), RSS flat |
| --state-in | a 583 KB .npz declaring 600 MB; extra, missing, object, misshapen, lying zip sizes | refused from the headers, RSS flat |
| .npy input | a 2.4 GB (sparse) file, a header past the file's end, the wrong d_in | memory-mapped / one-line error |
| graph metadata | read-out not JSON / wrong types / past d_out; state shape [1, 10**12]; d_in missing | StreamError naming the file |
| ONNX Runtime | an unknown or custom-domain operator; a graph that fails when run | one-line error naming the file |
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from export.streaming import MAX_STATE_ELEMENTS, StreamError, StreamingSession
from export.token_io import (
    NPY_PUSH_TOKENS,
    NPY_PUSH_VALUES,
    TokenError,
    iter_array_chunks,
    iter_lines,
    max_line_chars,
    read_state,
)

ZOO = [sys.executable, "-m", "zoo.cli"]
RELEASED = Path(__file__).resolve().parents[1] / "release" / "gated-rnn-gd-zucchet-icl"  # d_in 6, state (batch, 42)
STATE = {"state_in.0.h": (1, 42)}


def zoo_stream(*args, **kw):
    return subprocess.run([*ZOO, "stream", str(RELEASED), *map(str, args)], capture_output=True, text=True, check=False, **kw)


def one_line_error(out, *needles):
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and out.stderr.startswith("error: ") and len(out.stderr.splitlines()) == 1, out.stderr
    for needle in needles:
        assert needle in out.stderr, out.stderr


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


def peak_rss_mib(*args) -> float:
    """Peak RSS of `zoo stream RELEASED *args`, run as the only child of a fresh process."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, *ZOO, "stream", str(RELEASED), *map(str, args)],
                         capture_output=True, text=True, check=True)
    return int(out.stdout) / 1024


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens.npy"
    np.save(path, np.random.default_rng(0).uniform(-1, 1, (2500, 6)).astype(np.float32))
    return path


# ---------------------------------------------------------------- output files
def test_a_stream_that_fails_midway_leaves_no_file_and_existing_ones_untouched(tmp_path, tokens):
    """The NaN at token 2,200 comes after two 1,000-token chunks were written: before, --output was a
    full-size .npy whose unwritten rows were zeros, indistinguishable from a result."""
    bad = np.load(tokens)
    bad[2200, 3] = np.nan
    np.save(tmp_path / "bad.npy", bad)
    out = zoo_stream("--input", tmp_path / "bad.npy", "--output", tmp_path / "new.npy", "--state-out", tmp_path / "new.npz")
    one_line_error(out, "non-finite value at token 2200")
    assert not (tmp_path / "new.npy").exists() and not (tmp_path / "new.npz").exists()
    (tmp_path / "old.npy").write_bytes(b"previous result")
    (tmp_path / "old.npz").write_bytes(b"previous state")
    out = zoo_stream("--input", tmp_path / "bad.npy", "--output", tmp_path / "old.npy", "--state-out", tmp_path / "old.npz")
    one_line_error(out, "non-finite")
    assert (tmp_path / "old.npy").read_bytes() == b"previous result"
    assert (tmp_path / "old.npz").read_bytes() == b"previous state"
    assert leftovers(tmp_path) == []


def test_a_bad_text_line_leaves_an_existing_csv_untouched(tmp_path):
    """Text input used to truncate --output before the first line was read."""
    (tmp_path / "in.csv").write_text("1,0,0,1,0,0\n0,1,0,0,1,0\n1,2,x\n")
    (tmp_path / "out.csv").write_text("previous result\n")
    one_line_error(zoo_stream("--input", tmp_path / "in.csv", "--output", tmp_path / "out.csv"), "in.csv:3:")
    assert (tmp_path / "out.csv").read_text() == "previous result\n"
    one_line_error(zoo_stream("--input", tmp_path / "missing.csv", "--output", tmp_path / "out.csv"), "missing.csv")
    assert (tmp_path / "out.csv").read_text() == "previous result\n" and leftovers(tmp_path) == []


def test_a_good_stream_replaces_the_outputs_whole(tmp_path, tokens):
    (tmp_path / "o.npy").write_bytes(b"old")
    (tmp_path / "o.csv").write_text("old\n")
    out = zoo_stream("--input", tokens, "--output", tmp_path / "o.npy", "--state-out", tmp_path / "s.npz")
    assert out.returncode == 0, out.stderr
    session = StreamingSession(RELEASED)
    session.reset(1)
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), session.predict(session.push(np.load(tokens)[None])), atol=1e-5)
    saved = read_state(str(tmp_path / "s.npz"), STATE)
    np.testing.assert_allclose(saved["state_in.0.h"], session.state["state_in.0.h"], atol=1e-5)
    (tmp_path / "in.csv").write_text("1,0,0,1,0,0\n0,1,0,0,1,0\n")
    assert zoo_stream("--input", tmp_path / "in.csv", "--output", tmp_path / "o.csv").returncode == 0
    assert len((tmp_path / "o.csv").read_text().splitlines()) == 2 and leftovers(tmp_path) == []
    # a target that is not a regular file is written as it is (nothing to rename there); a state needs a file
    out = zoo_stream("--input", tmp_path / "in.csv", "--output", "/dev/stdout")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 2, out.stderr
    one_line_error(zoo_stream("--input", tmp_path / "in.csv", "--state-out", "/dev/null"), "not a regular file")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_an_interrupted_stream_leaves_no_file_and_existing_ones_untouched(tmp_path, sig, code):
    (tmp_path / "out.csv").write_text("previous result\n")
    (tmp_path / "state.npz").write_bytes(b"previous state")
    proc = subprocess.Popen([*ZOO, "stream", str(RELEASED), "--input", "-", "--output", str(tmp_path / "out.csv"),
                             "--state-out", str(tmp_path / "state.npz")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal: a test before this one in the same worker (Ray's driver) may have
                            # left SIGINT ignored, which a child inherits, and then Ctrl-C would not reach it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        proc.stdin.write("[1, 0, 0, 1, 0, 0]\n" * 50)
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while len(leftovers(tmp_path)) < 2:  # the output and state files are open: the stream is running
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert (tmp_path / "out.csv").read_text() == "previous result\n"
    assert (tmp_path / "state.npz").read_bytes() == b"previous state"
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------- text input
def test_an_overlong_line_is_refused_without_being_read_whole():
    class Spy:  # a stream that counts what is read from it
        def __init__(self, text):
            self.text, self.pos = text, 0

        def readline(self, limit=-1):
            end = self.text.find("\n", self.pos) + 1 or len(self.text)
            end = min(end, self.pos + limit) if limit >= 0 else end
            line, self.pos = self.text[self.pos : end], end
            return line

    spy = Spy("1,2,3,4,5,6\n" + "1," * 12_000_000 + "1\n")
    with pytest.raises(TokenError, match=r"^x:2: line longer than 460 characters, the most a token of 6 numbers"):
        list(iter_lines(spy, "x", d_in=6))
    assert max_line_chars(6) == 460 and spy.pos <= 12 + 461
    # a line at the limit is a token like any other (its numbers are long but valid)
    line = ",".join(["-0." + "1" * 60] * 6)
    assert len(line) <= max_line_chars(6)
    assert [n for n, _ in iter_lines(Spy(line + "\n" + line), "x", d_in=6)] == [1, 2]


def test_a_24_mb_line_costs_no_memory(tmp_path, tokens):
    """Before: 713 MB of RSS to refuse a 24 MB line (the line, then its 12M floats, were read whole)."""
    (tmp_path / "line.csv").write_text("1," * 12_000_000 + "1\n")
    one_line_error(zoo_stream("--input", tmp_path / "line.csv"), "line.csv:1: line longer than 460 characters")
    normal = peak_rss_mib("--input", tokens)
    hostile = peak_rss_mib("--input", tmp_path / "line.csv")
    assert hostile < normal + 40, f"{hostile:.0f} MiB against {normal:.0f} MiB for a normal stream"


# ---------------------------------------------------------------- --state-in
def test_a_state_bomb_is_refused_from_its_headers(tmp_path, tokens):
    """Before: a 583 KB .npz of a (1, 150M) zero array cost 650 MB of RSS before its shape was checked."""
    np.savez_compressed(tmp_path / "bomb.npz", **{"state_in.0.h": np.zeros((1, 150_000_000), np.float32)})
    assert (tmp_path / "bomb.npz").stat().st_size < 600_000
    one_line_error(zoo_stream("--input", tokens, "--state-in", tmp_path / "bomb.npz"), "bomb.npz", "not a saved state")
    normal = peak_rss_mib("--input", tokens)
    hostile = peak_rss_mib("--input", tokens, "--state-in", tmp_path / "bomb.npz")
    assert hostile < normal + 40, f"{hostile:.0f} MiB against {normal:.0f} MiB for a normal stream"
    # small enough to pass the size check: refused from the member's declared size, then its .npy header
    np.savez_compressed(tmp_path / "small.npz", **{"state_in.0.h": np.zeros((1, 4_000_000), np.float32)})
    with pytest.raises(TokenError, match=r"small.npz: array 'state_in.0.h' declares 16000128 bytes uncompressed"):
        read_state(str(tmp_path / "small.npz"), STATE)
    np.savez(tmp_path / "shape.npz", **{"state_in.0.h": np.zeros((1, 43), np.float32)})
    with pytest.raises(TokenError, match=r"state 'state_in.0.h' has shape \(1, 43\), the graph's is \(1, 42\)"):
        read_state(str(tmp_path / "shape.npz"), STATE)


def _patch_declared_size(path: Path, size: int) -> None:
    """Rewrite the uncompressed size that the zip's central directory declares for its one member."""
    raw = bytearray(path.read_bytes())
    at = raw.rindex(b"PK\x01\x02")
    raw[at + 24 : at + 28] = struct.pack("<I", size)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("case, message", [
    ("extra", r"holds the arrays \[state_in.0.h, extra\]; the graph's state is exactly \[state_in.0.h\]"),
    ("missing", r"holds the arrays \[other\]"),
    ("object", r"array 'state_in.0.h' has dtype object; a state holds real numbers"),
    ("lying size", r"declares 4294967280 bytes uncompressed"),
    ("truncated", r"holds fewer bytes than its header's"),
    ("npy", r"not a readable .npz state"),
    ("fifo", r"not a regular file"),
])
def test_hostile_state_files_are_one_line_errors(tmp_path, case, message):
    path = tmp_path / "s.npz"
    good = np.zeros((1, 42), np.float32)
    if case == "extra":
        np.savez(path, **{"state_in.0.h": good, "extra": good})
    elif case == "missing":
        np.savez(path, other=good)
    elif case == "object":
        np.savez(path, **{"state_in.0.h": np.full((1, 42), None, dtype=object)})
    elif case == "lying size":
        np.savez(path, **{"state_in.0.h": good})
        _patch_declared_size(path, 0xFFFFFFF0)
    elif case == "truncated":
        with zipfile.ZipFile(path, "w") as z:  # a (1, 42) header over 10 values
            header = tmp_path / "h.npy"
            np.save(header, good)
            z.writestr("state_in.0.h.npy", header.read_bytes()[:-128])
    elif case == "npy":
        np.save(tmp_path / "s.npy", good)
        path = tmp_path / "s.npy"
    elif case == "fifo":
        os.mkfifo(path)
    with pytest.raises(TokenError, match=message) as e:
        read_state(str(path), STATE)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_saved_state_in_any_real_dtype_and_order_restores(tmp_path):
    value = np.asfortranarray(np.arange(42, dtype=np.float64).reshape(1, 42))
    np.savez(tmp_path / "s.npz", **{"state_in.0.h": value})
    np.testing.assert_array_equal(read_state(str(tmp_path / "s.npz"), STATE)["state_in.0.h"], value)


# ---------------------------------------------------------------- .npy input
def test_a_huge_npy_input_is_memory_mapped_not_loaded(tmp_path):
    import psutil

    path = tmp_path / "huge.npy"
    shape = (1, 100_000_000, 6)  # 2.4 GB, sparse on disk
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
        f.truncate(f.tell() + 4 * np.prod(shape))
    before = psutil.Process().memory_info().rss
    got, chunks = iter_array_chunks(str(path), d_in=6)
    first = next(chunks)
    assert got == shape and first.shape == (1, min(NPY_PUSH_TOKENS, NPY_PUSH_VALUES // 6), 6)
    assert psutil.Process().memory_info().rss - before < 64 * 2**20
    with pytest.raises(TokenError, match="tokens have 6 values, the model takes d_in = 5"):
        iter_array_chunks(str(path), d_in=5)
    with open(path, "r+b") as f:  # the header now promises more than the file holds
        f.truncate(4096)
    with pytest.raises(TokenError, match="huge.npy: not a readable .npy array"):
        iter_array_chunks(str(path), d_in=6)


# ---------------------------------------------------------------- graph metadata
def _edited_graph(tmp_path: Path, **meta) -> Path:
    model = onnx.load(str(RELEASED / "model_step.onnx"))
    props = {p.key: p.value for p in model.metadata_props}
    for key, value in meta.items():
        key = f"icl_zoo.{key}"
        if value is None:
            props.pop(key, None)
        else:
            props[key] = value if isinstance(value, str) else json.dumps(value)
    del model.metadata_props[:]
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
    path = tmp_path / "model_step.onnx"
    onnx.save(model, str(path))
    return path


LAYOUT = {"input": "state_in.0.h", "output": "state_out.0.h", "dtype": "float32"}


@pytest.mark.parametrize("meta, message", [
    ({"readout": "{start: 3"}, "metadata icl_zoo.readout is not JSON"),
    ({"readout": {"start": "3", "stop": 6, "sign": -1.0}}, "metadata icl_zoo.readout"),
    ({"readout": {"start": 3, "stop": 60, "sign": -1.0}}, "0 ≤ start < stop ≤ d_out = 6"),
    ({"readout": {"start": 4, "stop": 4, "sign": -1.0}}, "0 ≤ start < stop ≤ d_out = 6"),
    ({"readout": {"start": 3, "stop": 6, "sign": "-"}}, "metadata icl_zoo.readout"),
    ({"readout": {"start": 3, "stop": 6, "sign": True}}, "metadata icl_zoo.readout"),
    ({"readout": [3, 6]}, "metadata icl_zoo.readout"),
    ({"state_layout": [{**LAYOUT, "shape": ["batch", 10**12]}]}, f"more than {MAX_STATE_ELEMENTS} state values per stream"),
    ({"state_layout": [{**LAYOUT, "shape": ["batch", 2**13, 2**13, 2]}]}, "more than"),
    ({"state_layout": [{**LAYOUT, "shape": ["batch", -42]}]}, "state_layout entry"),
    ({"state_layout": [{**LAYOUT, "shape": ["batch", 4.2]}]}, "state_layout entry"),
    ({"state_layout": [{**LAYOUT, "shape": ["batch", 42], "dtype": "float64"}]}, "state_layout entry"),
    ({"state_layout": {"state_in.0.h": 42}}, "metadata icl_zoo.state_layout is not"),
    ({"state_layout": "[" * 100_000}, "metadata icl_zoo.state_layout is not JSON"),
    ({"state_layout": [{**LAYOUT, "input": "state_in.0.x", "shape": ["batch", 42]}]}, "are not the (token, state…)"),
    ({"d_in": None}, "metadata icl_zoo.d_in is missing"),
    ({"d_in": "six"}, "metadata icl_zoo.d_in = 'six'; expected an integer"),
    ({"d_out": "1e9"}, "metadata icl_zoo.d_out = '1e9'"),
    ({"d_out": "0"}, "metadata icl_zoo.d_out = '0'"),
    ({"d_in": "99999999999999999999"}, "metadata icl_zoo.d_in"),
])
def test_bad_graph_metadata_is_a_one_line_error(tmp_path, meta, message):
    path = _edited_graph(tmp_path, **meta)
    with pytest.raises(StreamError) as e:
        StreamingSession(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_huge_declared_state_is_a_one_line_error_in_the_cli(tmp_path, tokens):
    """Before: MemoryError (a traceback) from reset() allocating a (1, 10**12) state."""
    path = _edited_graph(tmp_path, state_layout=[{**LAYOUT, "shape": ["batch", 10**12]}])
    out = subprocess.run([*ZOO, "stream", str(path), "--input", str(tokens)], capture_output=True, text=True, check=False)
    one_line_error(out, str(path), "more than")


# ---------------------------------------------------------------- ONNX Runtime failures
def _tiny_graph(path: Path, node) -> Path:
    graph = helper.make_graph(
        [node, helper.make_node("Identity", ["state_in.0.h"], ["state_out.0.h"])], "tiny",
        [helper.make_tensor_value_info("token", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("state_in.0.h", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("state_out.0.h", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor("seven", TensorProto.INT64, [1], [7])])  # an index past the token's 2 values
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.evil", 1)])
    model.ir_version = 8
    for key, value in {"graph": "step", "d_in": "2", "d_out": "1", "readout": '{"start": 0, "stop": 1, "sign": 1}',
                       "state_layout": json.dumps([{**LAYOUT, "shape": ["batch", 3]}])}.items():
        model.metadata_props.add(key=f"icl_zoo.{key}", value=value)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("domain", ["com.evil", ""])
def test_an_unknown_operator_is_a_one_line_error(tmp_path, domain):
    """A custom-domain op is refused (before or by ONNX Runtime); an unknown standard op by ONNX Runtime."""
    path = _tiny_graph(tmp_path / "evil.onnx", helper.make_node("Evil", ["token"], ["out"], domain=domain))
    with pytest.raises(ValueError) as e:
        StreamingSession(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    if domain == "":
        assert isinstance(e.value, StreamError) and "ONNX Runtime cannot open it" in str(e.value)
    out = subprocess.run([*ZOO, "stream", str(path), "--input", "-"], input="1,2\n", capture_output=True, text=True, check=False)
    one_line_error(out, str(path))


def test_a_graph_that_fails_when_run_is_a_one_line_error(tmp_path):
    path = _tiny_graph(tmp_path / "model_step.onnx", helper.make_node("Gather", ["token", "seven"], ["out"], axis=1))
    session = StreamingSession(path)
    with pytest.raises(StreamError, match=r"ONNX Runtime failed running it \(in the push from token 0\)") as e:
        session.push(np.zeros((1, 2), np.float32))
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(StreamError, match="ONNX Runtime failed running it"):  # the scanned step graph, T > 1
        session.push(np.zeros((1, 5, 2), np.float32))
    out = subprocess.run([*ZOO, "stream", str(path), "--input", "-"], input="1,2\n", capture_output=True, text=True, check=False)
    one_line_error(out, str(path), "ONNX Runtime failed running it")

