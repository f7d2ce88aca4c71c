"""Figures of a fleet of jobs: per team, the largest jobs, and every job as one flat row.

A month of 100,000 jobs does not belong in summary.json job by job: it keeps the cluster's
figures, each team's, and the largest jobs (`SUMMARY_JOBS`); every job's figures go to
`job_summary.parquet`, one row a job, one column a figure (nested figures by dotted name).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["SUMMARY_JOBS", "LARGEST_JOBS", "team_figures", "largest_jobs",
           "flat_job_columns", "flatten_into", "missing_figure", "finite_or_none_column",
           "finite_or_none", "COUNT_FAMILIES"]

SUMMARY_JOBS = 2_000  # up to this many jobs, summary.json lists every one
LARGEST_JOBS = 100  # past it, the largest this many (by chips, then chip-time held)

# The summary's mappings of counts that leave out what did not occur (a cause no failure
# had, a status no job ended in): a key one of them lacks counts 0 where another run or
# replication has it, unlike a figure that is null because it is undefined (a slowdown of
# a job that never started). Where the summary has them: cluster.failures,
# cluster.failures_by_cause, cluster.jobs_by_status, teams.<team>.jobs_by_status,
# <job>.interruptions_by_cause, <job>.status_by_replication, trace_rows.left_out,
# fleet_day.failures.
COUNT_FAMILIES = ("failures", "failures_by_cause", "jobs_by_status", "interruptions_by_cause",
                  "status_by_replication", "left_out")


def _quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def team_figures(jobs: Mapping[str, Mapping[str, Any]], quotas: Mapping[str, int | None],
                 weights: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """Per team: jobs and how they ended, queue waits (mean, median, 95th percentile),
    slowdowns, chip-time held and its share of all chip-time held, useful chip-time,
    preemptions, and its quota and fair-share weight. `jobs` are the summary's per-job
    figures (with `team`, `chips`, `held_chip_s`, `useful_s`, `queue_wait_s`, `slowdown`,
    `start_s`). Waits are of the jobs that started; a job that never did has a censored wait,
    counted apart (`jobs_never_started`, `mean_censored_queue_wait_s`)."""
    team, held_s, wait_s, start_s, slowdown, status, useful_s, chips, preempted = _columns(
        jobs, ("team", "held_chip_s", "queue_wait_s", "start_s", "slowdown", "status",
               "useful_s", "chips", "preemptions"))
    by_team: dict[str, list[int]] = {}
    for index, name in enumerate(team):
        by_team.setdefault(name, []).append(index)
    total_held = sum(held_s)
    out = {}
    for name in sorted(set(by_team) | set(quotas)):
        members = by_team.get(name, [])
        # Waits of jobs that started; a job never started has a censored wait, counted apart.
        waits = [wait_s[i] for i in members if start_s[i] is not None]
        never = [wait_s[i] for i in members if start_s[i] is None]
        slowdowns = [slowdown[i] for i in members if slowdown[i] is not None]
        held = float(sum(held_s[i] for i in members))
        statuses: dict[str, int] = {}
        for i in members:
            statuses[status[i]] = statuses.get(status[i], 0) + 1
        out[name] = {
            "jobs": len(members),
            "jobs_by_status": dict(sorted(statuses.items())),
            "quota_instances": quotas.get(name),
            "share_weight": weights.get(name, 1.0),
            "mean_queue_wait_s": _mean(waits),
            "p50_queue_wait_s": _quantile(waits, 0.5),
            "p95_queue_wait_s": _quantile(waits, 0.95),
            "jobs_never_started": len(never),
            "mean_censored_queue_wait_s": _mean(never),
            "mean_slowdown": _mean(slowdowns),
            "p95_slowdown": _quantile(slowdowns, 0.95),
            "held_chip_s": held,
            "chip_time_share": held / total_held if total_held > 0 else 0.0,
            "useful_chip_s": float(sum(useful_s[i] * chips[i] for i in members)),
            "preemptions": int(sum(preempted[i] for i in members)),
        }
    return out


def _columns(jobs: Mapping[str, Mapping[str, Any]], keys: tuple[str, ...]) -> list[list[Any]]:
    """Each figure's values over the jobs, in order: read a figure at a time (`ArrowRows`
    keeps its columns; a look-up per job and figure was a million calls in the 30-day slice
    of rainier-year)."""
    column = getattr(jobs, "column", None)
    if column is not None:
        return [column(key) for key in keys]
    rows = list(jobs.values())
    return [[job[key] for job in rows] for key in keys]


def largest_jobs(jobs: Mapping[str, Mapping[str, Any]], count: int = LARGEST_JOBS
                 ) -> dict[str, Mapping[str, Any]]:
    """The `count` largest jobs (chips, then chip-time held; then name), in the jobs' order."""
    ranked = sorted(jobs, key=lambda name: (-jobs[name]["chips"], -jobs[name]["held_chip_s"],
                                            name))[:count]
    keep = set(ranked)
    return {name: figures for name, figures in jobs.items() if name in keep}


# Leaves by exact type: most of a 100,000-job summary's figures, set without a call or an
# isinstance check against the Mapping ABC each (that was most of writing its Parquet).
_PLAIN = frozenset({float, int, str, bool, type(None)})


def flatten_into(prefix: str, value: Any, row: dict[str, Any]) -> None:
    """Set `row`'s entry of each figure in `value`, by dotted name under `prefix`."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if type(inner) in _PLAIN:
                row[name] = inner
            else:
                flatten_into(name, inner, row)
    elif isinstance(value, list | tuple):
        for index, inner in enumerate(value):
            flatten_into(f"{prefix}.{index}", inner, row)
    else:
        row[prefix] = value


def flat_job_columns(jobs: Mapping[str, Mapping[str, Any]],
                     teams: Mapping[str, str] | None = None) -> dict[str, list[Any]]:
    """Every per-job figure as a column (`time_by_state_s.queued`,
    `interruptions_by_cause.hbm`, ...), in order of first appearance, `name` first (then
    `team`, each job's from `teams` or "-", with `teams`); a job without a figure has None
    there, but 0 for a cause it never met. Built column by column as the jobs are read (not
    a row of dicts per job read again per column: most of writing a 100,000-job summary)."""
    columns: dict[str, list[Any]] = {"name": []}
    if teams is not None:
        columns["team"] = []
    for done, (name, figures) in enumerate(jobs.items()):
        row: dict[str, Any] = {"name": name}
        if teams is not None:
            row["team"] = teams.get(name, "-")
        flatten_into("", figures, row)
        for column, value in row.items():
            values = columns.get(column)
            if values is None:  # first seen: the jobs before had none
                values = columns[column] = [missing_figure(column)] * done
            values.append(value)
        if len(row) < len(columns):  # figures this job lacks (each column its own list:
            for column in columns.keys() - row.keys():  # any order; not a scan of them all)
                columns[column].append(missing_figure(column))
    return columns


def missing_figure(column: str) -> Any:
    """A job's value of a figure it does not have: 0 times for a cause it never met (0
    replications for a status it never ended in)."""
    return 0 if column.startswith(("interruptions_by_cause.", "status_by_replication.")) else None


_INF = math.inf


def finite_or_none_column(values: list[Any]) -> list[Any]:
    """`finite_or_none` of each value, in place: only values that compare like a NaN or an
    infinity are looked at (a call per value was a tenth of a 100,000-job run's writing)."""
    for index in [i for i, v in enumerate(values) if v != v or v == _INF or v == -_INF]:
        values[index] = finite_or_none(values[index])
    return values


def finite_or_none(value: Any) -> Any:
    """A NaN or an infinity as None (a Parquet null), anything else as it is."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
