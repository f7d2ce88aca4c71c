"""Regression checks: re-run reference scenarios and compare with their golden summaries.

Goldens are `results/<scenario name>/summary.json`, committed, with the volatile fields
(`wall_s`, `clustersim_version`) removed and every float rounded to 6 significant digits.
`clustersim check` re-runs each reference scenario (a file in `scenarios/` with a golden) and
reports every figure that moved by more than 1e-5 relative (a readable diff; exit 1); a
golden that cannot be read or written is exit 2, and so (with no scenario named) is a
scenario of the library that no longer loads or a golden no scenario names (renamed or
deleted): reported, never skipped;
`clustersim check --update` rewrites the goldens, deliberately. The quickstart scenario has no
golden: its default output folder is where the README's first command writes; nor has the
fleet benchmark, fleet-100k-month (minutes a run: scripts/bench.py times it instead).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clustersim.analysis.runs import figures_problem
from clustersim.hardware import limits
from clustersim.runner.api import simulate
from clustersim.runner.earlier_runs import holds_golden
from clustersim.runner.outputs import OutputDirError
from clustersim.scenario.loader import Issue, ScenarioError, load_scenario
from clustersim.scenario.reading import regular_file_problem

__all__ = ["SIGNIFICANT_DIGITS", "RELATIVE_TOLERANCE", "VOLATILE", "CheckResult", "normalise",
           "differences", "golden_path", "reference_scenarios", "check_scenario", "read_golden",
           "write_golden", "References", "references"]

SIGNIFICANT_DIGITS = 6
RELATIVE_TOLERANCE = 1e-5
VOLATILE = ("wall_s", "clustersim_version")
# quickstart's folder is the README command's output; fleet-100k-month is the fleet benchmark
# (100,000 jobs: minutes per run), trn2-512k-year the year benchmark (over a minute) and
# rainier-year the fleet year (a million jobs: too long for a check),
# timed by scripts/bench.py rather than checked.
NOT_REFERENCE = ("quickstart", "fleet-100k-month", "trn2-512k-year", "rainier-year")


def _round(value: float) -> float:
    if value == 0 or not math.isfinite(value):
        return value
    digits = SIGNIFICANT_DIGITS - 1 - int(math.floor(math.log10(abs(value))))
    return round(value, digits)


def normalise(summary: Any, top: bool = True) -> Any:
    """Volatile fields out, floats rounded: what a golden holds."""
    if isinstance(summary, dict):
        return {k: normalise(v, False) for k, v in summary.items()
                if not (top and k in VOLATILE)}
    if isinstance(summary, list):
        return [normalise(v, False) for v in summary]
    if isinstance(summary, float):
        return _round(summary)
    return summary


def differences(golden: Any, now: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, golden, now) for every figure that differs beyond the tolerance."""
    if isinstance(golden, dict) and isinstance(now, dict):
        out = []
        for key in list(dict.fromkeys(list(golden) + list(now))):
            where = f"{path}.{key}" if path else str(key)
            if key not in golden:
                out.append((where, "(absent)", now[key]))
            elif key not in now:
                out.append((where, golden[key], "(absent)"))
            else:
                out += differences(golden[key], now[key], where)
        return out
    if isinstance(golden, list) and isinstance(now, list) and len(golden) == len(now):
        out = []
        for index, (a, b) in enumerate(zip(golden, now, strict=True)):
            out += differences(a, b, f"{path}.{index}")
        return out
    numbers = (int, float)
    if (isinstance(golden, numbers) and isinstance(now, numbers)
            and not isinstance(golden, bool) and not isinstance(now, bool)):
        if golden == now or abs(golden - now) <= RELATIVE_TOLERANCE * max(abs(golden), abs(now)):
            return []
        return [(path, golden, now)]
    return [] if golden == now else [(path, golden, now)]


def golden_path(root: Path, name: str) -> Path:
    return root / "results" / name / "summary.json"


@dataclass
class References:
    """The library's reference scenarios, and what stops one being checked: a scenario
    file that does not load (path, error) and a golden no scenario names (its folder)."""

    scenarios: list[Path] = field(default_factory=list)
    invalid: list[tuple[Path, str]] = field(default_factory=list)
    orphaned: list[Path] = field(default_factory=list)


def references(root: Path) -> References:
    """Every scenario of the library that has a golden; every scenario file that no longer
    loads (a regression `check` reports, not skips); every golden (a `summary.json` under
    results/ without the volatile fields) no scenario names (renamed or deleted)."""
    found = References()
    named = set()
    for path in sorted((root / "scenarios").glob("*.yaml")):
        written = None
        try:
            # (a benchmark's name is read before the whole file: rainier-year's million
            # jobs take a minute to load)
            written = yaml.safe_load(path.read_text(encoding="utf-8"))
            if isinstance(written, dict) and isinstance(written.get("name"), str):
                named.add(written["name"])
            if isinstance(written, dict) and written.get("name") in NOT_REFERENCE:
                continue
            name = load_scenario(path).name
        except Exception as error:  # reported, not skipped
            problem = (str(error) if isinstance(error, ScenarioError) else
                       f"{path}: cannot load it ({type(error).__name__}: {error})")
            raw_name = written.get("name") if isinstance(written, dict) else None
            if (not isinstance(raw_name, str) or golden_path(root, raw_name).exists()
                    or not _plan_input(path)):
                found.invalid.append((path, problem))
            continue
        named.add(name)
        if name not in NOT_REFERENCE and golden_path(root, name).exists():
            found.scenarios.append(path)
    for summary in sorted((root / "results").glob("*/summary.json")):
        if summary.parent.name not in named and _is_golden(summary):
            found.orphaned.append(summary.parent)
    return found


def _plan_input(path: Path) -> bool:
    """Whether `path` is a `plan` input (it loads as one: no parallelism, sizes left to
    the planner), which `run` refuses and the check has no golden of."""
    try:
        load_scenario(path, planning=True)
    except Exception:
        return False
    return True


def reference_scenarios(root: Path) -> list[Path]:
    """Scenarios of the library that have a golden."""
    return references(root).scenarios


def _is_golden(path: Path) -> bool:
    """A summary as `check --update` writes it (a run's own holds its clustersim version)."""
    return (not regular_file_problem(path, limits.MAX_SUMMARY_BYTES)
            and holds_golden(path.parent))


def read_golden(path: Path) -> dict[str, Any]:
    """A golden summary; an unreadable or corrupt one is a ScenarioError naming it (exit 2,
    where a figure that moved is exit 1)."""
    problem = regular_file_problem(path, limits.MAX_SUMMARY_BYTES)  # a FIFO blocks forever
    if problem:
        raise ScenarioError(str(path), [Issue("", f"the golden summary {problem}; restore it "
                                              "from git or rewrite it with clustersim check "
                                              "--update")])
    try:
        golden = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
        problem = figures_problem(golden, "summary")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ScenarioError(str(path), [Issue("", f"cannot read the golden summary ({error}); "
                                              "restore it from git or rewrite it with "
                                              "clustersim check --update")]) from None
    if not isinstance(golden, dict):
        raise ScenarioError(str(path), [Issue("", "the golden summary is not a JSON object; "
                                              "restore it from git or rewrite it with "
                                              "clustersim check --update")])
    if problem:
        raise ScenarioError(str(path), [Issue("", f"the golden summary is damaged ({problem}); "
                                              "restore it from git or rewrite it with "
                                              "clustersim check --update")])
    return golden


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def write_golden(path: Path, summary: dict[str, Any]) -> None:
    """Write a golden whole (a temporary file renamed over it); a folder that cannot take it
    is an OutputDirError (exit 2)."""
    text = json.dumps(summary, indent=2, allow_nan=False) + "\n"
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise OutputDirError(f"{path}: cannot write the golden summary "
                             f"({error.strerror})") from None


@dataclass
class CheckResult:
    scenario: Path
    name: str
    status: str  # ok, differs, missing, updated
    differences: list[tuple[str, Any, Any]] = field(default_factory=list)
    wall_s: float = 0.0


def check_scenario(path: Path, root: Path, update: bool = False) -> CheckResult:
    """Re-run one scenario and compare (or rewrite) its golden."""
    scenario = load_scenario(path)
    golden_file = golden_path(root, scenario.name)
    if not update and not golden_file.exists():
        return CheckResult(path, scenario.name, "missing")  # nothing to compare: no run
    golden = None if update else normalise(read_golden(golden_file))  # before simulating
    result = simulate(scenario)
    now = normalise(result.summary)
    wall = float(result.summary.get("wall_s", 0.0))
    if update:
        write_golden(golden_file, now)
        return CheckResult(path, scenario.name, "updated", wall_s=wall)
    # The golden's folder is also `run`'s default OUT: a summary written there by
    # `clustersim run --force` compares as the golden it replaced would.
    found = differences(golden, now)
    return CheckResult(path, scenario.name, "differs" if found else "ok", found, wall)
