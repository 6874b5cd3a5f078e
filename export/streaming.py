"""Constant-memory streaming over exported step and chunk graphs with ONNX Runtime.

    session = StreamingSession("ckpt/lsa")        # folder, .onnx file or Hub repo id
    session.reset(batch=4)
    out = session.push(tokens)                    # (4, d_in) -> (4, d_out); (4, T, d_in) -> (4, T, d_out)

The state lives between calls and has the fixed shapes recorded in the graph's metadata, so
memory does not grow with the stream. One token runs the step graph (lowest latency); T > 1
tokens run a chunk graph on pieces, one `run` per piece, carrying the state across pieces and
calls. Which chunk graph, and how many tokens per run, is chosen per batch size by measurement
(`CHUNK_GRAPHS`; a timed probe of each candidate on the first push of T > 1 tokens at that batch
size, cached for the session and, per graph and machine, in the zoo's cache (export/choices.py), so a later
session on the same machine does not measure again; `chosen_by` says what each batch's choice cost):

- "parallel": model_chunk.onnx, the parallel scan continued from the state (exported);
- "scan": the step graph wrapped in an ONNX Scan over time (built in memory from the step graph);
- "hoisted": the step graph's own nodes split around the state update (built in memory, see
  export.scan_graph.hoisted_step_graph): token projections and read-out over all B·T tokens
  at once, only the update scanned; a diagonal linear update (the gated RNN) in time blocks.

On a CUDA machine (onnxruntime-gpu) every graph runs on the CUDA provider with IOBinding: the
state stays on the device, only tokens go in and outputs come out; long inputs take the chunk
path there too.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

from export import choices
from export.graph_files import check_graph_bytes, is_readout
from zoo.storage.locate import locate
from zoo.storage.manifest import CHUNK_FILE, STEP_FILE, CheckpointError, contained_file

RUN_TOKENS = 1024  # most tokens per run of a chunk graph valid for any T: its outputs are buffered, the state is not
# The parallel chunk graph does O(T log T) work per stream against the scanned step graph's O(T); the
# hoisted graph runs the step's own operators over all B·T tokens at once. Which is fastest depends on
# the batch, the model and the machine, so the session measures (see _choose). PARALLEL_MAX_BATCH is
# kept for callers that read it: the batch past which, on the development CPU, the parallel graph
# stopped winning (batch 16: 2.17M vs 2.14M tokens/s, reports/engineering/streaming.md).
PARALLEL_MAX_BATCH = 8
PARALLEL_TOKENS = 1024  # tokens per run of the parallel graph, over the whole batch
PARALLEL_MIN_T = 8  # fewest tokens per stream per run for which the parallel graph is a candidate
SCAN_TOKENS = 1 << 14  # tokens per run of the scanned step graph over the whole batch (at most RUN_TOKENS per stream)
HOIST_TOKENS = (4096, 16384)  # tokens per run of the hoisted graph over the whole batch: each is probed
CHUNK_GRAPHS = ("parallel", "scan", "hoisted")
PROBE_SECONDS = 0.01  # each candidate is timed for at least this long per round (after one warm-up run)
PROBE_ROUNDS = 2
PROBE_MIN_T = 16  # a push of fewer tokens per stream, before this batch size was probed, runs the step graph
# Probe runs use at most this many streams (with the batch's tokens per run): the candidates' order is the same
# and the first push's cost stays bounded at any batch (Mamba at batch 10,000: 12.0 s of probing before).
PROBE_MAX_STREAMS = 256


MAX_WIDTH = 1 << 16  # most values per token (icl_zoo.d_in) or output (icl_zoo.d_out) a graph may declare
MAX_STATE_ELEMENTS = 1 << 26  # most state values per stream a graph's icl_zoo.state_layout may declare (256 MiB)


def _package_clash() -> str | None:
    """A warning when onnxruntime and onnxruntime-gpu are both installed: they ship the same
    `onnxruntime` module, so whichever was installed last overwrote the other's files."""
    from importlib import metadata

    try:
        metadata.version("onnxruntime")
        metadata.version("onnxruntime-gpu")
    except metadata.PackageNotFoundError:
        return None
    return ("onnxruntime and onnxruntime-gpu are both installed and share one module; keep one: "
            "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu  (README, ONNX streaming)")


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

    A folder, Hub repo or bare released name is located and hash-checked by zoo.storage.locate (no torch):
    a released entry against the shipped release index, anything else against its own config.json;
    a chunk graph is taken only when the config lists it. A bare .onnx file is unverified and says so.
    Every graph is checked to be self-contained standard ONNX before a runtime opens it."""
    p = Path(path_or_repo)
    if p.is_file():  # a bare graph: its sibling chunk graph only from a checkpoint folder whose hashes check and that lists it
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
                 chunk: str | Path | None = None, graphs: tuple[str, ...] = CHUNK_GRAPHS):
        """`chunk`: a chunk graph file to use with a bare step graph file (the caller vouches for it;
        its metadata must still match the step graph's). `graphs`: the chunk graphs the session may
        choose among (CHUNK_GRAPHS; e.g. ("scan",) to force one), by measurement where several apply."""
        if not graphs or set(graphs) - set(CHUNK_GRAPHS):
            raise StreamError(f"graphs must be a non-empty subset of {CHUNK_GRAPHS}, got {graphs!r}")
        self.graphs = tuple(graphs)
        self.path, self.chunk_path, self._graph_bytes, self.trust = _resolve(path_or_repo, revision, endpoint)
        if chunk is not None:  # the caller vouches for it; it is still read once and checked like any graph
            self.chunk_path = Path(chunk)
            self._graph_bytes[self.chunk_path] = contained_file(self.chunk_path.parent, self.chunk_path.name).read_bytes()
            check_graph_bytes(self._graph_bytes[self.chunk_path], self.chunk_path)
        if self.trust == UNVERIFIED:
            warnings.warn(f"{self.path}: {UNVERIFIED}; load its checkpoint folder or released name to check it",
                          stacklevel=2)
        clash = _package_clash()
        if clash:
            warnings.warn(clash, stacklevel=2)
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
        self._chunk_sessions: dict[str, tuple] = {}  # "parallel" / "scan" / "hoisted" → (session, max T); opened on first use
        self._choice: dict[int, tuple[str, int]] = {}  # batch → (graph, tokens per run), measured on first use
        self.probes: dict[int, dict[tuple[str, int], float]] = {}  # batch → {(graph, T): tokens/s} as measured
        self.chosen_by: dict[int, str] = {}  # batch → "only candidate", "cache" or "probe (N.NN s)": what the first push cost
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
        length = tokens.shape[1]
        where = self.path
        try:
            if length > 1 and (length >= PROBE_MIN_T or self.batch in self._choice or len(self.candidates()) == 1):
                # one run per piece of the chunk graph measured fastest at this batch (a first push
                # too short to be worth the probe runs token at a time, below)
                kind, piece = self._choose()
                if kind == "hoisted" and not self._finite(tokens):
                    kind = "scan"  # the exact step operators: a NaN spreads as in the step graph (see scan_graph)
                    piece = self._pieces(kind)[0]
                session = self._chunk_session(kind)[0]
                where = self.chunk_path if kind == "parallel" else f"{self.path} ({kind} over time)"
                if length <= piece:
                    out, self._state = self._run_chunk(session, tokens, self._state)
                else:
                    out = np.empty((self.batch, length, self.d_out), np.float32)
                    for start in range(0, length, piece):
                        stop = min(start + piece, length)
                        out[:, start:stop], self._state = self._run_chunk(session, tokens[:, start:stop], self._state)
            else:  # token at a time: the lowest latency per token
                step = self._step_gpu if self.on_gpu else self._step_cpu
                out = np.empty((self.batch, length, self.d_out), np.float32)  # (B, 0, d_out) for no tokens
                for t in range(length):
                    out[:, t] = step(np.ascontiguousarray(tokens[:, t]))
        except _ORT_ERRORS as e:
            raise StreamError(f"{where}: ONNX Runtime failed running it (in the push from token {self.steps}): "
                              f"{_first_line(e)}") from e
        self.steps += length
        return out[:, 0] if single else out

    def _finite(self, tokens: np.ndarray) -> bool:
        if not np.isfinite(tokens).all():
            return False
        return self.on_gpu or all(np.isfinite(v).all() for v in self._state.values())

    # ------------------------------------------------------------------ choosing a chunk graph
    def _pieces(self, kind: str) -> list[int]:
        """The tokens per run (per stream) tried for `kind` at this batch."""
        longest = self._chunk_session(kind)[1]
        if kind == "parallel":
            return [min(longest, max(1, PARALLEL_TOKENS // self.batch))]
        if kind == "scan":
            return [min(longest, max(16, SCAN_TOKENS // self.batch))]
        from export.scan_graph import LINEAR_BLOCK

        return sorted({min(longest, max(LINEAR_BLOCK, t // self.batch // LINEAR_BLOCK * LINEAR_BLOCK)) for t in HOIST_TOKENS})

    def candidates(self) -> list[tuple[str, int]]:
        """(graph, tokens per run) the session may use at its batch: each allowed graph that applies.
        The parallel graph is not tried where it would run fewer than PARALLEL_MIN_T tokens per stream
        (batch > 128) unless it is the only one allowed: a parallel scan over a few tokens is a slower
        step (measured 0.01M tokens/s at batch 1,024, one token per run, against 1.5M scanned)."""
        found = [(kind, piece) for kind in self.graphs if self._chunk_session(kind) is not None
                 for piece in self._pieces(kind)]
        kept = [(kind, piece) for kind, piece in found if kind != "parallel" or piece >= PARALLEL_MIN_T]
        return kept or found

    def _choose(self) -> tuple[str, int]:
        """The (graph, tokens per run) for this batch: the only candidate, or the fastest in a timed
        probe (each candidate run from a zero scratch state on random tokens of its own run length,
        once to warm up, then for at least PROBE_SECONDS; tokens/s over the batch, the best of
        PROBE_ROUNDS interleaved rounds). Measured once per
        batch size and session; `probes` keeps the rates."""
        if self.batch not in self._choice:
            key = self._choice_key()
            cached = choices.recall(key, CHUNK_GRAPHS)
            if cached is not None and self._still_applies(cached):  # measured before on this machine (export/choices.py)
                self._choice[self.batch], self.chosen_by[self.batch] = cached, "cache"
                return cached
            candidates = self.candidates()
            if len(candidates) == 1:
                self._choice[self.batch], self.chosen_by[self.batch] = candidates[0], "only candidate"
            else:  # PROBE_ROUNDS interleaved rounds, the best of each: a busy moment hits one round
                import time

                start = time.perf_counter()
                rates = {c: 0.0 for c in candidates}
                for round in range(PROBE_ROUNDS):
                    for c in candidates:
                        rates[c] = max(rates[c], self._probe(*c, warm=round == 0))
                self.probes[self.batch] = rates
                self._choice[self.batch] = max(rates, key=rates.get)
                self.chosen_by[self.batch] = f"probe ({time.perf_counter() - start:.2f} s)"
                choices.remember(key, self._choice[self.batch], CHUNK_GRAPHS)
        return self._choice[self.batch]

    def _still_applies(self, choice: tuple[str, int]) -> bool:
        """A cached (graph, tokens per run) the session may use now: an allowed graph that opens, at one of the
        run lengths it would have probed (opening only that graph, not every candidate)."""
        kind, piece = choice
        return kind in self.graphs and self._chunk_session(kind) is not None and piece in self._pieces(kind)

    def _choice_key(self) -> str:
        """What a chunk-graph choice at this batch depends on: the graphs' bytes, the allowed graphs, the machine."""
        import hashlib

        digest = hashlib.sha256(self._graph_bytes[self.path])
        if self.chunk_path is not None:
            digest.update(self._graph_bytes[self.chunk_path])
        threads = self._options.intra_op_num_threads or None
        machine = choices.machine(threads, self._providers, ort.__version__)
        return choices.key(digest.hexdigest(), self.graphs, self.batch, machine)

    def _probe(self, kind: str, piece: int, warm: bool = True) -> float:
        import time

        session = self._chunk_session(kind)[0]
        rng = np.random.default_rng(0)
        streams = min(self.batch, PROBE_MAX_STREAMS)  # a run's cost grows with the batch: the probe's does not
        tokens = (rng.uniform(-1, 1, (streams, piece, self.d_in)) * 0.1).astype(np.float32)
        zero = {name: np.zeros(shape, np.float32) for name, shape in self.state_shapes(streams).items()}
        if self.on_gpu:
            zero = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in zero.items()}
        if warm:
            self._run_chunk(session, tokens, zero)  # warm-up: buffers allocated, kernels chosen
        runs, start = 0, time.perf_counter()
        while True:
            self._run_chunk(session, tokens, zero)
            runs += 1
            elapsed = time.perf_counter() - start
            if elapsed >= PROBE_SECONDS:
                return runs * streams * piece / elapsed

    def _chunk_graph(self):
        """(session, tokens per run) of the chunk graph this batch uses (chosen by _choose)."""
        kind, piece = self._choose()
        return self._chunk_session(kind)[0], piece

    def _chunk_session(self, kind: str):
        """(session, longest T per run) of a chunk graph, opened on first use; None where it does
        not apply (no model_chunk.onnx; a step graph the hoisted form cannot split)."""
        if kind not in self._chunk_sessions:
            self._chunk_sessions[kind] = self._open_chunk(kind)
        return self._chunk_sessions[kind]

    def _open_chunk(self, kind: str):
        if kind == "parallel":
            if self.chunk_path is None:
                return None
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
            return session, RUN_TOKENS if time == "any" else int(bound)
        import onnx

        from export.scan_graph import hoisted_step_graph, scan_step_graph

        where = f"{self.path} ({kind} over time)"
        try:
            step = onnx.ModelProto.FromString(self._graph_bytes[self.path])
            graph = scan_step_graph(step) if kind == "scan" else hoisted_step_graph(step)
        except Exception as e:  # onnx's checker raises its own classes
            if kind == "hoisted":
                return None  # the scanned step graph remains
            raise StreamError(f"{self.path}: cannot scan the step graph over time: {_first_line(e)}") from e
        if graph is None:
            return None
        if kind == "scan":
            return _open_graph(graph.SerializeToString(), where, self._options, self._providers), RUN_TOKENS
        try:  # the hoisted graph is an optimisation: one that ONNX Runtime refuses, or that does not
            session = _open_graph(graph.SerializeToString(), where, self._options, self._providers)
            if self._agrees_with_scan(session):  # reproduce the scanned step graph, is simply not used
                return session, 4 * RUN_TOKENS
        except (StreamError, *_ORT_ERRORS):
            pass
        return None

    def _agrees_with_scan(self, session) -> bool:
        """The hoisted graph's outputs and state equal the scanned step graph's on 2 streams × 37
        random tokens from a random state (float32 rounding: 1e-4 of the largest value)."""
        scan = self._chunk_session("scan")
        rng = np.random.default_rng(1)
        tokens = (rng.uniform(-1, 1, (2, 37, self.d_in)) * 0.3).astype(np.float32)
        state = {k: (rng.standard_normal(shape) * 0.1).astype(np.float32) for k, shape in self.state_shapes(2).items()}
        if self.on_gpu:
            state = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in state.items()}
        expected = self._run_chunk(scan[0], tokens, state)
        got = self._run_chunk(session, tokens, state)

        def host(v):
            return v.numpy() if isinstance(v, ort.OrtValue) else v

        pairs = [(expected[0], got[0])] + [(host(expected[1][k]), host(got[1][k])) for k in expected[1]]
        return all(a.shape == b.shape and np.allclose(a, b, rtol=0, atol=1e-4 * max(1.0, float(np.abs(a).max())))
                   for a, b in pairs)

    def _run_chunk(self, session, tokens: np.ndarray, state: dict):
        """(outputs (B, T, d_out), new state) of one run of a chunk graph from `state`. On CUDA the
        state stays on the device (IOBinding): tokens go in, outputs come out."""
        if not self.on_gpu:
            results = session.run(None, {"tokens": np.ascontiguousarray(tokens), **state}, self._run_options)
            return results[0], {s["input"]: results[i + 1] for i, s in enumerate(self.layout)}
        binding = session.io_binding()
        binding.bind_cpu_input("tokens", np.ascontiguousarray(tokens))
        for name, value in state.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("out", "cpu")
        for s in self.layout:
            binding.bind_output(s["output"], "cuda", 0)
        session.run_with_iobinding(binding, self._run_options)
        outputs = binding.get_outputs()
        return outputs[0].numpy(), {s["input"]: outputs[i + 1] for i, s in enumerate(self.layout)}

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
