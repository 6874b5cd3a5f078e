"""The declarative registry: every entry validates, bad files fail naming file, entry and field."""

import json
import re
from pathlib import Path

import pytest

import zoo
from zoo.science.models import create_model
from zoo.science.registry import RegistryError, default_registry, get_entry, list_entries, load_registry

GOOD_TASK = """
[tasks.t]
kind = "linear_regression"
d_x = 2
n_context = 4
[tasks.t.splits.test]
seed = 1
"""


def write(tmp_path, text, name="fam.toml"):
    (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("name", [e.name for e in list_entries()])
def test_every_entry_builds_a_model(name):
    entry = get_entry(name)
    task = default_registry().task(entry.task).build()
    model = create_model(entry.arch, task)
    assert model.d_in == task.token_dim
    assert set(default_registry().task(entry.task).splits) == {"validation", "test"}
    assert all(s.sha256 for s in default_registry().task(entry.task).splits.values()), "frozen splits must pin a hash"


def test_list_and_filter():
    assert {e.name for e in zoo.list_entries(source="constructed")} >= {"lsa-gd-d10-c10", "lsa-gd-zucchet-icl"}
    assert all(e.source.kind == "trained" for e in zoo.list_entries(source="trained"))
    assert [e.name for e in zoo.list_entries("zucchet", arch_type="lsa")] == ["lsa-gd-zucchet-icl"]
    assert {e.name for e in zoo.list_entries(arch_type="gated_rnn", source="constructed")} >= {"gated-rnn-gd-zucchet-icl"}


def test_unknown_entry_is_a_clear_error():
    with pytest.raises(RegistryError, match="unknown entry 'lsa-nope'"):
        zoo.get_entry("lsa-nope")


def test_bad_field_names_file_entry_and_field(tmp_path):
    write(tmp_path, GOOD_TASK + """
[models.m-1]
paper = "p"
task = "t"
arch = { type = "lsa", n_layers = 0 }
source = { kind = "constructed", construction = "gd" }
""")
    with pytest.raises(RegistryError) as e:
        load_registry(tmp_path)
    assert "fam.toml: entry 'm-1': field 'arch.n_layers'" in str(e.value)


@pytest.mark.parametrize("snippet,expected", [
    ('arch = { type = "lstm-9000" }', "field 'arch'"),
    ('arch = { type = "lsa", heads = 2 }', "field 'arch.heads': Extra inputs are not permitted"),
    ('arch = { type = "lsa" }\nsource = { kind = "trained", steps = 10 }', "field 'source.batch_size': Field required"),
])
def test_bad_arch_and_recipe_fields(tmp_path, snippet, expected):
    src = '' if "source" in snippet else '\nsource = { kind = "constructed", construction = "gd" }'
    write(tmp_path, GOOD_TASK + f'\n[models.m]\npaper = "p"\ntask = "t"\n{snippet}{src}\n')
    with pytest.raises(RegistryError, match="fam.toml: entry 'm': " + expected.replace("(", r"\(").replace(")", r"\)")):
        load_registry(tmp_path)


def test_unknown_task_and_bad_name(tmp_path):
    write(tmp_path, GOOD_TASK + """
[models.Bad_Name]
paper = "p"
task = "nope"
arch = { type = "lsa" }
source = { kind = "constructed", construction = "gd" }
""")
    with pytest.raises(RegistryError) as e:
        load_registry(tmp_path)
    assert "entry 'Bad_Name': field 'name'" in str(e.value) and "kebab-case" in str(e.value)


def test_bad_task_field_and_bad_toml(tmp_path):
    write(tmp_path, GOOD_TASK.replace("d_x = 2", "d_x = -2"))
    with pytest.raises(RegistryError, match="fam.toml: task 't': field 'd_x'"):
        load_registry(tmp_path)
    write(tmp_path, "[tasks.t\n", name="fam.toml")
    with pytest.raises(RegistryError, match="fam.toml: not valid TOML"):
        load_registry(tmp_path)


@pytest.mark.parametrize("task, message", [
    (GOOD_TASK.replace("d_x = 2", "d_x = 2\nd_y = 2\nlayout = \"products\""), "needs d_y = 1"),  # the task class's own check
    (GOOD_TASK.replace("d_x = 2", "d_x = 2\ntarget = \"sine\""), "sine-wave tasks are 1-D"),
    (GOOD_TASK.replace("n_context = 4\n", ""), "field 'n_context': Field required"),
    (GOOD_TASK.replace("d_x = 2", "d_x = 2\nlayout = \"rows\""), "field 'layout'"),
    ("[tasks.t]\nkind = \"lsa_teacher\"\nd = 3\nx_std = 0\n[tasks.t.splits.test]\nseed = 1\n", "field 'x_std': Input should be greater than 0"),
])
def test_task_fields_are_checked_as_the_task_class_declares_them(tmp_path, task, message):
    """A task's schema comes from its class (types, constraints, defaults, its own checks): each error
    names the file, the task and the field."""
    write(tmp_path, task)
    with pytest.raises(RegistryError, match=f"fam.toml: task 't': .*{message}"):
        load_registry(tmp_path)


def test_a_deviation_names_the_entry_with_the_papers_recipe():
    from zoo.science.registry import get_entry

    entry = get_entry("gated-rnn-zucchet-icl")
    paper = get_entry(entry.paper_recipe)
    assert entry.deviation and paper.source.optimizer == "adamw" and paper.source.recurrent_lr is None
    assert (paper.arch, paper.task, paper.source.steps) == (entry.arch, entry.task, entry.source.steps)


def test_paper_recipe_without_a_deviation_is_refused(tmp_path):
    import shutil

    from zoo.science.registry import ENTRIES_DIR, RegistryError, load_registry

    for f in ENTRIES_DIR.glob("*.toml"):
        shutil.copy(f, tmp_path / f.name)
    path = tmp_path / "zucchet.toml"
    path.write_text(path.read_text().replace('paper_recipe = "gated-rnn-zucchet-icl-b1"', 'paper_recipe = "no-such-entry"'))
    with pytest.raises(RegistryError, match="paper_recipe"):
        load_registry(tmp_path)


TRIPLES_TASK = GOOD_TASK.replace("[tasks.t]", "[tasks.t]\nlayout = \"triples\"")


@pytest.mark.parametrize("task, arch, source, expected", [
    (GOOD_TASK, '{ type = "fast_weight" }', '{ kind = "constructed", construction = "hebbian_gd" }',
     "needs arch type 'fast_weight' on a linear_regression task with layout 'triples'"),
    (TRIPLES_TASK, '{ type = "fast_weight", key_dim = 3 }', '{ kind = "constructed", construction = "hebbian_gd" }',
     "needs key_dim = d_x and value_dim = d_y"),
    (TRIPLES_TASK, '{ type = "fast_weight" }', '{ kind = "constructed", construction = "delta_rule", eta = 0.5 }',
     "needs update = 'delta'"),
    (TRIPLES_TASK, '{ type = "fast_weight" }', '{ kind = "constructed", construction = "hebbian_gd" }',
     "needs position_scale = true"),
    (TRIPLES_TASK, '{ type = "fast_weight", update = "delta" }', '{ kind = "constructed", construction = "delta_rule" }',
     "needs a fixed eta"),
])
def test_fast_weight_constructions_name_what_does_not_fit(tmp_path, task, arch, source, expected):
    write(tmp_path, task + f'\n[models.m]\npaper = "p"\ntask = "t"\narch = {arch}\nsource = {source}\n')
    with pytest.raises(RegistryError, match=f"fam.toml: entry 'm': field 'source.construction': .*{re.escape(expected)}"):
        load_registry(tmp_path)


@pytest.mark.parametrize("source, expected", [
    ('{ kind = "constructed", construction = "gd", compact = true }',
     "field 'source.compact': 'gd' takes no such knob (its knobs: eta)"),
    ('{ kind = "constructed", construction = "gd", eta = -1 }', None),  # a knob's own rules (none here: η < 0 is allowed)
    ('{ kind = "constructed", construction = "nope" }', "field 'source': 'construction' must be one of '"),  # then every name
    ('{ kind = "constructed" }', "field 'source': 'construction' must be one of"),
])
def test_a_construction_takes_the_knobs_its_family_declares(tmp_path, source, expected):
    write(tmp_path, GOOD_TASK + f'\n[models.m]\npaper = "p"\ntask = "t"\narch = {{ type = "lsa" }}\nsource = {source}\n')
    if expected is None:
        load_registry(tmp_path)
        return
    with pytest.raises(RegistryError, match=re.escape(f"fam.toml: entry 'm': {expected}")):
        load_registry(tmp_path)


def test_construction_sources_are_the_families_knobs():
    """A constructed source is `kind`, `construction` and exactly the knobs its rule declares (ConstructionRule.knobs)."""
    from zoo.science.models import CONSTRUCTIONS
    from zoo.science.registry import CONSTRUCTION_SOURCES, Construction

    assert set(CONSTRUCTION_SOURCES) == set(CONSTRUCTIONS)
    for name, (_, rule) in CONSTRUCTIONS.items():
        source = Construction.of(name)
        assert isinstance(source, Construction) and source.construction == name
        assert set(type(source).model_fields) == {"kind", "construction"} | set(rule.knobs.model_fields), name


def test_a_constructed_checkpoint_of_an_older_zoo_still_validates():
    """Before each construction declared its knobs, a config.json held the one schema's four (lsa, scale,
    compact, eta) for every construction: those it did not read, at their defaults, are dropped on load
    (outside the registry), and its fingerprint is the one it was built with. Anything else is refused."""
    from zoo.science.registry import Entry, definition_sha256, get_task_spec

    entry = get_entry("lsa-gd-d10-c10")
    data, task = entry.model_dump(mode="json"), get_task_spec(entry.task).model_dump(mode="json")
    legacy = {**data, "source": {"kind": "constructed", "construction": "gd", "lsa": "gd", "scale": 0.01,
                                 "compact": False, "eta": "analytic"}}
    assert Entry.model_validate(legacy).source == entry.source
    assert definition_sha256(legacy, task) == definition_sha256(data, task)
    with pytest.raises(ValueError, match="compact"):
        Entry.model_validate({**legacy, "source": {**legacy["source"], "compact": True}})


CITED = GOOD_TASK + """
[paper]
citation = "@article{x2024, title = {X}}"
prose = "The setting of paper X."
links = { "Paper X" = { arxiv = "2401.00001", title = "X" } }
[models.m]
paper = "Paper X, Table 1"
task = "t"
arch = { type = "lsa" }
source = { kind = "constructed", construction = "gd" }
"""


def test_an_entry_file_carries_its_own_citation(tmp_path, monkeypatch):
    """A file's [paper] table is what its entries' cards cite, link and tag (papers.toml not needed)."""
    from zoo.science import registry
    from zoo.storage import card

    reg = load_registry(write(tmp_path, CITED))
    monkeypatch.setattr(registry, "default_registry", lambda: reg)
    entry = reg.entries["m"]
    assert card.citation(entry) == "@article{x2024, title = {X}}"
    assert card.prose(entry).endswith("The setting of paper X.")
    assert {"title": "X", "href": "https://arxiv.org/abs/2401.00001", "arxiv": "2401.00001"} in card.paper_links(entry)
    write(tmp_path, CITED.replace('arxiv = "2401.00001", ', ""))
    with pytest.raises(RegistryError, match="fam.toml: table 'paper': field 'links.Paper X': .*'arxiv' or 'url'"):
        load_registry(tmp_path)


def test_the_zoo_files_without_a_paper_table_cite_papers_toml():
    from zoo.storage import card

    entry = get_entry("gated-rnn-zucchet-icl")
    assert "zucchet2023gated" in card.citation(entry) and "Zucchet et al." in card.prose(entry)
    assert any(link["arxiv"] == "2309.01775" for link in card.paper_links(entry))


def test_every_metric_evaluation_writes_is_declared_once():
    """zoo/science/metrics.py is the one list of metrics: a card, a report and a sweep take labels and
    columns from it, and every scalar a built checkpoint's evaluation writes is in it."""
    from zoo.publishing.report import COLUMNS
    from zoo.running.sweep import RESULT_COLUMNS
    from zoo.science import metrics
    from zoo.storage.card import METRIC_NAMES

    assert len(metrics.BY_KEY) == len(metrics.METRICS)
    assert set(METRIC_NAMES) | set(RESULT_COLUMNS) <= set(COLUMNS) == set(metrics.BY_KEY)
    assert all(METRIC_NAMES[k] == metrics.label(k) for k in METRIC_NAMES)
    released = json.loads((Path(__file__).parents[1] / "release" / "gated-rnn-zucchet-icl" / "eval_results.json").read_text())
    scalars = {k for k, v in released.items() if isinstance(v, (int, float)) and k not in ("n_tasks", "gd_eta")}
    assert scalars <= set(metrics.BY_KEY), scalars - set(metrics.BY_KEY)


def test_a_family_is_one_module():
    """Everything a family declares (schema, build, construction rules, card prose, weight figure)
    comes from the module of its model, and the registry's arch schemas and construction names are
    exactly the families'."""
    from typing import get_args

    from zoo.science.models import CONSTRUCTIONS, FAMILIES, FAMILY_OF_TYPE
    from zoo.science.registry import Arch, ConstructionName

    assert {f.name for f in FAMILIES} >= {"lsa", "gated_rnn", "gd_ssm", "fast_weight", "stack", "softmax_transformer"}
    for family in FAMILIES:
        home = family.build.__module__
        assert family.arch.__module__ == home and family.card.strip(), family.name
        if family.weights is not None:
            assert getattr(family.weights.matrices, "__module__", home) == home, family.name
        for name, rule in family.constructions.items():
            assert getattr(rule.problem, "func", rule.problem).__module__ == home, (family.name, name)
    assert set(get_args(get_args(Arch)[0])) == {f.arch for f in FAMILIES}
    assert set(get_args(ConstructionName)) == set(CONSTRUCTIONS)
    used = {e.arch.type for e in list_entries()}
    assert used <= set(FAMILY_OF_TYPE), used - set(FAMILY_OF_TYPE)


def test_a_construction_on_the_wrong_type_of_a_family_names_the_type_it_needs():
    from zoo.science.models import construction_problem
    from zoo.science.registry import Construction, get_task_spec

    entry = get_entry("lstm-gd-zucchet-icl")
    gru = entry.arch.model_copy(update={"type": "gru"})
    source = Construction.of("lstm_from_lsa")
    assert construction_problem(gru, get_task_spec(entry.task), source) == "'lstm_from_lsa' needs arch type 'lstm'"
    assert construction_problem(entry.arch, get_task_spec(entry.task), source) is None


def test_the_two_lstm_construction_names_the_stack_it_needs():
    from zoo.science.models import construction_problem
    from zoo.science.registry import get_task_spec

    entry = get_entry("lstm2-gd-zucchet-icl")
    task = get_task_spec(entry.task)
    assert construction_problem(entry.arch, task, entry.source) is None
    for wrong in ({"width": 144}, {"n_layers": 1}, {"residual": True}):
        assert construction_problem(entry.arch.model_copy(update=wrong), task, entry.source) == (
            "'lstm_from_gated_rnn' needs two 'lstm' layers of width 2·max(n, m) = 84 without residual")
    compact = entry.source.model_copy(update={"compact": True})  # θ_GD's W_V is singular: refused before building
    assert "needs an invertible W_V" in construction_problem(entry.arch.model_copy(update={"width": 72}), task, compact)
    lru = get_entry("lru-in-out-gd-zucchet-icl")
    assert construction_problem(lru.arch, task, lru.source) is None
    assert construction_problem(lru.arch.model_copy(update={"residual": None}), task, lru.source) == (
        "'lru_from_gated_rnn' with variant 'in_out' needs 1 'lru' layer(s) of width 84, hidden 42 and residual = false")


# ---------------------------------------------------------------- expected values: their source and their claim
EXPECTED_ENTRY = GOOD_TASK + """
[models.m]
paper = "p"
task = "t"
arch = { type = "lsa" }
source = { kind = "constructed", construction = "gd" }
"""


@pytest.mark.parametrize("expected, message", [
    ("value = 0.5\nrel_tol = 0.03", "field 'source' is required"),
    ('value = 0.5\nrel_tol = 0.03\nsource = "paper"', "needs the paper's words (quote) and where they are (section)"),
    ('value = 0.5\nrel_tol = 0.03\nsource = "reference"', "a reference value needs a note"),
    ('value = 0.5\nsource = "reference"\nnote = "closed form"', "kind 'within' needs one tolerance"),
    ('value = 0.5\nsource = "reference"\nnote = "n"\nkind = "paired_gd"', "gd_value"),
    ('value = 0.5\ngd_value = 0.49\nsource = "reference"\nnote = "n"\nkind = "paired_gd"', "gd_value must equal value"),
    ('value = 0.5\ngd_value = 0.5\nrel_tol = 0.01\nsource = "paper"\nquote = "q"\nsection = "s"\nkind = "paired_gd"',
     "against the paper's gap"),
    ('value = 0.5\ngd_value = 0.5\nlog10_tol = 1\nsource = "reference"\nnote = "n"\nkind = "paired_gd"', "no log10_tol"),
])
def test_an_expected_value_says_where_it_comes_from(tmp_path, expected, message):
    write(tmp_path, EXPECTED_ENTRY + "[models.m.expected.test_loss]\n" + expected + "\n")
    with pytest.raises(RegistryError, match="fam.toml: entry 'm': field 'expected.test_loss': .*" + re.escape(message)):
        load_registry(tmp_path)


def test_every_registry_expected_value_is_sourced():
    for entry in list_entries():
        for key, exp in entry.expected.items():
            assert exp.source in ("paper", "reference"), (entry.name, key)
            if exp.source == "paper":
                assert exp.quote and exp.section, (entry.name, key)


def test_deviations_are_declared_once_and_named(tmp_path):
    dev = '[deviations.d]\nwhat = "w"\npaper = "the paper says"\nzoo = "the zoo does"\nwhy = "because"\n'
    write(tmp_path, dev + EXPECTED_ENTRY + 'deviation = ["d"]\n')
    (entry,) = load_registry(tmp_path).entries.values()
    assert [(d.id, d.paper, d.zoo, d.why) for d in entry.deviation] == [("d", "the paper says", "the zoo does", "because")]
    write(tmp_path, dev + EXPECTED_ENTRY + 'deviation = ["nope"]\n')
    with pytest.raises(RegistryError, match=r"field 'deviation': no \[deviations.nope\]"):
        load_registry(tmp_path)
    write(tmp_path, dev + EXPECTED_ENTRY)
    with pytest.raises(RegistryError, match=r"\[deviations.d\] is declared but no entry names it"):
        load_registry(tmp_path)
    write(tmp_path, dev.replace('why = "because"\n', "") + EXPECTED_ENTRY + 'deviation = ["d"]\n')
    with pytest.raises(RegistryError, match="field 'deviation.0': .*'why'"):
        load_registry(tmp_path)


def test_the_fingerprint_covers_only_what_determines_the_weights():
    """Expected values, tolerances, notes, declared departures and a task's description are documentation:
    changing them never makes a released entry stale (zoo release refresh re-renders cards and index)."""
    from zoo.science.registry import definition_sha256, get_task_spec

    entry = get_entry("gated-rnn-zucchet-icl")
    data, task = entry.model_dump(mode="json"), get_task_spec(entry.task).model_dump(mode="json")
    base = definition_sha256(data, task)
    edited = {**data, "expected": {}, "deviation": [], "description": "other", "paper": "other"}
    assert definition_sha256(edited, {**task, "description": "other", "paper": "other"}) == base
    assert definition_sha256({**data, "source": {**data["source"], "lr": 2e-3}}, task) != base
    assert definition_sha256(data, {**task, "n_context": 11}) != base


def test_a_checkpoint_of_an_older_zoo_still_validates():
    """config.json of earlier releases: expected values without a source, a deviation as one sentence."""
    from zoo.science.registry import Entry

    data = get_entry("gated-rnn-zucchet-icl").model_dump(mode="json")
    data["expected"] = {"test_loss": {"value": 0.0945, "rel_tol": 0.03, "log10_tol": None, "note": ""}}
    data["deviation"] = "Adam with L2"
    entry = Entry.model_validate(data)
    assert entry.expected["test_loss"].source is None and entry.deviation[0].zoo == "Adam with L2"


def test_claims_are_checked_as_what_they_are():
    from zoo.science.expected import check, verdict
    from zoo.science.registry import Entry, Expected

    def entry(**expected):
        data = get_entry("lsa-gd-zucchet-icl").model_dump(mode="json")
        return Entry.model_validate({**data, "expected": expected})

    paper = {"source": "paper", "quote": "q", "section": "s"}
    bound = entry(test_loss=Expected(value=5e-8, kind="at_most", log10_tol=1.0, **paper))
    (c,) = check(bound, {"test_loss": 1.6e-9})  # 1.5 decades below an upper bound: it holds
    assert (c.status, c.meets) == ("meets", True) and verdict([c]) == "meets"
    (c,) = check(bound, {"test_loss": 0.0})  # no log-scale comparison: not checkable, not a pass
    assert c.status == "not checkable" and not c.meets and verdict([c]) == "meets where checkable"
    score = entry(q_score=Expected(value=2.06e-10, kind="at_most", **paper))  # 1 − R², no margin
    (c,) = check(score, {"q_score": 0.0})  # a blind score's 0 (an older evaluation: no span recorded) is no pass
    assert c.status == "not checkable" and not c.meets
    blind = {"forget_neurons": 30, "score_span": 14}  # 30 neurons span all 14 quadratics at d = 4: blind
    assert check(score, {"q_score": 1e-13, **blind})[0].status == "not checkable"  # rounding noise is no pass either
    small = {"forget_neurons": 4, "score_span": 14}  # the paper's 4 query neurons: the score can tell
    assert check(score, {"q_score": 0.0, **small})[0].meets and check(score, {"q_score": 1e-10, **small})[0].meets
    assert not check(score, {"q_score": 1e-9, **small})[0].meets
    ref = entry(test_loss=Expected(value=0.825, rel_tol=0.03, source="reference", note="closed form"))
    (c,) = check(ref, {"test_loss": 0.9})
    assert c.status == "differs from the reference" and verdict([c]) == "differs from the reference"
    paired = entry(test_loss=Expected(value=0.0945, gd_value=0.0947, kind="paired_gd", **paper))
    (c,) = check(paired, {"test_loss": 0.1, "gd_loss": 0.1})
    assert c.status == "not checkable"  # no paired difference measured
    ok = {"gd_loss": 0.1, "gd_paired_diff": 1e-5, "gd_paired_se": 2e-5, "gd_paired_n": 10_000}
    assert check(paired, ok)[0].meets  # +0.01% ± 0.02%: within the paper's 0.21% gap
    assert not check(paired, {**ok, "gd_paired_diff": 1e-3, "gd_paired_se": 1e-5})[0].meets  # +1% ± 0.01%
    # a reference comparison (the closed form as both values) holds within 2 s.e. and its declared margin, if any,
    # and never says "paper"
    same = entry(test_loss=Expected(value=0.0946, gd_value=0.0946, kind="paired_gd", source="reference", note="closed form"))
    (c,) = check(same, ok)  # +0.01% ± 0.02%: within 2 s.e.
    assert c.status == "matches the reference" and "paper" not in c.tolerance and c.tolerance == "gap within ±2 s.e."
    off = {**ok, "gd_paired_diff": 5e-5, "gd_paired_se": 2e-5}  # +0.05% ± 0.02%: 2.5 s.e. off
    (c,) = check(same, off)
    assert c.status == "differs from the reference" and not c.meets
    margin = entry(test_loss=Expected(value=0.0946, gd_value=0.0946, kind="paired_gd", source="reference", rel_tol=0.0021,
                                      note="closed form"))
    (c,) = check(margin, off)  # 0.05% ≤ 0.21% + 0.04%
    assert c.status == "matches the reference" and c.tolerance == "gap within ±(0.21% + 2 s.e.)"
    assert not check(margin, {**ok, "gd_paired_diff": 3e-4, "gd_paired_se": 1e-5})[0].meets  # 0.3% > 0.21% + 0.02%


def test_an_override_that_ends_a_departure_drops_it_from_the_run():
    """A deviation's `lifted_by` fields: a run with positions is not "without a positional encoding", and a run at
    another width is not "one width, 64" (their cards would declare what they no longer do). Other overrides keep
    every departure, and `lifted_by` never reaches a checkpoint's config (model_dump)."""
    from zoo.science.registry import get_entry, with_overrides

    ids = lambda e: [d.id for d in e.deviation]  # noqa: E731
    lsa = get_entry("lsa-2l-gdssm-nd")
    assert "lsa-no-positions" in ids(lsa)
    assert ids(with_overrides(lsa, {"arch.positions": 21})) == [i for i in ids(lsa) if i != "lsa-no-positions"]
    assert ids(with_overrides(lsa, {"source.lr": 1e-3})) == ids(lsa)
    gru = get_entry("gru-zucchet-icl")
    assert ids(with_overrides(gru, {"arch.width": 16})) == [i for i in ids(gru) if i != "zucchet-one-width"]
    assert "lifted_by" not in str(with_overrides(lsa, {"source.lr": 1e-3}).model_dump())


def test_an_overridden_run_says_its_description_is_the_registered_entrys():
    """A registered description can state what an override changes ("width = hidden = 60, 22,626 parameters"):
    the run's entry keeps the text and says, after it, which fields this run overrides."""
    from zoo.science.registry import get_entry, with_overrides

    student = get_entry("lru-out-student-d6")
    run = with_overrides(student, {"arch.width": 16, "arch.n_layers": 2})
    assert run.description == (f"{student.description} (As registered; this run overrides arch.width = 16, "
                               "arch.n_layers = 2.)")
    assert run.model_dump(mode="json")["description"] == run.description  # what config.json and the card carry


@pytest.mark.parametrize("name,field,rows", [("lsa-2l-gdssm-nd", "positions", 5), ("softmax-tf-1l-d10-c10", "max_len", 5)])
def test_a_position_table_shorter_than_the_prompt_is_refused_when_validated(name, field, rows):
    """An override that gives a model fewer position rows than its task's prompt has tokens is refused by the
    registry in one line naming the field (length_problem), before anything trains; as many rows as tokens pass."""
    from zoo.science.registry import get_task_spec, with_overrides

    entry = get_entry(name)
    n_tokens = get_task_spec(entry.task).build().n_tokens
    with pytest.raises(RegistryError, match=rf"field 'arch\.{field}': {rows} positions cannot read this task's "
                                            rf"{n_tokens}-token prompts \(needs at least {n_tokens}\)"):
        with_overrides(entry, {f"arch.{field}": rows})
    assert getattr(with_overrides(entry, {f"arch.{field}": n_tokens}).arch, field) == n_tokens
