"""README.md renders as written (issue 40, item 8): every code fence opens and closes, the CLI lines of
"Using the zoo" sit in a code block, and no fence swallows the prose after it. Every relative link of the
README and the report pages resolves, and generated report files sit apart from the written pages."""

from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


def test_readme_fences_render_as_code_and_prose_stays_prose():
    text = README.read_text()
    tokens = MarkdownIt("commonmark").parse(text)
    fences = [t for t in tokens if t.type == "fence"]
    assert fences and all(t.info in ("bash", "python", "toml", "text", "json") for t in fences), \
        [(t.map, t.info) for t in fences if t.info not in ("bash", "python", "toml", "text", "json")]
    assert not [t for t in tokens if t.type == "code_block"], "an indented block: a fence lost its opening"
    code = "\n".join(t.content for t in fences)
    assert "zoo list " in code and "zoo build lsa-d10-c10 --out ckpt/lsa" in code  # the CLI lines are code
    prose = "\n".join(t.content for t in tokens if t.type == "inline")
    assert "Frozen splits are built from their seeds on first use" in prose  # not swallowed by a fence
    assert "Frozen splits are built" not in code
    for t in fences:  # a fence never holds the start of a section or a stray fence line
        assert "\n## " not in "\n" + t.content and "```" not in t.content, t.map


def _pages() -> list[Path]:
    """The README and the hand-written report pages (reports/<paper>/*.md; what scripts and sweeps write
    sits in reports/<paper>/generated/)."""
    return [ROOT / "README.md", ROOT / "reports" / "README.md", *sorted((ROOT / "reports").glob("*/*.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_a_page_resolves(page):
    import re

    text = page.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
    local = [t.split("#")[0] for t in targets if not re.match(r"^(https?:|mailto:|#)", t) and t.split("#")[0]]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: links to missing files {missing}"


def test_reports_keep_generated_files_apart():
    """A paper's folder holds its hand-written pages (*.md), the paper's own numbers transcribed by hand
    (plotted-values.json: the blogpost's plots, an input the pages and scripts cite) and one `generated/`
    folder (what scripts, sweeps and `zoo report` wrote), nothing else."""
    written = {"plotted-values.json", "generated"}
    for paper in sorted(p for p in (ROOT / "reports").iterdir() if p.is_dir()):
        stray = [p.name for p in paper.iterdir() if not (p.suffix == ".md" and p.is_file()) and p.name not in written]
        assert not stray, f"{paper.relative_to(ROOT)}: {stray} belong in generated/"


def test_the_reports_readme_counts_are_the_release_index_s():
    """reports/README.md's counts and reference table are generated from release/index.json
    (zoo.publishing.report.write_release_summary), and its hand-written table of paper verdicts lists every
    entry the index grades against a paper value."""
    from zoo.publishing.report import readme_release_block, release_counts, release_summary
    from zoo.storage.locate import read_index

    index, page = read_index(), ROOT / "reports" / "README.md"
    assert readme_release_block(page) == release_summary(index), \
        "stale: python -c 'from pathlib import Path; from zoo.publishing.report import write_release_summary; " \
        "from zoo.storage.locate import read_index; write_release_summary(Path(\"reports/README.md\"), read_index())'"
    counts = release_counts(index)
    rows = index["entries"].values()
    assert counts["entries"] == len(index["entries"]) == counts["trained"] + counts["constructed"]
    assert counts["departures"] == sum(1 for r in rows if r["deviations"])
    assert counts["no_expected"] == sum(1 for r in rows if r["verdict"] == "no paper value")
    block = readme_release_block(page)
    assert f"holds {counts['entries']} entries: {counts['trained']} trained" in block
    assert f"{counts['departures']} of the {counts['entries']} entries declare departures" in block
    assert f"{counts['no_expected']} entries have no expected value" in block
    for r in rows:  # every reference-checked entry in the generated table, every paper verdict in the written one
        checks = r["checks"]
        if checks and all(c["source"] == "reference" for c in checks):
            assert f"| `{r['entry']}` | {r['source']} |" in block, r["entry"]
        if r["verdict"] in ("meets", "falls short", "meets where checkable"):
            assert f"| `{r['entry']}` |" in page.read_text().split(block)[1], r["entry"]
        elif r["source"] == "constructed":  # every constructed entry: checked against a reference, or beside its GD
            assert f"| `{r['entry']}` |" in block, r["entry"]


def test_release_counts_of_a_small_index():
    from zoo.publishing.report import release_counts, release_summary

    def row(name, source, steps=None, recipe=None, deviations=(), checks=(), verdict="no paper value", threads=1):
        return {"entry": name, "source": source, "steps": steps, "recipe_steps": recipe, "deviations": list(deviations),
                "checks": list(checks), "verdict": verdict, "threads": threads}

    ref = {"metric": "test_loss", "kind": "within", "value": 0.5, "tolerance": "±3%", "measured": 0.49,
           "source": "reference"}
    index = {"version": "v9", "entries": {r["entry"]: r for r in (
        row("a", "trained", 100, 100, ["d"], threads=2), row("b", "trained", 50, 100),
        row("c", "constructed", checks=[ref], verdict="matches the reference"),
        row("d", "trained", 10, 10, ["d"], [{**ref, "source": "paper"}], "falls short"),
        {**row("e", "constructed"), "test_loss": 0.2, "gd_loss": 0.25, "gd_steps": 2},
        {**row("f", "constructed"), "test_loss": 0.25 * (1 + 2e-8), "gd_loss": 0.25, "gd_steps": 1},
        {**row("g", "constructed"), "test_loss": float("nan"), "gd_loss": 0.25})}}
    c = release_counts(index)
    assert (c["entries"], c["trained"], c["constructed"], c["full_recipe"]) == (7, 3, 4, 2)
    assert c["short"] == [("b", 50, 100)] and c["threads"] == {1: 1, 2: 1}  # the full-recipe runs only: a and d
    assert (c["departures"], c["fall_short"], c["match_reference"], c["no_expected"]) == (2, 1, 1, 5)
    text = release_summary(index)
    assert "`b` (50 of 100 steps)" in text and "| `c` | constructed | — | test_loss: 0.5 (±3%) → 0.49 |" in text
    assert "| `d` |" not in text  # graded against a paper value: the written table's, not this one
    # a constructed entry with no expected value is listed beside its GD reference; a tiny gap is not "-0.00%"
    assert "| `e` | 0.2 | 0.25 (2) | -20.00% |" in text and "| `f` | 0.25 | 0.25 (1) | +2.0e-08 |" in text
    assert "| `g` | — | 0.25 | — |" in text  # a NaN loss and no step count: a dash, not "nan" or "(None)"
