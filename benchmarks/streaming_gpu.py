"""Many streams on one GPU: the chunked path on CUDA at 64 and 1,024 streams, beside ONNX Runtime
on the same machine's CPU, every figure measured in this run.

Methods (all on the released checkpoint, default gated-rnn-gd-zucchet-icl):
- `torch-cuda-chunk`: `model.forward_chunk(tokens, state)` on CUDA, one call per block of `--chunk`
  tokens, the state carried between calls: the computation model_chunk.onnx encodes (the parallel
  scan continued from the carried state), eager;
- `torch-cuda-chunk-graph`: the same call captured once as a CUDA graph and replayed per block;
- `torch-cuda-step`: `model.step` one token per call on CUDA (the GPU's token-at-a-time baseline);
- `ort-cpu-chunk`: `StreamingSession.push` on the CPU provider with every core (`--ort-threads`).
ONNX Runtime's CUDA provider is measured when the installed onnxruntime offers it (onnxruntime-gpu);
otherwise the table says it was not available.

Tokens are drawn once into a bank of blocks on the device and cycled, so the input costs nothing;
per-block latency (p50/p99) comes from CUDA events around each call. Exactness: the CUDA chunked
outputs of 8 streams over the first two blocks against the ONNX step graph (CPU provider) run
token at a time on the same tokens, max |Δ| printed beside.

    python benchmarks/streaming_gpu.py --batches 64 1024 --length 100000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def _bank(batch: int, chunk: int, d: int, device, blocks: int = 4, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(batch, chunk, d, generator=g, device=device) for _ in range(blocks)]


def _percentiles(ms: list[float]) -> tuple[float, float]:
    a = np.asarray(ms)
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


@torch.no_grad()
def torch_chunked(model, batch: int, length: int, chunk: int, graphed: bool) -> dict:
    dev = torch.device("cuda")
    bank = _bank(batch, chunk, model.d_in, dev)
    state = tuple(s.to(dev) for s in model.init_state(batch))
    call = model.forward_chunk
    if graphed:  # static buffers: the replay reads `x` and `state_in`, writes `out` and `state_out`
        x = bank[0].clone()
        state_in = tuple(s.clone() for s in state)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                call(x, state_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, state_out = call(x, state_in)

        def run(block):
            x.copy_(block)
            graph.replay()
            for dst, src in zip(state_in, state_out):
                dst.copy_(src)
            return out
    else:
        carried = [state]

        def run(block):
            y, carried[0] = call(block, carried[0])
            return y

    for i in range(3):  # warm-up (kernels chosen, allocator filled)
        run(bank[i % len(bank)])
    torch.cuda.synchronize()
    blocks = length // chunk
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(blocks)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(blocks)]
    wall = time.perf_counter()
    for i in range(blocks):
        starts[i].record()
        run(bank[i % len(bank)])
        stops[i].record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall
    ms = [a.elapsed_time(b) for a, b in zip(starts, stops)]
    p50, p99 = _percentiles(ms)
    return {"tokens_per_s": batch * blocks * chunk / wall, "block_ms_p50": p50, "block_ms_p99": p99,
            "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20}


@torch.no_grad()
def torch_step(model, batch: int, tokens: int) -> dict:
    dev = torch.device("cuda")
    x = _bank(batch, 1, model.d_in, dev, blocks=1)[0][:, 0]
    state = tuple(s.to(dev) for s in model.init_state(batch))
    for _ in range(10):
        _, state = model.step(x, state)
    torch.cuda.synchronize()
    wall = time.perf_counter()
    for _ in range(tokens):
        _, state = model.step(x, state)
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall
    return {"tokens_per_s": batch * tokens / wall, "token_us": 1e6 * wall / tokens}


def ort_chunked(folder, batch: int, length: int, threads: int, providers: list[str]) -> dict:
    from export.streaming import StreamingSession

    session = StreamingSession(folder, threads=threads, providers=providers)
    session.reset(batch)
    rng = np.random.default_rng(0)
    block = rng.standard_normal((batch, 1000, session.d_in), dtype=np.float32)
    session.push(block)  # warm-up: opens the chunk graph
    wall = time.perf_counter()
    for _ in range(length // 1000):
        session.push(block)
    wall = time.perf_counter() - wall
    return {"tokens_per_s": batch * (length // 1000) * 1000 / wall, "graph": session.session.get_providers()[0]}


@torch.no_grad()
def exactness(model, folder, batch: int, chunk: int, streams: int = 8) -> float:
    """max |Δ| between the CUDA chunked outputs (two blocks, state carried) and the ONNX step graph
    (CPU provider, one token per run) on the first `streams` streams."""
    from export.streaming import StreamingSession

    dev = torch.device("cuda")
    bank = _bank(batch, chunk, model.d_in, dev, blocks=2, seed=1)
    state = tuple(s.to(dev) for s in model.init_state(batch))
    outs = []
    for block in bank:
        y, state = model.forward_chunk(block, state)
        outs.append(y[:streams].cpu().numpy())
    cuda_out = np.concatenate(outs, axis=1)  # (streams, 2·chunk, d_out)
    ref = StreamingSession(folder, providers=["CPUExecutionProvider"], threads=1)
    ref.reset(streams)
    tokens = torch.cat([b[:streams] for b in bank], dim=1).cpu().numpy()
    step_out = np.stack([ref.push(tokens[:, t]) for t in range(tokens.shape[1])], axis=1)  # (B, d_in): one step each
    return float(np.abs(cuda_out - step_out).max())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entry", default="gated-rnn-gd-zucchet-icl")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--length", type=int, default=100_000, help="tokens per stream")
    ap.add_argument("--chunk", type=int, default=1000, help="tokens per stream per call")
    ap.add_argument("--step-tokens", type=int, default=2000, help="tokens per stream for the token-at-a-time rows")
    ap.add_argument("--ort-length", type=int, default=10_000, help="tokens per stream for the ONNX Runtime rows")
    ap.add_argument("--ort-threads", type=int, default=0, help="0: every core")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)

    import onnxruntime as ort

    import zoo
    from zoo.storage.locate import locate

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark measures the GPU path (benchmarks/streaming.py is the CPU one)")
    ckpt = zoo.load(args.entry)
    model = ckpt.model.float().eval().cuda()
    folder = locate(args.entry).folder
    providers = ort.get_available_providers()
    header = {"entry": args.entry, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "onnxruntime": ort.__version__, "ort_providers": providers, "length": args.length, "chunk": args.chunk}
    print(json.dumps(header))
    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    for batch in args.batches:
        emit({"batch": batch, "method": "exactness-vs-onnx-step",
              "max_abs_diff": exactness(model, folder, batch, args.chunk)})
        step = torch_step(model, batch, args.step_tokens)
        emit({"batch": batch, "method": "torch-cuda-step", **step, "vs_step": 1.0})
        for graphed in (False, True):
            r = torch_chunked(model, batch, args.length, args.chunk, graphed)
            emit({"batch": batch, "method": "torch-cuda-chunk" + ("-graph" if graphed else ""), **r,
                  "vs_step": r["tokens_per_s"] / step["tokens_per_s"]})
        r = ort_chunked(folder, batch, args.ort_length, args.ort_threads, ["CPUExecutionProvider"])
        emit({"batch": batch, "method": "ort-cpu-chunk", **r, "vs_step": r["tokens_per_s"] / step["tokens_per_s"]})
        if "CUDAExecutionProvider" in providers:
            r = ort_chunked(folder, batch, args.ort_length, 0, ["CUDAExecutionProvider"])
            emit({"batch": batch, "method": "ort-cuda", **r, "vs_step": r["tokens_per_s"] / step["tokens_per_s"]})
        else:
            emit({"batch": batch, "method": "ort-cuda", "skipped": "CUDAExecutionProvider not in " + ", ".join(providers)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
