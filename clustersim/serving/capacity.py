"""Capacity: the highest arrival rate a deployment holds within its latency objectives.

The share of requests meeting both the TTFT and TPOT bounds (`slo_goodput`) falls as the rate
grows past what the replicas can batch. A rate at which the deployment is `saturated` (its
queue grows over the horizon) is never held, whatever its goodput over a short horizon.
`find_rate` brackets the rate where it crosses the target (doubling or halving from a first
guess, never above `rate_ceiling`), then bisects, keeping the highest rate held below the
lowest that failed. When the ceiling itself holds the answer is "at least" it.

Every trial serves the same requests (common random numbers): the first n of the
deployment's stream from the same seed, their arrivals scaled by the rate, so that two rates
differ only in how close together the requests come. n is at first the scenario's own
count (its rate over its horizon) and at least 1/(1 - goodput) (with fewer one miss already
fails the target and none passes it: the halving once accepted 0.0215/s on 3 requests).

A trial judges a share only as finely as its requests allow. Near the capacity of a
deployment whose goodput falls slowly with the rate (a few long prompts miss the TTFT bound
whenever they arrive during others' decoding: Llama 3.1 405B on trn2 keeps 99.6% at 0.1/s,
99.1% at 0.5/s, 98.0% at 0.7/s) one more or one fewer such prompt in a 300-request trial
swung the answer from 0.055/s to 0.91/s with the seed. So a trial decides only when its
share is clear of the target by Z_DECISIVE binomial standard deviations (sqrt(g (1 - g) /
n) at the target g); otherwise it is run again on TRIAL_GROWTH times the requests, up to
MAX_TRIAL_REQUESTS, where a share still within that noise is judged as measured and the
rate noted (`within_noise`). The halving ends once the target is shown out of reach: fewer
than `goodput` of the requests could meet the SLO even on an idle replica (`idle_bound`,
checked before any trial), or a trial near idle failed it (an offered load under IDLE_LOAD
of one replica's work: lower rates change little).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clustersim.hardware import limits
from clustersim.scenario.models import Scenario
from clustersim.serving.idle_bound import IdleBound, idle_bound
from clustersim.serving.simulate import deployment_figures, simulate_serving
from clustersim.serving.trials import SloTrial

__all__ = ["RateSearch", "find_rate", "min_trial_requests", "rate_ceiling"]


@dataclass
class RateSearch:
    """The answer and every rate tried, with its figures."""

    deployment: str
    target_goodput: float
    rate_per_s: float | None  # the highest rate tried that met the target
    figures: dict[str, Any] | None
    tried: list[tuple[float, float]] = field(default_factory=list)  # (rate, slo_goodput)
    saturated: set[float] = field(default_factory=set)  # the rates tried that saturated
    ceiling_per_s: float = math.inf  # the highest rate the search may try
    at_ceiling: bool = False  # no rate tried failed (the ceiling held): the answer is "at least"
    idle: IdleBound | None = None  # the share that could meet the SLO on an idle replica
    near_idle_per_s: float | None = None  # the halving stopped at this failing rate, near idle
    requests: list[int] = field(default_factory=list)  # each trial's requests, as `tried`
    within_noise: set[float] = field(default_factory=set)  # rates judged at the most requests
    # a trial allows, their share still within Z_DECISIVE standard deviations of the target

    def best(self) -> tuple[float, float] | None:
        """(rate, goodput) of the trial with the highest goodput (the highest rate on ties)."""
        seen = [(g, r) for r, g in self.tried if g is not None]
        if not seen:
            return None
        goodput, rate = max(seen)
        return rate, goodput


MAX_BRACKET_TRIALS = 30  # doublings or halvings before the bisection
# The most requests a trial is lengthened to bring (goodput 1: any miss fails; 0.999's share).
MAX_MIN_TRIAL_REQUESTS = 1000
# Near idle: the offered load under 1% of one replica's work (rate x the least service time
# of the mean request / replicas): a request finds another in service about 1% of the time,
# so a lower rate changes its latency little.
IDLE_LOAD = 0.01
IDLE_SAMPLE_REQUESTS = 10_000  # lengths drawn for the idle bound (its share within about 0.5%)
# A trial decides when its share is this many binomial standard deviations from the target
# (about 98% one-sided); else it runs again on TRIAL_GROWTH times the requests, up to
# MAX_TRIAL_REQUESTS (at 99%: one standard deviation 0.11% of the share, about 5% of the
# rate where Llama 3.1 405B's goodput falls 3.6% per request/s near 0.65/s; a trial of it
# about 1.5 s of CPU; 20,000 took twice the time and moved its answer by as much).
Z_DECISIVE = 2.0
TRIAL_GROWTH = 4
MAX_TRIAL_REQUESTS = 8_000


def min_trial_requests(goodput: float) -> int:
    """The fewest requests a trial needs for one miss to be within the target's allowance:
    1 / (1 - goodput) (100 at 0.99), at most MAX_MIN_TRIAL_REQUESTS."""
    if goodput >= 1.0 - 1.0 / MAX_MIN_TRIAL_REQUESTS:
        return MAX_MIN_TRIAL_REQUESTS
    return math.ceil(1.0 / (1.0 - goodput) - 1e-9)


def rate_ceiling(scenario: Scenario, spec: Any) -> float:
    """The highest rate `find_rate` tries: limits.MAX_REQUEST_RATE_PER_S, and without a
    `workload.requests` cap no more than limits.MAX_RATE_SEARCH_REQUESTS expected requests
    per trial (each trial simulates the whole horizon: doubling with no ceiling reached
    2.7e9/s and ran out of memory)."""
    ceiling = limits.MAX_REQUEST_RATE_PER_S
    span = scenario.duration_s - spec.start_s
    if spec.workload.requests is None and span > 0:
        ceiling = min(ceiling, limits.MAX_RATE_SEARCH_REQUESTS / span)
    return ceiling


def _with_rate(scenario: Scenario, index: int, rate: float, requests: int) -> Scenario:
    """The scenario at `rate` serving the deployment's first `requests` requests: its
    horizon `requests / rate` from its start (the arrivals of a unit-rate stream scaled by
    1 / rate, so every rate draws the same requests; at most `workload.requests`)."""
    serve = list(scenario.serve)
    d = serve[index]
    wanted = min(requests, d.workload.requests or requests)
    serve[index] = d.model_copy(update={"workload": d.workload.model_copy(
        update={"rate_per_s": rate})})
    update: dict[str, Any] = {"serve": serve}
    if wanted > rate * (scenario.duration_s - d.start_s):
        update["duration_s"] = d.start_s + wanted / rate
    changed = scenario.model_copy(update=update)
    changed._source = scenario.source
    return changed


def decisive(share: float, goodput: float, requests: int) -> bool:
    """Whether a trial's share of `requests` is clear of `goodput` by Z_DECISIVE binomial
    standard deviations (at the target): one more or fewer miss would not change it."""
    spread = math.sqrt(goodput * (1.0 - goodput) / max(1, requests))
    return abs(share - goodput) >= Z_DECISIVE * spread


def find_rate(scenario: Scenario, deployment: str | None = None, goodput: float = 0.99,
              seed: int | None = None, bisections: int = 6, base_dir: Path | None = None,
              stop_early: bool = False) -> RateSearch:
    """Highest Poisson/gamma arrival rate of `deployment` (default: the first) at which at
    least `goodput` of its requests meet the scenario's TTFT and TPOT bounds and its queue
    does not grow (not `saturated`). `stop_early` (the serving planner's): a run stops once
    it cannot reach `goodput` (serving.trials), the same answer sooner; `tried` and
    `saturated` then hold such a run's figures so far."""
    names = [d.name for d in scenario.serve]
    if not names:
        raise ValueError("the scenario has no serve: deployments")
    name = deployment or names[0]
    if name not in names:
        raise ValueError(f"no deployment {name!r}; expected one of {', '.join(names)}")
    index = names.index(name)
    spec = scenario.serve[index]
    if spec.workload.arrival == "trace":
        raise ValueError(f"deployment {name!r} replays a trace: its rate is the trace's")
    seed = scenario.seed if seed is None else seed
    search = RateSearch(name, goodput, None, None)
    search.idle = idle_bound(scenario, index, base_dir, IDLE_SAMPLE_REQUESTS)
    ceiling = rate_ceiling(scenario, spec)
    search.ceiling_per_s = ceiling
    rate = min(float(spec.workload.rate_per_s or spec.replicas), ceiling)
    # The scenario's own requests at its rate, at least 1 / (1 - goodput)
    first = max(min_trial_requests(goodput),
                math.ceil(rate * (scenario.duration_s - spec.start_s) - 1e-9))
    most = max(first, MAX_TRIAL_REQUESTS)

    def evaluate(rate: float) -> dict[str, Any]:
        requests = first
        while True:
            variant = _with_rate(scenario, index, rate, requests)
            # A stopped run's share so far is under `goodput` too: its requests that can
            # still meet the SLO are too few (the trial's bound), so `holds` says no.
            result = simulate_serving(variant, np.random.SeedSequence(seed, spawn_key=(16,)),
                                      base_dir, trial=SloTrial(name, goodput) if stop_early
                                      else None, stratified=True)
            figures = deployment_figures(variant, result)[name]
            share = figures["slo_goodput"]
            if (share is None or figures["saturated"]
                    or decisive(share, goodput, figures["requests"])):
                break
            if requests >= most or (spec.workload.requests is not None
                                    and requests >= spec.workload.requests):
                search.within_noise.add(rate)
                break
            # the requests that would tell this share from the target, at least 4 times more
            gap = max(abs(share - goodput), 1e-9)
            needed = Z_DECISIVE**2 * goodput * (1.0 - goodput) / gap**2
            requests = min(most, max(TRIAL_GROWTH * requests, math.ceil(1.2 * needed)))
        search.tried.append((rate, share))
        search.requests.append(figures["requests"])
        if figures["saturated"]:
            search.saturated.add(rate)
        return figures

    def holds(figures: dict[str, Any]) -> bool:
        # (a trial without requests shows nothing held: None)
        return (figures["slo_goodput"] or 0.0) >= goodput and not figures["saturated"]

    figures = evaluate(rate)
    if search.idle is not None and search.idle.share < goodput:
        # Out of reach at any rate: a trial that held showed a lucky sample, not a capacity.
        return search
    good, bad = (rate, figures) if holds(figures) else (None, None), None
    if good[0] is not None:
        while bad is None and len(search.tried) < MAX_BRACKET_TRIALS and rate < ceiling:
            rate = min(2 * rate, ceiling)
            figures = evaluate(rate)
            if holds(figures):
                good = (rate, figures)
            else:
                bad = rate
        if bad is None:  # every rate tried held (up to the ceiling): the answer is "at least"
            search.rate_per_s, search.figures = good
            search.at_ceiling = True
            return search
    else:
        bad = rate
        while good[0] is None and len(search.tried) < MAX_BRACKET_TRIALS:
            if (search.idle is not None
                    and rate * search.idle.service_s / spec.replicas <= IDLE_LOAD):
                search.near_idle_per_s = rate  # failed near idle: lower rates change little
                break
            rate /= 2
            figures = evaluate(rate)
            if figures["slo_goodput"] is None:  # no request arrived: nor will one lower down
                break
            if holds(figures):
                good = (rate, figures)
            else:
                bad = rate  # the lowest failing rate bounds the bisection
    if good[0] is None or bad is None:
        return search
    low, high = good[0], bad
    for _ in range(bisections):
        middle = (low + high) / 2
        figures = evaluate(middle)
        if holds(figures):
            low, good = middle, (middle, figures)
        else:
            high = middle
    search.rate_per_s, search.figures = good
    return search
