"""SLO attainment as a continuous share, read from quantile functions.

A replica curve keeps each latency's quantiles at LEVELS (0, 0.005, ..., 1). Counting the
levels within a bound quantises the share at 1/201 and stops short of 1 (the top level is
the largest sample); this reads the distribution function at the bound instead: between the
two quantile levels that bracket the bound, linearly; 1 when the whole distribution is
within it, 0 when none of it is. Quantiles that are infinite (requests missing the TPOT
bound) are never within.
"""

from __future__ import annotations

import numpy as np

__all__ = ["share_within"]


def share_within(quantiles: np.ndarray, levels: np.ndarray, bound: np.ndarray | float
                 ) -> np.ndarray:
    """For each row of `quantiles` (T, L), non-decreasing along L at `levels` (L,), the share
    of the distribution at or below `bound` (scalar or (T,))."""
    q = np.asarray(quantiles, dtype=float)
    b = np.broadcast_to(np.asarray(bound, dtype=float), q.shape[:1])[:, None]
    k = np.sum(q <= b, axis=1)  # levels within: the bound lies in [q[k-1], q[k])
    top = len(levels)
    share = np.where(k >= top, 1.0, 0.0)
    inner = (k > 0) & (k < top)
    if inner.any():
        rows = np.flatnonzero(inner)
        lo = q[rows, k[rows] - 1]
        hi = q[rows, k[rows]]
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(np.isfinite(hi) & (hi > lo), (b[rows, 0] - lo) / (hi - lo), 0.0)
        share[rows] = levels[k[rows] - 1] + np.clip(w, 0.0, 1.0) * (
            levels[k[rows]] - levels[k[rows] - 1])
    return share
