"""Linear recurrences h_t = a_t ⊙ h_{t−1} + b_t (h_0 = 0): sequential and parallel scans.

The parallel form composes the affine maps (a, b)∘(a', b') = (a a', a' b + b') with
Hillis–Steele doubling: ⌈log₂ T⌉ vectorised steps instead of T Python steps. Both forms
agree to rounding (tested); the diagonal RNN and LRU families use the parallel one in
`forward` and the sequential one is their `step`.
"""

from __future__ import annotations

import torch


def sequential_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a, b: (B, T, n) (a may broadcast) → h: (B, T, n)."""
    a = a.expand_as(b)
    h = torch.zeros_like(b[:, 0])
    out = []
    for t in range(b.shape[1]):
        h = a[:, t] * h + b[:, t]
        out.append(h)
    return torch.stack(out, dim=1)


EXPORT_MAX_LEN = 2**16  # doublings traced into exported graphs: valid for T ≤ this


def parallel_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Same result as `sequential_scan` in ⌈log₂ T⌉ steps (inclusive prefix of affine maps)."""
    a = a.expand_as(b)
    T = b.shape[1]
    # An exported graph cannot branch on its dynamic T, so it gets enough doublings for
    # EXPORT_MAX_LEN; doublings past T leave the result unchanged.
    limit = EXPORT_MAX_LEN if torch.compiler.is_exporting() else T
    offset = 1
    while offset < limit:
        # position t absorbs the prefix ending at t − offset (identity map (1, 0) before the start)
        b_prev = torch.nn.functional.pad(b, (0, 0, offset, 0))[:, :T]
        a_prev = torch.nn.functional.pad(a, (0, 0, offset, 0), value=1.0)[:, :T]
        b = a * b_prev + b
        a = a * a_prev
        offset *= 2
    return b
