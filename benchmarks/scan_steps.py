"""The step-by-step scan's forward + backward: per-step slices by indexing vs by `unbind`.

    python benchmarks/scan_steps.py                 # 1 thread, the zoo's training shapes
    python benchmarks/scan_steps.py --threads 2 --reps 500

`indexed` is the form `zoo.science.models.scan.sequential_scan` had before: a time-invariant `a` expanded to
(B, T, …) and every step read as a[:, t] and b[:, t]. The backward of each such read is a full-size
(B, T, …) tensor holding one step's gradient, T of them per scan. `current` is
`sequential_scan` as it is now (`time_steps`: `unbind`, and a time-invariant `a` kept as one
tensor). Each row times both in the same run, eager and compiled, and checks that their gradients
agree.
"""

from __future__ import annotations

import argparse
import time

import torch

from zoo.science.models.scan import complex_mul, sequential_scan


def indexed_scan(a, b, *, complex_pairs=False):
    a = a.expand_as(b)
    mul = complex_mul if complex_pairs else torch.mul
    h, out = torch.zeros_like(b[:, 0]), []
    for t in range(b.shape[1]):
        h = mul(a[:, t], h) + b[:, t]
        out.append(h)
    return torch.stack(out, dim=1)


CASES = {  # name: (shape of a, shape of b, complex pairs); B = 64 and T = 32 as the teacher–student recipes
    "LRU student: λ (60, 2), b (64, 32, 60, 2)": ((60, 2), (64, 32, 60, 2), True),
    "gated RNN student: λ (100,), b (64, 32, 100)": ((100,), (64, 32, 100), False),
    "time-varying a, b (64, 32, 100) (Griffin, Mamba)": ((64, 32, 100), (64, 32, 100), False),
}


def timed_ms(fn, reps: int) -> float:
    for _ in range(5):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.reps} reps; forward + backward, ms")
    print("| case | mode | indexed | current | × |  max rel. grad diff |")
    print("|---|---|---|---|---|---|")
    for name, (a_shape, b_shape, pairs) in CASES.items():
        a0 = torch.rand(a_shape, generator=gen) * (0.5 if pairs else 1.0)
        b0 = torch.randn(b_shape, generator=gen)
        w = torch.randn(b_shape, generator=gen)

        def step(scan_fn):
            a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
            (scan_fn(a, b, complex_pairs=pairs) * w).sum().backward()
            return a.grad, b.grad

        for mode in ("eager", "compiled"):
            wrap = torch.compile if mode == "compiled" else (lambda f: f)
            base, new = wrap(lambda: step(indexed_scan)), wrap(lambda: step(sequential_scan))
            diff = max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(base(), new()))
            ms_base, ms_new = timed_ms(base, args.reps), timed_ms(new, args.reps)
            print(f"| {name} | {mode} | {ms_base:.3f} | {ms_new:.3f} | {ms_base / ms_new:.2f}× | {diff:.1e} |")


if __name__ == "__main__":
    main()
