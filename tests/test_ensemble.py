"""Ensembles: each member equals the model trained alone with its seed; resume; NaN guard."""

import pytest
import torch

from zoo.ensemble import train_ensemble
from zoo.models import create_model
from zoo.registry import get_entry, get_task_spec, with_overrides
from zoo.train import train


def setup(name, **overrides):
    entry = with_overrides(get_entry(name), overrides) if overrides else get_entry(name)
    task = get_task_spec(entry.task).build()
    return entry, task, (lambda: create_model(entry.arch, task))


@pytest.mark.parametrize("name,overrides", [
    ("gated-rnn-zucchet-icl", {"arch.hidden": 12, "source.batch_size": 16, "source.grad_clip": 0.5}),
    ("lsa-d10-c10", {"source.batch_size": 32}),
    ("gd-ssm-nd", {"source.batch_size": 16}),
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
    import zoo.ensemble

    entry, task, make = setup("gated-rnn-zucchet-icl", **{"arch.hidden": 8, "source.batch_size": 8})
    recipe = entry.source.model_copy(update={"checkpoint_every": 5, "eval_every": 5})
    full = train_ensemble(make, task, recipe, [0, 1], run_dir=tmp_path / "a", steps=12, device="cpu", progress=False)
    sample, calls = zoo.ensemble._sample, []

    def interrupted_at_step_8(*args):
        calls.append(1)
        if len(calls) > 8:
            raise KeyboardInterrupt
        return sample(*args)

    monkeypatch.setattr(zoo.ensemble, "_sample", interrupted_at_step_8)
    with pytest.raises(KeyboardInterrupt):
        train_ensemble(make, task, recipe, [0, 1], run_dir=tmp_path / "b", steps=12, device="cpu", progress=False)
    monkeypatch.setattr(zoo.ensemble, "_sample", sample)
    resumed = train_ensemble(make, task, recipe, [0, 1], run_dir=tmp_path / "b", steps=12, device="cpu", progress=False)
    for m_full, m_resumed in zip(full.models, resumed.models):
        for a, b in zip(m_full.parameters(), m_resumed.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_diverging_member_is_named(tmp_path):
    entry, task, make = setup("gated-rnn-zucchet-icl", **{"arch.hidden": 8, "source.batch_size": 8, "source.lr": 1e6})
    from zoo.train import TrainingDiverged

    with pytest.raises(TrainingDiverged, match="seed"):
        train_ensemble(make, task, entry.source, [0, 1], run_dir=tmp_path, steps=200, device="cpu", progress=False)
