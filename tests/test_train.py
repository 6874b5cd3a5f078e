"""Training: reproducible, resumable to the bit, NaN-guarded, and it learns GD."""

import json

import pytest
import torch

from zoo.running.train import META_FILE, TrainingDiverged, lr_factor, train
from zoo.science.models.lsa import LinearSelfAttention
from zoo.science.registry import TrainRecipe
from zoo.science.tasks.regression import LinearRegressionTask

TASK = LinearRegressionTask(d_x=4, d_y=1, n_context=8)


def recipe(**kw):
    base = dict(kind="trained", lr=3e-3, steps=40, batch_size=256, eval_every=10, checkpoint_every=10, warmup_steps=5)
    return TrainRecipe(**{**base, **kw})


def fresh_model(seed=0):
    torch.manual_seed(seed)
    return LinearSelfAttention(TASK.token_dim, TASK.readout, init_std=0.1)


def test_same_seed_same_weights(tmp_path):
    a, b = fresh_model(), fresh_model()
    train(a, TASK, recipe(), run_dir=tmp_path / "a", device="cpu", progress=False)
    train(b, TASK, recipe(), run_dir=tmp_path / "b", device="cpu", progress=False)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path):
    straight = fresh_model()
    train(straight, TASK, recipe(), run_dir=tmp_path / "straight", device="cpu", progress=False)

    task = poisoned_task(set(), interrupt_at=21)  # Ctrl-C when batch 21 is requested
    with pytest.raises(KeyboardInterrupt, match="run the same command again to resume"):
        train(fresh_model(), task, recipe(), run_dir=tmp_path / "cut", device="cpu", progress=False)
    assert json.loads((tmp_path / "cut" / META_FILE).read_text())["step"] == 20

    resumed = fresh_model(seed=99)  # a new process: weights must come from the saved state, not the init
    result = train(resumed, TASK, recipe(), run_dir=tmp_path / "cut", device="cpu", progress=False)
    assert result.resumed_from == 20
    for ps, pr in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(ps, pr)


def test_nan_guard_stops_and_keeps_last_good_state(tmp_path):
    model = fresh_model()
    with pytest.raises(TrainingDiverged, match="last good training state"):
        train(model, TASK, recipe(lr=1e4, steps=400, warmup_steps=0, checkpoint_every=1), run_dir=tmp_path,
              device="cpu", progress=False)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "train_state.safetensors"))
    assert all(torch.isfinite(v).all() for k, v in saved.items() if k.startswith("model."))


def test_a_non_finite_loss_is_never_applied_to_the_weights(tmp_path, monkeypatch):
    """A poisoned batch at step 7 stops training before its gradient reaches the weights: the
    in-memory model keeps step 7's finite weights (bitwise those of a clean run stopped there)."""
    flat = dict(schedule="constant", warmup_steps=0)  # the lr of step t does not depend on the run's length
    clean = fresh_model()
    train(clean, TASK, recipe(steps=7, **flat), run_dir=tmp_path / "clean", device="cpu", progress=False)
    task = poisoned_task({8})  # the 8th training batch: step 7 (0-based)
    model = fresh_model()
    with pytest.raises(TrainingDiverged, match=r"the loss is not finite at step 7 \(nan\)"):
        train(model, task, recipe(steps=40, **flat), run_dir=tmp_path / "poisoned", device="cpu", progress=False)
    for (name, p), q in zip(model.named_parameters(), clean.parameters()):
        assert torch.isfinite(p).all() and torch.equal(p, q), name


def poisoned_task(at_calls: set[int], interrupt_at: int | None = None):
    """TASK whose training batches number `at_calls` (1-based) are NaN, Ctrl-C at batch `interrupt_at`."""
    import dataclasses

    calls = {"n": 0}

    class Poisoned(type(TASK)):
        def sample(self, n, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == interrupt_at:
                raise KeyboardInterrupt
            batch = super().sample(n, *args, **kwargs)
            if calls["n"] in at_calls:
                batch = dataclasses.replace(batch, tokens=torch.full_like(batch.tokens, float("nan")))
            return batch

    return Poisoned(**{f.name: getattr(TASK, f.name) for f in dataclasses.fields(TASK)})


def test_a_skipped_step_leaves_the_weights_as_they_were(tmp_path):
    """max_skipped_steps = 1: the poisoned step 7 is skipped, so 8 steps give bitwise the weights of a
    clean 7-step run (a constant lr), and the row records the skip."""
    flat = dict(schedule="constant", warmup_steps=0)
    clean = fresh_model()
    train(clean, TASK, recipe(steps=7, **flat), run_dir=tmp_path / "clean", device="cpu", progress=False)
    model = fresh_model()
    result = train(model, poisoned_task({8}), recipe(steps=8, max_skipped_steps=1, **flat), run_dir=tmp_path / "skip",
                   device="cpu", progress=False)
    assert result.history[-1]["step"] == 8 and result.history[-1]["skipped"] == 1
    for (name, p), q in zip(model.named_parameters(), clean.parameters()):
        assert torch.equal(p, q), name


def test_one_skip_more_than_the_recipe_allows_stops(tmp_path):
    with pytest.raises(TrainingDiverged, match=r"not finite at step 25 \(nan\); 1 steps were skipped already"):
        train(fresh_model(), poisoned_task({8, 26}), recipe(max_skipped_steps=1), run_dir=tmp_path, device="cpu",
              progress=False)


def test_a_skip_keeps_the_schedule_and_resumes_to_the_bit(tmp_path):
    """The lr schedule moves on over a skipped step: a run cut at step 15 (state of step 10) and
    resumed, whose schedule restarts at step 10, equals the uninterrupted run."""
    r = recipe(steps=20, max_skipped_steps=1)
    straight = fresh_model()
    train(straight, poisoned_task({8}), r, run_dir=tmp_path / "straight", device="cpu", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(fresh_model(), poisoned_task({8}, interrupt_at=16), r, run_dir=tmp_path / "cut", device="cpu",
              progress=False)
    resumed = fresh_model(seed=99)
    result = train(resumed, TASK, r, run_dir=tmp_path / "cut", device="cpu", progress=False)
    assert result.resumed_from == 10 and result.history[0]["skipped"] == 1
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name


def test_a_skip_since_the_last_row_survives_a_checkpoint_between_rows(tmp_path):
    """Rows every 10 steps, states every 5, cap 1, NaN batches at steps 2 and 12: cut after the state
    of step 5 and resumed, the run still knows step 2 was skipped, and stops at step 12 as the
    uninterrupted run does."""
    r = recipe(eval_every=10, checkpoint_every=5, max_skipped_steps=1)
    with pytest.raises(TrainingDiverged, match=r"at step 12 \(nan\); 1 steps were skipped already"):
        train(fresh_model(), poisoned_task({3, 13}), r, run_dir=tmp_path / "straight", device="cpu", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(fresh_model(), poisoned_task({3}, interrupt_at=8), r, run_dir=tmp_path / "cut", device="cpu",
              progress=False)
    assert json.loads((tmp_path / "cut" / META_FILE).read_text())["skipped_after_last_row"] == 1
    with pytest.raises(TrainingDiverged, match=r"at step 12 \(nan\); 1 steps were skipped already"):
        train(fresh_model(), poisoned_task({8}), r, run_dir=tmp_path / "cut", device="cpu", progress=False)


class InfiniteGradient(torch.autograd.Function):
    """The identity, whose backward returns inf: a finite loss with an overflowing gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


def overflowing_task(at_calls: set[int]):
    """TASK whose training batches number `at_calls` (1-based) have a finite loss and an infinite gradient."""
    import dataclasses

    calls = {"n": 0}

    class Overflowing(type(TASK)):
        def sample(self, n, *args, **kwargs):
            calls["n"] += 1
            return super().sample(n, *args, **kwargs)

        def loss(self, pred, targets):
            if calls["n"] in at_calls and pred.requires_grad:
                pred = InfiniteGradient.apply(pred)
            return super().loss(pred, targets)

    return Overflowing(**{f.name: getattr(TASK, f.name) for f in dataclasses.fields(TASK)})


def test_a_finite_loss_with_an_overflowing_gradient_is_skipped(tmp_path):
    """Step 7's loss is finite but its gradient is not (the 5-layer LSA has such batches: a loss near
    float32's top whose backward overflows): with a recipe that skips, it is not applied, as AMP's
    GradScaler skips it, and a second one past the cap stops the run at that step."""
    flat = dict(schedule="constant", warmup_steps=0)
    clean = fresh_model()
    train(clean, TASK, recipe(steps=7, **flat), run_dir=tmp_path / "clean", device="cpu", progress=False)
    model = fresh_model()
    result = train(model, overflowing_task({8}), recipe(steps=8, max_skipped_steps=1, **flat),
                   run_dir=tmp_path / "skip", device="cpu", progress=False)
    assert result.history[-1]["skipped"] == 1
    for (name, p), q in zip(model.named_parameters(), clean.parameters()):
        assert torch.equal(p, q), name
    with pytest.raises(TrainingDiverged, match=r"the gradient is not finite at step 12 \(.*\); 1 steps were skipped"):
        train(fresh_model(), overflowing_task({8, 13}), recipe(steps=20, max_skipped_steps=1, **flat),
              run_dir=tmp_path / "twice", device="cpu", progress=False)


def test_an_ensemble_refuses_a_recipe_that_skips(tmp_path):
    from pydantic import ValidationError

    from zoo.running.ensemble import train_ensemble

    with pytest.raises(ValidationError, match="max_skipped_steps"):  # a cap is a count
        recipe(max_skipped_steps=-1)

    with pytest.raises(ValueError, match="one model at a time"):
        train_ensemble(fresh_model, TASK, recipe(max_skipped_steps=3), [0, 1], run_dir=tmp_path, device="cpu")


def test_cosine_schedule_shape():
    r = recipe(steps=100, warmup_steps=10, lr=1.0, final_lr=0.1)
    assert lr_factor(0, r, 100) == pytest.approx(0.1)
    assert lr_factor(10, r, 100) == pytest.approx(1.0)
    assert lr_factor(55, r, 100) == pytest.approx(0.55)
    assert lr_factor(100, r, 100) == pytest.approx(0.1)


def test_one_layer_lsa_learns_gd_on_a_small_task(tmp_path):
    """A short CPU run: loss within 3% of one optimal GD step and sensitivities aligned with θ_GD."""
    from zoo.science.evaluation import evaluate

    model = fresh_model()
    train(model, TASK, recipe(steps=600, batch_size=1024, lr=5e-3, final_lr=1e-4, checkpoint_every=600, eval_every=600),
          run_dir=tmp_path, device="cpu", progress=False)
    test = TASK.sample(4000, seed=11)
    m = evaluate(model, TASK, test)
    assert m["test_loss"] < 1.03 * m["gd_loss"], m
    assert m["sensitivity_cosine"] > 0.98, m


@pytest.mark.parametrize("optimizer,expected", [("adamw", 1 - 0.1 * 1e-4), ("adam_l2", 1 - 0.1)])
def test_decay_of_a_weight_the_loss_never_touches(optimizer, expected):
    """AdamW shrinks it by lr·λ·w per step; Adam with an L2 term normalises the decay like a
    gradient and moves it by ~lr (what removes Table 2's unconstrained terms)."""
    from zoo.running.train import make_optimizer
    from zoo.science.registry import TrainRecipe

    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    recipe = TrainRecipe(kind="trained", lr=0.1, weight_decay=1e-4, steps=1, batch_size=1, optimizer=optimizer)
    opt = make_optimizer(model, recipe)
    loss = (model(torch.tensor([[1.0, 0.0]])) - 3.0).pow(2).sum()  # no gradient for the second weight
    loss.backward()
    opt.step()
    assert model.weight[0, 1].item() == pytest.approx(expected, rel=1e-4)  # Adam's ε = 1e-8 against |g| = 1e-4


@pytest.mark.compile
def test_compiled_run_resumes_to_the_same_weights(tmp_path):
    """compiled=True keeps each lr in a tensor the schedule rewrites in place (no recompile per step);
    that state saves and restores like the eager one: a cut compiled run resumes to the uninterrupted one."""
    straight = fresh_model()
    train(straight, TASK, recipe(), run_dir=tmp_path / "straight", device="cpu", progress=False, compiled=True)

    task = poisoned_task(set(), interrupt_at=21)  # Ctrl-C when batch 21 is requested
    with pytest.raises(KeyboardInterrupt, match="run the same command again to resume"):
        train(fresh_model(), task, recipe(), run_dir=tmp_path / "cut", device="cpu", progress=False, compiled=True)
    resumed = fresh_model(seed=99)
    result = train(resumed, TASK, recipe(), run_dir=tmp_path / "cut", device="cpu", progress=False, compiled=True)
    assert result.resumed_from == 20
    for ps, pr in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(ps, pr, rtol=0, atol=1e-7)


@pytest.mark.compile
@pytest.mark.parametrize("name", ["gated-rnn-zucchet-icl", "lru-in-out-zucchet-icl"])
def test_compiled_training_equals_eager_to_rounding(name, tmp_path):
    """The fast path changes how the step is computed, not what: from one seed, 300 compiled steps see the
    eager run's batches and give its losses and weights. The gap is fp32 reassociation in fused kernels,
    grown over 300 AdamW steps (measured ≤ 3e-6 relative); the tolerances are 30× that, while a wrong
    gradient, a skipped clip or a stale lr moves the losses by > 1e-2 within a few steps."""
    from zoo.science.models import create_model
    from zoo.science.registry import get_entry, get_task_spec

    entry = get_entry(name)
    task = get_task_spec(entry.task).build()
    run = entry.source.model_copy(update={"eval_every": 25, "checkpoint_every": 10**9})
    models, losses = [], []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = create_model(entry.arch, task)
        torch._dynamo.utils.counters.clear()
        # compiled once: a recompile (e.g. the lr handed over as a new constant each step) is an error
        with torch._dynamo.config.patch(error_on_recompile=True):
            result = train(model, task, run, run_dir=tmp_path / str(compiled), steps=300, device="cpu",
                           progress=False, compiled=compiled)
        models.append(model)
        losses.append(torch.tensor([r["train_loss"] for r in result.history], dtype=torch.float64))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # the loss and the update became graphs
    assert losses[0][-1] < 0.95 * losses[0][0]  # it trained: the comparison is not between two untouched inits
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=0)
    for eager, fast in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(fast, eager, rtol=1e-4, atol=1e-4)


@pytest.mark.compile
def test_compiled_update_traces_the_optimiser_under_an_lr_scheduler():
    """LambdaLR replaces `opt.step` by a wrapper in a file torch.compile does not trace: compiling a call to
    it captures no graph and AdamW runs eagerly. `optimizer_update` compiles the optimiser's own step."""
    from zoo.running.train import make_optimizer, optimizer_update

    model = fresh_model()
    opt = make_optimizer(model, recipe(), tensor_lr=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in model.parameters()]
    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    update = optimizer_update(opt, compiled=True)
    update()
    sched.step()  # no "lr_scheduler.step() before optimizer.step()" order warning: the step is recorded
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert all((p != b).all() for p, b in zip(model.parameters(), before))
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.5 * 3e-3)


class DenormalProbeTask(LinearRegressionTask):
    """The same task; each batch request records what 1e-40 · 1 evaluates to on the training thread."""

    seen: list[float] = []

    def sample(self, *args, **kwargs):
        DenormalProbeTask.seen.append((torch.tensor(1e-40) * 1.0).item())
        return super().sample(*args, **kwargs)


def test_cpu_training_flushes_denormals_and_restores_the_default(tmp_path):
    """A denormal float is 10-100× slower to compute with on x86; the loop runs with them flushed to
    zero and leaves the thread as it found it (here torch's default: kept)."""
    DenormalProbeTask.seen = []
    task = DenormalProbeTask(d_x=TASK.d_x, d_y=TASK.d_y, n_context=TASK.n_context)
    train(fresh_model(), task, recipe(steps=5), run_dir=tmp_path, device="cpu", progress=False)
    assert len(DenormalProbeTask.seen) == 5 and set(DenormalProbeTask.seen) == {0.0}  # one batch per step
    assert (torch.tensor(1e-40) * 1.0).item() != 0.0


def test_a_flush_set_before_training_stays_set(tmp_path):
    """The training commands flush for the whole process; the loop leaves that setting as it found it."""
    torch.set_flush_denormal(True)
    try:
        train(fresh_model(), TASK, recipe(steps=5), run_dir=tmp_path, device="cpu", progress=False)
        assert (torch.tensor(1e-40) * 1.0).item() == 0.0
    finally:
        torch.set_flush_denormal(False)


def test_flushing_denormals_leaves_training_unchanged(tmp_path, monkeypatch):
    """From weights with denormal entries (what Adam with an L2 decay leaves behind), a run with them
    flushed gives the losses and the function of a run without: they are ~1e-40 beside O(1) values.
    Weights the loss never reaches are moved by the L2 term alone, by ~lr per step around zero; where
    one run lands on a denormal the other lands on zero, so those differ by O(lr) and nothing reads them."""
    import contextlib

    import zoo.running.train

    def denormal_model():
        model = fresh_model()
        with torch.no_grad():
            for p in model.parameters():
                p[p.abs() < 0.05] = 1e-40  # ~40% of the entries (init std 0.1)
        return model

    runs = []
    for flush in (True, False):
        if not flush:
            monkeypatch.setattr(zoo.running.train, "denormals_flushed", lambda device: contextlib.nullcontext())
        model = denormal_model()
        result = train(model, TASK, recipe(optimizer="adam_l2", weight_decay=1e-2), run_dir=tmp_path / str(flush),
                       device="cpu", progress=False)
        runs.append((model, torch.tensor([r["train_loss"] for r in result.history], dtype=torch.float64)))
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-6, atol=0)
    probe = TASK.sample(512, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        flushed, kept = (model.predict_query(probe.tokens) for model, _ in runs)
    torch.testing.assert_close(flushed, kept, rtol=1e-5, atol=1e-9)
    assert flushed.abs().mean() > 1e-3  # a function, not zero against zero (40 steps from init std 0.1)


def test_the_training_loop_pins_the_commit_it_started_from(tmp_path, monkeypatch):
    """A process that trains without a command (a worker, a notebook) still records the commit it started from."""
    from zoo.storage import checkpoint as ck

    monkeypatch.setattr(ck, "_PINNED_COMMIT", None)
    monkeypatch.setattr(ck, "git_commit", lambda: "c" * 40)
    train(fresh_model(), TASK, recipe(steps=2, warmup_steps=0), run_dir=tmp_path / "run", device="cpu", progress=False)
    monkeypatch.setattr(ck, "git_commit", lambda: "d" * 40)  # committed while the checkpoint is evaluated
    assert ck.provenance(0, 2, "cpu", {})["git_commit"] == "c" * 40
