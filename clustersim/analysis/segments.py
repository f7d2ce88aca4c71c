"""Array operations on many segments at once (a job's rows each, back to back), each segment's
result exactly what the operation on that segment alone gives: the same floating-point
operations in the same order. The utilisation's work on a year's million jobs is then a few
calls over whole columns, not a few numpy calls per job (82,788 jobs' calls were 11 of the
30-day slice's 212 profiled seconds), and its output is unchanged to the bit."""

from __future__ import annotations

import numpy as np

__all__ = ["segment_cumsums", "segment_interp", "segment_ranks", "segment_starts"]


def segment_starts(lengths: np.ndarray) -> np.ndarray:
    """Where each segment begins in the arrays of all of them."""
    return np.cumsum(lengths) - lengths


def segment_cumsums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`np.cumsum` of each segment of `values` (segments of `lengths`, back to back).

    Not a cumulative sum of everything less each segment's start (rounding would differ):
    the segments are rows of a table padded with zeros after their ends, which change none
    of a row's sums up to its end, and summed along the rows (a running sum, as np.cumsum's).
    Rows of like lengths (within a factor of 2) share a table: padding at most doubles it."""
    values = np.asarray(values, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.empty(len(values))
    starts = segment_starts(lengths)
    classes = np.zeros(len(lengths), dtype=np.int64)
    classes[lengths > 0] = np.frexp(lengths[lengths > 0].astype(np.float64))[1]
    for size in np.unique(classes[lengths > 0]).tolist():
        rows = np.flatnonzero(classes == size)
        width = int(lengths[rows].max())
        columns = np.arange(width)
        inside = columns[None, :] < lengths[rows, None]
        at = (starts[rows, None] + columns[None, :])[inside]
        table = np.zeros((len(rows), width))
        table[inside] = values[at]
        out[at] = np.cumsum(table, axis=1)[inside]
    return out


def segment_ranks(segments: np.ndarray, values: np.ndarray, query_segments: np.ndarray,
                  queries: np.ndarray) -> np.ndarray:
    """For each query, how many values of its segment are at most it: `np.searchsorted(that
    segment's values, query, side="right")`. `segments` (of each value) ascending; ties of a
    value and a query put the value first, as side="right" does."""
    n = len(values)
    order = np.lexsort((np.concatenate([np.zeros(n, np.int8), np.ones(len(queries), np.int8)]),
                        np.concatenate([values, queries]),
                        np.concatenate([segments, query_segments])))
    values_so_far = np.cumsum(order < n)
    place = np.empty(len(order), dtype=np.int64)
    place[order] = np.arange(len(order))
    before = np.searchsorted(segments, query_segments, side="left")  # earlier segments'
    return values_so_far[place[n:]] - before


def segment_interp(x: np.ndarray, x_segments: np.ndarray, xp: np.ndarray,
                   xp_segments: np.ndarray, fp: np.ndarray,
                   ranks: np.ndarray | None = None) -> np.ndarray:
    """`np.interp(x, xp, fp)` of each segment's x on that segment's xp and fp (xp strictly
    increasing within a segment, `xp_segments` ascending, every x's segment non-empty): the
    formulas of numpy's own loop (numpy/_core/src/multiarray/compiled_base.c, arr_interp),
    so the same value to the bit: at or past the ends the end values, on a point its value,
    between two points slope x (x - left point) + left value. `ranks`: `segment_ranks` of
    the x, when the caller has them."""
    first = np.searchsorted(xp_segments, x_segments, side="left")
    count = np.searchsorted(xp_segments, x_segments, side="right") - first
    if ranks is None:
        ranks = segment_ranks(xp_segments, xp, x_segments, x)
    j = ranks - 1
    at = first + np.clip(j, 0, count - 1)  # the point at or before x (the first if none)
    out = fp[at]  # before the first point, at or past the last, or on a point
    between = (j >= 0) & (j < count - 1) & (xp[at] != x)
    lo = at[between]
    hi = lo + 1
    slope = (fp[hi] - fp[lo]) / (xp[hi] - xp[lo])
    value = slope * (x[between] - xp[lo]) + fp[lo]
    nan = np.isnan(value)  # numpy tries from the right point, then the equal values
    if nan.any():
        again = slope[nan] * (x[between][nan] - xp[hi][nan]) + fp[hi][nan]
        flat = np.isnan(again) & (fp[lo][nan] == fp[hi][nan])
        value[nan] = np.where(flat, fp[lo][nan], again)
    out[between] = value
    return out
