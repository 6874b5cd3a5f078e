"""README.md renders as written (issue 40, item 8): every code fence opens and closes, the CLI lines of
"Using the zoo" sit in a code block, and no fence swallows the prose after it."""

from pathlib import Path

from markdown_it import MarkdownIt

README = Path(__file__).parent.parent / "README.md"


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
