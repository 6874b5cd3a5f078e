"""The regression task, its baselines and the papers' numbers."""

import math

import pytest
import torch

from zoo.science.registry import get_task_spec
from zoo.science.tasks.frozen import load_split
from zoo.science.tasks.regression import (
    LinearRegressionTask,
    empirical_eta,
    gd_predict,
    least_squares_predict,
    line_search_eta,
)


def test_sample_layout_and_determinism():
    task = LinearRegressionTask(d_x=3, d_y=2, n_context=5)
    a, b = task.sample(8, seed=7), task.sample(8, seed=7)
    assert torch.equal(a.tokens, b.tokens)
    assert a.tokens.shape == (8, 6, 5)
    assert torch.equal(a.tokens[:, :-1, :3], a.x[:, :-1]) and torch.equal(a.tokens[:, :-1, 3:], a.y[:, :-1])
    assert torch.all(a.tokens[:, -1, 3:] == 0)  # query's y is hidden
    torch.testing.assert_close(a.targets, a.y[:, -1])
    assert a.x.abs().max() <= 1.0
    assert not torch.equal(a.tokens, task.sample(8, seed=8).tokens)


def test_zucchet_analytic_eta():
    task = get_task_spec("zucchet-icl").build()
    assert task.analytic_eta() == pytest.approx(1 / (12 + 3 - 1 / 5), rel=1e-12)
    assert round(task.analytic_eta(), 4) == 0.0676
    assert task.analytic_gd_loss() == pytest.approx(0.0946, abs=1e-4)  # paper: 0.0947


def test_zucchet_gd_loss_on_frozen_test_split_matches_paper():
    task = get_task_spec("zucchet-icl").build()
    b = load_split("zucchet-icl", "test", spec=get_task_spec("zucchet-icl")).batch(task, dtype=torch.float64)
    per_task = 0.5 * ((gd_predict(b, task.analytic_eta()) - b.targets) ** 2).mean(1)
    loss, stderr = per_task.mean().item(), per_task.std().item() / math.sqrt(len(per_task))
    # the paper's 0.0947 and the exact expectation 0.09459 both lie within 3 standard errors
    assert abs(loss - 0.0947) < 3 * stderr, (loss, stderr)
    assert abs(loss - task.analytic_gd_loss()) < 3 * stderr
    assert stderr < 0.002


def test_analytic_eta_minimises_the_sampled_loss():
    """Eq. 30 against brute force: empirical and line-searched η* agree with the formula."""
    for task in [LinearRegressionTask(d_x=10, d_y=1, n_context=10), LinearRegressionTask(d_x=4, d_y=1, n_context=20, x_dist="normal")]:
        b = task.sample(200_000, seed=3, dtype=torch.float64)
        emp = empirical_eta(b)
        unit = gd_predict(b, 1.0)  # one step from W = 0 is linear in η: ŷ(η) = η ŷ(1)
        assert torch.allclose(gd_predict(b, 0.5), 0.5 * unit)
        ls = line_search_eta(lambda e: task.loss(e * unit, b.targets).item(), 0, 3 * task.analytic_eta())
        assert emp == pytest.approx(task.analytic_eta(), rel=0.02)
        assert ls == pytest.approx(emp, rel=1e-4)


def test_blogpost_gd_baseline_numbers():
    # DESIGN.md: U(−1,1) → η_blog ≈ 1.5, ½MSE ≈ 0.83;  U(−0.5,0.5) → η_blog ≈ 6.0, ½MSE ≈ 0.208
    full = LinearRegressionTask(d_x=10, d_y=1, n_context=10, x_scale=1.0)
    half = LinearRegressionTask(d_x=10, d_y=1, n_context=10, x_scale=0.5)
    assert 10 * full.analytic_eta() == pytest.approx(1.515, abs=0.01)
    assert 10 * half.analytic_eta() == pytest.approx(6.06, abs=0.05)
    assert full.analytic_gd_loss() == pytest.approx(0.825, abs=0.005)
    assert half.analytic_gd_loss() == pytest.approx(0.206, abs=0.003)


def test_least_squares_is_exact_without_noise_and_min_norm_when_underdetermined():
    over = LinearRegressionTask(d_x=4, d_y=2, n_context=12)
    b = over.sample(64, seed=1, dtype=torch.float64)
    torch.testing.assert_close(least_squares_predict(b), b.targets, atol=1e-9, rtol=0)
    under = LinearRegressionTask(d_x=8, d_y=1, n_context=3)
    b = under.sample(64, seed=1, dtype=torch.float64)
    assert over.loss(least_squares_predict(b), b.targets) > 1e-3


def _tokens_by_the_written_rule(layout: dict, x, y):
    """What a reader of `token_layout["rule"]` (in every ONNX graph's metadata) would write, in numpy."""
    import numpy as np

    c = layout["row"]["x"][0] - 1
    if layout["layout"] == "sequence":
        return x
    if layout["layout"] == "pairs":
        return np.concatenate([x, np.concatenate([y[:, :c], np.zeros_like(y[:, c:])], 1)], -1)
    if layout["layout"] == "interleaved":
        n, dx, dy = x.shape[0], x.shape[-1], y.shape[-1]
        out = np.zeros((n, 2 * c + 1, dx + dy), x.dtype)
        out[:, 0:2 * c:2, :dx], out[:, 1:2 * c:2, dx:], out[:, 2 * c, :dx] = x[:, :c], y[:, :c], x[:, c]
        return out
    if layout["layout"] == "products":
        return np.concatenate([x[:, :c] * y[:, :c], x[:, 1:]], -1)
    return np.concatenate([x[:, :c], y[:, :c], x[:, 1:]], -1)  # triples


@pytest.mark.parametrize("layout", ["pairs", "interleaved", "products", "triples", "teacher"])
def test_token_layout_states_how_a_row_becomes_tokens(layout):
    """The layout a graph's metadata states is the one the zoo scores with: tokens built from the stated
    rule equal `batch_from_arrays`, the shapes are the stated ones, and the query's y never reaches them."""
    from zoo.science.tasks.teacher import LSATeacherTask

    task = (LSATeacherTask(d=3, seq_len=5) if layout == "teacher" else
            LinearRegressionTask(d_x=2, d_y=1 if layout == "products" else 2, n_context=4, layout=layout))
    batch = task.sample(3, seed=0, dtype=torch.float64)
    stated = task.token_layout
    x, y = batch.x.numpy(), batch.y.numpy()
    assert [list(x.shape[1:]), list(y.shape[1:])] == [stated["row"]["x"], stated["row"]["y"]]
    assert list(batch.tokens.shape[1:]) == stated["tokens"] == [task.n_tokens, task.token_dim]
    assert torch.equal(batch.tokens, torch.from_numpy(_tokens_by_the_written_rule(stated, x, y)))
    if layout != "teacher":
        moved = y.copy()
        moved[:, -1] += 1.0  # the query's y
        assert torch.equal(task.batch_from_arrays(batch.x, torch.from_numpy(moved)).tokens, batch.tokens)


def test_baseline_losses_are_computed_per_split_and_rate():
    """The evaluation's baselines are reused for the same data and rate only: equal to computing them
    afresh, and a different split or rate gets its own."""
    from zoo.science.evaluation import baseline_losses

    task = LinearRegressionTask(d_x=3, d_y=1, n_context=6, layout="triples")
    a, b = (task.sample(300, seed=s, dtype=torch.float64) for s in (1, 2))
    eta = task.analytic_eta()
    first = baseline_losses(task, a, eta)
    assert first["gd_loss"] == task.loss(gd_predict(a, eta), a.query_targets).item()
    assert first["lstsq_loss"] == task.loss(least_squares_predict(a), a.query_targets).item()
    first["position"]["position_gd_loss"].append(0.0)  # the caller's copy: the cache is untouched
    assert baseline_losses(task, a, eta) != first and len(baseline_losses(task, a, eta)["position"]["position_gd_loss"]) == 6
    assert baseline_losses(task, b, eta)["gd_loss"] != first["gd_loss"]
    assert baseline_losses(task, a, 2 * eta)["gd_loss"] == task.loss(gd_predict(a, 2 * eta), a.query_targets).item()


def test_zero_predictor_script_refuses_unknown_and_non_regression_tasks():
    """scripts/zero_predictor_loss.py (Sushma Figure 6's zero-predictor level): a one-line usage error, not a
    traceback, for a name the registry lacks and for a teacher task, which has no query."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "zero_predictor_loss.py"
    for name, said in (("nope", "unknown task 'nope'"), ("teacher-student-d4", "is not a regression task")):
        run = subprocess.run([sys.executable, str(script), name], capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and said in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_sizes_plot_script_refuses_rows_it_cannot_plot(tmp_path, monkeypatch):
    """scripts/zucchet_sizes_plot.py (Zucchet Figures 4.B and 5): a one-line error, not a traceback, for a file
    that is not JSON, a row without its fields, and an entry outside the size-swept ones; no plot is written.
    The script is loaded once and its main() called as `python SCRIPT ROWS --plot P` would: a SystemExit with
    a message is what Python prints to stderr as one line, exit status 1."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "zucchet_sizes_plot.py"
    spec = importlib.util.spec_from_file_location("zucchet_sizes_plot", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    row = {"entry": "gru-zucchet-icl", "parameters": 542, "test_loss": 0.3, "val_loss": 0.6, "test_gd": 0.09,
           "val_gd": 0.19}
    cases = {"broken.json": ("{not json", "not a readable JSON file"),
             "short.json": (json.dumps([{"entry": "gru-zucchet-icl"}]), "row 0 lacks parameters"),
             "stranger.json": (json.dumps([{**row, "entry": "runs/x/nope--seed0--width=8"}]), "not one of the size-swept")}
    for name, (text, said) in cases.items():
        (tmp_path / name).write_text(text)
        monkeypatch.setattr(sys, "argv", [str(path), str(tmp_path / name), "--plot", str(tmp_path / "p.png")])
        with pytest.raises(SystemExit) as refused:
            script.main()
        message = refused.value.code
        assert isinstance(message, str) and said in message and "\n" not in message, message
    assert not (tmp_path / "p.png").exists()
    # a run folder's depth override is part of its label: two In+Out layers are not In+Out's line
    assert script.label("runs/x/lru-in-out-zucchet-icl--seed0--width=16--n_layers=2") == "LRU In+Out, 2 layers"
    assert script.label("runs/x/lru-in-out-zucchet-icl--seed1--width=32") == "LRU In+Out"
    assert script.label("runs/x/lru-out-2l-zucchet-icl--seed2--width=16") == "LRU Out, 2 layers"
    for odd in ("lru-out-2l-zucchet-icl--seed0--n_layers=1", "gru-zucchet-icl--seed0--n_layers=2",
                "lru-in-out-zucchet-icl--seed0--n_layers=3"):
        with pytest.raises(SystemExit, match="is not a Figure 5 variant"):
            script.label(odd)


def test_teacher_student_sizes_script_redraws_saved_rows_and_refuses_broken_ones(tmp_path, monkeypatch):
    """scripts/zucchet_teacher_student_sizes.py (Zucchet Figure 5, teacher–student panel): `--plot-only` draws
    saved rows (one line per variant and length, the full recipe's points apart) and refuses, in one line and
    without a plot, a file that is not JSON, a row without its fields and a variant outside Figure 5's."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "zucchet_teacher_student_sizes.py"
    monkeypatch.syspath_prepend(str(path.parent))  # as `python scripts/…` runs it: its sibling scripts import
    spec = importlib.util.spec_from_file_location("zucchet_teacher_student_sizes", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    row = {"entry": "runs/x/lru-out-student-d6--seed0--width=16", "label": "LRU Out", "parameters": 1814,
           "steps": 200_000, "train_loss": 0.5, "val_loss": 0.51, "test_loss": 0.52}
    good = [row, {**row, "parameters": 6694, "val_loss": 0.4}, {**row, "label": "LRU In+Out", "steps": 1_000_000}]
    (tmp_path / "good.json").write_text(json.dumps(good))
    monkeypatch.setattr(sys, "argv", [str(path), "--plot-only", str(tmp_path / "good.json"), "--plot", str(tmp_path / "ok.png")])
    script.main()
    assert (tmp_path / "ok.png").stat().st_size > 10_000
    fig = script.draw(good)  # one line per variant and length: LRU Out's two widths are one line, the 1M point apart
    labels = [line.get_label() for line in fig.axes[1].get_lines()]
    assert labels == ["LRU Out, 200k steps", "LRU In+Out, 1M steps"], labels
    assert [len(line.get_xdata()) for line in fig.axes[1].get_lines()] == [2, 1]
    two = script.draw([*good, {**row, "seed": 1}])  # a second seed is a line of its own, and the title says so
    assert "LRU Out, 200k steps, seed 1" in [line.get_label() for line in two.axes[1].get_lines()]
    assert "2 seeds" in two._suptitle.get_text()
    cases = {"broken.json": ("[1,", "not a readable JSON file"),
             "short.json": (json.dumps([{"entry": "x", "label": "LRU Out"}]), "row 0 lacks parameters"),
             "stranger.json": (json.dumps([{**row, "label": "GRU"}]), "unknown variant 'GRU'"),
             "nosteps.json": (json.dumps([{**row, "steps": None}]), "steps is None, not a positive integer"),
             "text.json": (json.dumps([{**row, "val_loss": "0.4"}]), "val_loss is '0.4', not a positive finite"),
             "zero.json": (json.dumps([{**row, "parameters": 0}]), "parameters is 0")}
    for name, (text, said) in cases.items():
        (tmp_path / name).write_text(text)
        monkeypatch.setattr(sys, "argv", [str(path), "--plot-only", str(tmp_path / name), "--plot", str(tmp_path / "p.png")])
        with pytest.raises(SystemExit) as refused:
            script.main()
        message = refused.value.code
        assert isinstance(message, str) and said in message and "\n" not in message, message
    assert not (tmp_path / "p.png").exists()


def test_figure_7_context_script_summarises_by_depth_and_context(tmp_path, monkeypatch):
    """scripts/figure_7_context.py (blogpost Figure 7's context axis): rows grouped by (layers, C) with mean and
    sample std over seeds, the blogpost's plotted value and band at that C read from plotted-values.json (its
    4-layer value at C = 2 is 0.518), C = 10 taken from the depth run's results.json (the released seed where
    the sweep has none), a plot drawn; a folder that is not a checkpoint and a results file that is not the
    depth run's are refused in one line."""
    import importlib.util
    import json
    import statistics
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "figure_7_context.py"
    spec = importlib.util.spec_from_file_location("figure_7_context", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = [{"layers": 4, "n_context": 2, "seed": s, "test_loss": x, "gd_loss": 0.577}
            for s, x in enumerate([0.5122, 0.5116, 0.5103])]
    c10 = {"runs": {"softmax-tf-4l-d5-c10--seed0": {"test_loss": 0.0065, "gd_loss": 0.2748, "steps": 20000}},
           "released": {"softmax-tf-4l-d5-c10": {"seed": 0, "test_loss": 0.0065, "gd_loss": 0.2748, "steps": 20000},
                        "softmax-tf-5l-d5-c10": {"seed": 0, "test_loss": 0.0027, "gd_loss": 0.2748, "steps": 20000}}}
    (tmp_path / "c10.json").write_text(json.dumps(c10))
    summary = script.summarise(rows + script.c10_rows(tmp_path / "c10.json"))
    four = summary["4 layers, C = 2"]
    assert four["seeds"] == [0, 1, 2] and four["mean"] == pytest.approx(statistics.fmean([0.5122, 0.5116, 0.5103]))
    assert four["std"] == pytest.approx(statistics.stdev([0.5122, 0.5116, 0.5103]))
    plotted = four["blogpost_plotted"]
    assert plotted["value"] == pytest.approx(0.518, abs=5e-4) and plotted["band"][0] < plotted["value"] < plotted["band"][1]
    assert summary["4 layers, C = 10"]["seeds"] == [0]  # the sweep's seed 0, not also the released one
    assert summary["5 layers, C = 10"]["std"] is None and summary["5 layers, C = 10"]["mean"] == 0.0027
    assert script.plotted_at(1, 3) is None  # C = 3 is not on the blogpost's grid (2, 10, …, 98)
    assert script.plot(summary, tmp_path / "c.png").stat().st_size > 10_000
    (tmp_path / "bad.json").write_text(json.dumps({"runs": {}}))
    with pytest.raises(SystemExit, match="not Figure 7's depth results.json") as refused:
        script.c10_rows(tmp_path / "bad.json")
    assert "\n" not in refused.value.code
    (tmp_path / "odd.json").write_text(json.dumps({**c10, "runs": {"softmax-tf-10l-d5-c10--seed0": {}}}))
    with pytest.raises(SystemExit, match="not Figure 7's depth results.json"):  # 10 layers is not read as 1
        script.c10_rows(tmp_path / "odd.json")
    with pytest.raises(SystemExit, match="a run given twice"):
        script.summarise(rows + rows[:1])
    with pytest.raises(SystemExit, match="plots 1-5 layers, not 6"):
        script.plotted_at(6, 2)
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "empty").mkdir()
    for folder, said in ((tmp_path / "empty", "not a loadable checkpoint"),
                         (root / "release" / "lsa-d10-c10", "not Figure 7's 1-5 layers on linreg-d5-c10")):
        monkeypatch.setattr(sys, "argv", [str(path), str(folder), "--json", str(tmp_path / "r.json"),
                                          "--plot", str(tmp_path / "p.png")])
        with pytest.raises(SystemExit, match=said) as refused:
            script.main()
        assert "\n" not in refused.value.code and not (tmp_path / "r.json").exists()
    # a committed run of the C = 2 variant: its task spec registered from the checkpoint, its frozen split built
    # from linreg-d5-c10's seeds, re-scored to the loss it recorded on the GPU
    run = root / "reports/blogpost-2024/generated/figure-7/depth-context-h200/figure-7-depth-context-c2"
    row = script.score(run / "softmax-tf-1l-d5-c10--seed0--n_context=2")
    assert (row["layers"], row["n_context"], row["seed"], row["steps"]) == (1, 2, 0, 20000)
    assert row["test_loss"] == pytest.approx(row["recorded_test_loss"], rel=1e-5)
