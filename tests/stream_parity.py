"""Long-stream parity helpers shared by the export and recurrence tests: task tokens over a stream with
their float64 reference, and the fp32-graph-vs-float64 tolerance."""

import copy

import numpy as np
import torch


def linearised(entry) -> bool:
    """A construction its family declares approximate (`ConstructionRule.exact = False`: the LSTM and LRU
    layers set by Zucchet et al.'s Tables 3–4, which linearise σ (and tanh) at a scale ε). Their read-out
    weights grow as ε shrinks (16/ε³; 4/ε² per paired gate), so fp32 rounding is amplified by design, and
    the linearisation holds only while the gates' arguments, which grow with the state, stay O(ε): they are
    checked against the fp32 torch model on the task's own length, not to 3e-5 over a long stream."""
    from zoo.science.models import CONSTRUCTIONS

    construction = getattr(entry.source, "construction", None)
    return construction is not None and not CONSTRUCTIONS[construction][1].exact


def stream_tokens(model, task, length, batch=2):
    """Task tokens over a long stream, and the float64 reference outputs.

    Attention-like outputs are polynomials (degree 3–4) of the tokens summed over the whole
    stream, so the tokens are halved (or doubled) until the reference is O(1) (½ ≤ max |y| ≤ 4),
    at most 20 times: a randomly initialised RNN has an input-independent part (the appended 1) that
    scaling cannot shrink, and `assert_parity` scales atol by the output magnitude then."""
    n = -(-length // task.n_tokens)
    b = task.sample(batch * n, seed=9)
    tokens = b.tokens.reshape(batch, n * task.n_tokens, -1)[:, :length]
    reference = model_double(model)
    with torch.no_grad():
        ref = reference(tokens.double())
        for _ in range(20):
            if ref.abs().max() <= 4:
                break
            tokens = tokens / 2
            ref = reference(tokens.double())
        for _ in range(10):  # a small random init (LSA without residual: out ∝ init_std⁴): scale up once
            if ref.abs().max() >= 0.5:
                break
            larger = reference(2 * tokens.double())
            if larger.abs().max() > 4:
                break
            tokens, ref = 2 * tokens, larger
    return tokens, ref


def model_double(model):
    return copy.deepcopy(model).double()


def assert_parity(got: np.ndarray, ref: torch.Tensor):
    ref = ref.detach().numpy()
    err = got.astype(np.float64) - ref
    rel_rms = np.sqrt((err**2).mean() / (ref**2).mean())
    scale = max(1.0, float(np.abs(ref).max()))  # fp32 keeps ~7 digits of the largest output
    # fp32 sums over a 1,000-token stream through memory neurons (λ ≈ 1) lose digits with the length
    # (worst measured: the random-init gated-rnn-triples, max 1.9e-5 · scale, relative rms 1.03e-5)
    assert np.abs(err).max() < 3e-5 * scale, (np.abs(err).max(), scale)
    assert rel_rms < 3e-5, rel_rms
    assert np.abs(ref).max() > 0.1, "the reference must not be trivially small"
