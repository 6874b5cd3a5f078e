"""Linear recurrences h_t = a_t ⊙ h_{t−1} + b_t from h_0 (zero unless given): sequential and parallel scans.

The parallel form composes the affine maps (a, b)∘(a', b') = (a a', a' b + b') with
Hillis–Steele doubling: ⌈log₂ T⌉ vectorised steps instead of T Python steps. After the
doublings `a` holds the prefix products A_t = a_1 ⋯ a_t, so a start state enters as
h_t = b_t + A_t ⊙ h_0 (what a streamed chunk needs). Both forms agree to rounding (tested).

The doublings cost ⌈log₂ T⌉ passes over all (B, T, …) elements, the sequential form one pass
in T small steps. `scan` picks: the parallel form in exported graphs (their T is symbolic) and
for long sequences; the sequential one for the zoo's short training prompts (T ≤ 16 eager, T ≤ 64
compiled) and for wide states (Mamba's e·N channels), where the extra passes cost more than the
Python steps (measured on the 2-core CPU: Mamba 1.7×/3× faster eager/compiled, LRU 1.8×, S5 1.5× eager;
reports/engineering/train-throughput-cpu.md). The diagonal RNN, GD-SSM, LRU, Mamba and Griffin
families call `scan` in `forward` and `forward_chunk`; their `step` is the sequential form.

Complex recurrences (LRU, S5) pass `complex_pairs=True`: the last axis of a and b holds
(real, imaginary), so nothing complex reaches an exported ONNX graph.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def complex_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(…, 2) × (…, 2) as complex numbers stored as (re, im) pairs."""
    re = a[..., 0] * b[..., 0] - a[..., 1] * b[..., 1]
    im = a[..., 0] * b[..., 1] + a[..., 1] * b[..., 0]
    return torch.stack([re, im], dim=-1)


def time_steps(x: torch.Tensor, like: torch.Tensor) -> list[torch.Tensor]:
    """x, which broadcasts against `like` (B, T, …), as T per-step tensors, each broadcasting against
    like[:, t]. A time-invariant x (no T axis, T = 1, or expanded along T: stride 0) is the same tensor
    at every step, so its gradient is one sum over the steps. The steps come from `unbind`, whose
    backward is one stack: indexing x[:, t] instead gives every step's gradient as a full-size
    (B, T, …) tensor, T of them (compiled, 2 threads, LRU forward + backward at 64 × 32 × 60:
    3.85 → 0.84 ms, benchmarks/scan_steps.py)."""
    # zip over the steps would otherwise cut a scan to the shorter of a and b, silently. (Checked here, not by
    # torch.broadcast_shapes: its first call imports torch's symbolic-shapes machinery, 0.7 s of a `zoo eval`.)
    if not _broadcasts_to(tuple(x.shape), tuple(like.shape)):
        raise ValueError(f"a of shape {tuple(x.shape)} does not broadcast to b's {tuple(like.shape)} (B, T, …)")
    x = x.reshape((1,) * (like.dim() - x.dim()) + tuple(x.shape))  # trailing axes line up, as broadcasting does
    if x.shape[1] == 1 or x.stride(1) == 0:
        return [x[:, 0]] * like.shape[1]
    return list(x.unbind(1))


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether a tensor of `shape` broadcasts to `target` unchanged (trailing axes aligned, each 1 or equal)."""
    return len(shape) <= len(target) and all(n in (1, m) for n, m in zip(reversed(shape), reversed(target)))


def sequential_scan(a: torch.Tensor, b: torch.Tensor, *, complex_pairs: bool = False,
                    h0: torch.Tensor | None = None) -> torch.Tensor:
    """a, b: (B, T, …) (a may broadcast), h0: (B, …) or None (zeros) → h: (B, T, …)."""
    mul = complex_mul if complex_pairs else torch.mul
    a_steps, b_steps = time_steps(a, b), b.unbind(1)
    h = torch.zeros_like(b_steps[0]) if h0 is None else h0
    out = []
    for a_t, b_t in zip(a_steps, b_steps):
        h = mul(a_t, h) + b_t
        out.append(h)
    return torch.stack(out, dim=1)


# Doublings traced into exported whole-sequence graphs: they are valid for T ≤ this (recorded
# in the graph's metadata); longer streams go through the chunk or step graph, which have no limit.
EXPORT_MAX_LEN = 2**12
_export_len = EXPORT_MAX_LEN  # the bound of the graph being exported (chunk graphs use a shorter one)


@contextlib.contextmanager
def export_length(n: int):
    """Trace scans for sequences of at most `n` steps (⌈log₂ n⌉ doublings, and a guard past n)."""
    global _export_len
    previous, _export_len = _export_len, n
    try:
        yield
    finally:
        _export_len = previous


def length_guard(x: torch.Tensor) -> torch.Tensor:
    """1, read from a constant of `_export_len` ones at index T − 1 (T = x.shape[1]).

    Multiplying a scan's input by it changes nothing, but in an exported graph it is a Gather
    whose index runs out of bounds when T exceeds the bound: ONNX Runtime then raises
    ("indices element out of data bounds") instead of returning a scan that stopped early."""
    ones = torch.ones(_export_len, dtype=x.dtype, device=x.device)
    return ones[x.shape[1] - 1]


def with_history(history: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, T, …) with the last K steps before it, `history` (B, K, …), prepended: (B, K + T, …), and
    the new history, its last K steps (what a causal window or convolution carries to the next chunk)."""
    full = torch.cat([history, x], dim=1)
    return full, full[:, x.shape[1] :]


def causal_depthwise_conv(u: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """A depthwise `conv` (groups = channels, no padding) over (B, k − 1 + T, e) inputs, earlier
    ones first (as `with_history` returns them) → (B, T, e). Written as k shifted products, the
    same sum as Conv1d's: compiled it fuses with its neighbours, and under vmap it does not become
    a grouped convolution with E·e groups (whose backward took ~6 ms a step for Griffin at E = 32)."""
    k = conv.kernel_size[0]
    T = u.shape[1] - k + 1
    weight = conv.weight[:, 0].T  # (k, e)
    out = u[:, :T] * weight[0]
    for j in range(1, k):
        out = out + u[:, j : j + T] * weight[j]
    return out + conv.bias if conv.bias is not None else out


def _delay(x: torch.Tensor, offset: int, fill: float) -> torch.Tensor:
    """x delayed by `offset` steps along time (dim 1), the first `offset` entries `fill`.
    (Written with pad, not cat: an exported graph keeps T symbolic.)"""
    pad = (0, 0) * (x.dim() - 2) + (offset, 0)
    return torch.nn.functional.pad(x, pad, value=fill)[:, : x.shape[1]]


def _delay_map(a: torch.Tensor, offset: int, complex_pairs: bool) -> torch.Tensor:
    """`a` delayed, the identity map (1, or 1 + 0i) before the start."""
    if not complex_pairs:
        return _delay(a, offset, 1.0)
    return torch.stack([_delay(a[..., 0], offset, 1.0), _delay(a[..., 1], offset, 0.0)], dim=-1)


def parallel_scan(a: torch.Tensor, b: torch.Tensor, *, complex_pairs: bool = False,
                  h0: torch.Tensor | None = None) -> torch.Tensor:
    """Same result as `sequential_scan` in ⌈log₂ T⌉ steps (inclusive prefix of affine maps)."""
    a = a.expand_as(b)
    mul = complex_mul if complex_pairs else torch.mul
    T = b.shape[1]
    # An exported graph cannot branch on its dynamic T, so it gets enough doublings for
    # the export bound; doublings past T leave the result unchanged.
    exporting = torch.compiler.is_exporting()
    limit = _export_len if exporting else T
    if exporting:  # make a longer input fail loudly instead of returning a partial scan
        b = b * length_guard(b)
    offset = 1
    while offset < limit:
        # position t absorbs the prefix ending at t − offset (identity map (1, 0) before the start)
        b = mul(a, _delay(b, offset, 0.0)) + b
        a = mul(a, _delay_map(a, offset, complex_pairs))
        offset *= 2
    if h0 is not None:  # a is now the prefix product A_t: h_t = b_t + A_t h_0
        b = b + mul(a, h0.unsqueeze(1))
    return b


SHORT_SCAN_LEN = 16  # sequences up to this length scan step by step (outside exported graphs)
# Compiled, inductor fuses each step's multiply-add into one loop, so the step-by-step form wins for
# longer prompts: forward + backward of (64, T, 100) on the 2-core CPU, sequential vs parallel,
# 0.79 vs 1.33 ms at T = 24, 1.05 vs 1.81 ms at T = 32, 4.6 vs 6.5 ms at T = 64.
COMPILED_SHORT_SCAN_LEN = 64
WIDE_SCAN_CHANNELS = 512  # ... and so do states this wide (per sequence: Mamba's e·N = 1024 at the zoo's sizes)


def scan(a: torch.Tensor, b: torch.Tensor, *, complex_pairs: bool = False, h0: torch.Tensor | None = None,
         parallel: bool | None = None) -> torch.Tensor:
    """h_t = a_t ⊙ h_{t−1} + b_t by the cheaper form (module docstring); `parallel` forces one.
    The choice depends on T and the state's width, never on the batch: a model scores a prompt
    with the same arithmetic whatever batch it comes in."""
    if parallel is None:
        T, width = b.shape[1], b[0, 0].numel()
        short = COMPILED_SHORT_SCAN_LEN if torch.compiler.is_compiling() else SHORT_SCAN_LEN
        parallel = torch.compiler.is_exporting() or (T > short and width < WIDE_SCAN_CHANNELS)
    return (parallel_scan if parallel else sequential_scan)(a, b, complex_pairs=complex_pairs, h0=h0)


def last_state(lam: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h_T of h_t = λ ⊙ h_{t−1} + b_t from h_0 = 0 with a time-invariant λ (…, C) and b (B, T, …, C),
    for a read-out that needs the last state only. Eager: Σ_t λ^{T−t} ⊙ b_t, one weighted sum
    (powers by a cumulative product: exact and differentiable at λ = 0 and 1). Compiled: the
    recurrence itself, keeping no intermediate state, which inductor fuses into one loop; the same
    while a CUDA graph is being captured (cumprod's backward checks its input for zeros on the host,
    which a capture forbids)."""
    if lam.dim() != b.dim() - 2:  # λ must span b's channel axes: powers (T, …) line up with b's (B, T, …)
        raise ValueError(f"λ of shape {tuple(lam.shape)} does not match b of shape {tuple(b.shape)} (B, T, …)")
    T = b.shape[1]
    if torch.compiler.is_compiling() or (b.is_cuda and torch.cuda.is_current_stream_capturing()):
        b_steps = b.unbind(1)  # not b[:, t]: see time_steps
        h = b_steps[0]
        for b_t in b_steps[1:]:
            h = lam * h + b_t
        return h
    steps = torch.cat([torch.ones_like(lam).unsqueeze(0), lam.expand(T - 1, *lam.shape)], dim=0)  # (T, …, C)
    powers = torch.cumprod(steps, dim=0).flip(0)  # [t] = λ^{T−1−t}
    return (powers * b).sum(1)  # (B, …, C)
