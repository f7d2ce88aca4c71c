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

from clustersim.analysis.segments import segment_cumsums, segment_interp, segment_starts
from clustersim.analysis.trace import JOB_STATES, SCHEMAS, UTILISATION_STATES

__all__ = [
    "JOBS_PER_PASS",
    "utilisation_rows",
]

# Jobs worked on at a time: a range of job ids and its intervals and allocations (the year's
# million jobs in 16 ranges). The result does not depend on it: jobs are added in id order.
JOBS_PER_PASS = 65_536
# Jobs whose held chip-time is made at once (`_held_by_state`): enough that numpy's calls
# cost little per job, few enough that their arrays stay small.
HELD_JOBS = 8_192
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


def _held_by_state(functions: _StepFunctions, a_job: np.ndarray, a_start: np.ndarray,
                   a_end: np.ndarray, edges: np.ndarray, chips_per_instance: int,
                   chip_time: dict[str, np.ndarray]) -> None:
    """Chip-time per state and bin of these allocations (by job, each job's in table order)
    to the one key, every job at once: per job, its held-instance step function and its
    state intervals merged at their cuts, the chip-time of each piece in each state summed
    and read at the bin edges. The `segments` operations do per job what numpy did job by
    job, to the bit, and the jobs' sums are added to the bins in job order as before."""
    start, end, states = functions.arrays
    jobs, allocations = np.unique(a_job, return_counts=True)
    spans = [functions.where.get(job, (0, 0)) for job in jobs.tolist()]
    known = np.array([job in functions for job in jobs.tolist()], dtype=bool)
    if not known.any():
        return
    # Segment k: the k-th job with state intervals; its allocations and its intervals.
    kept = np.repeat(known, allocations)
    a_seg = np.repeat(np.arange(known.sum()), allocations[known])
    a_start, a_end = a_start[kept], a_end[kept]
    first, last = np.array(spans, dtype=np.int64).reshape(-1, 2)[known].T
    rows = last - first  # its intervals
    at = np.arange(rows.sum()) - np.repeat(segment_starts(rows) - first, rows)
    s, e, st = start[at], end[at], states[at]
    # Its breakpoints (`_StepFunctions.of`): the intervals' starts, then the last one's end.
    p_len = rows + 1
    p_first = segment_starts(p_len)
    p_seg = np.repeat(np.arange(len(rows)), p_len)
    points = np.empty(p_len.sum())
    points[np.arange(len(at)) - np.repeat(segment_starts(rows) - p_first, rows)] = s
    points[p_first + rows] = end[last - 1]
    # Its cuts: the distinct allocation starts and ends and breakpoints, in order.
    values = np.concatenate([a_start, a_end, points])
    segs = np.concatenate([a_seg, a_seg, p_seg])
    order = np.lexsort((values, segs))
    values, segs = values[order], segs[order]
    new = np.ones(len(values), dtype=bool)
    new[1:] = (values[1:] != values[:-1]) | (segs[1:] != segs[:-1])
    cut_of = np.empty(len(values), dtype=np.int64)
    cut_of[order] = np.cumsum(new) - 1
    cuts, c_seg = values[new], segs[new]
    c_len = np.bincount(c_seg, minlength=len(rows))
    c_first = segment_starts(c_len)

    def at_or_before(of: np.ndarray) -> np.ndarray:
        """Per cut, how many of these values of its job are at or before it."""
        total = np.cumsum(np.bincount(of, minlength=len(cuts)))
        return total - np.concatenate([[0], total])[c_first][c_seg]

    n = len(a_start)
    held = (at_or_before(cut_of[:n]) - at_or_before(cut_of[n:2 * n])) * chips_per_instance
    # The state at each piece: the interval containing its left end.
    index = np.clip(at_or_before(cut_of[2 * n:]) - 1, 0, p_len[c_seg] - 2) + p_first[c_seg]
    piece = np.ones(len(cuts), dtype=bool)  # a piece from each cut but a job's last
    piece[c_first + c_len - 1] = False
    held, index = held[piece], index[piece]
    length = np.diff(cuts)[piece[:-1]]
    later_points = np.ones(len(points), dtype=bool)
    later_points[p_first] = False
    later_cuts = np.ones(len(cuts), dtype=bool)
    later_cuts[c_first] = False
    # The bins from the edge at or before a job's first allocation to the edge at or after
    # the end of its last: before and after, its chip-time in any state is constant (held is
    # 0), its bins' differences exact zeros, which added change no bin (a job done in its
    # first days has intervals to the horizon: all a month's bins, 60 times the work).
    # Jobs of one cut add nothing.
    whole = c_len >= 2
    a_first = segment_starts(allocations[known])
    low = np.maximum(np.searchsorted(edges, np.minimum.reduceat(a_start, a_first),
                                     side="right") - 1, 0)
    high = np.minimum(np.searchsorted(edges, np.maximum.reduceat(a_end, a_first),
                                      side="left"), len(edges) - 1)
    count = np.where(whole, high - low + 1, 0)
    q_seg = np.repeat(np.arange(len(rows)), count)
    q_bin = np.arange(count.sum()) - np.repeat(segment_starts(count) - low, count)
    # Each edge's rank among its job's cuts: a cut is at or before edge b when fewer than
    # b + 1 edges are below it, so one search of the (job, edges below) integer keys.
    stride = len(edges) + 1
    below = np.searchsorted(edges, cuts, side="left")
    ranks = (np.searchsorted(c_seg * stride + below, q_seg * stride + q_bin, side="right")
             - c_first[q_seg])
    step = np.ones(len(q_bin), dtype=bool)  # a bin from each edge but a job's last
    step[segment_starts(count)[count > 0] + count[count > 0] - 1] = False
    for code, state in enumerate(JOB_STATES):
        if state == "done":
            continue
        inside = np.where(st == code, e - s, 0.0)
        cumulative = np.zeros(len(points))  # (`of`: 0, then the running sum of each job)
        cumulative[later_points] = segment_cumsums(inside, rows)
        in_state = (cumulative[index + 1] - cumulative[index]) > 0
        chip_seconds = np.where(in_state, held * length, 0.0)
        total = np.zeros(len(cuts))  # at each cut: 0, then the running sum of each job
        total[later_cuts] = segment_cumsums(chip_seconds, c_len - 1)
        # Jobs ever in this state (the others would add only zeros)
        wanted = (cumulative[p_first + rows] > 0)[q_seg]
        read = segment_interp(edges[q_bin[wanted]], q_seg[wanted], cuts, c_seg, total,
                              ranks[wanted])
        adds = step[wanted]
        np.add.at(chip_time[state][0], q_bin[wanted][adds], np.diff(read)[adds[:-1]])


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
        folded, r_chips = _distinct_rows(
            (d_chip // chips_per_instance, d_repairing, d_start, d_end))
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


def _distinct_rows(columns: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(np.column_stack(columns), axis=0, return_counts=True)`: the distinct rows in
    order (by the first column, then the next...) and how many times each occurs. One
    lexsort of the columns, not numpy's sort of the rows as records (5 times as long)."""
    rows = np.column_stack(columns).reshape(-1, len(columns))
    if not len(rows):
        return rows, np.zeros(0, dtype=np.int64)
    rows = rows[np.lexsort(columns[::-1])]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    starts = np.flatnonzero(new)
    return rows[starts], np.diff(np.append(starts, len(rows)))


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
    if keys == 1:
        # `HELD_JOBS` jobs at a time: their arrays are a fraction of a pass's (a pass's at
        # once were 200 MB more at the peak), and the jobs still reach the bins in id order.
        if not len(by_job):
            return
        firsts = np.flatnonzero(np.diff(a_job[by_job], prepend=-1))[::HELD_JOBS]
        for lo, hi in zip(firsts.tolist(), [*firsts[1:].tolist(), len(by_job)], strict=True):
            rows = by_job[lo:hi]
            _held_by_state(functions, a_job[rows], a_start[rows], a_end[rows], edges,
                           chips_per_instance, chip_time)
        return
    cuts = np.flatnonzero(np.diff(a_job[by_job])) + 1
    for rows in np.split(by_job, cuts) if len(by_job) else []:
        job = int(a_job[rows[0]])
        if job not in functions:
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
