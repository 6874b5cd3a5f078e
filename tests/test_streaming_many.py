"""Many streams: every chunk graph the session may choose (parallel model_chunk.onnx, the scanned step
graph, the hoisted step graph built in memory) equals the token-at-a-time step graph, with the state
carried across pushes of different lengths and across batch sizes; the session picks among them by
measurement; on CUDA long inputs take the chunk path.

Tolerance: float32 outputs of O(1) to atol 1e-5·max(1, max |out|), as the chunk tests in
test_export.py. The scanned graph and the hoisted graph's projections and read-out run the step's
own operators (equal to the bit); the hoisted graph's blocked linear update reassociates the sums of
a running recurrence (a^(t+1)·h + Σ a^(t−s)·u_s per block of 16), so it differs by float32 rounding
of the state (≈ 1e-7 relative, growing like √T): measured ≤ 3e-7 absolute at 3,000 tokens here."""

import itertools
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from export import choices
from export.scan_graph import hoisted_step_graph, scan_step_graph
from export.streaming import CHUNK_GRAPHS, StreamError, StreamingSession

RELEASE = Path(__file__).resolve().parents[1] / "release"
GATED = RELEASE / "gated-rnn-gd-zucchet-icl"
CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def _tol(ref):
    return 1e-5 * max(1.0, float(np.nanmax(np.abs(ref))))


def _stepped(session: StreamingSession, tokens: np.ndarray, state=None) -> tuple[np.ndarray, dict]:
    session.reset(tokens.shape[0])
    if state is not None:
        session.set_state(state)
    out = np.stack([session.push(np.ascontiguousarray(tokens[:, t])) for t in range(tokens.shape[1])], axis=1)
    return out, session.state


def _tokens(batch, length, d, seed, scale=0.3):
    return (np.random.default_rng(seed).uniform(-1, 1, (batch, length, d)) * scale).astype(np.float32)


@pytest.mark.parametrize("kind", CHUNK_GRAPHS)
def test_each_chunk_graph_equals_the_step_graph_across_pushes_and_batches(kind):
    """Pushes of 1, 2, 15, 16, 17, 700 and 1,300 tokens (across the runs' and the blocks' boundaries),
    at batches 1, 3 and 64 in one session, from a random state: the same outputs and final state as
    one token at a time."""
    session = StreamingSession(GATED, threads=1, graphs=(kind,))
    step = StreamingSession(GATED, threads=1)
    cuts = [0, 1, 3, 18, 34, 51, 751, 2051]
    for i, batch in enumerate((1, 3, 64, 3)):  # batch 3 again: its cached choice, a fresh state
        tokens = _tokens(batch, cuts[-1] if batch < 64 else 800, session.d_in, seed=i)
        h0 = {"state_in.0.h": np.random.default_rng(10 + i).normal(size=(batch, 42)).astype(np.float32)}
        ref, ref_state = _stepped(step, tokens, h0)
        session.reset(batch)
        session.set_state(h0)
        pieces = [session.push(tokens[:, a:b]) for a, b in itertools.pairwise(cuts) if a < tokens.shape[1]]
        got = np.concatenate(pieces, axis=1)
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=0, atol=_tol(ref))
        np.testing.assert_allclose(session.state["state_in.0.h"], ref_state["state_in.0.h"], rtol=0,
                                   atol=_tol(ref_state["state_in.0.h"]))
        assert session._choose()[0] == kind


def _released_step_graphs():
    return sorted(p for p in RELEASE.glob("*/model_step.onnx"))


@pytest.mark.parametrize("path", _released_step_graphs(), ids=lambda p: p.parent.name)
def test_hoisted_graph_of_every_released_step_graph_equals_it(path):
    """For every released recurrent entry: the hoisted graph (when the step graph splits) and the
    scanned step graph, run on 37 tokens (not a whole number of blocks) of 3 streams from a random
    state, give the step graph's outputs and state."""
    step = onnx.load(str(path))
    meta = {p.key: p.value for p in step.metadata_props}
    layout = json.loads(meta["icl_zoo.state_layout"])
    d_in = int(meta["icl_zoo.d_in"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    run = ort.InferenceSession(step.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    B, T = 3, 37
    tokens = (rng.uniform(-1, 1, (B, T, d_in)) * 0.3).astype(np.float32)
    h0 = {s["input"]: (rng.normal(size=(B, *s["shape"][1:])) * 0.1).astype(np.float32) for s in layout}
    state, outs = dict(h0), []
    for t in range(T):
        out, *new = run.run(None, {"token": tokens[:, t], **state})
        state = {s["input"]: v for s, v in zip(layout, new)}
        outs.append(out)
    ref = np.stack(outs, axis=1)
    graphs = {"scan": scan_step_graph(step), "hoisted": hoisted_step_graph(step)}
    for name, graph in graphs.items():
        if graph is None:
            continue
        session = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
        out, *final = session.run(None, {"tokens": tokens, **h0})
        np.testing.assert_allclose(out, ref, rtol=0, atol=_tol(ref), err_msg=name)
        for s, v in zip(layout, final):
            np.testing.assert_allclose(v, state[s["input"]], rtol=0, atol=_tol(state[s["input"]]), err_msg=name)


@pytest.mark.parametrize("groups, scans", [(None, 1), (0, 2)])
def test_the_gated_rnn_gets_the_blocked_linear_hoisted_graph(groups, scans):
    """Its decays are 1 and 0: within blocks one gemm (groups=None), or, with decay_groups=0, the
    step's update scanned over the block (the form for many distinct decays); both equal the step
    graph on 3 streams × 100 tokens from a random state."""
    step = onnx.load(str(GATED / "model_step.onnx"))
    graph = hoisted_step_graph(step, decay_groups=groups)
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count("Scan") == scans  # across blocks (and within them)
    assert "MatMul" in ops and "Slice" in ops  # the dense projection stays; one-nonzero columns are sliced
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    tokens = _tokens(3, 100, 6, seed=7)
    h0 = np.random.default_rng(8).normal(size=(3, 42)).astype(np.float32)
    ref, ref_state = _stepped(StreamingSession(GATED, threads=1), tokens, {"state_in.0.h": h0})
    out, final = session.run(None, {"tokens": tokens, "state_in.0.h": h0})
    np.testing.assert_allclose(out, ref, rtol=0, atol=_tol(ref))
    np.testing.assert_allclose(final, ref_state["state_in.0.h"], rtol=0, atol=_tol(final))


def test_non_finite_tokens_take_the_exact_scanned_step_graph():
    """The hoisted graph applies one-nonzero-per-column weights as slices, which would not spread a NaN
    the way the dense step graph does: a push with a NaN runs the scanned step graph instead."""
    session = StreamingSession(GATED, threads=1, graphs=("hoisted", "scan"))
    session._choice[2] = ("hoisted", 64)
    tokens = _tokens(2, 50, session.d_in, seed=3)
    tokens[1, 20, 2] = np.nan
    ref, _ = _stepped(StreamingSession(GATED, threads=1), tokens)
    session.reset(2)
    got = session.push(tokens)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got[~np.isnan(got)], ref[~np.isnan(ref)], rtol=0, atol=_tol(ref[~np.isnan(ref)]))


def test_the_session_picks_the_fastest_graph_per_batch_by_probe(monkeypatch):
    """_choose probes each candidate once per batch size (cached for the session) and takes the
    fastest; a single candidate is taken without a probe."""
    monkeypatch.setenv("ICL_ZOO_STREAMING_CHOICES", "0")  # every session measures (no choice kept across sessions)
    session = StreamingSession(GATED, threads=1)
    calls = []
    rates = {"parallel": 3.0, "scan": 1.0, "hoisted": 2.0}

    def fake_probe(kind, piece, warm=True):
        calls.append((session.batch, kind, piece))
        return rates[kind] * (1 + piece / 1e6)

    monkeypatch.setattr(session, "_probe", fake_probe)
    session.reset(4)
    assert session._choose()[0] == "parallel"
    session.push(_tokens(4, 5, session.d_in, seed=0))
    n = len(calls)
    assert n == 2 * len(session.candidates()) >= 6 and set(session.probes[4]) == set(session.candidates())
    rates.update(parallel=0.5)
    session.reset(64)
    assert session._choose()[0] == "hoisted"  # a new batch: probed afresh
    m = len(calls)
    assert m == n + 2 * len(session.candidates())
    session.reset(4)
    assert session._choose()[0] == "parallel" and len(calls) == m  # cached
    only = StreamingSession(GATED, threads=1, graphs=("scan",))
    monkeypatch.setattr(only, "_probe", lambda *a: pytest.fail("probed a single candidate"))
    only.reset(8)
    assert only._choose()[0] == "scan"
    with pytest.raises(StreamError, match="graphs must be"):
        StreamingSession(GATED, graphs=("fast",))


def test_a_choice_measured_once_is_kept_per_graph_and_machine(monkeypatch, tmp_path):
    """The first session at a batch probes and stores its choice (export/choices.py); the next session on the same
    graph reads it and probes nothing; its outputs are the same. Another batch, or other allowed graphs, probe."""
    monkeypatch.setenv("ICL_ZOO_CACHE", str(tmp_path))
    first = StreamingSession(GATED, threads=1)
    first.reset(3)
    x = _tokens(3, 40, first.d_in, seed=3)
    want = first.push(x)
    assert first.chosen_by[3].startswith("probe (") and (tmp_path / choices.FILE).is_file()
    second = StreamingSession(GATED, threads=1)
    monkeypatch.setattr(second, "_probe", lambda *a, **k: pytest.fail("probed a choice the cache holds"))
    second.reset(3)
    np.testing.assert_array_equal(second.push(x), want)
    assert second.chosen_by[3] == "cache" and second._choose() == first._choose()
    calls = []
    monkeypatch.setattr(second, "_probe", lambda *a, **k: calls.append(a) or 1.0)
    second.reset(5)
    second._choose()
    assert calls and second.chosen_by[5].startswith("probe (")


@pytest.mark.parametrize("content", ['{"k": ["fast", 64]}', "[1, 2]", "not json", '{"k": ["scan", -1]}', "x" * (2 << 20)])
def test_a_broken_or_hostile_choice_cache_is_ignored(monkeypatch, tmp_path, content):
    monkeypatch.setenv("ICL_ZOO_CACHE", str(tmp_path))
    (tmp_path / choices.FILE).write_text(content)
    session = StreamingSession(GATED, threads=1)
    session.reset(2)
    out = session.push(_tokens(2, 30, session.d_in, seed=4))
    assert out.shape == (2, 30, session.d_out) and session.chosen_by[2].startswith("probe (")
    assert isinstance(json.loads((tmp_path / choices.FILE).read_text()), dict)  # rewritten whole


def test_a_symlinked_choice_cache_is_not_read(monkeypatch, tmp_path):
    monkeypatch.setenv("ICL_ZOO_CACHE", str(tmp_path))
    elsewhere = tmp_path / "elsewhere.json"
    first = StreamingSession(GATED, threads=1)
    first.reset(2)
    first.push(_tokens(2, 30, first.d_in, seed=4))
    (tmp_path / choices.FILE).rename(elsewhere)
    (tmp_path / choices.FILE).symlink_to(elsewhere)
    second = StreamingSession(GATED, threads=1)
    second.reset(2)
    second.push(_tokens(2, 30, second.d_in, seed=4))
    assert second.chosen_by[2].startswith("probe (")


def test_an_empty_push_returns_no_outputs_and_keeps_the_state():
    session = StreamingSession(GATED, threads=1)
    session.reset(3)
    before = session.state["state_in.0.h"].copy()
    assert session.push(np.zeros((3, 0, session.d_in), np.float32)).shape == (3, 0, session.d_out)
    np.testing.assert_array_equal(session.state["state_in.0.h"], before)


def test_real_probe_records_a_rate_for_each_candidate(monkeypatch):
    monkeypatch.setenv("ICL_ZOO_STREAMING_CHOICES", "0")
    session = StreamingSession(GATED, threads=1)
    session.reset(2)
    session.push(_tokens(2, 3, session.d_in, seed=1))
    assert 2 not in session.probes  # a first push shorter than PROBE_MIN_T runs the step graph: no probe
    session.push(_tokens(2, 20, session.d_in, seed=1))
    assert set(session.probes[2]) == set(session.candidates())
    assert all(rate > 0 for rate in session.probes[2].values())
    assert session._choose() == max(session.probes[2], key=session.probes[2].get)


def test_on_a_gpu_long_inputs_take_the_chunk_path(monkeypatch):
    """The device branch without a device: with on_gpu set, T > 1 tokens go through _run_chunk (the
    IOBinding path on CUDA; here its CPU body) and never through the token-at-a-time step."""
    session = StreamingSession(GATED, threads=1)
    cpu_run = session._run_chunk
    runs = []

    def run_chunk(graph, tokens, state):
        runs.append(tokens.shape)
        session.on_gpu = False
        try:
            return cpu_run(graph, tokens, state)
        finally:
            session.on_gpu = True

    monkeypatch.setattr(session, "_run_chunk", run_chunk)
    monkeypatch.setattr(session, "_step_gpu", lambda token: pytest.fail("a long input ran token at a time"))
    session.reset(2)  # CPU state (on CUDA it would live on the device)
    session.on_gpu = True
    session._choice[2] = ("scan", 16)  # no probe (it would time the fake)
    tokens = _tokens(2, 40, session.d_in, seed=2)
    got = session.push(tokens)
    assert runs == [(2, 16, 6), (2, 16, 6), (2, 8, 6)]
    session.on_gpu = False
    ref, _ = _stepped(StreamingSession(GATED, threads=1), tokens)
    np.testing.assert_allclose(got, ref, rtol=0, atol=_tol(ref))


@pytest.mark.skipif(not CUDA, reason="needs onnxruntime-gpu and a CUDA device")
def test_cuda_chunk_path_with_iobinding_equals_the_cpu_step_graph():
    session = StreamingSession(GATED)
    assert session.on_gpu
    tokens = _tokens(64, 300, session.d_in, seed=4)
    session.reset(64)
    got = np.concatenate([session.push(tokens[:, :1]), session.push(tokens[:, 1:300])], axis=1)
    assert all(not isinstance(v, np.ndarray) for v in session._state.values())  # the state stayed on the device
    ref, _ = _stepped(StreamingSession(GATED, providers=["CPUExecutionProvider"], threads=1), tokens)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * max(1.0, np.abs(ref).max()))  # TF32/fused kernels on GPU


def test_a_hoisted_graph_that_disagrees_with_the_scanned_step_is_not_used(monkeypatch):
    """The hoisted graph is checked against the scanned step graph when it is opened (2 streams × 37
    tokens from a random state); one that differs (here: built from a step graph whose decays were
    halved) is dropped and the session streams with the others, exactly."""
    from onnx import numpy_helper

    from export import scan_graph

    real = scan_graph.hoisted_step_graph

    def wrong(step, **kw):
        step = onnx.ModelProto.FromString(step.SerializeToString())
        for init in step.graph.initializer:
            if init.name == "exp_1":
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 0.5, "exp_1"))
        return real(step, **kw)

    assert StreamingSession(GATED, threads=1, graphs=("hoisted",)).candidates()  # the real one is kept
    monkeypatch.setattr(scan_graph, "hoisted_step_graph", wrong)
    session = StreamingSession(GATED, threads=1)
    session.reset(2)
    assert [k for k, _ in session.candidates()] == ["parallel", "scan"]
    tokens = _tokens(2, 40, session.d_in, seed=5)
    ref, _ = _stepped(StreamingSession(GATED, threads=1), tokens)
    session.reset(2)
    np.testing.assert_allclose(session.push(tokens), ref, rtol=0, atol=_tol(ref))
