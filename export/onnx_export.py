"""ONNX export of zoo models: step and chunk graphs for streaming, a sequence graph for batches.

Step graph  (token (B, d_in), state_in.<i>.<name> ...) -> (out (B, d_out), state_out.<i>.<name> ...)
Chunk graph (tokens (B, T, d_in), state_in.<i>.<name> ...) -> (out (B, T, d_out), state_out.<i>.<name> ...)
Sequence    (tokens (B, T, d_in)) -> (out (B, T, d_out)), memory bounded by a block of sequences

The chunk graph is the model's `forward_chunk`: the parallel form (scans of ⌈log₂ T⌉ doublings)
continued from a state, for T up to the model's `chunk_len` (longer inputs raise); a runtime
splits a long stream into chunks and carries the state between them. Families without a
parallel form (LSTM, GRU, the dense RNN) get the step graph wrapped in an ONNX `Scan` instead,
exact for any T.

The sequence graph (model.onnx, what most people run first) of a recurrent model is its step graph scanned
over time from the zero state, in blocks of sequences (export/sequence_graph.py): one step's (block, state)
alive at a time, whatever the batch and T. A model without a recurrent form (softmax attention) gets its
`forward` run block by block. Every graph first passes export/graph_rewrite.py's rewrites (forms ONNX
Runtime's kernels run fast, the same numbers), then the checks below.

fp32, opset 18, exported with the dynamo exporter (`dynamo=True`, explicit), batch (and T for
the sequence graph) the only dynamic axes; export traces with batch 2 so no axis is
specialised to 1. The state layout, entry and read-out go into the model's metadata_props, so
a runtime needs nothing but the .onnx file.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from export.graph_rewrite import rewrite
from export.scan_graph import scan_step_graph
from export.sequence_graph import BATCH_BLOCK, batch_blocked, block_for, recurrent_sequence_graph
from zoo.science.models.scan import EXPORT_MAX_LEN, export_length, length_guard
from zoo.storage.manifest import CHUNK_FILE, SEQUENCE_FILE, STEP_FILE

OPSET = 18
EXPORT_BATCH = 2


def state_io_names(model) -> tuple[list[str], list[str]]:
    names = model.state_names()
    return [f"state_in.{n}" for n in names], [f"state_out.{n}" for n in names]


class _StepGraph(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, token, *state):
        out, new_state = self.model.step(token, tuple(state))
        return (out, *new_state)


class _ChunkGraph(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, *state):
        tokens = tokens * length_guard(tokens)  # every chunk graph refuses T past its bound, scans or not
        out, new_state = self.model.forward_chunk(tokens, tuple(state))
        return (out, *new_state)


class _SequenceGraph(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model(tokens)


# torch.onnx.export (dynamo) rebuilds its table of ATen → ONNX functions from onnxscript's torchlib on every call:
# 0.7–1 s of CPU, up to half of a small model's export, and a build exports up to three graphs per entry. The table
# depends only on its arguments (the opset), so a process builds it once and each export gets its own copy (a custom
# translation table, which the zoo never passes, would change only that copy). The graphs are the same byte for
# byte (tests/test_export.py). False: every export builds its own, as torch does.
CACHE_TORCHLIB_TABLE = True
_torchlib_tables: dict = {}


@contextlib.contextmanager
def _torchlib_table_built_once():
    """Within the block, torch.onnx's ONNXRegistry.from_torchlib returns a copy of the table built on first use."""
    try:
        from torch.onnx._internal.exporter._registration import ONNXRegistry
    except ImportError:  # another torch's layout: every export builds its own table
        yield
        return
    original = ONNXRegistry.__dict__["from_torchlib"]
    build = original.__func__

    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in _torchlib_tables:
            _torchlib_tables[key] = build(cls, *args, **kwargs)
        table = _torchlib_tables[key]
        registry = copy.copy(table)
        registry.functions = {target: list(decomps) for target, decomps in table.functions.items()}
        return registry

    ONNXRegistry.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        ONNXRegistry.from_torchlib = original


def _export(module, args, path: Path, input_names, output_names, dynamic_shapes) -> None:
    """torch.onnx.export of `module`, then `rewrite` (export/graph_rewrite.py) in place."""
    # The exporter reports progress on stdout and warns about unrelated registries; keep both
    # out of the user's terminal. Real failures still raise.
    onnx_logger = logging.getLogger("torch.onnx")
    level = onnx_logger.level
    onnx_logger.setLevel(logging.ERROR)
    table = _torchlib_table_built_once() if CACHE_TORCHLIB_TABLE else contextlib.nullcontext()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), table:
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module, args, str(path), dynamo=True, opset_version=OPSET, input_names=input_names,
                output_names=output_names, dynamic_shapes=dynamic_shapes, verbose=False, external_data=False,
            )
    finally:
        onnx_logger.setLevel(level)
    onnx.save(rewrite(onnx.load(str(path))), str(path))


CONTRACT_VERSION = "1"


def contract(props: dict) -> str:
    """The graph's contract in words, stored as the model's doc_string (shown by Netron and onnx tools)."""
    r = props["readout"]
    where = {None: "every token", -1: "the last token"}.get(r["position"], f"token {r['position']}")
    pick = f"{'−' if r['sign'] < 0 else ''}out[..., {r['start']}:{r['stop']}] of {where}"
    head = f"icl-zoo graph contract v{CONTRACT_VERSION}: entry {props['entry']}, float32. Prediction (task read-out): {pick}."
    if "tokens" in props:  # how a dataset row becomes the input (the task's token_layout)
        t = props["tokens"]
        head += (f" Tokens from a dataset row x {tuple(t['row']['x'])}, y {tuple(t['row']['y'])} ({t['layout']} layout, "
                 f"{tuple(t['tokens'])} per row): {t['rule']}. The prediction is compared with {t['target']}.")
    if props["graph"] in ("step", "chunk"):
        states = ", ".join(f"{s['input']} → {s['output']} {s['shape']}" for s in props["state_layout"])
        feed = "feed state_out back as state_in. The initial state is all zeros"
        if props["graph"] == "step":
            return (f"{head} Step graph: token (batch, {props['d_in']}) and state_in.* → out (batch, {props['d_out']}) "
                    f"and state_out.*; {feed}. States: {states}. Valid for any stream length.")
        time = props["time"]
        valid = ("any T ≥ 1 (the step graph scanned over time)" if time == "any" else
                 f"T in {time}; a longer chunk raises (Gather out of bounds) — split a longer stream into chunks")
        return (f"{head} Chunk graph: tokens (batch, T, {props['d_in']}) and state_in.* → out (batch, T, {props['d_out']}) "
                f"and state_out.* (the state after the chunk's last token); {feed}. States: {states}. Valid for {valid}; "
                "chunks of any sizes give the outputs of one token at a time.")
    time = props["time"]
    if time == "any":
        valid = ("Exact for any T ≥ 1: the step graph scanned over time from the zero state")
    elif isinstance(time, str):  # a model without a step graph (only recurrent ones have one, and scan it: "any")
        valid = (f"Exact for T in {time}; longer inputs are not checked (a position table refuses them), and the "
                 "model has no step graph to stream them")
    else:
        valid = f"T = {time} exactly (fixed by fused kernels); other lengths are refused by shape checks"
    block = props.get("batch_block")
    if block:
        valid += (f". Runs {block} sequences at a time whatever the batch (memory bounded by the block, not by the "
                  "batch): a whole split fits in one call")
    return f"{head} Sequence graph: tokens (batch, T, {props['d_in']}) → out (batch, T, {props['d_out']}), causal. {valid}."


def _metadata(path: Path, props: dict) -> None:
    m = onnx.load(str(path))
    m.doc_string = contract(props)
    props = {**props, "contract_version": CONTRACT_VERSION}
    # A chunk graph scanned from a step graph arrives with the step graph's keys: this graph's replace them.
    kept = [p for p in m.metadata_props if not p.key.startswith("icl_zoo.")]
    del m.metadata_props[:]
    m.metadata_props.extend(kept)
    for key, value in props.items():
        entry = m.metadata_props.add()
        entry.key = f"icl_zoo.{key}"
        entry.value = value if isinstance(value, str) else json.dumps(value)
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(path))


def _common_metadata(model, entry_name: str, token_layout: dict | None) -> dict:
    r = model.readout
    return {
        "entry": entry_name,
        "d_in": model.d_in,
        "d_out": model.d_out,
        "readout": {"position": r.position, "start": r.start, "stop": r.stop, "sign": r.sign},
        **({"tokens": token_layout} if token_layout is not None else {}),  # the task's token_layout, when exported for one
    }


@torch.no_grad()
def export_step(model, path: Path, *, entry_name: str = "", token_layout: dict | None = None) -> Path:
    """Write the step graph of a recurrent model (fp32) with its state layout in the metadata."""
    model = _fp32_copy(model)
    state = model.init_state(EXPORT_BATCH)
    token = torch.zeros(EXPORT_BATCH, model.d_in)
    in_names, out_names = state_io_names(model)
    batch = torch.export.Dim("batch", min=1)
    dyn = ({0: batch}, tuple({0: batch} for _ in state))  # (token, *state): state arrives as one tuple
    _export(_StepGraph(model), (token, *state), path, ["token", *in_names], ["out", *out_names], dyn)
    _metadata(path, {**_common_metadata(model, entry_name, token_layout), "graph": "step", "state_layout": _state_layout(model, state)})
    check_graph(model, path)
    return path


def _state_layout(model, state) -> list[dict]:
    in_names, out_names = state_io_names(model)
    return [{"input": i, "output": o, "shape": ["batch", *x.shape[1:]], "dtype": "float32"}
            for i, o, x in zip(in_names, out_names, state)]


@torch.no_grad()
def export_chunk(model, path: Path, *, entry_name: str = "", step_graph: Path | None = None,
                 token_layout: dict | None = None) -> Path:
    """Write the chunk graph of a recurrent model (fp32): its `forward_chunk` traced for
    T ≤ `chunk_len` where it has a parallel form, else the step graph scanned over time (the
    model's `step_graph` file when one was just exported, else a fresh export)."""
    model = _fp32_copy(model)
    state = model.init_state(EXPORT_BATCH)
    if model.has_parallel_form:
        in_names, out_names = state_io_names(model)
        tokens = torch.zeros(EXPORT_BATCH, min(8, model.chunk_len), model.d_in)
        batch, time = torch.export.Dim("batch", min=1), torch.export.Dim("time", min=1, max=model.chunk_len)
        dyn = ({0: batch, 1: time}, tuple({0: batch} for _ in state))
        with export_length(model.chunk_len):
            _export(_ChunkGraph(model), (tokens, *state), path, ["tokens", *in_names], ["out", *out_names], dyn)
        valid = f"1..{model.chunk_len}"
    elif step_graph is not None:
        onnx.save(scan_step_graph(onnx.load(str(step_graph))), str(path))
        valid = "any"
    else:
        step = Path(path).with_suffix(".step.tmp")
        try:
            return export_chunk(model, path, entry_name=entry_name, token_layout=token_layout,
                                step_graph=export_step(model, step, entry_name=entry_name))
        finally:
            step.unlink(missing_ok=True)
    _metadata(path, {**_common_metadata(model, entry_name, token_layout), "graph": "chunk", "time": valid,
                     "state_layout": _state_layout(model, state)})
    check_graph(model, path)
    return path


@torch.no_grad()
def export_sequence(model, path: Path, *, entry_name: str = "", seq_len: int = 8, token_layout: dict | None = None,
                    step_graph: Path | None = None) -> Path:
    """Write the whole-sequence graph (B, T, d_in) -> (B, T, d_out), run in blocks of sequences (a recurrent
    model's `block_for` its state's size, else BATCH_BLOCK).
    A recurrent model's is its step graph (the `step_graph` file when one was just exported, else a fresh export)
    scanned over time from the zero state: any T. Otherwise `forward` traced with T symbolic up to
    EXPORT_MAX_LEN (or the model's `max_tokens`, a position table's rows), or fixed at `seq_len` where fused kernels fix it (`has_parallel_form = False`). The
    metadata's `time` records which, `batch_block` the block."""
    model = _fp32_copy(model)
    if model.recurrent and step_graph is None:
        step = Path(path).with_suffix(".step.tmp")
        try:
            return export_sequence(model, path, entry_name=entry_name, seq_len=seq_len, token_layout=token_layout,
                                   step_graph=export_step(model, step, entry_name=entry_name))
        finally:
            step.unlink(missing_ok=True)
    if model.recurrent:
        block = block_for(sum(x[0].numel() for x in model.init_state(1)))
        onnx.save(recurrent_sequence_graph(onnx.load(str(step_graph)), block), str(path))
        time = "any"
    else:
        tokens = torch.zeros(EXPORT_BATCH, seq_len, model.d_in)
        axes = {0: torch.export.Dim("batch", min=1)}
        longest = min(EXPORT_MAX_LEN, model.max_tokens or EXPORT_MAX_LEN)  # a position table ends the time axis
        if model.has_parallel_form:
            axes[1] = torch.export.Dim("time", min=2, max=longest)
        _export(_SequenceGraph(model), (tokens,), path, ["tokens"], ["out"], (axes,))
        block = BATCH_BLOCK
        onnx.save(batch_blocked(onnx.load(str(path)), block), str(path))
        time = f"2..{longest}" if model.has_parallel_form else seq_len
    _metadata(path, {**_common_metadata(model, entry_name, token_layout), "graph": "sequence", "time": time,
                     "batch_block": block})
    check_graph(model, path)
    return path


def _fp32_copy(model):
    import copy

    return copy.deepcopy(model).float().cpu().eval()


def export_checkpoint_graphs(ckpt, folder: Path) -> list[Path]:
    """Write the ONNX files of a checkpoint into `folder` and nothing else: model.onnx always; model_step.onnx
    and model_chunk.onnx when recurrent. The storage floor's save passes this writer in
    (`zoo.storage.save.save_checkpoint(ckpt, folder, graphs=export_checkpoint_graphs)`) and records the hashes."""
    folder = Path(folder)
    meta = {"entry_name": ckpt.entry.name, "token_layout": ckpt.task.token_layout}
    if not getattr(ckpt.model, "recurrent", False):
        return [export_sequence(ckpt.model, folder / SEQUENCE_FILE, seq_len=ckpt.task.n_tokens, **meta)]
    step = export_step(ckpt.model, folder / STEP_FILE, **meta)
    return [export_sequence(ckpt.model, folder / SEQUENCE_FILE, seq_len=ckpt.task.n_tokens, step_graph=step, **meta),
            step, export_chunk(ckpt.model, folder / CHUNK_FILE, step_graph=step, **meta)]


# ---------------------------------------------------------------------------- the graph's claim, checked
CHECK_LENGTHS = (3, 13)  # two lengths every exported chunk and sequence graph must run at (neither the traced 8)
CHECK_SEED = 0


class GraphContractError(ValueError):
    """An exported graph does not do what its metadata says (one line: the file, the claim, what ran)."""


def _ort_session(path: Path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _stepped(model, tokens: torch.Tensor, state) -> tuple[torch.Tensor, tuple]:
    """`model.step` iterated over tokens (B, T, d_in) from `state`: the reference every graph is held to."""
    outs = []
    for t in range(tokens.shape[1]):
        out, state = model.step(tokens[:, t], state)
        outs.append(out)
    return torch.stack(outs, 1), state


def _close(got: np.ndarray, refs: tuple[torch.Tensor, torch.Tensor]) -> float | None:
    """The largest error of `got` from the float64 reference when it exceeds what fp32 allows (else None):
    1e-4 of the output's scale, plus ten times the model's own fp32 error (torch's fp32 result against its
    float64 one). Graph and torch differ only in summation order, which a model that cancels large terms (the
    LSTM construction's ε-linearisation) amplifies as much in torch as in ONNX Runtime."""
    ref32, ref64 = (r.detach().double().numpy() for r in refs)
    if got.shape != ref64.shape:
        return float("inf")
    err = float(np.abs(got.astype(np.float64) - ref64).max())
    tolerance = 1e-4 * max(1.0, float(np.abs(ref64).max())) + 10 * float(np.abs(ref32 - ref64).max())
    return err if err > tolerance else None


def check_graph(model, path: Path) -> None:
    """`_check_graph`; a refused graph file is removed, so no export leaves one behind."""
    try:
        _check_graph(model, path)
    except GraphContractError:
        Path(path).unlink(missing_ok=True)
        raise


def _within(time, lengths) -> list[int]:
    """`lengths` capped at the last T of a metadata time range "lo..hi" (a scan's or a position table's bound);
    as they are for "any"."""
    longest = int(str(time).split("..")[1]) if ".." in str(time) else None
    return [T if longest is None else min(T, longest) for T in lengths]


@torch.no_grad()
def _check_graph(model, path: Path) -> None:
    """Run the exported graph `path` through ONNX Runtime where its metadata says it is valid and hold it to the
    model: a step graph to `step` over a few tokens; a chunk graph at two lengths (CHECK_LENGTHS, the second
    continuing the first's state) to `step` iterated over both; a sequence graph at two lengths (or its one
    fixed length), and at a batch of two blocks and one more sequence, to `forward`. A graph that fails to run at a length its metadata claims, or computes other
    numbers, is refused in one line: the export never ships a graph whose time axis is not what it says."""
    model = _fp32_copy(model)
    exact = copy.deepcopy(model).double()  # the float64 reference; `model` gives fp32's own error beside it
    session = _ort_session(path)
    meta = session.get_modelmeta().custom_metadata_map
    graph, time = meta["icl_zoo.graph"], meta.get("icl_zoo.time")  # "1..1024", "2..N" and "any" raw; a fixed T as JSON
    time = int(time) if time is not None and time.isdigit() else time
    rng = np.random.default_rng(CHECK_SEED)

    def tokens(T: int, batch: int = EXPORT_BATCH) -> np.ndarray:
        return (0.5 * rng.uniform(-1, 1, (batch, T, model.d_in))).astype(np.float32)

    def run(feed: dict, what: str) -> list[np.ndarray]:
        try:
            return session.run(None, feed)
        except Exception as e:  # onnxruntime's own error types: a shape the graph does not take
            message = " ".join(str(e).split())[:300]
            raise GraphContractError(f"{path.name}: the {graph} graph claims time {time or 'one token'} but fails "
                                     f"{what}: {message}") from None

    def refuse(what: str, err: float) -> None:
        raise GraphContractError(f"{path.name}: the {graph} graph claims time {time or 'one token'} but {what} it "
                                 f"differs from torch by {err:.3g}")

    if graph == "step":
        x = tokens(CHECK_LENGTHS[0])
        state = [s.numpy() for s in model.init_state(EXPORT_BATCH)]
        in_names, _ = state_io_names(model)
        refs = [_stepped(m, torch.from_numpy(x).to(dtype), m.init_state(EXPORT_BATCH))[0]
                for m, dtype in ((model, torch.float32), (exact, torch.float64))]
        for t in range(x.shape[1]):
            out, *state = run({"token": x[:, t], **dict(zip(in_names, state))}, f"at token {t}")
            if (err := _close(out, (refs[0][:, t], refs[1][:, t]))) is not None:
                refuse(f"at token {t}", err)
    elif graph == "chunk":
        lengths = _within(time, CHECK_LENGTHS)
        in_names, _ = state_io_names(model)
        state, xs, outs = [s.numpy() for s in model.init_state(EXPORT_BATCH)], [], []
        for T in lengths:
            x = tokens(T)
            out, *state = run({"tokens": x, **dict(zip(in_names, state))}, f"at T = {T}")
            xs.append(x)
            outs.append(out)
        x = torch.from_numpy(np.concatenate(xs, 1))
        refs = tuple(_stepped(m, x.to(dtype), m.init_state(EXPORT_BATCH))[0]
                     for m, dtype in ((model, torch.float32), (exact, torch.float64)))
        if (err := _close(np.concatenate(outs, 1), refs)) is not None:
            refuse(f"over chunks of T = {lengths[0]} then {lengths[1]} (state carried)", err)
    else:
        # each distinct length once: a short bound caps several to the same T (a chunk graph keeps both, as two chunks)
        lengths = list(dict.fromkeys(_within(time, CHECK_LENGTHS))) if isinstance(time, str) else [time]
        block = int(meta.get("icl_zoo.batch_block", "0") or 0)
        shapes = [(EXPORT_BATCH, T) for T in lengths] + ([(2 * block + 1, lengths[0])] if block else [])
        for batch, T in shapes:  # and past two blocks: whole blocks, then one padded
            x = tokens(T, batch)
            what = f"at T = {T}" + (f", batch {batch}" if batch != EXPORT_BATCH else "")
            (out,) = run({"tokens": x}, what)
            if (err := _close(out, (model(torch.from_numpy(x)), exact(torch.from_numpy(x).double())))) is not None:
                refuse(what, err)
