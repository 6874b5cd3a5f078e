"""`zoo release plan` (each trained entry's measured cost at its recipe length, eager and as the build trains
it) and `zoo release build` into a fresh folder."""

import json

import pytest

from zoo.publishing import release


@pytest.mark.compile
def test_plan_measures_eager_and_compiled_and_totals_them(capsys):
    rows = release.print_plan(only=["fast-weight-triples", "lstm-triples"], device="cpu")
    out = capsys.readouterr().out
    by_name = {r["entry"]: r for r in rows}
    for row in rows:
        assert row["eager_steps_per_second"] > 0 and row["compiled_steps_per_second"] > 0
        assert row["eager_seconds"] == pytest.approx(row["recipe_steps"] / row["eager_steps_per_second"])
    # the build trains an LSTM eagerly (compiling leaves its fused kernel as it is): the plan says so
    assert release.training_mode("lstm-triples", "cpu") == (False, False)
    lstm = by_name["lstm-triples"]
    assert lstm["compiled_steps_per_second"] == lstm["eager_steps_per_second"]
    assert release.training_mode("fast-weight-triples", "cpu") == (False, True)
    assert release.training_mode("fast-weight-triples", "cpu", compiled=False) == (False, False)
    total = sum(r["compiled_seconds"] for r in rows) / 3600
    assert "whole zoo" in out and f"{total:.2f}" in out.splitlines()[-1]


@pytest.mark.compile
def test_release_build_trains_compiled_within_its_budget_and_constructs(tmp_path):
    """A budgeted CPU build: the trained entry runs compiled for the steps its measured (compiled) rate
    affords, says so in its provenance and index row; the constructed one is built as always."""
    index = release.build_release(tmp_path, only=["fast-weight-triples", "lsa-gd-zucchet-icl"], time_budget=1,
                                  device="cpu", progress=False)
    trained, constructed = index["entries"]["fast-weight-triples"], index["entries"]["lsa-gd-zucchet-icl"]
    assert release.MIN_STEPS <= trained["steps"] < trained["recipe_steps"] and trained["steps_per_second"] > 0
    config = json.loads((tmp_path / "fast-weight-triples" / "config.json").read_text())
    assert config["provenance"]["compiled"] is True and config["provenance"]["steps"] == trained["steps"]
    assert constructed["source"] == "constructed" and constructed["verdict"].startswith("meets")


def test_an_eager_release_build_announces_its_entry_and_shows_the_step_bar(tmp_path, capsys, monkeypatch):
    """compiled=False: a budgeted build trains eagerly, makes the model twice (the seed's, which decides the training
    mode and is trained, and the rate probe's), says where and how long, and shows the step bar to its end."""
    import zoo.running.builder
    import zoo.science.models
    from zoo.science.registry import default_registry

    default_registry()  # loaded (and validated, which builds a few models) once per process, before counting
    made, create_model = [], zoo.science.models.create_model
    for module in (zoo.science.models, zoo.running.builder):  # every name the build reaches create_model by
        monkeypatch.setattr(module, "create_model", lambda *a, **k: made.append(1) or create_model(*a, **k))
    eager = release.build_release(tmp_path / "eager", only=["fast-weight-triples"], time_budget=1, device="cpu",
                                  progress=True, compiled=False)
    assert len(made) == 2  # the seed's model, which decides the training mode and is trained, and the rate probe's
    shown = capsys.readouterr()
    assert "started fast-weight-triples (" in shown.out  # make_entry_announced: where and how long
    steps = eager["entries"]["fast-weight-triples"]["steps"]
    assert f"{steps}/{steps}" in shown.err  # tqdm's bar at the end of the run
    config = json.loads((tmp_path / "eager" / "fast-weight-triples" / "config.json").read_text())
    assert "compiled" not in config["provenance"] and eager["entries"]["fast-weight-triples"]["steps"] >= release.MIN_STEPS


def test_no_cpp_compiler_means_an_eager_build(monkeypatch):
    """Inductor writes C++ on a CPU: with no compiler on the PATH the build trains eagerly instead of failing."""
    from zoo.running.train import can_compile

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not can_compile("cpu")
    assert release.training_mode("fast-weight-triples", "cpu") == (False, False)


def test_one_training_mode_decides_for_build_sweep_and_release(monkeypatch):
    """zoo.running.train.training_mode: ensemble / CUDA graph / compiled, one rule for every command. Without a
    C++ compiler an asked-for compile falls back to eager (it used to fail in `zoo sweep --compile`)."""
    from types import SimpleNamespace

    from zoo.running import train
    from zoo.running.train import TrainingMode

    vmappable = SimpleNamespace(vmappable=True, compile_pays=True)
    fused = SimpleNamespace(vmappable=False, compile_pays=False)  # nn.LSTM / nn.GRU kernels
    plain, skipping = SimpleNamespace(max_skipped_steps=0), SimpleNamespace(max_skipped_steps=10)
    monkeypatch.setattr(train, "can_compile", lambda device: False)
    assert train.training_mode(vmappable, plain, "cpu", compile=True) == TrainingMode(False, False, False)
    monkeypatch.setattr(train, "can_compile", lambda device: True)
    assert train.training_mode(vmappable, plain, "cpu", compile=True) == TrainingMode(False, False, True)
    assert train.training_mode(vmappable, plain, "cpu", members=4, compile=True) == TrainingMode(True, False, True)
    assert train.training_mode(vmappable, plain, "cuda", compile=True) == TrainingMode(True, True, False)
    assert train.training_mode(vmappable, skipping, "cuda", members=4) == TrainingMode(False, False, False)
    assert train.training_mode(fused, plain, "cuda", members=4, compile=True) == TrainingMode(False, False, False)
