"""Reading runs back in pandas: `load_run(OUT)` and what to ask of a run.

    run = clustersim.analysis.load_run("results/quickstart")
    run.jobs, run.cluster_state        # the tables, as DataFrames, read on first use
    run.utilisation_at("cluster", bin_s=3600)   # any level and bin, from the intervals
    run.utilisation_at("chip", chips=[0, 17])   # per chip, for chosen chips
    run.goodput()                      # useful and lost hours per job, by cause
    run.failure_stats()                # failures by component
    clustersim.analysis.compare(["results/a", "results/b"])
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml

from clustersim.analysis.trace import SCHEMA_VERSION, SERVING_TABLES, TABLES
from clustersim.analysis.utilisation import utilisation_rows
from clustersim.hardware import limits
from clustersim.scenario.loader import TRACE_LEVELS, load_scenario

__all__ = ["Run", "TraceSchemaError", "load_run", "compare", "summary_problem", "figures_problem",
           "table_problem", "job_summary_problem", "MAX_SUMMARY_BYTES", "job_status"]


class TraceSchemaError(ValueError):
    """Traces written by a clustersim whose trace schema this one does not read."""


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


class _Table:
    """A run's table of the same name as a DataFrame attribute, read on first use and kept."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, run: Run | None, owner: type | None = None) -> Any:
        if run is None:
            return self
        frame = run.table(self.name)
        run.__dict__[self.name] = frame  # later reads find it before this descriptor
        return frame


class Run:
    """A finished run's folder: summary, scenario and Parquet tables (read lazily)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        summary = self.path / "summary.json"
        if not summary.exists():
            raise FileNotFoundError(f"{self.path}: no summary.json (not a clustersim run?)")
        self.summary: dict[str, Any] = json.loads(summary.read_text(encoding="utf-8"))
        scenario = self.path / "scenario.yaml"
        self.scenario: dict[str, Any] = yaml.safe_load(scenario.read_text()) if (
            scenario.exists()) else {}
        self._check_schema()

    def _check_schema(self) -> None:
        """Refuse traces of another schema with a message, not a KeyError later: schema 3
        renamed the job state `waiting` to `waiting_for_hardware` (one name everywhere),
        schema 4 made a run of periodic checkpoints one `events` row."""
        if not (self.path / "intervals.parquet").exists():
            return
        written = self.metadata("intervals").get("clustersim.schema")
        if written != SCHEMA_VERSION:
            raise TraceSchemaError(
                f"{self.path}: traces written with trace schema {written} (clustersim "
                f"{self.summary.get('clustersim_version', '?')}); this clustersim reads schema "
                f"{SCHEMA_VERSION} (see docs/traces.md): re-run the "
                f"scenario to write them again")

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, scenario={self.summary.get('scenario')!r})"

    def table(self, name: str) -> pd.DataFrame:
        """A table of the run (`TABLES`, the serving tables or `job_summary`) as a
        DataFrame."""
        known = TABLES + SERVING_TABLES + ("job_summary",)
        if name not in known:
            raise KeyError(f"unknown table {name!r}; expected one of {', '.join(known)}")
        path = self.path / f"{name}.parquet"
        if not path.exists():
            raise FileNotFoundError(f"{path}: {self._why_no_table(name)}")
        frame = pq.read_table(path).to_pandas()
        for column in frame.columns:  # dictionary-encoded strings come back as categoricals
            if isinstance(frame[column].dtype, pd.CategoricalDtype):
                frame[column] = frame[column].astype(str)
        return frame

    def _why_no_table(self, name: str) -> str:
        """Why a table the run lacks is absent: the kind of run, or its traces off."""
        if "fleet_day" in self.summary and name not in ("day", "fleet"):
            return (f"a fleet-day run has no {name} table: it writes day and fleet (with "
                    "traces) and job_summary.parquet (its jobs' figures; docs/fleet-day.md)")
        if name in SERVING_TABLES and not self.summary.get("deployments"):
            return f"this run has no {name} table: it serves no deployment"
        return f"this run has no {name} table (its scenario's trace.enabled is false?)"

    def metadata(self, name: str = "jobs") -> dict[str, str]:
        raw = pq.read_schema(self.path / f"{name}.parquet").metadata or {}
        return {k.decode(): v.decode() for k, v in raw.items() if k.startswith(b"clustersim.")}

    # The tables as attributes, each read on first use: run.jobs, run.events, ...
    chips = _Table()
    jobs = _Table()
    intervals = _Table()
    events = _Table()
    allocations = _Table()
    utilisation = _Table()
    cluster_state = _Table()
    job_summary = _Table()  # every job's figures, one row a job (docs/outputs.md)

    # ------------------------------------------------------------------ questions
    def utilisation_at(self, level: str = "cluster", bin_s: float | None = None,
                       chips: Sequence[int] | None = None) -> pd.DataFrame:
        """Utilisation per bin at any level (`cluster`, `ultraserver`, `instance`, `job`, or
        `chip` for the chosen `chips`) and bin length, recomputed from the intervals."""
        levels = (*TRACE_LEVELS, "chip")
        if level not in levels:
            raise ValueError(f"utilisation_at: level {level!r}; expected one of "
                             f"{', '.join(levels)}")
        if bin_s is not None and not (isinstance(bin_s, int | float)
                                      and math.isfinite(bin_s) and bin_s > 0):
            raise ValueError(f"utilisation_at: bin_s {bin_s!r}; expected a positive number "
                             "of seconds (None: the run's own bin)")
        hardware = self.summary["cluster"]
        horizon = float(self.summary["simulated_s"])
        if bin_s is None:  # the run's own bin (from the scenario when no level was written)
            written = self.utilisation["bin_s"]
            bin_s = (written.iloc[0] if len(written)
                     else load_scenario(self.path / "scenario.yaml").trace.bin_s)
        bin_s = float(bin_s)
        chips_per_instance = int(hardware["chips_per_instance"])
        instances = None
        wanted = level
        if level == "chip":
            if chips is None:
                raise ValueError("utilisation_at('chip') needs chips=[...]")
            known = len(self.chips)
            wrong = [c for c in chips if not (isinstance(c, int | np.integer)
                                              and 0 <= c < known)]
            if wrong:
                raise ValueError(f"utilisation_at('chip'): chips {wrong[:5]}; expected chip "
                                 f"ids from 0 to {known - 1}")
            chip_rows = self.chips.set_index("chip_id").loc[list(chips)]
            instances = chip_rows["instance_id"].to_numpy()
            wanted = "instance"
        jobs = self.jobs.sort_values("job_id")
        table = utilisation_rows(
            horizon_s=horizon, bin_s=bin_s, levels=[wanted],
            n_instances=int(hardware["instances"]), chips_per_instance=chips_per_instance,
            instances_per_ultraserver=int(hardware["instances_per_ultraserver"]),
            job_ids=jobs["job_id"].tolist(), job_names=jobs["name"].tolist(),
            intervals=self.path / "intervals.parquet",
            allocations=self.path / "allocations.parquet",
            instances=instances)
        frame = table.to_pandas()
        frame["level"] = frame["level"].astype(str)
        if level == "chip":
            assert chips is not None
            per_instance = {k: g for k, g in frame.groupby("key")}
            pieces = []
            for chip, instance in zip(chips, instances, strict=True):
                piece = per_instance[str(int(instance))].copy()
                piece["level"], piece["key"] = "chip", str(chip)
                pieces.append(piece)
            frame = pd.concat(pieces, ignore_index=True)
        return frame

    @property
    def replications(self) -> int:
        """How many replications the summary's figures are means over (the traces, and what
        is read from them, are replication 0's)."""
        count = self.summary.get("replications", 1)
        return count if isinstance(count, int) and not isinstance(count, bool) else 1

    def listed_jobs(self, figures: Sequence[str]) -> pd.DataFrame | None:
        """Past SUMMARY_JOBS jobs summary.json lists only the largest (`jobs_listed`): every
        job's `figures` (and `name`) from job_summary.parquet then, one row a job; None when
        the summary lists every job."""
        path = self.path / "job_summary.parquet"
        if "jobs_listed" not in self.summary or not path.exists():
            return None
        present = set(pq.read_schema(path).names)
        wanted = ["name"] + [c for c in figures if c in present and c != "name"]
        frame = pq.read_table(path, columns=wanted).to_pandas()
        return frame.reindex(columns=["name", *figures])

    def goodput(self) -> pd.DataFrame:
        """Per job: wall, useful and lost hours by cause (they add up to the wall time); every
        job, from job_summary.parquet when summary.json lists only the largest. On a
        replicated run, means over the replications (column `replications`)."""
        path = self.path / "job_summary.parquet"
        listed = "jobs_listed" in self.summary and path.exists()
        lost = [c for c in (pq.read_schema(path).names if listed else [])
                if c.startswith("lost_time_s.") and not c.endswith("_ci95")]
        frame = self.listed_jobs(["wall_s", "useful_s", "ettr", "goodput", *lost])
        if frame is not None:
            out = pd.DataFrame({"job": frame["name"], "wall_h": frame["wall_s"] / 3600,
                                "useful_h": frame["useful_s"] / 3600, "ettr": frame["ettr"],
                                "goodput": frame["goodput"]})
            for column in lost:
                cause = column.removeprefix("lost_time_s.").removeprefix("lost_")
                out[f"lost_{cause}_h"] = frame[column] / 3600
            if self.replications > 1:
                out["replications"] = self.replications
            return out
        rows = []
        for name, job in self.summary["jobs"].items():
            lost = {k: v for k, v in job.get("lost_time_s", {}).items() if not k.endswith("_ci95")}
            row = {"job": name, "wall_h": job.get("wall_s", 0) / 3600,
                   "useful_h": job.get("useful_s", 0) / 3600, "ettr": job.get("ettr"),
                   "goodput": job.get("goodput")}
            # lost_work_h, lost_down_h, lost_queued_h, ...: one `lost_` prefix each
            row.update({f"lost_{k.removeprefix('lost_')}_h": v / 3600 for k, v in lost.items()})
            if self.replications > 1:
                row["replications"] = self.replications
            rows.append(row)
        return pd.DataFrame(rows)

    def failure_stats(self) -> pd.DataFrame:
        """Failures by component: count, rate per day and mean time between them, from the
        events trace. On a replicated run the trace is replication 0's, and so are these
        (column `replication`, 0); `mean_count` and `mean_count_ci95` beside them are the
        summary's means over the replications (a component replication 0 never met: its
        row has count 0)."""
        events = self.events
        failures = events[events["kind"] == "failure"]
        days = float(self.summary["simulated_s"]) / 86400
        rows = []
        for component, group in failures.groupby("component"):
            times = np.sort(group["time_s"].to_numpy())
            gaps = np.diff(times)
            rows.append({"component": component, "count": len(group),
                         "per_day": len(group) / days if days else np.nan,
                         "mean_gap_h": float(gaps.mean() / 3600) if len(gaps) else np.nan,
                         "jobs_hit": int((group["job_id"] >= 0).sum())})
        columns = ["component", "count", "per_day", "mean_gap_h", "jobs_hit"]
        if self.replications > 1:
            rows = self._with_means(rows)
            columns = ["component", "replication", *columns[1:], "mean_count",
                       "mean_count_ci95"]
        return pd.DataFrame(rows, columns=columns).sort_values("count", ascending=False,
                                                                ignore_index=True)

    def _with_means(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Replication 0's rows marked as such, with the summary's mean count over the
        replications beside each, and a row for a component only other replications met."""
        means = self.summary.get("cluster", {}).get("failures") or {}
        found = {row["component"]: row for row in rows}
        for component in means:
            if not component.endswith("_ci95") and component not in found:
                found[component] = {"component": component, "count": 0, "per_day": 0.0,
                                    "mean_gap_h": np.nan, "jobs_hit": 0}
        for component, row in found.items():
            row["replication"] = 0
            row["mean_count"] = float(means.get(component, 0))
            ci = means.get(f"{component}_ci95")
            row["mean_count_ci95"] = float(ci) if isinstance(ci, int | float) else np.nan
        return list(found.values())


def job_status(job: dict) -> str:
    """A job's status; over replications that ended apart, how many ended in each (the
    summary's `status` alone is replication 0's)."""
    by = job.get("status_by_replication")
    if not isinstance(by, dict) or len(by) < 2:
        return str(job.get("status", ""))
    return ", ".join(f"{status} {count:,}" for status, count in by.items()) + " replications"


def load_run(path: str | Path) -> Run:
    """A run folder written by `clustersim run` (tables are read on first use)."""
    return Run(path)


_FIGURES = ("steps_completed", "tokens_trained", "ettr", "goodput", "interruptions",
            "lost_work_s", "step_time_s", "tokens_per_s", "mfu", "checkpoint_interval_s")


def compare(runs: Iterable[str | Path | Run]) -> pd.DataFrame:
    """One row per run and job with the figures that matter (several runs or a sweep); every
    job, from job_summary.parquet when summary.json lists only the largest."""
    rows = []
    for item in runs:
        run = item if isinstance(item, Run) else load_run(item)
        every = run.listed_jobs(_FIGURES)
        if every is not None:
            every = every.rename(columns={"name": "job"})
            every.insert(0, "run", str(run.path))
            every.insert(1, "scenario", run.summary["scenario"])
            every.insert(2, "seed", run.summary["seed"])
            rows += every.to_dict("records")
            continue
        for name, job in run.summary["jobs"].items():
            row = {"run": str(run.path), "scenario": run.summary["scenario"],
                   "seed": run.summary["seed"], "job": name}
            row.update({figure: job.get(figure) for figure in _FIGURES})
            rows.append(row)
    return pd.DataFrame(rows)
