"""Gated linear RNNs (Zucchet et al.): equations, scans, constructions, analyses."""

import pytest
import torch

from zoo.science.analysis.polynomial import (
    coefficients,
    monomials,
    polynomial_distance,
    prediction_map,
    regression_coefficient_table,
)
from zoo.science.analysis.rnn import (
    active_neurons,
    imperfect_memory_effect,
    kv_q_scores,
    memory_leak,
    prune,
    prune_by_function,
)
from zoo.science.constructions import construct_gd_lsa
from zoo.science.models.gated_rnn import GatedLinearRNN, rnn_from_lsa, rnn_size
from zoo.science.models.lsa import LinearSelfAttention, lsa_weights, teacher_lsa
from zoo.science.models.scan import last_state, parallel_scan, scan, sequential_scan
from zoo.science.tasks.regression import LinearRegressionTask, Readout
from zoo.science.tasks.teacher import LSATeacherTask

READOUT = Readout(position=None, start=0, stop=5, sign=1.0)


def lsa_rnn(weights, readout, compact=False) -> GatedLinearRNN:
    """A float64 gated RNN of the construction's size, set to the LSA layer (W_V, W_K, W_Q) by `rnn_from_lsa`."""
    d = weights[0].shape[0]
    return rnn_from_lsa(GatedLinearRNN(d, d, readout, **rnn_size(d, compact)).double(), *weights, compact=compact)


def random_lsa(d, seed, invertible=True):
    g = torch.Generator().manual_seed(seed)
    lsa = LinearSelfAttention(d, READOUT, attention="causal", residual=False).double()
    with torch.no_grad():
        for name in ("w_q", "w_k", "w_v", "w_p"):
            getattr(lsa.layers[0], name).copy_(torch.randn(d, d, generator=g, dtype=torch.float64) / d**0.5)
    return lsa


@pytest.mark.parametrize("T", [1, 2, 7, 16, 33])
def test_parallel_scan_equals_sequential(T):
    g = torch.Generator().manual_seed(T)
    a = torch.rand(3, T, 5, generator=g, dtype=torch.float64)
    b = torch.randn(3, T, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(parallel_scan(a, b), sequential_scan(a, b), rtol=1e-12, atol=1e-12)
    # and against the definition h_t = Σ_{s≤t} (Π_{s<r≤t} a_r) b_s
    t = T - 1
    expected = sum(torch.prod(a[:, s + 1 : t + 1], dim=1) * b[:, s] for s in range(T))
    torch.testing.assert_close(parallel_scan(a, b)[:, t], expected, rtol=1e-10, atol=1e-10)


# a as the scan receives it, from a leaf of the given shape: as is, expanded along time and batch (stride 0
# on both), expanded along batch only (time-varying, stride 0 on batch), or time-varying and transposed
A_FORMS = {"as is": lambda a, b: a, "expanded": lambda a, b: a.expand_as(b),
           "batch-expanded": lambda a, b: a.expand_as(b), "transposed": lambda a, b: a.transpose(1, 2)}


@pytest.mark.parametrize("a_shape, form", [((5,), "as is"), ((1, 1, 5), "as is"), ((3, 1, 5), "as is"), ((7, 5), "as is"),
                                           ((1, 7, 5), "as is"), ((3, 7, 5), "as is"), ((5,), "expanded"),
                                           ((1, 7, 5), "batch-expanded"), ((3, 5, 7), "transposed")])
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.compile)])
def test_sequential_scan_takes_a_in_every_broadcast_shape(a_shape, form, compiled):
    """`sequential_scan` reads a time-invariant `a` once per step without expanding it (scan.time_steps);
    values and gradients of a and b equal the definition written with a broadcast to (B, T, n) first,
    for every shape that broadcasts: no T axis, T = 1, (T, n) (time-varying), stride-0 expands along
    time or along batch only, and a non-contiguous time-varying a."""
    g = torch.Generator().manual_seed(len(str(a_shape)) + len(form))
    b = torch.randn(3, 7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    a_base = torch.rand(a_shape, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 7, 5, generator=g, dtype=torch.float64)

    def loss(scan_fn, a):
        return (scan_fn(A_FORMS[form](a, b), b) * weights).sum()

    def reference(a, b):  # h_t = Σ_{s≤t} (Π_{s<r≤t} a_r) b_s with a broadcast to b's shape
        a = torch.broadcast_to(a, b.shape)
        return torch.stack([sum(torch.prod(a[:, s + 1 : t + 1], dim=1) * b[:, s] for s in range(t + 1))
                            for t in range(b.shape[1])], dim=1)

    if compiled:
        torch._dynamo.reset()  # each case is a new specialisation of the same function: keep under the recompile limit
    fast = torch.compile(sequential_scan, fullgraph=True) if compiled else sequential_scan
    got = torch.autograd.grad(loss(fast, a_base), (a_base, b))
    want = torch.autograd.grad(loss(reference, a_base), (a_base, b))
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("a_shape", [(3, 2, 5), (3, 6, 5), (2, 5), (4,)])
def test_sequential_scan_refuses_an_a_that_does_not_broadcast(a_shape):
    """A wrong number of steps in a is an error, not a scan cut to the shorter of a and b."""
    with pytest.raises(ValueError, match="does not broadcast"):
        sequential_scan(torch.rand(a_shape), torch.randn(3, 4, 5))


def test_forward_is_eq2_in_both_scan_forms():
    """The parallel and sequential scans agree, and equal Eq. 2 written out (forward ≡ step for every
    recurrence is tests/test_recurrence.py)."""
    torch.manual_seed(0)
    rnn = GatedLinearRNN(5, 5, READOUT, hidden=12, gates=9).double()
    x = torch.randn(4, 20, 5, dtype=torch.float64)
    full = rnn(x, parallel=True)
    torch.testing.assert_close(rnn(x, parallel=False), full, rtol=1e-10, atol=1e-10)
    x1 = torch.cat([x, torch.ones_like(x[..., :1])], -1)
    u = (x1 @ rnn.w_m_in.T) * (x1 @ rnn.w_x_in.T)
    lam = torch.exp(-torch.exp(rnn.nu))
    h = sum(lam ** (19 - s) * u[:, s] for s in range(20))
    y = ((h @ rnn.w_m_out.T) * (h @ rnn.w_x_out.T)) @ rnn.readout_matrix.T
    torch.testing.assert_close(full[:, -1], y, rtol=1e-10, atol=1e-10)
    assert ((lam >= 0) & (lam <= 1)).all()


@pytest.mark.parametrize("recurrence", ["diagonal", "dense"])
@pytest.mark.parametrize("readout", [Readout(position=-1, start=3, stop=5, sign=-1.0),
                                     Readout(position=6, start=0, stop=2, sign=1.0)])
def test_predict_computes_the_output_at_the_query_only(recurrence, readout):
    """`predict` runs D g_out at the read-out position only: it must equal reading the full forward there."""
    torch.manual_seed(1)
    rnn = GatedLinearRNN(5, 5, readout, hidden=12, gates=9, recurrence=recurrence).double()
    x = torch.randn(4, 11, 5, dtype=torch.float64)
    expected = readout.sign * rnn(x)[:, readout.position, readout.start : readout.stop]
    torch.testing.assert_close(rnn.predict(x), expected, rtol=1e-12, atol=1e-12)
    assert rnn.predict(x).shape == (4, readout.stop - readout.start)


@pytest.mark.parametrize("T", [2, 16, 17, 40])
@pytest.mark.parametrize("width", [3, 2**15])
def test_scan_picks_a_form_and_both_give_the_recurrence(T, width):
    """`scan` goes sequential for short or wide inputs and parallel otherwise: either way, h_t = a_t h_{t-1} + b_t
    from h_0 (written out here step by step), with complex pairs too."""
    g = torch.Generator().manual_seed(T)
    a = torch.rand(1, T, width, 2, generator=g, dtype=torch.float64) * 0.9
    b = torch.randn(1, T, width, 2, generator=g, dtype=torch.float64)
    h0 = torch.randn(1, width, 2, generator=g, dtype=torch.float64)
    h, expected = h0, []
    for t in range(T):
        re = a[:, t, :, 0] * h[..., 0] - a[:, t, :, 1] * h[..., 1]
        im = a[:, t, :, 0] * h[..., 1] + a[:, t, :, 1] * h[..., 0]
        h = torch.stack([re, im], -1) + b[:, t]
        expected.append(h)
    torch.testing.assert_close(scan(a, b, complex_pairs=True, h0=h0), torch.stack(expected, 1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.compile)])
@pytest.mark.parametrize("T", [1, 13])
def test_last_state_equals_the_scan_with_its_gradients(T, compiled):
    """`last_state` (the read-out's shortcut: a weighted sum eager, the unrolled recurrence compiled) gives
    the scan's h_T and the same gradients, also at λ = 0 and λ = 1, where the constructions put neurons."""
    g = torch.Generator().manual_seed(T)
    lam0 = torch.tensor([0.0, 1.0, 0.5, 0.93], dtype=torch.float64)
    b0 = torch.randn(3, T, 4, generator=g, dtype=torch.float64)
    weights = torch.randn(3, 4, generator=g, dtype=torch.float64)

    def grads(fn):
        lam, b = lam0.clone().requires_grad_(), b0.clone().requires_grad_()
        h = fn(lam, b)
        (h * weights).sum().backward()
        # at T = 1, h_T = b_1 does not involve λ: its gradient is zero, or None where λ was never read
        return h.detach(), torch.zeros_like(lam) if lam.grad is None else lam.grad, b.grad

    fast = torch.compile(last_state, dynamic=False) if compiled else last_state
    for got, want in zip(grads(fast), grads(lambda lam, b: sequential_scan(lam.expand_as(b), b)[:, -1])):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="does not match"):
        last_state(lam0, b0.unsqueeze(2))  # λ (C,) against b (B, T, M, C) would line T up with M


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("d,seed", [(3, 0), (4, 1), (6, 2)])
def test_constructed_rnn_reproduces_random_lsa(compact, d, seed):
    lsa = random_lsa(d, seed)
    rnn = lsa_rnn(lsa_weights(lsa), READOUT, compact=compact)
    assert rnn.hidden == (d * (d + 1) // 2 if compact else d * d) + d
    x = torch.randn(8, 40, d, generator=torch.Generator().manual_seed(seed + 10), dtype=torch.float64)
    ref = lsa(x)
    assert ref.abs().max() > 1
    torch.testing.assert_close(rnn(x), ref, rtol=0, atol=1e-10)
    ca, _ = coefficients(prediction_map(rnn), d)
    cb, _ = coefficients(prediction_map(lsa), d)
    assert polynomial_distance(ca, cb) < 1e-10


def test_compact_construction_needs_invertible_values():
    lsa = random_lsa(3, 0)
    with torch.no_grad():
        lsa.layers[0].w_v[2] = lsa.layers[0].w_v[0]
    with pytest.raises(ValueError, match="invertible W_V"):
        lsa_rnn(lsa_weights(lsa), READOUT, compact=True)


def test_rnn_that_does_gd_on_zucchet_task():
    task = LinearRegressionTask(d_x=3, d_y=3, n_context=12, x_scale=3**0.5, w_std=(1 / 3) ** 0.5)
    lsa = LinearSelfAttention(6, task.readout, attention="causal", residual=False).double()
    construct_gd_lsa(lsa, 3, task.analytic_eta())
    rnn = lsa_rnn(lsa_weights(lsa), task.readout)
    b = task.sample(500, seed=4, dtype=torch.float64)
    from zoo.science.tasks.regression import gd_predict

    torch.testing.assert_close(rnn.predict(b.tokens), gd_predict(b, task.analytic_eta()), rtol=0, atol=1e-10)


def test_table2_gd_column():
    """θ_GD on the Zucchet task: x_i² y_1 coefficients = η* = 1/14.8 = 6.76e-2, nothing else."""
    task = LinearRegressionTask(d_x=3, d_y=3, n_context=12, x_scale=3**0.5, w_std=(1 / 3) ** 0.5)
    lsa = LinearSelfAttention(6, task.readout, attention="causal", residual=False)
    construct_gd_lsa(lsa, 3, task.analytic_eta())
    table = regression_coefficient_table(lsa, 3, 3)
    for term in ("x1^2 y1", "x2^2 y1", "x3^2 y1"):
        assert table[term] == pytest.approx(1 / 14.8, rel=1e-6)
        assert round(table[term], 4) == 0.0676
    assert table["residual norm"] < 1e-10


def test_polynomial_fit_is_exact_on_a_known_polynomial():
    exps = monomials(2, 4)
    assert len(exps) == 15
    coef, exps = coefficients(lambda x: (3 * x[:, :1] ** 2 * x[:, 1:] - x[:, 1:] ** 4 + 0.5), 2)
    expected = torch.zeros(15, 1, dtype=torch.float64)
    expected[exps.index((2, 1))] = 3
    expected[exps.index((0, 4))] = -1
    expected[exps.index((0, 0))] = 0.5
    torch.testing.assert_close(coef, expected, rtol=0, atol=1e-10)


def padded(rnn: GatedLinearRNN, hidden: int, gates: int) -> GatedLinearRNN:
    """`rnn` in the first neurons and gates of a larger float64 RNN whose other weights are all 0."""
    n, m = rnn.hidden, rnn.readout_matrix.shape[1]
    big = GatedLinearRNN(rnn.d_in, rnn.d_out, rnn.readout, hidden=hidden, gates=gates).double()
    with torch.no_grad():
        for p in big.parameters():
            p.zero_()
        big.w_m_in[:n], big.w_x_in[:n], big.nu[:n] = rnn.w_m_in, rnn.w_x_in, rnn.nu
        big.w_m_out[:m, :n], big.w_x_out[:m, :n], big.readout_matrix[:, :m] = rnn.w_m_out, rnn.w_x_out, rnn.readout_matrix
    return big


def test_kv_q_scores_and_pruning():
    task = LSATeacherTask(d=4, teacher_seed=4, x_std=0.4)
    lsa = teacher_lsa(task)
    rnn = lsa_rnn(lsa_weights(lsa), task.readout)
    scores = kv_q_scores(rnn, task.teacher_weights())
    assert scores["kv_score"] < 1e-10 and scores["q_score"] < 1e-10
    assert (scores["memory_neurons"], scores["forget_neurons"]) == (16, 4)
    # pad the construction with dead neurons: pruning removes exactly them and keeps the function
    big = padded(rnn, hidden=30, gates=25)
    with torch.no_grad():
        big.w_m_in[25:] = 1.0  # fed but never read: prunable too
    hidden, gates = active_neurons(big)
    assert int(hidden.sum()) == 20 and int(gates.sum()) == 16
    small = prune(big)
    x = torch.randn(3, 32, 4, dtype=torch.float64)
    torch.testing.assert_close(small(x), big(x), rtol=0, atol=1e-12)
    assert kv_q_scores(big, task.teacher_weights())["prunable_neurons"] == 10


def test_prune_by_function_removes_what_the_construction_does_not_need():
    """The full construction (20 hidden, 16 gates) padded with 6 leaky neurons and 4 gates that read every
    neuron and add a small quartic to the output: greedy pruning by function back to 20 / 16 removes
    exactly the extra units (the 4 gates still read live neurons, so they must be cut one by one) and
    recovers the construction's function to float64 rounding, its loss going from > 0 to ~0."""
    task = LSATeacherTask(d=4, teacher_seed=4, x_std=0.4)
    rnn = lsa_rnn(lsa_weights(teacher_lsa(task)), task.readout)
    big = padded(rnn, hidden=26, gates=20)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, rows, cols in (("w_m_in", slice(20, 26), slice(None)), ("w_x_in", slice(20, 26), slice(None)),
                                 ("w_m_out", slice(16, 20), slice(None)), ("w_x_out", slice(16, 20), slice(None))):
            w = getattr(big, name)
            w[rows, cols] = 0.1 * torch.randn(w[rows, cols].shape, generator=g, dtype=torch.float64)
        big.nu[20:] = torch.randn(6, generator=g, dtype=torch.float64)  # leaky neurons, 0 < λ < 1
        big.readout_matrix[:, 16:] = 0.05 * torch.randn(4, 4, generator=g, dtype=torch.float64)
    big.requires_grad_(False)
    x = torch.randn(16, 32, 4, generator=g, dtype=torch.float64)
    target = rnn(x).detach()
    loss = lambda m: float(((m(x) - target) ** 2).mean())  # noqa: E731
    assert loss(big) > 1e-6
    small, curve = prune_by_function(big, loss, hidden=20, gates=16)
    assert (small.hidden, small.readout_matrix.shape[1]) == (20, 16)
    assert [r["hidden"] for r in curve] == [26, 25, 24, 23, 22, 21, 20, 20, 20, 20, 20]
    assert [r["gates"] for r in curve][-1] == 16 and curve[-1]["loss"] < 1e-28
    torch.testing.assert_close(small(x), target, rtol=0, atol=1e-12)
    # by λ group: keep the 16 memory and 4 forget neurons, none of the 6 leaky ones
    lam = big.lam()
    groups = [(lam == 1, 16), (lam == 0, 4), ((lam > 0) & (lam < 1), 0)]
    small, curve = prune_by_function(big, loss, hidden=0, gates=16, groups=groups)
    assert [r["hidden"] for r in curve][:7] == [26, 25, 24, 23, 22, 21, 20] and curve[-1]["loss"] < 1e-28
    torch.testing.assert_close(small(x), target, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n,blind", [(10, False), (13, False), (14, True), (18, True)])
def test_kv_score_is_blind_with_as_many_memory_neurons_as_quadratics(n, blind):
    """Random, untrained memory neurons: fewer than (d+1)(d+2)/2 − 1 = 14 cannot encode the
    teacher's key-values (score well above 0); 14 or more score 0 whatever they are (docstring)."""
    task = LSATeacherTask(d=4, teacher_seed=4, x_std=0.4)
    torch.manual_seed(0)
    rnn = GatedLinearRNN(4, 4, task.readout, hidden=n)
    with torch.no_grad():
        rnn.nu.fill_(-30.0)  # λ = 1 to float64 precision
    score = kv_q_scores(rnn, task.teacher_weights())["kv_score"]
    assert (score < 1e-12) if blind else (score > 1e-2)


def test_imperfect_memory_effect():
    """0 for the construction (every λ is exactly 0 or 1); for a neuron with λ = 0.9 that feeds
    the output it is exactly the relative change of silencing that neuron."""
    task = LSATeacherTask(d=4, teacher_seed=4, x_std=0.4)
    rnn = lsa_rnn(lsa_weights(teacher_lsa(task)), task.readout)
    x = torch.randn(8, 32, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert imperfect_memory_effect(rnn, x) == 0.0
    leaky = padded(rnn, hidden=21, gates=17)
    with torch.no_grad():
        leaky.w_m_in[20, 0], leaky.w_x_in[20, 4] = 1.0, 1.0  # h ← 0.9 h + x_1
        leaky.nu[20] = torch.log(-torch.log(torch.tensor(0.9, dtype=torch.float64)))
        leaky.w_m_out[16, 20], leaky.w_x_out[16, 20], leaky.readout_matrix[0, 16] = 1.0, 1.0, 0.3  # reads h²
    leaky.requires_grad_(False)
    out = leaky(x)
    h = sequential_scan(torch.full((8, 32, 1), 0.9, dtype=torch.float64), x[..., :1])
    extra = torch.zeros_like(out)
    extra[..., 0] = 0.3 * h[..., 0] ** 2
    torch.testing.assert_close(out - extra, rnn.requires_grad_(False)(x), rtol=0, atol=1e-12)  # the extra neuron adds exactly that
    expected = float(extra.norm() / out.norm())
    assert expected > 1e-2
    assert imperfect_memory_effect(leaky, x) == pytest.approx(expected, rel=1e-12)


def test_memory_leak():
    """0 on the construction (λ = 1 exactly); the median over memory neurons only, so dead
    neurons and forget neurons (λ = 0) do not count; None when no neuron remembers."""
    task = LSATeacherTask(d=4, teacher_seed=4, x_std=0.4)
    rnn = lsa_rnn(lsa_weights(teacher_lsa(task)), task.readout)
    assert memory_leak(rnn) == 0.0
    leaky = padded(rnn, hidden=24, gates=16)  # 4 dead neurons at λ = exp(−1) stay out of the median
    lam = leaky.lam()
    memory = (lam > 0.5).nonzero().squeeze(1)[:16]
    gaps = torch.linspace(1e-3, 3e-2, 16, dtype=torch.float64)  # median of 16: mean of the 8th and 9th
    with torch.no_grad():
        leaky.nu[memory] = torch.log(-torch.log1p(-gaps))
    assert memory_leak(leaky) == pytest.approx(float(gaps[7:9].mean()), rel=1e-9)
    with torch.no_grad():
        leaky.nu.fill_(10.0)  # every λ ≈ 0
    assert memory_leak(leaky) is None


@pytest.mark.parametrize("recurrence", ["diagonal", "dense"])
def test_recurrent_lr_and_no_decay_reach_only_nu(recurrence):
    from zoo.running.train import make_optimizer
    from zoo.science.registry import TrainRecipe

    model = GatedLinearRNN(4, 4, Readout(None, 0, 4, 1.0), hidden=6, recurrence=recurrence)
    opt = make_optimizer(model, TrainRecipe(kind="trained", lr=1e-3, recurrent_lr=1e-2, weight_decay=1e-4,
                                            steps=1, batch_size=1))
    groups = {(g["lr"], g["weight_decay"]): g["params"] for g in opt.param_groups}
    if recurrence == "diagonal":
        assert set(groups) == {(1e-2, 0.0), (1e-3, 1e-4)}
        assert groups[(1e-2, 0.0)] == [model.nu]
    else:  # the dense A is an ordinary weight: decayed, at the main lr
        assert set(groups) == {(1e-3, 1e-4)}
        assert any(p is model.w_rec for p in groups[(1e-3, 1e-4)])
