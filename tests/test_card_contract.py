"""What a released model card promises a stranger, checked against the released files (issue 40, items 3-5):

| promise | checked by |
|---|---|
| the datasets + onnxruntime snippet runs verbatim from an empty folder against a served hub (no zoo code) and prints the card's test loss | tests/test_release.py::test_card_snippet_runs_verbatim_from_an_empty_folder |
| every ONNX graph's metadata states the token layout (`icl_zoo.tokens`, the task's) and its description says it | test_graphs_state_the_token_layout |
| metadata: tag `onnx`, the task's type and name, the dataset revision pinned, `base_model` (`finetune`) for construction-initialised entries, `teacher` for students, no `pipeline_tag` | test_card_metadata_fits_each_entry |
| config.json holds no second copy of the expected values and tolerances (the registry's, on the card) | test_config_holds_no_expected_values |
| `ckpt.predict` gives tensors without grad in eval mode; `zoo.from_pretrained` the plain module | test_predict_has_no_autograd_graph, test_from_pretrained_gives_the_plain_module |
| saving renders no card; the builder's save writes it after the files | test_checkpoint_save_writes_no_card_the_builder_does |
"""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import ModelCard

import zoo
from zoo.science.registry import default_registry, get_task_spec
from zoo.storage.card import base_model, teacher_model
from zoo.storage.locate import VERSION, read_index, release_dir

RELEASED = sorted(read_index()["entries"])
SNIPPET_ENTRY = "lsa-d10-c10"  # pairs layout; its sequence graph scores 10,000 tasks in well under a second


def _snippet(card: str) -> str:
    block = card.split("<!-- onnx-snippet -->")[1].split("<!-- /onnx-snippet -->")[0]
    return block.split("```python\n")[1].split("```")[0]


@pytest.mark.parametrize("name", RELEASED)
def test_card_metadata_fits_each_entry(name):
    entry = default_registry().entries[name]
    spec = get_task_spec(entry.task)
    card = ModelCard.load(release_dir() / name / "README.md")
    data = card.data.to_dict()
    assert "onnx" in data["tags"] and data["library_name"] == "icl-zoo"
    results = data["model-index"][0]["results"]
    for r in results:
        assert r["dataset"]["revision"] == VERSION and r["dataset"]["type"] == f"icl-zoo/{entry.task}"
        if getattr(spec, "target", None) == "sine":
            assert "sine" in r["task"]["name"] and "linear" not in r["task"]["name"].lower()
        elif getattr(spec, "kind", None) == "lsa_teacher":
            assert r["task"]["type"] == "teacher-student-regression"
        else:
            assert r["task"]["name"] == "In-context linear regression"
    assert data.get("base_model") == base_model(entry) and data.get("teacher") == teacher_model(entry)
    assert data.get("base_model_relation") == ("finetune" if data.get("base_model") else None)
    assert "pipeline_tag" not in data  # no Hub widget takes a prompt tensor (zoo.storage.card.card_data)
    if name == "gd-ssm-nd-2layer-gd-init":  # trained on from the two-step construction, released as its own entry
        assert data["base_model"] == "icl-zoo/gd-ssm-gd-nd-2step" and data["base_model_relation"] == "finetune"
    if name == "gated-rnn-student-d4":  # a student: its teacher, realised as a released RNN, is not its base model
        assert data["teacher"] == "icl-zoo/gated-rnn-teacher-d4" and "base_model" not in data
    if getattr(spec, "layout", None):  # how a dataset row becomes tokens, in words, with the read-out
        text = card.text
        assert f"the **{spec.layout}** layout" in text and "icl_zoo.readout" in text
        if spec.layout == "pairs":
            assert "**zeroed**" in text and "**minus**" in text


@pytest.mark.parametrize("name", RELEASED)
def test_graphs_state_the_token_layout(name):
    import onnx

    layout = get_task_spec(default_registry().entries[name].task).build().token_layout  # what tests/test_tasks.py checks against the tokens
    graphs = sorted((release_dir() / name).glob("*.onnx"))
    assert graphs
    for path in graphs:
        m = onnx.load(str(path), load_external_data=False)
        meta = {p.key: p.value for p in m.metadata_props}
        assert len(meta) == len(m.metadata_props), f"{path.name}: a metadata key twice"
        assert json.loads(meta["icl_zoo.tokens"]) == layout, path.name
        assert layout["rule"] in m.doc_string and "Tokens from a dataset row" in m.doc_string


@pytest.mark.parametrize("name", RELEASED)
def test_config_holds_no_expected_values(name):
    config = json.loads((release_dir() / name / "config.json").read_text())
    assert "expected" not in config["entry"], "expected values and tolerances live in the registry (card, index)"


def test_predict_has_no_autograd_graph():
    ckpt = zoo.load(SNIPPET_ENTRY)
    ckpt.model.train()
    tokens = ckpt.task.sample(4, seed=0).tokens
    pred = ckpt.predict(tokens)
    assert pred.shape == (4, 1) and not pred.requires_grad and pred.grad_fn is None
    assert not ckpt.model.training  # eval mode
    assert torch.equal(ckpt.predict(tokens.numpy()), pred)  # an array works too
    assert ckpt.model.predict(tokens).grad_fn is not None  # the module itself stays differentiable


def test_from_pretrained_gives_the_plain_module():
    from zoo.storage.checkpoint import Checkpoint

    model = zoo.from_pretrained(SNIPPET_ENTRY)
    assert isinstance(model, torch.nn.Module) and not model.training
    ckpt = Checkpoint.from_pretrained(str(release_dir() / SNIPPET_ENTRY))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ckpt.model.state_dict().values()))


def test_checkpoint_save_writes_no_card_the_builder_does(tmp_path):
    from zoo.running.builder import save

    ckpt = zoo.load("lsa-gd-zucchet-icl")
    ckpt.save_files(tmp_path / "plain")
    assert not (tmp_path / "plain" / "README.md").exists()
    out = save(ckpt, tmp_path / "full")
    assert "<!-- icl-zoo model card" in (out / "README.md").read_text()
    assert zoo.load(out).metrics == ckpt.metrics


def test_polynomial_table_ends_with_the_residual_norm(tmp_path):
    """Table 2's card table lists the x_i² y_1 coefficients, then the residual norm, whatever order
    eval_results.json holds them in (a JSON round trip may sort the keys: the residual came first)."""
    from zoo.storage.card import write_card_and_figures

    ckpt = zoo.load("gated-rnn-gd-zucchet-icl")
    poly = ckpt.metrics["polynomial"]
    ckpt.metrics["polynomial"] = {"residual norm": poly["residual norm"], **{k: v for k, v in poly.items() if k != "residual norm"}}
    card = write_card_and_figures(ckpt, tmp_path, extra_metrics={}).read_text()
    table = card.split("| term | this model | one GD step |\n|---|---|---|\n")[1].split("\n\n")[0].splitlines()
    assert [row.split(" | ")[0] for row in table] == ["| x1^2 y1", "| x2^2 y1", "| x3^2 y1", "| residual norm"]
    assert table[-1].endswith("| 0 |") and all(row.endswith("| 0.06757 |") for row in table[:-1])
