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

import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from clustersim.hardware import limits
from clustersim.hardware.spec import Spec
from clustersim.scenario.errors import WorkloadError
from clustersim.scenario.reading import TooLarge, read_bounded, regular_file_problem

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
    "after_end": "submitted at or after the scenario's end",
}


class _Bad(ValueError):
    """A problem of the trace; `file` names another file than the trace given (PAI's task
    table), `key` the scenario key of a problem of the mapping."""

    def __init__(self, message: str, file: Path | None = None, key: str | None = None):
        super().__init__(message)
        self.file = file
        self.key = key


def _contents(path: Path) -> bytes:
    """A trace file's bytes, bounded by limits.MAX_TRACE_FILE_BYTES however the file says its
    size (a /proc file says 0); anything but a regular file is refused."""
    problem = regular_file_problem(path, limits.MAX_TRACE_FILE_BYTES, "a trace file")
    if problem is not None:
        raise _Bad(problem, path)
    try:
        return read_bounded(path, limits.MAX_TRACE_FILE_BYTES)
    except TooLarge as error:
        raise _Bad(str(error), path) from None
    except OSError as error:
        raise _Bad(f"cannot read it ({error.strerror or error})", path) from None


# A plain decimal number as text: what float() reads beyond it (digits of other scripts such
# as Arabic-Indic, `1_000`, `infinity`) is not a trace's number.
_PLAIN_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_FIRST_YEAR, _LAST_YEAR = limits.TRACE_FIRST_YEAR, limits.TRACE_LAST_YEAR
_DATE = re.compile(r"\s*[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(\s|T|$)")  # YYYY-MM-DD, then the time
_MISSING = ("None", "NaT", "nan", "NaN")  # a time not known: Philly's "None", pandas' marks


def _shown(value: Any) -> str:
    """A value for a message, at most 40 characters (a 400-digit number is not shown whole)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _plain(value: Any) -> float | None:
    """A number given as a number or as plain ASCII decimal text, else None (a boolean too:
    True is not 1 s or 1 GPU)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # a JSON integer of 400 digits: no finite number
            return math.inf
    if isinstance(value, str) and _PLAIN_NUMBER.fullmatch(value.strip()):
        return float(value)
    return None


def _seconds(value: Any, where: str, column: str) -> float | None:
    """A time as seconds: a number, or a date and time (with or without a zone)."""
    if (value is None or (isinstance(value, float) and math.isnan(value)) or value == ""
            or value in _MISSING):  # Philly writes a time it does not have as "None"
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _Bad(f"{where}, column {column}: {value!r} is not a time; expected "
                   "YYYY-MM-DD HH:MM:SS (optionally with a zone) or seconds")
    seconds = _plain(value)  # seconds, written as a number or as text (PAI's tables)
    if seconds is not None:
        if not math.isfinite(seconds):
            raise _Bad(f"{where}, column {column}: {_shown(value)} is not a finite time")
        return seconds
    if not _DATE.match(value):  # pandas reads "now" and "today" as the clock's time
        raise _Bad(f"{where}, column {column}: {value!r} is not a time; expected "
                   "YYYY-MM-DD HH:MM:SS (optionally with a zone) or seconds")
    import pandas as pd

    try:
        stamp = pd.Timestamp(str(value))
        if stamp is pd.NaT:
            return None
        if not _FIRST_YEAR <= stamp.year <= _LAST_YEAR:
            raise _Bad(f"{where}, column {column}: {value!r} is in the year {stamp.year}; "
                       f"expected a time from {_FIRST_YEAR} to {_LAST_YEAR}")
        if stamp.tzinfo is not None:
            stamp = stamp.tz_convert("UTC").tz_localize(None)
        return stamp.value / 1e9
    except (ValueError, TypeError, OverflowError) as error:
        if isinstance(error, _Bad):
            raise
        raise _Bad(f"{where}, column {column}: {value!r} is not a time; expected "
                   "YYYY-MM-DD HH:MM:SS (optionally with a zone) or seconds") from None


def _submitted(value: Any, where: str, column: str) -> float:
    """A job's submission time, which every row needs: it orders the trace and starts its
    clock (one missing was read as 1970, decades before the others)."""
    seconds = _seconds(value, where, column)
    if seconds is None:
        raise _Bad(f"{where}, column {column}: {_shown(value)}; expected the job's submission "
                   "time (YYYY-MM-DD HH:MM:SS or seconds)")
    return seconds


def _number(value: Any, where: str, column: str) -> float:
    number = _plain(value)
    if number is None:
        raise _Bad(f"{where}, column {column}: {value!r} is not a number")
    if not math.isfinite(number) or number < 0:
        raise _Bad(f"{where}, column {column}: {value!r}; expected a finite count >= 0")
    return number


def _csv(path: Path, columns: tuple[str, ...], header: bool | None = True):
    """The rows of a CSV file as mappings of text; `header` None: a header row when the
    first field is the first column's name (PAI's tables are published without one)."""
    import pandas as pd

    data = _contents(path)
    if header is None:  # (past a byte-order mark and quotes, as pandas reads the header)
        first = data.removeprefix(b"\xef\xbb\xbf").split(b"\n", 1)[0].split(b",")[0]
        header = first.strip().strip(b'"').strip() == columns[0].encode()
    try:
        frame = pd.read_csv(io.BytesIO(data), header=0 if header else None, dtype=str,
                            keep_default_na=False, names=None if header else list(columns))
    except Exception as error:  # pandas raises many kinds for a damaged file
        raise _Bad(f"cannot read it as CSV ({type(error).__name__}: {error})", path) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise _Bad(f"column {missing[0]} missing; expected the columns "
                   f"{', '.join(columns)}", path)
    if len(frame) > limits.MAX_TRACE_ROWS:
        raise _Bad(f"{len(frame):,} rows; expected at most {limits.MAX_TRACE_ROWS:,} "
                   "(docs/limits.md)", path)
    return frame.to_dict("records")


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _slurm_rows(path: Path, team_column: str, with_fail_time: bool) -> list[_Row]:
    """Helios' cluster_log.csv and Acme's trace_seren.csv / trace_kalos.csv: one job a row."""
    needed = ("job_id", "user", "gpu_num", "state", "submit_time", "start_time", "end_time")
    if team_column == "vc":
        needed += ("vc",)
    rows = []
    for number, record in enumerate(_csv(path, needed), start=1):
        where = f"row {number}"
        end = _seconds(record["end_time"], where, "end_time")
        end_column = "end_time"
        if with_fail_time and _text(record.get("fail_time")):
            fail = _seconds(record["fail_time"], where, "fail_time")
            if fail is not None and (end is None or fail < end):
                end, end_column = fail, "fail_time"
        gpus = _number(record["gpu_num"], where, "gpu_num")
        rows.append(_Row(where, str(record["job_id"]),
                         _submitted(record["submit_time"], where, "submit_time"),
                         _seconds(record["start_time"], where, "start_time"), end,
                         gpus or None, _text(record.get(team_column)),
                         _text(record["state"]), "gpu_num", end_column=end_column))
    return rows


def _philly_rows(path: Path, team_column: str) -> list[_Row]:
    """Philly's cluster_job_log: a JSON list of jobs, each with its scheduling attempts; the
    job's GPUs are its last attempt's, its run time from the first attempt's start to the
    last attempt's end (the retries between count as running: it held GPUs)."""
    data = _contents(path)
    try:
        document = json.loads(data.decode("utf-8-sig"))  # (past a byte-order mark)
    except (UnicodeDecodeError, ValueError) as error:
        raise _Bad(f"cannot read it as JSON ({error})") from None
    except RecursionError:  # JSON nested deeper than Python's stack (Philly's is 4 levels)
        raise _Bad("cannot read it as JSON (nested too deeply; expected a list of jobs, "
                   "each a mapping with a list of attempts)") from None
    if not isinstance(document, list):
        raise _Bad("expected a JSON list of jobs (Philly's cluster_job_log)")
    if len(document) > limits.MAX_TRACE_ROWS:
        raise _Bad(f"{len(document):,} jobs; expected at most {limits.MAX_TRACE_ROWS:,}")
    rows = []
    for number, job in enumerate(document, start=1):
        where = f"job {number}"
        if not isinstance(job, dict):
            raise _Bad(f"{where}: expected a mapping of job keys")
        for key in ("jobid", "status", "submitted_time", "attempts", team_column):
            if key not in job:
                raise _Bad(f"{where}, column {key} missing; expected jobid, status, vc, "
                           "user, submitted_time and attempts")
        where = f"job {number} (jobid {job['jobid']})"
        attempts = job["attempts"]
        if not isinstance(attempts, list):
            raise _Bad(f"{where}, column attempts: expected a list")
        start = end = None
        gpus = None
        reason = None if attempts else "no_attempts"
        if not all(isinstance(a, dict) for a in attempts):
            raise _Bad(f"{where}, column attempts: expected mappings")
        # As Philly's own analysis reads them: an attempt whose start is "None" never
        # started; the job ran from its first started attempt to the end of its last (an end
        # of "None": still running when the log ends, ended at the trace's end later).
        started = [a for a in attempts
                   if _seconds(a.get("start_time"), where, "attempts.start_time") is not None]
        if attempts and not started:
            reason = "never_started"
        if started:
            first, last = started[0], started[-1]
            start = _seconds(first.get("start_time"), where, "attempts.start_time")
            end = _seconds(last.get("end_time"), where, "attempts.end_time")
            if "detail" not in last:  # (an empty list is a CPU-only attempt)
                raise _Bad(f"{where}, column attempts.detail missing from a started attempt")
            detail = last["detail"] or []
            if not isinstance(detail, list):
                raise _Bad(f"{where}, column attempts.detail: expected a list")
            if not all(isinstance(d, dict) and isinstance(d.get("gpus"), list)
                       for d in detail):  # a string's length is not its GPUs
                raise _Bad(f"{where}, column attempts.detail.gpus: expected a list of "
                           "GPUs per server")
            gpus = float(sum(len(d["gpus"]) for d in detail))
        if not isinstance(job["status"], str | None):  # (a list's text is not a status)
            raise _Bad(f"{where}, column status: expected text or null")
        rows.append(_Row(where, str(job["jobid"]),
                         _submitted(job["submitted_time"], where, "submitted_time"),
                         start, end, gpus or None, _text(job.get(team_column)),
                         _text(job["status"]), "attempts.detail.gpus", reason,
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
        raise _Bad("its name has no job_table to find the task table by; expected "
                   "pai_job_table.csv and pai_task_table.csv in one folder")
    if not tasks_path.is_file():
        raise _Bad(f"no task table beside it ({tasks_path.name}); expected "
                   "pai_job_table.csv and pai_task_table.csv in one folder")
    jobs = _csv(path, PAI_JOB_COLUMNS, None)
    tasks: dict[str, list[tuple[float, float | None, float | None]]] = {}
    for number, task in enumerate(_csv(tasks_path, PAI_TASK_COLUMNS, None), start=1):
        where = f"row {number}"
        try:
            gpus = (_number(task["inst_num"] or 0, where, "inst_num")
                    * _number(task["plan_gpu"] or 0, where, "plan_gpu") / 100.0)
            tasks.setdefault(str(task["job_name"]), []).append(
                (gpus, _seconds(task["start_time"], where, "start_time"),
                 _seconds(task["end_time"], where, "end_time")))
        except _Bad as error:
            raise _Bad(str(error), tasks_path) from None
    rows = []
    for number, job in enumerate(jobs, start=1):
        where = f"row {number}"
        own = tasks.get(str(job["job_name"]), [])
        starts = [s for _, s, _ in own if s is not None]
        ends = [e for _, _, e in own if e is not None]
        gpus = sum(g for g, _, _ in own)
        running = any(s is not None and e is None for _, s, e in own)  # (no end yet)
        rows.append(_Row(where, str(job["inst_id"] or job["job_name"]),
                         _submitted(job["start_time"], where, "start_time"),
                         min(starts) if starts else None, None if running or not ends else max(ends),
                         gpus or None, _text(job["user"]), _text(job["status"]),
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
    except _Bad as error:
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
            raise _Bad(f"{mapping.gpu!r} is not a catalog hardware entry (`clustersim "
                       "hardware` lists them)", key="workload.mapping.gpu") from None
        if not gpu_tflops or not target.chip_bf16_tflops:
            raise _Bad("compute needs a BF16 peak of both chips", key="workload.mapping.rule")
    team = mapping.team or ("user" if fmt in ("pai", "acme") else "vc")
    if team == "vc" and fmt in ("pai", "acme"):
        raise _Bad(f"vc: the {fmt} trace has no virtual cluster; use user",
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
        raise _Bad(f"{fmt!r}; expected one of {', '.join(FORMATS)}", key="workload.format")
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
            raise _Bad(f"{row.where}, column id: {row.id!r} is there twice (also "
                       f"{seen[row.id]}); expected each job once")
        seen[row.id] = row.where
        if row.submit < previous:
            raise _Bad(f"{row.where}, column submit: submitted before the row above; "
                       "expected rows in submission order")
        previous = row.submit
        if row.start is not None and row.end is not None and row.end < row.start:
            raise _Bad(f"{row.where}, column {row.end_column}: it ends "
                       f"{row.start - row.end:,.0f} s "
                       "before it starts; expected a duration >= 0")
        if row.start is not None and row.start < row.submit - 1e-6 and fmt != "pai":
            raise _Bad(f"{row.where}, column start_time: it starts before its submission; "
                       "expected start >= submit")
        reason = row.left_out or ("never_started" if row.start is None else
                                  "no_gpus" if row.gpus is None else
                                  "no_end" if row.end is None and fmt != "philly" else None)
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
            raise _Bad(f"{row.where}, column {row.size_column}: {row.gpus:g} GPUs; expected "
                       f"at most {gpus_bound:,} (more than the cluster's {most:,} "
                       "instances hold; docs/limits.md)")
        instances = _size(row.gpus, mapping, target, gpu_tflops)
        if instances > most:
            raise _Bad(f"{row.where}, column {row.size_column}: {row.gpus:g} GPUs map to "
                       f"{instances:,} instances, more than the cluster's {most:,}")
        jobs.append(TraceJob(row.id, row.submit - base, max(end - row.start, 1.0),
                             instances, None if team == "none" else row.team, row.outcome,
                             row.where))
    del left_out["no_end" if fmt == "philly" else "no_attempts"]  # a reason of other formats
    return jobs, {"format": fmt, "rows": len(rows), "replayed": len(jobs),
                  "left_out": left_out, "ended_at_trace_end": ended_at_trace_end}
