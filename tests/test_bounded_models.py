"""Outside models run bounded (zoo/publishing/benchmark.py, `Limits`): an ONNX graph that takes too much
memory, runs without end or returns too much is stopped in one line naming the limit; a normal one scores."""

import psutil
import pytest
from onnx import TensorProto, helper

import zoo
from zoo.cli import main
from zoo.publishing import benchmark
from zoo.publishing.benchmark import BenchmarkError
from zoo.storage.locate import read_index, release_dir

TASK = "zucchet-icl"  # tokens (B, 13, 6) → predictions (B, 3)
GD_LOSS = read_index()["entries"]["lsa-gd-zucchet-icl"]["gd_loss"]


def ints(name, *values):
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def graph_bytes(nodes, constants, out_shape=("batch", 3), out_type=TensorProto.FLOAT) -> bytes:
    """A graph of `nodes` from `tokens` (B, 13, 6) to `prediction`; `query_y` (B, 3), the query token's y
    channels (zeros), is there to build on."""
    head = [helper.make_node("Slice", ["tokens", "query_start", "query_end", "axes_1_2"], ["query"]),  # (B, 1, 3)
            helper.make_node("Squeeze", ["query", "axis_1"], ["query_y"])]  # (B, 3)
    constants = [ints("query_start", -1, 3), ints("query_end", 2**62, 6), ints("axes_1_2", 1, 2),
                 ints("axis_1", 1), *constants]
    graph = helper.make_graph(head + nodes, "hostile", [helper.make_tensor_value_info("tokens", TensorProto.FLOAT,
                                                                                      ["batch", 13, 6])],
                              [helper.make_tensor_value_info("prediction", out_type, list(out_shape))], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model.SerializeToString()


def memory_hog() -> bytes:
    """3 GiB of zeros whatever the batch (its size read from the tokens' shape, so nothing folds it away)."""
    nodes = [helper.make_node("Shape", ["tokens"], ["shape"], start=2, end=3),  # [6]
             helper.make_node("Mul", ["shape", "many"], ["size"]),  # [6 · 2^27] floats: 3 GiB
             helper.make_node("ConstantOfShape", ["size"], ["zeros"]),
             helper.make_node("ReduceSum", ["zeros"], ["sum"], keepdims=0),
             helper.make_node("Add", ["query_y", "sum"], ["prediction"])]
    return graph_bytes(nodes, [ints("many", 2**27)])


def endless_loop() -> bytes:
    """A Loop with a 2^40 trip count around an Identity."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["v_in"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["batch", 3])])
    nodes = [helper.make_node("Loop", ["trips", "go", "query_y"], ["prediction"], body=body)]
    return graph_bytes(nodes, [helper.make_tensor("trips", TensorProto.INT64, [], [2**40]),
                               helper.make_tensor("go", TensorProto.BOOL, [], [True])])


def flood() -> bytes:
    """Every token repeated 4096 times: (B, 13, 6, 4096), ~3 MB a task where the contract needs 12 bytes."""
    nodes = [helper.make_node("Unsqueeze", ["tokens", "axis_3"], ["wide"]),
             helper.make_node("Expand", ["wide", "copies"], ["prediction"])]
    return graph_bytes(nodes, [ints("axis_3", 3), ints("copies", 1, 1, 1, 4096)], out_shape=("batch", 13, 6, 4096))


def write(tmp_path, name, raw):
    path = tmp_path / name
    path.write_bytes(raw)
    return str(path)


def no_children_left():
    assert [p for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE] == []


def refusal(tmp_path, name: str, graph: bytes, **limits) -> str:
    """The one-line BenchmarkError `zoo.evaluate` gives an outside graph under `limits`, which names the graph's
    path first; no child process is left behind."""
    path = write(tmp_path, name, graph)
    with pytest.raises(BenchmarkError) as caught:
        zoo.evaluate(path, task=TASK, sensitivity="none", **limits)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(path)
    no_children_left()
    return message


def test_a_graph_that_needs_gigabytes_is_stopped_by_the_memory_limit(tmp_path):
    message = refusal(tmp_path, "hog.onnx", memory_hog(), memory_limit=512 * 2**20)
    assert "memory limit of 512 MiB" in message and "--memory-limit" in message


def test_a_loop_of_2_to_the_40_is_stopped_by_the_time_limit(tmp_path):
    message = refusal(tmp_path, "loop.onnx", endless_loop(), time_limit=3)
    assert "time limit of 3 s" in message and "--time-limit" in message


def test_an_output_far_above_the_contract_is_refused_by_the_output_cap(tmp_path):
    message = refusal(tmp_path, "flood.onnx", flood())  # (2500, 13, 6, 4096) floats: 1 GB, the cap 256 MiB
    assert "above the output cap of 256 MiB" in message and "--output-limit" in message


def test_the_cli_flags_set_each_limit_and_report_it_in_one_line(tmp_path, capsys):
    loop, hog = write(tmp_path, "loop.onnx", endless_loop()), write(tmp_path, "hog.onnx", memory_hog())
    assert main(["eval", loop, "--task", TASK, "--time-limit", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "time limit of 2 s" in err
    assert main(["eval", hog, "--task", TASK, "--memory-limit", "300M"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "memory limit of 300 MiB" in err
    out = tmp_path / "board"
    assert main(["leaderboard", TASK, "--only", "lsa-gd-zucchet-icl", "--add", f"hog={hog}", "--memory-limit", "0.25G",
                 "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "memory limit of 256 MiB" in err and not out.exists()
    no_children_left()


def test_a_released_graph_still_scores_under_the_limits():
    record = zoo.evaluate(str(release_dir() / "lsa-gd-zucchet-icl" / "model.onnx"), task=TASK)
    assert record["metrics"]["n_tasks"] == 10_000
    assert record["metrics"]["test_loss"] == pytest.approx(GD_LOSS, rel=1e-5)
    with benchmark.bounds(memory_limit=256 * 2**20, time_limit=120):  # it needs far less
        assert zoo.evaluate(str(release_dir() / "lsa-gd-zucchet-icl" / "model.onnx"),
                            task=TASK)["metrics"] == record["metrics"]
    no_children_left()


def test_limits_are_checked():
    with pytest.raises(ValueError, match="time_limit"):
        benchmark.limits(time_limit=-1)
    assert benchmark.limits() == benchmark.Limits(600.0, 2 * 2**30, 256 * 2**20)
