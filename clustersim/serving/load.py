"""A deployment's arrival rate over time (`workload.load`), on a grid of fixed steps.

Both levels of fidelity read the same grid: the fluid fleet model takes one rate per step,
and the request-level simulator draws its arrivals from it by time rescaling (a unit-rate
Poisson or gamma process on the integrated rate, mapped back through its inverse), so they
see the same curve and the same noise. The noise is a log-normal factor of mean 1, drawn
once per `noise_interval` from the deployment's own stream.
"""

from __future__ import annotations

import math

import numpy as np

from clustersim.scenario.fleetday import DAY_S, LoadCurveSpec

__all__ = ["load_rates", "load_seed", "rescale_arrivals", "LOAD_STREAM"]

LOAD_STREAM = 17  # spawn key of the load curves' noise, apart from the requests' streams


def load_seed(seed: int, index: int) -> np.random.SeedSequence:
    """The noise stream of deployment `index` (the same for both levels of fidelity)."""
    return np.random.SeedSequence(seed, spawn_key=(LOAD_STREAM, index))


def _curve(load: LoadCurveSpec, t: np.ndarray) -> np.ndarray:
    if load.sinusoid is not None:
        s = load.sinusoid
        middle = (s.peak_per_s + s.trough_per_s) / 2.0
        amplitude = (s.peak_per_s - s.trough_per_s) / 2.0
        return middle + amplitude * np.cos(2 * math.pi * (t - s.peak_at_s) / DAY_S)
    assert load.hourly is not None
    points = np.asarray(load.hourly, dtype=float)
    hours = t / 3600.0
    if load.between == "step":
        index = np.floor(hours).astype(np.int64)
        index = index % len(points) if load.repeat == "daily" else np.minimum(index,
                                                                               len(points) - 1)
        return points[index]
    if load.repeat == "daily":  # periodic: hour 24 is hour 0 again
        return np.interp(hours % 24.0, np.arange(25.0), np.append(points, points[0]))
    # Linear between points; the last one holds for its hour.
    return np.interp(hours, np.arange(len(points) + 1.0), np.append(points, points[-1]))


def load_rates(load: LoadCurveSpec, start_s: float, span_s: float, step_s: float,
               seed: np.random.SeedSequence) -> np.ndarray:
    """Requests per second in each step [start + k step, start + (k+1) step) of the span (the
    curve at the step's middle, times the noise factor of the noise interval it falls in)."""
    steps = max(1, math.ceil(span_s / step_s - 1e-9))
    middle = start_s + (np.arange(steps) + 0.5) * step_s
    rates = np.maximum(_curve(load, middle), 0.0)
    if load.noise > 0:
        blocks = math.ceil((start_s + span_s) / load.noise_interval_s) + 1
        sigma = load.noise
        factor = np.exp(np.random.default_rng(seed).normal(-sigma**2 / 2, sigma, blocks))
        rates = rates * factor[(middle // load.noise_interval_s).astype(np.int64)]
    return rates


def rescale_arrivals(unit_times: np.ndarray, rates: np.ndarray, step_s: float) -> np.ndarray:
    """Arrival times of a process whose rate is `rates` per step, from the arrival times of a
    unit-rate one (time rescaling: t = L^-1(u), L the integrated rate); those past the span's
    integral are dropped."""
    cumulative = np.concatenate(([0.0], np.cumsum(rates * step_s)))
    times = np.arange(len(rates) + 1) * step_s
    keep = unit_times[unit_times < cumulative[-1]]
    # np.interp on a non-decreasing cumulative: a step with no load is skipped over.
    return np.interp(keep, cumulative, times)
