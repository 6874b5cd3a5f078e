"""The family contract: optional hooks declared on the base class, training settings a family cannot honour
refused by the registry, task kinds found like families, and an export that refuses a graph whose time axis is
not what its metadata says."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from test_registry import GOOD_TASK  # a valid task table
from torch import nn

from export.onnx_export import GraphContractError, export_chunk, export_sequence
from zoo.science.models import FAMILIES, FAMILY_OF_TYPE, create_model
from zoo.science.models.base import ZooModel
from zoo.science.registry import (
    TASK_ADAPTER,
    TASK_SPECS,
    RegistryError,
    get_entry,
    get_task_spec,
    list_entries,
    load_registry,
    with_overrides,
)
from zoo.science.tasks import TASK_KINDS, Task
from zoo.science.tasks.regression import LinearRegressionTask, Readout
from zoo.science.tasks.teacher import LSATeacherTask


class LoopedRNN(ZooModel):
    """A recurrent model that keeps the default `has_parallel_form = True` while its `forward_chunk` loops over
    T in Python: traced at one length, its graphs are fixed at that length."""

    def __init__(self):
        super().__init__(2, 2, Readout(position=-1, start=0, stop=2, sign=1.0))
        self.a = nn.Parameter(torch.full((2,), 0.5))

    def state_shapes(self):
        return [("0.h", (2,))]

    def step(self, token, state):
        h = self.a * state[0] + token
        return h, (h,)

    def forward_chunk(self, tokens, state):
        state = state if state is not None else self.init_state(tokens.shape[0])
        outs = []
        for t in range(tokens.shape[1]):
            out, state = self.step(tokens[:, t], state)
            outs.append(out)
        return torch.stack(outs, 1), state

    def forward(self, tokens):
        return self.forward_chunk(tokens, None)[0]


@pytest.mark.parametrize("export, recurrent", [(export_chunk, True), (export_sequence, False)], ids=["chunk", "sequence"])
def test_an_export_refuses_a_graph_whose_time_axis_is_not_its_metadata(tmp_path, export, recurrent):
    """A recurrent model's sequence graph is its step graph scanned (it cannot lie about T); a model declared
    without a recurrent form exports `forward` itself, and a Python loop over T in it is caught."""
    path, model = tmp_path / "graph.onnx", LoopedRNN()
    model.recurrent = recurrent
    with pytest.raises(GraphContractError, match=r"graph\.onnx: the (chunk|sequence) graph claims time "
                                                 r"(1\.\.1024|2\.\.\d+) but fails at T = 3") as e:
        export(model, path)
    assert "\n" not in str(e.value) and not path.exists()  # one line, and no graph left behind


def test_the_same_model_honestly_declared_exports_and_passes(tmp_path):
    """Declared without a parallel form, its chunk graph is the step graph scanned over time: valid at any T."""
    model = LoopedRNN()
    model.has_parallel_form = False
    export_chunk(model, tmp_path / "chunk.onnx")  # checked at T = 3 then 13 against `step`
    assert (tmp_path / "chunk.onnx").is_file()
    export_sequence(LoopedRNN(), tmp_path / "model.onnx")  # the scanned step: checked at T = 3, 13 and 2 blocks + 1
    assert (tmp_path / "model.onnx").is_file()


def test_optional_hooks_are_declared_on_the_base_class_with_their_meaning():
    for hook in ("no_weight_decay", "recurrent_parameter_names", "has_polynomial_map", "instantaneous",
                 "family_metrics"):
        assert inspect.getdoc(getattr(ZooModel, hook)), hook
    assert "has_parallel_form" in inspect.getsource(ZooModel) and not hasattr(ZooModel, "dynamic_time")
    plain = LoopedRNN()
    assert plain.no_weight_decay() == set() and plain.recurrent_parameter_names() == set()
    assert not plain.has_polynomial_map() and plain.family_metrics(None, None) == {}


def test_generic_code_does_not_probe_for_hooks():
    """Training, ensembles and evaluation call the declared hooks; no `hasattr` probe or concrete class test."""
    root = Path(__file__).resolve().parents[1] / "zoo"
    for path in (root / "running" / "train.py", root / "running" / "ensemble.py", root / "science" / "evaluation.py"):
        text = path.read_text()
        for probe in ('"no_weight_decay"', '"recurrent_parameter_names"', '"instantaneous"', "isinstance(task",
                      "LSATeacherTask)", "GatedLinearRNN)"):
            assert probe not in text, (path.name, probe)


@pytest.mark.parametrize("source, message", [
    ('{ kind = "trained", steps = 10, batch_size = 2, recurrent_lr = 1e-4 }',
     "field 'source.recurrent_lr': arch type 'lsa' has no recurrent parameters"),
    ('{ kind = "trained", steps = 10, batch_size = 2, freeze = ["nonexistent"] }',
     "field 'source.freeze': 'nonexistent' names no parameter of arch type 'lsa' (its parameters start with layers)"),
])
def test_the_registry_refuses_training_settings_the_family_cannot_honour(tmp_path, source, message):
    (tmp_path / "fam.toml").write_text(GOOD_TASK + f'\n[models.m]\npaper = "p"\ntask = "t"\narch = {{ type = "lsa" }}\n'
                                               f"source = {source}\n")
    with pytest.raises(RegistryError) as e:
        load_registry(tmp_path)
    assert f"fam.toml: entry 'm': {message}" in str(e.value)


def test_overrides_are_held_to_the_same_rules():
    with pytest.raises(RegistryError, match="'source.recurrent_lr': arch type 'lsa' has no recurrent parameters"):
        with_overrides(get_entry("lsa-d10-c10"), {"source.recurrent_lr": 1e-4})
    with pytest.raises(RegistryError, match="'source.freeze': 'w_zz' names no parameter"):
        with_overrides(get_entry("lsa-d10-c10"), {"source.freeze": ["w_zz"]})
    # a family with recurrent parameters takes it; a prefix that names parameters is accepted
    assert with_overrides(get_entry("gated-rnn-zucchet-icl"), {"source.recurrent_lr": 1e-4}).source.recurrent_lr == 1e-4
    assert with_overrides(get_entry("lsa-d10-c10"), {"source.freeze": ["layers.0"]}).source.freeze == ["layers.0"]


def test_task_kinds_are_found_like_families():
    assert TASK_KINDS == {"linear_regression": LinearRegressionTask, "lsa_teacher": LSATeacherTask}
    assert all(issubclass(cls, Task) for cls in TASK_KINDS.values())
    assert set(TASK_SPECS) == set(TASK_KINDS)  # the registry's task schemas are the discovered kinds'
    assert {TASK_ADAPTER.validate_python({"kind": kind, **params, "splits": {}}).build() for kind, params in
            (("linear_regression", {"d_x": 2, "n_context": 4}), ("lsa_teacher", {"d": 3}))} == {
        LinearRegressionTask(d_x=2, n_context=4), LSATeacherTask(d=3)}
    regression = LinearRegressionTask(d_x=2, n_context=4)
    teacher = LSATeacherTask(d=3)
    assert regression.has_gd_reference and regression.teacher_weights() is None and regression.prediction_dim == 1
    assert not teacher.has_gd_reference and set(teacher.teacher_weights()) == {"w_v", "w_k", "w_q"}
    assert teacher.predicts_every_position and teacher.prediction_dim == 3


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_builds_a_zoo_model_that_answers_the_hooks(family):
    entry = next(e for e in list_entries() if FAMILY_OF_TYPE[e.arch.type] is family)
    model = create_model(entry.arch, get_task_spec(entry.task).build())
    assert isinstance(model, ZooModel)
    names = {n for n, _ in model.named_parameters()}
    assert model.no_weight_decay() <= names and model.recurrent_parameter_names() <= names
    assert isinstance(model.has_polynomial_map(), bool)
