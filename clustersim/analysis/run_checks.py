"""Checks of a run folder's files before they are read: a summary.json, a Parquet table or
job_summary.parquet of another run, tool or schema is refused with what is wrong (the
report and `load_run` use them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from clustersim.hardware import limits

__all__ = ["summary_problem", "figures_problem", "table_problem", "job_summary_problem",
           "MAX_SUMMARY_BYTES", "LATER_COLUMNS", "JOB_SUMMARY_READ"]


MAX_SUMMARY_BYTES = limits.MAX_SUMMARY_BYTES  # about 2.3 KB a job: MAX_JOBS write 233 MB
_MAX_FIGURE = 1e30  # no figure of a run is near it; 1e308 days overflow the plots


def figures_problem(value: Any, where: str, depth: int = 0) -> str | None:
    """The first non-finite or absurd number, or nesting deeper than a run writes."""
    if depth > 8:
        return f"{where}: nested deeper than a run's summary"
    if isinstance(value, dict):
        for key, item in value.items():
            found = figures_problem(item, f"{where}.{key}", depth + 1)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = figures_problem(item, f"{where}.{index}", depth + 1)
            if found:
                return found
    elif isinstance(value, float) and not (abs(value) <= _MAX_FIGURE):
        return f"{where} = {value!r}: expected a finite figure"
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_FIGURE:
        return f"{where} = {value}: expected a figure below {_MAX_FIGURE:g}"
    return None


# What `report` reads of a summary, per section: key -> (kind, required). The report indexes a
# required key and `.get`s the others, so an absent optional figure is fine and a present one
# must be of its kind: a wrongly-typed figure is refused here (exit 2) with its key path rather
# than failing mid-report on a format string (exit 1).
_NUMBER, _WHOLE, _MAYBE, _TEXT, _NUMBERS, _ANY = (
    "a number", "a whole number", "a number or null", "text", "an object of numbers", "present")
_RUN_FIGURES: dict[str, dict[str, tuple[str, bool]]] = {
    "": {"scenario": (_TEXT, True), "seed": (_WHOLE, True), "replications": (_WHOLE, True),
         "clustersim_version": (_TEXT, True), "simulated_s": (_NUMBER, True)},
    "cluster": {"chip": (_TEXT, True), "hardware": (_TEXT, True),
                "utilisation": (_NUMBER, False), "useful_utilisation": (_NUMBER, False),
                "serving_instances": (_MAYBE, False), "failures": (_NUMBERS, False)},
    "jobs.*": {"status": (_TEXT, False), "steps_completed": (_NUMBER, False),
               "ettr": (_NUMBER, False), "interruptions": (_NUMBER, False),
               "step_time_s": (_NUMBER, False), "mfu": (_NUMBER, False),
               "chips": (_NUMBER, False), "wall_s": (_NUMBER, False),
               "useful_s": (_NUMBER, False), "lost_time_s": (_NUMBERS, False),
               "step_breakdown": (_NUMBERS, False),
               "cost_per_million_tokens_usd": (_MAYBE, False),
               "effective_cost_per_million_tokens_usd": (_MAYBE, False),
               "energy_per_token_j": (_MAYBE, False),
               "effective_energy_per_token_j": (_MAYBE, False)},
    "deployments.*": {"requests_per_s": (_NUMBER, True), "output_tokens_per_s": (_NUMBER, True),
                      "slo_goodput": (_MAYBE, True), "ttft_p50_s": (_MAYBE, True),
                      "ttft_p99_s": (_MAYBE, True), "tpot_p50_s": (_MAYBE, True),
                      "tpot_p99_s": (_MAYBE, True),
                      "cost_per_million_output_tokens_usd": (_MAYBE, True),
                      "requests_completed": (_NUMBER, False),
                      "requests_drained": (_MAYBE, False), "drain_s": (_MAYBE, False),
                      "requests_unfinished": (_MAYBE, False),
                      "requests_rejected": (_MAYBE, False),
                      "kv_capacity_tokens_per_replica": (_MAYBE, False)},
}
# A fleet-day run's summary (docs/fleet-day.md), as its report reads it.
_DAY_FIGURES: dict[str, dict[str, tuple[str, bool]]] = {
    "": {"scenario": (_TEXT, True), "seed": (_WHOLE, True), "simulated_s": (_NUMBER, True),
         "clustersim_version": (_TEXT, True)},
    "cluster": {"chips": (_NUMBER, True), "chip": (_TEXT, True), "hardware": (_TEXT, True)},
    "fleet_day": {"chip_hours": (_NUMBERS, True), "chip_hours_total": (_NUMBER, True),
                  "interval_s": (_NUMBER, True),
                  "serving_cost_per_million_output_tokens_usd": (_MAYBE, False),
                  "training_cost_per_million_tokens_usd": (_MAYBE, False),
                  "fleet_cost_per_million_output_tokens_usd": (_MAYBE, False)},
    "deployments.*": {"peak_load_per_s": (_NUMBER, True), "replicas_min": (_NUMBER, True),
                      "replicas_max": (_NUMBER, True), "ttft_p50_s": (_MAYBE, True),
                      "ttft_p99_s": (_MAYBE, True), "tpot_p50_s": (_MAYBE, True),
                      "tpot_p99_s": (_MAYBE, True), "slo_goodput": (_MAYBE, True),
                      "cost_per_million_output_tokens_usd": (_MAYBE, False)},
    "jobs.*": {"status": (_ANY, True), "tokens_trained": (_NUMBER, True),
               "ettr": (_NUMBER, True), "preemptions": (_ANY, True),
               "interruptions": (_ANY, True), "lost_work_s": (_NUMBER, True)},
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind_ok(value: Any, kind: str) -> bool:
    if kind == _NUMBER:
        return _is_number(value)
    if kind == _WHOLE:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _MAYBE:
        return value is None or _is_number(value)
    if kind == _TEXT:
        return isinstance(value, str)
    if kind == _NUMBERS:
        return isinstance(value, dict) and all(_is_number(v) for v in value.values())
    return True


def _figures_problem(summary: dict[str, Any], spec: dict[str, dict[str, tuple[str, bool]]]
                     ) -> str | None:
    """The first figure of `spec` missing (when required) or not of its kind, by key path."""
    for section, figures in spec.items():
        if not section:
            entries = {"": summary}
        elif section.endswith(".*"):
            entries = summary.get(section[:-2], {})
            if not isinstance(entries, dict):
                return f"{section[:-2]}: expected an object, found {entries!r:.80}"
            entries = {f"{section[:-2]}.{name}": entry for name, entry in entries.items()}
        else:
            entries = {section: summary.get(section)}
        for where, entry in entries.items():
            if not isinstance(entry, dict):
                return f"{where}: expected an object, found {entry!r:.80}"
            for key, (kind, required) in figures.items():
                path = f"{where}.{key}" if where else key
                if key not in entry:
                    if required:
                        return f"{path}: missing; expected {kind}"
                    continue
                if not _kind_ok(entry[key], kind):
                    return f"{path}: expected {kind}, found {entry[key]!r:.80}"
    return None


def summary_problem(summary: Any, fleet_day: bool = False) -> str | None:
    """What makes `summary` (summary.json, parsed) not a run's summary the report can read,
    or None: the keys and types `clustersim run` writes (every figure the report reads, by
    key path), every figure finite and bounded. `fleet_day`: a fleet-day run's summary."""
    if not isinstance(summary, dict):
        return f"expected a JSON object, found {type(summary).__name__}"
    for key in ("jobs", "cluster") + (("deployments",) if fleet_day else ()):
        if key not in summary:
            return f"{key}: missing"
    # Bounds first: a figure of 1e400 or nesting 50,000 deep is named as such.
    problem = figures_problem(summary, "summary")
    if problem:
        return problem
    if fleet_day:
        problem = _figures_problem(summary, _DAY_FIGURES)
        if problem:
            return problem
        if not isinstance(summary.get("jobs", {}), dict):
            return "jobs: expected an object"
        return _horizon_problem(summary)
    problem = _figures_problem(summary, _RUN_FIGURES) or _horizon_problem(summary)
    if problem:
        return problem
    if summary["replications"] < 1:
        return f"replications = {summary['replications']}: expected at least 1"
    cluster = summary["cluster"]
    for key in ("chips", "instances", "chips_per_instance", "instances_per_ultraserver"):
        value = cluster.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"cluster.{key}: expected a whole number of at least 1, found {value!r:.80}"
    if not isinstance(summary.get("deployments", {}), dict):
        return "deployments: expected an object"
    return None


def _horizon_problem(summary: dict[str, Any]) -> str | None:
    if not 0 < summary["simulated_s"] <= limits.MAX_DURATION_S:
        return (f"simulated_s = {summary['simulated_s']!r}: expected a horizon of at most "
                f"{limits.MAX_DURATION_S:g} s")
    return None


# Columns a later version added to a table without a new trace schema: a run written before
# them lacks them and is read as it is.
LATER_COLUMNS = {"utilisation": ("failed",), "jobs": ("cp", "ep")}


def table_problem(path: Path, name: str) -> str | None:
    """What makes the Parquet file `path` not the run table `name` (another table, another
    tool's file, a column of the wrong kind), or None. Columns added later
    (`LATER_COLUMNS`) may be absent."""
    import pyarrow as pa

    from clustersim.analysis.trace import SCHEMAS

    expected = SCHEMAS.get(name)
    if expected is None:
        return None
    schema = pq.read_schema(path)
    for field in expected:
        if field.name not in schema.names:
            if field.name in LATER_COLUMNS.get(name, ()):
                continue
            return f"lacks column {field.name}; expected the {name} table of a run"
        if schema.names.count(field.name) > 1:
            return f"has column {field.name} twice"
        found = schema.field(field.name).type
        if pa.types.is_dictionary(found):
            found = found.value_type
        want = field.type.value_type if pa.types.is_dictionary(field.type) else field.type

        def kind(t: pa.DataType) -> str:
            if pa.types.is_integer(t) or pa.types.is_floating(t):
                return "number"
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                return "text"
            if pa.types.is_boolean(t):
                return "boolean"
            return str(t)

        if kind(found) != kind(want):
            return f"column {field.name} is {found}; expected {want}"
    return None


# What the report's fleet plots read of job_summary.parquet (one column a figure, no fixed
# schema): column -> kind. A null column (a figure no job had) reads as a number.
JOB_SUMMARY_READ = {"instances": "number", "team": "text", "queue_wait_s": "number",
                    "slowdown": "number", "held_chip_s": "number"}


def job_summary_problem(path: Path, jobs: object = None) -> str | None:
    """What makes `path` not a run's job_summary.parquet as the report reads it (another
    table in its place, a column of another kind, or, given the summary's `cluster.jobs`,
    another count of jobs: another run's table was drawn beside this run's summary), or
    None."""
    import pyarrow as pa

    rows = pq.read_metadata(path).num_rows
    if isinstance(jobs, int | float) and not isinstance(jobs, bool) and rows != jobs:
        return f"{rows:,} jobs where summary.json counts {jobs:,g}"
    schema = pq.read_schema(path)
    for column, kind in JOB_SUMMARY_READ.items():
        if column not in schema.names:
            return f"lacks column {column}; expected the job_summary table of a run"
        if schema.names.count(column) > 1:
            return f"has column {column} twice"
        found = schema.field(column).type
        if pa.types.is_dictionary(found):
            found = found.value_type
        ok = (pa.types.is_string(found) or pa.types.is_large_string(found)) if kind == "text" \
            else (pa.types.is_integer(found) or pa.types.is_floating(found)
                  or pa.types.is_null(found))
        if not ok:
            return f"column {column} is {found}; expected {kind}"
    return None
