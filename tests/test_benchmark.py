"""The open benchmark (zoo/publishing/benchmark.py) and the per-task leaderboards (zoo/publishing/leaderboard.py): models the
zoo never built, scored on the frozen splits beside GD; bad models refused in one line, nothing written."""

import hashlib
import json

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import zoo
from zoo.cli import main
from zoo.publishing import hub
from zoo.publishing.benchmark import BenchmarkError
from zoo.publishing.leaderboard import FOLDER, leaderboard, leaderboard_url, released_on
from zoo.science.registry import get_entry, get_task_spec
from zoo.storage.locate import read_index, release_dir

TASK = "zucchet-icl"  # pairs (x, y): d_x = d_y = 3, C = 12, tokens (B, 13, 6)
SPEC = get_task_spec(TASK)
D_X, D_Y = SPEC.d_x, SPEC.d_y
ETA = SPEC.build().analytic_eta()  # η*: the card's one GD step
GD_LOSS = read_index()["entries"]["lsa-gd-zucchet-icl"]["gd_loss"]  # the GD reference the release's cards show


# ---------------------------------------------------------------- three models the zoo never built
def gd_step_graph(*, eta=ETA, input_name="tokens", width=D_X + D_Y, extra_input=None, squeeze=True) -> bytes:
    """One GD step from W = 0 as an ONNX graph written by hand: ŷ = η Σ_t (x_qᵀ x_t) y_t over every token
    (the query's y is zero, so it adds nothing): (tokens (B, T, 6)) → prediction (B, 3)."""
    def ints(name, *values):
        return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)

    nodes = [
        helper.make_node("Slice", [input_name, "zero", "d_x", "two"], ["x"]),  # (B, T, d_x)
        helper.make_node("Slice", [input_name, "d_x", "d_in", "two"], ["y"]),  # (B, T, d_y)
        helper.make_node("Slice", ["x", "minus_one", "end", "one"], ["x_query"]),  # (B, 1, d_x)
        helper.make_node("Transpose", ["x"], ["x_t"], perm=[0, 2, 1]),  # (B, d_x, T)
        helper.make_node("MatMul", ["x_query", "x_t"], ["similarity"]),  # (B, 1, T)
        helper.make_node("MatMul", ["similarity", "y"], ["read"]),  # (B, 1, d_y)
        helper.make_node("Mul", ["read", "eta"], ["scaled" if squeeze else "prediction"]),
    ]
    if squeeze:
        nodes.append(helper.make_node("Squeeze", ["scaled", "one"], ["prediction"]))  # (B, d_y)
    constants = [ints("zero", 0), ints("d_x", D_X), ints("d_in", D_X + D_Y), ints("two", 2), ints("one", 1),
                 ints("minus_one", -1), ints("end", 2**62), helper.make_tensor("eta", TensorProto.FLOAT, [], [eta])]
    inputs = [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 13, width])]
    if extra_input:
        inputs.append(helper.make_tensor_value_info(extra_input, TensorProto.FLOAT, ["batch", 4]))
    out_shape = ["batch", D_Y] if squeeze else ["batch", 1, D_Y]
    graph = helper.make_graph(nodes, "one_gd_step", inputs,
                              [helper.make_tensor_value_info("prediction", TensorProto.FLOAT, out_shape)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model.SerializeToString()


class OneGDStep(torch.nn.Module):
    """ŷ = η Σ_t y_t x_tᵀ x_q on (x, y) tokens, in torch."""

    def __init__(self, eta: float):
        super().__init__()
        self.eta = torch.nn.Parameter(torch.tensor(eta))

    def forward(self, tokens):
        x, y = tokens[..., :D_X], tokens[..., D_X:]
        w = y.transpose(1, 2) @ x  # (B, d_y, d_x): Σ_t y_t x_tᵀ
        return self.eta * (w @ x[:, -1].unsqueeze(-1)).squeeze(-1)


def numpy_gd_step(tokens: np.ndarray) -> np.ndarray:
    """ŷ = η Σ_t y_t x_tᵀ x_q in numpy."""
    x, y = tokens[..., :D_X], tokens[..., D_X:]
    return ETA * np.einsum("btj,bti,bi->bj", y, x, x[:, -1])


@pytest.fixture(scope="module")
def gd_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "one_gd_step.onnx"
    path.write_bytes(gd_step_graph())
    return path


def test_a_hand_written_onnx_graph_scores_the_gd_reference(gd_onnx):
    record = zoo.evaluate(str(gd_onnx), task=TASK)
    m = record["metrics"]
    assert abs(m["gd_loss"] - GD_LOSS) < 1e-9 and abs(m["test_loss"] - GD_LOSS) < 1e-6
    assert abs(m["gd_paired_diff"]) < 1e-6 and m["output"] == "query"
    assert m["sensitivity"] == "finite differences" and abs(m["sensitivity_cosine"] - 1) < 1e-6
    assert record["dataset_sha256"] == SPEC.splits["test"].sha256 and record["zoo_version"] == zoo.__version__
    assert record["model"] == {"kind": "onnx", "name": str(gd_onnx),
                               "sha256": hashlib.sha256(gd_onnx.read_bytes()).hexdigest()}
    assert m["lstsq_loss"] < 1e-9 and [k["steps"] for k in m["gd_k_steps"]] == [2, 3]
    assert all(k["loss"] < m["gd_loss"] for k in m["gd_k_steps"])  # noise-free: more steps approach least squares


def test_k_step_gd_is_at_the_rate_a_line_search_over_the_steps_finds():
    from zoo.publishing.benchmark import best_eta, gd_polynomial
    from zoo.science.tasks.regression import gd_predict, resolve_eta

    task = SPEC.build()
    b64 = task.sample(300, seed=1, dtype=torch.float64)
    for steps in (1, 2, 3):
        c = gd_polynomial(b64, steps)
        assert torch.allclose((0.05 ** torch.arange(1, steps + 1, dtype=c.dtype)).view(-1, 1, 1).mul(c).sum(0),
                              gd_predict(b64, 0.05, steps), atol=1e-12)
        assert best_eta(task, b64, steps) == pytest.approx(resolve_eta("line_search", task, steps, b64), rel=1e-6)


def test_k_steps_with_equal_rates_are_k_steps_at_that_rate_and_the_steps_commute():
    """gd_predict_per_step is gd_weights' step with a rate per step: equal rates give gd_predict's k steps, and
    W_k = G S⁻¹ (I − Π_j (I − η_j S)) does not depend on the steps' order (float64: to rounding)."""
    from zoo.publishing.benchmark import gd_predict_per_step
    from zoo.science.tasks.regression import gd_predict

    b64 = SPEC.build().sample(300, seed=2, dtype=torch.float64)
    for steps in (1, 2, 3, 5):
        assert torch.allclose(gd_predict_per_step(b64, [0.05] * steps), gd_predict(b64, 0.05, steps),
                              rtol=0, atol=1e-12)
    assert torch.allclose(gd_predict_per_step(b64, [0.03, 0.1, 0.06]), gd_predict_per_step(b64, [0.1, 0.06, 0.03]),
                          rtol=0, atol=1e-12)
    assert not torch.allclose(gd_predict_per_step(b64, [0.03, 0.1]), gd_predict(b64, 0.065, 2), atol=1e-3)


def test_per_step_rates_are_the_best_k_steps_and_never_worse_than_one_shared_rate():
    """On the tuning tasks (float64): k = 1 is the closed-form empirical η*; for k = 2 no rate pair on a grid
    about the fitted one, nor the shared rate `best_eta`, does better; 2 rates beat the shared one."""
    from zoo.publishing.benchmark import best_eta, gd_predict_per_step, per_step_etas
    from zoo.science.tasks.regression import empirical_eta, gd_predict

    task = SPEC.build()
    b64 = task.sample(2000, seed=3, dtype=torch.float64)

    def loss(etas):
        return task.loss(gd_predict_per_step(b64, etas), b64.query_targets).item()

    (eta,) = per_step_etas(task, b64, 1)
    assert eta == pytest.approx(empirical_eta(b64), rel=1e-9)
    for steps in (2, 3):
        etas = per_step_etas(task, b64, steps)
        shared = best_eta(task, b64, steps)
        assert loss(etas) <= task.loss(gd_predict(b64, shared, steps), b64.query_targets).item()
        assert loss(etas) < 0.9 * loss([shared] * steps)  # a real gain: 0.054 vs 0.074 on zucchet-icl's validation
    a, b = per_step_etas(task, b64, 2)
    grid = [(a * (1 + i / 50), b * (1 + j / 50)) for i in range(-5, 6) for j in range(-5, 6)]
    assert min(loss(list(pair)) for pair in grid) >= loss([a, b]) - 1e-15


def test_per_step_rates_are_fitted_on_the_validation_split_and_scored_on_the_test_split():
    """Sushma Fig. 4.A's comparator: two GD steps with a rate each reach 0.1231 on the N-D test split (the
    released 2-layer GD-SSMs: 0.1248 and 0.1232), where two steps sharing one rate reach 0.1532."""
    from zoo.publishing.benchmark import PER_STEP_KEY, load_frozen, per_step_etas, split_references

    _, task, test = load_frozen("gdssm-nd-x5-y3-n10", "test")
    _, _, validation = load_frozen("gdssm-nd-x5-y3-n10", "validation")
    m = split_references(task, test).metrics
    two, three = m[PER_STEP_KEY]
    assert two["tuned_on"] == "gdssm-nd-x5-y3-n10/validation" and (two["steps"], three["steps"]) == (2, 3)
    v64 = validation.batch(task, dtype=torch.float64)
    assert two["etas"] == pytest.approx(per_step_etas(task, v64, 2), rel=1e-12)
    assert two["loss"] == pytest.approx(0.123134, rel=1e-5)  # float64 on a hash-checked split: to rounding
    assert m["gd_k_steps"][0]["loss"] == pytest.approx(0.153208, rel=1e-5)
    released = read_index()["entries"]
    for name, gap in (("gd-ssm-nd-2layer", 0.014), ("gd-ssm-nd-2layer-gd-init", 0.001)):
        assert abs(released[name]["test_loss"] / two["loss"] - 1) < gap  # the page's "within 1.4% and 0.1%"


def test_a_torch_module_scores_gd_and_its_sensitivity_cosine_is_one():
    module = OneGDStep(ETA)
    m = zoo.score(module, task=TASK)["metrics"]
    assert abs(m["test_loss"] - GD_LOSS) < 1e-6
    assert m["sensitivity"] == "autograd" and abs(m["sensitivity_cosine"] - 1) < 1e-6
    assert m["sensitivity_l2_to_gd"] < 1e-9


def test_a_numpy_function_scores_gd_and_zoo_evaluate_is_a_function_beside_the_evaluation_module():
    import zoo.science.evaluation  # the scoring helpers: importing them leaves zoo.evaluate the function

    assert callable(zoo.evaluate) and not isinstance(zoo.evaluate, type(zoo.science.evaluation))
    record = zoo.evaluate(numpy_gd_step, task=TASK, sensitivity="none")
    assert abs(record["metrics"]["test_loss"] - GD_LOSS) < 1e-6
    assert record["model"] == {"kind": "callable", "name": f"{__name__}.numpy_gd_step"}
    assert "sensitivity_cosine" not in record["metrics"] and record["metrics"]["sensitivity"] == "none"


def test_the_sequence_contract_reads_the_graphs_read_out_metadata():
    """A zoo-exported sequence graph, scored as an outside file: (B, T, d_out) read by its icl_zoo.readout."""
    name = "lsa-gd-zucchet-icl"
    record = zoo.evaluate(str(release_dir() / name / "model.onnx"), task=TASK)
    assert record["metrics"]["test_loss"] == pytest.approx(read_index()["entries"][name]["test_loss"], rel=1e-6)


def test_every_position_on_triples_gives_the_loss_at_each_position():
    from zoo.publishing.benchmark import callable_candidate, load_frozen, score

    _, task, frozen = load_frozen("linreg-triples-d5-c20", "test")
    first = task.batch_from_arrays(*(torch.from_numpy(a[:400]) for a in (frozen.x, frozen.y)))  # per position: few suffice
    etas = task.prefix_etas().numpy()  # η*_t of each prefix

    def prefix_gd(tokens):  # s_t = (x_t, y_t, x_{t+1}) → ŷ_{t+1} = η*_t Σ_{s≤t} y_s x_sᵀ x_{t+1}
        d = task.d_x
        x, y, x_next = tokens[..., :d], tokens[..., d:d + task.d_y], tokens[..., d + task.d_y:]
        w = np.cumsum(np.einsum("bti,btj->btij", y, x), axis=1)
        return etas[None, :, None] * np.einsum("btij,btj->bti", w, x_next)

    m = score(callable_candidate(prefix_gd), task, first)
    assert m["output"] == "every position" and len(m["position_loss"]) == task.n_context
    assert np.allclose(m["position_loss"], m["position_gd_loss"], rtol=1e-5)
    assert abs(m["test_loss"] - m["gd_loss"]) < 1e-6


def test_a_hub_repo_holding_an_onnx_file(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "gd.onnx").write_bytes(gd_step_graph())
    hub.publish_local(folder, "someone/gd-step", root=tmp_path / "hub")
    proc, endpoint = hub.start_server(tmp_path / "hub")
    try:
        record = zoo.evaluate("someone/gd-step", task=TASK, endpoint=endpoint, sensitivity="none")
    finally:
        hub.stop_server(proc)
    assert record["model"]["name"] == "someone/gd-step@main/gd.onnx"
    assert abs(record["metrics"]["test_loss"] - GD_LOSS) < 1e-6


# ---------------------------------------------------------------- bad models: one line, nothing written
BAD_GRAPHS = {  # case: (gd_step_graph arguments, what the one line says)
    "wrong input name": ({"input_name": "input"}, "its input is named 'input'; the contract feeds one input named 'tokens'"),
    "wrong input width": ({"width": 5}, "its input 'tokens' is tensor(float) (?, 13, 5); the contract: tokens (B, 13, 6)"),
    "wrong output shape": ({"squeeze": False}, "output shape (2500, 1, 3); the contract"),
    "NaN outputs": ({"eta": float("nan")}, "non-finite predictions (NaN or inf) for 2500 of 2500 tasks"),
    "inf outputs": ({"eta": float("inf")}, "non-finite predictions (NaN or inf)"),
    "inputs the task cannot give": ({"extra_input": "state_in.0"},
                                    "the graph needs inputs ['tokens', 'state_in.0'], but the task gives only 'tokens'"),
}


@pytest.mark.parametrize("case", BAD_GRAPHS)
def test_a_bad_graph_is_refused_in_one_line_and_nothing_is_written(case, tmp_path, capsys):
    kwargs, expected = BAD_GRAPHS[case]
    graph = tmp_path / "bad.onnx"
    graph.write_bytes(gd_step_graph(**kwargs))
    out = tmp_path / "result.json"
    assert main(["eval", str(graph), "--task", TASK, "--out", str(out), "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"error: {graph}: ") and expected in line, line


def test_a_streaming_step_graph_needs_inputs_the_task_cannot_give(capsys):
    step = release_dir() / "gated-rnn-zucchet-icl" / "model_step.onnx"
    assert main(["eval", str(step), "--task", TASK]) == 1
    assert "the task gives only 'tokens'" in capsys.readouterr().err


def test_a_module_that_declares_another_token_width_is_refused_before_it_runs(capsys):
    assert main(["eval", str(release_dir() / "lsa-gd-d10-c10"), "--task", TASK]) == 1
    assert capsys.readouterr().err.strip().endswith("takes tokens of width d_in = 11; the contract: tokens (B, 13, 6) "
                                                    "float32 → predictions (B, 3) at the query, or outputs (B, 13, d_out) "
                                                    "with a read-out")


def raises(tokens):
    raise RuntimeError("shape mismatch inside my model\nsecond line")


BAD_CALLABLES = {
    "raises": (raises, "raises raised RuntimeError on tokens (2500, 13, 6): shape mismatch inside my model"),
    "wrong width": (lambda t: np.zeros((len(t), D_Y + 1)), "output shape (2500, 4); the contract: tokens (B, 13, 6)"),
    "wrong batch": (lambda t: np.zeros((1, D_Y)), "output shape (1, 3)"),
    "NaN": (lambda t: np.where(np.arange(len(t))[:, None] == 7, np.nan, numpy_gd_step(t)),
            "non-finite predictions (NaN or inf) for 1 of 2500 tasks, the first task 7"),
    "not an array": (lambda t: "ŷ", "returned str; the contract expects an array of predictions"),
    "sequence without a read-out": (lambda t: np.zeros((len(t), 13, 6)), "output shape (2500, 13, 6)"),
}


@pytest.mark.parametrize("case", BAD_CALLABLES)
def test_a_bad_callable_is_refused_in_one_line(case):
    fn, expected = BAD_CALLABLES[case]
    with pytest.raises(BenchmarkError) as e:
        zoo.evaluate(fn, task=TASK, name=case.replace(" ", "_") if case != "raises" else None)
    assert "\n" not in str(e.value) and expected in str(e.value), str(e.value)


def test_a_leaderboard_with_a_bad_model_writes_nothing(gd_onnx, tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(gd_step_graph(input_name="input"))
    out = tmp_path / "board"
    assert main(["leaderboard", TASK, "--add", f"good={gd_onnx}", "--add", f"bad={bad}", "--out", str(out)]) == 1
    assert "its input is named 'input'" in capsys.readouterr().err and not out.exists()
    with pytest.raises(BenchmarkError, match="raised RuntimeError"):
        leaderboard(TASK, add={"raises": raises}, entries=[])


# ---------------------------------------------------------------- records that others can check
def test_check_confirms_a_record_and_refutes_a_changed_one(gd_onnx, tmp_path, capsys):
    record = tmp_path / "result.json"
    assert main(["eval", str(gd_onnx), "--task", TASK, "--out", str(record)]) == 0
    capsys.readouterr()
    assert main(["eval", "--check", str(record), str(gd_onnx)]) == 0
    assert capsys.readouterr().out.startswith(f"confirmed: {gd_onnx} on {TASK}/test")

    edited = json.loads(record.read_text())
    edited["metrics"]["test_loss"] *= 1.01
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    assert main(["eval", "--check", str(tmp_path / "edited.json"), str(gd_onnx)]) == 1
    assert "refuted" in (out := capsys.readouterr().out) and "test_loss recorded" in out

    other = tmp_path / "other.onnx"
    other.write_bytes(gd_step_graph(eta=1.1 * ETA))
    assert main(["eval", "--check", str(record), str(other)]) == 1
    assert "the record scored a model with sha256" in capsys.readouterr().out


# ---------------------------------------------------------------- leaderboards
def test_zoo_leaderboard_prints_and_draws_the_table(gd_onnx, tmp_path, capsys):
    out = tmp_path / "board"
    assert main(["leaderboard", TASK, "--only", "lsa-gd-zucchet-icl", "--add", f"mine={gd_onnx}", "--out", str(out),
                 "--quiet"]) == 0
    table = capsys.readouterr().out
    for row in ("`mine` | outside", "`lsa-gd-zucchet-icl` | released", r"*GD, 1 step at η\* = 0.06757* | reference",
                "*GD, 2 steps at η =", "*GD, 2 steps at η = 0.04764, 0.1057 (a rate each, fitted on validation)*",
                "*least squares* | reference"):
        assert row in table, row
    assert table.splitlines()[2].startswith("| 1 | *least squares*")  # ranked by loss: noise-free, LS is exact
    assert (out / f"{TASK}.png").read_bytes()[:4] == b"\x89PNG"
    assert table in (out / f"{TASK}.md").read_text()


def test_the_release_carries_a_leaderboard_for_every_task_and_each_dataset_card_links_it(tmp_path):
    tasks = {get_entry(name).task for name in read_index()["entries"]}
    for task in tasks:
        board = (release_dir() / FOLDER / f"{task}.md").read_text()
        assert (release_dir() / FOLDER / f"{task}.png").is_file()
        missing = [name for name in released_on(task) if f"`{name}` | released" not in board]
        assert not missing, (f"release/{FOLDER}/{task}.md lacks {missing}: regenerate with "
                             "zoo release refresh --leaderboards")
    folder, _ = hub.dataset_folder(TASK, tmp_path / "ds")
    assert leaderboard_url(TASK) in (folder / "README.md").read_text()


# ---------------------------------------------------------------- released checkpoints scored fast, the same numbers
def test_a_released_checkpoint_scores_its_jacobian_by_step_as_autograd_through_the_whole_forward():
    """A zoo checkpoint in the open benchmark takes its recurrent model's fast path (passes sized by its state,
    ∂ŷ/∂x_q from one `step`); an outside torch module of the same weights goes through autograd over the whole
    forward in passes of 2,500 tasks. Same predictions and Jacobians, up to float32 rounding."""
    from zoo.publishing.benchmark import checkpoint_candidate, sensitivities, torch_candidate

    ckpt = zoo.load("lru-out-zucchet-icl")
    task = ckpt.task
    tokens = task.sample(300, seed=3).tokens
    fast = checkpoint_candidate(ckpt)
    slow = torch_candidate(ckpt.model, "the same weights", readout=ckpt.model.readout)
    assert fast.zoo_model is ckpt.model and slow.zoo_model is None
    by_step, method = sensitivities(fast, task, tokens, "auto")
    autograd, _ = sensitivities(slow, task, tokens, "auto")
    assert method == "autograd" and by_step.shape == (300, task.d_y, task.d_x)
    scale = autograd.abs().max().item()
    assert scale > 0.1 and (by_step - autograd).abs().max().item() <= 1e-5 * scale  # float32: ~1e-7 measured


def test_passes_are_sized_by_the_state_and_change_predictions_by_rounding_at_most():
    """`tasks_per_pass`: 2,500 tasks for a narrow state or attention; Mamba's 1,216 state floats a token over
    21 tokens give passes of 128 (whole multiples of 64). Predictions in those passes equal one pass's to float32
    rounding (bit for bit at 64·k for most families: PASS_STATE_FLOATS)."""
    from zoo.science.evaluation import PASS_ALIGN, TASKS_PER_PASS, tasks_per_pass

    mamba = zoo.load("mamba-nd")
    assert tasks_per_pass(mamba.model, 21) == 128 and tasks_per_pass(mamba.model, 10**6) == PASS_ALIGN
    assert tasks_per_pass(zoo.load("gated-rnn-zucchet-icl").model, 13) == TASKS_PER_PASS
    assert tasks_per_pass(zoo.load("softmax-tf-1l-d10-c10").model, 11) == TASKS_PER_PASS  # attention: no state
    assert tasks_per_pass(torch.nn.Linear(2, 2), 11) == TASKS_PER_PASS  # a plain module
    tokens = mamba.task.sample(300, seed=4).tokens
    with torch.no_grad():
        whole = mamba.model.predict_query(tokens)
        passes = torch.cat([mamba.model.predict_query(c) for c in tokens.split(128)])
    assert (passes - whole).abs().max().item() <= 1e-5 * whole.abs().max().item()


@pytest.mark.parametrize("name", ["mamba-nd", "gated-rnn-teacher-d4"])
def test_the_loss_alone_is_evaluates_test_loss_bit_for_bit(name):
    """`loss_alone` (what test_release re-scores trained cards with) is `evaluate`'s `test_loss`, exactly: the same
    predictions in the same passes, on a regression task and on a teacher–student one."""
    from zoo.science.evaluation import evaluate, loss_alone

    ckpt = zoo.load(name)
    batch = ckpt.task.sample(300, seed=5)
    assert loss_alone(ckpt.model, ckpt.task, batch) == evaluate(ckpt.model, ckpt.task, batch)["test_loss"]
