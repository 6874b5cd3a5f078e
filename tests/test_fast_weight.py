"""The triples layout and the fast-weight network of "Recurrent networks can learn in-context by
gradient descent": each construction against its defining math, computed independently on the
prefix, at every position, on fresh random tasks in float64."""

import dataclasses

import pytest
import torch

from zoo.science.constructions import construct
from zoo.science.models import create_model
from zoo.science.registry import get_entry, get_task_spec
from zoo.science.tasks.regression import gd_predict, least_squares_predict, online_gd_predict, prefix_gd_predict

TASK = get_task_spec("linreg-triples-d5-c20").build()


def fresh_tasks(seed: int, n: int = 300, **changes):
    """Tasks the construction never saw: another seed, and (where given) another distribution."""
    return dataclasses.replace(TASK, **changes).sample(n, seed=seed, dtype=torch.float64)


def constructed(name: str):
    entry = get_entry(name)
    model = create_model(entry.arch, TASK).double()
    construct(entry, model, TASK)
    return model


def test_triples_layout():
    b = fresh_tasks(0, n=4)
    d_x, d_y = TASK.d_x, TASK.d_y
    assert b.tokens.shape == (4, TASK.n_context, 2 * d_x + d_y) and TASK.n_tokens == TASK.n_context
    for t in range(TASK.n_context):  # token t = [x_t, y_t, x_{t+1}] (0-based t here)
        torch.testing.assert_close(b.tokens[:, t, :d_x], b.x[:, t])
        torch.testing.assert_close(b.tokens[:, t, d_x : d_x + d_y], b.y[:, t])
        torch.testing.assert_close(b.tokens[:, t, d_x + d_y :], b.x[:, t + 1])
    torch.testing.assert_close(b.targets, b.y[:, 1:])  # y_{t+1} at every position
    torch.testing.assert_close(b.query_targets, b.y[:, -1])
    assert not any(torch.equal(b.tokens[:, t, d_x : d_x + d_y], b.y[:, -1]) for t in range(TASK.n_context))
    assert TASK.readout.position is None and TASK.query_channels == (d_x + d_y, 2 * d_x + d_y)


def _one_step_gd_on_prefix(b, t: int, eta: float) -> torch.Tensor:
    """The zoo's query GD on a batch cut to the first t examples and x_{t+1} as the query."""
    prefix = TASK.__class__(d_x=TASK.d_x, d_y=TASK.d_y, n_context=t).batch_from_arrays(b.x[:, : t + 1], b.y[:, : t + 1])
    return gd_predict(prefix, eta)


@pytest.mark.parametrize("x_dist", ["uniform", "normal"])
def test_hebbian_construction_is_one_gd_step_on_every_prefix_at_eta_star_t(x_dist):
    model = constructed("fast-weight-hebbian-gd-triples")
    b = fresh_tasks(7, x_dist=x_dist, x_scale=0.8)
    with torch.no_grad():
        pred = model.predict(b.tokens)  # (N, C, d_y)
    for t in range(1, TASK.n_context + 1):  # η*_t of the task the model was built for
        reference = _one_step_gd_on_prefix(b, t, TASK.analytic_eta(t))
        torch.testing.assert_close(pred[:, t - 1], reference, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pred, prefix_gd_predict(b, TASK.prefix_etas()), rtol=1e-12, atol=1e-12)


def test_hebbian_fixed_rate_is_the_notes_network_as_written():
    entry = get_entry("fast-weight-hebbian-fixed-triples")
    model = constructed(entry.name)
    assert entry.source.eta == pytest.approx(TASK.analytic_eta())  # the fixed rate is η*_C
    b = fresh_tasks(8)
    with torch.no_grad():
        pred = model.predict(b.tokens)
    for t in (1, 7, TASK.n_context):
        torch.testing.assert_close(pred[:, t - 1], _one_step_gd_on_prefix(b, t, entry.source.eta), rtol=1e-12, atol=1e-12)


def test_delta_rule_construction_is_online_gd_by_autograd():
    """W_t = W_{t−1} − η ∇_W ½‖y_t − W x_t‖², the gradient taken by autograd, W_t applied to x_{t+1}."""
    entry = get_entry("fast-weight-delta-triples")
    model = constructed(entry.name)
    b = fresh_tasks(9, n=64)
    eta = entry.source.eta
    w = torch.zeros(b.x.shape[0], TASK.d_y, TASK.d_x, dtype=torch.float64)
    expected = []
    for t in range(TASK.n_context):
        w = w.detach().requires_grad_(True)
        loss = 0.5 * ((b.y[:, t] - (w @ b.x[:, t].unsqueeze(-1)).squeeze(-1)) ** 2).sum()
        (grad,) = torch.autograd.grad(loss, w)
        w = w - eta * grad
        expected.append((w @ b.x[:, t + 1].unsqueeze(-1)).squeeze(-1).detach())
    with torch.no_grad():
        pred = model.predict(b.tokens)
    torch.testing.assert_close(pred, torch.stack(expected, dim=1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(online_gd_predict(b, eta), pred, rtol=1e-12, atol=1e-12)


def test_what_the_approximation_costs():
    """On the task's own distribution the exact delta rule (online GD) beats the note's 𝓘 = I
    approximation (one GD step) from the second example on, and least squares is exact once t ≥ d_x."""
    b = TASK.sample(4000, seed=11, dtype=torch.float64)
    loss = lambda pred: 0.5 * ((pred - b.y[:, 1:]) ** 2).mean(dim=(0, 2))  # noqa: E731
    hebbian = loss(prefix_gd_predict(b, TASK.prefix_etas()))
    delta = loss(online_gd_predict(b, TASK.online_eta()))
    assert (delta[4:] < hebbian[4:]).all()
    assert delta[-1] < 0.25 * hebbian[-1]  # measured 0.022 vs 0.16 at t = 20
    assert hebbian[-1] == pytest.approx(TASK.analytic_gd_loss(), rel=0.05)  # the closed form at t = C
    last = least_squares_predict(b)
    assert (0.5 * (last - b.query_targets) ** 2).mean() < 1e-20


def test_the_fast_weight_network_needs_the_triples_layout():
    entry = get_entry("fast-weight-triples")
    with pytest.raises(ValueError, match="layout 'triples'"):
        create_model(entry.arch, get_task_spec("linreg-d10-c10").build())


def test_built_entry_reports_loss_against_position(tmp_path):
    """zoo build → eval_results.json's per-position curves → the card's table and figure, and
    zoo report's loss-against-position section, all the same numbers."""
    import json

    import zoo
    from zoo.publishing.report import collect, write_report

    folder = tmp_path / "hebbian"
    zoo.build("fast-weight-hebbian-gd-triples", folder, progress=False, graphs=False)
    metrics = json.loads((folder / "eval_results.json").read_text())
    curves = ("position_loss", "position_gd_loss", "position_gd_fixed_loss", "position_online_gd_loss", "position_lstsq_loss")
    assert all(len(metrics[k]) == TASK.n_context for k in curves)
    assert metrics["position_loss"] == pytest.approx(metrics["position_gd_loss"], rel=1e-5)  # the construction is GD at η*_t
    assert metrics["position_loss"][-1] == pytest.approx(metrics["test_loss"], rel=1e-6)  # the query is the last position
    card = (folder / "README.md").read_text()
    assert "### Loss against position" in card and (folder / "loss_vs_position.png").stat().st_size > 10_000
    assert f"| 20 | {metrics['position_loss'][-1]:.4g} |" in card
    md, *_ = write_report(collect([folder]), tmp_path / "report")
    table = md.read_text().split("loss against position", 1)[1]
    assert f"| fast-weight-hebbian-gd-triples | 1 | {metrics['position_loss'][0]:.4g} |" in table
    assert (tmp_path / "report" / "report-linreg-triples-d5-c20-position.png").exists()
