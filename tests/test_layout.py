"""The package's layout holds: no module over 500 lines, the scripts' included (split along
the concepts inside it instead), and docs/contributing.md's map of the packages matches the tree."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clustersim"
MAX_LINES = 500


def test_no_module_is_over_500_lines():
    modules = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
    long = {str(p.relative_to(ROOT)): n for p in modules
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines (split them): {long}"


def _layout_section() -> str:
    text = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    return text.split("## Layout", 1)[1].split("\n## ", 1)[0]


def test_the_layout_map_names_every_package():
    section = _layout_section()
    named = set(re.findall(r"^ {6}(\w+)/", section, flags=re.M))
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages <= named, f"packages missing from the map: {sorted(packages - named)}"
    assert named <= packages, f"the map names packages that do not exist: {sorted(named - packages)}"


def test_every_module_the_map_names_exists():
    """Each package's entry names its modules (as `name`, the first word of a clause); each
    one named exists in that package, and each module of the package is named."""
    section = _layout_section()
    entries = re.split(r"^ {6}(?=\w+/)", section, flags=re.M)[1:]
    for entry in entries:
        package, text = entry.split("/", 1)
        modules = {p.stem for p in (PACKAGE / package).glob("*.py")} - {"__init__"}
        words = set(re.findall(r"[a-z_0-9]+", text))
        named = {w for w in words if w in modules}
        missing = modules - named
        assert not missing, f"{package}/: modules not in the map: {sorted(missing)}"


def _import_cycles():
    pytest.importorskip("grimp")  # installed with import-linter
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from import_cycles import import_cycles
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return import_cycles


def test_no_import_cycle_but_for_annotations():
    """Modules import each other in one direction; a cycle only through `if TYPE_CHECKING:`
    imports (scripts/import_cycles.py lists them, and CI prints them)."""
    assert _import_cycles()() == []


def test_cluster_has_no_import_cycle_even_for_annotations():
    """The timeline's collaborators see it through their ports (clustersim.cluster.ports),
    not by its class: not even an annotation closes a circle in cluster/."""
    cycles = _import_cycles()(type_checking=True)
    assert [c for c in cycles if any(m.startswith("clustersim.cluster.") for m in c)] == []


def test_no_collaborator_imports_the_timeline():
    """Not even under `if TYPE_CHECKING:` (import-linter's contracts leave those out)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("clustersim", exclude_type_checking_imports=False, cache_dir=None)
    importers = graph.find_modules_that_directly_import("clustersim.cluster.timeline")
    assert sorted(m for m in importers if m.startswith("clustersim.cluster.")) == []


def test_ci_prints_the_import_cycles():
    assert "scripts/import_cycles.py" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
