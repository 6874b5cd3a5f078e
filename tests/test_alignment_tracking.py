"""Alignment with GD recorded during training (the blogpost's Figure 10): the probe against the
defining math, training left unchanged by it, ensembles recording each member's own curve."""

import json

import pytest
import torch

import zoo
from zoo.running.builder import build, build_ensemble
from zoo.science.evaluation import PROBE_TASKS, alignment_probe
from zoo.science.registry import get_entry, get_task_spec, with_overrides
from zoo.science.tasks.frozen import load_split
from zoo.science.tasks.regression import gd_predict
from zoo.storage.manifest import HISTORY

KEYS = ("pred_l2_to_gd", "sensitivity_l2_to_gd", "sensitivity_cosine")
SHORT = {"source.eval_every": 10, "source.batch_size": 64}


def validation_of(name):
    entry = get_entry(name)
    spec = get_task_spec(entry.task)
    task = spec.build()
    return task, load_split(entry.task, "validation", spec=spec).batch(task)


def test_probe_of_the_gd_construction_is_exact_and_of_a_zero_model_is_gds_own_size():
    ckpt = zoo.build("lsa-gd-d10-c10")
    task, batch = validation_of("lsa-gd-d10-c10")
    eta = ckpt.metrics["gd_eta"]
    probe = alignment_probe(task, batch, eta=eta)
    exact = probe(ckpt.model)
    assert exact["pred_l2_to_gd"] < 1e-9 and exact["sensitivity_l2_to_gd"] < 1e-9  # float32 rounding only
    assert exact["sensitivity_cosine"] == pytest.approx(1.0, abs=1e-6)

    zero = ckpt.model
    with torch.no_grad():
        for p in zero.parameters():
            p.zero_()
    # f ≡ 0: the prediction error is E‖ŷ_GD‖² and the gradient error E‖W_1‖² with W_1 = η Σ y_i x_iᵀ
    sub = task.batch_from_arrays(batch.x[:PROBE_TASKS].double(), batch.y[:PROBE_TASKS].double())
    w1 = eta * torch.einsum("nci,ncj->nij", sub.y_context, sub.x_context)  # (N, d_y, d_x)
    expected_pred = (gd_predict(sub, eta) ** 2).sum(1).mean().item()
    measured = probe(zero)
    assert measured["pred_l2_to_gd"] == pytest.approx(expected_pred, rel=1e-5)
    assert measured["sensitivity_l2_to_gd"] == pytest.approx((w1 ** 2).sum((1, 2)).mean().item(), rel=1e-5)


def test_tracking_leaves_training_unchanged_and_records_the_model_at_each_eval(tmp_path):
    entry = with_overrides(get_entry("lsa-d10-c10"), SHORT)
    plain = build(entry, tmp_path / "plain", steps=30, device="cpu", progress=False, graphs=False)
    tracked = build(entry, tmp_path / "tracked", steps=30, device="cpu", progress=False, track_alignment=True,
                    graphs=False)
    for a, b in zip(plain.model.parameters(), tracked.model.parameters()):
        assert torch.equal(a, b)  # the probe draws no training data and touches no weight
    assert [h["train_loss"] for h in plain.history] == [h["train_loss"] for h in tracked.history]
    assert [h["step"] for h in tracked.history] == [10, 20, 30]
    assert all(k in h for h in tracked.history for k in KEYS)
    # the last row is the final model's, scored again from scratch
    task, batch = validation_of("lsa-d10-c10")
    again = alignment_probe(task, batch, eta=tracked.metrics["gd_eta"])(tracked.model)
    assert {k: tracked.history[-1][k] for k in KEYS} == pytest.approx(again, rel=1e-5)
    assert tracked.history[0]["pred_l2_to_gd"] != tracked.history[-1]["pred_l2_to_gd"]  # it moved with training
    # saved with the checkpoint, plotted on its card
    assert "sensitivity_cosine" in json.loads((tmp_path / "tracked" / HISTORY).read_text())[-1]
    assert (tmp_path / "tracked" / "alignment_curve.png").is_file()
    assert "alignment_curve.png" in (tmp_path / "tracked" / "README.md").read_text()
    assert not (tmp_path / "plain" / "alignment_curve.png").exists()


def test_an_ensemble_records_each_members_own_curve(tmp_path):
    entry = with_overrides(get_entry("lsa-d10-c10"), SHORT)
    seeds = [0, 1]
    members = build_ensemble(entry, seeds, [tmp_path / f"m{s}" for s in seeds], run_dir=tmp_path / "ens", steps=20,
                             device="cpu", progress=False, track_alignment=True, graphs=False)
    solo = build(entry, tmp_path / "solo1", steps=20, seed=1, device="cpu", progress=False, track_alignment=True,
                 graphs=False)
    for row, solo_row in zip(members[1].history, solo.history):
        assert all(isinstance(row[k], float) for k in KEYS)
        assert {k: row[k] for k in KEYS} == pytest.approx({k: solo_row[k] for k in KEYS}, rel=1e-3)
    assert members[0].history[-1]["pred_l2_to_gd"] != members[1].history[-1]["pred_l2_to_gd"]


def test_tracking_is_refused_where_gd_alignment_is_undefined(tmp_path):
    with pytest.raises(ValueError, match="in-context regression"):
        build("gated-rnn-student-d4", tmp_path / "s", steps=5, device="cpu", progress=False, track_alignment=True)


def test_the_sensitivity_cosine_is_a_cosine_for_vanishing_sensitivities():
    """A model collapsed to a constant has float32 sensitivities near 0 (down to denormals): the cosine stays in
    [−1, 1] and is 0 where a sensitivity is exactly 0 (torch's eps-clamped cosine gave −5e5 for such a model); on
    ordinary rows it is the float64 cosine."""
    from zoo.science.evaluation import alignment
    from zoo.science.tasks.regression import LinearRegressionTask, gd_weights

    task = LinearRegressionTask(d_x=3, d_y=1, n_context=6)
    b = task.sample(4, seed=0, dtype=torch.float64)
    ref = gd_weights(b, 0.3, 1).float()  # (4, 1, 3)
    sens = torch.stack([ref[0] * 1e-41, torch.zeros_like(ref[1]), -2 * ref[2], torch.tensor([[1.0, -1.0, 0.5]])])
    cos = alignment(torch.zeros(4, 1), sens, b, 0.3)["sensitivity_cosine"]
    last = torch.nn.functional.cosine_similarity(sens[3].double().flatten(), ref[3].double().flatten(), dim=0).item()
    assert cos == pytest.approx((1.0 + 0.0 - 1.0 + last) / 4, abs=1e-6)
