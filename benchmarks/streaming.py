"""Streaming throughput and memory: ONNX Runtime step graph vs PyTorch eager `step` vs a
softmax-attention decoder with a KV cache, one token at a time (batch 1).

Every (method, length) runs in a fresh process: tokens/s over the stream, and the peak RSS
growth during the stream (sampled every 1000 tokens) above the process's RSS after setup (model loaded, tokens in memory).
Ratios are against PyTorch eager `step` measured in the same run.

    python benchmarks/streaming.py                      # lengths 1e3, 1e4, 1e5
    python benchmarks/streaming.py --lengths 1000 1000000 --entry lsa-gd-zucchet-icl
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import tempfile
import time
from pathlib import Path

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


def _run(method: str, length: int, folder: str, entry: str, queue) -> None:
    import torch

    torch.set_num_threads(1)
    import zoo
    from export import StreamingSession

    ckpt = zoo.load(folder)
    d = ckpt.model.d_in
    tokens = np.random.default_rng(0).uniform(-1, 1, (length, 1, d)).astype(np.float32) * (12 / length) ** (1 / 3)
    if method == "onnx":
        session = StreamingSession(folder, threads=1)
        session.reset(1)
        step = session.push
        feed = tokens
    elif method == "torch-step":
        model, state = ckpt.model.eval(), None
        state = model.init_state(1)

        def step(tok):
            nonlocal state
            out, state = model.step(tok, state)
            return out

        feed = torch.from_numpy(tokens)
    else:
        dec = SoftmaxDecoder(d, length)
        step, feed = dec.step, torch.from_numpy(tokens)
    with torch.no_grad():
        for i in range(min(100, length)):  # warm-up, outside the measurement
            step(feed[i])
        if method == "onnx":
            session.reset(1)
        elif method == "torch-step":
            state = ckpt.model.init_state(1)
        else:
            dec = SoftmaxDecoder(d, length)
            step = dec.step
        base = peak = _rss_bytes()
        elapsed = 0.0
        for start in range(0, length, 1000):  # RSS sampled every 1000 tokens, outside the timed loop
            t0 = time.perf_counter()
            for i in range(start, min(start + 1000, length)):
                step(feed[i])
            elapsed += time.perf_counter() - t0
            peak = max(peak, _rss_bytes())
    queue.put({"tokens_per_s": length / elapsed, "mem_growth_mib": (peak - base) / 2**20})


def measure(method: str, length: int, folder: str, entry: str) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_run, args=(method, length, folder, entry, q))
    p.start()
    result = q.get()
    p.join()
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entry", default="lsa-gd-zucchet-icl")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--methods", nargs="+", default=["torch-step", "onnx", "softmax-kv"])
    ap.add_argument("--softmax-max", type=int, default=100_000,
                    help="longest stream for the softmax decoder: its per-token cost grows with t (O(T²) total)")
    args = ap.parse_args(argv)

    import torch

    import zoo

    with tempfile.TemporaryDirectory() as tmp:
        folder = str(Path(tmp) / args.entry)
        zoo.build(args.entry, folder, progress=False)
        import onnxruntime as ort

        print(f"entry {args.entry}; torch {torch.__version__}, onnxruntime {ort.__version__}, 1 thread, batch 1")
        print(f"{'length':>9} {'method':>11} {'tokens/s':>11} {'vs torch':>9} {'Δ peak RSS':>11}")
        for length in args.lengths:
            base = None
            for method in args.methods:
                if method == "softmax-kv" and length > args.softmax_max:
                    print(f"{length:>9} {method:>11}   skipped: O(T²) total, > --softmax-max")
                    continue
                r = measure(method, length, folder, args.entry)
                base = r["tokens_per_s"] if method == "torch-step" else base
                ratio = f"{r['tokens_per_s'] / base:8.2f}×" if base else "        –"
                print(f"{length:>9} {method:>11} {r['tokens_per_s']:>11,.0f} {ratio} {r['mem_growth_mib']:>8.1f} MiB")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
