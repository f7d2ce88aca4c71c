"""What an existing OUT holds: an earlier run that a new run may replace without --force, or
the user's data.

A run replaces an earlier one in its OUT without --force only when the outputs would be the
same (by determinism, nothing is lost): the folder holds nothing but what `clustersim run`
writes (and its `report/` as `clustersim report` wrote it), and that run was of the same
effective scenario (its `scenario.yaml`, the file with every --set and --seed folded in),
seed and replications. Anything else is the user's: another scenario, other settings, a
golden summary (`clustersim check --update` writes it without the volatile fields), a file
of their own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from clustersim.analysis.report_names import REPORT_FILES
from clustersim.analysis.trace import SERVING_TABLES, TABLES
from clustersim.cluster.fleet import flatten_into

if TYPE_CHECKING:
    from clustersim.scenario.models import Scenario

__all__ = ["RUN_FILES", "RunSettings", "earlier_report", "earlier_run_of", "holds_golden", "run_differences",
           "run_settings"]

# What `clustersim run` writes into OUT (and `clustersim report` adds): a folder holding only
# these, with a summary.json and scenario.yaml of the same scenario, is an earlier run.
RUN_FILES = frozenset({"summary.json", "scenario.yaml", "report"} | {
    f"{table}.parquet" for table in (*TABLES, *SERVING_TABLES, "job_summary")})

# A scenario.yaml larger than this is compared as text only (no key-by-key account).
_DIFF_BYTES = 4 * 2**20


@dataclass(frozen=True)
class RunSettings:
    """What decides a run's outputs: the scenario's name, the effective scenario as written
    to OUT/scenario.yaml, the seed and the replications."""

    name: str
    scenario_yaml: str
    seed: int
    replications: int = 1


def run_settings(scenario: Scenario, seed: int | None = None,
                 replications: int = 1) -> RunSettings:
    """The settings of a run of `scenario` (with `seed` in place of its own, if given)."""
    from clustersim.scenario.loader import with_seed

    seeded = with_seed(scenario, seed)
    return RunSettings(scenario.name, seeded.source_yaml, seeded.seed, replications)


def earlier_report(out: Path) -> bool:
    """Whether `out` holds only what `clustersim report` writes, by the exact names it
    writes them under (REPORT_FILES: report.md, its plots, report.html): a report it may
    replace; anything else there (a PNG of the user's too) is the user's."""
    if not out.is_dir():
        return False
    for entry in out.iterdir():
        if entry.is_symlink() or not entry.is_file() or entry.name not in REPORT_FILES:
            return False
    return True


def _earlier_summary(out: Path, name: str) -> dict[str, Any] | None:
    """The summary of the earlier run of scenario `name` that `out` holds alone, or None."""
    if not out.is_dir():
        return None
    names = {p.name for p in out.iterdir()}
    if not names <= RUN_FILES or not {"summary.json", "scenario.yaml"} <= names:
        return None
    # its report/ as `clustersim report` wrote it, nothing of the user's beside (a notebook
    # kept there would go with the folder)
    report = out / "report"
    if "report" in names and (report.is_symlink() or not earlier_report(report)):
        return None
    summary = _summary(out)
    # (a golden: `check --update` leaves out the version, and git holds it)
    if summary is None or summary.get("scenario") != name or "clustersim_version" not in summary:
        return None
    return summary


def _summary(out: Path) -> dict[str, Any] | None:
    """`out`'s summary.json as a mapping, or None (absent, unreadable or not a mapping)."""
    if not (out / "summary.json").is_file():  # (a named pipe would block the read)
        return None
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return summary if isinstance(summary, dict) else None


def run_differences(out: Path, settings: RunSettings | None) -> list[str] | None:
    """None when `out` does not hold only an earlier run of `settings.name`; else what
    differs between that run and `settings` (empty: the same run, which may be replaced)."""
    if settings is None:
        return None
    summary = _earlier_summary(out, settings.name)
    if summary is None:
        return None
    found = []
    if summary.get("seed") != settings.seed:
        found.append(f"seed {summary.get('seed')} (this run's: {settings.seed})")
    if summary.get("replications", 1) != settings.replications:
        found.append(f"replications {summary.get('replications', 1)} (this run's: "
                     f"{settings.replications})")
    try:
        written = (out / "scenario.yaml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return [*found, "its scenario.yaml cannot be read"]
    if written != settings.scenario_yaml:
        found.append(_scenario_differences(written, settings.scenario_yaml))
    return found


def holds_golden(out: Path) -> bool:
    """Whether `out` holds a golden summary (`check --update` writes it without the
    version), which git keeps and no run replaces without --force."""
    summary = _summary(out)
    return summary is not None and "scenario" in summary and (
        "clustersim_version" not in summary)


def earlier_run_of(out: Path, settings: RunSettings | None) -> bool:
    """Whether `out` holds only the outputs of an earlier `clustersim run` of the same
    scenario and settings: replacing it loses nothing."""
    return run_differences(out, settings) == []


def _scenario_differences(earlier: str, now: str, shown: int = 3) -> str:
    """The scenario keys whose values differ, the first `shown` of them."""
    if max(len(earlier), len(now)) > _DIFF_BYTES:
        return "its scenario.yaml differs"
    try:
        before, after = {}, {}
        flatten_into("", yaml.safe_load(earlier), before)  # dotted path -> leaf value
        flatten_into("", yaml.safe_load(now), after)
    except yaml.YAMLError:
        return "its scenario.yaml differs"
    keys = [k for k in dict.fromkeys([*before, *after]) if before.get(k, _ABSENT)
            != after.get(k, _ABSENT)]
    if not keys:
        return "its scenario.yaml differs"
    parts = [f"{k or '(the whole file)'}: {_shown(before.get(k, _ABSENT))} (this run's: "
             f"{_shown(after.get(k, _ABSENT))})" for k in keys[:shown]]
    more = f", and {len(keys) - shown} more" if len(keys) > shown else ""
    return "scenario " + ", ".join(parts) + more


_ABSENT = object()


def _shown(value: Any) -> str:
    text = "absent" if value is _ABSENT else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
