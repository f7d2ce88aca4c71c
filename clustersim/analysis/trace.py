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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
    "columns_table",
    "table_metadata",
]

# 2: down intervals per chip (failed, repairing); `failed` column. 3: the job state `waiting`
# is `waiting_for_hardware`, as in summary.json (one name per state everywhere).
# 4: events `count`, `period_s` and `first_s` (a run of periodic checkpoints is one row).
SCHEMA_VERSION = "4"
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
        ("cp", pa.int32()), ("ep", pa.int32()),
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
        ("count", pa.int64()), ("period_s", pa.float64()), ("first_s", pa.float64()),
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
        "ranks": "tp x cp x pp x dp", "chips": "chips held when whole", "instances": "instances held",
        "tp": "tensor parallel", "pp": "pipeline parallel", "dp": "data parallel",
        "cp": "context parallel", "ep": "expert parallel (of the data-parallel ranks)",
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
        "count": "events the row stands for: 1, or the checkpoints of a run of periodic ones "
                 "(completed `period_s` apart from `first_s`; the row at the end of the run)",
        "period_s": "time between the checkpoints of the row, s (0: a single event)",
        "first_s": "when the first event of the row happened, s (`time_s` for a single one)",
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
              job: int, count: int = 1, period_s: float = 0.0,
              first_s: float | None = None) -> None:
        self._append("events", self.events, (time_s, kind, component, chip, instance, job,
                                              count, period_s,
                                              time_s if first_s is None else first_s))

    def interval(self, entity: str, entity_id: int, state: str, start_s: float,
                 end_s: float) -> None:
        self._append("intervals", self.intervals, (entity, entity_id, state, start_s, end_s))

    def interval_rows(self, rows: list[tuple]) -> None:
        """Several `interval` rows (entity, entity_id, state, start_s, end_s) at once."""
        self._extend("intervals", self.intervals, rows)

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
        if len(rows) >= self.ROW_GROUP:
            self._maybe_flush(table, rows)

    def interval(self, entity: str, entity_id: int, state: str, start_s: float,
                 end_s: float) -> None:
        # (`MemoryRecorder.interval` and `_append` in one call: a year writes ten million)
        rows = self.intervals
        rows.append((entity, entity_id, state, start_s, end_s))
        if len(rows) >= self.ROW_GROUP:
            self._maybe_flush("intervals", rows)

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


def _rows_to_table(table: str, rows: list[tuple]) -> pa.Table:
    names = SCHEMAS[table].names
    if set(map(len, rows)) - {len(names)}:
        raise ValueError(f"{table}: a row of other than its {len(names)} columns")
    # A column at a time: zip(*rows) of a row group's 65,536 rows was 6 times as long
    return columns_table(table, {name: [row[k] for row in rows]
                                 for k, name in enumerate(names)})


def columns_table(table: str, columns: Mapping[str, Sequence[Any]]) -> pa.Table:
    """The table `table` (its schema) of its columns by name (made a column at a time: no
    tuple per row, as `write_table`'s rows)."""
    schema = SCHEMAS[table]
    # A dictionary column straight from its strings: the dictionary in order of first
    # appearance, as encoding a string column gives it, in a tenth of the time.
    arrays = [pa.array(columns[field_.name], field_.type) for field_ in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


# ---------------------------------------------------------------------------------------------
# Interval arithmetic


