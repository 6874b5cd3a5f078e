"""`zoo stream` on a .npy input against `StreamingSession.push` on the same tokens, in one run.

For each batch: a (B, T, d_in) .npy of random tokens is streamed (a) in this process through
`StreamingSession.push` in pieces of 65,536 tokens per stream at most (as `zoo stream` reads them),
the task read-out taken (`session.predict`), after the session's one-time probe (the library's
steady rate); (b) by `zoo stream PATH --input x.npy --output y.npy --threads 1 --quiet` in a fresh
process, timed from launch to exit (imports, hash check, probe and the .npy writes included), and
once more on a 2-token input, whose time is the CLI's fixed cost. Both use one ONNX Runtime thread.
Prints tokens/s of each, the CLI's rate without its fixed cost, and the ratios; the CLI's output is
checked equal to the library's.

    python benchmarks/stream_cli.py                         # batch 1 and 64, 4M tokens each
    python benchmarks/stream_cli.py --batches 1 --tokens 1000000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "release" / "gated-rnn-gd-zucchet-icl"))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--tokens", type=int, default=4_000_000, help="tokens per batch size, over all streams")
    args = ap.parse_args(argv)

    from export.streaming import StreamingSession

    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    print(f"model {args.model}; one ONNX Runtime thread; library = StreamingSession.push in this process, "
          "CLI = `zoo stream --input x.npy --output y.npy` in a fresh process (launch to exit)")
    print(f"{'batch':>5} {'tokens':>10} {'library tok/s':>14} {'CLI tok/s':>12} {'CLI/library':>11} "
          f"{'CLI fixed s':>11} {'CLI w/o fixed':>13} {'ratio':>6}  graph")
    with tempfile.TemporaryDirectory() as tmp:
        for batch in args.batches:
            length = max(2, args.tokens // batch)
            session = StreamingSession(args.model, threads=1)
            rng = np.random.default_rng(batch)
            tokens = (rng.uniform(-1, 1, (batch, length, session.d_in)) * 0.3).astype(np.float32)
            src, dst, tiny = Path(tmp) / "x.npy", Path(tmp) / "y.npy", Path(tmp) / "tiny.npy"
            np.save(src, tokens)
            np.save(tiny, tokens[:, :2])
            session.reset(batch)
            session.push(tokens[:, :2])  # the one-time probe of the chunk graphs at this batch, outside the timing
            session.reset(batch)
            step = max(1, min(65_536, (1 << 20) // (batch * session.d_in)))
            t0 = time.perf_counter()
            lib = [session.predict(session.push(tokens[:, a : a + step])) for a in range(0, length, step)]
            lib_s = time.perf_counter() - t0
            graph = "{}/T={}".format(*session._choose())

            def cli(path, dst=dst) -> float:
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "zoo.cli", "stream", args.model, "--input", str(path), "--output",
                                str(dst), "--threads", "1", "--quiet"], check=True, env=env, cwd=ROOT)
                return time.perf_counter() - t0

            fixed = cli(tiny)
            cli_s = cli(src)
            np.testing.assert_allclose(np.load(dst), np.concatenate(lib, axis=1), rtol=0, atol=1e-5)
            n = batch * length
            lib_rate, cli_rate, steady = n / lib_s, n / cli_s, n / max(cli_s - fixed, 1e-9)
            print(f"{batch:>5} {n:>10,} {lib_rate:>14,.0f} {cli_rate:>12,.0f} {cli_rate / lib_rate:>10.0%} "
                  f"{fixed:>11.2f} {steady:>13,.0f} {steady / lib_rate:>5.0%}  {graph}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
