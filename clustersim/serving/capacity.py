"""Capacity: the highest arrival rate a deployment holds within its latency objectives.

The share of requests meeting both the TTFT and TPOT bounds (`slo_goodput`) falls as the rate
grows past what the replicas can batch. A rate at which the deployment is `saturated` (its
queue grows over the horizon) is never held, whatever its goodput over a short horizon.
`find_rate` brackets the rate where it crosses the target (doubling or halving from a first
guess, never above `rate_ceiling`), then bisects; every rate tried is simulated over the
scenario's horizon with the same seed, so the answer is deterministic. When the ceiling
itself holds the answer is "at least" it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clustersim.hardware import limits
from clustersim.scenario.models import Scenario
from clustersim.serving.simulate import deployment_figures, simulate_serving
from clustersim.serving.trials import SloTrial

__all__ = ["RateSearch", "find_rate", "rate_ceiling"]


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


MAX_BRACKET_TRIALS = 30  # doublings or halvings before the bisection


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


def _with_rate(scenario: Scenario, index: int, rate: float) -> Scenario:
    serve = list(scenario.serve)
    d = serve[index]
    serve[index] = d.model_copy(update={"workload": d.workload.model_copy(
        update={"rate_per_s": rate})})
    changed = scenario.model_copy(update={"serve": serve})
    changed._source = scenario.source
    return changed


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

    def evaluate(rate: float) -> dict[str, Any]:
        variant = _with_rate(scenario, index, rate)
        # A stopped run's share so far is under `goodput` too: its requests that can still
        # meet the SLO are too few (the trial's bound), so `holds` says no, as it would.
        result = simulate_serving(variant, np.random.SeedSequence(seed, spawn_key=(16,)),
                                  base_dir, trial=SloTrial(name, goodput) if stop_early
                                  else None)
        figures = deployment_figures(variant, result)[name]
        search.tried.append((rate, figures["slo_goodput"]))
        if figures["saturated"]:
            search.saturated.add(rate)
        return figures

    def holds(figures: dict[str, Any]) -> bool:
        # (a trial without requests shows nothing held: None)
        return (figures["slo_goodput"] or 0.0) >= goodput and not figures["saturated"]

    ceiling = rate_ceiling(scenario, spec)
    search.ceiling_per_s = ceiling
    rate = min(float(spec.workload.rate_per_s or spec.replicas), ceiling)
    figures = evaluate(rate)
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
