"""The paper rows that need no training (issue 51, item 6), checked in float64 on fresh tasks: the functions are
scripts/paper_rows.py's, which writes each row's raw result under reports/<paper>/generated/<row>/.

Tolerances: an exact construction is held to 1e-12 (absolute, on predictions of order 1: float64 rounding of
sums of ~100 products is ~1e-15, and a wrong step or rate is off by 1e-2 or more); a statistical claim to 4
standard errors of its own Monte Carlo or sampling estimate (seeds are fixed, so the check is deterministic)."""

import importlib.util
from pathlib import Path

import pytest
import torch

import zoo
from zoo.science.tasks.regression import LinearRegressionTask, empirical_eta, gd_predict

_spec = importlib.util.spec_from_file_location("paper_rows", Path(__file__).parent.parent / "scripts" / "paper_rows.py")
rows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rows)

EXACT = 1e-12


# ---------------------------------------------------------------- Zucchet et al. Appendix C.2
def test_c2_trace_moments_are_eq_35_not_eq_34_as_printed():
    """Eq. 35: Tr E[XXᵀXXᵀ] = n d σ⁴ (n + d − 1/5) = 532.8 for n = 12, d = 3, σ² = 1; Eq. 34 as printed drops a
    factor d_x from its last term (484.8). Monte Carlo over 100,000 draws, s.e. ~0.5."""
    mc = rows.trace_moments(d=3, n=12, draws=100_000, seed=1)
    assert abs(mc["tr_xxxx"] - 532.8) < 4 * mc["tr_xxxx_se"]
    assert abs(mc["tr_xxxx"] - 484.8) > 40 * mc["tr_xxxx_se"]
    assert abs(mc["tr_xx"] - 36.0) < 0.1  # n d σ²; its s.e. is ~0.01 at this many draws


@pytest.mark.parametrize("w_var", [1 / 3, 2 / 3])
def test_c2_best_one_step_rate_is_eta_star_whatever_the_weights_variance(w_var):
    """η* = 1/(T + d_x − 1/5) = 0.067568 (Table 2 prints 6.76e-2), and the loss-optimal rate on 10,000 fresh tasks
    is within 4 of its bootstrap s.e. of it for either weight variance ("only the distribution of the learning
    data matters")."""
    task = LinearRegressionTask(d_x=3, d_y=3, n_context=12, x_scale=3**0.5, w_std=w_var**0.5)
    assert task.analytic_eta() == pytest.approx(1 / 14.8, rel=1e-12) and round(task.analytic_eta(), 4) == 0.0676
    b = task.sample(10_000, seed=7, dtype=torch.float64)
    se = rows.bootstrap_eta_se(b, resamples=200)
    assert abs(empirical_eta(b) - task.analytic_eta()) < 4 * se and se < 0.01 * task.analytic_eta()


# ---------------------------------------------------------------- Zucchet et al. Appendix B.2
def test_b2_rows_with_a_common_rank_one_kernel_merge_into_one_construction_row():
    r = rows.b2_merge_on_a_construction(d=4, seed=3)
    assert min(r["split_rows_m_share_off_kv"][:2]) > 0.1  # the split rows do mix the neuron groups
    assert r["common_kernel_rank_one_sigma2_over_sigma1"] < EXACT and r["kernels_proportional_sigma2_over_sigma1"] < EXACT
    assert r["max_abs_output_change"] < EXACT * r["output_scale"]
    assert r["max_abs_change_from_the_construction"] < EXACT * r["output_scale"]
    assert r["merged_u_share_off_kv"] < EXACT and r["merged_v_share_off_query"] < EXACT


# ---------------------------------------------------------------- Sushma, Tian et al. Propositions 1-3, A.4
PROPOSITIONS = [  # (layout, d_x, d_y, n_context, layers, ridge)
    ("products", 10, 1, 10, 1, 0.0),  # Proposition 1 at A.5's f = N = 10
    ("interleaved", 5, 3, 10, 1, 0.0),  # Proposition 2
    ("interleaved", 5, 5, 10, 2, 0.0),  # Proposition 3
    ("interleaved", 5, 5, 10, 3, 0.0),
    ("interleaved", 5, 5, 10, 2, 1.0),  # A.4: ridge-regularised steps
    ("interleaved", 4, 2, 8, 3, 20.0),
]


@pytest.mark.parametrize("layout,d_x,d_y,n,layers,ridge", PROPOSITIONS)
def test_gd_ssm_construction_predicts_as_gd_at_every_token(layout, d_x, d_y, n, layers, ridge):
    """Every position that predicts (every token; every x token after the first) gives the (ridge) GD prediction
    of `layers` steps on the examples before it; y tokens output 0."""
    task = LinearRegressionTask(d_x=d_x, d_y=d_y, n_context=n, layout=layout)
    r = rows.every_position_error(task, layers, ridge, eta=0.05, seed=5, n_tasks=64)
    assert r["positions"] == n and r["max_abs_error"] < EXACT
    assert r["max_abs_output_at_y_tokens"] == (None if layout == "products" else 0.0)
    assert r["prediction_scale"] > 0.5


def test_a4_ridge_changes_the_read_out_not_the_recurrence():
    task = LinearRegressionTask(d_x=5, d_y=5, n_context=10, layout="interleaved")
    plain, ridged = rows.gd_ssm(task, 2), rows.gd_ssm(task, 2, ridge=1.0)
    assert all(torch.equal(p, q) for p, q in zip(plain.state_dict().values(), ridged.state_dict().values()))
    b = task.sample(64, seed=9, dtype=torch.float64)
    assert (plain.predict(b.tokens) - ridged.predict(b.tokens)).abs().max() > 1e-2  # and the ridge does act


# ---------------------------------------------------------------- blogpost: the GD construction, the best rate
@pytest.mark.parametrize("d_x,c,eta", [(5, 10, 0.1), (3, 50, 0.02)])
def test_blog_main_result_every_token_moves_as_one_gd_step(d_x, c, eta):
    r = rows.token_dynamics_error(d_x, c, eta, seed=11)
    assert r["max_abs_token_error"] < EXACT * r["token_scale"]
    assert r["max_abs_loss_identity_error"] < 1e-10 and r["query_prediction_error_vs_gd_at_w0_zero"] < EXACT


def test_blog_rotation_note_holds_on_the_key_query_side_not_as_printed():
    r = rows.rotation_note(seed=4)
    assert r["relative_change_key_query_rotation"] < EXACT and r["relative_change_as_printed"] > 0.1


def test_blog_closed_form_rate_is_the_line_search_minimum():
    """The blogpost's closed form against a golden-section search on the constructed transformer's own loss: the
    loss is quadratic in η, so the search finds the minimum to ~√ε of float64 (1e-8 relative) once its bracket,
    0.618^60 ≈ 3e-13 of [0, 2.5 η*] after 60 steps, is below that."""
    task = LinearRegressionTask(d_x=5, n_context=10)
    b = task.sample(500, seed=13, dtype=torch.float64)
    assert rows.theta_gd_line_search(task, b, iters=60) == pytest.approx(rows.blog_eta(b, 0), rel=1e-6)


@pytest.mark.parametrize("name", ["lsa-d10-c10", "lsa-1l-gdssm-1d"])
def test_trained_one_layer_lsa_implements_eta_star(name):
    """The GD rate closest to the released trained LSA's predictions is η* to within 1.1%: one standard error of
    the loss-optimal rate measured on a 10,000-task split (bootstrap, reports/blogpost-2024/generated/best-rate),
    the precision with which a test split can say where the best rate is. (Measured: +0.008% and −0.28%.)"""
    ckpt = zoo.load(name)
    task, model = ckpt.task, ckpt.model.double().requires_grad_(False)
    b = task.sample(2000, seed=17, dtype=torch.float64)
    pred, g = model.predict(b.tokens), gd_predict(b, 1.0)
    closest = float((pred * g).sum() / (g * g).sum())
    assert closest == pytest.approx(task.analytic_eta(), rel=0.011)
