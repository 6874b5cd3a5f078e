"""Streaming throughput, latency and memory, all against the ONNX token-at-a-time step measured
in the same run: ONNX Runtime step graph one token per call (the baseline); the chunked path
(`StreamingSession.push(B, T, d)` given blocks of 1,000 tokens: the chunk graph and tokens per run
it measured fastest at that batch, shown in the last column); the step graph scanned over time
inside ORT (what a checkpoint without a chunk graph gets); PyTorch eager `step`; and a
softmax-attention decoder with a KV cache.

Every (method, batch, length) runs in a fresh process: tokens/s over the stream (aggregate over the
batch), the peak RSS growth during the stream (sampled every 1000 tokens) above the RSS after setup,
and, for the step graph, the per-token latency p50/p99. Each row also gives the model's FLOPs per
token (the step graph's: 2·K·N per MatMul by a K×N weight, one per element of every elementwise
op) and the percent of the matmul floor this rate reaches, the floor being measured in the same
run: a (65,536 × K)·(K × N) float32 MatMul on one thread, K × N the step graph's largest weight,
with ONNX Runtime and with numpy, the faster of the two. (The hoisted chunk graph applies
one-nonzero-per-column weights as Gathers, so it can do fewer FLOPs than the dense count.)

    python benchmarks/streaming.py                                  # lengths 1e3 1e4 1e5, batch 1 and 64
    python benchmarks/streaming.py --lengths 10000000 --methods onnx-step onnx-chunk --step-max 100000 --batches 1
                                                                    # flat RSS at 1e7 (step measured at 1e5)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: its BLAS (the matmul floor) on one thread
import numpy as np


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class SoftmaxDecoder:
    """One softmax-attention layer with a KV cache (what a transformer decoder keeps): memory grows with t."""

    def __init__(self, d: int, capacity: int, seed: int = 0):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.wq, self.wk, self.wv, self.wo = (torch.randn(d, d, generator=g) / d**0.5 for _ in range(4))
        # Preallocated cache, as serving stacks do; its pages become resident as rows are written.
        self.k = torch.empty(capacity, d)
        self.v = torch.empty(capacity, d)
        self.t = 0

    def step(self, token):
        import torch

        self.k[self.t] = token[0] @ self.wk.T
        self.v[self.t] = token[0] @ self.wv.T
        self.t += 1
        k, v = self.k[: self.t], self.v[: self.t]
        q = token @ self.wq.T
        att = torch.softmax(k @ q.T / q.shape[-1] ** 0.5, dim=0)  # (t, 1): every step reads the whole cache
        return token + (att.T @ v) @ self.wo.T


def _run(method: str, length: int, batch: int, folder: str, entry: str, queue, cpu_time: bool = False) -> None:
    import torch

    clock = time.process_time if cpu_time else time.perf_counter  # CPU time: less moved by other processes

    torch.set_num_threads(1)
    import zoo
    from export.streaming import StreamingSession

    ckpt = zoo.load(folder)
    d = ckpt.model.d_in
    rng = np.random.default_rng(0)
    scale = (12 / length) ** (1 / 3)  # keeps attention-like sums O(1) over the stream

    def block(start: int, stop: int) -> np.ndarray:  # tokens are generated per block: the input costs no memory
        return (rng.uniform(-1, 1, (batch, stop - start, d)) * scale).astype(np.float32)

    latencies = []
    if method in ("onnx-step", "onnx-chunk", "onnx-scan", "onnx-hoisted", "onnx-parallel"):
        graphs = {"onnx-scan": ("scan",), "onnx-hoisted": ("hoisted",), "onnx-parallel": ("parallel",)}
        session = StreamingSession(folder, threads=1, **({"graphs": graphs[method]} if method in graphs else {}))
        session.reset(batch)
        if method != "onnx-step":
            def run_block(tok):
                session.push(tok)
        else:
            def run_block(tok):
                for t in range(tok.shape[1]):
                    t0 = time.perf_counter()
                    session.push(tok[:, t])
                    if len(latencies) < 20_000:
                        latencies.append(time.perf_counter() - t0)
    elif method == "torch-step":
        model = ckpt.model.eval()
        state = model.init_state(batch)

        def run_block(tok):
            nonlocal state
            tok = torch.from_numpy(tok)
            for t in range(tok.shape[1]):
                _, state = model.step(tok[:, t], state)
    else:
        dec = SoftmaxDecoder(d, length + 100)

        def run_block(tok):
            tok = torch.from_numpy(tok)
            for t in range(tok.shape[1]):
                dec.step(tok[:1, t])  # one stream: its cache is what grows
    with torch.no_grad():
        run_block(block(0, min(1000, length)))  # warm-up (graphs opened, buffers allocated), outside the measurement
        latencies.clear()
        base = peak = _rss_bytes()
        elapsed = 0.0
        for start in range(0, length, 1000):  # RSS sampled every 1000 tokens, outside the timed loop
            tok = block(start, min(start + 1000, length))
            t0 = clock()
            run_block(tok)
            elapsed += clock() - t0
            peak = max(peak, _rss_bytes())
    result = {"tokens_per_s": length * (batch if method != "softmax-kv" else 1) / elapsed,
              "mem_growth_mib": (peak - base) / 2**20}
    if method.startswith("onnx-") and method != "onnx-step":
        result["graph"] = "{}/T={}".format(*session._choose())
    if latencies:
        result["p50_us"], result["p99_us"] = (float(np.percentile(latencies, q)) * 1e6 for q in (50, 99))
    queue.put(result)


def step_flops(step_path: str) -> tuple[int, tuple[int, int]]:
    """(FLOPs per token of the step graph, the largest MatMul weight's (K, N)): 2·K·N per MatMul by a
    constant K×N matrix, one FLOP per output element of each elementwise arithmetic op."""
    import onnx
    from onnx import shape_inference

    m = shape_inference.infer_shapes(onnx.load(step_path))
    inits = {i.name: tuple(i.dims) for i in m.graph.initializer}
    shapes = {v.name: [d.dim_value or 1 for d in v.type.tensor_type.shape.dim[1:]]
              for v in [*m.graph.value_info, *m.graph.output, *m.graph.input]}
    flops, biggest = 0, (1, 1)
    for n in m.graph.node:
        if n.op_type == "MatMul" and len(inits.get(n.input[1], ())) == 2:
            k, c = inits[n.input[1]]
            flops += 2 * k * c
            biggest = max(biggest, (k, c), key=lambda kn: kn[0] * kn[1])
        elif n.op_type in ("Mul", "Add", "Sub", "Div", "Tanh", "Sigmoid", "Exp", "Relu") and n.output[0] in shapes:
            flops += int(np.prod(shapes[n.output[0]]))
    return flops, biggest


def matmul_floor(k: int, n: int, rows: int = 65_536, clock=time.perf_counter) -> dict:
    """GFLOP/s of a (rows × k)·(k × n) float32 MatMul on one thread: ONNX Runtime and numpy (best of 5)."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "floor",
                              [helper.make_tensor_value_info("a", 1, ["rows", k])],
                              [helper.make_tensor_value_info("y", 1, ["rows", n])], [numpy_helper.from_array(w, "w")])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(),
                                   options, providers=["CPUExecutionProvider"])

    def best(fn):
        fn()
        times = []
        for _ in range(5):
            t0 = clock()
            fn()
            times.append(clock() - t0)
        return 2 * rows * k * n / min(times) / 1e9

    return {"onnxruntime": best(lambda: session.run(None, {"a": a})), "numpy": best(lambda: a @ w)}


def measure(method: str, length: int, batch: int, folder: str, entry: str, cpu_time: bool = False) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_run, args=(method, length, batch, folder, entry, q, cpu_time))
    p.start()
    result = q.get()
    p.join()
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entry", default="gated-rnn-gd-zucchet-icl")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--methods", nargs="+", default=["onnx-step", "onnx-chunk", "onnx-scan", "torch-step", "softmax-kv"],
                    help="onnx-step (baseline), onnx-chunk (the graph the session measures fastest), onnx-parallel, "
                         "onnx-scan, onnx-hoisted (each chunk graph forced), torch-step, softmax-kv")
    ap.add_argument("--softmax-max", type=int, default=100_000,
                    help="longest stream for the softmax decoder: its per-token cost grows with t (O(T²) total)")
    ap.add_argument("--step-max", type=int, default=100_000,
                    help="longest stream for the token-at-a-time methods (the chunked path goes further)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the stream in process CPU time (one thread: the work itself, less moved by other "
                         "processes on a shared machine) instead of wall-clock time")
    args = ap.parse_args(argv)

    import onnxruntime as ort
    import torch

    import zoo

    with tempfile.TemporaryDirectory() as tmp:
        folder = str(Path(tmp) / args.entry)
        zoo.build(args.entry, folder, progress=False)
        flops, (k, n) = step_flops(str(Path(folder) / "model_step.onnx"))
        floors = matmul_floor(k, n, clock=time.process_time if args.cpu_time else time.perf_counter)
        floor = max(floors.values())
        print(f"FLOPs per token (step graph, dense): {flops:,}; matmul floor (65,536×{k})·({k}×{n}) fp32, 1 thread, "
              f"this run: onnxruntime {floors['onnxruntime']:.1f}, numpy {floors['numpy']:.1f} GFLOP/s → floor "
              f"{floor:.1f} GFLOP/s = {floor * 1e9 / flops / 1e6:.2f}M tokens/s")
        print(f"clock: {'process CPU time' if args.cpu_time else 'wall'}; entry {args.entry}; torch {torch.__version__}, onnxruntime {ort.__version__}, 1 thread; "
              "ratios against onnx-step at the same batch and length, measured in this run "
              "(past --step-max: against the step at the longest length measured, marked *)")
        print(f"{'batch':>5} {'length':>10} {'method':>13} {'tokens/s':>12} {'vs step':>8} {'FLOP/tok':>8} {'% floor':>7} "
              f"{'Δ peak RSS':>11} {'p50/p99 µs':>14} graph")
        for batch in args.batches:
            base = None
            for length in args.lengths:
                carried = base is not None
                for method in args.methods:
                    too_long = (method == "softmax-kv" and length > args.softmax_max) or \
                               (method in ("onnx-step", "torch-step") and length > args.step_max)
                    if too_long or (method == "softmax-kv" and batch > 1):
                        continue
                    r = measure(method, length, batch, folder, args.entry, args.cpu_time)
                    if method == "onnx-step":
                        base, carried = r["tokens_per_s"], False
                    ratio = f"{r['tokens_per_s'] / base:7.1f}×{'*' if carried else ''}" if base else "       –"
                    lat = f"{r['p50_us']:6.1f}/{r['p99_us']:<6.1f}" if "p50_us" in r else ""
                    pct = r["tokens_per_s"] * flops / (floor * 1e9) * 100 if method != "softmax-kv" else float("nan")
                    print(f"{batch:>5} {length:>10} {method:>13} {r['tokens_per_s']:>12,.0f} {ratio} {flops:>8,} {pct:>6.1f}% "
                          f"{r['mem_growth_mib']:>8.1f} MiB {lat:>14} {r.get('graph', '')}")
                    sys.stdout.flush()


if __name__ == "__main__":
    main()
