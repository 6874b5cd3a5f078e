"""The house's floors: `zoo` and the `export` package import one way, checked by import-linter against the
contracts in pyproject.toml ([tool.importlinter]): CLI → publishing → running → export → storage → science,
the science floor's own order, and a streaming runtime that loads no torch. Imports inside functions count
(grimp reads them), so a deferred import cannot dodge a floor."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint(config: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    return subprocess.run([exe, "--config", str(config), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


def test_every_contract_is_kept():
    run = _lint(ROOT / "pyproject.toml")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in run.stdout


def test_the_contracts_can_fail(tmp_path):
    """The same checker on the floors turned upside down reports the real imports that would break them
    (the CLI imports the publishing floor, the builder the exporter): it reads the code, not a stub."""
    config = tmp_path / "upside_down.toml"
    config.write_text('[tool.importlinter]\nroot_packages = ["zoo", "export"]\n\n[[tool.importlinter.contracts]]\n'
                      'name = "upside down"\ntype = "layers"\n'
                      'layers = ["zoo.science", "zoo.storage", "export", "zoo.running", "zoo.publishing", "zoo.cli"]\n')
    run = _lint(config)
    assert run.returncode == 1 and "upside down BROKEN" in run.stdout
    assert "zoo.cli.hub -> zoo.publishing.hub" in run.stdout and "zoo.running.builder -> export" in run.stdout
