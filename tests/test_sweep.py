"""Sweeps (the local backend; on Ray: test_ray.py), entry overrides, and the comparison report."""

import json
from pathlib import Path

import pytest

import zoo
from zoo.publishing.report import collect, write_report
from zoo.running.sweep import expand, load_spec, run_sweep
from zoo.science.registry import RegistryError, with_overrides

SPEC = """
name = "tiny"
entries = ["gated-rnn-zucchet-icl", "lsa-gd-zucchet-icl"]
seeds = [0, 1]
steps = 3
graphs = false
"""  # no ONNX export per run: sweeps are about results (the graphs: test_export.py, test_checkpoint.py)


@pytest.mark.parametrize("spec_file", sorted((Path(__file__).parents[1] / "sweeps").glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_sweep_expands_into_valid_runs(spec_file):
    """What the reports and scripts/gpu_paper_length_runs.sh run: every entry exists and every grid
    point validates (expand builds each run's entry with its overrides)."""
    spec = load_spec(spec_file)
    runs = expand(spec)
    assert runs and {r.entry for r in runs} == set(spec.entries)


def test_overrides_are_validated_with_the_field_named():
    entry = zoo.get_entry("gated-rnn-zucchet-icl")
    assert with_overrides(entry, {"arch.hidden": 16, "source.lr": 3e-4}).arch.hidden == 16
    with pytest.raises(RegistryError, match="arch.hidden"):
        with_overrides(entry, {"arch.hidden": -1})
    with pytest.raises(RegistryError, match="arch.hiden"):
        with_overrides(entry, {"arch.hiden": 16})


def test_spec_expands_and_rejects_bad_grids(tmp_path):
    spec_file = tmp_path / "s.toml"
    spec_file.write_text(SPEC + '[grid]\n"arch.hidden" = [8, 12]\n')
    with pytest.raises(RegistryError):  # the constructed LSA has no 'hidden'
        expand(load_spec(spec_file))
    spec_file.write_text(SPEC.replace(', "lsa-gd-zucchet-icl"', "") + '[grid]\n"arch.hidden" = [8, 12]\n')
    runs = expand(load_spec(spec_file))
    assert [r.name for r in runs] == ["gated-rnn-zucchet-icl--seed0--hidden=8", "gated-rnn-zucchet-icl--seed1--hidden=8",
                                      "gated-rnn-zucchet-icl--seed0--hidden=12", "gated-rnn-zucchet-icl--seed1--hidden=12"]
    spec_file.write_text("name = 'x'\nentries = []\n")
    with pytest.raises(ValueError, match="invalid sweep spec"):
        load_spec(spec_file)


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """SPEC run once on the local backend: (spec, its output folder, its rows); the ensemble tests compare with
    these rows."""
    folder = tmp_path_factory.mktemp("local-sweep")
    (folder / "s.toml").write_text(SPEC)
    spec = load_spec(folder / "s.toml")
    return spec, folder / "out", run_sweep(spec, folder / "out", progress=False)


def test_local_sweep_runs_resumes_and_reports(local_sweep, tmp_path):
    spec, out, rows = local_sweep
    # two seeds of the trained entry, one run of the constructed one
    assert [r["status"] for r in rows] == ["built"] * 3
    assert {r["run"] for r in rows} == {"gated-rnn-zucchet-icl--seed0", "gated-rnn-zucchet-icl--seed1", "lsa-gd-zucchet-icl"}
    assert rows[0]["steps"] == 3 and rows[0]["test_loss"] != rows[1]["test_loss"]  # seeds differ
    again = run_sweep(spec, out, progress=False)
    assert [r["status"] for r in again] == ["cached"] * 3
    assert [r["test_loss"] for r in again] == [r["test_loss"] for r in rows]
    table = json.loads((out / "results.json").read_text())
    assert len(table) == 3 and (out / "results.md").read_text().startswith("| run |")
    # every run is an ordinary checkpoint, here without graphs (`graphs = false`)
    ckpt = zoo.load(str(out / "gated-rnn-zucchet-icl--seed1"))
    assert ckpt.provenance["seed"] == 1 and not list(out.glob("*/*.onnx"))
    report_rows = collect([out])
    md, raw, png, *more = write_report(report_rows, tmp_path / "report")
    assert [f.name for f in more] == ["report-zucchet-icl-training.png"]  # the trained runs' validation curves
    assert {r["model"] for r in json.loads(raw.read_text())} == {r["model"] for r in report_rows}
    text = md.read_text()
    assert "## zucchet-icl" in text and "lsa-gd-zucchet-icl" in text and png.stat().st_size > 10_000
    # Table 2 for the gated RNNs (the constructed LSA has a polynomial too): the saved coefficients, GD's η*
    poly = text[text.index("### zucchet-icl: instantaneous polynomial"):].splitlines()
    assert poly[2] == "| model | steps | x1^2 y1 | x2^2 y1 | x3^2 y1 | residual norm | memory_leak |"
    seed1 = ckpt.metrics["polynomial"]
    assert poly[5] == ("| gated-rnn-zucchet-icl--seed1 | 3 | " + " | ".join(
        f"{seed1[t]:.4g}" for t in ("x1^2 y1", "x2^2 y1", "x3^2 y1", "residual norm")) + f" | {ckpt.metrics['memory_leak']:.4g} |")
    assert poly[7] == "| one GD step (η*) | | 0.06757 | 0.06757 | 0.06757 | 0 | |"


def test_ensemble_sweep_saves_each_member_as_a_checkpoint(local_sweep, tmp_path):
    spec_file = tmp_path / "s.toml"
    spec_file.write_text(SPEC.replace(', "lsa-gd-zucchet-icl"', "") + "ensemble = true\n")
    rows = run_sweep(load_spec(spec_file), tmp_path / "out", progress=False)
    assert [r["status"] for r in rows] == ["built (ensemble of 2)"] * 2
    solo = {r["run"]: r["test_loss"] for r in local_sweep[2]}  # the same seeds trained one by one
    assert [r["test_loss"] for r in rows] == pytest.approx([solo[r["run"]] for r in rows], rel=1e-4)
    ckpt = zoo.load(str(tmp_path / "out" / "gated-rnn-zucchet-icl--seed1"))
    assert ckpt.provenance["ensemble"] == {"members": 2, "seeds": [0, 1]}


@pytest.mark.parametrize("ensemble,seeds", [(False, [0]), (True, [0, 1])])
def test_a_sweep_run_validates_its_entry_once_and_builds_its_model_once(tmp_path, monkeypatch, ensemble, seeds):
    """`expand` validates each (entry, overrides) once and every run carries the result; each run's
    model is built once: no second validation in the builder, no probe model to ask whether the
    family vmaps, no reading an ensemble's members back from disk to fill in their rows."""
    import zoo.running.builder
    import zoo.science.models
    import zoo.storage.checkpoint
    from zoo.science.registry import Entry

    calls = {"validate": 0, "create_model": 0}
    validate, create_model = Entry.model_validate.__func__, zoo.science.models.create_model

    def counted_validate(cls, *args, **kwargs):
        calls["validate"] += 1
        return validate(cls, *args, **kwargs)

    def counted_create_model(*args, **kwargs):
        calls["create_model"] += 1
        return create_model(*args, **kwargs)

    spec = load_spec_text(tmp_path, 'name = "once"\nentries = ["lsa-d10-c10"]\nsteps = 2\ngraphs = false\n'
                          f'seeds = {seeds}\nensemble = {str(ensemble).lower()}\n[grid]\n"source.batch_size" = [8]\n')
    zoo.get_entry("lsa-d10-c10")  # the registry itself is loaded (and validated) once per process, not per run
    monkeypatch.setattr(Entry, "model_validate", classmethod(counted_validate))
    for module in (zoo.science.models, zoo.running.builder, zoo.storage.checkpoint):  # every module that builds models by this name
        monkeypatch.setattr(module, "create_model", counted_create_model)
    rows = run_sweep(spec, tmp_path / "out", progress=False)
    assert [r["status"] for r in rows] == (["built (ensemble of 2)"] * 2 if ensemble else ["built"])
    assert calls == {"validate": 1, "create_model": len(seeds)}


def load_spec_text(tmp_path, text: str):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return load_spec(path)


def test_ensemble_sweep_builds_constructed_and_unvmappable_entries_one_by_one(tmp_path):
    """`ensemble = true` over a mixed spec (the blogpost comparison): a constructed entry and an
    LSTM (fused kernels, no vmap rule) are built run by run instead of failing the sweep."""
    spec_file = tmp_path / "s.toml"
    spec_file.write_text('name = "mixed"\nentries = ["lsa-gd-d10-c10", "lstm-d10-c10"]\nseeds = [0, 1]\nsteps = 2\ngraphs = false\n'
                         'ensemble = true\n')
    rows = run_sweep(load_spec(spec_file), tmp_path / "out", progress=False)
    assert [(r["entry"], r["status"]) for r in rows] == [("lsa-gd-d10-c10", "built")] + [("lstm-d10-c10", "built")] * 2
    assert all(r["test_loss"] > 0 for r in rows)


def test_an_ensemble_sweep_trains_a_recipe_that_skips_one_seed_at_a_time(tmp_path):
    """`lsa-5l-d10-c10` skips overflowing steps (max_skipped_steps), which an ensemble cannot: its
    seeds are built one by one, and the release build does not replay it as a CUDA graph."""
    from zoo.publishing.release import training_mode

    spec_file = tmp_path / "s.toml"
    spec_file.write_text('name = "skips"\nentries = ["lsa-5l-d10-c10"]\nseeds = [0, 1]\nsteps = 2\nensemble = true\ngraphs = false\n')
    rows = run_sweep(load_spec(spec_file), tmp_path / "out", progress=False)
    assert [r["status"] for r in rows] == ["built", "built"]
    assert training_mode("lsa-5l-d10-c10", "cuda")[0] is False
    assert training_mode("lsa-4l-d10-c10", "cuda")[0] is True  # the same model, a recipe that does not skip


def test_task_variants_for_context_size_sweeps(tmp_path):
    from zoo.science.registry import get_task_spec

    entry = with_overrides(zoo.get_entry("lsa-gd-d10-c10"), {"task.n_context": 4})
    assert entry.task == "linreg-d10-c10--n_context=4"
    spec = get_task_spec(entry.task)
    assert spec.n_context == 4 and spec.splits["test"].sha256 is None and spec.splits["test"].seed == 101
    with pytest.raises(RegistryError, match="no such task field"):
        with_overrides(zoo.get_entry("lsa-gd-d10-c10"), {"task.context": 4})
    ckpt = zoo.build(entry, tmp_path / "c4", progress=False, graphs=False)
    assert ckpt.metrics["test_loss"] == pytest.approx(ckpt.metrics["gd_loss"], rel=1e-4)
    assert zoo.load(str(tmp_path / "c4")).task.n_context == 4
    # a constructed entry whose construction no longer fits is refused before building
    with pytest.raises(RegistryError, match="hidden"):
        with_overrides(zoo.get_entry("gated-rnn-gd-zucchet-icl"), {"task.d_x": 4})


def test_cli_set_values_and_bad_set(tmp_path, capsys):
    from zoo.cli import main
    from zoo.cli.build import parse_value

    assert [parse_value(v) for v in ("3e-3", "16", "true", "[8, 16]", "in_out")] == [3e-3, 16, True, [8, 16], "in_out"]
    spec_file = tmp_path / "s.toml"
    spec_file.write_text(SPEC)
    assert main(["sweep", str(spec_file), "--set", "source.lr", "--out", str(tmp_path / "o")]) == 1
    assert "expected FIELD=VALUE" in capsys.readouterr().err
    assert main(["sweep", str(spec_file), "--only", "lsa-gd-zuchet-icl", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "--only lsa-gd-zuchet-icl: not in" in err and "gated-rnn-zucchet-icl, lsa-gd-zucchet-icl" in err
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_cli_only_and_seeds_narrow_a_spec(tmp_path, capsys):
    from zoo.cli import main

    spec_file = tmp_path / "s.toml"
    spec_file.write_text(SPEC)
    assert main(["sweep", str(spec_file), "--only", "gated-rnn-zucchet-icl", "--seeds", "7", "--quiet",
                 "--out", str(tmp_path / "o")]) == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if p.is_dir()) == ["gated-rnn-zucchet-icl--seed7"]
    assert [r["run"] for r in json.loads((tmp_path / "o" / "results.json").read_text())] == ["gated-rnn-zucchet-icl--seed7"]


def test_report_scans_a_task_field(tmp_path):
    """Runs over a task field (tasks `base--field=value`) get a loss-against-field table and figure:
    one row per run less the field, one column per value in numeric order, GD beside it; a run name
    found in two folders is told apart by its steps."""
    def row(model, c, loss, gd, steps=100, cos=0.5):
        return {"model": f"{model}--n_context={c}", "entry": model, "arch": "lsa", "task": f"linreg-d10-c10--n_context={c}",
                "source": "trained", "parameters": 1, "steps": steps, "device": "cpu", "test_loss": loss,
                "gd_loss": gd, "lstsq_loss": 1e-15, "gd_steps": 1, "sensitivity_cosine": cos}
    gd = {2: 1.4, 10: 0.83, 100: 0.15}
    rows = [row("lsa", c, 1.01 * g, g) for c, g in gd.items()] + [row("lstm", c, 1.5, g, 200) for c, g in gd.items()]
    rows.append(row("lstm", 10, 0.9, gd[10], steps=5000))  # the same run, trained longer elsewhere
    md, _, _, scan_png = write_report(rows, tmp_path / "report")
    text = md.read_text()
    heads = [line for line in text.splitlines() if line.startswith("## linreg-d10-c10--")]
    assert heads == [f"## linreg-d10-c10--n_context={c}" for c in (2, 10, 100)]  # natural order, not 10 < 100 < 2
    table = text[text.index("test loss against `task.n_context`"):].splitlines()
    assert table[2:8] == [
        "| model | 2 | 10 | 100 |", "|---|---|---|---|",
        "| GD | 1.4 | 0.83 | 0.15 |", "| least squares | 1e-15 | 1e-15 | 1e-15 |",
        "| lsa | 1.414 (0.500) | 0.8383 (0.500) | 0.1515 (0.500) |",
        "| lstm (200 steps) | 1.5 (0.500) | 1.5 (0.500) | 1.5 (0.500) |",
    ]
    assert table[8] == "| lstm (5000 steps) |  | 0.9 (0.500) |  |"
    assert scan_png.name == "report-linreg-d10-c10-n_context.png" and scan_png.stat().st_size > 10_000


def test_scan_lines_drop_the_overrides_every_run_shares():
    """Scan rows keep only the overrides that tell runs apart; the shared ones are printed once."""
    from zoo.publishing.report import _drop_shared_overrides

    lines = ["gd-ssm-1d--seed0--beta=1--lr=3", "gd-ssm-1d--seed1--beta=1--lr=3",
             "gd-ssm-1d--seed0--key_dim=4--beta=1--lr=3", "gd-ssm-gd-1d--beta=1"]
    rows = [{"line": line} for line in lines]
    _drop_shared_overrides(rows)
    assert [r["line"] for r in rows] == ["gd-ssm-1d--seed0", "gd-ssm-1d--seed1", "gd-ssm-1d--seed0--key_dim=4", "gd-ssm-gd-1d"]
    assert {r["shared"] for r in rows} == {("gd-ssm-1d", "beta=1--lr=3"), ("gd-ssm-gd-1d", "beta=1")}
    single = [{"line": "lsa--seed0--lr=3"}]  # one run of one entry: every override is shared, the name stays readable
    _drop_shared_overrides(single)
    assert single[0]["line"] == "lsa" and single[0]["shared"] == ("lsa", "seed0--lr=3")


def test_report_summarises_seeds_and_regenerates_from_its_json(tmp_path):
    """Runs that differ only in their seed get one mean ± std row (sample std); the report's own
    results.json, given back to `zoo report`, rebuilds the same markdown."""
    def row(seed, loss, cos):
        return {"model": f"gd-ssm-1d--seed{seed}", "entry": "gd-ssm-1d", "arch": "gd_ssm", "task": "gdssm-1d-f10-n10",
                "source": "trained", "parameters": 483, "steps": 300000, "device": "cpu", "test_loss": loss,
                "gd_loss": 0.8385, "lstsq_loss": 1e-7, "gd_steps": 1, "sensitivity_cosine": cos}
    rows = [row(0, 0.84, 0.999), row(1, 0.86, 0.997), row(2, 0.85, 0.998)]
    md, raw, _ = write_report(rows, tmp_path / "a")
    table = md.read_text()[md.read_text().index("## mean ± std over seeds"):].splitlines()
    assert table[2] == "| run | seeds | steps | Test loss (½·MSE) | GD loss | Sensitivity cosine to θ_GD |"
    assert table[4] == "| gd-ssm-1d | 3 | 300000 | 0.85 ± 0.01 | 0.8385 ± 0 | 0.998 ± 0.001 |"
    again, _, _ = write_report(collect([raw]), tmp_path / "b")
    assert again.read_text() == md.read_text()


def test_report_input_scales_and_weights_of_a_construction(tmp_path):
    """On the constructed GD-SSM the input-scale curve is GD's at every α (Figs. 1D/2D) and the
    weights are the construction's (Fig. 3): cosine 1, Λ = 1."""
    from zoo.running.builder import build

    build("gd-ssm-gd-nd", tmp_path / "gd-ssm-gd-nd", progress=False, graphs=False)
    rows = collect([tmp_path / "gd-ssm-gd-nd"], input_scales=[0.5, 2.0], weights=True)
    curve = rows[0]["input_scale_curve"]
    assert [p["input_scale"] for p in curve] == [0.5, 2.0]
    for p in curve:
        assert p["test_loss"] == pytest.approx(p["gd_loss"], rel=1e-5)  # float32 model, float64 GD
    assert curve[1]["gd_loss"] > 10 * curve[0]["gd_loss"]  # η* of scale 1 overshoots at α = 2
    weights = rows[0]["weights_vs_construction"]
    assert weights["tensor_cosine"] == pytest.approx(1, abs=1e-6) and weights["lambda_mean"] == 1.0
    md, _, _, scale_png = write_report(rows, tmp_path / "report")
    text = md.read_text()
    assert "| gd-ssm-gd-nd | 1 |" in text and "weights: function-tensor cosine" in text
    assert scale_png.name == "report-input-scale.png" and scale_png.stat().st_size > 10_000


@pytest.fixture(scope="module")
def constructed_lsa(tmp_path_factory):
    """lsa-gd-zucchet-icl built once for the report tests below, each of which reads a copy (a report reads no
    graphs: none are exported)."""
    from zoo.running.builder import build

    folder = tmp_path_factory.mktemp("constructed") / "lsa"
    build("lsa-gd-zucchet-icl", folder, progress=False, graphs=False)
    return folder


def test_report_analyses_skip_what_they_do_not_apply_to(constructed_lsa, tmp_path):
    """`--weights` on an LSA records why it does not apply instead of stopping the report; a sweep's
    results.json (rows keyed by run) is refused with a pointer to the sweep folder."""
    import shutil

    shutil.copytree(constructed_lsa, tmp_path / "lsa")
    rows = collect([tmp_path / "lsa"], weights=True)
    assert "GD-SSM" in rows[0]["weights_not_applicable"] and "weights_vs_construction" not in rows[0]
    sweep_json = tmp_path / "sweep" / "results.json"
    sweep_json.parent.mkdir()
    sweep_json.write_text(json.dumps([{"run": "lsa-gd-zucchet-icl", "test_loss": 0.1}]))
    with pytest.raises(ValueError, match="not a report's results.json"):
        collect([sweep_json])


def test_report_plots_validation_loss_during_training_and_times_each_decade(constructed_lsa, tmp_path):
    """A checkpoint's training history becomes its row's validation curve (rows without a finite
    validation loss left out), a table of the first evaluation below each decade, and a figure;
    a history that is not a list of rows is refused, naming the file."""
    import shutil

    from zoo.publishing.report import validation_curve
    from zoo.storage.checkpoint import CheckpointError

    folder = tmp_path / "lsa"
    shutil.copytree(constructed_lsa, folder)  # a construction: no history
    assert validation_curve(folder) == [] and "val_curve" not in collect([folder])[0]
    (folder / "training_history.json").write_text(json.dumps([
        {"step": 100, "train_loss": 1.0, "val_loss": 0.5}, {"step": 200, "train_loss": 0.1},
        {"step": 300, "train_loss": 0.01, "val_loss": 0.004}, {"step": 400, "train_loss": None, "val_loss": float("nan")},
        {"step": 500, "train_loss": 1e-4, "val_loss": 2e-5}]))
    assert validation_curve(folder) == [[100, 0.5], [300, 0.004], [500, 2e-5]]
    rows = collect([folder])
    fast = dict(rows[0], model="fast", val_curve=[[100, 0.05], [200, 5e-4], [500, 1e-5]])
    md, raw, *figures = write_report([rows[0], fast], tmp_path / "report")
    table = md.read_text().split("first evaluation below each validation loss")[1].splitlines()
    assert table[2] == "| model | steps | last validation loss | < 1e-1 | < 1e-2 | < 1e-3 | < 1e-4 |"
    assert table[4] == "| fast |  | 1e-05 | 100 | 200 | 200 | 500 |"
    assert table[5] == "| lsa |  | 2e-05 | 300 | 300 | 500 | 500 |"
    png = [f for f in figures if f.name.endswith("-training.png")]
    assert len(png) == 1 and png[0].stat().st_size > 10_000
    again, _, *_ = write_report(collect([raw]), tmp_path / "again")  # the curves travel in results.json
    assert again.read_text() == md.read_text()
    (folder / "training_history.json").write_text(json.dumps({"step": 1}))
    with pytest.raises(CheckpointError, match="not a training history"):
        collect([folder])
