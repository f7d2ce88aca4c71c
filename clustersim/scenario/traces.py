"""Published cluster traces as job mixes: Philly, Helios, Alibaba PAI, Acme, and the native
format, read as their owners publish them and mapped onto the scenario's hardware
(`workload: {trace, format, mapping, templates}`, as docs/traces-in.md shows).

Each format's columns and how they map are in docs/traces-in.md. In short, every GPU job of
the trace becomes a job with its submission time (from the trace's first), size (GPUs ->
instances by the mapping's rule), run time (end - start) and outcome (`trace_outcome`); the
model, parallelism and batch come from the mapping's template, the team from the trace's
user or virtual cluster. Rows without a GPU run, or submitted after the scenario's end, are
left out and counted by reason.

Rules (`mapping.rule`):
- `instances`: a GPU node is an instance: ceil(GPUs / `gpus_per_instance`) instances (8 by
  default: the 8-GPU servers of all four traces).
- `compute`: the same peak dense BF16 compute: ceil(GPUs x the `gpu` hardware's per-chip
  peak / the scenario chip's peak) chips, rounded up to whole instances (`gpu`: a catalog
  entry, p4de for A100, p5en for H200; Philly's P100 and P40 had no BF16: the closest).
A rule refuses the other's key. A malformed trace (a missing column, a negative duration, a
size that is no number or beyond the cluster, ids out of order or twice) is refused naming
file, row and column (ValueError; the loader makes it exit 2).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from clustersim.hardware import limits
from clustersim.hardware.spec import Spec
from clustersim.scenario.errors import WorkloadError
from clustersim.scenario.trace_cells import (
    TraceProblem,
    cell_count,
    cell_seconds,
    cell_text,
    csv_records,
    submitted_s,
    trace_bytes,
)

__all__ = ["COLUMNS", "FORMATS", "LEFT_OUT", "TraceMapping", "TraceTarget", "TraceJob", "read_trace"]

FORMATS = ("philly", "helios", "pai", "acme", "native")


class TraceMapping(Spec):
    """How a GPU trace's jobs become the scenario's jobs."""

    rule: Literal["instances", "compute"] = Field(
        default="instances", description="GPUs to instances: by GPU nodes, or by compute")
    gpus_per_instance: int = Field(default=8, gt=0, le=64,
                                   description="rule instances: GPUs per instance")
    gpu: str = Field(default="p4de", description="rule compute: the catalog hardware whose "
                     "chip the trace's GPUs were (p4de: A100, p5en: H200)")
    template: str | None = Field(default=None, description="the template giving every job's "
                                 "model, parallelism and batch (default: the first)")
    team: Literal["user", "vc", "none"] | None = Field(
        default=None, description="the team of a job: the trace's user or virtual cluster "
        "(default: vc where the trace has one, else user)")

    @model_validator(mode="after")
    def _used_by_the_rule(self) -> TraceMapping:  # a key the rule ignores is refused
        unused = {"instances": "gpu", "compute": "gpus_per_instance"}[self.rule]
        if unused in self.model_fields_set:
            raise ValueError(f"{unused} is read only under rule "
                             f"{'compute' if self.rule == 'instances' else 'instances'}; "
                             f"this mapping's rule is {self.rule}: drop it or change the rule")
        return self


@dataclass(frozen=True)
class TraceTarget:
    """What the mapping needs of the scenario's hardware and cluster."""

    chips_per_instance: int
    chip_bf16_tflops: float | None
    max_instances: int | None  # the cluster's working instances, when known


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace, mapped: seconds from the trace's first submission."""

    id: str
    submit_s: float
    run_for_s: float
    instances: int
    team: str | None
    outcome: str | None
    where: str = ""  # "row 12" (CSV) or "job 12 (jobid ...)" (JSON)


# Per format, the trace's column behind each key of a replayed job (for messages).
COLUMNS = {
    "philly": {"name": "jobid", "submit": "submitted_time", "instances": "attempts.detail.gpus",
               "run_for": "attempts.start_time/end_time", "team": "vc or user"},
    "helios": {"name": "job_id", "submit": "submit_time", "instances": "gpu_num",
               "run_for": "start_time/end_time", "team": "vc or user"},
    "acme": {"name": "job_id", "submit": "submit_time", "instances": "gpu_num",
             "run_for": "start_time/end_time/fail_time", "team": "user"},
    "pai": {"name": "inst_id", "submit": "start_time", "instances": "plan_gpu",
            "run_for": "the task table's start_time/end_time", "team": "user"},
}


@dataclass(frozen=True)
class _Row:
    where: str  # "row 12" (CSV) or "job 12 (jobid ...)" (JSON)
    id: str
    submit: float  # seconds, absolute as in the trace
    start: float | None
    end: float | None
    gpus: float | None  # None: a job without GPUs
    team: str | None
    outcome: str | None
    size_column: str
    left_out: str | None = None  # why the row is not replayed, when its parser knows
    end_column: str = "end_time"  # the column its end came from (Acme: fail_time when earlier)


# Why a row of a trace is not replayed, as counted in summary.json's trace_rows.
LEFT_OUT = {
    "no_attempts": "no scheduling attempt (Philly)",
    "never_started": "never started",
    "no_gpus": "no GPUs (CPU-only)",
    "no_end": "no end time (still running at the trace's end)",
    "zero_length": "ended as it started (no run time)",
    "after_end": "submitted at or after the scenario's end",
}


def _slurm_rows(path: Path, team_column: str, with_fail_time: bool) -> list[_Row]:
    """Helios' cluster_log.csv and Acme's trace_seren.csv / trace_kalos.csv: one job a row."""
    needed = ("job_id", "user", "gpu_num", "state", "submit_time", "start_time", "end_time")
    if team_column == "vc":
        needed += ("vc",)
    rows = []
    for number, record in enumerate(csv_records(path, needed), start=1):
        where = f"row {number}"
        end = cell_seconds(record["end_time"], where, "end_time")
        end_column = "end_time"
        if with_fail_time and cell_text(record.get("fail_time")):
            fail = cell_seconds(record["fail_time"], where, "fail_time")
            if fail is not None and (end is None or fail < end):
                end, end_column = fail, "fail_time"
        gpus = cell_count(record["gpu_num"], where, "gpu_num")
        rows.append(_Row(where, str(record["job_id"]),
                         submitted_s(record["submit_time"], where, "submit_time"),
                         cell_seconds(record["start_time"], where, "start_time"), end,
                         gpus or None, cell_text(record.get(team_column)),
                         cell_text(record["state"]), "gpu_num", end_column=end_column))
    return rows


def _philly_rows(path: Path, team_column: str) -> list[_Row]:
    """Philly's cluster_job_log: a JSON list of jobs, each with its scheduling attempts; the
    job's GPUs are its last attempt's, its run time from the first attempt's start to the
    last attempt's end (the retries between count as running: it held GPUs)."""
    data = trace_bytes(path)
    if not data.strip():
        raise TraceProblem("empty (0 bytes); expected a JSON list of jobs (Philly's "
                           "cluster_job_log)")
    try:
        document = json.loads(data.decode("utf-8-sig"))  # (past a byte-order mark)
    except (UnicodeDecodeError, ValueError) as error:
        raise TraceProblem(f"cannot read it as JSON ({error})") from None
    except RecursionError:  # JSON nested deeper than Python's stack (Philly's is 4 levels)
        raise TraceProblem("cannot read it as JSON (nested too deeply; expected a list of jobs, "
                           "each a mapping with a list of attempts)") from None
    if not isinstance(document, list):
        raise TraceProblem("expected a JSON list of jobs (Philly's cluster_job_log)")
    if not document:
        raise TraceProblem("an empty list: no job can come of it; expected a JSON list of jobs")
    if len(document) > limits.MAX_TRACE_ROWS:
        raise TraceProblem(f"{len(document):,} jobs; expected at most {limits.MAX_TRACE_ROWS:,}")
    rows = []
    for number, job in enumerate(document, start=1):
        where = f"job {number}"
        if not isinstance(job, dict):
            raise TraceProblem(f"{where}: expected a mapping of job keys")
        for key in ("jobid", "status", "submitted_time", "attempts", team_column):
            if key not in job:
                raise TraceProblem(f"{where}, column {key} missing; expected jobid, status, vc, "
                                   "user, submitted_time and attempts")
        where = f"job {number} (jobid {job['jobid']})"
        attempts = job["attempts"]
        if not isinstance(attempts, list):
            raise TraceProblem(f"{where}, column attempts: expected a list")
        start = end = None
        gpus = None
        reason = None if attempts else "no_attempts"
        if not all(isinstance(a, dict) for a in attempts):
            raise TraceProblem(f"{where}, column attempts: expected mappings")
        # As Philly's own analysis reads them: an attempt whose start is "None" never
        # started; the job ran from its first started attempt to the end of its last (an end
        # of "None": still running when the log ends, ended at the trace's end later).
        started = [a for a in attempts
                   if cell_seconds(a.get("start_time"), where, "attempts.start_time") is not None]
        if attempts and not started:
            reason = "never_started"
        if started:
            first, last = started[0], started[-1]
            start = cell_seconds(first.get("start_time"), where, "attempts.start_time")
            end = cell_seconds(last.get("end_time"), where, "attempts.end_time")
            if "detail" not in last:  # (an empty list is a CPU-only attempt)
                raise TraceProblem(f"{where}, column attempts.detail missing from a started attempt")
            detail = last["detail"] or []
            if not isinstance(detail, list):
                raise TraceProblem(f"{where}, column attempts.detail: expected a list")
            if not all(isinstance(d, dict) and isinstance(d.get("gpus"), list)
                       for d in detail):  # a string's length is not its GPUs
                raise TraceProblem(f"{where}, column attempts.detail.gpus: expected a list of "
                                   "GPUs per server")
            gpus = float(sum(len(d["gpus"]) for d in detail))
        if not isinstance(job["status"], str | None):  # (a list's text is not a status)
            raise TraceProblem(f"{where}, column status: expected text or null")
        rows.append(_Row(where, str(job["jobid"]),
                         submitted_s(job["submitted_time"], where, "submitted_time"),
                         start, end, gpus or None, cell_text(job.get(team_column)),
                         cell_text(job["status"]), "attempts.detail.gpus", reason,
                         "attempts.end_time"))
    return rows


PAI_JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
PAI_TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
                    "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")


def _pai_rows(path: Path) -> list[_Row]:
    """Alibaba PAI 2020: pai_job_table.csv (given) and pai_task_table.csv beside it, both
    without a header row as published. A job's GPUs: the sum over its tasks of inst_num x
    plan_gpu / 100; its submission: the job's start_time; its run: from its earliest task
    start to its latest task end (none while a started task has none)."""
    tasks_path = path.with_name(path.name.replace("job_table", "task_table"))
    if tasks_path == path:  # "no task table beside it (h.csv)" named the job table
        raise TraceProblem("its name has no job_table to find the task table by; expected "
                           "pai_job_table.csv and pai_task_table.csv in one folder")
    if not tasks_path.is_file():
        raise TraceProblem(f"no task table beside it ({tasks_path.name}); expected "
                           "pai_job_table.csv and pai_task_table.csv in one folder")
    jobs = csv_records(path, PAI_JOB_COLUMNS, None)
    tasks: dict[str, list[tuple[float, float | None, float | None]]] = {}
    for number, task in enumerate(csv_records(tasks_path, PAI_TASK_COLUMNS, None), start=1):
        where = f"row {number}"
        try:
            gpus = (cell_count(task["inst_num"] or 0, where, "inst_num")
                    * cell_count(task["plan_gpu"] or 0, where, "plan_gpu") / 100.0)
            tasks.setdefault(str(task["job_name"]), []).append(
                (gpus, cell_seconds(task["start_time"], where, "start_time"),
                 cell_seconds(task["end_time"], where, "end_time")))
        except TraceProblem as error:
            raise TraceProblem(str(error), tasks_path) from None
    rows = []
    for number, job in enumerate(jobs, start=1):
        where = f"row {number}"
        own = tasks.get(str(job["job_name"]), [])
        starts = [s for _, s, _ in own if s is not None]
        ends = [e for _, _, e in own if e is not None]
        gpus = sum(g for g, _, _ in own)
        running = any(s is not None and e is None for _, s, e in own)  # (no end yet)
        rows.append(_Row(where, str(job["inst_id"] or job["job_name"]),
                         submitted_s(job["start_time"], where, "start_time"),
                         min(starts) if starts else None, None if running or not ends else max(ends),
                         gpus or None, cell_text(job["user"]), cell_text(job["status"]),
                         "plan_gpu"))
    return rows


def _size(gpus: float, mapping: TraceMapping, target: TraceTarget, gpu_tflops: float | None
          ) -> int:
    if mapping.rule == "instances":
        return max(1, math.ceil(gpus / mapping.gpus_per_instance - 1e-9))
    assert gpu_tflops is not None and target.chip_bf16_tflops
    chips = math.ceil(gpus * gpu_tflops / target.chip_bf16_tflops - 1e-9)
    return max(1, math.ceil(chips / target.chips_per_instance))


def read_trace(path: Path, fmt: str, mapping: TraceMapping, target: TraceTarget,
               horizon_s: float | None = None) -> tuple[list[TraceJob], dict[str, Any]]:
    """The GPU jobs of a trace file, mapped (WorkloadError naming file, row and column, or the
    mapping's key), and what became of its rows: {rows, replayed, left_out: {reason: count}
    (LEFT_OUT; `after_end`: submitted, from the trace's first, at or past `horizon_s`, the
    scenario's duration), ended_at_trace_end}."""
    try:
        return _read(path, fmt, mapping, target, horizon_s)
    except TraceProblem as error:
        if error.key is not None:
            raise WorkloadError(error.key, str(error)) from None
        raise WorkloadError("workload.trace", f"{error.file or path}: {error}") from None


def _read(path: Path, fmt: str, mapping: TraceMapping, target: TraceTarget,
          horizon_s: float | None) -> tuple[list[TraceJob], dict[str, Any]]:
    gpu_tflops = None
    if mapping.rule == "compute":
        from clustersim.hardware.catalog import catalog_entry

        try:
            gpu_tflops = catalog_entry(mapping.gpu).chip.tflops.get("bf16")
        except (KeyError, ValueError):
            raise TraceProblem(f"{mapping.gpu!r} is not a catalog hardware entry (`clustersim "
                               "hardware` lists them)", key="workload.mapping.gpu") from None
        if not gpu_tflops or not target.chip_bf16_tflops:
            raise TraceProblem("compute needs a BF16 peak of both chips", key="workload.mapping.rule")
    team = mapping.team or ("user" if fmt in ("pai", "acme") else "vc")
    if team == "vc" and fmt in ("pai", "acme"):
        raise TraceProblem(f"vc: the {fmt} trace has no virtual cluster; use user",
                           key="workload.mapping.team")
    if fmt == "philly":
        rows = _philly_rows(path, "user" if team == "none" else team)
    elif fmt == "helios":
        rows = _slurm_rows(path, "user" if team == "none" else team, False)
    elif fmt == "acme":
        rows = _slurm_rows(path, "user", True)
    elif fmt == "pai":
        rows = _pai_rows(path)
    else:
        raise TraceProblem(f"{fmt!r}; expected one of {', '.join(FORMATS)}", key="workload.format")
    seen: dict[str, str] = {}
    jobs = []
    previous = -math.inf
    base = min((row.submit for row in rows), default=0.0)
    # The trace's end: its last time of any kind (a Philly attempt without an end ran to it).
    trace_end = max((t for row in rows for t in (row.submit, row.start, row.end)
                     if t is not None), default=0.0)
    left_out = dict.fromkeys(LEFT_OUT, 0)
    ended_at_trace_end = 0
    for row in rows:
        if row.id in seen:
            raise TraceProblem(f"{row.where}, column id: {row.id!r} is there twice (also "
                               f"{seen[row.id]}); expected each job once")
        seen[row.id] = row.where
        if row.submit < previous:
            raise TraceProblem(f"{row.where}, column submit: submitted before the row above; "
                               "expected rows in submission order")
        previous = row.submit
        if row.start is not None and row.end is not None and row.end < row.start:
            raise TraceProblem(f"{row.where}, column {row.end_column}: it ends "
                               f"{row.start - row.end:,.0f} s "
                               "before it starts; expected a duration >= 0")
        if row.start is not None and row.start < row.submit - 1e-6 and fmt != "pai":
            raise TraceProblem(f"{row.where}, column start_time: it starts before its submission; "
                               "expected start >= submit")
        reason = row.left_out or ("never_started" if row.start is None else
                                  "no_gpus" if row.gpus is None else
                                  "no_end" if row.end is None and fmt != "philly" else
                                  # (a 1 s job of ETTR 0 was replayed)
                                  "zero_length" if row.end == row.start else None)
        if reason is None and horizon_s is not None and row.submit - base >= horizon_s:
            reason = "after_end"  # (after the row's own reasons: theirs hang on no duration)
        if reason is not None:  # no GPU run to replay
            left_out[reason] += 1
            continue
        end = row.end
        if end is None:
            end = trace_end
            ended_at_trace_end += 1
        most = min(target.max_instances or limits.MAX_INSTANCES, limits.MAX_INSTANCES)
        gpus_bound = most * limits.MAX_TRACE_GPUS_PER_INSTANCE
        if row.gpus > gpus_bound:  # beyond any mapping's reach: no 300-digit size
            raise TraceProblem(f"{row.where}, column {row.size_column}: {row.gpus:g} GPUs; expected "
                               f"at most {gpus_bound:,} (more than the cluster's {most:,} "
                               "instances hold; docs/limits.md)")
        instances = _size(row.gpus, mapping, target, gpu_tflops)
        if instances > most:
            raise TraceProblem(f"{row.where}, column {row.size_column}: {row.gpus:g} GPUs map to "
                               f"{instances:,} instances, more than the cluster's {most:,}")
        jobs.append(TraceJob(row.id, row.submit - base, max(end - row.start, 1.0),
                             instances, None if team == "none" else row.team, row.outcome,
                             row.where))
    del left_out["no_end" if fmt == "philly" else "no_attempts"]  # a reason of other formats
    if not jobs:  # an empty fleet would run (and report nothing) for the whole duration
        counts = ", ".join(f"{count:,} {LEFT_OUT[reason]}"
                           for reason, count in left_out.items() if count)
        raise TraceProblem(f"none of its {len(rows):,} rows is a GPU job to replay"
                           + (f" (left out: {counts})" if counts else "")
                           + "; expected at least one row of a job that started on GPUs and "
                           "ran (docs/traces-in.md)")
    return jobs, {"format": fmt, "rows": len(rows), "replayed": len(jobs),
                  "left_out": left_out, "ended_at_trace_end": ended_at_trace_end}
