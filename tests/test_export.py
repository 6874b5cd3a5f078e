"""ONNX export and streaming: parity with PyTorch for every entry, constant memory, clear errors.
(Each recurrent code path's step graph over a 1,000-token stream: test_recurrence.py, which exports it once; one per
family, weight kind and variant in the everyday tier, the rest with -m deep and -m slow.)"""

import gc
import json

import numpy as np
import onnx
import pytest
import torch
from stream_parity import assert_parity, linearised, model_double, stream_tokens

from export.onnx_export import export_chunk, export_sequence, export_step
from export.streaming import (
    CHUNK_GRAPHS,
    PARALLEL_MAX_BATCH,
    PARALLEL_TOKENS,
    RUN_TOKENS,
    StreamError,
    StreamingSession,
)
from export.token_io import read_tokens
from zoo.science.constructions import construct
from zoo.science.models import create_model
from zoo.science.registry import get_task_spec, list_entries

ENTRIES = list_entries()


def _is_recurrent(entry) -> bool:
    return create_model(entry.arch, get_task_spec(entry.task).build()).recurrent


RECURRENT = [e for e in ENTRIES if _is_recurrent(e)]


def _graph_signature(entry) -> tuple:
    """Entries whose sequence graphs have the same operators: one of each is exported (the
    step graph of every recurrent entry is, in the streaming test). Layer count matters only
    where it changes the operators (LSA context attention, the GD-SSM's second head)."""
    a = entry.arch
    layered = a.type in ("lsa", "gd_ssm") and getattr(a, "n_layers", 1) > 1
    return (a.type, getattr(a, "variant", None), getattr(a, "attention", None), getattr(a, "loops", 1) > 1, layered)


def _one_per_family(entries):
    seen, out = set(), []
    for e in entries:
        if e.arch.type not in seen:
            seen.add(e.arch.type)
            out.append(e)
    return out


# The chunk test's entries (one per recurrent family) and the two the streaming tests below read: their step graphs
# are exported for those tests anyway.
CHUNK_ENTRIES = _one_per_family([e for e in RECURRENT if not linearised(e)])
STREAMED = ["gated-rnn-gd-zucchet-icl", "lsa-gd-zucchet-icl"]
EXPORTED_ANYWAY = [e.name for e in CHUNK_ENTRIES] + STREAMED  # the entries whose step graph the module exports


def _sequence_graphs() -> list:
    """One entry per graph signature. A recurrent model's sequence graph is its step graph scanned, so where an
    entry whose step graph the module exports anyway (CHUNK_ENTRIES, STREAMED) has the signature, it is that one:
    one step export (1–3 s) fewer per such signature. Otherwise the last entry of the signature."""
    picked = {}
    for e in ENTRIES:
        if linearised(e):
            continue
        rank = EXPORTED_ANYWAY.index(e.name) if e.name in EXPORTED_ANYWAY else len(EXPORTED_ANYWAY)
        if _graph_signature(e) not in picked or rank <= picked[_graph_signature(e)][0]:
            picked[_graph_signature(e)] = (rank, e)
    return [e for _, e in picked.values()]


SEQUENCE_GRAPHS = _sequence_graphs()


def _everyday_sequence_graphs() -> set[str]:
    """The everyday tier's share of SEQUENCE_GRAPHS: the first signature per arch type and weight kind (trained or
    constructed; the one whose step graph the module exports anyway where there is one). The other signatures
    (`_graph_signature`: the same family's LRU variants, attention modes, looping and depth) are marked `deep`:
    the second line of .ci/run. A recurrent model's sequence graph is its step graph scanned, and each of those
    step graphs' code paths streams in the everyday tier (test_recurrence.py)."""
    first = {}
    for e in sorted(SEQUENCE_GRAPHS, key=lambda e: e.name not in EXPORTED_ANYWAY):  # stable: else module order
        first.setdefault((e.arch.type, e.source.kind), e.name)
    return set(first.values())


EVERYDAY_SEQUENCE_GRAPHS = _everyday_sequence_graphs()
SEQUENCE_CASES = [pytest.param(e, id=e.name, marks=() if e.name in EVERYDAY_SEQUENCE_GRAPHS else pytest.mark.deep)
                  for e in SEQUENCE_GRAPHS]


def model_for(entry):
    """The entry's model: constructed weights, or the seeded random init of a trained entry."""
    task = get_task_spec(entry.task).build()
    torch.manual_seed(0)
    model = create_model(entry.arch, task)
    if entry.source.kind == "constructed":
        batch = task.sample(2000, seed=5, dtype=torch.float64)
        construct(entry, model, task, batch)
    return model.eval(), task


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`exported(entry, kind)`: the entry's "sequence", "step" or "chunk" graph of `model_for`'s weights,
    exported once for this module. An export takes 1–10 s, and several tests read the same graph."""
    folder, made = tmp_path_factory.mktemp("graphs"), {}

    def get(entry, kind: str):
        if (entry.name, kind) not in made:
            model, task = model_for(entry)
            path = folder / entry.name / f"{kind}.onnx"
            path.parent.mkdir(exist_ok=True)
            if kind == "sequence":  # a recurrent model's is its step graph scanned: the one exported here
                export_sequence(model, path, entry_name=entry.name, seq_len=task.n_tokens,
                                step_graph=get(entry, "step") if model.recurrent else None)
            elif kind == "step":
                export_step(model, path, entry_name=entry.name)
            else:  # a model without a parallel form scans its step graph: the one exported here
                export_chunk(model, path, entry_name=entry.name,
                             step_graph=None if model.has_parallel_form else get(entry, "step"))
            made[entry.name, kind] = path
        return made[entry.name, kind]

    return get


@pytest.mark.parametrize("entry", [e for e in RECURRENT if linearised(e)], ids=lambda e: e.name)
def test_linearised_constructions_stream_at_fp32_precision(entry, tmp_path):
    """Over the task's own sequences (13 tokens), the streamed fp32 graph is as close to the
    float64 model as the fp32 PyTorch model is."""
    model, task = model_for(entry)
    path = export_step(model, tmp_path / "model_step.onnx", entry_name=entry.name)
    b = task.sample(64, seed=4)
    session = StreamingSession(path)
    session.reset(64)
    got = session.push(b.tokens.numpy()).astype(np.float64)
    with torch.no_grad():
        ref = model_double(model)(b.tokens.double()).numpy()
        fp32 = model.float()(b.tokens).double().numpy()
    rel = lambda x: np.sqrt(((x - ref) ** 2).mean() / (ref**2).mean())
    assert rel(got) < 0.05 and rel(got) < 2 * rel(fp32), (rel(got), rel(fp32))  # measured 0.015 vs 0.022


@pytest.mark.parametrize("entry", SEQUENCE_CASES)
def test_onnx_sequence_graph_equals_pytorch(entry, exported):
    model, task = model_for(entry)
    path = exported(entry, "sequence")
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta().custom_metadata_map
    assert meta["icl_zoo.graph"] == "sequence" and json.loads(meta["icl_zoo.d_in"]) == task.token_dim
    tokens, ref = stream_tokens(model, task, task.n_tokens, batch=64)  # another batch size than the export's
    (got,) = sess.run(None, {"tokens": tokens.numpy()})
    assert_parity(got, ref)


@pytest.fixture(scope="module")
def session(exported):
    return StreamingSession(exported(next(e for e in RECURRENT if e.name == "lsa-gd-zucchet-icl"), "step"))


def test_step_graph_metadata_and_names(session):
    assert session.entry == "lsa-gd-zucchet-icl"
    assert [s["input"] for s in session.layout] == ["state_in.0.kv"]
    assert [s["output"] for s in session.layout] == ["state_out.0.kv"]
    names = [i.name for i in session.session.get_inputs()]
    assert names == ["token", "state_in.0.kv"]
    assert session.session.get_inputs()[0].shape[0] == "batch"


def test_bad_tokens_and_state_are_clear_errors(session):
    session.reset(2)
    with pytest.raises(StreamError, match="token width 5 does not match the model's d_in = 6"):
        session.push(np.zeros((2, 5), np.float32))
    with pytest.raises(StreamError, match=r"batch 3 does not match the session's 2; call reset\(batch=3\)"):
        session.push(np.zeros((3, 6), np.float32))
    with pytest.raises(StreamError, match=r"state 'state_in.0.kv' has shape \(2, 5, 5\), expected \(2, 6, 6\)"):
        session.set_state({"state_in.0.kv": np.zeros((2, 5, 5), np.float32)})
    with pytest.raises(StreamError, match="do not match the graph's"):
        session.set_state({"kv": np.zeros((2, 6, 6), np.float32)})


def test_state_carries_between_pushes(session):
    tokens = np.random.default_rng(0).uniform(-1, 1, (2, 40, 6)).astype(np.float32)
    session.reset(2)
    whole = session.push(tokens)
    session.reset(2)
    parts = np.concatenate([session.push(tokens[:, :13]), session.push(tokens[:, 13:])], axis=1)
    np.testing.assert_array_equal(whole, parts)


def test_memory_does_not_grow_with_the_stream(session):
    import psutil

    proc = psutil.Process()
    rng = np.random.default_rng(0)
    tokens = (rng.uniform(-1, 1, (1, 10_000, 6)) * 0.05).astype(np.float32)
    session.reset(1)
    rss = {}
    for block in range(10):  # 100 000 tokens, one step at a time
        session.push(tokens)
        if block in (0, 9):
            gc.collect()
            rss[(block + 1) * 10_000] = proc.memory_info().rss
    growth = rss[100_000] - rss[10_000]
    assert session.steps == 100_000
    assert growth < 2 * 2**20, f"RSS grew by {growth / 2**20:.2f} MiB between 10k and 100k tokens"


def test_read_tokens_formats(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "t.npy", arr)
    np.savetxt(tmp_path / "t.csv", arr, delimiter=",")
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in arr.tolist()))
    for name in ("t.npy", "t.csv", "t.jsonl"):
        np.testing.assert_array_equal(read_tokens(str(tmp_path / name)), arr[None])
    (tmp_path / "bad.jsonl").write_text("[1, 2]\nnot json\n")
    with pytest.raises(ValueError, match="bad.jsonl:2: expected comma-separated numbers or a JSON list"):
        read_tokens(str(tmp_path / "bad.jsonl"))


# one sequence graph of each of three scanned families the sequence test exports anyway
SCANNED = [next(e for e in SEQUENCE_GRAPHS if e.arch.type == t and e.name in EVERYDAY_SEQUENCE_GRAPHS)
           for t in ("gated_rnn", "lru", "gd_ssm")]


@pytest.mark.parametrize("entry", SCANNED, ids=lambda e: e.name)
def test_recurrent_sequence_graph_is_exact_past_any_scan_bound_in_batch_blocks(entry, exported):
    """A recurrent model's whole-sequence graph is its step graph scanned from the zero state, in batch blocks:
    under plain onnxruntime it equals torch past the old doubling bound (EXPORT_MAX_LEN), and at a batch of
    several blocks plus a padded one."""
    import onnxruntime as ort

    from zoo.science.models.scan import EXPORT_MAX_LEN

    model, _ = model_for(entry)
    session = ort.InferenceSession(str(exported(entry, "sequence")), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    assert meta["icl_zoo.time"] == "any"
    block = int(meta["icl_zoo.batch_block"])
    for batch, T in ((1, EXPORT_MAX_LEN + 1), (3 * block + 5, 7)):
        tokens = 0.3 * torch.randn(batch, T, model.d_in)
        (out,) = session.run(None, {"tokens": tokens.numpy()})
        with torch.no_grad():
            reference = model(tokens).numpy()
        assert out.shape == reference.shape
        assert np.abs(out - reference).max() <= 1e-4 * max(1.0, np.abs(reference).max())


# Families whose torch forward (the float64 reference) is quadratic or memory-heavy in T: 4,000 tokens
# by default (still ≫ the chunk), 10,000 with -m slow.
QUADRATIC_REFERENCE = {"lsa", "griffin", "mamba", "retention"}
# A family whose chunk graph is another family's code, in the second tier (marker `deep`): S5's block is the LRU's
# DiagonalComplexBlock (the same complex parallel scan and forward_chunk) with its own λ and drive (ZOH; its step
# graph, drive included, streams in the everyday tier), and its chunk graph's export (ten doublings of that scan)
# is one of the two longest here. test_the_families_in_the_second_tier_share_an_everyday_familys_chunk_code holds it.
SAME_CHUNK_CODE = {"s5": "lru"}
CHUNK_CASES = [
    pytest.param(e, 10_000 if e.arch.type not in QUADRATIC_REFERENCE else 4_000, id=e.arch.type,
                 marks=pytest.mark.deep if e.arch.type in SAME_CHUNK_CODE else ()) for e in CHUNK_ENTRIES
] + [
    pytest.param(e, 10_000, id=f"{e.arch.type}-10k", marks=pytest.mark.slow)
    for e in _one_per_family([e for e in RECURRENT if e.arch.type in QUADRATIC_REFERENCE])
]


def test_the_families_in_the_second_tier_share_an_everyday_familys_chunk_code():
    """SAME_CHUNK_CODE's reason, checked: the family left to `deep` runs its everyday partner's forward_chunk (the
    code its chunk graph traces), and that partner's 10,000-token case is in the everyday tier."""
    from zoo.science.models.lru import DiagonalComplexBlock, LRUBlock, S5Block

    assert S5Block.forward_chunk is LRUBlock.forward_chunk is DiagonalComplexBlock.forward_chunk
    everyday = {c.id for c in CHUNK_CASES if not c.marks}
    assert set(SAME_CHUNK_CODE.values()) <= everyday and not set(SAME_CHUNK_CODE) & everyday


@pytest.mark.parametrize("entry, length", CHUNK_CASES)
def test_chunked_stream_at_10k_tokens_equals_step_graph_and_torch(entry, length, exported):
    """push(B, T, d) runs a chunk graph (model_chunk.onnx: the parallel scan continued from the
    state, or the scanned step graph for LSTM/GRU; the step graph scanned in memory; the hoisted step
    graph) on pieces of at most its run length, carrying the state between pieces and calls: at
    T = 10,000 (≫ the chunk, pushed in uneven pieces) each of them equals the token-at-a-time step
    graph and the float64 torch forward."""
    model, task = model_for(entry)
    step, chunk = exported(entry, "step"), exported(entry, "chunk")
    tokens, ref = stream_tokens(model, task, length, batch=2)
    session = StreamingSession(step, chunk=chunk)
    session.reset(2)
    stepped = np.stack([session.push(tokens[:, t].numpy()) for t in range(length)], axis=1)
    tried = []
    for kind in CHUNK_GRAPHS:
        session = StreamingSession(step, chunk=chunk, graphs=(kind,))
        session.reset(2)
        if not session.candidates():
            continue  # a step graph the hoisted form does not split
        piece = min(p for k, p in session.candidates())
        session._choice[2] = (kind, piece)  # each run length is one the probe may pick
        if kind == "parallel":
            assert piece == min(model.chunk_len if model.has_parallel_form else RUN_TOKENS, PARALLEL_TOKENS // 2)
        cuts = sorted({min(c, length) for c in (0, 1, piece + 5, piece + 6, 3 * piece + 7, length)})  # uneven pieces
        chunked = np.concatenate([session.push(tokens[:, a:b].numpy()) for a, b in zip(cuts, cuts[1:])], axis=1)
        np.testing.assert_allclose(chunked, stepped, rtol=0, atol=1e-5 * max(1.0, np.abs(stepped).max()), err_msg=kind)
        assert_parity(chunked, ref)
        tried.append(kind)
    assert {"parallel", "scan"} <= set(tried)


def test_many_streams_take_the_graph_measured_fastest(exported):
    """At 9 streams the session probes each chunk graph (parallel, scanned, hoisted) once and runs
    the fastest: the same outputs as the float64 reference whichever it is."""
    entry = next(e for e in RECURRENT if e.name == "gated-rnn-gd-zucchet-icl")  # its chunk graph: the plain-ORT test's
    model, task = model_for(entry)
    batch = PARALLEL_MAX_BATCH + 1
    tokens, ref = stream_tokens(model, task, 3000, batch=batch)
    session = StreamingSession(exported(entry, "step"), chunk=exported(entry, "chunk"))
    session.reset(batch)
    assert_parity(session.push(tokens.numpy()), ref)
    assert set(session.probes[batch]) == set(session.candidates())
    assert {k for k, _ in session.candidates()} == set(CHUNK_GRAPHS)
    assert session._choose() == max(session.probes[batch], key=session.probes[batch].get)


@pytest.mark.parametrize("name", ["gated-rnn-gd-zucchet-icl", "lsa-gd-zucchet-icl"])
def test_chunk_graph_under_plain_onnxruntime(name, exported):
    """The chunk graph as a user without the zoo runs it: state in, state out, any chunk sizes up
    to its bound give the outputs of one stream; a longer chunk raises instead of scanning part."""
    import onnxruntime as ort

    from zoo.science.registry import get_entry

    model, task = model_for(get_entry(name))
    path = exported(get_entry(name), "chunk")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    assert meta["icl_zoo.graph"] == "chunk" and meta["icl_zoo.time"] == f"1..{model.chunk_len}"
    assert "Chunk graph" in onnx.load(str(path)).doc_string
    tokens, ref = stream_tokens(model, task, 2 * model.chunk_len + 1, batch=2)
    state = {s.name: np.zeros([2, *s.shape[1:]], np.float32) for s in session.get_inputs()[1:]}
    outs, start = [], 0
    for stop in (1, model.chunk_len, model.chunk_len + 1, 2 * model.chunk_len + 1):  # 1, N − 1, 1, N tokens
        out, *new = session.run(None, {"tokens": tokens[:, start:stop].numpy(), **state})
        state = {k: v for k, v in zip(state, new)}
        outs.append(out)
        start = stop
    assert_parity(np.concatenate(outs, axis=1), ref)
    too_long = np.zeros((2, model.chunk_len + 1, model.d_in), np.float32)
    with pytest.raises(Exception, match="out of data bounds"):
        session.run(None, {"tokens": too_long, **state})


# ---------------------------------------------------------------- layering: streaming needs no torch
STREAM_WITHOUT_TORCH = """
import sys
import numpy as np
from export.streaming import StreamingSession
for where in sys.argv[1:]:  # a checkpoint folder, then a bare released entry name
    session = StreamingSession(where)
    session.reset(2)
    assert session.push(np.zeros((2, 3, session.d_in), np.float32)).shape == (2, 3, session.d_out)
loaded = sorted(m for m in ("torch", "safetensors.torch", "pydantic", "zoo.storage.checkpoint", "zoo.publishing.release", "zoo.science.registry",
                            "zoo.publishing.hub", "export.onnx_export") if m in sys.modules)
print("loaded:", loaded)
"""


def test_streaming_a_checkpoint_imports_no_torch(tmp_path):
    """The streaming runtime resolves (zoo.storage.locate) and hash-checks (zoo.storage.manifest) a checkpoint folder or
    a bare released name without the checkpoint layer, the registry or torch."""
    import shutil
    import subprocess
    import sys

    from zoo.storage.locate import release_dir

    name = "gated-rnn-zucchet-icl"
    shutil.copytree(release_dir() / name, tmp_path / "ckpt")
    env = {k: v for k, v in __import__("os").environ.items() if k != "HF_ENDPOINT"}
    out = subprocess.run([sys.executable, "-c", STREAM_WITHOUT_TORCH, str(tmp_path / "ckpt"), name],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "loaded: []", out.stdout


def test_streaming_refuses_a_tampered_graph_without_torch(tmp_path):
    import shutil

    from zoo.storage.locate import release_dir
    from zoo.storage.manifest import CheckpointError

    shutil.copytree(release_dir() / "gated-rnn-zucchet-icl", tmp_path / "ckpt")
    with open(tmp_path / "ckpt" / "model_chunk.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(CheckpointError, match="model_chunk.onnx has SHA-256"):
        StreamingSession(tmp_path / "ckpt")


def test_the_exporters_table_built_once_gives_the_same_graph_byte_for_byte(exported, tmp_path, monkeypatch):
    """export/onnx_export.py builds torch.onnx's ATen → ONNX table once per process (CACHE_TORCHLIB_TABLE): the graph
    is the one an export that builds its own table writes, byte for byte, and the table is torch's again after."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    import export.onnx_export as onnx_export

    entry = next(e for e in RECURRENT if e.name == STREAMED[0])
    cached = exported(entry, "step").read_bytes()
    assert onnx_export._torchlib_tables  # built on the module's exports, kept
    assert ONNXRegistry.__dict__["from_torchlib"].__func__.__module__ != onnx_export.__name__  # restored after each
    monkeypatch.setattr(onnx_export, "CACHE_TORCHLIB_TABLE", False)
    model, _ = model_for(entry)
    assert export_step(model, tmp_path / "own.onnx", entry_name=entry.name).read_bytes() == cached


@pytest.mark.parametrize("n_context", [10, 3], ids=["gdssm-nd", "7-tokens"])
def test_a_position_table_bounds_the_sequence_graphs_time_axis(n_context, tmp_path):
    """An LSA with one-hot positions (sweeps/figure-6-positions.toml) exports a sequence graph whose metadata says
    T in 2..P and whose contract promises no step graph, equals torch at the prompt's length and a shorter one, and
    refuses a longer prompt in ONNX Runtime as torch does. P = 7 (fewer rows than the export's check length 13)
    exports too; lsa-2l-gdssm-nd's own P = 21 above it."""
    import onnxruntime as ort

    from zoo.science.models import NotRecurrentError
    from zoo.science.tasks.regression import LinearRegressionTask

    entry = next(e for e in ENTRIES if e.name == "lsa-2l-gdssm-nd")
    task = get_task_spec(entry.task).build() if n_context == 10 else LinearRegressionTask(
        d_x=3, d_y=2, n_context=n_context, layout="interleaved")
    torch.manual_seed(0)
    model = create_model(entry.arch.model_copy(update={"positions": task.n_tokens, "init_std": 0.3}), task).eval()
    path = export_sequence(model, tmp_path / "sequence.onnx", entry_name=entry.name, seq_len=task.n_tokens)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta()
    assert meta.custom_metadata_map["icl_zoo.time"] == f"2..{task.n_tokens}"
    assert "no step graph" in meta.description and "model_step.onnx" not in meta.description
    for T in (task.n_tokens, task.n_tokens - 2):
        tokens, ref = stream_tokens(model, task, T, batch=64)
        (got,) = sess.run(None, {"tokens": tokens.numpy()})
        assert_parity(got, ref)
    longer = np.zeros((2, task.n_tokens + 1, task.token_dim), dtype=np.float32)
    with pytest.raises(Exception, match="invalid expand shape"):  # the one-hot block cannot cover T + 1 rows
        sess.run(None, {"tokens": longer})
    with pytest.raises(ValueError, match="longer than the model's"):
        model(torch.from_numpy(longer))
    with pytest.raises(NotRecurrentError):
        export_step(model, tmp_path / "step.onnx", entry_name=entry.name)
