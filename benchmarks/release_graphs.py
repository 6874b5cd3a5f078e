"""Every released model.onnx on its whole frozen test split, as a card's snippet runs it, beside the chunk path.

For each released entry: the whole-sequence graph (model.onnx) fed the full test split (10,000 tasks) in one
`run`, in a fresh child process on one thread with only onnxruntime and numpy loaded: its first run's seconds,
its steady tokens/s (best of --repeats runs) and the child's peak resident memory, all of it (Python, ONNX Runtime,
the split's tokens and the outputs: what a snippet's process holds), beside its growth over the resident memory
before the first run (a graph growing past --memory-limit is stopped and shown as over it). Beside it, in the same
run: the chunk path (`StreamingSession`: its first push of the split, which includes choosing a chunk graph, and
a steady push), and the model's FLOPs per token with the percent of the dense matmul floor that model.onnx
reaches. The floor is measured in this run (the largest-weight-shaped float32 MatMul on one thread, ONNX
Runtime or numpy, the faster; benchmarks/streaming.py `matmul_floor`).

FLOPs per token are counted on the step graph (recurrent models) or on one block of the sequence graph (the
rest), at batch 1: 2·K·N per MatMul or Gemm by a K × N matrix (2·M·K·N for a product of two activations), one
per output element of each elementwise op (a K = 1 MatMul, the rewrites' outer products and widenings, counts
one per element); ONNX's LSTM/GRU ops, 2 per weight per token and direction (their gates' elementwise work left out).

The target (issue 52): ≤ 1 GiB and ≥ 1M tokens/s on one thread, or ≥ 25% of the floor where 1M tokens/s is
above it. Rows come worst first (tokens/s over the target).

    python benchmarks/release_graphs.py                       # every released entry
    python benchmarks/release_graphs.py --only mamba-1d gated-rnn-zucchet-icl --repeats 3
    python benchmarks/release_graphs.py --json raw.json       # and the raw rows
    python benchmarks/release_graphs.py --kernels             # the kernel table behind export/graph_rewrite.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: the floor's numpy MatMul on one thread
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streaming import matmul_floor  # noqa: E402  (a sibling script)

from export.choices import cpu_model  # noqa: E402

TARGET_TOKENS_PER_S = 1e6
TARGET_FLOOR_SHARE = 0.25
MEMORY_TARGET = 1 << 30

CHILD = r"""
import json, resource, sys, time
import numpy as np, onnxruntime as ort
path, tokens_path, repeats, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tokens = np.load(tokens_path)
options = ort.SessionOptions()
options.intra_op_num_threads = options.inter_op_num_threads = 1
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
page = resource.getpagesize()
virtual, resident = (int(v) * page for v in open("/proc/self/statm").read().split()[:2])
resource.setrlimit(resource.RLIMIT_AS, (virtual + limit, resource.RLIM_INFINITY))  # the graph's growth is capped
times = []
for _ in range(1 + repeats):
    start = time.perf_counter()
    (out,) = session.run(None, {"tokens": tokens})
    times.append(time.perf_counter() - start)
# VmHWM, not ru_maxrss: ru_maxrss survives exec, so it would count the parent's (torch-laden) image at fork
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"first_s": times[0], "steady_s": min(times[1:] or times), "peak_bytes": peak,
                  "growth_bytes": max(0, peak - resident), "out_shape": list(out.shape)}))
"""


def split_tokens(task: str) -> np.ndarray:
    from zoo.publishing.benchmark import load_frozen

    _, task_obj, frozen = load_frozen(task, "test")
    return np.ascontiguousarray(frozen.batch(task_obj).tokens.numpy(), dtype=np.float32)


def run_sequence_graph(path: Path, tokens: np.ndarray, repeats: int, memory_limit: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "tokens.npy", tokens)
        done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(Path(tmp) / "tokens.npy"), str(repeats),
                               str(memory_limit)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["killed"])[-1][:160]
        return {"error": f"over the {memory_limit >> 20} MiB limit or failed: {last}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_chunk_path(folder: Path, tokens: np.ndarray) -> dict:
    from export.streaming import StreamingSession

    session = StreamingSession(folder, threads=1)
    session.reset(batch=tokens.shape[0])
    start = time.perf_counter()
    session.push(tokens)
    first = time.perf_counter() - start
    session.reset(batch=tokens.shape[0])
    start = time.perf_counter()
    session.push(tokens)
    steady = time.perf_counter() - start
    batch = tokens.shape[0]
    graph = "/".join(map(str, session._choice[batch])) if batch in session._choice else "step"  # short pushes: the step graph
    return {"first_push_s": first, "steady_s": steady, "graph": graph, "chosen_by": session.chosen_by.get(batch, "—")}


# ---------------------------------------------------------------- FLOPs per token
def _at_batch_one(model):
    import onnx
    from onnx import shape_inference

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in model.graph.input:
        dim = value.type.tensor_type.shape.dim
        if dim and not dim[0].dim_value:
            dim[0].dim_value = 1
    return shape_inference.infer_shapes(model)


def graph_flops(model, per: int = 1) -> tuple[int, tuple[int, int]]:
    """(FLOPs per token, the largest K × N weight) of `model` at batch 1, `per` tokens per run (module doc)."""
    m = _at_batch_one(model)
    weights = {i.name: tuple(i.dims) for i in m.graph.initializer}
    shapes = {v.name: [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
              for v in [*m.graph.value_info, *m.graph.output, *m.graph.input]}
    shapes |= {name: list(dims) for name, dims in weights.items()}
    elementwise = {"Mul", "Add", "Sub", "Div", "Tanh", "Sigmoid", "Exp", "Log", "Relu", "Neg", "Abs", "Where", "Softplus",
                   "Pow", "Sqrt", "Reciprocal", "Erf", "Max", "Min", "Softmax"}
    flops, biggest = 0, (1, 1)
    for n in m.graph.node:
        out = shapes.get(n.output[0])
        if n.op_type in ("MatMul", "Gemm") and out:
            a, b = shapes.get(n.input[0]), shapes.get(n.input[1])
            if not a or not b:
                continue
            k = a[-1] if not (n.op_type == "Gemm" and any(x.name == "transA" and x.i for x in n.attribute)) else a[0]
            flops += int(np.prod(out)) * (2 * k if k > 1 else 1)
            if n.input[1] in weights and len(weights[n.input[1]]) == 2 and k > 1:
                biggest = max(biggest, weights[n.input[1]], key=lambda kn: kn[0] * kn[1])
        elif n.op_type in ("LSTM", "GRU", "RNN") and n.input[1] in weights and n.input[2] in weights:
            steps = shapes.get(n.input[0], [1])[0]  # ONNX's recurrent ops take (T, batch, input)
            flops += steps * 2 * (int(np.prod(weights[n.input[1]])) + int(np.prod(weights[n.input[2]])))
        elif n.op_type in elementwise and out:
            flops += int(np.prod(out))
    return flops // per, biggest


def count_flops(folder: Path, n_tokens: int) -> tuple[int, tuple[int, int]]:
    import onnx

    step = folder / "model_step.onnx"
    if step.is_file():
        return graph_flops(onnx.load(str(step)))
    sequence = onnx.load(str(folder / "model.onnx"))  # one block: the body of its batch Scan, at T = the task's
    scan = next(n for n in sequence.graph.node if n.op_type == "Scan")
    body = next(a.g for a in scan.attribute if a.name == "body")
    block = onnx.helper.make_graph(list(body.node), "block", list(body.input), list(body.output), list(body.initializer))
    block.input[0].type.tensor_type.shape.dim[1].dim_value = n_tokens
    model = onnx.helper.make_model(block, opset_imports=list(sequence.opset_import), ir_version=sequence.ir_version)
    return graph_flops(model, per=n_tokens)


# ---------------------------------------------------------------- the table
def measure_entry(name: str, root: Path, tokens: np.ndarray, repeats: int, memory_limit: int, floors: dict) -> dict:
    folder = root / name
    n_tasks, n_tokens = tokens.shape[:2]
    row = {"entry": name, "tasks": n_tasks, "tokens_per_task": n_tokens}
    row |= run_sequence_graph(folder / "model.onnx", tokens, repeats, memory_limit)
    if "steady_s" in row:
        row["tokens_per_s"] = n_tasks * n_tokens / row["steady_s"]
    flops, biggest = count_flops(folder, n_tokens)
    if biggest not in floors:
        floors[biggest] = max(matmul_floor(*biggest).values())
    floor = floors[biggest] * 1e9 / flops
    row |= {"flops_per_token": flops, "floor_gflops": floors[biggest], "floor_tokens_per_s": floor,
            "target_tokens_per_s": TARGET_TOKENS_PER_S if floor >= TARGET_TOKENS_PER_S else TARGET_FLOOR_SHARE * floor}
    if "tokens_per_s" in row:
        row["floor_percent"] = 100 * row["tokens_per_s"] / floor
        row["at_target"] = row["tokens_per_s"] >= row["target_tokens_per_s"] and row["peak_bytes"] <= MEMORY_TARGET
    if (folder / "model_step.onnx").is_file():
        chunk = run_chunk_path(folder, tokens)
        row |= {"chunk_first_push_s": chunk["first_push_s"], "chunk_tokens_per_s": n_tasks * n_tokens / chunk["steady_s"],
                "chunk_graph": chunk["graph"], "chunk_chosen_by": chunk["chosen_by"]}
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| entry | tasks × T | model.onnx first run s | tokens/s | peak MiB (growth) | FLOPs/token | % of floor | "
             "target tokens/s | at target | chunk path tokens/s | chunk first push s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['entry']} | {r['tasks']} × {r['tokens_per_task']} | {r['error']} |||||||||")
            continue
        chunk = (f"{r['chunk_tokens_per_s'] / 1e6:.2f}M ({r['chunk_graph']}) | {r['chunk_first_push_s']:.2f} "
                 f"({r['chunk_chosen_by']})"
                 if "chunk_tokens_per_s" in r else "— (not recurrent) | —")
        lines.append(f"| {r['entry']} | {r['tasks']} × {r['tokens_per_task']} | {r['first_s']:.2f} | "
                     f"{r['tokens_per_s'] / 1e6:.2f}M | {r['peak_bytes'] / 2**20:.0f} ({r['growth_bytes'] / 2**20:.0f}) | "
                     f"{r['flops_per_token']:,} | "
                     f"{r['floor_percent']:.1f}% | {r['target_tokens_per_s'] / 1e6:.2f}M | {'yes' if r['at_target'] else 'no'} | "
                     f"{chunk} |")
    return "\n".join(lines)


def kernels() -> None:
    """The kernel table in export/graph_rewrite.py's docstring: each slow form beside its rewrite, one thread."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    def session(nodes, inputs, inits=()):
        graph = helper.make_graph(nodes, "k", [helper.make_tensor_value_info(n, 1, s) for n, s in inputs],
                                  [helper.make_tensor_value_info("y", 1, None)], list(inits))
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        return ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(),
                                    options, providers=["CPUExecutionProvider"])

    def best_us(s, feeds):
        s.run(None, feeds)
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            s.run(None, feeds)
            times.append(time.perf_counter() - t0)
        return 1e6 * min(times)

    rng = np.random.default_rng(0)
    a, b = rng.random((256, 64, 1), np.float32), rng.random((256, 1, 16), np.float32)
    h, x = rng.random((256, 64, 16), np.float32), rng.random((256, 64), np.float32)
    A = numpy_helper.from_array(rng.random((64, 16), np.float32), "A")
    one = numpy_helper.from_array(np.ones(1, np.float32), "one")
    rows = [
        ("Mul (256, 64, 1) × (256, 1, 16)", session([helper.make_node("Mul", ["a", "b"], ["y"])], [("a", [256, 64, 1]), ("b", [256, 1, 16])]), {"a": a, "b": b},
         "MatMul of the same", session([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", [256, 64, 1]), ("b", [256, 1, 16])]), {"a": a, "b": b}),
        ("Mul (256, 64, 1) × (64, 16)", session([helper.make_node("Mul", ["a", "A"], ["y"])], [("a", [256, 64, 1])], [A]), {"a": a},
         "Mul of same shapes", session([helper.make_node("Mul", ["h", "g"], ["y"])], [("h", [256, 64, 16]), ("g", [256, 64, 16])]), {"h": h, "g": h}),
        ("Softplus (256, 64)", session([helper.make_node("Softplus", ["x"], ["y"])], [("x", [256, 64])]), {"x": x},
         "Exp, Add, Log", session([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Add", ["e", "one"], ["f"]),
                                   helper.make_node("Log", ["f"], ["y"])], [("x", [256, 64])], [one]), {"x": x}),
    ]
    print("| slow form | µs | rewrite | µs |\n|---|---|---|---|")
    for slow, s1, f1, fast, s2, f2 in rows:
        print(f"| {slow} | {best_us(s1, f1):.0f} | {fast} | {best_us(s2, f2):.0f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", help="these released entries (default: all)")
    parser.add_argument("--release", type=Path, help="release folder (default: the shipped one)")
    parser.add_argument("--repeats", type=int, default=2, help="steady runs after the first (default 2)")
    parser.add_argument("--memory-limit", type=int, default=4096, help="MiB a child may use above its start (default 4096)")
    parser.add_argument("--json", type=Path, help="also write the raw rows here")
    parser.add_argument("--kernels", action="store_true", help="print the kernel table of export/graph_rewrite.py and stop")
    args = parser.parse_args(argv)
    if args.kernels:
        kernels()
        return 0
    from zoo.science.registry import get_entry
    from zoo.storage.locate import read_index, release_dir

    root = args.release or release_dir()
    names = args.only or sorted(read_index(root)["entries"])
    floors, rows, tokens = {}, [], {}
    for i, name in enumerate(names, 1):
        task = get_entry(name).task
        if task not in tokens:
            tokens[task] = split_tokens(task)
        rows.append(measure_entry(name, Path(root), tokens[task], args.repeats, args.memory_limit << 20, floors))
        r = rows[-1]
        print(f"[{i}/{len(names)}] {name}: " + (r.get("error") or f"{r['tokens_per_s'] / 1e6:.2f}M tokens/s, "
              f"{r['peak_bytes'] / 2**20:.0f} MiB, {r['floor_percent']:.1f}% of floor"), file=sys.stderr, flush=True)
    rows.sort(key=lambda r: r.get("tokens_per_s", 0) / r["target_tokens_per_s"])
    print(f"one thread, {os.cpu_count()} cores ({cpu_model()}); floor GFLOP/s by weight shape: "
          + ", ".join(f"{k}×{n}: {v:.0f}" for (k, n), v in floors.items()))
    print(markdown(rows))
    met = sum(bool(r.get("at_target")) for r in rows)
    print(f"\n{met} of {len(rows)} reach the target (≤ 1 GiB and ≥ 1M tokens/s or ≥ 25% of the floor)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
