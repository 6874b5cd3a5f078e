"""Every constructed registry entry that carries θ_GD (von Oswald et al.'s one-GD-step LSA, and the
constructions that put it into another family, e.g. a gated RNN) against its defining
math: its query read-out equals k steps of gradient descent from W = 0 at the η its construction
recorded, on fresh random tasks (not a frozen split), in float64. The entries come from the
registry: a new family's θ_GD construction is tested here without an edit.

θ_GD reads tokens (x, y), so these are the constructed entries on a linear_regression task with
layout "pairs" (the other constructions' layouts: the GD-SSM's in test_gd_ssm.py, the fast-weight
network's triples in test_fast_weight.py). A construction its family declares approximate
(`ConstructionRule.exact = False`: the LSTM ≈ LSA linearisation, O(ε²)) is checked by its own
family's tests (test_families.py)."""

import pytest
import torch

from zoo.science.constructions import construct
from zoo.science.evaluation import gd_reference
from zoo.science.models import CONSTRUCTIONS, create_model
from zoo.science.registry import get_task_spec, list_entries
from zoo.science.tasks.regression import gd_predict, online_gd_predict


def _theta_gd_entries():
    out = []
    for entry in list_entries(source="constructed"):
        spec = get_task_spec(entry.task)
        if spec.kind == "linear_regression" and spec.layout == "pairs" and CONSTRUCTIONS[entry.source.construction][1].exact:
            out.append(entry)
    return out


THETA_GD = _theta_gd_entries()


def test_the_zoo_has_theta_gd_constructions_in_several_families():
    assert {e.arch.type for e in THETA_GD} >= {"lsa", "gated_rnn"}, [e.name for e in THETA_GD]


@pytest.mark.parametrize("entry", THETA_GD, ids=lambda e: e.name)
def test_a_theta_gd_construction_is_gd_on_fresh_tasks(entry):
    task = get_task_spec(entry.task).build()
    torch.manual_seed(0)
    model = create_model(entry.arch, task).double().eval()
    info = construct(entry, model, task, task.sample(2000, seed=5, dtype=torch.float64))  # (a line search's split)
    batch = task.sample(512, seed=987_654, dtype=torch.float64)  # tasks no frozen split holds
    with torch.no_grad():
        pred = model.predict(batch.tokens)  # (B, d_y)
    if "online_eta" in info:  # online GD (the delta rule): one step per context example, read at the query
        assert 0 < info["online_eta"] < 1, info
        want = online_gd_predict(batch, info["online_eta"])[:, -1]  # (B, d_y)
    else:
        ref = gd_reference(entry, task, info)
        assert ref["eta"] is not None and ref["eta"] > 0, info
        want = gd_predict(batch, ref["eta"], ref["gd_steps"], ref["ridge"])  # (B, d_y)
    torch.testing.assert_close(pred, want, rtol=1e-10, atol=1e-10)
