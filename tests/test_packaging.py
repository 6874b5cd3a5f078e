"""The wheel `python -m build --wheel` (or `pip wheel .`) makes holds both import packages, the release and the
card templates: what README's "Which torch" paragraph tells a user to install when icl-zoo is not on a registry."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(out)],
                         capture_output=True, text=True, timeout=600, check=False)
    if run.returncode != 0 and "hatchling" in run.stderr and ("connection" in run.stderr.lower()
                                                                or "no matching distribution" in run.stderr.lower()):
        pytest.skip("no package index to fetch the build backend from")
    assert run.returncode == 0, run.stderr[-2000:]
    (built,) = out.glob("icl_zoo-*.whl")
    return built


def test_the_wheel_holds_both_packages_the_release_and_the_templates(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("zoo/__init__.py", "zoo/cli/__init__.py", "zoo/science/models/base.py", "zoo/science/entries/zucchet.toml",
                   "export/__init__.py", "export/streaming.py", "export/onnx_export.py",
                   "zoo/_release/index.json", "zoo/_release/INDEX.md", "zoo/_release/gated-rnn-zucchet-icl/model.safetensors",
                   "zoo/_model_cards/card.md.j2"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "zoo/_release/.work"))]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "zoo = zoo.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
