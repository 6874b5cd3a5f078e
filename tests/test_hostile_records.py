"""Hostile input to the open benchmark and the leaderboards: a record that `zoo eval --check` confirms
binds every field and every re-scored number (a string, null, bool, an empty or partial `metrics`
refutes it), a record's re-scoring parameters are bounded, and a leaderboard name is data, never markup."""

import json
import math
import subprocess
import sys
import time

import pytest
from test_benchmark import TASK, gd_step_graph, numpy_gd_step

from zoo.cli import main
from zoo.publishing.benchmark import RECORD_FORMAT, BenchmarkError, check, evaluate
from zoo.publishing.leaderboard import (
    Leaderboard,
    Row,
    figure,
    leaderboard,
    markdown,
    markdown_table,
)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """An ONNX file (one GD step) and its genuine record (no sensitivities: the re-score is quick)."""
    folder = tmp_path_factory.mktemp("records")
    onnx = folder / "gd.onnx"
    onnx.write_bytes(gd_step_graph())
    record = evaluate(str(onnx), task=TASK, sensitivity="none")
    (folder / "record.json").write_text(json.dumps(record))
    return onnx, record


def edited(record: dict, edit) -> dict:
    copy = json.loads(json.dumps(record))
    edit(copy)
    return copy


def _set(path, value):
    """An edit that sets record[path[0]][path[1]]... to value."""
    def edit(r):
        for key in path[:-1]:
            r = r[key]
        r[path[-1]] = value
    return edit


def _drop(path):
    def edit(r):
        for key in path[:-1]:
            r = r[key]
        del r[path[-1]]
    return edit


# ---------------------------------------------------------------- A: forged records are refuted
FORGED = {
    "a metric as a string": _set(["metrics", "test_loss"], "0.0001"),
    "a metric as the string of its own value": lambda r: r["metrics"].__setitem__("test_loss", str(r["metrics"]["test_loss"])),
    "empty metrics": _set(["metrics"], {}),
    "a metric null": _set(["metrics", "test_loss"], None),
    "a metric a bool": _set(["metrics", "gd_steps"], True),  # True == 1: a bool is not a number of the record
    "a metric NaN": _set(["metrics", "test_loss"], float("nan")),
    "a metric inf": _set(["metrics", "test_loss"], float("inf")),
    "a metric missing": _drop(["metrics", "gd_loss"]),
    "a k-step reference's steps changed": _set(["metrics", "gd_k_steps", 1, "steps"], 4),
    "k-step references missing": _drop(["metrics", "gd_k_steps"]),
    "a k-step number missing": _drop(["metrics", "gd_k_steps", 0, "loss"]),
    "a per-step rate changed": _set(["metrics", "gd_k_steps_per_step_rates", 0, "etas", 1], 0.5),
    "per-step references missing": _drop(["metrics", "gd_k_steps_per_step_rates"]),
    "per-step rates tuned elsewhere": _set(["metrics", "gd_k_steps_per_step_rates", 0, "tuned_on"], "zucchet-icl/test"),
    "a metric the re-score does not produce": _set(["metrics", "accuracy"], 1.0),
    "a string metric changed": _set(["metrics", "output"], "every position"),
    "format missing": _drop(["format"]),
    "format another": _set(["format"], "icl-zoo/publishing/benchmark/v0"),
    "zoo version missing": _drop(["zoo_version"]),
    "zoo version another": _set(["zoo_version"], "0.0.1"),
    "zoo version not a string": _set(["zoo_version"], 2),
    "dataset SHA-256 missing": _drop(["dataset_sha256"]),
    "dataset SHA-256 another": _set(["dataset_sha256"], "0" * 64),
    "model SHA-256 missing (name only)": _drop(["model", "sha256"]),
    "model SHA-256 another": _set(["model", "sha256"], "f" * 64),
    "model missing": _drop(["model"]),
    "model kind another": _set(["model", "kind"], "callable"),
}


@pytest.mark.parametrize("case", FORGED)
def test_a_forged_record_is_refuted_in_one_line(scored, case):
    onnx, record = scored
    assert check(record, str(onnx)).confirmed  # the genuine record stands
    verdict = check(edited(record, FORGED[case]), str(onnx))
    assert not verdict.confirmed, (case, verdict.message)
    assert verdict.message.startswith("refuted: ") and "\n" not in verdict.message


def test_zoo_eval_check_refutes_a_string_metric_and_empty_metrics(scored, tmp_path, capsys):
    onnx, record = scored
    for name, edit in (("string", FORGED["a metric as a string"]), ("empty", FORGED["empty metrics"])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(edited(record, edit)))
        assert main(["eval", "--check", str(path), str(onnx)]) == 1
        out = capsys.readouterr().out
        assert out.startswith("refuted: ") and len(out.strip().splitlines()) == 1, out


BAD_PARAMETERS = {  # a record's re-scoring parameters: refused in one line, before anything runs
    "steps a float": _set(["metrics", "gd_k_steps", 0, "steps"], 2.5),
    "steps a string": _set(["metrics", "gd_k_steps", 0, "steps"], "2"),
    "steps a bool": _set(["metrics", "gd_k_steps", 0, "steps"], True),
    "steps null": _set(["metrics", "gd_k_steps", 0, "steps"], None),
    "steps zero": _set(["metrics", "gd_k_steps", 0, "steps"], 0),
    "steps negative": _set(["metrics", "gd_k_steps", 0, "steps"], -1),
    "steps 17": _set(["metrics", "gd_k_steps", 0, "steps"], 17),  # 3000 and 10**30: in a subprocess below
    "steps missing": _drop(["metrics", "gd_k_steps", 0, "steps"]),
    "a k-step not an object": _set(["metrics", "gd_k_steps", 0], 2),
    "k-steps not a list": _set(["metrics", "gd_k_steps"], {"steps": 2}),
    "too many k-steps": _set(["metrics", "gd_k_steps"], [{"steps": k} for k in range(1, 6)]),
    "sensitivity not a method": _set(["metrics", "sensitivity"], "rm -rf"),
    "sensitivity a number": _set(["metrics", "sensitivity"], 3),
    "task not a string": _set(["task"], ["zucchet-icl"]),
    "split not a string": _set(["split"], 1),
    "metrics not an object": _set(["metrics"], [1, 2]),
}


@pytest.mark.parametrize("case", BAD_PARAMETERS)
def test_a_records_rescoring_parameters_are_checked_before_anything_runs(scored, case):
    onnx, record = scored
    started = time.perf_counter()
    with pytest.raises(BenchmarkError) as e:
        check(edited(record, BAD_PARAMETERS[case]), str(onnx))
    assert "\n" not in str(e.value) and time.perf_counter() - started < 5, str(e.value)


CHECK_MANY_STEPS = """
import json, resource, sys, time
from zoo.publishing.benchmark import BenchmarkError, check
record = json.loads(open(sys.argv[1]).read())
record["metrics"]["gd_k_steps"][0]["steps"] = int(sys.argv[3])
started = time.perf_counter()
try:
    verdict = check(record, sys.argv[2])
    outcome = "confirmed" if verdict.confirmed else "refuted"
except BenchmarkError as e:
    outcome = "refused: " + str(e)
print(json.dumps({"outcome": outcome, "seconds": time.perf_counter() - started,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


@pytest.mark.parametrize("steps", [3000, 10**30])
def test_a_record_asking_for_thousands_of_gd_steps_is_refused_at_once(scored, steps):
    """Before: `steps: 3000` ran the k-step line search for over 120 s, reaching 6.1 GB; 10**30 never ends.
    In a subprocess, killed after 30 s."""
    onnx, _ = scored
    path = onnx.parent / "record.json"
    try:
        out = subprocess.run([sys.executable, "-c", CHECK_MANY_STEPS, str(path), str(onnx), str(steps)],
                             capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"check() of a record with steps: {steps} ran past 30 s")
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(got)
    assert got["outcome"].startswith("refused: ") and "steps" in got["outcome"], got
    assert got["seconds"] < 5, got


def test_zoo_eval_check_refuses_a_float_step_count_in_one_line(scored, tmp_path, capsys):
    onnx, record = scored
    path = tmp_path / "float-steps.json"
    path.write_text(json.dumps(edited(record, BAD_PARAMETERS["steps a float"])))
    assert main(["eval", "--check", str(path), str(onnx)]) != 0
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "TypeError" not in line and "steps" in line, line


def test_a_genuine_record_binds_format_version_and_every_number(scored):
    onnx, record = scored
    assert record["format"] == RECORD_FORMAT and record["zoo_version"] and len(record["dataset_sha256"]) == 64
    verdict = check(record, str(onnx))
    assert verdict.confirmed and verdict.message.startswith("confirmed: "), verdict.message
    numbers = int(verdict.message.split("): ")[1].split()[0])
    assert numbers >= 25  # every number the re-score produces


def test_a_record_scored_with_other_k_step_references_is_re_scored_with_them(scored):
    onnx, _ = scored
    for steps in ((4,), ()):
        record = evaluate(str(onnx), task=TASK, sensitivity="none", gd_steps=steps)
        assert [k["steps"] for k in record["metrics"]["gd_k_steps"]] == list(steps)
        verdict = check(record, str(onnx))
        assert verdict.confirmed, verdict.message


# ---------------------------------------------------------------- B: leaderboard names are data
HOSTILE_NAMES = {
    "closes the cell": "mine | 0",
    "forges a row": "x | outside | 0 ± 0 |\n| 0 | `winner`",
    "a heading": "# I win",
    "a script": "<script>alert(1)</script>",
    "an image": "![](https://evil.example/x.png)",
    "a javascript link": "[click](javascript:alert(1))",
    "a newline": "a\nb",
    "a backtick": "`code`",
    "mathtext": "$\\frac{1}{0}$",
    "empty": "",
    "blank": "   ",
    "too long": "x" * 65,
    "a control character": "a\x1b[2Jb",
    "an HTML entity": "&lt;b&gt;",
}


@pytest.mark.parametrize("case", HOSTILE_NAMES)
def test_a_hostile_leaderboard_name_is_refused_in_one_line_before_anything_is_scored(case):
    scored = []

    def model(tokens):
        scored.append(1)
        return numpy_gd_step(tokens)

    with pytest.raises(ValueError) as e:
        leaderboard(TASK, add={HOSTILE_NAMES[case]: model}, entries=[])
    assert "\n" not in str(e.value) and "name" in str(e.value) and not scored, str(e.value)


def test_zoo_leaderboard_refuses_a_name_that_would_close_the_table_row(scored, tmp_path, capsys):
    onnx, _ = scored
    out = tmp_path / "board"
    assert main(["leaderboard", TASK, "--add", f"mine | 0 | forged={onnx}", "--out", str(out), "--quiet"]) != 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "name" in line and not out.exists(), line


def test_names_of_letters_digits_spaces_and_dashes_are_taken():
    from zoo.publishing.leaderboard import validate_name

    for name in ("mine", "My model (v2.1)", "gd_step-3+ln", "x" * 64):
        assert validate_name(name) == name


def _board(*rows) -> Leaderboard:
    return Leaderboard(TASK, "test", f"{TASK}/test", "0" * 64, 10, 0.06757, "a task", list(rows))


def _render(md: str) -> str:
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark").enable("table").render(md)


def test_the_reference_rows_render_as_one_italic_label_each():
    """`*GD, 1 step at η* = …*`: the '*' of η* closed the italics."""
    from zoo.publishing.leaderboard import reference_rows

    refs = {"gd_eta": 0.06756756756756757, "gd_loss": 0.0941, "gd_loss_se": 0.0015, "lstsq_loss": 1e-15,
            "lstsq_loss_se": 1e-17, "lstsq_gd_paired_diff": -0.0941, "lstsq_gd_paired_se": 0.0015,
            "gd_k_steps": [{"steps": 2, "eta": 0.0657, "loss": 0.036, "loss_se": 0.001, "gd_paired_diff": -0.05,
                            "gd_paired_se": 0.001}]}
    board = _board(*reference_rows(refs), Row("mine", "outside", 0.09, 0.001, 0.0, 0.0, 0.0, 1.0))
    html = _render(markdown_table(board))
    assert "<em>GD, 1 step at η* = 0.06757</em>" in html, html
    assert "<em>GD, 2 steps at η = 0.0657</em>" in html and "<em>least squares</em>" in html, html
    assert "<code>mine</code>" in html and html.count("<tr>") == 1 + len(board.rows)


@pytest.mark.parametrize("case", [c for c in HOSTILE_NAMES if c not in ("empty", "blank")])
def test_a_hostile_name_in_a_hand_made_board_is_never_rendered(case, tmp_path):
    """A Leaderboard built by hand (or read back from JSON) goes through the same check when drawn."""
    board = _board(Row(HOSTILE_NAMES[case], "outside", 0.09, 0.001, 0.0, 0.0, 0.0, 1.0),
                   Row("least squares", "reference", 1e-15, 1e-17, -0.09, 0.001))
    for render in (markdown_table, lambda b: markdown(b, "x.png"), lambda b: figure(b, tmp_path / "x.png")):
        with pytest.raises(ValueError) as e:
            render(board)
        assert "\n" not in str(e.value) and "name" in str(e.value)
    assert not (tmp_path / "x.png").exists()


def test_a_board_of_good_names_renders_each_row_once():
    rows = [Row(name, "outside", 0.09 + i, 0.001, 0.0, 0.0, 0.0, 1.0) for i, name in
            enumerate(("mine", "My model (v2.1)", "gd_step-3+ln"))]
    html = _render(markdown(_board(*rows), "x.png"))
    assert html.count("<tr>") == 1 + len(rows) and "<script" not in html and html.count("<h1>") == 1
    assert all(f"<code>{r.name}</code>" in html for r in rows)
    assert math.isfinite(rows[0].loss)
