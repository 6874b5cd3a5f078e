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
from pathlib import Path

import numpy as np
import onnxruntime as ort

from zoo.locate import resolve
from zoo.manifest import CHUNK_FILE, STEP_FILE, CheckpointError, verify_files

CHUNK = 1024  # most tokens per run of a chunk graph valid for any T: its outputs are buffered, the state is not
# The parallel chunk graph does O(T log T) work per stream against the scanned step graph's O(T):
# it wins while few streams leave the step's vector units idle. Measured on one CPU thread
# (gated-rnn-gd-zucchet-icl, tokens/s parallel vs scanned): batch 1 2.75M vs 0.25M, batch 4
# 2.33M vs 0.69M, batch 16 2.17M vs 2.14M, batch 64 1.5M vs 5.3M; the best chunk holds
# ~1,024 tokens over the batch. Past this batch the scanned step graph runs the chunks.
PARALLEL_MAX_BATCH = 8
PARALLEL_TOKENS = 1024  # tokens per run of the parallel graph, over the whole batch


class StreamError(ValueError):
    """A token or state does not fit the graph."""


def _resolve(path_or_repo: str | Path, revision: str | None, endpoint: str | None) -> tuple[Path, Path | None]:
    """The step graph, and the chunk graph beside it (None if there is none): a checkpoint's (or a
    given step graph's folder's) chunk graph is taken only when its config lists it and it verifies.
    A folder, Hub repo or bare released name (zoo.locate) is hash-checked by zoo.manifest: no torch."""
    p = Path(path_or_repo)
    if p.is_file():  # a bare graph: its sibling chunk graph only from a checkpoint folder that verifies and lists it
        sibling = p.with_name(CHUNK_FILE)
        if p.name != STEP_FILE or not (sibling.exists() or sibling.is_symlink()):
            return p, None
        try:
            listed = verify_files(p.parent).get("files", {})
        except (CheckpointError, OSError):
            listed = {}
        return p, sibling if CHUNK_FILE in listed else None
    folder = p if p.is_dir() else resolve(str(path_or_repo), revision=revision, endpoint=endpoint)
    verified = verify_files(folder)  # every recorded hash, the ONNX graphs included, before a session runs them
    step = folder / STEP_FILE
    if not step.exists():
        raise FileNotFoundError(f"{folder} has no {STEP_FILE}: the model is not recurrent or was not exported (zoo export)")
    return step, folder / CHUNK_FILE if CHUNK_FILE in verified.get("files", {}) else None


class StreamingSession:
    def __init__(self, path_or_repo: str | Path, *, providers: list[str] | None = None,
                 revision: str | None = None, endpoint: str | None = None, threads: int | None = None,
                 chunk: str | Path | None = None):
        """`chunk`: a chunk graph file to use with a bare step graph file (the caller vouches for it;
        its metadata must still match the step graph's)."""
        self.path, self.chunk_path = _resolve(path_or_repo, revision, endpoint)
        if chunk is not None:
            self.chunk_path = Path(chunk)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        available = ort.get_available_providers()
        providers = providers or [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        self.session = ort.InferenceSession(str(self.path), options, providers=providers)
        meta = self.session.get_modelmeta().custom_metadata_map
        if meta.get("icl_zoo.graph") != "step":
            raise StreamError(f"{self.path} is not an icl-zoo step graph (metadata icl_zoo.graph={meta.get('icl_zoo.graph')!r})")
        self.d_in = int(meta["icl_zoo.d_in"])
        self.d_out = int(meta["icl_zoo.d_out"])
        self.readout = json.loads(meta["icl_zoo.readout"])
        self.entry = meta.get("icl_zoo.entry", "")
        self.layout = json.loads(meta["icl_zoo.state_layout"])
        self.on_gpu = self.session.get_providers()[0] == "CUDAExecutionProvider"
        self._options, self._providers = options, providers
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
        if tokens.shape[1] > 1 and not self.on_gpu:  # one run per chunk of at most the graph's valid length
            session, piece = self._chunk_graph()
            for start in range(0, tokens.shape[1], piece):
                stop = min(start + piece, tokens.shape[1])
                outs[:, start:stop] = self._chunk(session, np.ascontiguousarray(tokens[:, start:stop]))
        else:  # token at a time: the lowest latency per token
            step = self._step_gpu if self.on_gpu else self._step_cpu
            for t in range(tokens.shape[1]):
                outs[:, t] = step(np.ascontiguousarray(tokens[:, t]))
        self.steps += tokens.shape[1]
        return outs[:, 0] if single else outs

    def _chunk_graph(self):
        """The chunk graph for this batch and the tokens per run: the parallel one (model_chunk.onnx)
        for few streams, the step graph scanned over time for many (see PARALLEL_MAX_BATCH)."""
        kind = "parallel" if self.chunk_path is not None and self.batch <= PARALLEL_MAX_BATCH else "scan"
        if kind not in self._chunk_sessions:
            if kind == "parallel":
                session = ort.InferenceSession(str(self.chunk_path), self._options, providers=self._providers)
                meta = session.get_modelmeta().custom_metadata_map
                step_meta = self.session.get_modelmeta().custom_metadata_map
                same = ("icl_zoo.entry", "icl_zoo.d_in", "icl_zoo.d_out", "icl_zoo.readout", "icl_zoo.state_layout")
                if meta.get("icl_zoo.graph") != "chunk" or any(meta.get(k) != step_meta.get(k) for k in same):
                    raise StreamError(f"{self.chunk_path} is not the chunk graph of {self.path} (metadata differs)")
                time = meta["icl_zoo.time"]  # "1..N" (a parallel scan bounded by N) or "any" (a scanned step)
                longest = CHUNK if time == "any" else int(time.split("..")[1])
            else:
                import onnx

                from icl_zoo_export.scan_graph import scan_step_graph

                graph = scan_step_graph(onnx.load(str(self.path)))
                session = ort.InferenceSession(graph.SerializeToString(), self._options, providers=self._providers)
                longest = CHUNK
            self._chunk_sessions[kind] = (session, longest)
        session, longest = self._chunk_sessions[kind]
        return session, min(longest, max(1, PARALLEL_TOKENS // self.batch)) if kind == "parallel" else longest

    def _chunk(self, session, tokens: np.ndarray) -> np.ndarray:
        results = session.run(None, {"tokens": tokens, **self._state})
        self._state = {s["input"]: results[i + 1] for i, s in enumerate(self.layout)}
        return results[0]

    def predict(self, outputs: np.ndarray) -> np.ndarray:
        """The task read-out of step outputs (…, d_out) -> (…, d_y): sign · out[start:stop]."""
        r = self.readout
        return r["sign"] * outputs[..., r["start"] : r["stop"]]

    def _step_cpu(self, token: np.ndarray) -> np.ndarray:
        feeds = {"token": token, **self._state}
        results = self.session.run(None, feeds)
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
        self.session.run_with_iobinding(binding)
        self._state, self._spare = self._spare, self._state
        return binding.copy_outputs_to_cpu()[0]
