"""The frozen splits as an open benchmark: any model, scored with the card's metrics beside GD.

    import zoo
    result = zoo.evaluate("my_model.onnx", task="zucchet-icl")          # or zoo.score(...)
    result = zoo.evaluate(my_torch_module, task="zucchet-icl", split="validation")
    result = zoo.evaluate(my_numpy_function, task="linreg-triples-d5-c20")

**The contract.** A model takes the task's tokens, float32 `(B, T, d_in)` in the task's layout
(zoo/science/tasks/regression.py; `zoo show ENTRY` prints a task), and returns either

- the predictions at the query, `(B, d_y)`, or
- the zoo's sequence contract, `(B, T, d_out)`, with a read-out that says which position, which
  channels and which sign hold the prediction: ONNX metadata `icl_zoo.readout` (as the zoo's exporter
  writes it, export/onnx_export.py), a `readout` attribute of a module or function, or `readout=`.
  Without one, a task that predicts at every position (`triples`, teacher–student) takes
  `(B, T, d_y)` as every position's prediction.

A model is an ONNX file (one float input named `tokens`; its first output is read), a folder or Hub
repo `ORG/NAME` holding one (`model.onnx`, or its only `.onnx` file), a zoo checkpoint (a folder, a
Hub repo with config.json, a released entry's name), a `torch.nn.Module` (fed torch tensors in its
parameters' dtype), or any other callable (fed numpy arrays). What breaks the contract is refused
with one line naming the model and what the contract expects.

**The metrics**, on the same tasks (zoo/science/metrics.py names the card's): the test loss (½·MSE at the
query; teacher–student: over every position) with its standard error over tasks; one GD step at
the analytic η* (the card's `gd_loss`); the paired difference model − GD, task by task, with its
standard error (`gd_paired_diff`, `gd_paired_se`, as zoo/science/expected.py measures it for cards); k-step
GD at the one rate that suits k steps best on these tasks; k-step GD with a rate of its own for each step,
fitted on the task's validation split (`per_step_etas`: the best k steps exactly, where they are real); least
squares; the prediction gap to GD; the sensitivity cosine to GD (autograd for torch modules, central finite
differences for black boxes); and, where the model predicts at every position of a `triples` task, the loss at
each position.

**A record** (`evaluate`'s result, `zoo eval MODEL --task TASK --json`) holds the split's SHA-256,
the model's (its file's bytes, or its weights'; a function: its name) and the zoo version;
`check(record, model)` (`zoo eval --check RECORD MODEL`) scores the model again and confirms or
refutes every number. It confirms only a record that holds the format, task, split, split SHA-256,
model identity and zoo version, each matching, and every number the re-score produces as a finite
int or float within CHECK_RTOL (a string, null, a bool, a missing or an extra metric refutes it).
What the record decides about the re-score (task, split, the k of each k-step GD reference, the
sensitivity method) is checked first and bounded (k ≤ MAX_GD_STEPS, at most MAX_GD_REFERENCES of them):
anything else is refused in one line before anything runs.

**Outside models run bounded.** An ONNX graph runs in a child process (`_GraphProcess`) under three
limits, each a keyword of `evaluate` and `check` (`Limits`; `zoo eval --time-limit/--memory-limit/
--output-limit`; `bounds(...)` sets them for a block, as `zoo leaderboard` does): the wall-clock time the
graph may take to open or to run one pass (one call of `run`, at most TASKS_PER_PASS tasks; 600 s), the memory it may take above its process's start (2 GiB, RLIMIT_AS) and the
bytes one call may return (256 MiB; the contract's (B, T, d_out) floats are far less). A call that needs
more memory is fed again half the tasks at a time (and so are later calls), down to one task. Reaching a
limit stops the graph with one line naming it. Zoo checkpoints, torch modules and functions run in-process.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import math
import os
import re
import select
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from zoo.science.evaluation import (
    TASKS_PER_PASS,
    alignment,
    position_baselines,
    position_loss,
    predictions_and_sensitivities,
    query_sensitivities,
    tasks_per_pass,
)
from zoo.science.tasks.regression import (
    LinearRegressionTask,
    Readout,
    gd_predict,
    least_squares_predict,
    line_search_eta,
)
from zoo.version import __version__

RECORD_FORMAT = "icl-zoo/publishing/benchmark/v1"
GD_STEPS = (2, 3)  # k-step GD references beside the one step at η*, each at the rate that suits k steps
SENSITIVITY_METHODS = ("auto", "autograd", "finite differences", "none")
FD_STEP = 1e-2  # finite-difference step, in units of the task's input scale: exact for models linear in x_q
CHECK_RTOL = 1e-5  # re-scored numbers must agree this closely (ONNX Runtime and BLAS may sum in another order)
# A record's re-scoring parameters are bounded: the zoo writes k = 2 and 3. The k-step line search holds k
# coefficient tensors of the split and costs O(k²) matmuls over it (k = 16: ~4 s on one CPU core); past ~16
# steps the polynomial in η loses its precision to cancellation anyway (k = 32: 0.07 off at η = 0.05).
MAX_GD_STEPS = 16
MAX_GD_REFERENCES = 4
RECORD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a record's task and split (fullmatch): registry names
SHA256 = re.compile(r"[0-9a-f]{64}")  # fullmatch


class BenchmarkError(ValueError):
    """A model does not keep the open-benchmark contract (one line: the model, and what was expected)."""


# ---------------------------------------------------------------- outside graphs run bounded
@dataclass(frozen=True)
class Limits:
    """What an outside ONNX graph may use: seconds of wall-clock time to open it and for each pass over a
    batch of tasks (scoring makes at most (1 + 2·d_x)·⌈N / TASKS_PER_PASS⌉ passes), bytes of memory above its
    process's start, bytes one call may return."""

    time_limit: float = 600.0
    memory_limit: int = 2 * 2**30
    output_limit: int = 256 * 2**20

    def __post_init__(self):
        for key in ("time_limit", "memory_limit", "output_limit"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{key}={value!r}: expected a positive finite number")


DEFAULT_LIMITS = Limits()
_LIMITS: contextvars.ContextVar[Limits] = contextvars.ContextVar("icl_zoo_benchmark_limits", default=DEFAULT_LIMITS)


def limits(time_limit: float | None = None, memory_limit: int | None = None, output_limit: int | None = None) -> Limits:
    """The limits in force (bounds(...) or the defaults) with those given replaced."""
    given = {k: v for k, v in (("time_limit", time_limit), ("memory_limit", memory_limit),
                                ("output_limit", output_limit)) if v is not None}
    return replace(_LIMITS.get(), **given)


@contextlib.contextmanager
def bounds(time_limit: float | None = None, memory_limit: int | None = None, output_limit: int | None = None):
    """Within the block, outside ONNX graphs run under these limits (the others as before)."""
    token = _LIMITS.set(limits(time_limit, memory_limit, output_limit))
    try:
        yield _LIMITS.get()
    finally:
        _LIMITS.reset(token)


def shown_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


# The child: numpy and ONNX Runtime only (no torch), its address space capped right after those imports.
# Frames: 8-byte little-endian length, then the bytes. In: the limits (JSON), the graph; then per call a
# header (JSON: shape) and the float32 tokens. Out: a JSON header, then (per call) the output's bytes.
_WORKER = r"""
import json, os, resource, struct, sys
import numpy as np
import onnxruntime as ort
inp, out = sys.stdin.buffer, sys.stdout.buffer
def read():
    head = inp.read(8)
    if len(head) < 8:
        sys.exit(0)
    (n,) = struct.unpack("<Q", head)
    return inp.read(n)
def send(header, data=b""):
    raw = json.dumps(header).encode()
    out.write(struct.pack("<Q", len(raw)) + raw)
    if data:
        out.write(struct.pack("<Q", len(data)))
        out.write(data)
    out.flush()
def status():
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmPeak", "VmHWM", "VmSize", "VmRSS"):
                found[key] = int(value.split()[0]) * 1024
    return found
def memory_error(e):
    text = str(e).lower()
    return isinstance(e, MemoryError) or "bad_alloc" in text or "alloc" in text and ("fail" in text or "memory" in text)
config = json.loads(read())
start = status()["VmSize"]
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
cap = start + int(config["memory_limit"])
resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
try:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False  # what the graph holds is what it uses: no arena rounding it up to 2x
    session = ort.InferenceSession(read(), options, providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    send({"inputs": [{"name": i.name, "type": i.type, "shape": [d if isinstance(d, int) else None for d in i.shape]}
                     for i in session.get_inputs()],
          "meta": dict(session.get_modelmeta().custom_metadata_map), "start": start})
except BaseException as e:
    send({"error": (str(e).strip().splitlines() or [type(e).__name__])[0][:300],
          "memory": memory_error(e), "stage": "open"})
    sys.exit(0)
while True:
    header = json.loads(read())
    tokens = np.frombuffer(read(), dtype=np.float32).reshape(header["shape"])
    try:
        result = np.asarray(session.run([name], {"tokens": tokens})[0])
    except BaseException as e:
        send({"error": (str(e).strip().splitlines() or [type(e).__name__])[0][:300], "memory": memory_error(e)})
        continue
    if result.dtype.kind not in "fiub":
        send({"error": f"an output of dtype {result.dtype}; the contract expects float predictions", "memory": False})
    elif result.nbytes > config["output_limit"]:
        send({"too_big": int(result.nbytes), "shape": list(result.shape)})
    else:
        result = np.ascontiguousarray(result)
        send({"dtype": result.dtype.str, "shape": list(result.shape), **status()}, result.tobytes())
"""


class _GraphProcess:
    """One outside graph in its own process, under `limits`: `run(tokens)` returns its first output, or
    raises BenchmarkError in one line naming the limit reached (the process is then ended)."""

    def __init__(self, raw: bytes, where: str, limits: Limits):
        self.where, self.limits, self.used, self.total = where, limits, 0.0, 0.0  # seconds: this pass, in all
        self.peak: dict = {}  # the process's VmPeak (address space), VmHWM (resident), in bytes
        self.rows: int | None = None  # tasks per call, once a call needed more than the memory limit
        env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._finalizer = weakref.finalize(self, _end, self.process)
        self._send(json.dumps({"memory_limit": int(limits.memory_limit),
                               "output_limit": int(limits.output_limit)}).encode(), "while opening it")
        self._send(raw, "while opening it")
        header = self._header("while opening it")
        if "error" in header:
            self.close()
            if header.get("memory"):
                raise BenchmarkError(self._memory_line("while opening it"))
            raise BenchmarkError(f"{where}: ONNX Runtime cannot open it: {header['error']}")
        self.inputs, self.meta, self.start = header["inputs"], header["meta"], header["start"]

    def run(self, tokens: np.ndarray) -> np.ndarray:
        """The graph's output on `tokens`. A call that needs more than the memory limit is run again on half
        as many tasks (and later calls too), down to one task; one task that needs more ends the graph."""
        if self.process.poll() is not None:
            raise BenchmarkError(f"{self.where}: its process has already been stopped")
        tokens = np.ascontiguousarray(tokens, dtype=np.float32)
        self.used = 0.0  # the time limit holds for each pass
        n = tokens.shape[0] if tokens.ndim else 1
        rows, pieces, done = min(self.rows or n, n) or 1, [], 0
        while done < n or not pieces:
            piece = tokens[done:done + rows] if tokens.ndim else tokens
            out = self._call(piece, f"on tokens {tuple(tokens.shape)}")
            if out is None:  # above the memory limit
                if rows <= 1 or tokens.ndim == 0:
                    self.close()
                    raise BenchmarkError(self._memory_line(f"on tokens {tuple(piece.shape)}"))
                rows = self.rows = max(1, rows // 2)
                continue
            if rows < n and (out.ndim == 0 or out.shape[0] != piece.shape[0]):
                raise BenchmarkError(f"{self.where}: output shape {out.shape} on {piece.shape[0]} tasks; the contract "
                                     "expects the batch axis first")
            pieces.append(out)
            done += piece.shape[0] if tokens.ndim else 1
            returned = sum(p.nbytes for p in pieces)
            if returned > self.limits.output_limit:  # the cap holds for the pass, however it is split
                self.close()
                raise BenchmarkError(self._output_line(returned, None, f"on tokens {tuple(tokens.shape)}"))
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _call(self, tokens: np.ndarray, on: str) -> np.ndarray | None:
        """One call of the graph; None when it needed more than the memory limit."""
        self._send(json.dumps({"shape": list(tokens.shape)}).encode(), on)
        self._send(tokens.tobytes(), on)
        header = self._header(on)
        if "error" in header:
            if header.get("memory"):
                return None
            raise BenchmarkError(f"{self.where}: ONNX Runtime failed {on}: {header['error']}")
        if "too_big" in header:
            self.close()
            raise BenchmarkError(self._output_line(header["too_big"], header["shape"], on))
        shape, dtype = tuple(header["shape"]), np.dtype(header["dtype"])
        size = dtype.itemsize * math.prod(shape)
        if size > self.limits.output_limit:
            self.close()
            raise BenchmarkError(self._output_line(size, shape, on))
        data = self._frame(on, most=size)
        self.peak = {k: max(v, self.peak.get(k, 0)) for k, v in header.items() if k.startswith("Vm")}
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()

    def close(self) -> None:
        self._finalizer()

    # -- the pipe, with the time left
    def _send(self, data: bytes, on: str) -> None:
        try:
            self.process.stdin.write(struct.pack("<Q", len(data)))
            self.process.stdin.write(data)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise BenchmarkError(self._died_line(on)) from None

    def _header(self, on: str) -> dict:
        return json.loads(self._frame(on, most=1 << 20))

    def _frame(self, on: str, most: int) -> bytes:
        (n,) = struct.unpack("<Q", self._read(8, on))
        if n > most:
            self.close()
            raise BenchmarkError(self._output_line(n, None, on))
        return self._read(n, on)

    def _read(self, n: int, on: str) -> bytes:
        fd, chunks, got = self.process.stdout.fileno(), [], 0
        while got < n:
            left = self.limits.time_limit - self.used
            began = time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            self.used += time.monotonic() - began
            self.total += time.monotonic() - began
            if not ready:
                self.close()
                raise BenchmarkError(f"{self.where}: stopped {on}: the graph ran past the time limit of "
                                     f"{self.limits.time_limit:g} s for one pass (time_limit, --time-limit)")
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise BenchmarkError(self._died_line(on))
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    # -- the lines
    def _memory_line(self, on: str) -> str:
        return (f"{self.where}: stopped {on}: the graph needed more than the memory limit of "
                f"{shown_bytes(self.limits.memory_limit)} above its start (memory_limit, --memory-limit)")

    def _output_line(self, size: int, shape, on: str) -> str:
        of = f" (shape {tuple(shape)})" if shape is not None else ""
        return (f"{self.where}: refused {on}: the graph returned {size} bytes{of}, above the output cap of "
                f"{shown_bytes(self.limits.output_limit)} (output_limit, --output-limit)")

    def _died_line(self, on: str) -> str:
        self.close()
        code = self.process.returncode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return (f"{self.where}: stopped {on}: its ONNX Runtime process ended ({how}), as a graph that needs more "
                f"than the memory limit of {shown_bytes(self.limits.memory_limit)} (memory_limit, --memory-limit) does")


def _end(process: subprocess.Popen) -> None:
    """End a graph's process (kill, then reap) and close its pipes."""
    if process.poll() is None:
        process.kill()
    with contextlib.suppress(Exception):
        process.wait(timeout=10)
    for pipe in (process.stdin, process.stdout):
        with contextlib.suppress(Exception):
            pipe.close()


# ---------------------------------------------------------------- models reduced to the contract
@dataclass
class Candidate:
    """A model as the benchmark sees it: `run(tokens (B, T, d_in) float32) -> raw output`."""

    name: str  # how errors and tables name it
    identity: dict  # what a record stores to say which model it scored
    run: Callable[[torch.Tensor], torch.Tensor]
    readout: Readout | None = None
    differentiable: bool = False  # autograd reaches the tokens: sensitivities without finite differences
    check_inputs: Callable[[object], None] = field(default=lambda task: None)  # refuses a graph before it runs
    close: Callable[[], None] = field(default=lambda: None)  # ends what runs it (an outside graph's process)
    zoo_model: object | None = None  # a zoo checkpoint's model: passes sized by its state, its Jacobian by `step`


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:300]


def _expects(task) -> str:
    """The contract for `task`, in words."""
    shapes = f"(B, {task.n_tokens}, {task.token_dim})"
    if not task.has_gd_reference:
        return f"tokens {shapes} float32 → predictions (B, {task.n_tokens}, {task.prediction_dim}) at every position"
    every = f", or (B, {task.n_tokens}, {task.d_y}) at every position" if task.every_position else ""
    return (f"tokens {shapes} float32 → predictions (B, {task.d_y}) at the query{every}, or outputs "
            f"(B, {task.n_tokens}, d_out) with a read-out")


def _calling(name: str, fn: Callable, tokens) -> object:
    """fn(tokens); whatever it raises becomes one line naming the model."""
    try:
        return fn(tokens)
    except BenchmarkError:
        raise
    except Exception as e:  # a model may raise anything; the user needs its first line
        raise BenchmarkError(f"{name} raised {type(e).__name__} on tokens {tuple(tokens.shape)}: "
                             f"{_first_line(e)}") from e


def _as_tensor(out, name: str) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    try:
        array = np.asarray(out)
    except Exception:  # noqa: BLE001 -- a ragged list, an object that refuses conversion
        array = None
    if array is None or array.dtype.kind not in "fiub":
        raise BenchmarkError(f"{name} returned {type(out).__name__}; the contract expects an array of predictions")
    return torch.from_numpy(np.array(array, dtype=np.float64))


def weights_sha256(module: torch.nn.Module) -> str:
    """SHA-256 over a module's state_dict (names, dtypes, shapes, bytes): which weights were scored."""
    h = hashlib.sha256()
    for key, value in sorted(module.state_dict().items()):
        value = value.detach().cpu().contiguous()
        h.update(f"{key}|{value.dtype}|{tuple(value.shape)}|".encode())
        h.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _qualname(obj) -> str:
    """module.qualname of a function, or of the class of any other object (a module, a callable instance)."""
    named = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(named, '__module__', None) or '?'}.{named.__qualname__}"


def torch_candidate(module: torch.nn.Module, name: str | None = None, readout=None) -> Candidate:
    """A torch module, fed tokens in its parameters' dtype and device (float32 on the CPU if it has none)."""
    first = next((t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()), None)
    dtype, device = (first.dtype, first.device) if first is not None else (torch.float32, torch.device("cpu"))
    name = name or type(module).__name__
    module.eval()  # as zoo.evaluate scores the zoo's own models

    def run(tokens):
        return _as_tensor(_calling(name, module, tokens.to(device=device, dtype=dtype)), name)

    def check_width(task):  # a module that declares its token width (every zoo model does) is checked before it runs
        width = getattr(module, "d_in", None)
        if isinstance(width, int) and width != task.token_dim:
            raise BenchmarkError(f"{name}: takes tokens of width d_in = {width}; the contract: {_expects(task)}")

    readout = _readout(readout if readout is not None else getattr(module, "readout", None), name)
    return Candidate(name, {"kind": "torch.nn.Module", "name": _qualname(module), "sha256": weights_sha256(module)},
                     run, readout, differentiable=True, check_inputs=check_width)


def callable_candidate(fn: Callable, name: str | None = None, readout=None) -> Candidate:
    """A function of numpy tokens (B, T, d_in) float32; it may return numpy or torch."""
    qualname = _qualname(fn)
    name = name or qualname

    def run(tokens):
        return _as_tensor(_calling(name, fn, tokens.detach().cpu().numpy()), name)

    readout = _readout(readout if readout is not None else getattr(fn, "readout", None), name)
    return Candidate(name, {"kind": "callable", "name": qualname}, run, readout)


def checkpoint_candidate(ckpt, name: str | None = None) -> Candidate:
    """A zoo checkpoint: its torch model with the task's read-out; the record names its entry and trust."""
    candidate = torch_candidate(ckpt.model, name or ckpt.entry.name, readout=ckpt.model.readout)
    candidate.identity = {"kind": "zoo checkpoint", "name": candidate.name, "entry": ckpt.entry.name,
                          "sha256": candidate.identity["sha256"], "trust": ckpt.trust}
    candidate.zoo_model = ckpt.model
    return candidate


def onnx_candidate(raw: bytes, where: str, limits: Limits | None = None) -> Candidate:
    """An ONNX graph from its bytes (hashed as read): standard operators, self-contained, one input `tokens`;
    it runs in its own process under `limits` (those in force by default: see `bounds`)."""
    from export.graph_files import GraphFileError, check_graph_bytes

    try:
        check_graph_bytes(raw, where)
    except GraphFileError as e:
        raise BenchmarkError(str(e)) from None
    graph = _GraphProcess(raw, where, limits or _LIMITS.get())

    def run(tokens):
        return torch.from_numpy(graph.run(tokens.detach().cpu().numpy()))

    inputs = [_GraphInput(i["name"], i["type"], i["shape"]) for i in graph.inputs]
    candidate = Candidate(where, {"kind": "onnx", "name": where, "sha256": hashlib.sha256(raw).hexdigest()}, run,
                          _readout(graph.meta.get("icl_zoo.readout"), where),
                          check_inputs=lambda task: _check_graph_inputs(inputs, task, where), close=graph.close)
    candidate.graph = graph  # its process: peak memory, time used
    return candidate


@dataclass
class _GraphInput:
    name: str
    type: str
    shape: list


def _check_graph_inputs(inputs, task, where: str) -> None:
    """One float input `tokens` of rank 3 whose fixed sizes, if any, are the task's; the batch axis free."""
    names = [i.name for i in inputs]
    expects = _expects(task)
    if len(inputs) != 1:
        raise BenchmarkError(f"{where}: the graph needs inputs {names}, but the task gives only 'tokens'; "
                             f"the contract: {expects}")
    (graph_input,) = inputs
    if graph_input.name != "tokens":
        raise BenchmarkError(f"{where}: its input is named {graph_input.name!r}; the contract feeds one input named "
                             f"'tokens': {expects}")
    shape = list(graph_input.shape)
    fixed = [d if isinstance(d, int) else None for d in shape]  # a symbolic size: None
    fits = (graph_input.type == "tensor(float)" and len(shape) == 3 and fixed[0] is None  # the batch stays free
            and all(f in (None, want) for f, want in zip(fixed[1:], (task.n_tokens, task.token_dim))))
    if not fits:
        shown = ", ".join(str(d) if isinstance(d, int) else "?" for d in shape)
        raise BenchmarkError(f"{where}: its input 'tokens' is {graph_input.type} ({shown}); the contract: {expects} "
                             "(batch axis dynamic)")


def _onnx_in_folder(folder: Path, where: str) -> Candidate:
    files = sorted(p.name for p in folder.glob("*.onnx") if p.is_file())
    chosen = "model.onnx" if "model.onnx" in files else files[0] if len(files) == 1 else None
    if chosen is None:
        raise BenchmarkError(f"{where}: holds {', '.join(files) or 'no .onnx file'}; expected a model.onnx or "
                             "exactly one .onnx file")
    return onnx_candidate((folder / chosen).read_bytes(), f"{where}/{chosen}")


def _from_text(text: str, *, revision: str | None, endpoint: str | None) -> Candidate:
    """An ONNX file, a folder or Hub repo holding one, or a zoo checkpoint (folder, Hub repo, released entry)."""
    from zoo.storage.loading import load
    from zoo.storage.locate import resolve_folder
    from zoo.storage.manifest import CONFIG

    path = Path(text)
    if path.suffix == ".onnx" and not path.is_file():
        raise BenchmarkError(f"{text}: no such file")
    if path.is_file():
        if path.suffix != ".onnx":
            raise BenchmarkError(f"{text}: not an .onnx file; the benchmark scores ONNX files, checkpoints, Hub repos, "
                                 "torch modules and functions")
        return onnx_candidate(path.read_bytes(), text)
    if path.is_dir():
        return checkpoint_candidate(load(path), text) if (path / CONFIG).is_file() else _onnx_in_folder(path, text)
    if "/" not in text:  # a released entry (or the registry's error for an unknown name)
        return checkpoint_candidate(load(text, revision=revision, endpoint=endpoint), text)
    with tempfile.TemporaryDirectory(prefix="icl-zoo-benchmark-") as tmp:  # nothing of the repo stays behind
        folder = resolve_folder(text, revision=revision, endpoint=endpoint, cache_dir=tmp,
                                allow_patterns=[CONFIG, "*.onnx"])
        if not (folder / CONFIG).is_file():
            return _onnx_in_folder(folder, f"{text}@{revision or 'main'}")
    return checkpoint_candidate(load(text, revision=revision, endpoint=endpoint), text)


def as_candidate(model, *, name: str | None = None, readout=None, revision: str | None = None,
                 endpoint: str | None = None) -> Candidate:
    """Any model the benchmark takes (see the module docstring), reduced to `Candidate`."""
    from zoo.storage.checkpoint import Checkpoint

    if isinstance(model, Candidate):
        return model
    if isinstance(model, (str, Path)):
        candidate = _from_text(str(model), revision=revision, endpoint=endpoint)
        candidate.name = name or candidate.name
        candidate.readout = _readout(readout, candidate.name) if readout is not None else candidate.readout
        return candidate
    if isinstance(model, Checkpoint):
        return checkpoint_candidate(model, name)
    if isinstance(model, torch.nn.Module):
        return torch_candidate(model, name, readout)
    if callable(model):
        return callable_candidate(model, name, readout)
    raise BenchmarkError(f"{type(model).__name__}: not a model; the benchmark takes an ONNX file, a checkpoint, a Hub "
                         "repo, a torch.nn.Module or a function of tokens")


def _readout(value, where: str) -> Readout | None:
    """A read-out from a Readout, a dict or its JSON (the ONNX metadata): position (an int, or null for
    every position), channels start:stop and a finite sign."""
    from export.graph_files import is_readout

    if value is None or isinstance(value, Readout):
        return value
    expected = '{"position": int or null, "start": int, "stop": int, "sign": number} with 0 ≤ start < stop'
    try:
        r = json.loads(value) if isinstance(value, str) else value
    except (ValueError, TypeError, RecursionError):
        raise BenchmarkError(f"{where}: read-out {str(value)[:80]!r} is not {expected}") from None
    if not is_readout(r):
        raise BenchmarkError(f"{where}: read-out {str(value)[:80]!r} is not {expected}")
    return Readout(position=r.get("position", -1), start=r["start"], stop=r["stop"], sign=float(r["sign"]))


# ---------------------------------------------------------------- running a model on a split
@dataclass
class Predictions:
    query: torch.Tensor  # (N, d_y) float64: the prediction at the query
    every: torch.Tensor | None  # (N, T, d_y) float64 when the model predicts at every position, else None


def _d_y(task) -> int:
    return task.prediction_dim


def _every_position(task) -> bool:
    return task.predicts_every_position


def read_output(out: torch.Tensor, task, candidate: Candidate, batch: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(query prediction (B, d_y), every position's (B, T, d_y) or None) from a raw output, or one line
    saying which shape the contract expects. Predictions must be finite."""
    d_y, n_tokens, shape = _d_y(task), task.n_tokens, tuple(out.shape)
    query = every = None
    if len(shape) == 2 and shape == (batch, d_y) and task.has_gd_reference:
        query = out
    elif len(shape) == 3 and shape[:2] == (batch, n_tokens):
        r = candidate.readout
        if r is not None and r.stop <= shape[2] and (r.position is None or -n_tokens <= r.position < n_tokens):
            query = r.query(out)
            every = r.channels(out) if r.position is None and _every_position(task) else None
        elif r is None and _every_position(task) and shape[2] == d_y:
            query, every = out[:, -1], out
    if query is None or every is None and not task.has_gd_reference:
        r = candidate.readout
        why = f" (its read-out: position {r.position}, channels {r.start}:{r.stop})" if r is not None else ""
        raise BenchmarkError(f"{candidate.name}: output shape {shape}{why}; the contract: {_expects(task)}")
    for values in (query, every):
        if values is not None and not torch.isfinite(values).all():
            bad = (~torch.isfinite(values)).flatten(1).any(1).nonzero().flatten()
            raise BenchmarkError(f"{candidate.name}: non-finite predictions (NaN or inf) for {bad.numel()} of {batch} "
                                 f"tasks, the first task {int(bad[0])}; the contract expects finite predictions")
    return query, every


def predict(candidate: Candidate, task, tokens: torch.Tensor) -> Predictions:
    """The model's predictions on every task of `tokens`, run in chunks that bound memory."""
    queries, everys = [], []
    size = TASKS_PER_PASS if candidate.zoo_model is None else tasks_per_pass(candidate.zoo_model, tokens.shape[1])
    with torch.no_grad():
        for chunk in tokens.split(size):
            query, every = read_output(candidate.run(chunk), task, candidate, chunk.shape[0])
            queries.append(query.detach().double().cpu())
            everys.append(None if every is None else every.detach().double().cpu())
    every = torch.cat(everys) if all(e is not None for e in everys) else None
    return Predictions(torch.cat(queries), every)


class _QueryModel:
    """`predict_query` over a candidate: what zoo.evaluate's autograd helpers call."""

    def __init__(self, candidate: Candidate, task):
        self.candidate, self.task = candidate, task

    def predict_query(self, tokens: torch.Tensor) -> torch.Tensor:
        return read_output(self.candidate.run(tokens), self.task, self.candidate, tokens.shape[0])[0]


def finite_difference_sensitivities(query_model: _QueryModel, task, tokens: torch.Tensor) -> torch.Tensor:
    """∂ŷ/∂x_query (N, d_y, d_x) of a black box by central differences. The step divides by the
    perturbation float32 actually made, so a model linear in x_query gets its Jacobian to rounding."""
    start, stop = task.query_channels
    step = FD_STEP * task.x_scale
    columns = []
    for channel in range(start, stop):
        bump = torch.zeros_like(tokens)
        bump[:, -1, channel] = step
        up, down = tokens + bump, tokens - bump
        made = (up - down)[:, -1, channel].double().unsqueeze(1)  # (N, 1)
        diff = [query_model.predict_query(u).double() - query_model.predict_query(d).double()
                for u, d in zip(up.split(TASKS_PER_PASS), down.split(TASKS_PER_PASS))]
        columns.append(torch.cat(diff) / made)
    return torch.stack(columns, dim=-1)  # (N, d_y, d_x)


def sensitivities(candidate: Candidate, task, tokens: torch.Tensor, method: str) -> tuple[torch.Tensor | None, str]:
    """(∂ŷ/∂x_query (N, d_y, d_x) or None, the method used): autograd where the model is differentiable,
    central finite differences for a black box, or none."""
    differentiable = method in ("auto", "autograd") and candidate.differentiable and _has_gradient(candidate, task, tokens[:2])
    if method == "auto":
        method = "autograd" if differentiable else "finite differences"
    elif method == "autograd" and not differentiable:
        raise BenchmarkError(f"{candidate.name}: autograd does not reach its predictions from the tokens; "
                             "use sensitivity='finite differences'")
    if method == "autograd" and candidate.zoo_model is not None:  # a recurrent model's Jacobian is one `step`'s
        model = candidate.zoo_model
        tokens = tokens.to(next(model.parameters()))
        return query_sensitivities(model, tokens, task.query_channels).double().cpu(), method
    query_model = _QueryModel(candidate, task)
    if method == "autograd":
        return predictions_and_sensitivities(query_model, tokens, task.query_channels)[1].double().cpu(), method
    if method == "finite differences":
        with torch.no_grad():
            return finite_difference_sensitivities(query_model, task, tokens), method
    return None, "none"


def _has_gradient(candidate: Candidate, task, tokens: torch.Tensor) -> bool:
    probe = tokens.detach().clone().requires_grad_(True)
    return read_output(candidate.run(probe), task, candidate, probe.shape[0])[0].requires_grad


# ---------------------------------------------------------------- metrics
def per_task_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The task's loss (½·MSE) of each task: (N,) float64; their mean is the split's loss."""
    return 0.5 * ((pred.double() - target.double()) ** 2).flatten(1).mean(1)


def mean_se(values: torch.Tensor) -> tuple[float, float]:
    """Mean and its standard error over tasks."""
    n = values.numel()
    se = float(values.std(unbiased=True) / math.sqrt(n)) if n > 1 else float("nan")
    return float(values.mean()), se


def loss_summary(key: str, losses: torch.Tensor, gd: torch.Tensor | None = None, paired: str = "gd_paired") -> dict:
    """{key, key_se}: the mean loss and its standard error; given GD's per-task losses `gd`, also the
    paired difference from GD with its standard error, {paired_diff, paired_se}."""
    mean, se = mean_se(losses)
    out = {key: mean, f"{key}_se": se}
    if gd is not None:
        out[f"{paired}_diff"], out[f"{paired}_se"] = mean_se(losses - gd)
    return out


@dataclass
class References:
    """What GD and least squares reach on a split's tasks, per task, beside which a model is scored."""

    b64: object  # the split's TaskBatch in float64
    gd_pred: torch.Tensor  # one GD step at η*: (N, d_y)
    gd_losses: torch.Tensor  # (N,)
    metrics: dict  # gd_loss ± se, lstsq_loss ± se with its paired difference from GD, k-step GD, per-position baselines


def references(task: LinearRegressionTask, batch, gd_steps: Sequence[int] = GD_STEPS, *, tuning=None,
               tuned_on: str = "the scored tasks") -> References:
    """One GD step at the analytic η* (the card's GD reference), k-step GD for k in `gd_steps` at the rate
    k steps do best with on these tasks (`best_eta`: one number fitted on them, as the blogpost's empirical η* is),
    k-step GD with a rate of its own for each step, fitted on `tuning` (a TaskBatch: the validation split's,
    named `tuned_on`; without one, on these tasks) by `per_step_etas`, and least squares, each per task; on
    `triples`, the per-position baselines of zoo.evaluate."""
    b64 = task.batch_from_arrays(batch.x.double(), batch.y.double())
    target, eta = b64.query_targets, task.analytic_eta()
    gd_pred = gd_predict(b64, eta)
    gd_losses = per_task_loss(gd_pred, target)
    metrics = {**loss_summary("gd_loss", gd_losses), "gd_eta": eta, "gd_steps": 1,
               **loss_summary("lstsq_loss", per_task_loss(least_squares_predict(b64), target), gd_losses, "lstsq_gd_paired")}
    metrics["gd_k_steps"] = [_k_step_gd(task, b64, k, gd_losses) for k in gd_steps]
    t64 = b64 if tuning is None else task.batch_from_arrays(tuning.x.double(), tuning.y.double())
    metrics[PER_STEP_KEY] = [_per_step_gd(task, b64, t64, k, gd_losses, tuned_on) for k in gd_steps]
    if task.every_position:
        metrics.update(position_baselines(task, b64))
    return References(b64, gd_pred, gd_losses, metrics)


_REFERENCES: dict = {}  # (task, split SHA-256, k's) → References: each split's are computed once per process
_REFERENCES_KEPT = 4
TUNING_SPLIT = "validation"  # the split the per-step rates are fitted on, whichever split is scored


def split_references(task: LinearRegressionTask, frozen, gd_steps: Sequence[int] = GD_STEPS) -> References:
    """`references` of a frozen split, remembered by its content hash (a leaderboard or a re-check scores
    many models on one split; the k-step line searches are the slow part). The per-step rates are fitted on
    the task's validation split (hash-checked as every split is) and evaluated on `frozen`."""
    key = (task, frozen.sha256, tuple(gd_steps))
    if key not in _REFERENCES:
        while len(_REFERENCES) >= _REFERENCES_KEPT:
            _REFERENCES.pop(next(iter(_REFERENCES)))
        task_name, split = frozen.name.rsplit("/", 1)
        tuning = frozen if split == TUNING_SPLIT else load_frozen(task_name, TUNING_SPLIT)[2]
        _REFERENCES[key] = references(task, frozen.batch(task), gd_steps, tuning=tuning.batch(task),
                                      tuned_on=tuning.name)
    return _REFERENCES[key]


def _k_step_gd(task, b64, steps: int, gd_losses: torch.Tensor) -> dict:
    eta = best_eta(task, b64, steps)
    losses = per_task_loss(gd_predict(b64, eta, steps), b64.query_targets)
    return {"steps": steps, "eta": eta, **loss_summary("loss", losses, gd_losses)}


PER_STEP_KEY = "gd_k_steps_per_step_rates"  # the record's k-step GD references with a rate for each step


def _per_step_gd(task, b64, t64, steps: int, gd_losses: torch.Tensor, tuned_on: str) -> dict:
    etas = per_step_etas(task, t64, steps)
    losses = per_task_loss(gd_predict_per_step(b64, etas), b64.query_targets)
    return {"steps": steps, "etas": etas, "tuned_on": tuned_on, **loss_summary("loss", losses, gd_losses)}


def gd_predict_per_step(b64, etas: Sequence[float]) -> torch.Tensor:
    """The query prediction (N, d_y) of len(etas) GD steps from W = 0, step j at rate etas[j]:
    W ← W + η_j (G − W S), G = Σ_i y_i x_iᵀ, S = Σ_i x_i x_iᵀ (gd_weights' step with a rate per step)."""
    x = b64.x_context
    g, s = b64.y_context.transpose(1, 2) @ x, x.transpose(1, 2) @ x
    w = torch.zeros_like(g)
    for eta in etas:
        w = w + eta * (g - w @ s)
    return (w @ b64.x_query.unsqueeze(-1)).squeeze(-1)


def per_step_etas(task, b64, steps: int, sweeps: int = 50) -> list[float]:
    """The rates η_1..η_k with which k GD steps from W = 0 do best on these tasks (the loss the task
    defines, ½·MSE at the query), in increasing order.

    k steps leave W_k = G S⁻¹ (I − q(S)) with q(s) = Π_j (1 − η_j s): the steps commute, and the prediction
    is linear in q's coefficients, ŷ = −Σ_m a_m G S^(m−1) x_q for q(s) = 1 + Σ_m a_m s^m. So the best
    polynomial of degree k with q(0) = 1 is one least-squares solve, and where its roots are real the rates
    are their reciprocals: the best k steps exactly, over every choice of rates. Where a root is complex no
    real rates reach it; then the rates are polished one at a time (`_polish_rates`). The result is never
    worse on these tasks than `best_eta`'s one rate for every step."""
    shared = best_eta(task, b64, steps)
    target = b64.query_targets

    def loss(etas) -> float:
        return task.loss(gd_predict_per_step(b64, etas), target).item()

    x = b64.x_context
    g, s = b64.y_context.transpose(1, 2) @ x, x.transpose(1, 2) @ x
    v, features = b64.x_query.unsqueeze(-1), []
    for m in range(1, steps + 1):  # h_m = η̄^m G S^(m−1) x_q: in units of the shared rate η̄, well scaled
        features.append(shared**m * (g @ v).squeeze(-1))
        v = s @ v
    f = torch.stack(features, -1).reshape(-1, steps)  # (N·d_y, k)
    beta = torch.linalg.lstsq(f, target.reshape(-1, 1)).solution.squeeze(1)  # ŷ = Σ β_m h_m, q(u) = 1 − Σ β_m u^m
    roots = np.roots(np.concatenate([-beta.numpy()[::-1], [1.0]]))  # in u = η̄ s
    diagonal = [shared] * steps
    if len(roots) == steps and np.all(np.abs(roots.imag) <= 1e-9 * np.abs(roots)):
        exact = sorted(float(shared / u) for u in roots.real)
        if loss(exact) <= loss(diagonal):
            return exact
    # No real rates reach the best polynomial. The loss is symmetric in the rates, so equal rates are a
    # stationary point one rate at a time: polish from the roots' real parts and from rates spread about η̄.
    starts = [[shared * (1 + (j - (steps - 1) / 2) / steps) for j in range(steps)]]
    if len(roots) == steps and np.all(roots.real != 0):
        starts.append([float(shared / u) for u in roots.real])
    polished = [_polish_rates(b64, start, loss, sweeps) for start in starts]
    return sorted(min([diagonal, *polished], key=loss))


def _polish_rates(b64, etas: list[float], loss, sweeps: int) -> list[float]:
    """Coordinate descent on the rates: the prediction is affine in each η_j, so each step is the closed-form
    best η_j given the others, and none raises the loss."""
    target, current = b64.query_targets, loss(etas)
    for _ in range(sweeps):
        before = current
        for j in range(len(etas)):
            at0 = gd_predict_per_step(b64, etas[:j] + [0.0] + etas[j + 1:])
            slope = gd_predict_per_step(b64, etas[:j] + [1.0] + etas[j + 1:]) - at0
            denominator = float((slope * slope).sum())
            if denominator > 0:
                trial = etas[:j] + [float(((target - at0) * slope).sum()) / denominator] + etas[j + 1:]
                if (trial_loss := loss(trial)) <= current:
                    etas, current = trial, trial_loss
        if before - current <= 1e-12 * before:
            break
    return etas


def gd_polynomial(b64, steps: int) -> torch.Tensor:
    """The query prediction of `steps` GD steps from W = 0 as the polynomial in η it is, ŷ(η) = Σ_m η^m c_m:
    the coefficients c_1..c_k (k, N, d_y). W ← W + η (G − W S) with G = Σ_i y_i x_iᵀ and S = Σ_i x_i x_iᵀ
    (zoo.science.tasks.regression.gd_weights) gives each step's coefficients from the last ones."""
    x = b64.x_context
    g, s = b64.y_context.transpose(1, 2) @ x, x.transpose(1, 2) @ x
    coefficients = g.new_zeros((steps, *g.shape))  # of η^1 … η^k in W, updated all at once each step
    for _ in range(steps):
        coefficients = torch.cat([coefficients[:1] + g, coefficients[1:] - coefficients[:-1] @ s])
    return (coefficients @ b64.x_query.unsqueeze(-1)).squeeze(-1)


def best_eta(task, b64, steps: int) -> float:
    """The rate at which `steps` GD steps do best on these tasks: resolve_eta's golden-section search over
    the same range, each trial evaluated from `gd_polynomial` instead of by running the steps again."""
    c = gd_polynomial(b64, steps)
    exponents = torch.arange(1, steps + 1, dtype=c.dtype).view(-1, 1, 1)

    def loss(eta: float) -> float:
        return task.loss((eta**exponents * c).sum(0), b64.query_targets).item()

    return line_search_eta(loss, 0.0, 2.5 * task.analytic_eta())


def score(candidate: Candidate, task, batch, *, gd_steps: Sequence[int] = GD_STEPS, sensitivity: str = "auto",
          refs: References | None = None) -> dict:
    """The metrics of `candidate` on `batch` (a frozen split of `task`); `refs` when already computed."""
    if sensitivity not in SENSITIVITY_METHODS:
        raise ValueError(f"sensitivity={sensitivity!r}: expected one of {', '.join(SENSITIVITY_METHODS)}")
    candidate.check_inputs(task)
    tokens = batch.tokens
    pred = predict(candidate, task, tokens)
    if not task.has_gd_reference:  # a teacher–student task has no GD or least-squares reference
        return {**loss_summary("test_loss", per_task_loss(pred.every, batch.targets)), "n_tasks": int(tokens.shape[0]),
                "output": "every position", "sensitivity": "none"}
    refs = refs or references(task, batch, gd_steps)
    metrics = {**loss_summary("test_loss", per_task_loss(pred.query, refs.b64.query_targets), refs.gd_losses),
               **refs.metrics, "n_tasks": int(tokens.shape[0]),
               "output": "every position" if pred.every is not None else "query"}
    sens, method = sensitivities(candidate, task, tokens, sensitivity)
    if sens is not None:
        metrics.update(alignment(pred.query, sens, refs.b64, refs.metrics["gd_eta"]))
    else:
        metrics["pred_l2_to_gd"] = float(((pred.query - refs.gd_pred) ** 2).sum(1).mean())
    metrics["sensitivity"] = method
    if task.every_position and pred.every is not None:
        metrics["position_loss"] = position_loss(pred.every, refs.b64)
    return metrics


# ---------------------------------------------------------------- records
def load_frozen(task_name: str, split: str):
    """(task spec, task, frozen split) from the registry: the split is hash-checked against it."""
    from zoo.science.registry import get_task_spec
    from zoo.science.tasks.frozen import load_split

    spec = get_task_spec(task_name)
    return spec, spec.build(), load_split(task_name, split, spec=spec)


def evaluate(model, *, task: str, split: str = "test", name: str | None = None, readout=None,
             gd_steps: Sequence[int] = GD_STEPS, sensitivity: str = "auto", revision: str | None = None,
             endpoint: str | None = None, time_limit: float | None = None, memory_limit: int | None = None,
             output_limit: int | None = None) -> dict:
    """Score `model` (see the module docstring) on the frozen `split` of registry task `task`: a record
    with the split's and the model's SHA-256, the zoo version and the metrics. `readout` overrides the
    model's own; `sensitivity` is "auto", "autograd", "finite differences" or "none"; `revision` and
    `endpoint` reach a Hub repo. An outside ONNX graph runs under `time_limit` (seconds in all),
    `memory_limit` (bytes above its process's start) and `output_limit` (bytes per call): see `Limits`."""
    gd_steps = checked_gd_steps(gd_steps)
    with bounds(time_limit, memory_limit, output_limit):
        candidate = as_candidate(model, name=name, readout=readout, revision=revision, endpoint=endpoint)
    try:
        _, task_obj, frozen = load_frozen(task, split)
        refs = split_references(task_obj, frozen, gd_steps) if task_obj.has_gd_reference else None
        metrics = score(candidate, task_obj, frozen.batch(task_obj), sensitivity=sensitivity, refs=refs)
    finally:
        candidate.close()
    return {"format": RECORD_FORMAT, "task": task, "split": split, "dataset": frozen.name,
            "dataset_sha256": frozen.sha256, "model": candidate.identity, "zoo_version": __version__,
            "metrics": metrics}


def checked_gd_steps(steps, where: str = "gd_steps") -> tuple[int, ...]:
    """The k's of the k-step GD references: at most MAX_GD_REFERENCES ints, each 1..MAX_GD_STEPS, or one line."""
    expected = f"at most {MAX_GD_REFERENCES} step counts, each an integer from 1 to {MAX_GD_STEPS}"
    if isinstance(steps, (str, bytes, dict)) or not isinstance(steps, Sequence) or len(steps) > MAX_GD_REFERENCES:
        raise BenchmarkError(f"{where}: {_shown(steps)} is not {expected}")
    for k in steps:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_GD_STEPS:
            raise BenchmarkError(f"{where}: steps {_shown(k)} is not an integer from 1 to {MAX_GD_STEPS} ({expected})")
    return tuple(steps)


def _shown(value, width: int = 60) -> str:
    """A value of a record as one short printable line (a record is anyone's JSON)."""
    text = repr(value)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass
class Verdict:
    confirmed: bool
    message: str  # one line


def _numbers(value, path: str = ""):
    """(path, number) for every number in a record's metrics, nested lists and dicts included."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{path}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, float(value)


def _is_number(value) -> bool:
    """An int or a float, not a bool, finite: what a record's number must be."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float's range: 10**400
        return False


def _rescoring_parameters(record) -> tuple[str, str, tuple[int, ...], str]:
    """(task, split, k's of the k-step GD references, sensitivity method) from a record, each checked and
    bounded before anything runs; one line otherwise."""
    shape = (f"not a benchmark record ({RECORD_FORMAT}): expected task, split and metrics as "
             "`zoo eval MODEL --task TASK --json` writes them")
    if not isinstance(record, dict) or not isinstance(record.get("metrics"), dict):
        raise BenchmarkError(shape)
    task, split, recorded = record.get("task"), record.get("split"), record["metrics"]
    for key, value in (("task", task), ("split", split)):
        if not (isinstance(value, str) and RECORD_NAME.fullmatch(value)):
            raise BenchmarkError(f"{shape}; its {key} is {_shown(value)}")
    k_steps = recorded.get("gd_k_steps", [{"steps": k} for k in GD_STEPS])  # none on a teacher–student task
    if not isinstance(k_steps, list) or len(k_steps) > MAX_GD_REFERENCES or not all(
            isinstance(k, dict) and "steps" in k for k in k_steps):
        raise BenchmarkError(f"the record's gd_k_steps {_shown(k_steps)} is not a list of at most "
                             f"{MAX_GD_REFERENCES} k-step references, each with its steps")
    steps = checked_gd_steps([k["steps"] for k in k_steps], "the record's gd_k_steps")
    sensitivity = recorded.get("sensitivity", "auto")
    if not (isinstance(sensitivity, str) and sensitivity in SENSITIVITY_METHODS):
        raise BenchmarkError(f"the record's sensitivity {_shown(sensitivity)} is not one of "
                             f"{', '.join(SENSITIVITY_METHODS)}")
    return task, split, steps, sensitivity


def _binding_problems(record: dict) -> list[str]:
    """What a record lacks of what binds it (format, zoo version, split and model SHA-256, a non-empty
    metrics object): refuted before anything is re-scored."""
    problems = []
    if record.get("format") != RECORD_FORMAT:
        problems.append(f"its format is {_shown(record.get('format'))}, expected {RECORD_FORMAT!r}")
    if record.get("zoo_version") != __version__:
        problems.append(f"it was scored by icl-zoo {_shown(record.get('zoo_version'))}, this is icl-zoo {__version__} "
                        "(re-score it with the version that wrote it)")
    if not (isinstance(record.get("dataset_sha256"), str) and SHA256.fullmatch(record["dataset_sha256"])):
        problems.append(f"its split SHA-256 is {_shown(record.get('dataset_sha256'))}")
    model = record.get("model")
    if not (isinstance(model, dict) and isinstance(model.get("kind"), str) and isinstance(model.get("name"), str)):
        problems.append(f"its model is {_shown(model)}, expected the kind, name and SHA-256 of the model scored")
    if not record["metrics"]:
        problems.append("its metrics are empty")
    return problems


def _compare(recorded, rescored, path: str, rtol: float, problems: list[str]) -> None:
    """Every number, string and list of `rescored` must be in `recorded` at the same place, the same kind
    and (numbers) finite and within `rtol`; anything else the record holds is reported as not re-scored."""
    where = path or "metrics"
    if isinstance(rescored, dict):
        if not isinstance(recorded, dict):
            problems.append(f"{where} recorded {_shown(recorded)}, re-scored an object")
            return
        for key, value in rescored.items():
            inner = f"{path}.{key}" if path else str(key)
            if key in recorded:
                _compare(recorded[key], value, inner, rtol, problems)
            else:
                problems.append(f"{inner} missing from the record")
        extra = [key for key in recorded if key not in rescored]
        if extra:
            shown = ", ".join(_shown(k, 30) for k in extra[:3]) + (f" (and {len(extra) - 3} more)" if len(extra) > 3 else "")
            problems.append(f"{where} holds {shown}, which the re-score does not produce")
    elif isinstance(rescored, list):
        if not isinstance(recorded, list) or len(recorded) != len(rescored):
            problems.append(f"{where} recorded {_shown(recorded)}, re-scored a list of {len(rescored)}")
            return
        for i, (theirs, mine) in enumerate(zip(recorded, rescored)):
            _compare(theirs, mine, f"{path}[{i}]", rtol, problems)
    elif isinstance(rescored, (int, float)) and not isinstance(rescored, bool):
        if not _is_number(recorded):
            problems.append(f"{where} recorded {_shown(recorded)}, not a finite number (re-scored {rescored:.9g})")
        elif not math.isfinite(rescored):
            problems.append(f"{where} re-scored {rescored}, not a finite number")
        elif not _agree(float(rescored), float(recorded), rtol):
            problems.append(f"{where} recorded {recorded:.9g}, re-scored {rescored:.9g}")
    elif recorded != rescored or type(recorded) is not type(rescored):  # the output and sensitivity methods
        problems.append(f"{where} recorded {_shown(recorded)}, re-scored {_shown(rescored)}")


def check(record: dict, model, *, revision: str | None = None, endpoint: str | None = None,
          rtol: float = CHECK_RTOL, time_limit: float | None = None, memory_limit: int | None = None,
          output_limit: int | None = None) -> Verdict:
    """Score `model` again as `record` says it was scored and compare. Confirmed only when the record holds
    the format, the task and split, the split's SHA-256, the model's identity (file or weights SHA-256; a
    function's name), the zoo version and every number the re-score produces, each finite and within
    `rtol`. The record's re-scoring parameters (task, split, k-step GD, sensitivity method) are checked
    and bounded first: a malformed one is refused in one line (`BenchmarkError`), before anything runs."""
    task, split, steps, sensitivity = _rescoring_parameters(record)
    problems = _binding_problems(record)
    if problems:
        return _refuted(f"the record {record['task']}/{record['split']}", problems)
    rescored = evaluate(model, task=task, split=split, gd_steps=steps, sensitivity=sensitivity,
                        revision=revision, endpoint=endpoint, time_limit=time_limit, memory_limit=memory_limit,
                        output_limit=output_limit)
    what = f"{rescored['model']['name']} on {rescored['dataset']}"
    if record["dataset_sha256"] != rescored["dataset_sha256"]:
        problems.append(f"the record's split has SHA-256 {record['dataset_sha256']}, this one {rescored['dataset_sha256']}")
    if record.get("dataset", rescored["dataset"]) != rescored["dataset"]:
        problems.append(f"the record's split is {_shown(record['dataset'])}, this one {rescored['dataset']}")
    mine, theirs = rescored["model"], record["model"]
    if theirs["kind"] != mine["kind"]:
        problems.append(f"the record scored a {_shown(theirs['kind'])}, this is a {mine['kind']}")
    key = "sha256" if "sha256" in mine else "name"  # what identifies this kind of model: never the record's choice
    if theirs.get(key) != mine.get(key):
        problems.append(f"the record scored a model with {key} {_shown(theirs.get(key), 70)}, this one has {mine.get(key)}")
    _compare(record["metrics"], rescored["metrics"], "", rtol, problems)
    if problems:
        return _refuted(what, problems)
    n = sum(1 for _ in _numbers(rescored["metrics"]))
    return Verdict(True, f"confirmed: {what} (split SHA-256 {rescored['dataset_sha256'][:12]}…): "
                         f"{n} numbers re-scored to within a relative {rtol:g}")


def _refuted(what: str, problems: list[str]) -> Verdict:
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return Verdict(False, f"refuted: {what}: {'; '.join(problems[:3])}{more}")


def _agree(a: float, b: float, rtol: float) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12)


def summary_lines(record: dict) -> list[str]:
    """The record in words, for `zoo eval` without --json."""
    m, model = record["metrics"], record["model"]
    scored = (f"{model['name']} ({model['kind']}) on {record['dataset']} ({m['n_tasks']} tasks, SHA-256 "
              f"{record['dataset_sha256']}); output: {m['output']}")
    lines = [scored, f"test loss {_pm(m, 'test_loss')}"]
    if "gd_loss" in m:
        cosine = f"{m['sensitivity_cosine']:.6f} ({m['sensitivity']})" if "sensitivity_cosine" in m else "not computed"
        lines.append(f"one GD step (η* = {m['gd_eta']:.4g}) {_pm(m, 'gd_loss')}; model − GD {m['gd_paired_diff']:+.4g} "
                     f"± {m['gd_paired_se']:.2g} (paired)")
        lines += [f"{k['steps']} GD step{'s' * (k['steps'] > 1)} (η = {k['eta']:.4g}) {k['loss']:.6g} ± {k['loss_se']:.2g}"
                  for k in m["gd_k_steps"]]
        lines += [f"{k['steps']} GD steps, a rate each (η = {', '.join(f'{e:.4g}' for e in k['etas'])}, fitted on "
                  f"{k['tuned_on']}) {k['loss']:.6g} ± {k['loss_se']:.2g}" for k in m.get(PER_STEP_KEY, [])]
        lines.append(f"least squares {_pm(m, 'lstsq_loss')}")
        lines.append(f"prediction gap to GD {m['pred_l2_to_gd']:.4g}; sensitivity cosine to GD {cosine}")
    if "position_loss" in m:
        lines.append("loss by position: " + " ".join(f"{x:.3g}" for x in m["position_loss"]))
    return lines


def _pm(m: dict, key: str) -> str:
    return f"{m[key]:.6g} ± {m[f'{key}_se']:.2g}"
