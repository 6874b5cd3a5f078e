"""Ensembles: each member equals the model trained alone with its seed; resume; NaN guard."""

import pytest
import torch

from zoo.running.ensemble import train_ensemble
from zoo.running.train import make_optimizer, train
from zoo.science.models import create_model
from zoo.science.registry import get_entry, get_task_spec, with_overrides


def setup(name, **overrides):
    entry = with_overrides(get_entry(name), overrides) if overrides else get_entry(name)
    task = get_task_spec(entry.task).build()
    return entry, task, (lambda: create_model(entry.arch, task))


@pytest.mark.parametrize("name,overrides", [
    ("gated-rnn-zucchet-icl", {"arch.hidden": 12, "source.batch_size": 16, "source.grad_clip": 0.5}),
    ("lsa-d10-c10", {"source.batch_size": 32}),
    ("gd-ssm-nd", {"source.batch_size": 16}),
    ("gd-ssm-sine-gd-mlp", {"source.batch_size": 16, "source.warmup_steps": 0}),  # frozen layers
])
def test_members_equal_their_solo_runs(tmp_path, name, overrides):
    entry, task, make = setup(name, **overrides)
    recipe = entry.source.model_copy(update={"eval_every": 5, "warmup_steps": 2})
    seeds = [3, 7, 11]
    result = train_ensemble(make, task, recipe, seeds, run_dir=tmp_path / "ens", steps=15, device="cpu", progress=False)
    for seed, member in zip(seeds, result.models):
        torch.manual_seed(seed)
        solo = make()
        train(solo, task, recipe, run_dir=tmp_path / f"solo{seed}", steps=15, seed=seed, device="cpu", progress=False)
        for (n, a), b in zip(solo.named_parameters(), member.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=2e-6, msg=f"seed {seed}: {n}")
    # members really differ from each other
    a, b = (next(m.parameters()) for m in result.models[:2])
    assert (a - b).abs().max() > 1e-3


def test_ensemble_resumes_after_interruption(tmp_path, monkeypatch):
    import zoo.running.ensemble

    entry, task, make = setup("gated-rnn-zucchet-icl", **{"arch.hidden": 8, "source.batch_size": 8})
    recipe = entry.source.model_copy(update={"checkpoint_every": 5, "eval_every": 5})
    full = train_ensemble(make, task, recipe, [0, 1], run_dir=tmp_path / "a", steps=12, device="cpu", progress=False)
    sample, calls = zoo.running.ensemble._sample, []

    def interrupted_at_step_8(*args):
        calls.append(1)
        if len(calls) > 8:
            raise KeyboardInterrupt
        return sample(*args)

    monkeypatch.setattr(zoo.running.ensemble, "_sample", interrupted_at_step_8)
    with pytest.raises(KeyboardInterrupt):
        train_ensemble(make, task, recipe, [0, 1], run_dir=tmp_path / "b", steps=12, device="cpu", progress=False)
    monkeypatch.setattr(zoo.running.ensemble, "_sample", sample)
    resumed = train_ensemble(make, task, recipe, [0, 1], run_dir=tmp_path / "b", steps=12, device="cpu", progress=False)
    for m_full, m_resumed in zip(full.models, resumed.models):
        for a, b in zip(m_full.parameters(), m_resumed.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_diverging_member_is_named(tmp_path):
    entry, task, make = setup("gated-rnn-zucchet-icl", **{"arch.hidden": 8, "source.batch_size": 8, "source.lr": 1e6})
    from zoo.running.train import TrainingDiverged

    with pytest.raises(TrainingDiverged, match="seed"):
        train_ensemble(make, task, entry.source, [0, 1], run_dir=tmp_path, steps=200, device="cpu", progress=False)


def test_nonfinite_weights_with_finite_loss_are_not_saved(tmp_path, monkeypatch):
    """A step can leave a weight non-finite while the loss that produced it was finite: the
    boundary check must refuse to save that state."""
    from zoo.running.train import TrainingDiverged

    entry, task, make = setup("gated-rnn-zucchet-icl", **{"arch.hidden": 8, "source.batch_size": 8})
    recipe = entry.source.model_copy(update={"checkpoint_every": 4, "eval_every": 4})
    train_ensemble(make, task, recipe, [0, 1], run_dir=tmp_path, steps=4, device="cpu", progress=False)
    saved = (tmp_path / "train_state.safetensors").read_bytes()
    optimizer = type(make_optimizer(make(), recipe))  # the class the recipe trains with (Adam for adam_l2)
    step = optimizer.step

    def poisoning_step(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0][1].view(-1)[0] = float("inf")  # member 1 only
        return out

    monkeypatch.setattr(optimizer, "step", poisoning_step)
    with pytest.raises(TrainingDiverged, match=r"seed \[1\].*step 4"):
        train_ensemble(make, task, recipe, [0, 1], run_dir=tmp_path, steps=8, device="cpu", progress=False)
    assert (tmp_path / "train_state.safetensors").read_bytes() == saved


def test_unvmappable_models_are_refused_with_a_reason(tmp_path):
    entry, task, make = setup("lstm-d10-c10", **{"source.batch_size": 4})
    with pytest.raises(ValueError, match="cannot be vmapped"):
        train_ensemble(make, task, entry.source, [0, 1], run_dir=tmp_path, steps=2, device="cpu", progress=False)
    assert not (tmp_path / "train_state.safetensors").exists()


# ------------------------------------------------------------------ CUDA graphs (GPU machine only)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("name,overrides", [
    ("gated-rnn-zucchet-icl", {"arch.hidden": 80, "source.grad_clip": 1.0}),
    ("lsa-d10-c10", {}),
    ("gd-ssm-nd", {"source.batch_size": 32}),
    ("gated-rnn-student-d4", {"arch.hidden": 32}),
])
@pytest.mark.parametrize("data", ["per_member", "shared"])
def test_cuda_graph_steps_equal_eager_steps(tmp_path, name, overrides, data):
    """The captured step draws the same data (per-member generators, or every member's tasks from
    one generator inside the graph), applies the same lr schedule and AdamW update: after 60 steps
    (warm-up, capture, replays, a cosine schedule) the weights match the eager ensemble to float32
    rounding."""
    entry, task, make = setup(name, **overrides)
    recipe = entry.source.model_copy(update={"eval_every": 20, "checkpoint_every": 30, "warmup_steps": 10})
    kw = dict(steps=60, device="cuda", progress=False, data=data)
    eager = train_ensemble(make, task, recipe, [0, 5], run_dir=tmp_path / "eager", cuda_graph=False, **kw)
    graphed = train_ensemble(make, task, recipe, [0, 5], run_dir=tmp_path / "graph", cuda_graph=True, **kw)
    for m_eager, m_graph in zip(eager.models, graphed.models):
        for (n, a), b in zip(m_eager.named_parameters(), m_graph.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=n)
    for r_eager, r_graph in zip(eager.history, graphed.history):
        assert r_eager["lr"] == pytest.approx(r_graph["lr"])
        assert r_eager["train_loss"] == pytest.approx(r_graph["train_loss"], rel=1e-4)


@cuda
def test_cuda_graph_run_resumes(tmp_path):
    """Stopped at step 20 of a 50-step schedule and run again: the same weights as one go
    (the generators' states saved after graph replays continue the same data stream)."""
    entry, task, make = setup("gated-rnn-zucchet-icl")
    recipe = entry.source.model_copy(update={"eval_every": 10, "checkpoint_every": 10})
    kw = dict(steps=50, device="cuda", progress=False)
    full = train_ensemble(make, task, recipe, [0, 1, 2], run_dir=tmp_path / "a", **kw)
    part = train_ensemble(make, task, recipe, [0, 1, 2], run_dir=tmp_path / "b", until=20, **kw)
    assert part.steps == 20 and [r["step"] for r in part.history] == [10, 20]
    resumed = train_ensemble(make, task, recipe, [0, 1, 2], run_dir=tmp_path / "b", **kw)
    assert [r["step"] for r in resumed.history] == [10, 20, 30, 40, 50]
    for m_full, m_resumed in zip(full.models, resumed.models):
        for a, b in zip(m_full.parameters(), m_resumed.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@cuda
def test_cuda_graph_divergence_keeps_last_good_state(tmp_path):
    from zoo.running.train import TrainingDiverged

    entry, task, make = setup("gated-rnn-zucchet-icl", **{"source.lr": 1e6, "source.grad_clip": None})
    recipe = entry.source.model_copy(update={"eval_every": 50, "checkpoint_every": 50, "warmup_steps": 0})
    with pytest.raises(TrainingDiverged, match="seed"):
        train_ensemble(make, task, recipe, [0, 1], run_dir=tmp_path, steps=2000, device="cuda", progress=False)
    if (tmp_path / "train_state.safetensors").exists():  # whatever was saved is finite
        from safetensors.torch import load_file
        assert all(torch.isfinite(v).all() for k, v in load_file(tmp_path / "train_state.safetensors").items()
                   if k.startswith("model."))


def test_cuda_graph_on_cpu_is_refused_before_training(tmp_path):
    entry, task, make = setup("lsa-d10-c10", **{"source.batch_size": 8})
    with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device"):
        train_ensemble(make, task, entry.source, [0, 1], run_dir=tmp_path / "r", steps=3, device="cpu",
                       cuda_graph=True, progress=False)
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())  # nothing written


@pytest.mark.compile
def test_compiled_ensemble_equals_eager_ensemble(tmp_path):
    """compiled=True (the vmapped loss and its backward, and AdamW, through torch.compile) trains the same
    members: from the same seeds, 200 steps give the eager ensemble's losses and weights to fp32
    reassociation (measured ≤ 5e-7 relative; tolerance 1e-4, a wrong update moves them by > 1e-2)."""
    entry, task, make = setup("gated-rnn-zucchet-icl", **{"arch.hidden": 16})
    recipe = entry.source.model_copy(update={"eval_every": 50, "checkpoint_every": 10**9})
    runs = [train_ensemble(make, task, recipe, [0, 1, 2], run_dir=tmp_path / str(compiled), steps=200, device="cpu",
                           compiled=compiled, progress=False) for compiled in (False, True)]
    eager, fast = (torch.tensor([r["train_loss"] for r in run.history], dtype=torch.float64) for run in runs)
    assert (eager[-1] < 0.95 * eager[0]).all()  # every member trained
    torch.testing.assert_close(fast, eager, rtol=1e-4, atol=0)
    for a, b in zip(runs[0].models, runs[1].models):
        for pa, pb in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-4)


def test_compiling_a_cuda_graph_launch_is_refused(tmp_path):
    """compiled=True compiles eager launches; with cuda_graph=True it is refused before anything trains."""
    entry, task, make = setup("gated-rnn-zucchet-icl", **{"arch.hidden": 16})
    with pytest.raises(ValueError, match="compiled=True is for eager launches"):
        train_ensemble(make, task, entry.source, [0], run_dir=tmp_path / "cg", steps=2, device="cpu", cuda_graph=True,
                       compiled=True, progress=False)
    assert not (tmp_path / "cg").exists() or not any((tmp_path / "cg").iterdir())  # nothing written
