"""The layering rule is enforced: the import-linter contract in pyproject.toml holds on the
package, and breaks as soon as a lower layer imports a higher one (skipped without
import-linter). The command-line shell stays light."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = shutil.which("lint-imports")

needs_linter = pytest.mark.skipif(LINT_IMPORTS is None,
                                reason="import-linter is not installed (pip install -e '.[dev]')")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """lint-imports on the copy of the project in `tree` (its package, its pyproject.toml)."""
    assert LINT_IMPORTS is not None
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([LINT_IMPORTS, "--no-cache", "--no-logo"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package and its configuration, to be broken at will."""
    shutil.copytree(ROOT / "clustersim", tmp_path / "clustersim",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@needs_linter
def test_the_package_keeps_its_layers(tree: Path):
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


@needs_linter
@pytest.mark.parametrize(("module", "upward"), [
    ("hardware/units.py", "clustersim.cli"),  # the bottom importing the top
    ("scenario/models.py", "clustersim.cluster.timeline"),  # one layer reaching up two
    ("training/step.py", "clustersim.runner.api"),
    ("cluster/scheduler.py", "clustersim.cluster.timeline"),  # a collaborator its timeline
    ("runner/sweep.py", "clustersim.planning.serving_plan"),  # the runner planning
])
def test_an_upward_import_breaks_the_contract(tree: Path, module: str, upward: str):
    path = tree / "clustersim" / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _upward():\n    import {upward}"
                    f"  # noqa\n", encoding="utf-8")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout or "broken" in result.stdout
    importer = "clustersim." + module.removesuffix(".py").replace("/", ".")
    assert importer in result.stdout and upward in result.stdout


def test_lint_imports_runs_in_ci():
    assert "lint-imports" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_command_line_shell_loads_no_heavy_layer():
    """`clustersim --version` and `--help` import the CLI modules only: the layers (and numpy,
    pandas, pydantic, networkx, simpy) are imported inside the commands that use them."""
    code = ("import sys, clustersim, clustersim.cli.app; "
            "print(sorted(m for m in ('numpy', 'pandas', 'pydantic', 'networkx', 'simpy', "
            "'clustersim.runner', 'clustersim.scenario', 'clustersim.hardware') "
            "if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
