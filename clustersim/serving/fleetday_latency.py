"""A fleet day's latency books: per step, TTFT and TPOT percentiles and SLO attainment from
the replica curve at the step's utilisation plus the backlog's wait; over the run,
request-weighted histograms of TTFT and TPOT for its percentiles.

The curve gives LEVELS quantiles a step (about 8 KB of matrices a step), so the steps are
taken a chunk at a time and the histograms summed over the chunks: memory stays flat in the
horizon (holding a year of one-minute steps at once passed 4.7 GB).
"""

from __future__ import annotations

import numpy as np

from clustersim.serving.curves import LEVELS
from clustersim.serving.fleetday_state import HISTOGRAM_EDGES_S, DeploymentState

__all__ = ["latency_books", "LATENCY_CHUNK_STEPS"]

P50, P99 = 100, 198  # indices of LEVELS
LATENCY_CHUNK_STEPS = 4096  # steps whose quantiles are held at once


def latency_books(dep: DeploymentState, s: dict[str, np.ndarray], dts: np.ndarray
                  ) -> dict[str, np.ndarray]:
    """Fill the deployment's per-step latency columns of `s` (vectorised over a chunk of
    steps at a time); return the run's request-weighted TTFT and TPOT histograms (each
    step's quantiles weighted by the requests it served)."""
    curve = dep.curve
    service = s["replicas"] * curve.capacity_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(service > 0, s["load_per_s"] / service, curve.rho[-1])
        wait = np.where(service > 0, s["backlog_mean"] / service,
                        np.where(s["backlog_mean"] > 0, dts, 0.0))
    rho = np.where(s["backlog_mean"] > 0, curve.rho[-1], rho)
    steps = len(rho)
    s["wait_s"] = wait
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "slo_attainment"):
        s[key] = np.empty(steps)
    s["output_tokens"] = s["served"] * curve.output_tokens_mean
    s["in_system"] = np.empty(steps)
    histograms = {key: np.zeros(len(HISTOGRAM_EDGES_S) - 1) for key in ("ttft", "tpot")}
    for a in range(0, steps, LATENCY_CHUNK_STEPS):
        part = slice(a, min(steps, a + LATENCY_CHUNK_STEPS))
        ttft, tpot, e2e = curve.at(rho[part])
        ttft = ttft + wait[part, None]
        s["ttft_p50_s"][part] = ttft[:, P50]
        s["ttft_p99_s"][part] = ttft[:, P99]
        s["tpot_p50_s"][part] = tpot[:, P50]
        s["tpot_p99_s"][part] = tpot[:, P99]
        # continuous: the distribution read at the bound (no 1/201 steps, no cap below 1)
        s["slo_attainment"][part] = curve.slo_share(rho[part], dep.spec.slo.ttft_s - wait[part])
        # Little's law: requests in the system = rate through it x time in it, plus the
        # backlog.
        s["in_system"][part] = (np.minimum(s["load_per_s"][part], service[part]) * e2e
                                + s["backlog_mean"][part])
        weights = np.repeat(s["served"][part] / len(LEVELS), len(LEVELS))
        for key, values in (("ttft", ttft.ravel()), ("tpot", tpot.ravel())):
            # (a curve with no request decoding past its first token has TPOT 0: no time
            # per output token, which the lowest bin would have read as 0.1 ms)
            finite = np.isfinite(values) & (values > 0)
            histograms[key] += np.histogram(
                np.clip(values[finite], HISTOGRAM_EDGES_S[0], HISTOGRAM_EDGES_S[-1]),
                bins=HISTOGRAM_EDGES_S, weights=weights[finite])[0]
    return histograms
