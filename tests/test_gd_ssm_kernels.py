"""The GD-SSM's gauge-free kernels (zoo/science/analysis/gd_ssm_kernels.py, Sushma, Tian et al. Figs. 3/5):
they reproduce the model's output, survive every symmetry of the weights, and tell different
functions apart."""

import pytest
import torch

from zoo.science.analysis.gd_ssm_kernels import compare, compare_with_construction, function_tensor, kernels
from zoo.science.models.gd_ssm import GDSSM, construct_gd_ssm
from zoo.science.tasks.regression import LinearRegressionTask

TASKS = {
    "products": LinearRegressionTask(d_x=4, d_y=1, n_context=6, layout="products"),
    "interleaved": LinearRegressionTask(d_x=3, d_y=2, n_context=5, layout="interleaved"),
}


def random_model(task, seed):
    torch.manual_seed(seed)
    dims = {"window": 1, "value_dim": task.d_x, "key_dim": 1} if task.layout == "products" else \
        {"window": 3, "value_dim": task.d_y, "key_dim": task.d_x}
    model = GDSSM(task.token_dim, task.d_y, task.readout, **dims).double()
    with torch.no_grad():
        model.layers[0].nu.fill_(-float("inf"))  # Λ = 1: the regime the kernels describe exactly
    return model


def constructed(task, eta=0.07):
    return construct_gd_ssm(random_model(task, 0), task.layout, task.d_x, task.d_y, eta)


def one_slot_later(model, f: int, *names: str):
    """Move the named window projections of the layer (e.g. "a", "b") to read every slot one
    position later (slot k → k + 1; the newest slot's weights drop out)."""
    layer = model.layers[0]
    with torch.no_grad():
        for name in names:
            w = getattr(layer, name)
            old = w.clone()
            w.zero_()
            w[:, f:3 * f] = old[:, 0:2 * f]
    return model


@pytest.mark.parametrize("layout", TASKS)
def test_kernels_reproduce_the_output(layout):
    """o_k = Σ_t (c_qᵀ V_k c_t)(c_tᵀ K c_q) on fresh random weights and tokens, float64."""
    task = TASKS[layout]
    model = random_model(task, 1)
    tokens = torch.randn(7, task.n_tokens, task.token_dim, dtype=torch.float64)
    c, _ = model.windows(tokens)  # (B, T, c)
    k = kernels(model)
    c_q = c[:, -1]
    by_kernels = torch.einsum("bi,kij,btj,btl,lm,bm->bk", c_q, k["V"], c, c, k["K"], c_q)
    out = model(tokens)[:, -1]  # every output channel at the last position
    torch.testing.assert_close(by_kernels, out, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", TASKS)
def test_comparison_is_blind_to_the_weight_symmetries(layout):
    """Mixing the key channels (B → P B, Q → P⁻ᵀ Q), permuting and rescaling the value channels
    and moving scale between β and D leave the function and every cosine at 1."""
    task = TASKS[layout]
    ref = constructed(task)
    moved = constructed(task)
    layer = moved.layers[0]
    g = torch.Generator().manual_seed(3)
    m_k, m_v = layer.b.shape[0], layer.a.shape[0]
    p = torch.randn(m_k, m_k, generator=g, dtype=torch.float64) + 3 * torch.eye(m_k, dtype=torch.float64)
    perm = torch.randperm(m_v, generator=g)
    s_a = torch.rand(m_v, generator=g, dtype=torch.float64) + 0.5
    s_r = -(torch.rand(m_v, generator=g, dtype=torch.float64) + 0.5)
    with torch.no_grad():
        layer.b.copy_(p @ layer.b)
        moved.q.copy_(torch.linalg.inv(p).T @ moved.q)
        layer.a.copy_((layer.a * s_a[:, None])[perm])
        moved.r.copy_((moved.r * s_r[:, None])[perm])
        moved.d.copy_((moved.d / (s_a * s_r))[:, perm] / 4.0)
        layer.beta.mul_(4.0)
    tokens = task.sample(64, seed=5, dtype=torch.float64).tokens
    torch.testing.assert_close(moved.predict(tokens), ref.predict(tokens), rtol=1e-10, atol=1e-12)
    result = compare(moved, ref)
    assert result["key_cosine"] == pytest.approx(1, abs=1e-12)
    assert result["value_cosine"] == pytest.approx([1] * task.d_y, abs=1e-12)
    assert result["tensor_cosine"] == pytest.approx(1, abs=1e-12)
    assert result["value_norm_ratio"] == pytest.approx(1, abs=1e-12)


@pytest.mark.parametrize("layout", TASKS)
def test_comparison_tells_other_functions_apart(layout):
    """A random layer is far from the construction; one GD step at another η only rescales V."""
    task = TASKS[layout]
    ref = constructed(task)
    assert compare(random_model(task, 2), ref)["tensor_cosine"] < 0.5
    other_eta = compare(constructed(task, eta=0.21), ref)
    assert other_eta["tensor_cosine"] == pytest.approx(1, abs=1e-12)
    assert other_eta["value_norm_ratio"] == pytest.approx(3, rel=1e-12)


def test_function_tensor_is_symmetric_in_the_query_pair():
    k = kernels(random_model(TASKS["interleaved"], 4))
    t = function_tensor(k)  # (o, i, m, folded context pair)
    torch.testing.assert_close(t, t.transpose(1, 2))


def test_the_fold_keeps_slot_offsets_apart():
    """Shifting only the value projection pairs y_j with x_{j−1}'s slot: another function (it reads
    y_j x_{j+1}ᵀ), which the folded comparison must not mistake for the construction."""
    task = TASKS["interleaved"]
    ref = constructed(task)
    other = one_slot_later(constructed(task), task.token_dim, "a")  # values one slot later, keys where they were
    tokens = task.sample(64, seed=7, dtype=torch.float64).tokens
    assert not torch.allclose(other.predict(tokens), ref.predict(tokens), atol=1e-3)
    assert compare(other, ref)["tensor_cosine"] < 0.5


def test_comparison_leaves_the_model_alone_and_refuses_other_models():
    from zoo.science.models.lsa import LinearSelfAttention

    task = TASKS["interleaved"]
    model = random_model(task, 8).float()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compare_with_construction(model, task)
    assert all(torch.equal(v, model.state_dict()[k]) and v.dtype == torch.float32 for k, v in before.items())
    with pytest.raises(ValueError, match="GD-SSM on in-context regression"):
        compare_with_construction(LinearSelfAttention(task.token_dim, task.readout), task)


def test_the_two_window_alignments_of_the_interleaved_layout_fold_together():
    """Reading y_j x_jᵀ at the y-token window (slots 2, 1) instead of the x-token window (slots 1, 0)
    is the same function up to the first and last window, and the same folded tensor."""
    task = TASKS["interleaved"]
    ref = constructed(task)
    shifted = one_slot_later(constructed(task), task.token_dim, "a", "b")
    assert compare(shifted, ref)["tensor_cosine"] == pytest.approx(1, abs=1e-12)
    assert compare(shifted, ref)["key_cosine"] < 0.1  # raw K: different slots


def test_kernels_refuse_models_they_do_not_describe():
    task = TASKS["interleaved"]
    two = GDSSM(task.token_dim, task.d_y, task.readout, n_layers=2, window=3, value_dim=2, key_dim=3)
    with pytest.raises(ValueError, match="one linear GD-SSM layer"):
        kernels(two)


@pytest.mark.parametrize("layout", TASKS)
def test_coefficients_the_tokens_never_exercise_are_ignored(layout):
    """Against the construction at the task's η*: junk on a query channel that is zero at every
    query (interleaved: the y-channels of the query token's slot) leaves the cosine at 1; a random
    layer stays far."""
    task = TASKS[layout]
    model = constructed(task, eta=task.analytic_eta())
    if layout == "interleaved":
        with torch.no_grad():
            model.q[:, 2 * task.token_dim + task.d_x] = 5.0  # the query token's (always zero) y-channel
    assert compare_with_construction(model, task)["tensor_cosine"] == pytest.approx(1, abs=1e-12)
    assert compare_with_construction(random_model(task, 6), task)["tensor_cosine"] < 0.5
