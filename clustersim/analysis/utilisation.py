"""Utilisation from a run's traces: the chip-time of each level (cluster, instance, job) by
state, per time bin, by interval arithmetic on the traces' step functions."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clustersim.analysis.trace import JOB_STATES, SCHEMAS, UTILISATION_STATES

__all__ = [
    "utilisation_rows",
]


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
    out.arrays = (start, end, states)
    out.where = {job: where[job] for job in jobs if job in where}
    return out


def _state_codes(column: pa.ChunkedArray) -> np.ndarray:
    """A state column as each value's position in JOB_STATES (-1: another state), read from
    its dictionary: integers compared per job, not a Python string per interval."""
    column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    lookup = np.array([JOB_STATES.index(name) if name in JOB_STATES else -1
                       for name in column.dictionary.to_pylist()] + [-1], dtype=np.int8)
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
    # (compared in Arrow: a Python string per row was a gigabyte of a year's intervals)
    entity = intervals["entity"].cast(pa.string())
    down_rows = intervals.filter(pc.equal(entity, "chip"))
    # (the job rows' copy dropped once their step functions are made: a year's are 300 MB)
    functions = _job_state_functions(intervals.filter(pc.equal(entity, "job")), job_ids)
    del entity
    blocks: list[dict[str, Any]] = []

    if "job" in levels:
        for job, name in zip(job_ids, job_names, strict=True):
            fractions = {state: np.zeros(len(starts)) for state in UTILISATION_STATES}
            if job in functions:
                points, cumulatives = functions.of(job)
                for state in JOB_STATES:
                    if state == "done":
                        continue
                    c = _integrate(points, cumulatives[state], edges)
                    fractions[state] = np.diff(c) / widths
            used = sum(fractions[s] for s in JOB_STATES if s != "done")
            fractions["inactive"] = np.clip(1.0 - used, 0.0, 1.0)
            blocks.append({"level": "job", "key": name, **fractions})

    hardware_levels = [lv for lv in levels if lv in ("cluster", "ultraserver", "instance")]
    if hardware_levels:
        # (32-bit ids as written: the same sorts and keys at half a year's 14 M rows' bytes)
        a_job = allocations["job_id"].to_numpy()
        a_inst = allocations["instance_id"].to_numpy()
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
            kept = a_key[by_job] >= 0
            if not kept.all():
                by_job = by_job[kept]
            del kept
            cuts = np.flatnonzero(np.diff(a_job[by_job])) + 1
            for rows in np.split(by_job, cuts) if len(by_job) else []:
                job = int(a_job[rows[0]])
                if job not in functions:
                    continue
                if len(rows) == 0:
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
