"""Trace tables: their schema (one place), the recorders that write them, and the interval
arithmetic that derives utilisation from them.

A run's traces are a star schema (DESIGN.md): small dimension tables (`chips`, `jobs`) and
fact tables of what happened (`intervals`, `events`, `allocations`), from which
`utilisation` is derived per time bin by interval arithmetic. Nothing is written per chip per
time bin: per-chip state is the state of its instance's job (`allocations`) unless its
instance is down (`intervals` of entity `chip`, state `failed` then `repairing`).

Every file is Parquet (zstd) and carries the key-value metadata `clustersim.version`,
`clustersim.seed`, `clustersim.scenario` (the effective YAML), `clustersim.schema` (this
module's version) and `clustersim.table`. Column documentation: `COLUMNS` below, also in the
README.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "SCHEMA_VERSION",
    "JOB_STATES",
    "UTILISATION_STATES",
    "TABLES",
    "SERVING_TABLES",
    "REQUEST_STATUSES",
    "SCHEMAS",
    "COLUMNS",
    "EVENT_KINDS",
    "MemoryRecorder",
    "ParquetRecorder",
    "utilisation_rows",
    "table_metadata",
]

# 2: down intervals per chip (failed, repairing); `failed` column. 3: the job state `waiting`
# is `waiting_for_hardware`, as in summary.json (one name per state everywhere).
SCHEMA_VERSION = "3"
JOB_STATES = ("queued", "running", "checkpointing", "down", "waiting_for_hardware", "restarting",
              "restoring", "done")
# Utilisation columns: chip-time by the state of the job holding the chip, plus `failed` (its
# instance down, not yet detected), `repairing` (detected, being repaired or replaced) and
# `idle` for hardware levels; job levels use the job states plus
# `inactive` (before submission, or after the end). Every row's columns add up to 1.
UTILISATION_STATES = ("queued", "running", "checkpointing", "down", "waiting_for_hardware",
                      "restarting",
                      "restoring", "failed", "repairing", "idle", "inactive")
EVENT_KINDS = ("failure", "repair", "checkpoint")
TABLES = ("chips", "jobs", "intervals", "events", "allocations", "utilisation",
          "cluster_state")
# Written only by scenarios with `serve:` deployments.
SERVING_TABLES = ("requests", "replicas", "day", "fleet")  # day, fleet: fleet-day runs
REQUEST_STATUSES = ("unfinished", "completed", "rejected")

_dict_string = pa.dictionary(pa.int8(), pa.string())
SCHEMAS: dict[str, pa.Schema] = {
    "chips": pa.schema([
        ("chip_id", pa.int32()), ("instance_id", pa.int32()), ("ultraserver_id", pa.int32()),
        ("leaf_id", pa.int32()), ("x", pa.int16()), ("y", pa.int16()), ("z", pa.int16()),
    ]),
    "jobs": pa.schema([
        ("job_id", pa.int32()), ("name", pa.string()), ("model", pa.string()),
        ("ranks", pa.int64()), ("chips", pa.int32()), ("instances", pa.int32()),
        ("tp", pa.int32()), ("pp", pa.int32()), ("dp", pa.int32()),
        ("submit_s", pa.float64()), ("start_s", pa.float64()), ("end_s", pa.float64()),
        ("status", pa.string()), ("steps_completed", pa.int64()), ("step_time_s", pa.float64()),
        ("team", pa.string()),
    ]),
    "intervals": pa.schema([
        ("entity", _dict_string), ("entity_id", pa.int32()), ("state", _dict_string),
        ("start_s", pa.float64()), ("end_s", pa.float64()),
    ]),
    "events": pa.schema([
        ("time_s", pa.float64()), ("kind", _dict_string), ("component", _dict_string),
        ("chip_id", pa.int32()), ("instance_id", pa.int32()), ("job_id", pa.int32()),
    ]),
    "allocations": pa.schema([
        ("job_id", pa.int32()), ("instance_id", pa.int32()), ("start_s", pa.float64()),
        ("end_s", pa.float64()),
    ]),
    "utilisation": pa.schema(
        [("bin_start_s", pa.float64()), ("bin_s", pa.float64()), ("level", _dict_string),
         ("key", pa.string())] + [(state, pa.float64()) for state in UTILISATION_STATES]
    ),
    "cluster_state": pa.schema([
        ("time_s", pa.float64()), ("free_instances", pa.int32()), ("queued_jobs", pa.int32()),
        ("running_jobs", pa.int32()), ("fragmentation", pa.float64()),
    ]),
    "requests": pa.schema([
        ("deployment", _dict_string), ("deployment_id", pa.int16()), ("request", pa.int64()),
        ("arrival_s", pa.float64()), ("first_token_s", pa.float64()),
        ("finish_s", pa.float64()), ("input_tokens", pa.int32()), ("output_tokens", pa.int32()),
        ("replica", pa.int32()), ("status", _dict_string), ("retries", pa.int16()),
    ]),
    "replicas": pa.schema([
        ("deployment_id", pa.int16()), ("replica", pa.int32()), ("start_s", pa.float64()),
        ("duration_s", pa.float64()), ("batch", pa.int32()), ("kv_tokens", pa.float64()),
        ("kv_occupancy", pa.float64()),
    ]),
    "day": pa.schema([
        ("deployment", pa.dictionary(pa.int16(), pa.string())), ("deployment_id", pa.int16()),
        ("time_s", pa.float64()), ("duration_s", pa.float64()), ("replicas", pa.int32()),
        ("replicas_starting", pa.int32()), ("replicas_draining", pa.int32()),
        ("load_per_s", pa.float64()), ("served_per_s", pa.float64()),
        ("backlog", pa.float64()), ("ttft_p50_s", pa.float64()), ("ttft_p99_s", pa.float64()),
        ("tpot_p50_s", pa.float64()), ("tpot_p99_s", pa.float64()),
        ("slo_attainment", pa.float64()), ("output_tokens", pa.float64()),
    ]),
    "fleet": pa.schema([  # then one int64 column `job:<name>` per training job
        ("time_s", pa.float64()), ("duration_s", pa.float64()),
        ("serving_chips", pa.int64()), ("scaling_chips", pa.int64()),
        ("training_chips", pa.int64()), ("down_chips", pa.int64()), ("idle_chips", pa.int64()),
    ]),
}

COLUMNS: dict[str, dict[str, str]] = {
    "chips": {
        "chip_id": "chip index, 0 .. chips-1 (chip = instance x chips per instance + local)",
        "instance_id": "instance holding the chip (hot spares are the last instances)",
        "ultraserver_id": "UltraServer of the instance, -1 without UltraServers",
        "leaf_id": "EFA leaf switch of the instance",
        "x": "torus column (or position in the instance)", "y": "torus row",
        "z": "instance's index within its UltraServer (the Z ring coordinate)",
    },
    "jobs": {
        "job_id": "index of the job in the scenario", "name": "job name", "model": "model",
        "ranks": "tp x pp x dp", "chips": "chips held when whole", "instances": "instances held",
        "tp": "tensor parallel", "pp": "pipeline parallel", "dp": "data parallel",
        "submit_s": "submission time, s", "start_s": "first start, s (null: never started)",
        "end_s": "end, s (null: still going at the horizon)", "status": "final status",
        "steps_completed": "training steps kept at the end",
        "step_time_s": "one step's time from the step model, s",
        "team": "the job's team (`-`: none)",
    },
    "intervals": {
        "entity": "`job` or `chip`", "entity_id": "job_id or chip_id",
        "state": ("job: one of JOB_STATES; chip: `failed` (its instance down, not yet detected)"
                  " or `repairing` (detected, until repaired or replaced; with repairs disabled, `failed`"
                  " to the horizon)"),
        "start_s": "start, s", "end_s": "end, s (the horizon if it was still going)",
    },
    "events": {
        "time_s": "when, s", "kind": "failure, repair or checkpoint",
        "component": "failure: failed component (chip, hbm, switch, software, ...); "
                     "checkpoint: blocking or async",
        "chip_id": "chip hit (-1: none)", "instance_id": "instance hit (-1: none)",
        "job_id": "job interrupted or checkpointing (-1: none)",
    },
    "allocations": {
        "job_id": "job holding the instance", "instance_id": "instance held",
        "start_s": "from, s", "end_s": "until, s (the horizon if still held)",
    },
    "cluster_state": {
        "time_s": "when the scheduler last changed something, s (a step function)",
        "free_instances": "healthy instances held by no job",
        "queued_jobs": "jobs waiting to start", "running_jobs": "jobs holding instances",
        "fragmentation": "share of free instances outside wholly free leaf switches",
    },
    "requests": {
        "deployment": "deployment name (`serve:` entry)",
        "deployment_id": "index of the deployment in the scenario",
        "request": "request index within its deployment, in arrival order",
        "arrival_s": "arrival, s", "first_token_s": "first output token (end of the prompt's "
        "prefill on the attempt that completed), s; null if never",
        "finish_s": "last output token, s; null if unfinished",
        "input_tokens": "prompt tokens", "output_tokens": "output tokens asked for",
        "replica": "replica that served it last (-1: never routed)",
        "status": "completed, unfinished (in flight when the run ended) or rejected (its KV "
                  "cache can never fit a replica)",
        "retries": "times it was resent after its replica failed",
    },
    "replicas": {
        "deployment_id": "index of the deployment", "replica": "replica index",
        "start_s": "start of a run of iterations with a fixed batch (or an idle or down "
                   "spell), s",
        "duration_s": "its length, s (0: idle from here until the next row)",
        "batch": "sequences in the batch (decoding and prefilling)",
        "kv_tokens": "KV cache tokens held at the start (whole blocks)",
        "kv_occupancy": "kv_tokens over the replica's KV capacity",
    },
    "day": {
        "deployment": "deployment name (`serve:` entry)",
        "deployment_id": "index of the deployment in the scenario",
        "time_s": "start of the fleet step, s", "duration_s": "its length, s",
        "replicas": "replicas serving through the step",
        "replicas_starting": "replicas loading their weights, warming up or restarting",
        "replicas_draining": "replicas removed, holding their chips while they drain",
        "load_per_s": "arrival rate, requests per second (the load curve with its noise)",
        "served_per_s": "requests completed per second (at most the replicas' capacity)",
        "backlog": "requests waiting beyond what the replicas serve (mean over the step)",
        "ttft_p50_s": "median time to first token, s (the replica curve at the step's "
                      "utilisation, plus the backlog's wait)",
        "ttft_p99_s": "99th percentile time to first token, s",
        "tpot_p50_s": "median time per output token, s",
        "tpot_p99_s": "99th percentile time per output token, s",
        "slo_attainment": "share of the step's requests within both SLO bounds",
        "output_tokens": "output tokens of the requests served in the step",
    },
    "fleet": {
        "time_s": "start of the fleet step, s", "duration_s": "its length, s",
        "serving_chips": "chips of replicas serving",
        "scaling_chips": "chips of replicas loading, warming up, restarting or draining",
        "training_chips": "chips of instances training jobs hold (one more column per job, "
                          "`job:<name>`, has each job's)",
        "down_chips": "chips of instances failed or in repair",
        "idle_chips": "the rest: free instances, and the unused chips of instances a "
                      "deployment's small replicas share",
    },
    "utilisation": {
        "bin_start_s": "bin start, s", "bin_s": "bin length, s",
        "level": "cluster, ultraserver, instance or job",
        "key": "which cluster/UltraServer/instance/job (cluster: `all`)",
        **{state: "fraction of the bin's chip-time (job level: of the job's time) in this state"
           for state in UTILISATION_STATES},
    },
}


def table_metadata(table: str, version: str, seed: int, scenario_yaml: str) -> dict[bytes, bytes]:
    return {
        b"clustersim.version": version.encode(),
        b"clustersim.seed": str(seed).encode(),
        b"clustersim.scenario": scenario_yaml.encode(),
        b"clustersim.schema": SCHEMA_VERSION.encode(),
        b"clustersim.table": table.encode(),
    }


# ---------------------------------------------------------------------------------------------
# Recorders


class MemoryRecorder:
    """Keeps the fact tables as Python lists (tests, notebooks, replications)."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.intervals: list[tuple] = []
        self.allocations: list[tuple] = []
        self.states: list[tuple] = []

    def event(self, time_s: float, kind: str, component: str, chip: int, instance: int,
              job: int) -> None:
        self._append("events", self.events, (time_s, kind, component, chip, instance, job))

    def interval(self, entity: str, entity_id: int, state: str, start_s: float,
                 end_s: float) -> None:
        self._append("intervals", self.intervals, (entity, entity_id, state, start_s, end_s))

    def allocation(self, job: int, instance: int, start_s: float, end_s: float) -> None:
        self._append("allocations", self.allocations, (job, instance, start_s, end_s))

    def allocations_ended(self, job: int, instances: list[int], starts_s: list[float],
                          end_s: float) -> None:
        """An allocation row for each instance a job stops holding, in order."""
        self._extend("allocations", self.allocations,
                     [(job, instance, start, end_s)
                      for instance, start in zip(instances, starts_s, strict=True)])

    def cluster_state(self, time_s: float, free: int, queued: int, running: int,
                      fragmentation: float) -> None:
        self._append("cluster_state", self.states, (time_s, free, queued, running, fragmentation))

    def _append(self, table: str, rows: list[tuple], row: tuple) -> None:
        """One row of a fact table (a streaming recorder may write the rows out here)."""
        rows.append(row)

    def _extend(self, table: str, rows: list[tuple], new: list[tuple]) -> None:
        """Rows of a fact table, as `_append` of each in turn."""
        rows.extend(new)

    def _facts(self) -> tuple[tuple[str, list[tuple]], ...]:
        """The fact tables and their rows kept so far."""
        return (("events", self.events), ("intervals", self.intervals),
                ("allocations", self.allocations), ("cluster_state", self.states))


class ParquetRecorder(MemoryRecorder):
    """Streams the fact tables to Parquet in row groups as the simulation runs, so memory
    stays flat however long the run; `finish` writes the dimension tables and utilisation."""

    ROW_GROUP = 65_536

    def __init__(self, folder: Path, metadata: dict[str, Any]):
        super().__init__()
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.metadata = metadata
        self.writers: dict[str, pq.ParquetWriter] = {}

    def _schema(self, table: str) -> pa.Schema:
        return SCHEMAS[table].with_metadata(table_metadata(table, **self.metadata))

    def _writer(self, table: str) -> pq.ParquetWriter:
        if table not in self.writers:
            self.writers[table] = pq.ParquetWriter(self.folder / f"{table}.parquet",
                                                   self._schema(table), compression="zstd")
        return self.writers[table]

    def _maybe_flush(self, table: str, rows: list[tuple], force: bool = False) -> None:
        if rows and (force or len(rows) >= self.ROW_GROUP):
            self._writer(table).write_table(_rows_to_table(table, rows))
            rows.clear()

    def _append(self, table: str, rows: list[tuple], row: tuple) -> None:
        rows.append(row)
        self._maybe_flush(table, rows)

    def _extend(self, table: str, rows: list[tuple], new: list[tuple]) -> None:
        # Up to each row group's end, then flushed: the same row groups as row by row.
        done = 0
        while done < len(new):
            room = self.ROW_GROUP - len(rows)
            rows.extend(new[done: done + room])
            done += room
            self._maybe_flush(table, rows)

    def write_table(self, table: str, rows: Sequence[tuple] | pa.Table) -> None:
        """Write a whole table at once (dimension tables, utilisation)."""
        data = rows if isinstance(rows, pa.Table) else _rows_to_table(table, list(rows))
        pq.write_table(data.cast(self._schema(table)), self.folder / f"{table}.parquet",
                       compression="zstd")

    def close_facts(self) -> None:
        """Flush and close the streamed tables (they exist even when empty)."""
        for table, rows in self._facts():
            self._maybe_flush(table, rows, force=True)
            self._writer(table).close()
        self.writers.clear()

    def read(self, table: str) -> pa.Table:
        return pq.read_table(self.folder / f"{table}.parquet")


def _rows_to_table(table: str, rows: list[tuple]) -> pa.Table:
    schema = SCHEMAS[table]
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in schema.names]
    arrays = []
    for field_, values in zip(schema, columns, strict=True):
        if pa.types.is_dictionary(field_.type):
            arrays.append(pa.array(list(values), pa.string()).dictionary_encode().cast(
                field_.type))
        else:
            arrays.append(pa.array(list(values), field_.type))
    return pa.Table.from_arrays(arrays, schema=schema)


# ---------------------------------------------------------------------------------------------
# Interval arithmetic


@dataclass
class _StepFunctions:
    """Per job: cumulative time in each state, as piecewise-linear functions of time."""

    breakpoints: dict[int, np.ndarray] = field(default_factory=dict)
    cumulative: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)


def _job_state_functions(job_intervals: pa.Table | None, jobs: Iterable[int]) -> _StepFunctions:
    out = _StepFunctions()
    if job_intervals is None or job_intervals.num_rows == 0:
        return out
    ids = np.asarray(job_intervals["entity_id"].to_numpy(), dtype=np.int64)
    states = _state_codes(job_intervals["state"])
    start = job_intervals["start_s"].to_numpy()
    end = job_intervals["end_s"].to_numpy()
    # Each job's intervals by start time (ties in table order), every job at once: one
    # sort, then a slice per job (not a scan of every interval per job: jobs x intervals).
    order = np.lexsort((start, ids))
    ids, start, end, states = ids[order], start[order], end[order], states[order]
    bounds = np.flatnonzero(np.diff(ids)) + 1
    first = np.concatenate(([0], bounds))
    last = np.append(bounds, len(ids))
    where = dict(zip(ids[first].tolist(), zip(first.tolist(), last.tolist(), strict=True),
                     strict=True))
    for job in jobs:
        span = where.get(job)
        if span is None:
            continue
        s, e, st = start[span[0]:span[1]], end[span[0]:span[1]], states[span[0]:span[1]]
        points = np.concatenate([s, e[-1:]])
        out.breakpoints[job] = points
        entered = set(st.tolist())
        never = np.zeros(len(s) + 1)  # (what the cumulative sum of no time is, exactly)
        for code, state in enumerate(JOB_STATES):
            if code not in entered:
                out.cumulative[(job, state)] = never
                continue
            inside = np.where(st == code, e - s, 0.0)
            out.cumulative[(job, state)] = np.concatenate([[0.0], np.cumsum(inside)])
    return out


def _state_codes(column: pa.ChunkedArray) -> np.ndarray:
    """A state column as each value's position in JOB_STATES (-1: another state), read from
    its dictionary: integers compared per job, not a Python string per interval."""
    column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    lookup = np.array([JOB_STATES.index(name) if name in JOB_STATES else -1
                       for name in column.dictionary.to_pylist()] + [-1], dtype=np.int64)
    indices = column.indices.fill_null(len(lookup) - 1).to_numpy()
    return lookup[indices]


def _integrate(points: np.ndarray, cumulative: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Cumulative time in a state up to each t (linear between interval ends)."""
    return np.interp(t, points, cumulative)


def _held_by_state(functions: _StepFunctions, job: int, a_start: np.ndarray, a_end: np.ndarray,
                   edges: np.ndarray, chips_per_instance: int, chip_time: dict[str, np.ndarray],
                   key: int) -> None:
    """Chip-time per state and bin of one job over one key, from its held-instance step
    function and its state intervals merged: O((allocations + states) log + bins)."""
    points = functions.breakpoints[job]
    cuts = np.unique(np.concatenate([a_start, a_end, points]))
    if len(cuts) < 2:
        return
    left = cuts[:-1]
    held = (np.searchsorted(np.sort(a_start), left, side="right")
            - np.searchsorted(np.sort(a_end), left, side="right")) * chips_per_instance
    # The state at each piece: the interval containing its left end.
    index = np.clip(np.searchsorted(points, left, side="right") - 1, 0, len(points) - 2)
    length = np.diff(cuts)
    # Only the bins between the edge at or before its first cut and the edge at or after its
    # last: before, the cumulative chip-time is exactly 0 at every edge, after, exactly its
    # total, so the other bins would add exact zeros (most jobs span a few of a month's bins).
    first = max(int(np.searchsorted(edges, cuts[0], side="right")) - 1, 0)
    last = min(int(np.searchsorted(edges, cuts[-1], side="left")), len(edges) - 1)
    spanned = edges[first: last + 1]
    for state in JOB_STATES:
        if state == "done":
            continue
        cumulative = functions.cumulative[(job, state)]
        if not cumulative[-1] > 0:
            continue  # never in this state: it would add only zeros (most jobs, most states)
        in_state = np.diff(cumulative)[index] > 0  # the interval at this piece is this state
        chip_seconds = np.where(in_state, held * length, 0.0)
        total = np.concatenate([[0.0], np.cumsum(chip_seconds)])
        chip_time[state][key][first:last] += np.diff(np.interp(spanned, cuts, total))


def _add_spans(target: np.ndarray, keys: np.ndarray, start: np.ndarray, end: np.ndarray,
               weight: np.ndarray, edges: np.ndarray) -> None:
    """target[key, bin] += weight x the part of [start, end) in the bin, for each span, over
    only the bins it overlaps: the work grows with the spans' lengths in bins, not spans x
    bins (a year of repairs at 10-minute bins was 10^10 cells). The same sums, added in the
    same order, as clipping every span to every bin edge."""
    if not len(keys):
        return
    nbins = len(edges) - 1
    first = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, nbins - 1)
    last = np.maximum(np.clip(np.searchsorted(edges, end, side="left") - 1, 0, nbins - 1),
                      first)
    count = last - first + 1
    row = np.repeat(np.arange(len(keys)), count)
    bins = first[row] + np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)
    low = np.clip(edges[bins], start[row], end[row])
    high = np.clip(edges[bins + 1], start[row], end[row])
    np.add.at(target, (keys[row], bins), (high - low) * weight[row])


def utilisation_rows(
    *,
    horizon_s: float,
    bin_s: float,
    levels: Sequence[str],
    n_instances: int,
    chips_per_instance: int,
    instances_per_ultraserver: int,
    job_ids: Sequence[int],
    job_names: Sequence[str],
    intervals: pa.Table,
    allocations: pa.Table,
    instances: Sequence[int] | None = None,
) -> pa.Table:
    """Utilisation per time bin for the levels asked for, by interval arithmetic.

    Hardware levels: the chip-time of each bin split by the state of the job holding the
    chip (from `allocations` and the job's state intervals), `failed` and `repairing` (from
    chip intervals) and `idle` (the rest). Job level: the fraction of the bin the job spent in
    each state, `inactive` when it did not exist. Rows add up to 1. `instances` restricts the
    instance level to those instances.
    """
    # Whole bins, the last one cut at the horizon; an edge a rounding error short of the
    # horizon would make a bin of width ~0 whose fractions mean nothing.
    bins = max(1, math.ceil(horizon_s / bin_s - 1e-9))
    edges = np.minimum(np.arange(bins + 1) * bin_s, horizon_s)
    edges[-1] = horizon_s
    starts, widths = edges[:-1], np.diff(edges)
    entity = np.asarray(intervals["entity"].cast(pa.string()).to_pylist(), dtype=object)
    job_rows = intervals.filter(pa.array(entity == "job"))
    down_rows = intervals.filter(pa.array(entity == "chip"))
    functions = _job_state_functions(job_rows, job_ids)
    blocks: list[dict[str, Any]] = []

    if "job" in levels:
        for job, name in zip(job_ids, job_names, strict=True):
            fractions = {state: np.zeros(len(starts)) for state in UTILISATION_STATES}
            if job in functions.breakpoints:
                points = functions.breakpoints[job]
                for state in JOB_STATES:
                    if state == "done":
                        continue
                    c = _integrate(points, functions.cumulative[(job, state)], edges)
                    fractions[state] = np.diff(c) / widths
            used = sum(fractions[s] for s in JOB_STATES if s != "done")
            fractions["inactive"] = np.clip(1.0 - used, 0.0, 1.0)
            blocks.append({"level": "job", "key": name, **fractions})

    hardware_levels = [lv for lv in levels if lv in ("cluster", "ultraserver", "instance")]
    if hardware_levels:
        a_job = allocations["job_id"].to_numpy().astype(np.int64)
        a_inst = allocations["instance_id"].to_numpy().astype(np.int64)
        a_start = allocations["start_s"].to_numpy()
        a_end = allocations["end_s"].to_numpy()
        # Chips of an instance share their down intervals: fold identical (instance, state,
        # span) rows into one with a chip count, so the work scales with repairs, not chips.
        d_state = np.asarray(down_rows["state"].cast(pa.string()).to_pylist(), dtype=object)
        folded = np.column_stack([
            down_rows["entity_id"].to_numpy().astype(np.float64) // chips_per_instance,
            (d_state == "repairing").astype(np.float64),
            down_rows["start_s"].to_numpy(), down_rows["end_s"].to_numpy()])
        folded, r_chips = np.unique(folded.reshape(-1, 4), axis=0, return_counts=True)
        r_inst = folded[:, 0].astype(np.int64)
        r_state = np.where(folded[:, 1] == 1.0, "repairing", "failed")
        r_start, r_end = folded[:, 2], folded[:, 3]
        for level in hardware_levels:
            if level == "cluster":
                keys, a_key, r_key = 1, np.zeros_like(a_inst), np.zeros_like(r_inst)
                members = np.array([n_instances])
                names = ["all"]
            elif level == "ultraserver":
                ipu = instances_per_ultraserver
                keys = -(-n_instances // ipu)
                a_key, r_key = a_inst // ipu, r_inst // ipu
                members = np.bincount(np.arange(n_instances) // ipu, minlength=keys)
                names = [str(k) for k in range(keys)]
            else:
                chosen = np.arange(n_instances) if instances is None else np.unique(
                    np.asarray(instances, dtype=np.int64))
                lookup = np.full(n_instances, -1, dtype=np.int64)
                lookup[chosen] = np.arange(len(chosen))
                keys = len(chosen)
                a_key, r_key = lookup[a_inst], lookup[r_inst]
                members = np.ones(keys, dtype=np.int64)
                names = [str(k) for k in chosen.tolist()]
            chip_time = {state: np.zeros((keys, len(starts))) for state in UTILISATION_STATES}
            # Each job's allocations, in table order: one stable sort, a slice per job.
            by_job = np.argsort(a_job, kind="stable")
            by_job = by_job[a_key[by_job] >= 0]
            cuts = np.flatnonzero(np.diff(a_job[by_job])) + 1
            for rows in np.split(by_job, cuts) if len(by_job) else []:
                job = int(a_job[rows[0]])
                if job not in functions.breakpoints:
                    continue
                if len(rows) == 0:
                    continue
                if keys == 1:
                    _held_by_state(functions, job, a_start[rows], a_end[rows], edges,
                                   chips_per_instance, chip_time, 0)
                    continue
                # Finer levels: for an allocation [a, b) of job j, the differences of
                # C_js(clip(edge, a, b)) are its chip-time in state s per bin.
                points = functions.breakpoints[job]
                for chunk in np.array_split(rows, max(1, len(rows) // 512 + 1)):
                    if len(chunk) == 0:
                        continue
                    clipped = np.clip(edges[None, :], a_start[chunk, None], a_end[chunk, None])
                    for state in JOB_STATES:
                        if state == "done":
                            continue
                        c = _integrate(points, functions.cumulative[(job, state)], clipped)
                        per_bin = np.diff(c, axis=1) * chips_per_instance
                        np.add.at(chip_time[state], a_key[chunk], per_bin)
            for state in ("failed", "repairing"):
                chosen = np.flatnonzero((r_key >= 0) & (r_state == state))
                _add_spans(chip_time[state], r_key[chosen], r_start[chosen], r_end[chosen],
                           r_chips[chosen], edges)
            capacity = members[:, None] * chips_per_instance * widths[None, :]
            used = sum(chip_time[s] for s in UTILISATION_STATES if s not in ("idle", "inactive"))
            chip_time["idle"] = np.clip(capacity - used, 0.0, None)
            for k in range(keys):
                blocks.append({"level": level, "key": names[k],
                               **{s: chip_time[s][k] / capacity[k] for s in UTILISATION_STATES}})

    n = len(starts)
    columns: dict[str, Any] = {
        "bin_start_s": np.tile(starts, len(blocks)),
        "bin_s": np.tile(widths, len(blocks)),
        "level": [b["level"] for b in blocks for _ in range(n)],
        "key": [b["key"] for b in blocks for _ in range(n)],
    }
    for state in UTILISATION_STATES:
        columns[state] = np.concatenate([b[state] for b in blocks]) if blocks else np.array([])
    table = pa.table(columns)
    return table.cast(SCHEMAS["utilisation"])
