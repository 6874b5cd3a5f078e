"""GD-SSM (Sushma, Tian et al.): token layouts, the constructions against k-step (ridge) GD,
sequence form against iterated `step`, entries and training."""

import math

import pytest
import torch

import zoo
from zoo.science.models.gd_ssm import GDSSM, construct_gd_ssm
from zoo.science.registry import get_task_spec, list_entries
from zoo.science.tasks.regression import LinearRegressionTask, gd_predict, gd_weights


def constructed(task: LinearRegressionTask, n_layers=1, ridge=0.0, eta=0.05, window=None):
    if task.layout == "products":
        dims = {"window": window or 1, "value_dim": task.d_x, "key_dim": 1}
    else:
        dims = {"window": window or 3, "value_dim": task.d_y, "key_dim": task.d_x}
    model = GDSSM(task.token_dim, task.d_y, task.readout, n_layers=n_layers, ridge=ridge, **dims).double()
    return construct_gd_ssm(model, task.layout, task.d_x, task.d_y, eta)


def test_layouts_put_the_examples_where_the_paper_does():
    task = LinearRegressionTask(d_x=2, d_y=1, n_context=3, layout="interleaved")
    b = task.sample(4, seed=0)
    assert b.tokens.shape == (4, 7, 3)
    assert torch.equal(b.tokens[:, 0, :2], b.x[:, 0]) and torch.equal(b.tokens[:, 0, 2:], torch.zeros(4, 1))
    assert torch.equal(b.tokens[:, 1, 2:], b.y[:, 0]) and torch.equal(b.tokens[:, 1, :2], torch.zeros(4, 2))
    assert torch.equal(b.tokens[:, -1, :2], b.x_query) and torch.equal(b.tokens[:, -1, 2:], torch.zeros(4, 1))
    task = LinearRegressionTask(d_x=2, d_y=1, n_context=3, layout="products")
    b = task.sample(4, seed=0)
    assert b.tokens.shape == (4, 3, 4)
    torch.testing.assert_close(b.tokens[:, 1, :2], b.x[:, 1] * b.y[:, 1])
    assert torch.equal(b.tokens[:, -1, 2:], b.x_query)  # c_C carries x_{C+1}
    with pytest.raises(ValueError, match="d_y = 1"):
        LinearRegressionTask(d_x=2, d_y=2, n_context=3, layout="products")


@pytest.mark.parametrize("d_x,n_context", [(10, 10), (3, 25)])
def test_products_construction_is_one_gd_step(d_x, n_context):
    """Eqs. 14–16: o_C = η (Σ_i x_i y_i)ᵀ x_{C+1}, checked against an independent formula."""
    task = LinearRegressionTask(d_x=d_x, d_y=1, n_context=n_context, layout="products")
    b = task.sample(256, seed=11, dtype=torch.float64)
    eta = 0.037
    pred = constructed(task, eta=eta).predict(b.tokens)
    by_hand = eta * torch.einsum("bi,bid,bd->b", b.y_context[..., 0], b.x_context, b.x_query).unsqueeze(-1)
    torch.testing.assert_close(pred, by_hand, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_layers", [1, 2, 3])
@pytest.mark.parametrize("ridge", [0.0, 0.7])
def test_interleaved_construction_is_k_steps_of_ridge_gd(n_layers, ridge):
    """A.1, A.2, A.4: L layers = L GD steps on ½Σ‖y − Wx‖² + (ρ/2)‖W‖², to 1e-10 in float64."""
    task = LinearRegressionTask(d_x=4, d_y=3, n_context=12, layout="interleaved")
    b = task.sample(256, seed=100 + n_layers, dtype=torch.float64)
    eta = 0.06
    pred = constructed(task, n_layers=n_layers, ridge=ridge, eta=eta).predict(b.tokens)
    torch.testing.assert_close(pred, gd_predict(b, eta, steps=n_layers, ridge=ridge), rtol=0, atol=1e-10)
    if n_layers > 1:  # the steps really differ: the test can tell k steps from k − 1
        assert (pred - gd_predict(b, eta, steps=n_layers - 1, ridge=ridge)).abs().max() > 1e-2
    if n_layers == 2 and ridge:  # and the ridge term is really applied
        assert (pred - gd_predict(b, eta, steps=2)).abs().max() > 1e-3


def test_ridge_gd_reference_is_the_gradient_step():
    """gd_weights against the explicit gradient of ½Σ‖y − Wx‖² + (ρ/2)‖W‖² by autograd."""
    task = LinearRegressionTask(d_x=3, d_y=2, n_context=8)
    b = task.sample(5, seed=3, dtype=torch.float64)
    eta, rho = 0.1, 0.4
    w = torch.zeros(5, 2, 3, dtype=torch.float64)
    for _ in range(2):
        w = w.detach().requires_grad_(True)
        loss = 0.5 * ((b.y_context - b.x_context @ w.transpose(1, 2)) ** 2).sum() + 0.5 * rho * (w**2).sum()
        (g,) = torch.autograd.grad(loss, w)
        w = w - eta * g
    torch.testing.assert_close(gd_weights(b, eta, steps=2, ridge=rho), w.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("window,n_layers,layout,nonlinear", [(1, 1, "products", False), (3, 2, "interleaved", False),
                                                          (4, 3, "interleaved", False), (3, 2, "interleaved", True)])
def test_parallel_and_sequential_scans_agree(window, n_layers, layout, nonlinear):
    """Random weights (not the construction, whose zeros hide slot mix-ups), float64; the A.3
    variant with its embedding and a gated unit whose (zero-initialised) output is randomised.
    (forward ≡ iterated step ≡ ONNX for every recurrent entry is tests/test_recurrence.py.)"""
    task = LinearRegressionTask(d_x=3, d_y=1 if layout == "products" else 2, n_context=9, layout=layout)
    torch.manual_seed(0)
    extra = {"embed": 5, "mlp": 7} if nonlinear else {}
    model = GDSSM(task.token_dim, task.d_y, task.readout, n_layers=n_layers, window=window,
                  value_dim=4, key_dim=3, ridge=0.3, lambda_range=(0.5, 0.99), **extra).double()
    if nonlinear:
        torch.nn.init.normal_(model.mlp.outer.weight)
    tokens = task.sample(3, seed=1, dtype=torch.float64).tokens
    full = model(tokens, parallel=True)
    torch.testing.assert_close(model(tokens, parallel=False), full, rtol=0, atol=1e-12)
    assert model.state_names()[0] == ("window" if window > 1 else "0.z")


def test_construction_rejects_a_mismatched_model():
    task = LinearRegressionTask(d_x=3, d_y=2, n_context=5, layout="interleaved")
    model = GDSSM(task.token_dim, 2, task.readout, window=2, value_dim=2, key_dim=3)
    with pytest.raises(ValueError, match="window"):
        construct_gd_ssm(model, "interleaved", 3, 2, 0.1)


GD_SSM_CONSTRUCTED = [e.name for e in list_entries(arch_type="gd_ssm", source="constructed")]


@pytest.mark.parametrize("name", GD_SSM_CONSTRUCTED)
def test_constructed_entries_score_as_gd_on_their_frozen_split(name):
    ckpt = zoo.build(name, progress=False)
    m = ckpt.metrics
    steps = zoo.get_entry(name).arch.n_layers
    assert m["gd_steps"] == steps
    assert m["test_loss"] == pytest.approx(m["gd_loss"], rel=1e-5)
    assert m["pred_l2_to_gd"] < 1e-9 and m["sensitivity_cosine"] > 1 - 1e-6


def test_gd_ssm_entries_exist_for_each_construction():
    names = set(GD_SSM_CONSTRUCTED)
    assert {"gd-ssm-gd-1d", "gd-ssm-gd-nd", "gd-ssm-gd-nd-2step", "gd-ssm-gd-nd-ridge-2step"} <= names


def test_training_a_toy_gd_ssm_approaches_gd(tmp_path):
    """A small 1-D GD-SSM from random init reaches the one-step GD loss on CPU in seconds (it
    sits on a plateau near 0.38 for ~800 steps first; measured: 0.1158 vs GD 0.1146)."""
    from zoo.running.train import train
    from zoo.science.registry import TrainRecipe

    task = LinearRegressionTask(d_x=3, d_y=1, n_context=10, layout="products")
    torch.manual_seed(0)
    model = GDSSM(task.token_dim, 1, task.readout, window=1, value_dim=3, key_dim=1)
    recipe = TrainRecipe(kind="trained", lr=1e-2, recurrent_lr=5e-3, steps=2000, batch_size=128, eval_every=500)
    val = task.sample(4000, seed=1)
    result = train(model, task, recipe, run_dir=tmp_path, validation_batch=val, device="cpu", progress=False)
    gd = task.loss(gd_predict(val, task.analytic_eta()), val.targets).item()
    final = result.history[-1]["val_loss"]
    assert final < 1.03 * gd, (final, gd)


def test_plateau_escape_init_options():
    """`arch.beta_init` sets β of every layer and `arch.zero_output` starts D at 0 (the output is 0,
    the other weights as the seed draws them): the feature-dimension sweep uses both, because from
    β = 0.1 and a random D the degree-6 output stays on the zero-predictor plateau at f = 20."""
    from zoo.science.models import create_model
    from zoo.science.registry import RegistryError, with_overrides

    entry = with_overrides(zoo.get_entry("gd-ssm-nd-2layer"), {"arch.beta_init": 1.0})
    task = get_task_spec(entry.task).build()
    model = create_model(entry.arch, task)
    assert [layer.beta.item() for layer in model.layers] == [1.0, 1.0]
    torch.manual_seed(0)
    plain = create_model(entry.arch, task)
    torch.manual_seed(0)
    zeroed = create_model(with_overrides(entry, {"arch.zero_output": True}).arch, task)
    assert torch.count_nonzero(zeroed.d) == 0 and torch.count_nonzero(plain.d) == plain.d.numel()
    assert torch.equal(zeroed.layers[1].a, plain.layers[1].a)  # the same seed draws the same other weights
    batch = task.sample(8, seed=0)
    assert torch.count_nonzero(zeroed(batch.tokens)) == 0
    default = create_model(zoo.get_entry("gd-ssm-nd-2layer").arch, task)
    assert [layer.beta.item() for layer in default.layers] == pytest.approx([0.1, 0.1])
    with pytest.raises(RegistryError, match="arch.beta_init"):
        with_overrides(entry, {"arch.beta_init": 0.0})


def test_recurrent_lr_gets_its_own_param_group():
    from zoo.running.train import make_optimizer
    from zoo.science.registry import TrainRecipe

    model = GDSSM(7, 2, LinearRegressionTask(d_x=3, d_y=2, n_context=4, layout="interleaved").readout, n_layers=2, value_dim=2, key_dim=3)
    opt = make_optimizer(model, TrainRecipe(kind="trained", lr=2e-4, recurrent_lr=1e-4, weight_decay=0.05,
                                            steps=1, batch_size=1))
    by_lr = {g["lr"]: g for g in opt.param_groups}
    assert set(by_lr) == {1e-4, 2e-4}
    assert by_lr[1e-4]["weight_decay"] == 0.0 and len(by_lr[1e-4]["params"]) == 3  # ν of layer 1, ν and ν̃ of layer 2
    assert by_lr[2e-4]["weight_decay"] == 0.05


def test_task_spec_rejects_products_with_vector_targets():
    from zoo.science.registry import TASK_ADAPTER

    with pytest.raises(Exception, match="d_y = 1"):
        TASK_ADAPTER.validate_python({"kind": "linear_regression", "d_x": 3, "d_y": 2, "n_context": 4,
                                      "layout": "products", "splits": {}})
    assert get_task_spec("gdssm-1d-f10-n10").layout == "products"


def test_input_scale_curve_constructed_matches_gd_and_s5_does_not():
    """Figs. 1D/2D: a GD-SSM is GD at every input scale; an (untrained) S5 is not."""
    from zoo.science.evaluation import input_scale_curve
    from zoo.science.models import create_model

    task = get_task_spec("gdssm-1d-f10-n10").build()
    model = constructed(task, eta=task.analytic_eta()).float()
    rows = input_scale_curve(model, task, [0.5, 1.0, 3.0], n=500)
    assert [r["input_scale"] for r in rows] == [0.5, 1.0, 3.0]
    for r in rows:
        assert r["test_loss"] == pytest.approx(r["gd_loss"], rel=1e-4)
    assert rows[2]["gd_loss"] > 10 * rows[0]["gd_loss"]  # the scale really changes the problem
    torch.manual_seed(0)
    s5 = create_model(zoo.get_entry("s5-1d").arch, task)
    assert abs(input_scale_curve(s5, task, [1.0], n=500)[0]["test_loss"] - rows[1]["gd_loss"]) > 1e-2


def test_sine_tasks_are_sine_waves_in_their_ranges():
    """Each task's targets are exactly A sin(x − φ): fit a sin x + b cos x (a = A cos φ,
    b = −A sin φ) by least squares, recover A ∈ [0.1, 5] and φ ∈ [0, π], residual ~ 0."""
    task = LinearRegressionTask(d_x=1, d_y=1, n_context=10, x_scale=5.0, layout="interleaved", target="sine")
    b = task.sample(500, seed=3, dtype=torch.float64)
    x, y = b.x[..., 0], b.y[..., 0]  # (N, 11)
    basis = torch.stack([torch.sin(x), torch.cos(x)], -1)  # (N, 11, 2)
    coef = torch.linalg.lstsq(basis, y.unsqueeze(-1)).solution.squeeze(-1)  # (N, 2)
    assert (basis @ coef.unsqueeze(-1)).squeeze(-1).sub(y).abs().max() < 1e-6  # float32 draws, float64 sin
    amp, phase = coef.norm(dim=1), torch.atan2(-coef[:, 1], coef[:, 0])
    assert amp.min() >= 0.1 - 1e-6 and amp.max() <= 5.0 + 1e-6 and amp.max() > 4.5 and amp.min() < 0.6
    assert phase.min() >= -1e-6 and phase.max() <= math.pi + 1e-6
    assert x.abs().max() <= 5.0 and x.abs().max() > 4.9
    with pytest.raises(ValueError, match="1-D"):
        LinearRegressionTask(d_x=2, d_y=1, n_context=10, target="sine")


def test_nonlinear_gd_ssm_is_not_constructible():
    from zoo.science.models.gd_ssm import shape_problem

    dims = {"window": 3, "n_layers": 1, "value_dim": 1, "key_dim": 1, "embed": 16, "mlp": 32}
    assert "no input embedding" in shape_problem(dims, "interleaved", 1, 1)
    assert shape_problem({**dims, "embed": None}, "interleaved", 1, 1) is None  # the gated unit is trained on top


def test_training_from_the_construction_with_frozen_layers(tmp_path):
    """`source.init` + `source.freeze`: before training the model *is* the GD construction (the
    gated unit starts as the identity), and training moves only the unfrozen gated unit."""
    from zoo.running.builder import _initialise
    from zoo.science.evaluation import evaluate
    from zoo.science.models import create_model
    from zoo.science.registry import get_entry, get_task_spec
    from zoo.science.tasks.frozen import load_split

    entry = get_entry("gd-ssm-sine-gd-mlp")
    task = get_task_spec(entry.task).build()
    validation, test = (load_split(entry.task, s, spec=get_task_spec(entry.task)) for s in ("validation", "test"))
    torch.manual_seed(0)
    start = create_model(entry.arch, task)
    info = _initialise(entry, start, task, validation)
    assert info["init"] == "gd_ssm" and info["eta"] == pytest.approx(task.analytic_eta())
    m = evaluate(start.double(), task, test.batch(task, dtype=torch.float64), eta=info["eta"])
    assert m["test_loss"] == pytest.approx(m["gd_loss"], rel=1e-9)

    ckpt = zoo.build("gd-ssm-sine-gd-mlp", tmp_path, steps=5, progress=False, overrides={"source.batch_size": 8},
                     graphs=False)
    trained, initial = ckpt.model.state_dict(), start.float().state_dict()
    frozen = [k for k in trained if entry.source.frozen(k)]
    assert frozen and all(torch.equal(trained[k], initial[k]) for k in frozen)
    assert not torch.equal(trained["mlp.outer.weight"], initial["mlp.outer.weight"])
    assert ckpt.construction["init"] == "gd_ssm" and "frozen" in (tmp_path / "README.md").read_text()
