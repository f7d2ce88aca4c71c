"""Utilisation from a run's traces: the chip-time of each level (cluster, instance, job) by
state, per time bin, by interval arithmetic on the traces' step functions.

The traces are read once, in record batches, into compact arrays bucketed by ranges of job
ids (`JOBS_PER_PASS`); each range is then worked on alone. The per-job work (sorts, step
functions, slices) of a year's million jobs held at once was about 3 GB more than the run."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from clustersim.analysis.trace import JOB_STATES, SCHEMAS, UTILISATION_STATES

__all__ = [
    "JOBS_PER_PASS",
    "utilisation_rows",
]

# Jobs worked on at a time: a range of job ids and its intervals and allocations (the year's
# million jobs in 16 ranges). The result does not depend on it: jobs are added in id order.
JOBS_PER_PASS = 65_536
# Rows decoded at a time from a trace file.
_BATCH_ROWS = 1 << 20


class _StepFunctions:
    """Per job: cumulative time in each state, as piecewise-linear functions of time, made
    when a job's are asked for (`of`) and not kept: a year's million jobs' were 2 GB."""

    def __init__(self) -> None:
        self.where: dict[int, tuple[int, int]] = {}  # job -> its rows in the sorted arrays
        self.arrays: tuple[np.ndarray, ...] = ()

    def __contains__(self, job: int) -> bool:
        return job in self.where

    def of(self, job: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The job's breakpoints and its cumulative time in each state at them."""
        start, end, states = self.arrays
        first, last = self.where[job]
        s, e, st = start[first:last], end[first:last], states[first:last]
        points = np.concatenate([s, e[-1:]])
        cumulative = {}
        entered = set(st.tolist())
        never = np.zeros(len(s) + 1)  # (what the cumulative sum of no time is, exactly)
        for code, state in enumerate(JOB_STATES):
            if code not in entered:
                cumulative[state] = never
                continue
            inside = np.where(st == code, e - s, 0.0)
            cumulative[state] = np.concatenate([[0.0], np.cumsum(inside)])
        return points, cumulative


def _job_state_functions(ids: np.ndarray, states: np.ndarray, start: np.ndarray,
                         end: np.ndarray, jobs: Iterable[int]) -> _StepFunctions:
    """The step functions of `jobs` from their intervals' columns (job id, state code,
    start, end), in table order."""
    out = _StepFunctions()
    if len(ids) == 0:
        return out
    ids = ids.astype(np.int64, copy=False)
    # Each job's intervals by start time (ties in table order), every job at once: one
    # sort, then a slice per job (not a scan of every interval per job: jobs x intervals).
    order = np.lexsort((start, ids))
    ids, start, end, states = ids[order], start[order], end[order], states[order]
    bounds = np.flatnonzero(np.diff(ids)) + 1
    first = np.concatenate(([0], bounds))
    last = np.append(bounds, len(ids))
    where = dict(zip(ids[first].tolist(), zip(first.tolist(), last.tolist(), strict=True),
                     strict=True))
    out.arrays = (start, end, states)
    out.where = {job: where[job] for job in jobs if job in where}
    return out


def _codes(column: pa.Array | pa.ChunkedArray, names: Sequence[str]) -> np.ndarray:
    """A string column as each value's position in `names` (-1: another value or null),
    read from its dictionary: integers compared, not a Python string per row."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    lookup = np.array([names.index(name) if name in names else -1
                       for name in column.dictionary.to_pylist()] + [-1], dtype=np.int8)
    indices = column.indices.fill_null(len(lookup) - 1).to_numpy(zero_copy_only=False)
    return lookup[indices]


def _batches(source: pa.Table | Path, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """A trace's columns a record batch at a time, in table order (a Parquet file is
    decoded a batch at a time, not read whole)."""
    if isinstance(source, pa.Table):
        yield from source.select(list(columns)).to_batches(max_chunksize=_BATCH_ROWS)
    else:
        yield from pq.ParquetFile(source).iter_batches(batch_size=_BATCH_ROWS,
                                                       columns=list(columns))


class _Buckets:
    """Rows of a trace bucketed by their job's range of ids (`JOBS_PER_PASS`), in table
    order within each: compact column arrays, joined when a range is worked on."""

    def __init__(self, first_job: int, jobs_per_pass: int):
        self.first_job = first_job
        self.jobs_per_pass = jobs_per_pass
        self.parts: dict[int, list[tuple[np.ndarray, ...]]] = {}

    def add(self, job_ids: np.ndarray, *columns: np.ndarray) -> None:
        if not len(job_ids):
            return
        bucket = (job_ids.astype(np.int64) - self.first_job) // self.jobs_per_pass
        order = np.argsort(bucket, kind="stable")
        ranked = bucket[order]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(ranked)) + 1))
        for rows, index in zip(np.split(order, starts[1:]), ranked[starts].tolist(),
                               strict=True):
            self.parts.setdefault(index, []).append(
                tuple(column[rows] for column in (job_ids, *columns)))

    def take(self, index: int, empty: tuple[np.dtype, ...]) -> tuple[np.ndarray, ...]:
        """The range's rows (and forget them): `empty`'s dtypes where it has none."""
        parts = self.parts.pop(index, [])
        if not parts:
            return tuple(np.array([], dtype=dtype) for dtype in empty)
        return tuple(np.concatenate(column) for column in zip(*parts, strict=True))


def _integrate(points: np.ndarray, cumulative: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Cumulative time in a state up to each t (linear between interval ends)."""
    return np.interp(t, points, cumulative)


def _held_by_state(functions: _StepFunctions, job: int, a_start: np.ndarray, a_end: np.ndarray,
                   edges: np.ndarray, chips_per_instance: int, chip_time: dict[str, np.ndarray],
                   key: int) -> None:
    """Chip-time per state and bin of one job over one key, from its held-instance step
    function and its state intervals merged: O((allocations + states) log + bins)."""
    points, cumulatives = functions.of(job)
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
        cumulative = cumulatives[state]
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


def _read_traces(intervals: pa.Table | Path, allocations: pa.Table | Path, first_job: int,
                 jobs_per_pass: int, with_allocations: bool
                 ) -> tuple[_Buckets, _Buckets, tuple[np.ndarray, ...]]:
    """One pass over each trace: the job intervals and the allocations bucketed by range of
    job ids, and the chip intervals (chip id, 1.0 if repairing, start, end)."""
    job_rows, held = _Buckets(first_job, jobs_per_pass), _Buckets(first_job, jobs_per_pass)
    chip_parts: list[tuple[np.ndarray, ...]] = []
    for batch in _batches(intervals, ("entity", "entity_id", "state", "start_s", "end_s")):
        entity = _codes(batch.column("entity"), ("job", "chip"))
        ids = batch.column("entity_id").to_numpy(zero_copy_only=False)
        start = batch.column("start_s").to_numpy(zero_copy_only=False)
        end = batch.column("end_s").to_numpy(zero_copy_only=False)
        is_job, is_chip = entity == 0, entity == 1
        job_rows.add(ids[is_job], _codes(batch.column("state"), JOB_STATES)[is_job],
                     start[is_job], end[is_job])
        if is_chip.any():
            repairing = _codes(batch.column("state"), ("repairing",))[is_chip] == 0
            chip_parts.append((ids[is_chip].astype(np.float64), repairing.astype(np.float64),
                               start[is_chip], end[is_chip]))
    if with_allocations:
        for batch in _batches(allocations, ("job_id", "instance_id", "start_s", "end_s")):
            held.add(*(batch.column(name).to_numpy(zero_copy_only=False)
                       for name in ("job_id", "instance_id", "start_s", "end_s")))
    chips = (tuple(np.concatenate(column) for column in zip(*chip_parts, strict=True))
             if chip_parts else tuple(np.array([]) for _ in range(4)))
    return job_rows, held, chips


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
    intervals: pa.Table | Path,
    allocations: pa.Table | Path,
    instances: Sequence[int] | None = None,
    jobs_per_pass: int = JOBS_PER_PASS,
) -> pa.Table:
    """Utilisation per time bin for the levels asked for, by interval arithmetic.

    Hardware levels: the chip-time of each bin split by the state of the job holding the
    chip (from `allocations` and the job's state intervals), `failed` and `repairing` (from
    chip intervals) and `idle` (the rest). Job level: the fraction of the bin the job spent in
    each state, `inactive` when it did not exist. Rows add up to 1. `instances` restricts the
    instance level to those instances. `intervals` and `allocations`: the tables, or their
    Parquet files (read a batch at a time). `jobs_per_pass`: job ids worked on at a time.
    """
    if jobs_per_pass < 1:
        raise ValueError(f"jobs_per_pass {jobs_per_pass}: expected at least 1")
    # Whole bins, the last one cut at the horizon; an edge a rounding error short of the
    # horizon would make a bin of width ~0 whose fractions mean nothing.
    bins = max(1, math.ceil(horizon_s / bin_s - 1e-9))
    edges = np.minimum(np.arange(bins + 1) * bin_s, horizon_s)
    edges[-1] = horizon_s
    starts, widths = edges[:-1], np.diff(edges)
    hardware_levels = [lv for lv in levels if lv in ("cluster", "ultraserver", "instance")]
    ids = np.asarray(job_ids, dtype=np.int64)
    first_job = int(ids.min()) if len(ids) else 0
    job_rows, held, down = _read_traces(intervals, allocations, first_job, jobs_per_pass,
                                        bool(hardware_levels))
    passes = int((ids.max() - first_job) // jobs_per_pass) + 1 if len(ids) else 0
    ranges = (ids - first_job) // jobs_per_pass
    keyed = [_level_keys(level, n_instances, instances_per_ultraserver, instances)
             for level in hardware_levels]
    chip_time = [{state: np.zeros((len(names), len(starts))) for state in UTILISATION_STATES}
                 for _, names, _ in keyed]
    job_fractions: dict[int, dict[str, np.ndarray]] = {}
    for index in range(passes):
        wanted = ids[ranges == index].tolist()
        functions = _job_state_functions(
            *job_rows.take(index, (np.int32, np.int8, np.float64, np.float64)), wanted)
        if "job" in levels:
            for job in wanted:
                job_fractions[job] = _job_fractions(functions, job, edges, widths)
        a_job, a_inst, a_start, a_end = held.take(
            index, (np.int32, np.int32, np.float64, np.float64))
        for (lookup, _, _), times in zip(keyed, chip_time, strict=True):
            _add_held(functions, a_job, a_inst, a_start, a_end, lookup, edges,
                      chips_per_instance, times)
        del functions, a_job, a_inst, a_start, a_end

    blocks: list[dict[str, Any]] = []
    if "job" in levels:
        for job, name in zip(job_ids, job_names, strict=True):
            blocks.append({"level": "job", "key": name, **job_fractions[int(job)]})
    if hardware_levels:
        # Chips of an instance share their down intervals: fold identical (instance, state,
        # span) rows into one with a chip count, so the work scales with repairs, not chips.
        d_chip, d_repairing, d_start, d_end = down
        folded = np.column_stack([d_chip // chips_per_instance, d_repairing, d_start, d_end])
        folded, r_chips = np.unique(folded.reshape(-1, 4), axis=0, return_counts=True)
        r_inst = folded[:, 0].astype(np.int64)
        r_state = np.where(folded[:, 1] == 1.0, "repairing", "failed")
        r_start, r_end = folded[:, 2], folded[:, 3]
        for level, (lookup, names, members), times in zip(hardware_levels, keyed, chip_time,
                                                          strict=True):
            r_key = lookup(r_inst)
            for state in ("failed", "repairing"):
                chosen = np.flatnonzero((r_key >= 0) & (r_state == state))
                _add_spans(times[state], r_key[chosen], r_start[chosen], r_end[chosen],
                           r_chips[chosen], edges)
            capacity = members[:, None] * chips_per_instance * widths[None, :]
            used = sum(times[s] for s in UTILISATION_STATES if s not in ("idle", "inactive"))
            times["idle"] = np.clip(capacity - used, 0.0, None)
            for k in range(len(names)):
                blocks.append({"level": level, "key": names[k],
                               **{s: times[s][k] / capacity[k] for s in UTILISATION_STATES}})

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


def _job_fractions(functions: _StepFunctions, job: int, edges: np.ndarray,
                   widths: np.ndarray) -> dict[str, np.ndarray]:
    """The fraction of each bin the job spent in each state (`inactive`: did not exist)."""
    fractions = {state: np.zeros(len(widths)) for state in UTILISATION_STATES}
    if job in functions:
        points, cumulatives = functions.of(job)
        for state in JOB_STATES:
            if state == "done":
                continue
            c = _integrate(points, cumulatives[state], edges)
            fractions[state] = np.diff(c) / widths
    used = sum(fractions[s] for s in JOB_STATES if s != "done")
    fractions["inactive"] = np.clip(1.0 - used, 0.0, 1.0)
    return fractions


def _level_keys(level: str, n_instances: int, instances_per_ultraserver: int,
                instances: Sequence[int] | None) -> tuple[Any, list[str], np.ndarray]:
    """A hardware level's key of each instance (-1: not reported), its keys' names and
    their instances each."""
    if level == "cluster":
        return (lambda inst: np.zeros_like(inst)), ["all"], np.array([n_instances])
    if level == "ultraserver":
        ipu = instances_per_ultraserver
        keys = -(-n_instances // ipu)
        members = np.bincount(np.arange(n_instances) // ipu, minlength=keys)
        return (lambda inst: inst // ipu), [str(k) for k in range(keys)], members
    chosen = np.arange(n_instances) if instances is None else np.unique(
        np.asarray(instances, dtype=np.int64))
    table = np.full(n_instances, -1, dtype=np.int64)
    table[chosen] = np.arange(len(chosen))
    return ((lambda inst: table[inst]), [str(k) for k in chosen.tolist()],
            np.ones(len(chosen), dtype=np.int64))


def _add_held(functions: _StepFunctions, a_job: np.ndarray, a_inst: np.ndarray,
              a_start: np.ndarray, a_end: np.ndarray, lookup: Any, edges: np.ndarray,
              chips_per_instance: int, chip_time: dict[str, np.ndarray]) -> None:
    """Add the chip-time of these allocations, by the state of the job holding them, to each
    key's bins; jobs in id order, each job's allocations in table order."""
    a_key = lookup(a_inst)
    keys = len(next(iter(chip_time.values())))
    by_job = np.argsort(a_job, kind="stable")
    kept = a_key[by_job] >= 0
    if not kept.all():
        by_job = by_job[kept]
    del kept
    cuts = np.flatnonzero(np.diff(a_job[by_job])) + 1
    for rows in np.split(by_job, cuts) if len(by_job) else []:
        job = int(a_job[rows[0]])
        if job not in functions:
            continue
        if keys == 1:
            _held_by_state(functions, job, a_start[rows], a_end[rows], edges,
                           chips_per_instance, chip_time, 0)
            continue
        # Finer levels: for an allocation [a, b) of job j, the differences of
        # C_js(clip(edge, a, b)) are its chip-time in state s per bin.
        points, cumulatives = functions.of(job)
        for chunk in np.array_split(rows, max(1, len(rows) // 512 + 1)):
            if len(chunk) == 0:
                continue
            clipped = np.clip(edges[None, :], a_start[chunk, None], a_end[chunk, None])
            for state in JOB_STATES:
                if state == "done":
                    continue
                c = _integrate(points, cumulatives[state], clipped)
                per_bin = np.diff(c, axis=1) * chips_per_instance
                np.add.at(chip_time[state], a_key[chunk], per_bin)
