"""Constant-memory streaming over exported step and chunk graphs with ONNX Runtime.

    session = StreamingSession("ckpt/lsa")        # folder, .onnx file or Hub repo id
    session.reset(batch=4)
    out = session.push(tokens)                    # (4, d_in) -> (4, d_out); (4, T, d_in) -> (4, T, d_out)

The state lives between calls and has the fixed shapes recorded in the graph's metadata, so
memory does not grow with the stream. One token runs the step graph (lowest latency); T > 1
tokens run the chunk graph (model_chunk.onnx: the parallel scan continued from the state) on
pieces of at most its valid length, one `run` per piece, carrying the state across pieces and
calls. A checkpoint without a chunk graph gets the step graph scanned over time in memory.
With onnxruntime-gpu, single steps run on CUDA and keep the state on the device with IOBinding
(only tokens go in and outputs come out).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
from zoo.export.graph_files import check_graph_bytes, is_readout

from zoo.locate import locate
from zoo.manifest import CHUNK_FILE, STEP_FILE, CheckpointError, contained_file

CHUNK = 1024  # most tokens per run of a chunk graph valid for any T: its outputs are buffered, the state is not
# The parallel chunk graph does O(T log T) work per stream against the scanned step graph's O(T):
# it wins while few streams leave the step's vector units idle. Measured on one CPU thread
# (gated-rnn-gd-zucchet-icl, tokens/s parallel vs scanned): batch 1 2.75M vs 0.25M, batch 4
# 2.33M vs 0.69M, batch 16 2.17M vs 2.14M, batch 64 1.5M vs 5.3M; the best chunk holds
# ~1,024 tokens over the batch. Past this batch the scanned step graph runs the chunks.
PARALLEL_MAX_BATCH = 8
PARALLEL_TOKENS = 1024  # tokens per run of the parallel graph, over the whole batch


MAX_WIDTH = 1 << 16  # most values per token (icl_zoo.d_in) or output (icl_zoo.d_out) a graph may declare
MAX_STATE_ELEMENTS = 1 << 26  # most state values per stream a graph's icl_zoo.state_layout may declare (256 MiB)


class StreamError(ValueError):
    """A token or state does not fit the graph, or a graph is not one the runtime can stream."""


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:300]


# What ONNX Runtime raises from its C++ side (Fail, InvalidGraph, InvalidArgument, …): plain Exceptions.
_ORT_ERRORS = (RuntimeError, *(v for v in vars(ort.capi.onnxruntime_pybind11_state).values()
                               if isinstance(v, type) and issubclass(v, Exception)))


def _open_graph(source, where, options, providers) -> ort.InferenceSession:
    """An ONNX Runtime session, or a one-line StreamError naming the graph."""
    try:
        return ort.InferenceSession(source, options, providers=providers)
    except Exception as e:  # whatever the runtime refuses, say so in one line
        raise StreamError(f"{where}: ONNX Runtime cannot open it: {_first_line(e)}") from e


def _metadata(meta: dict[str, str], where) -> tuple[int, int, dict, list[dict]]:
    """(d_in, d_out, read-out, state layout) from a step graph's metadata, each checked: a graph
    that declares absurd widths or state sizes is refused before any state is allocated."""
    def text(key):
        if key not in meta:
            raise StreamError(f"{where}: metadata {key} is missing; not an icl-zoo step graph")
        return meta[key]

    def width(key):
        value = text(key)
        if not (value.isascii() and value.isdigit() and len(value) <= 9 and 1 <= int(value) <= MAX_WIDTH):
            raise StreamError(f"{where}: metadata {key} = {value[:40]!r}; expected an integer from 1 to {MAX_WIDTH}")
        return int(value)

    def parsed(key):
        try:
            return json.loads(text(key))
        except (ValueError, RecursionError) as e:
            raise StreamError(f"{where}: metadata {key} is not JSON ({type(e).__name__})") from None

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    d_in, d_out = width("icl_zoo.d_in"), width("icl_zoo.d_out")
    readout = parsed("icl_zoo.readout")
    if not is_readout(readout, d_out):
        raise StreamError(f"{where}: metadata icl_zoo.readout = {text('icl_zoo.readout')[:80]!r}; expected "
                          f'{{"start": int, "stop": int, "sign": number}} with 0 ≤ start < stop ≤ d_out = {d_out}')
    layout = parsed("icl_zoo.state_layout")
    expected = ('a list of {"input": name, "output": name, "shape": ["batch", positive ints…], "dtype": "float32"} '
                f"of at most {MAX_STATE_ELEMENTS} values per stream")
    if not isinstance(layout, list) or not all(isinstance(s, dict) for s in layout):
        raise StreamError(f"{where}: metadata icl_zoo.state_layout is not {expected}")
    total = 0
    for s in layout:
        shape = s.get("shape")
        if not (isinstance(s.get("input"), str) and isinstance(s.get("output"), str) and isinstance(shape, list)
                and 1 <= len(shape) <= 8 and all(is_int(d) and d >= 1 for d in shape[1:])
                and s.get("dtype", "float32") == "float32"):
            raise StreamError(f"{where}: metadata icl_zoo.state_layout entry {json.dumps(s)[:120]} is not in {expected}")
        total += int(np.prod(shape[1:], dtype=object))
        if total > MAX_STATE_ELEMENTS:
            raise StreamError(f"{where}: metadata icl_zoo.state_layout declares more than {MAX_STATE_ELEMENTS} state "
                              f"values per stream ({s['input']} {shape}); refusing to allocate it")
    names = [s[k] for s in layout for k in ("input", "output")]
    if len(set(names)) != len(names):
        raise StreamError(f"{where}: metadata icl_zoo.state_layout repeats a name")
    return d_in, d_out, readout, layout


def _check_wiring(session: ort.InferenceSession, layout: list[dict], where, tokens: str) -> None:
    """The graph's inputs are (tokens, state inputs…) and its outputs (out, state outputs…), in the
    layout's order, as the runtime feeds and reads them."""
    inputs = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    if inputs != [tokens, *(s["input"] for s in layout)] or outputs[1:] != [s["output"] for s in layout] \
            or len(outputs) != len(layout) + 1:
        raise StreamError(f"{where}: the graph's inputs {inputs[:8]} and outputs {outputs[:8]} are not the "
                          f"({tokens}, state…) → (out, state…) of its icl_zoo.state_layout metadata")


UNVERIFIED = "unverified: a bare graph file, not checked against a checkpoint's config.json or a release"


def _resolve(path_or_repo: str | Path, revision: str | None, endpoint: str | None
             ) -> tuple[Path, Path | None, dict[Path, bytes], str]:
    """(step graph, chunk graph or None, the bytes of both as hashed, how they were checked).

    A folder, Hub repo or bare released name is located and hash-checked by zoo.locate (no torch):
    a released entry against the shipped release index, anything else against its own config.json;
    a chunk graph is taken only when the config lists it. A bare .onnx file is unverified and says so.
    Every graph is checked to be self-contained standard ONNX before a runtime opens it."""
    p = Path(path_or_repo)
    if p.is_file():  # a bare graph: its sibling chunk graph only from a checkpoint folder that verifies and lists it
        graphs = {p: contained_file(p.parent, p.name).read_bytes()}
        sibling, trust = p.with_name(CHUNK_FILE), UNVERIFIED
        chunk = None
        if p.name == STEP_FILE and (sibling.exists() or sibling.is_symlink()):
            try:
                verified = locate(p.parent)
            except (CheckpointError, OSError, ValueError):
                verified = None
            if verified is not None and CHUNK_FILE in verified.data and STEP_FILE in verified.data:
                graphs = {p: verified.data[STEP_FILE], sibling: verified.data[CHUNK_FILE]}
                chunk, trust = sibling, verified.trust
    else:
        verified = locate(path_or_repo, revision=revision, endpoint=endpoint)
        if STEP_FILE not in verified.data:
            raise FileNotFoundError(f"{verified.folder} has no {STEP_FILE}: the model is not recurrent or was not exported (zoo export)")
        p, trust = verified.folder / STEP_FILE, verified.trust
        graphs = {p: verified.data[STEP_FILE]}
        chunk = None
        if CHUNK_FILE in verified.data:
            chunk = verified.folder / CHUNK_FILE
            graphs[chunk] = verified.data[CHUNK_FILE]
    for path, raw in graphs.items():
        check_graph_bytes(raw, path)
    return p, chunk, graphs, trust


class StreamingSession:
    def __init__(self, path_or_repo: str | Path, *, providers: list[str] | None = None,
                 revision: str | None = None, endpoint: str | None = None, threads: int | None = None,
                 chunk: str | Path | None = None):
        """`chunk`: a chunk graph file to use with a bare step graph file (the caller vouches for it;
        its metadata must still match the step graph's)."""
        self.path, self.chunk_path, self._graph_bytes, self.trust = _resolve(path_or_repo, revision, endpoint)
        if chunk is not None:  # the caller vouches for it; it is still read once and checked like any graph
            self.chunk_path = Path(chunk)
            self._graph_bytes[self.chunk_path] = contained_file(self.chunk_path.parent, self.chunk_path.name).read_bytes()
            check_graph_bytes(self._graph_bytes[self.chunk_path], self.chunk_path)
        if self.trust == UNVERIFIED:
            warnings.warn(f"{self.path}: {UNVERIFIED}; load its checkpoint folder or released name to check it",
                          stacklevel=2)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        available = ort.get_available_providers()
        providers = providers or [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        self.session = _open_graph(self._graph_bytes[self.path], self.path, options, providers)  # the bytes that were hashed
        meta = self.session.get_modelmeta().custom_metadata_map
        if meta.get("icl_zoo.graph") != "step":
            raise StreamError(f"{self.path} is not an icl-zoo step graph (metadata icl_zoo.graph={meta.get('icl_zoo.graph')!r})")
        self.d_in, self.d_out, self.readout, self.layout = _metadata(meta, self.path)
        _check_wiring(self.session, self.layout, self.path, "token")
        self.entry = meta.get("icl_zoo.entry", "")
        self.on_gpu = self.session.get_providers()[0] == "CUDAExecutionProvider"
        self._options, self._providers = options, providers
        self._run_options = ort.RunOptions()  # one for every run (cheaper than ONNX Runtime making one per call)
        self._run_options.log_severity_level = 4  # a failed run raises a StreamError; ONNX Runtime need not log it too
        self._chunk_sessions: dict[str, tuple] = {}  # "parallel" / "scan" → (session, max T); opened on first use
        self.batch = 0
        self.steps = 0
        self.reset(1)

    # ------------------------------------------------------------------ state
    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {s["input"]: (batch, *s["shape"][1:]) for s in self.layout}

    def reset(self, batch: int = 1) -> None:
        """Zero state for `batch` independent streams."""
        if batch < 1:
            raise StreamError(f"batch must be ≥ 1, got {batch}")
        self.batch, self.steps = batch, 0
        self._set({name: np.zeros(shape, np.float32) for name, shape in self.state_shapes(batch).items()})

    def _set(self, state: dict[str, np.ndarray]) -> None:
        self._state = state
        if self.on_gpu:  # state and a spare buffer of the same shapes stay on the device; steps swap them
            self._state = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in state.items()}
            self._spare = {k: ort.OrtValue.ortvalue_from_numpy(np.zeros_like(v), "cuda", 0) for k, v in state.items()}

    @property
    def state(self) -> dict[str, np.ndarray]:
        return {k: (v.numpy() if isinstance(v, ort.OrtValue) else v) for k, v in self._state.items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Replace the state (e.g. a saved one); names and shapes must match the graph."""
        expected = self.state_shapes(self.batch)
        if set(state) != set(expected):
            raise StreamError(f"state names {sorted(state)} do not match the graph's {sorted(expected)}")
        for name, value in state.items():
            if tuple(np.shape(value)) != expected[name]:
                raise StreamError(f"state '{name}' has shape {tuple(np.shape(value))}, expected {expected[name]}")
        self._set({k: np.ascontiguousarray(v, np.float32) for k, v in state.items()})

    # ------------------------------------------------------------------ stepping
    def push(self, tokens) -> np.ndarray:
        """Feed (B, d_in) for one step or (B, T, d_in) for T steps; returns the outputs."""
        tokens = np.asarray(tokens, dtype=np.float32)
        single = tokens.ndim == 2
        if single:
            tokens = tokens[:, None, :]
        if tokens.ndim != 3:
            raise StreamError(f"tokens must be (B, d_in) or (B, T, d_in), got shape {tokens.shape}")
        if tokens.shape[2] != self.d_in:
            raise StreamError(f"token width {tokens.shape[2]} does not match the model's d_in = {self.d_in}")
        if tokens.shape[0] != self.batch:
            raise StreamError(f"batch {tokens.shape[0]} does not match the session's {self.batch}; call reset(batch={tokens.shape[0]})")
        outs = np.empty((self.batch, tokens.shape[1], self.d_out), np.float32)
        where = self.path
        try:
            if tokens.shape[1] > 1 and not self.on_gpu:  # one run per chunk of at most the graph's valid length
                session, piece = self._chunk_graph()
                parallel = session is self._chunk_sessions.get("parallel", (None,))[0]
                where = self.chunk_path if parallel else f"{self.path} (scanned over time)"
                for start in range(0, tokens.shape[1], piece):
                    stop = min(start + piece, tokens.shape[1])
                    outs[:, start:stop] = self._chunk(session, np.ascontiguousarray(tokens[:, start:stop]))
            else:  # token at a time: the lowest latency per token
                step = self._step_gpu if self.on_gpu else self._step_cpu
                for t in range(tokens.shape[1]):
                    outs[:, t] = step(np.ascontiguousarray(tokens[:, t]))
        except _ORT_ERRORS as e:
            raise StreamError(f"{where}: ONNX Runtime failed running it (in the push from token {self.steps}): "
                              f"{_first_line(e)}") from e
        self.steps += tokens.shape[1]
        return outs[:, 0] if single else outs

    def _chunk_graph(self):
        """The chunk graph for this batch and the tokens per run: the parallel one (model_chunk.onnx)
        for few streams, the step graph scanned over time for many (see PARALLEL_MAX_BATCH)."""
        kind = "parallel" if self.chunk_path is not None and self.batch <= PARALLEL_MAX_BATCH else "scan"
        if kind not in self._chunk_sessions:
            if kind == "parallel":
                session = _open_graph(self._graph_bytes[self.chunk_path], self.chunk_path, self._options, self._providers)
                meta = session.get_modelmeta().custom_metadata_map
                step_meta = self.session.get_modelmeta().custom_metadata_map
                same = ("icl_zoo.entry", "icl_zoo.d_in", "icl_zoo.d_out", "icl_zoo.readout", "icl_zoo.state_layout")
                if meta.get("icl_zoo.graph") != "chunk" or any(meta.get(k) != step_meta.get(k) for k in same):
                    raise StreamError(f"{self.chunk_path} is not the chunk graph of {self.path} (metadata differs)")
                _check_wiring(session, self.layout, self.chunk_path, "tokens")
                time = meta.get("icl_zoo.time", "")  # "1..N" (a parallel scan bounded by N) or "any" (a scanned step)
                bound = time.removeprefix("1..")
                if time != "any" and not (time.startswith("1..") and bound.isascii() and bound.isdigit()
                                          and len(bound) <= 9 and int(bound) >= 1):
                    raise StreamError(f"{self.chunk_path}: metadata icl_zoo.time = {time[:40]!r}; expected 'any' or '1..N'")
                longest = CHUNK if time == "any" else int(bound)
            else:
                import onnx
                from zoo.export.scan_graph import scan_step_graph

                try:
                    graph = scan_step_graph(onnx.ModelProto.FromString(self._graph_bytes[self.path]))
                except Exception as e:  # onnx's checker raises its own classes
                    raise StreamError(f"{self.path}: cannot scan the step graph over time: {_first_line(e)}") from e
                session = _open_graph(graph.SerializeToString(), f"{self.path} (scanned over time)",
                                      self._options, self._providers)
                longest = CHUNK
            self._chunk_sessions[kind] = (session, longest)
        session, longest = self._chunk_sessions[kind]
        return session, min(longest, max(1, PARALLEL_TOKENS // self.batch)) if kind == "parallel" else longest

    def _chunk(self, session, tokens: np.ndarray) -> np.ndarray:
        results = session.run(None, {"tokens": tokens, **self._state}, self._run_options)
        self._state = {s["input"]: results[i + 1] for i, s in enumerate(self.layout)}
        return results[0]

    def predict(self, outputs: np.ndarray) -> np.ndarray:
        """The task read-out of step outputs (…, d_out) -> (…, d_y): sign · out[start:stop]."""
        r = self.readout
        return r["sign"] * outputs[..., r["start"] : r["stop"]]

    def _step_cpu(self, token: np.ndarray) -> np.ndarray:
        feeds = {"token": token, **self._state}
        results = self.session.run(None, feeds, self._run_options)
        self._state = {s["input"]: results[i + 1] for i, s in enumerate(self.layout)}
        return results[0]

    def _step_gpu(self, token: np.ndarray) -> np.ndarray:
        binding = self.session.io_binding()
        binding.bind_cpu_input("token", token)
        for name, value in self._state.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("out", "cpu")
        for s in self.layout:
            binding.bind_ortvalue_output(s["output"], self._spare[s["input"]])
        self.session.run_with_iobinding(binding, self._run_options)
        self._state, self._spare = self._spare, self._state
        return binding.copy_outputs_to_cpu()[0]
