"""Every module the package, its tests and scripts import is the standard library's, the
package's own, or a declared dependency of pyproject.toml (the extra it is in for the tests:
`dev`; `ray` only where a missing Ray is handled). A newcomer installs exactly `.[dev]`: an
undeclared import that CI's machine happens to have (scipy came with Ray there) breaks the
newcomer's `pytest` at collection."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Distribution name -> the module it is imported as, where the two differ.
IMPORT_NAMES = {"pyyaml": "yaml", "import-linter": "importlinter"}
LOCAL = {"clustersim", "conftest", "tests"}
# Installed by a declared dependency and imported for its sake (import-linter's import graph).
TRANSITIVE = {"grimp"}


def _requirements(group: list[str]) -> set[str]:
    names = set()
    for requirement in group:
        name = requirement.split(";")[0]
        for mark in "<>=![ ":
            name = name.split(mark)[0]
        names.add(IMPORT_NAMES.get(name.lower(), name.lower().replace("-", "_")))
    return names


def _declared() -> tuple[set[str], set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    return (_requirements(project["dependencies"]), _requirements(extras["dev"]),
            _requirements(extras["ray"]) | {"ray"})


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _undeclared(folder: str, allowed: set[str]) -> dict[str, set[str]]:
    local_scripts = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    local_tests = {p.stem for p in (ROOT / "tests").glob("*.py")}
    known = allowed | set(sys.stdlib_module_names) | LOCAL | local_scripts | local_tests
    if folder != "clustersim":
        known |= TRANSITIVE
    missing = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        unknown = _imports(path) - known
        if unknown:
            missing[str(path.relative_to(ROOT))] = unknown
    return missing


def test_the_package_imports_only_its_dependencies_and_ray_from_its_extra():
    runtime, _dev, ray = _declared()
    assert _undeclared("clustersim", runtime | ray) == {}


def test_tests_and_scripts_import_only_what_dev_and_ray_install():
    runtime, dev, ray = _declared()
    assert _undeclared("tests", runtime | dev | ray) == {}
    assert _undeclared("scripts", runtime | dev | ray) == {}


def test_an_undeclared_import_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from scipy import stats\n", encoding="utf-8")
    assert _imports(module) == {"scipy"}
