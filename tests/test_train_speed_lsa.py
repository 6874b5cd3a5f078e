"""The LSA's query-only read-out (`LinearSelfAttention.predict`, issue 43): the same prediction and gradients
as `readout(forward)`, and the same training losses. No timings here: benchmarks/train_throughput.py
measures them."""

import itertools

import pytest
import torch
from same_training import assert_trains_the_same, losses_and_weights

from zoo.running.train import train
from zoo.science.models import create_model
from zoo.science.models.lsa import LinearSelfAttention
from zoo.science.registry import get_entry, get_task_spec
from zoo.science.tasks.regression import Readout


def assert_close_to_scale(got, expected, tol):
    """max |got − expected| ≤ tol · max |expected|: rounding relative to the tensor's scale (an element
    that is a difference of large terms carries their rounding, not its own)."""
    scale = expected.abs().max().clamp_min(1e-300)
    assert ((got - expected).abs().max() / scale).item() <= tol, ((got - expected).abs().max() / scale).item()


CASES = list(itertools.product(["causal", "strict_causal", "context"], [True, False], [True, False], [1, 2], [1, 2],
                               [-1, 3, 0]))


@pytest.mark.parametrize("attention,residual,constant,n_layers,loops,position", CASES)
def test_predict_equals_the_full_forward_in_float64(attention, residual, constant, n_layers, loops, position):
    """Every attention mode, with and without residual and constant channel, 1–2 layers, looped, and a
    query at the end, in the middle and first: values and every weight's gradient, float64 rounding."""
    torch.manual_seed(0)
    readout = Readout(position=position, start=1, stop=3, sign=-1.0)
    model = LinearSelfAttention(5, readout, n_layers=n_layers, attention=attention, loops=loops, damping=0.8,
                                init_std=0.3, residual=residual, constant=constant).double()
    tokens = torch.randn(7, 9, 5, dtype=torch.float64)
    fast, full = model.predict(tokens), model.readout(model(tokens))
    assert torch.isfinite(full).all()  # (a strict-causal first query has no key: its update is 0)
    assert_close_to_scale(fast, full, 1e-12)
    cotangent = torch.randn_like(full)
    expected = torch.autograd.grad((full * cotangent).sum(), list(model.parameters()))
    got = torch.autograd.grad((fast * cotangent).sum(), list(model.parameters()))
    for g, e in zip(got, expected):
        assert_close_to_scale(g, e, 1e-12)


def test_every_position_still_reads_the_full_forward():
    torch.manual_seed(0)
    model = LinearSelfAttention(4, Readout(position=None, start=0, stop=2, sign=1.0), attention="causal")
    tokens = torch.randn(3, 6, 4)
    assert torch.equal(model.predict(tokens), model.readout(model(tokens)))


@pytest.mark.parametrize("mode", ["eager", pytest.param("compiled", marks=pytest.mark.compile)])
@pytest.mark.parametrize("name", ["lsa-1l-gdssm-1d", "lsa-2l-gdssm-1d"])
def test_lsa_training_losses_equal_the_full_forward_read_out(name, mode, tmp_path):
    """From one seed, training through `predict` and through `readout(forward)` (the benchmark's plain
    baseline) sees the same batches and gives the same losses and weights to rounding: float32
    reassociation (k_s·q summed as e_s·(W_Kᵀq)), grown over 100 AdamW steps. Losses: 1e-4 relative,
    while a wrong gradient moves them by > 1e-2 within a few steps. Weights: 1e-4 absolute, as in
    test_train.py's compiled-vs-eager test (Adam normalises each weight's step, so a weight whose gradient
    is rounding noise moves by up to lr a step in either run; measured ≤ 8e-6 here)."""
    entry = get_entry(name)
    task = get_task_spec(entry.task).build()
    run = entry.source.model_copy(update={"eval_every": 10, "checkpoint_every": 10**9, "warmup_steps": 0,
                                          "lr": 3e-3})
    results = {}
    for run_mode in ("plain", mode):
        torch.manual_seed(0)
        model = create_model(entry.arch, task)
        if run_mode == "plain":
            model.predict = lambda tokens, model=model: model.readout(model(tokens))
        result = train(model, task, run, run_dir=tmp_path / run_mode, steps=100, device="cpu", progress=False,
                       compiled=run_mode == "compiled")
        results[run_mode] = losses_and_weights(result, model)
    assert_trains_the_same(results, "plain", (mode,), weight_atol=1e-4)
