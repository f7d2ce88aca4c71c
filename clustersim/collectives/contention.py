"""Collectives running at the same time: the resources each one uses and their max-min fair
share (links, HBM, EFA)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from clustersim.collectives.costs import CollectiveCost
from clustersim.collectives.sites import site_link_rates

if TYPE_CHECKING:
    from clustersim.collectives.model import CollectiveModel

__all__ = ["resource_rates", "capacity", "simultaneous"]


def resource_rates(model: CollectiveModel, cost: CollectiveCost, instance: int | None = None
                   ) -> dict[tuple, float]:
    """Peak rate at which the collective uses each resource while it transfers.

    Resources: directed links (`("link", u, v)`, bytes/s) and chips' HBM (`("hbm", chip)`,
    bytes/s) of its instance and UltraServer levels, for every instance of the group; and
    each domain's EFA (`("efa", first chip)`, as a fraction of it: 1 when a fabric stage
    runs). The rate of a resource is the highest over the steps that use it (bytes of the
    step on it over the step's time alone), so collectives sharing it are assumed to meet
    in their busiest steps: two identical collectives each take twice as long. With
    `instance`, the links and HBM of that instance (and its UltraServer) only.
    """
    if cost.group is None or cost.transfer_s <= 0:
        return {}
    layout = model.layout(cost.group)
    topology = model.topology
    n_chips = topology.chips
    rates: dict[tuple, float] = {}

    def peak(key: tuple, rate: float) -> None:
        if rate > rates.get(key, 0.0):
            rates[key] = rate

    for stage in cost.stages:
        if stage.transfer_s <= 0:
            continue
        if stage.level == "fabric":
            for domain in layout.domains.tolist():
                peak(("efa", domain), 1.0)
            continue
        if stage.level == "site":
            for key, rate in site_link_rates(topology, layout, stage).items():
                peak(key, rate)
            continue
        chips, steps, span = model.stage_steps(stage, layout)
        link_rate: dict[tuple[int, int], float] = {}
        hbm_rate = 0.0
        for step in steps:
            step_s = max(model.coster.link_time(step.flows, step.flow_bytes)[0],
                         step.hbm_bytes_per_chip / model.coster.hbm_rate())
            if step_s <= 0:
                continue
            hbm_rate = max(hbm_rate, step.hbm_bytes_per_chip / step_s)
            loads: Counter[tuple[int, int]] = Counter()
            for a, b in step.flows:
                nodes = topology.route(a, b)
                for u, v in zip(nodes, nodes[1:], strict=False):
                    loads[(u, v)] += 1
            for edge, count in loads.items():
                link_rate[edge] = max(link_rate.get(edge, 0.0), count * step.flow_bytes / step_s)
        rep_base = chips[0] - chips[0] % span
        if instance is None:
            bases = (np.unique(cost.group.chips // span) * span).tolist()
        else:
            first = instance * model.hardware.chips_per_instance
            bases = [first - first % span]
        links = list(link_rate.items())
        # Links between chips move with the chips (`_translate`), as most do: the loops
        # below peak each resource as `peak` does, without a call per link and instance.
        between_chips = all(u < n_chips and v < n_chips for (u, v), _ in links)
        for base in bases:
            shift = base - rep_base
            if between_chips:
                for (u, v), rate in links:
                    key = ("link", u + shift, v + shift)
                    if rate > rates.get(key, 0.0):
                        rates[key] = rate
            else:
                for (u, v), rate in links:
                    su, sv = _translate(model, u, v, shift), _translate(model, v, u, shift)
                    peak(("link", su, sv), rate)
            for chip in chips:
                key = ("hbm", chip + shift)
                if hbm_rate > rates.get(key, 0.0):
                    rates[key] = hbm_rate
    return rates


def _translate(model: CollectiveModel, node: int, other: int, shift: int) -> int:
    """A node of the representative's links, moved to another instance: chips shift,
    a chip switch becomes the switch of the shifted chip at the link's other end."""
    if node < model.topology.chips:
        return node + shift
    return model.topology._switch_of(other + shift)


def capacity(model: CollectiveModel, key: tuple) -> float:
    """What a resource of `resource_rates` can carry."""
    if key[0] == "link":
        data = model.topology.edge(key[1], key[2])
        return data["bandwidth_bytes_per_s"] * model.coster.efficiency(data["kind"])
    if key[0] == "hbm":
        return model.coster.hbm_rate()
    return 1.0


def simultaneous(model: CollectiveModel, costs: Sequence[CollectiveCost]) -> list[CollectiveCost]:
    """Collectives running at the same time, sharing links, HBM and EFA max-min fairly.

    Each collective alone uses each resource at some peak rate. Run together, each one's
    transfer runs at a speed found by progressive filling: every speed rises together until
    some shared resource is full; the collectives using it are frozen there, the others go on
    rising (to at most their speed alone). Two identical collectives on the same links each
    get half the bandwidth. Only the transfer part slows; latency does not.
    """
    instance = _common_instance(model, costs)
    rates = [model.resource_rates(c, instance) for c in costs]
    keys = list({key for r in rates for key in r})
    if not keys:
        return list(costs)
    # One row per collective, one column per resource: the loops below are over arrays
    # (sums run row by row, in the same order as a loop over the collectives would).
    column = {key: j for j, key in enumerate(keys)}
    use = np.zeros((len(costs), len(keys)))
    for i, r in enumerate(rates):
        for key, rate in r.items():
            use[i, column[key]] = rate
    limit = np.array([model.capacity(key) for key in keys])  # (looked up once per model)
    speed = np.array([0.0 if r else 1.0 for r in rates])
    frozen = np.array([not r for r in rates])
    while not frozen.all():
        active = np.flatnonzero(~frozen)
        step = float((1.0 - speed[active]).min())
        growth = use[active].sum(axis=0)
        rising = growth > 0
        if rising.any():
            load = (speed[:, None] * use[:, rising]).sum(axis=0)
            step = min(step, float((np.maximum(0.0, limit[rising] - load)
                                    / growth[rising]).min()))
        speed[active] += step
        full = (speed[:, None] * use).sum(axis=0) >= limit * (1 - 1e-9)
        stop = (speed[active] >= 1.0 - 1e-12) | (use[np.ix_(active, np.flatnonzero(full))]
                                                  > 0).any(axis=1)
        frozen[active[stop]] = True
    return [c.scaled(1.0 / s) if 0 < s < 1 else c
            for c, s in zip(costs, speed.tolist(), strict=True)]


def _common_instance(model: CollectiveModel, costs: Sequence[CollectiveCost]) -> int | None:
    """The first instance of the collectives' groups when every group spans the same
    instances, else None. Each collective then loads every one of those instances (and
    UltraServers) alike, so the shares found on one are those found on all: `simultaneous`
    looks at that one only (the same speeds, without a resource per link of every
    instance). So too over several sites: the EFA domains and inter-site links a group
    uses are kept whole (`resource_rates` limits only links and HBM to the instance), and
    the instances of every site are built alike."""
    if any(c.group is None for c in costs):
        return None
    cpi = model.hardware.chips_per_instance
    spans = [np.unique(c.group.chips // cpi) for c in costs if c.group is not None]
    if any(not np.array_equal(s, spans[0]) for s in spans[1:]):
        return None
    return int(spans[0][0])
