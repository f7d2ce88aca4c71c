"""Site events (power, cooling, partition) as rates: how often they interrupt a job, and how
many discrete events they add to a run.

A job's checkpoint interval (`interval: auto`) and the run's event budget read the same
rates the timeline samples (`cluster.sites.SiteEvents`), so a cluster whose only failures are
site events still checkpoints, and a partition every second for a year is refused before it
starts rather than run for hours.

Which sites a job sits on is decided at placement; before the run it is taken as the
placement on an empty cluster does it: the tightest site that holds it, else the fewest
sites, largest first. A power or cooling event downs a random block of `hit` UltraServers of
a site's `units`; it reaches a job of `j` UltraServers in the site for at most
(hit + j - 1) of the (units - hit + 1) places the block can start, so that share of the
event's rate counts (at most the whole rate): an upper bound, edge effects only lower it.
A partition of a site interrupts the jobs spanning it and another site only.
"""

from __future__ import annotations

import math

from clustersim.scenario.models import Scenario

__all__ = ["job_site_event_rate", "site_events_per_s", "job_sites"]


def _processes(scenario: Scenario):
    """(event, site index) per site-event process, as `SiteEvents` superposes them."""
    net = scenario.site_network
    if net is None:
        return []
    names = list(net.names)
    out = []
    for event in scenario.failures.site_events:
        sites = [names.index(event.site)] if event.site is not None else range(net.count)
        out.extend((event, s) for s in sites)
    return out


def site_events_per_s(scenario: Scenario) -> float:
    """Site events per second over the whole cluster (every process superposed)."""
    return sum(event.rate_per_s for event, _ in _processes(scenario))


def job_sites(scenario: Scenario, instances: int) -> dict[int, int]:
    """Instances per site of a job of `instances` placed on the empty cluster: the tightest
    site that holds it, else spread over the fewest sites, largest first."""
    net = scenario.site_network
    if net is None:
        return {}
    sizes = list(net.instances)
    fitting = [s for s in range(net.count) if sizes[s] >= instances]
    if fitting:
        return {min(fitting, key=lambda s: (sizes[s], s)): instances}
    placed: dict[int, int] = {}
    left = instances
    for s in sorted(range(net.count), key=lambda s: (-sizes[s], s)):
        if left <= 0:
            break
        placed[s] = min(sizes[s], left)
        left -= placed[s]
    return placed


def job_site_event_rate(scenario: Scenario, instances: int) -> float:
    """Site events per second that can interrupt a job of `instances` instances (an upper
    bound: see the module's docstring)."""
    processes = _processes(scenario)
    if not processes:
        return 0.0
    net = scenario.site_network
    assert net is not None
    hw = scenario.hardware
    ipu = hw.instances_per_ultraserver if hw.ultraserver else 1
    placed = job_sites(scenario, instances)
    rate = 0.0
    for event, site in processes:
        held = placed.get(site, 0)
        if held <= 0:
            continue
        if event.kind == "partition":
            if len(placed) > 1:
                rate += event.rate_per_s
            continue
        units = max(1, net.instances[site] // ipu)
        hit = max(1, min(units, math.ceil(event.share * units)))
        job_units = max(1, math.ceil(held / ipu))
        rate += event.rate_per_s * min(1.0, (hit + job_units - 1) / (units - hit + 1))
    return rate
