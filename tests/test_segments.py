"""The many-segment array operations give each segment, to the bit, what numpy gives that
segment alone (the utilisation's output must not move by a bit when made job by job or all
jobs at once)."""

import numpy as np
import pytest

from clustersim.analysis.segments import (
    segment_cumsums,
    segment_interp,
    segment_ranks,
    segment_starts,
)
from clustersim.analysis.utilisation import _distinct_rows


def _bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).view(np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_segment_cumsums_are_each_segments_own(seed):
    rng = np.random.default_rng(seed)
    # lengths from empty to thousands (rows of unlike lengths padded apart); magnitudes far
    # apart, so a running sum less the segment's start would round differently
    lengths = rng.integers(0, [3, 40, 3000][seed % 3], rng.integers(1, 60))
    values = rng.exponential(1e5, lengths.sum()) * rng.choice([1e-9, 1.0, 1e7], lengths.sum())
    values[rng.random(len(values)) < 0.2] = 0.0
    made = segment_cumsums(values, lengths)
    for start, length in zip(segment_starts(lengths), lengths, strict=True):
        alone = np.cumsum(values[start: start + length])
        assert np.array_equal(_bits(made[start: start + length]), _bits(alone))


def _segments(rng, count):
    xs, fs, queries = [], [], []
    for _ in range(count):
        x = np.unique(np.round(rng.uniform(0, 1e6, rng.integers(1, 50)), rng.integers(-3, 3)))
        steps = rng.exponential(1e9, len(x) - 1) * (rng.random(len(x) - 1) < 0.7)
        fs.append(np.concatenate([[0.0], np.cumsum(steps)]))
        xs.append(x)
        # before, past, on the points and between them
        queries.append(np.sort(np.concatenate([rng.uniform(-1e5, 1.1e6, 20),
                                               rng.choice(x, 5)])))
    return xs, fs, queries


@pytest.mark.parametrize("seed", range(6))
def test_segment_interp_and_ranks_are_numpys(seed):
    rng = np.random.default_rng(100 + seed)
    xs, fs, queries = _segments(rng, int(rng.integers(1, 40)))
    xp, fp, x = (np.concatenate(a) for a in (xs, fs, queries))
    xp_seg = np.repeat(np.arange(len(xs)), [len(a) for a in xs])
    x_seg = np.repeat(np.arange(len(xs)), [len(a) for a in queries])
    alone = np.concatenate([np.interp(q, a, f) for q, a, f in zip(queries, xs, fs, strict=True)])
    assert np.array_equal(_bits(segment_interp(x, x_seg, xp, xp_seg, fp)), _bits(alone))
    ranks = np.concatenate([np.searchsorted(a, q, side="right")
                            for q, a in zip(queries, xs, strict=True)])
    assert np.array_equal(segment_ranks(xp_seg, xp, x_seg, x), ranks)


def test_distinct_rows_are_numpys_unique_rows():
    rng = np.random.default_rng(7)
    for size in (0, 1, 5, 300):
        columns = tuple(rng.integers(0, 3, size) * rng.choice([1.0, 0.5]) for _ in range(4))
        rows, counts = np.unique(np.column_stack(columns).reshape(-1, 4), axis=0,
                                 return_counts=True)
        made, made_counts = _distinct_rows(columns)
        assert np.array_equal(made, rows) and np.array_equal(made_counts, counts)
