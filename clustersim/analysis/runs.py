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

from clustersim.analysis.run_checks import (  # (re-exported: the report reads them here)
    MAX_SUMMARY_BYTES,
    figures_problem,
    job_summary_problem,
    summary_problem,
    table_problem,
)
from clustersim.analysis.trace import SCHEMA_VERSION, SERVING_TABLES, TABLES
from clustersim.analysis.utilisation import utilisation_rows
from clustersim.scenario.loader import TRACE_LEVELS, load_scenario

__all__ = ["Run", "TraceSchemaError", "load_run", "compare", "summary_problem", "figures_problem",
           "table_problem", "job_summary_problem", "MAX_SUMMARY_BYTES", "job_status"]


class TraceSchemaError(ValueError):
    """Traces written by a clustersim whose trace schema this one does not read."""


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
