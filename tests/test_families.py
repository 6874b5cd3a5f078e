"""The comparison families (LRU, S5, LSTM, GRU, bi-LSTM, Mamba, Griffin, softmax transformer):
their defining equations, forward = iterated step, and what each may and may not see."""

import dataclasses
import math

import pytest
import torch

from zoo.science.models import NotRecurrentError, create_model
from zoo.science.models.griffin import GriffinRecurrentBlock, LocalAttentionBlock
from zoo.science.models.lru import LRUBlock, S5Block
from zoo.science.models.mamba import MambaBlock
from zoo.science.models.scan import causal_depthwise_conv
from zoo.science.models.stack import RecurrentStackArch
from zoo.science.models.transformer import TransformerArch
from zoo.science.tasks.regression import LinearRegressionTask

TASK = LinearRegressionTask(d_x=3, d_y=2, n_context=9)
STACKS = [
    {"type": "lru", "variant": "out"}, {"type": "lru", "variant": "in_out"}, {"type": "lru", "variant": "in_skip"},
    {"type": "s5"}, {"type": "lstm"}, {"type": "gru"}, {"type": "mamba", "state_size": 4},
    {"type": "griffin", "window": 3},
]


def stack(spec, n_layers=2, width=8):
    torch.manual_seed(0)
    return create_model(RecurrentStackArch(width=width, n_layers=n_layers, hidden=6, **spec), TASK).double()


def test_lru_is_the_complex_recurrence_of_eqs_6_to_9():
    """Against a direct implementation with torch's complex numbers."""
    torch.manual_seed(1)
    block = LRUBlock(width=4, hidden=5, variant="out").double()
    x = torch.randn(2, 7, 4, dtype=torch.float64)
    lam = torch.exp(-torch.exp(block.nu_log) + 1j * torch.exp(block.theta_log))
    gamma = torch.exp(block.gamma_log)
    b = torch.view_as_complex(block.b.contiguous())
    c = torch.view_as_complex(block.c.contiguous())
    h = torch.zeros(2, 5, dtype=torch.complex128)
    outs = []
    for t in range(7):
        h = lam * h + gamma * (x[:, t].to(torch.complex128) @ b.T)
        y_tilde = (h @ c.T).real + block.d * x[:, t]
        outs.append(torch.sigmoid(y_tilde @ block.w_m.T) * (y_tilde @ block.w_x.T))
    torch.testing.assert_close(block(x), torch.stack(outs, 1), rtol=0, atol=1e-12)
    assert (lam.abs() < 1).all()  # the ring initialisation is stable


def test_s5_zero_order_hold_discretisation():
    torch.manual_seed(2)
    block = S5Block(width=3, hidden=4).double()
    dt = torch.exp(block.log_dt)
    big_lambda = -torch.exp(block.nu_log) + 1j * block.theta
    lam = torch.exp(big_lambda * dt)
    b_bar = ((lam - 1) / big_lambda).unsqueeze(-1) * torch.view_as_complex(block.b.contiguous())
    u = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(torch.view_as_complex(block.lam().contiguous()), lam)
    torch.testing.assert_close(torch.view_as_complex(block.drive(u).contiguous()), u.to(torch.complex128) @ b_bar.T)


def test_mamba_parallel_and_sequential_scans_agree():
    torch.manual_seed(3)
    block = MambaBlock(width=6, state_size=4).double()
    x = torch.randn(2, 33, 6, dtype=torch.float64)
    torch.testing.assert_close(block(x, parallel=True), block(x, parallel=False), rtol=0, atol=1e-12)


def test_mamba_is_selective():
    """Δ, B and C depend on the input: scaling one token changes the decay applied to the state."""
    torch.manual_seed(4)
    block = MambaBlock(width=4, state_size=3).double()
    u = torch.randn(2, 8, dtype=torch.float64)
    a1, _, c1 = block._selective(u)
    a2, _, c2 = block._selective(3 * u)
    assert (a1 - a2).abs().max() > 1e-3 and (c1 - c2).abs().max() > 1e-3


def test_local_attention_sees_exactly_its_window():
    torch.manual_seed(5)
    block = LocalAttentionBlock(width=4, window=3).double()
    x = torch.randn(1, 10, 4, dtype=torch.float64)
    base = block(x)
    x2 = x.clone()
    x2[:, 4] += 1.0
    changed = (block(x2) - base).abs().amax(-1)[0] > 1e-9
    assert changed.tolist() == [t in (4, 5, 6) for t in range(10)]


def test_bidirectional_lstm_sees_the_future_and_has_no_state():
    torch.manual_seed(6)
    model = create_model(RecurrentStackArch(type="bilstm", width=8), TASK).double()
    tokens = TASK.sample(2, seed=0, dtype=torch.float64).tokens
    t2 = tokens.clone()
    t2[:, -1, :3] += 1.0
    assert (model(t2)[:, 0] - model(tokens)[:, 0]).abs().max() > 1e-6
    with pytest.raises(NotRecurrentError):
        model.init_state(2)


@pytest.mark.parametrize("window", [3, 16])
def test_local_attention_at_the_last_position_equals_its_full_pass(window):
    """Griffin's local attention read at the last token only (its query against the last W keys),
    with the window shorter and longer than the prompt, equals the full pass read there."""
    model = stack({"type": "griffin", "window": window}, n_layers=2)  # recurrent block, then local attention
    tokens = TASK.sample(4, seed=5, dtype=torch.float64).tokens
    torch.testing.assert_close(model.predict(tokens), model.readout(model(tokens)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("block", [GriffinRecurrentBlock(width=6, expand=2, conv_kernel=4), MambaBlock(width=6, conv_kernel=3)],
                         ids=["griffin", "mamba"])
def test_depthwise_conv_as_shifted_products_equals_conv1d(block):
    """The blocks' causal depthwise convolution, written as k shifted products, equals the Conv1d
    module it takes its weights from (float64, random inputs), gradients included."""
    torch.manual_seed(8)
    conv = block.conv.double()
    u = torch.randn(3, conv.kernel_size[0] - 1 + 9, conv.in_channels, dtype=torch.float64, requires_grad=True)  # (B, k − 1 + T, e)
    fast, want = causal_depthwise_conv(u, conv), conv(u.transpose(1, 2)).transpose(1, 2)  # (B, T, e)
    torch.testing.assert_close(fast, want, rtol=1e-12, atol=1e-12)
    direction = torch.randn_like(want)
    grads = [torch.autograd.grad((out * direction).sum(), [u, conv.weight, conv.bias]) for out in (fast, want)]
    for g_fast, g_want in zip(*grads):
        torch.testing.assert_close(g_fast, g_want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_layers", [1, 3])
def test_bidirectional_lstm_reads_its_last_position_with_one_backward_step(n_layers):
    """At the last position the backward direction has seen one token: `predict` runs it as one
    cell step (and the forward direction through the fused kernel with this layer's weights). It
    equals the full bidirectional pass, adds no parameter, and follows the weights it borrows."""
    torch.manual_seed(6)
    model = create_model(RecurrentStackArch(type="bilstm", width=8, n_layers=n_layers), TASK).double()
    tokens = TASK.sample(4, seed=2, dtype=torch.float64).tokens
    torch.testing.assert_close(model.predict(tokens), model.readout(model(tokens)), rtol=1e-12, atol=1e-12)
    assert not any("_forward_direction" in k for k in model.state_dict())
    with torch.no_grad():  # the borrowed forward weights and the backward step's weights are the layer's own
        model.blocks[-1].lstm.weight_hh_l0.mul_(0.5)
        model.blocks[-1].lstm.weight_ih_l0_reverse.mul_(2.0)
    torch.testing.assert_close(model.predict(tokens), model.readout(model(tokens)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_transformer_mask(causal):
    torch.manual_seed(7)
    model = create_model(TransformerArch(type="softmax_transformer", width=16, n_layers=2, causal=causal), TASK).double()
    tokens = TASK.sample(2, seed=0, dtype=torch.float64).tokens
    t2 = tokens.clone()
    t2[:, -1, :3] += 1.0
    first_changed = (model(t2)[:, 0] - model(tokens)[:, 0]).abs().max() > 1e-9
    assert first_changed == (not causal)
    assert not model.recurrent
    too_long = torch.zeros(1, 300, TASK.token_dim, dtype=torch.float64)
    with pytest.raises(ValueError, match="max_len"):
        model(too_long)
    with pytest.raises(ValueError, match="max_len"):  # the query-only read-out checks the same bound
        model.predict(too_long)


@pytest.mark.parametrize("positions", [False, True])
def test_softmax_transformer_without_positions_reads_the_context_as_a_set(positions):
    """Unmasked and without a position table (the blogpost-sized entries), each block is equivariant
    to the tokens' order, so the query's prediction is the same for every order of the context
    pairs: up to float64 rounding. With the table, the order matters (the test can fail)."""
    torch.manual_seed(11)
    arch = TransformerArch(type="softmax_transformer", width=16, n_layers=3, mlp=False, positions=positions)
    model = create_model(arch, TASK).double()
    assert (model.positions is None) == (not positions)
    tokens = TASK.sample(4, seed=2, dtype=torch.float64).tokens  # (B, C + 1, d): context pairs, then the query
    shuffled = torch.cat([tokens[:, torch.randperm(tokens.shape[1] - 1)], tokens[:, -1:]], dim=1)
    moved = (model.predict(shuffled) - model.predict(tokens)).abs().max().item()
    assert moved < 1e-12 if not positions else moved > 1e-6
    torch.testing.assert_close(model.predict(tokens), model.readout(model(tokens)), rtol=1e-12, atol=1e-12)
    long = torch.zeros(1, 300, TASK.token_dim, dtype=torch.float64)  # longer than max_len = 256
    if positions:  # the table has max_len rows: a longer prompt is refused, as by the ONNX graph's slice
        with pytest.raises(ValueError, match="max_len"):
            model(long)
    else:  # without one, any length reads the same way (the exported graph takes it too)
        assert model(long).shape == (1, 300, TASK.d_out)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_layers, heads", [(1, 1), (2, 4)])
@pytest.mark.parametrize("position", [-1, 4])
def test_softmax_transformer_predict_at_the_query_only_equals_reading_forward(causal, n_layers, heads, position):
    """The training read-out runs the last block at the query only: keys and values at every token
    (every token, unmasked; up to the query, masked), the rest at one. It must equal the full
    forward pass read at the query, also for a query before the end."""
    torch.manual_seed(3)
    arch = TransformerArch(type="softmax_transformer", width=16, n_layers=n_layers, heads=heads, causal=causal)
    model = create_model(arch, TASK).double()
    model.readout = dataclasses.replace(model.readout, position=position)
    tokens = TASK.sample(5, seed=1, dtype=torch.float64).tokens
    want = model.readout(model(tokens))
    torch.testing.assert_close(model.predict(tokens), want, rtol=1e-12, atol=1e-12)
    # and the gradients training takes through it (W_k, W_v folded into the query)
    grads = [torch.autograd.grad(out.square().sum(), list(model.parameters())) for out in (model.predict(tokens), want)]
    for fast, full in zip(*grads):
        torch.testing.assert_close(fast, full, rtol=1e-10, atol=1e-12)
    if causal:  # masked, what follows the query cannot matter
        later = tokens.clone()
        later[:, position + 1 :] += 1.0 if position >= 0 else 0.0
        torch.testing.assert_close(model.predict(later), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("block", ["lru-out", "lru-in_out", "lru-in_skip", "s5"])
@pytest.mark.parametrize("T", [1, 25, 200])
def test_complex_diagonal_forward_last_is_the_last_position_of_forward(block, T):
    """The LRU's and S5's read-out shortcut, h_T = Σ_t λ^{T−1−t} drive_t with the powers in closed
    form, equals the scan's last output, gradients included, also with |λ| near 1 (r_max 0.999,
    the long-memory end of the ring) over 200 steps."""
    torch.manual_seed(4)
    if block == "s5":
        layer = S5Block(width=6, hidden=7).double()
    else:
        layer = LRUBlock(width=6, hidden=7, variant=block.removeprefix("lru-"), r_min=0.9, r_max=0.999).double()
    x = torch.randn(3, T, 6, dtype=torch.float64)
    if block != "s5":  # and a neuron with λ = 0 exactly (log|λ| = −inf): λ^0 is still 1
        with torch.no_grad():
            layer.nu_log[0] = 1e4
        torch.testing.assert_close(layer.forward_last(x), layer(x)[:, -1], rtol=1e-11, atol=1e-12)
        with torch.no_grad():
            layer.nu_log[0] = 0.0
    fast, full = layer.forward_last(x), layer(x)[:, -1]
    torch.testing.assert_close(fast, full, rtol=1e-11, atol=1e-12)
    grads = [torch.autograd.grad(out.square().sum(), list(layer.parameters())) for out in (fast, full)]
    for (name, _), g_fast, g_full in zip(layer.named_parameters(), *grads):
        torch.testing.assert_close(g_fast, g_full, rtol=1e-9, atol=1e-11, msg=name)


def test_variant_only_for_lru():
    with pytest.raises(ValueError, match="variant"):
        RecurrentStackArch(type="gru", variant="in_out")


@pytest.mark.parametrize("spec", [{"type": "lru", "variant": "in_out"}, {"type": "lstm"}])
def test_residual_is_the_types_default_unless_stated(spec):
    """x_l = x_{l-1} + block_l(x_{l-1}) or x_l = block_l(x_{l-1}): checked on the computed output, so
    an LRU checkpoint saved before `residual` existed (no field: the residual) loads as it was built."""
    default = stack(spec)
    assert default.residual == (spec["type"] == "lru")
    for residual in (True, False):
        model = stack({**spec, "residual": residual})
        model.load_state_dict(default.state_dict())
        tokens = torch.randn(3, 10, TASK.token_dim, dtype=torch.float64)
        x = model.embed(tokens)
        for block in model.blocks:
            y = block(x)
            x = x + y if residual else y
        torch.testing.assert_close(model(tokens), model.head(x), rtol=1e-12, atol=1e-12)


def test_lru_ring_init_radius():
    torch.manual_seed(8)
    block = LRUBlock(width=4, hidden=2000, r_min=0.5, r_max=0.9)
    radius = torch.exp(-torch.exp(block.nu_log))
    assert radius.min() >= 0.5 - 1e-3 and radius.max() <= 0.9 + 1e-3
    # uniform on the ring by area: E[r²] = (r_min² + r_max²)/2
    assert abs((radius**2).mean().item() - (0.25 + 0.81) / 2) < 0.01
    assert math.isclose(torch.exp(block.gamma_log).pow(2).add(radius**2).mean().item(), 1.0, rel_tol=1e-5)


def test_lstm_construction_approaches_the_lsa_as_epsilon_shrinks():
    """Table 4: relative error O(ε²) in float64 (measured 1.1e-1, 1.2e-2, 1.3e-3, 1.2e-4, 1.3e-5
    for ε = 0.1 … 0.001 on this LSA)."""
    from zoo.science.models.lsa import LinearSelfAttention, lsa_weights
    from zoo.science.models.stack_constructions import lstm_from_lsa, lstm_width
    from zoo.science.registry import get_task_spec

    task = get_task_spec("zucchet-icl").build()
    d = task.token_dim
    torch.manual_seed(0)
    lsa = LinearSelfAttention(d, task.readout, attention="causal", residual=False, init_std=0.4).double()
    b = task.sample(100, seed=1, dtype=torch.float64)
    ref = lsa(b.tokens)
    errors = []
    for eps in (0.1, 0.01, 0.001):
        model = create_model(RecurrentStackArch(type="lstm", width=lstm_width(d)), task).double()
        lstm_from_lsa(model, *lsa_weights(lsa), scale=eps)
        with torch.no_grad():
            errors.append(((model(b.tokens) - ref).norm() / ref.norm()).item())
    assert errors[2] < 3e-5
    for coarse, fine in zip(errors, errors[1:]):
        assert 50 < coarse / fine < 200  # ε² scaling: ×100 per decade


SCALES = (0.03, 0.01, 0.003, 0.001)  # ε, a factor of ~3 apart: the error should fall ×9 to ×11 each step


def _assert_error_falls_as_eps_squared(construct, tokens, ref, final: float) -> None:
    """`construct(ε)` → the model for each ε in SCALES: its relative error to `ref` on `tokens`, float64, falls
    within 0.6–1.5× of ε² per step and ends below `final`."""
    errors = []
    for eps in SCALES:
        with torch.no_grad():
            errors.append(((construct(eps)(tokens) - ref).norm() / ref.norm()).item())
    assert errors[-1] < final, errors
    for (coarse, fine), (big, small) in zip(zip(errors, errors[1:]), zip(SCALES, SCALES[1:])):
        assert 0.6 * (big / small) ** 2 < coarse / fine < 1.5 * (big / small) ** 2, errors  # ε² scaling


def test_two_lstm_layers_approach_a_gated_rnn_as_epsilon_shrinks():
    """Table 4 (right): two LSTM layers ≈ any diagonal gated RNN of Eq. 2, here a random one with
    memory (λ = 1), forget (λ = 0) and leaky neurons, on fresh tasks in float64. Relative error O(ε²)
    (measured 5.3e-2, 6.4e-3, 5.8e-4, 6.5e-5 for ε = 0.03 … 0.001 on this RNN): ×9 for ε/3."""
    from zoo.science.models.stack_constructions import lstm2_width, lstm_from_gated_rnn
    from zoo.science.registry import get_task_spec

    task = get_task_spec("zucchet-icl").build()
    rnn = _random_gated_rnn(task)
    b = task.sample(200, seed=1, dtype=torch.float64)
    with torch.no_grad():
        ref = rnn(b.tokens)  # every position's output, not only the query's
    arch = RecurrentStackArch(type="lstm", width=lstm2_width(10, 7), n_layers=2)
    _assert_error_falls_as_eps_squared(lambda eps: lstm_from_gated_rnn(create_model(arch, task).double(), rnn, scale=eps),
                                       b.tokens, ref, final=1e-4)


def test_the_two_lstm_construction_checks_its_stack():
    from zoo.science.models.gated_rnn import GatedLinearRNN
    from zoo.science.models.stack_constructions import lstm_from_gated_rnn
    from zoo.science.registry import get_task_spec

    task = get_task_spec("zucchet-icl").build()
    rnn = GatedLinearRNN(task.token_dim, task.token_dim, task.readout, hidden=10, gates=7)
    for arch in (RecurrentStackArch(type="lstm", width=20, n_layers=1), RecurrentStackArch(type="lstm", width=22, n_layers=2),
                 RecurrentStackArch(type="lstm", width=20, n_layers=3), RecurrentStackArch(type="gru", width=20, n_layers=2),
                 RecurrentStackArch(type="bilstm", width=20, n_layers=2),
                 RecurrentStackArch(type="lstm", width=20, n_layers=2, residual=True)):
        with pytest.raises(ValueError, match="two LSTM layers of width 2·max"):
            lstm_from_gated_rnn(create_model(arch, task), rnn, scale=0.01)
    two = create_model(RecurrentStackArch(type="lstm", width=20, n_layers=2), task)
    dense = GatedLinearRNN(task.token_dim, task.token_dim, task.readout, hidden=10, gates=7, recurrence="dense")
    with pytest.raises(ValueError, match="diagonal"):
        lstm_from_gated_rnn(two, dense, scale=0.01)
    for d_in, d_out in ((task.token_dim - 2, task.token_dim), (task.token_dim, 1)):  # not broadcast, not ignored
        with pytest.raises(ValueError, match="the stack maps 6 → 6 channels"):
            lstm_from_gated_rnn(two, GatedLinearRNN(d_in, d_out, task.readout, hidden=10, gates=7), scale=0.01)
    with pytest.raises(ValueError, match="must be finite and > 0"):
        lstm_from_gated_rnn(two, rnn, scale=0.0)


def _random_gated_rnn(task, hidden=10, gates=7):
    """A random diagonal gated RNN (float64) with memory (λ = 1), forget (λ = 0) and leaky neurons."""
    from zoo.science.models.gated_rnn import GatedLinearRNN

    torch.manual_seed(0)
    rnn = GatedLinearRNN(task.token_dim, task.token_dim, task.readout, hidden=hidden, gates=gates).double()
    with torch.no_grad():
        rnn.nu[:2], rnn.nu[2:4] = float("-inf"), float("inf")  # λ = 1 and λ = 0 exactly; the rest U(0, 1)
    return rnn


@pytest.mark.parametrize("variant", ["in_out", "out", "in_skip"])
@pytest.mark.parametrize("hidden,gates", [(10, 7), (5, 9)])
def test_lru_layers_approach_a_gated_rnn_as_epsilon_shrinks(variant, hidden, gates):
    """Table 3's LRU rows for the gated RNN (In+Out: 1 layer; Out and In+Skip: 2), on a random RNN with
    leaky neurons, more neurons than gates or fewer, fresh tasks, float64, every position: relative error
    O(ε²) (measured 4.5e-3, 5.0e-4, 4.5e-5, 5.0e-6 for ε = 0.03 … 0.001 at 10 neurons and 7 gates, 2.2e-5 at
    ε = 0.001 with 5 and 9, the same for the three variants)."""
    from zoo.science.models.stack_constructions import LRU_LAYERS, lru_from_gated_rnn, lru_size
    from zoo.science.registry import get_task_spec

    task = get_task_spec("zucchet-icl").build()
    rnn = _random_gated_rnn(task, hidden, gates)
    b = task.sample(200, seed=1, dtype=torch.float64)
    with torch.no_grad():
        ref = rnn(b.tokens)
    arch = RecurrentStackArch(type="lru", variant=variant, n_layers=LRU_LAYERS[variant], residual=False,
                              **lru_size(hidden, gates, task.token_dim, variant))
    _assert_error_falls_as_eps_squared(lambda eps: lru_from_gated_rnn(create_model(arch, task).double(), rnn, scale=eps),
                                       b.tokens, ref, final=1e-4)


def test_one_lru_in_skip_layer_approaches_an_lsa_as_epsilon_shrinks():
    """Table 3, LRU In-Skip, attention: one layer, the queries from the skip branch (measured 5.7e-4,
    6.3e-5, 5.7e-6, 6.3e-7 for ε = 0.03 … 0.001 on this LSA, float64)."""
    from zoo.science.models.lsa import LinearSelfAttention, lsa_weights
    from zoo.science.models.stack_constructions import lru_in_skip_from_lsa, lru_in_skip_lsa_size
    from zoo.science.registry import get_task_spec

    task = get_task_spec("zucchet-icl").build()
    d = task.token_dim
    torch.manual_seed(0)
    lsa = LinearSelfAttention(d, task.readout, attention="causal", residual=False, init_std=0.4).double()
    b = task.sample(200, seed=1, dtype=torch.float64)
    with torch.no_grad():
        ref = lsa(b.tokens)
    arch = RecurrentStackArch(type="lru", variant="in_skip", residual=False, **lru_in_skip_lsa_size(d))
    _assert_error_falls_as_eps_squared(
        lambda eps: lru_in_skip_from_lsa(create_model(arch, task).double(), *lsa_weights(lsa), scale=eps), b.tokens, ref,
        final=1e-5)


def test_the_lru_constructions_check_their_stack():
    from zoo.science.models.lsa import LinearSelfAttention, lsa_weights
    from zoo.science.models.stack_constructions import lru_from_gated_rnn, lru_in_skip_from_lsa
    from zoo.science.registry import get_task_spec

    task = get_task_spec("zucchet-icl").build()
    rnn = _random_gated_rnn(task)
    wrong = [dict(variant="in_out", n_layers=2, width=20, hidden=10), dict(variant="out", n_layers=1, width=20, hidden=10),
             dict(variant="in_out", width=22, hidden=10), dict(variant="in_out", width=20, hidden=9)]
    for fields in wrong:
        with pytest.raises(ValueError, match="without residual"):
            lru_from_gated_rnn(create_model(RecurrentStackArch(type="lru", residual=False, **fields), task), rnn, scale=0.01)
    with pytest.raises(ValueError, match="without residual"):  # the LRU's default is residual
        lru_from_gated_rnn(create_model(RecurrentStackArch(type="lru", variant="in_out", width=20, hidden=10), task), rnn, 0.01)
    with pytest.raises(ValueError, match="needs 'lru' layers"):
        lru_from_gated_rnn(create_model(RecurrentStackArch(type="s5", width=20, hidden=10), task), rnn, scale=0.01)
    from zoo.science.models.gated_rnn import GatedLinearRNN

    in_out = create_model(RecurrentStackArch(type="lru", variant="in_out", width=20, hidden=10, residual=False), task)
    with pytest.raises(ValueError, match="the stack maps 6 → 6 channels, the model it stands for 6 → 1"):
        lru_from_gated_rnn(in_out, GatedLinearRNN(task.token_dim, 1, task.readout, hidden=10, gates=7), scale=0.01)
    lsa = LinearSelfAttention(task.token_dim, task.readout, attention="causal", residual=False)
    with pytest.raises(ValueError, match="variant 'in_skip'"):
        lru_in_skip_from_lsa(create_model(RecurrentStackArch(type="lru", variant="in_out", width=72, hidden=36, residual=False),
                                          task), *lsa_weights(lsa), scale=0.01)


@pytest.mark.parametrize("name", ["lru-in-out-gd-zucchet-icl", "lru-out-2l-gd-zucchet-icl", "lru-in-skip-2l-gd-zucchet-icl",
                                  "lru-in-skip-gd-zucchet-icl", "lstm2-gd-zucchet-icl", "gated-rnn-gd-zucchet-icl",
                                  "gated-rnn-teacher-d4", "gated-rnn-teacher-d4-compact", "gated-rnn-teacher-d6"])
def test_training_can_start_from_a_constructed_model(name):
    """λ = 1 and 0 are finite stand-ins (ν = −100 and 20 in the gated RNN, ν^log = −100 and 20 in the LRU), not
    ν = ∓∞, whose weights are not finite and whose gradient at +∞ is ∞ · 0 = NaN: every gradient of a
    constructed model is finite, and one optimiser step leaves the weights finite."""
    from zoo.science.constructions import construct
    from zoo.science.registry import get_entry, get_task_spec

    entry = get_entry(name)
    task = get_task_spec(entry.task).build()
    model = create_model(entry.arch, task)
    construct(entry, model, task)
    b = task.sample(32, seed=2)
    targets = b.query_targets if hasattr(b, "query_targets") else b.targets  # regression: the query; teacher: every t
    task.loss(model.predict(b.tokens), targets).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    torch.optim.SGD(model.parameters(), lr=1e-6).step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("name", ["lru-in-out-gd-zucchet-icl", "lru-out-2l-gd-zucchet-icl", "lru-in-skip-2l-gd-zucchet-icl",
                                  "lru-in-skip-gd-zucchet-icl"])
def test_lru_gd_entries_score_as_gd(name):
    """Measured: 0.094146 against GD's 0.094146 on the 10,000-task test split for all four, prediction
    L2 to GD 1.6e-8–1.8e-8 (fp32, ε = 0.01)."""
    import zoo

    m = zoo.build(name, progress=False, graphs=False).metrics
    assert m["test_loss"] == pytest.approx(m["gd_loss"], rel=1e-4)
    assert m["pred_l2_to_gd"] < 1e-6 * m["gd_loss"]


def test_lstm2_gd_entry_scores_as_gd():
    """The θ_GD gated RNN through two LSTM layers: measured 0.094129 against GD's 0.094146 on the
    10,000-task test split (−0.02%), prediction L2 to GD 1.8e-6 (fp32, ε = 0.01)."""
    import zoo

    m = zoo.build("lstm2-gd-zucchet-icl", progress=False).metrics
    assert m["test_loss"] == pytest.approx(m["gd_loss"], rel=2e-3)
    assert m["pred_l2_to_gd"] < 1e-4 * m["gd_loss"]
    assert m["sensitivity_cosine"] > 0.9999


def test_lstm_gd_entry_scores_close_to_gd():
    import zoo

    m = zoo.build("lstm-gd-zucchet-icl", progress=False).metrics
    assert m["test_loss"] == pytest.approx(m["gd_loss"], rel=2e-2)
    assert m["sensitivity_cosine"] > 0.99


def _toy_entries() -> dict[str, str]:
    """Arch type → one trained registry entry of it: the one that sets the most arch fields away from
    their defaults (ties: the first by name), so each type's most configured code path trains. A new
    family's trained entry is picked up here without a list to edit."""
    from zoo.science.registry import list_entries

    picked = {}
    for entry in list_entries(source="trained"):
        key = (-len(entry.arch.model_dump(exclude_defaults=True)), entry.name)
        if entry.arch.type not in picked or key < picked[entry.arch.type]:
            picked[entry.arch.type] = key
    return {arch_type: name for arch_type, (_, name) in sorted(picked.items())}


TOY_ENTRIES = sorted(_toy_entries().values())


def test_every_arch_type_has_a_toy_entry():
    from zoo.science.models import FAMILY_OF_TYPE

    missing = set(FAMILY_OF_TYPE) - set(_toy_entries())
    assert not missing, f"arch types without a trained registry entry to train at toy size: {sorted(missing)}"


@pytest.mark.parametrize("name", TOY_ENTRIES)
def test_every_family_trains_saves_and_reloads_at_toy_size(name, tmp_path):
    """Three optimiser steps through the real `build` path: training, evaluation, model card; then a
    strict, hash-checked reload gives the same predictions. One entry per arch type, picked by
    `_toy_entries`. Without ONNX graphs (`graphs=False`: the export was over 90% of this test's time):
    every arch's graphs are exported and checked against torch in test_export.py and
    test_recurrence.py, and `build`'s graph writing in test_checkpoint.py and the release tests."""
    import zoo

    ckpt = zoo.build(name, tmp_path, steps=3, progress=False, overrides={"source.batch_size": 8}, graphs=False)
    assert ckpt.provenance["steps"] == 3 and len(ckpt.history) == 1
    scored = ("test_loss", "gd_loss", "sensitivity_cosine") if ckpt.task_spec.kind == "linear_regression" else ("test_loss",)
    assert all(math.isfinite(ckpt.metrics[k]) for k in scored)  # (a teacher task has no GD to compare with)
    assert (tmp_path / "README.md").exists() and not list(tmp_path.glob("*.onnx"))
    again = zoo.load(str(tmp_path))
    tokens = again.task.sample(4, seed=0).tokens
    with torch.no_grad():
        torch.testing.assert_close(again.model.predict(tokens), ckpt.model.predict(tokens), rtol=0, atol=0)
