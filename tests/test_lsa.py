"""LSA and θ_GD against their defining math, in float64 on fresh random tasks."""

import pytest
import torch

from zoo.science.models import NotRecurrentError
from zoo.science.models.lsa import LinearSelfAttention, construct_gd_lsa
from zoo.science.tasks.regression import LinearRegressionTask, gd_predict

TASKS = [
    LinearRegressionTask(d_x=10, d_y=1, n_context=10),  # blogpost
    LinearRegressionTask(d_x=3, d_y=3, n_context=12, x_scale=3**0.5, w_std=(1 / 3) ** 0.5),  # Zucchet
    LinearRegressionTask(d_x=5, d_y=2, n_context=40, x_dist="normal"),
]


def gd_lsa(task, eta, n_layers=1, attention="strict_causal", loops=1, damping=1.0):
    m = LinearSelfAttention(task.token_dim, task.readout, n_layers=n_layers, attention=attention,
                            loops=loops, damping=damping).double()
    return construct_gd_lsa(m, task.d_x, eta / damping)


@pytest.mark.parametrize("task", TASKS, ids=["blogpost", "zucchet", "normal"])
@pytest.mark.parametrize("attention", ["causal", "strict_causal", "context"])
def test_theta_gd_query_prediction_is_one_gd_step(task, attention, rng):
    eta = 0.37 * task.analytic_eta() + torch.rand((), generator=rng).item() * task.analytic_eta()
    b = task.sample(512, generator=rng, dtype=torch.float64)
    pred = gd_lsa(task, eta, attention=attention).predict(b.tokens)
    # ŷ = η Σ_i y_i x_iᵀ x_q written out independently of gd_predict:
    expected = eta * torch.einsum("bcy,bcx,bx->by", b.y_context, b.x_context, b.x_query)
    torch.testing.assert_close(pred, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(pred, gd_predict(b, eta), rtol=0, atol=1e-10)


@pytest.mark.parametrize("n_layers", [2, 3, 5])
def test_multi_layer_theta_gd_is_multi_step_gd(n_layers, rng):
    task = TASKS[0]
    eta = 0.5 * task.analytic_eta()
    b = task.sample(256, generator=rng, dtype=torch.float64)
    pred = gd_lsa(task, eta, n_layers=n_layers, attention="context").predict(b.tokens)
    torch.testing.assert_close(pred, gd_predict(b, eta, steps=n_layers), rtol=0, atol=1e-6)
    # and it is not the one-step answer: the test can tell the two apart
    assert (pred - gd_predict(b, eta, steps=1)).abs().max() > 1e-2


def test_looped_theta_gd_with_damping_is_multi_step_gd(rng):
    task = TASKS[1]
    eta = task.analytic_eta()
    b = task.sample(256, generator=rng, dtype=torch.float64)
    model = gd_lsa(task, eta, attention="context", loops=4, damping=0.7)
    torch.testing.assert_close(model.predict(b.tokens), gd_predict(b, eta, steps=4), rtol=0, atol=1e-6)


def test_multi_layer_causal_is_not_multi_step_gd(rng):
    """Why multi-layer GD needs context attention: causal layers see partial contexts."""
    task = TASKS[0]
    eta = 0.5 * task.analytic_eta()
    b = task.sample(256, generator=rng, dtype=torch.float64)
    pred = gd_lsa(task, eta, n_layers=2, attention="strict_causal").predict(b.tokens)
    assert (pred - gd_predict(b, eta, steps=2)).abs().max() > 1e-3


def test_context_attention_has_no_recurrence():
    model = LinearSelfAttention(4, TASKS[0].readout, attention="context")
    with pytest.raises(NotRecurrentError, match="strict_causal"):
        model.init_state(2)


def test_wrong_state_shape_is_a_clear_error():
    model = LinearSelfAttention(4, TASKS[0].readout, n_layers=2)
    with pytest.raises(ValueError, match=r"state '1.kv' has shape \(2, 3, 3\), expected \(2, 4, 4\)"):
        model.check_state((torch.zeros(2, 4, 4), torch.zeros(2, 3, 3)), batch=2)


def test_loop_curve_of_theta_gd_is_k_steps_of_damped_gd(rng):
    """Blogpost Figure 13: θ_GD (trained-from-one-layer shape, strict causal) applied K times with
    dampening λ is K GD steps at rate λη; the original model is left untouched."""
    from zoo.science.evaluation import loop_curve

    task = TASKS[0]
    eta = task.analytic_eta()
    b = task.sample(256, generator=rng, dtype=torch.float64)
    model = gd_lsa(task, eta)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = loop_curve(model, task, b, [1, 2, 4], [1.0, 0.75], eta=eta)
    for r in rows:
        gd = task.loss(gd_predict(b, r["damping"] * eta, r["loops"]), b.targets).item()
        assert r["gd_loss"] == pytest.approx(gd, rel=1e-12)
        assert r["test_loss"] == pytest.approx(gd, rel=1e-9)
    assert len({round(r["test_loss"], 6) for r in rows}) == len(rows)  # K and λ really change the answer
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_zeroing_x_updates_keeps_the_one_layer_prediction(rng):
    """W_P's x-rows never reach a single application's read-out, so zeroing them (before looping
    a trained layer) leaves K = 1 exactly as trained and changes K > 1."""
    from zoo.science.evaluation import loop_curve

    task = TASKS[0]
    model = LinearSelfAttention(task.token_dim, task.readout, attention="strict_causal", init_std=0.3).double()
    b = task.sample(128, generator=rng, dtype=torch.float64)
    plain = loop_curve(model, task, b, [1, 3], [1.0])
    zeroed = loop_curve(model, task, b, [1, 3], [1.0], zero_x_updates=True)
    assert zeroed[0]["test_loss"] == pytest.approx(plain[0]["test_loss"], rel=1e-12)
    assert zeroed[1]["test_loss"] != pytest.approx(plain[1]["test_loss"], rel=1e-3)
    with pytest.raises(ValueError, match="one-layer"):
        loop_curve(LinearSelfAttention(task.token_dim, task.readout, n_layers=2).double(), task, b, [2], [1.0])


def test_constant_channel_lets_one_layer_do_gd_on_the_products_layout():
    """On c_t = (x_t y_t, x_{t+1}) a bias-free LSA is odd in the tokens and cannot beat the zero
    predictor; with the constant channel and no residual, one causal layer is one GD step:
    k = x_t y_t, q = x_{t+1}, v = the constant into output channel 0, W_P = η I."""
    from zoo.science.models import create_model
    from zoo.science.registry import get_entry, get_task_spec

    entry = get_entry("lsa-1l-gdssm-1d")
    task = get_task_spec(entry.task).build()
    model = create_model(entry.arch, task).double()
    f, eta = task.d_x, task.analytic_eta()
    d = 2 * f + 1  # with the constant channel
    with torch.no_grad():
        layer = model.layers[0]
        layer.w_k.zero_()[:f, :f] = torch.eye(f)  # keys: x_t y_t
        layer.w_q.zero_()[:f, f : 2 * f] = torch.eye(f)  # queries: x_{t+1}
        layer.w_v.zero_()[0, d - 1] = 1.0  # values: the constant, into channel 0
        layer.w_p.copy_(eta * torch.eye(d, dtype=torch.float64))
    b = task.sample(500, seed=21, dtype=torch.float64)
    with torch.no_grad():
        pred = model.predict(b.tokens)
        flipped = model.predict(-b.tokens)
    torch.testing.assert_close(pred, gd_predict(b, eta), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(flipped, -pred)  # no longer odd in the tokens
    bias_free = create_model(entry.arch.model_copy(update={"constant": False}), task).double()
    with torch.no_grad():
        torch.testing.assert_close(bias_free.predict(-b.tokens), -bias_free.predict(b.tokens))  # odd without it


def test_gd_rate_curve_peaks_at_the_rate_the_model_implements(rng):
    """Blogpost Figure 12: θ_GD built with rate η₀ is GD at η₀ exactly (prediction and gradient L2
    zero, the closest η is η₀), farther at every other η, and its cosine is 1 whatever η."""
    from zoo.science.evaluation import gd_rate_curve
    from zoo.science.tasks.regression import empirical_eta

    task = TASKS[0]
    eta0 = 0.8 * task.analytic_eta()
    b = task.sample(512, generator=rng, dtype=torch.float64)
    result = gd_rate_curve(gd_lsa(task, eta0), task, b, [0.5 * eta0, eta0, 1.5 * eta0])
    assert result["closest_eta"] == pytest.approx(eta0, rel=1e-10)
    assert result["loss_eta"] == pytest.approx(empirical_eta(b), rel=1e-12)
    assert result["analytic_eta"] == task.analytic_eta()
    low, at, high = result["curve"]
    assert at["pred_l2_to_gd"] < 1e-20 and at["sensitivity_l2_to_gd"] < 1e-20
    assert min(low["pred_l2_to_gd"], high["pred_l2_to_gd"]) > 1e-4
    assert all(r["sensitivity_cosine"] == pytest.approx(1, abs=1e-12) for r in result["curve"])
    assert at["gd_loss"] == pytest.approx(task.loss(gd_predict(b, eta0), b.query_targets).item(), rel=1e-12)


def _pair_coefficients(predict, task, u, v, w) -> torch.Tensor:
    """C[i, k] = the coefficient of (vᵀy_i)(uᵀx_k)(wᵀx_q) in the first channel of `predict(batch)`, the query
    prediction, for context examples i, k (the mixed third derivative at the origin picks exactly that monomial
    of a polynomial)."""
    n = task.n_context
    out = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for k in range(n):
            s = torch.zeros(3, dtype=torch.float64, requires_grad=True)
            x = torch.zeros(1, n + 1, task.d_x, dtype=torch.float64)
            y = torch.zeros(1, n + 1, task.d_y, dtype=torch.float64)
            x = x.index_put((torch.tensor([0]), torch.tensor([k])), s[1] * u[None])
            x = x.index_put((torch.tensor([0]), torch.tensor([n])), s[2] * w[None], accumulate=True)
            y = y.index_put((torch.tensor([0]), torch.tensor([i])), s[0] * v[None])
            f = predict(task.batch_from_arrays(x, y))[0, 0]
            (g0,) = torch.autograd.grad(f, s, create_graph=True)
            (g1,) = torch.autograd.grad(g0[0], s, create_graph=True)
            (g2,) = torch.autograd.grad(g1[1], s)
            out[i, k] = g2[2]
    return out


def _differences_depend_on_the_row(c: torch.Tensor) -> float:
    """How far C[i, k] − C[i, 0] (k ≤ i) is from being the same in every row i ≥ k: 0 when C[i, k] = α_i + β_k."""
    n = c.shape[0]
    return max(abs((c[i, k] - c[i, 0]) - (c[k, k] - c[k, 0])).item() for k in range(n) for i in range(k, n))


def test_linear_transformers_cannot_pair_interleaved_examples():
    """The lsa-no-positions departure (Sushma Figure 6's linear transformers on x_1, y_1, …, x_N, y_N, x_q):
    one causal layer with a constant channel has no y_i x_kᵀ x_q term at all (each term of its sum reads one
    token besides the query); two layers have C[i, k] = α_i + β_k for k ≤ i, which GD's η δ_ik is not once
    N ≥ 3. On random weights in float64. The same extraction on GD itself recovers η δ_ik (a check on the
    extraction) and fails the α_i + β_k check (a check on the check), and three layers break the form."""
    task = LinearRegressionTask(d_x=2, d_y=2, n_context=4, layout="interleaved")
    g = torch.Generator().manual_seed(5)
    u, v, w = (torch.randn(2, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.random.fork_rng():  # the layers' initialisation draws from the global generator
        torch.manual_seed(6)
        models = [LinearSelfAttention(task.token_dim, task.readout, n_layers=n, attention="causal", constant=True,
                                      residual=n > 1, init_std=0.7).double() for n in (1, 2, 3)]
    c1, c2, c3 = (_pair_coefficients(lambda b, m=m: m.predict(b.tokens), task, u, v, w) for m in models)
    assert c1.abs().max() < 1e-12
    assert c2.abs().max() > 1e-2  # two layers do have such terms
    assert _differences_depend_on_the_row(c2) < 1e-10 * c2.abs().max()
    assert _differences_depend_on_the_row(c3) > 1e-2 * c3.abs().max()  # not a property of every depth
    eta = 0.3  # GD: ŷ = η Σ_j y_j x_jᵀ x_q, so C = η (vᵀe_0)(uᵀw) I for the first output channel
    c_gd = _pair_coefficients(lambda b: gd_predict(b, eta), task, u, v, w)
    torch.testing.assert_close(c_gd, eta * v[0] * (u @ w) * torch.eye(task.n_context, dtype=torch.float64),
                               rtol=1e-12, atol=1e-12)
    assert _differences_depend_on_the_row(c_gd) > 0.1 * c_gd.abs().max()


def _pairing_gd_lsa(task, eta: float) -> LinearSelfAttention:
    """Two causal layers without residual, a constant channel and one-hot positions (the width of
    lsa-2l-gdssm-nd with arch.positions = T, residual = false), set by hand to one GD step on interleaved tokens.
    Channels: x 0:d_x, y d_x:d, the constant d, position t at d + 1 + t.
    Layer 1 scores by position alone, [s = t] + [t is a y token][s = t − 1], with identity values on (x, y):
    every y token leaves as (x_j, y_j), every x token (the query's included) as itself.
    Layer 2 scores x_sᵀ x_t and writes η y_s onto the read-out channels: at the query,
    η Σ_j (x_jᵀ x_q) y_j, one GD step from W = 0 (x tokens carry y = 0 and add nothing)."""
    d, P = task.token_dim, task.n_tokens
    model = LinearSelfAttention(d, task.readout, n_layers=2, attention="causal", residual=False, constant=True,
                                positions=P).double()
    r = task.readout
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        first, second = model.layers
        for t in range(P):
            first.w_k[d + 1 + t, d + 1 + t] = first.w_q[d + 1 + t, d + 1 + t] = 1.0
            if t % 2 == 1:  # y_j's token reads x_j's, the token before it
                first.w_q[d + t, d + 1 + t] = 1.0
        first.w_v[:d, :d] = first.w_p[:d, :d] = torch.eye(d, dtype=torch.float64)
        second.w_k[: task.d_x, : task.d_x] = second.w_q[: task.d_x, : task.d_x] = torch.eye(task.d_x,
                                                                                           dtype=torch.float64)
        second.w_v[r.start : r.stop, task.d_x : d] = r.sign * eta * torch.eye(task.d_y, dtype=torch.float64)
        second.w_p[:] = torch.eye(model.layers[0].w_p.shape[0], dtype=torch.float64)
    return model


@pytest.mark.parametrize("d_x,d_y,n_context", [(5, 3, 10), (3, 3, 7), (4, 1, 25)])
def test_one_hot_positions_let_two_layers_do_one_gd_step_on_interleaved_tokens(d_x, d_y, n_context, rng):
    """What the lsa-no-positions departure takes away (Sushma Figure 6; sweeps/figure-6-positions.toml):
    with one-hot positions, two linear-attention layers (no residual) express one GD step on x_1, y_1, …, x_q
    exactly, in float64 on fresh tasks; its coefficients C[i, k] are η δ_ik, outside the α_i + β_k form that
    bounds two layers without positions."""
    task = LinearRegressionTask(d_x=d_x, d_y=d_y, n_context=n_context, layout="interleaved")
    eta = 0.21 + torch.rand((), generator=rng).item()
    model = _pairing_gd_lsa(task, eta)
    b = task.sample(256, generator=rng, dtype=torch.float64)
    expected = eta * torch.einsum("bcy,bcx,bx->by", b.y_context, b.x_context, b.x_query)  # written out
    torch.testing.assert_close(model.predict(b.tokens), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.readout(model(b.tokens)), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(expected, gd_predict(b, eta), rtol=1e-12, atol=1e-12)
    if n_context >= 3:
        g = torch.Generator().manual_seed(n_context)
        u, v, w = (torch.randn(n, generator=g, dtype=torch.float64) for n in (d_x, d_y, d_x))
        c = _pair_coefficients(lambda batch: model.predict(batch.tokens), task, u, v, w)
        torch.testing.assert_close(c, eta * v[0] * (u @ w) * torch.eye(n_context, dtype=torch.float64),
                                   rtol=1e-10, atol=1e-10)
        assert _differences_depend_on_the_row(c) > 0.1 * c.abs().max()


def test_positions_read_a_prompt_of_at_most_p_tokens_as_a_sequence():
    """Random weights in float64: the read-out's shortcut (`predict`) equals the full forward; a prompt longer
    than the table, and any step or chunk, is a clear error; one-hot channels never reach the output."""
    task = LinearRegressionTask(d_x=3, d_y=2, n_context=5, layout="interleaved")
    torch.manual_seed(2)
    model = LinearSelfAttention(task.token_dim, task.readout, n_layers=2, attention="causal", constant=True,
                                positions=task.n_tokens, init_std=0.3).double()
    b = task.sample(64, seed=3, dtype=torch.float64)
    out = model(b.tokens)
    assert out.shape == b.tokens.shape and not model.recurrent
    torch.testing.assert_close(model.predict(b.tokens), model.readout(out), rtol=1e-12, atol=1e-12)
    shorter = model(b.tokens[:, :-2])  # causal: a prefix reads as the same prefix
    torch.testing.assert_close(shorter, out[:, :-2], rtol=1e-12, atol=1e-12)
    longer = torch.cat([b.tokens, b.tokens[:, :1]], dim=1)
    with pytest.raises(ValueError, match=f"longer than the model's {task.n_tokens} positions"):
        model(longer)
    with pytest.raises(NotRecurrentError, match="one-hot positions"):
        model.state_shapes()
    with pytest.raises(NotRecurrentError, match="one-hot positions"):
        model.forward_chunk(b.tokens, None)
    with pytest.raises(NotRecurrentError, match="one-hot positions"):
        model.step(b.tokens[:, 0], ())


@pytest.mark.parametrize("extra", [{}, {"constant": True}, {"positions": 11}], ids=["bare", "constant", "positions"])
def test_one_layer_has_a_polynomial_map_only_on_bare_tokens(extra, tmp_path):
    """Table 2's instantaneous polynomial reads single bare tokens: a one-layer LSA with a constant channel or
    positions has none, and evaluating it on a (x, y)-pairs task scores it without one (it used to raise)."""
    from zoo.science.evaluation import evaluate

    task = LinearRegressionTask(d_x=4, d_y=1, n_context=10)  # pairs: 11 tokens
    torch.manual_seed(0)
    model = LinearSelfAttention(task.token_dim, task.readout, attention="causal", **extra)
    assert model.has_polynomial_map() == (not extra)
    metrics = evaluate(model, task, task.sample(64, seed=1))
    assert ("polynomial" in metrics) == (not extra) and metrics["test_loss"] > 0
