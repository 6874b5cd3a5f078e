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
