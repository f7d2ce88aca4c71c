"""Site events on a fleet day (the timeline's `cluster.sites.SiteEvents`, on the fleet's
pools of instances: the fluid model places by count, not by site).

- Power or cooling downs its share of the site (whole UltraServers) for its duration, taken
  from the jobs and the free pool in proportion to what each holds; the deployments'
  instances are left alone, as on the timeline. A job hit waits for the instances to come
  back, then restarts from its last checkpoint.
- A partition stops every job no one site holds (it spans sites) until it ends; no hardware
  goes down.

Events are drawn after the failures from the same stream, so a run without site events draws
exactly as before.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from clustersim.scenario.models import Scenario

__all__ = ["site_events", "largest_site", "apply_site_event"]


def site_events(scenario: Scenario, rng: np.random.Generator, horizon_s: float
                ) -> list[tuple[float, bool, int, str]]:
    """(time, False, instances, "site-<kind>:<index>") of every site event, `index` the
    event's in failures.site_events (for its duration); a partition downs 0 instances."""
    net = scenario.site_network
    if net is None:
        return []
    hw = scenario.hardware
    ipu = hw.instances_per_ultraserver if hw.ultraserver else 1
    names = list(net.names)
    out = []
    for index, event in enumerate(scenario.failures.site_events):
        sites = [names.index(event.site)] if event.site is not None else range(net.count)
        for site in sites:
            units = max(1, net.instances[site] // ipu)
            width = 0 if event.kind == "partition" else (
                max(1, min(units, math.ceil(event.share * units))) * ipu)
            count = int(rng.poisson(event.rate_per_s * horizon_s))
            for t in np.sort(rng.uniform(0.0, horizon_s, count)).tolist():
                out.append((t, False, width, f"site-{event.kind}:{index}"))
    return out


def largest_site(scenario: Scenario) -> int:
    """Working instances of the largest site (0 without sites): a job above it spans sites."""
    net = scenario.site_network
    if net is None:
        return 0
    return max(n - s for n, s in zip(net.instances, net.spares, strict=True))


def apply_site_event(now: float, width: int, what: str, scenario: Scenario, jobs: list[Any],
                     state: dict[str, int], repairs: list[tuple[float, int]],
                     failures: dict[str, int], lose: Callable[[Any], None]) -> None:
    """One site event on the fleet's books (module docstring)."""
    f = scenario.failures
    kind, index = what.split(":")
    event = f.site_events[int(index)]
    failures[kind] = failures.get(kind, 0) + 1
    if kind == "site-partition":
        spans = largest_site(scenario)
        for job in jobs:
            if job.held > spans and job.state in ("running", "restarting"):
                lose(job)
                job.interruptions += 1
                job.state = "restarting"
                job.ready_at = (max(job.ready_at, now + event.duration_s) + f.restart_s
                                + job.restore_s)
        return
    holders = [j for j in jobs if j.held]
    pool = sum(j.held for j in holders) + state["free"]
    if pool <= 0:
        return
    share = min(1.0, width / pool)
    downed_all = 0
    for job in holders:
        downed = min(job.held, round(job.held * share))
        if not downed:
            continue
        job.held -= downed
        lose(job)
        job.interruptions += 1
        job.state = "waiting_for_hardware"
        job.missing += downed
        job.ready_at = max(job.ready_at, now + event.duration_s)
        downed_all += downed
    free = min(state["free"], max(0, width - downed_all))
    state["free"] -= free
    downed_all += free
    state["down"] += downed_all
    if downed_all:
        heapq.heappush(repairs, (now + event.duration_s, downed_all))
