"""The data-parallel gradient reduction of a training step, per pipeline rank.

Each pipeline rank reduces its gradients over its data-parallel ranks: an all-reduce, or with
ZeRO-1 a reduce-scatter and an all-gather of the updated parameters. A stage has one
data-parallel group per TP rank. Groups on the same chips run as one collective carrying all
their gradients; groups on different chips of the same instances share the instance's links
max-min fairly (`simultaneous`) when they have several chips per instance (one chip per
instance each means their own NICs and Z links: nothing shared). A mixture of experts
reduces its expert weights afterwards, over the dp / ep ranks that hold the same experts.
This module gives durations; the step model starts the reduction with the last backward
pass.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from clustersim.collectives.model import CollectiveCost, CollectiveModel, Group, simultaneous
from clustersim.collectives.sites import share_site_links
from clustersim.hardware.catalog import HardwareSpec
from clustersim.training.ranks import rank_chips
from clustersim.training.workload import TrainingJob, expert_params_per_rank, params_per_rank

__all__ = ["DataParallelTimes", "GradientReduction"]


class DataParallelTimes(NamedTuple):
    """One pipeline rank's data-parallel collectives: the gradient reduction (all-reduce or
    reduce-scatter) and the ZeRO-1 parameter gather (0 without ZeRO-1)."""

    reduce_s: float
    gather_s: float


class GradientReduction:
    """Durations of the data-parallel gradient reduction of jobs on one hardware."""

    def __init__(self, hardware: HardwareSpec, collectives: CollectiveModel):
        self.hardware = hardware
        self.collectives = collectives

    def per_pipeline_rank(self, job: TrainingJob, placed: np.ndarray, grad_bytes: int,
                          weight_bytes: int) -> dict[int, DataParallelTimes]:
        """(gradient reduction, parameter gather) of each pipeline rank of `job` on the
        instances `placed`, with `grad_bytes` and `weight_bytes` per parameter."""
        par = job.parallelism
        stride = par.tp * par.pp
        self._pipeline_ranks = par.pp  # their reductions cross the inter-site links together
        experts = expert_params_per_rank(job)
        out = {}
        for d in range(par.pp):
            dense = params_per_rank(job, d == 0, d == par.pp - 1) - experts
            dp_ranks = [d * par.tp + t + stride * np.arange(par.dp) for t in range(par.tp)]
            reduce_s, gather_s = self._over_groups(par.zero, dp_ranks, dense, grad_bytes,
                                                   weight_bytes, placed)
            if experts and par.dp > par.ep:
                replicas = np.arange(0, par.dp, par.ep)  # dp ranks holding the same experts
                expert_ranks = [d * par.tp + t + stride * (r + replicas)
                                for t in range(par.tp) for r in range(par.ep)]
                more = self._over_groups(par.zero, expert_ranks, experts, grad_bytes,
                                         weight_bytes, placed)
                reduce_s, gather_s = reduce_s + more[0], gather_s + more[1]
            out[d] = DataParallelTimes(reduce_s, gather_s)
        return out

    def _over_groups(self, zero: int, groups: list[np.ndarray], params: float,
                     grad_bytes: int, weight_bytes: int, placed: np.ndarray
                     ) -> tuple[float, float]:
        """(reduction, gather) of `params` per rank over these groups of ranks at once."""
        if len(groups[0]) == 1:
            return 0.0, 0.0
        hw = self.hardware
        by_chips: dict[bytes, tuple[np.ndarray, int]] = {}
        # Every group's chips at once (the groups have one length): one array operation,
        # not one per group.
        all_chips = rank_chips(hw, np.stack(groups), placed)
        for ranks, chips in zip(groups, all_chips, strict=True):
            key = chips.tobytes()
            first, count = by_chips.get(key, (ranks, 0))
            by_chips[key] = (first, count + 1)
        first_chips = rank_chips(hw, groups[0], placed)
        # Over several sites, every group of every pipeline rank crosses the same inter-site
        # links at once (clustersim.collectives.sites.share_site_links).
        parallel = len(by_chips) * getattr(self, "_pipeline_ranks", 1)
        if len(np.unique(first_chips // hw.chips_per_instance)) == len(first_chips):
            # Each group has its own chip per instance (own NIC, own Z links): the groups
            # are translations of one another and share nothing; one stands for all.
            first_key = next(iter(by_chips))
            by_chips = {first_key: by_chips[first_key]}
        reduces, gathers = [], []
        for ranks, together in by_chips.values():
            group = Group.from_rank_chips(rank_chips(hw, ranks, placed).tolist())
            grads = params * grad_bytes * together
            if zero == 1:
                reduces.append(self.collectives.cost("reduce-scatter", group, grads))
                gathers.append(self.collectives.cost(
                    "all-gather", group, params * weight_bytes * together))
            else:
                reduces.append(self.collectives.cost("all-reduce", group, grads))
        chips = reduces[0].group.chips
        instances = len(np.unique(chips // hw.chips_per_instance))
        shared = len(chips) > instances  # several chips of one group in an instance
        topology = self.collectives.topology
        if topology.site_count > 1:
            # Over several sites: the stages inside the sites share links as on one site;
            # the site stage of every group of every pipeline rank crosses the same inter-site
            # links at once (share_site_links), after them.
            layout = self.collectives.layout(reduces[0].group)
            site = [_site_part(share_site_links(topology, c, layout, parallel))
                    for c in reduces + gathers]
            reduce_site = max(site[: len(reduces)], default=0.0)
            gather_site = max(site[len(reduces):], default=0.0)
            return (_slowest(self.collectives, [_below_sites(c) for c in reduces], shared)
                    + reduce_site,
                    _slowest(self.collectives, [_below_sites(c) for c in gathers], shared)
                    + gather_site)
        return (_slowest(self.collectives, reduces, shared),
                _slowest(self.collectives, gathers, shared))


def _site_part(cost: CollectiveCost) -> float:
    return sum(s.time_s for s in cost.stages if s.level == "site")


def _below_sites(cost: CollectiveCost) -> CollectiveCost:
    return replace(cost, stages=tuple(s for s in cost.stages if s.level != "site"))


def _slowest(model: CollectiveModel, costs: list[CollectiveCost], shared: bool) -> float:
    """Time until the last of collectives running at once is done."""
    if not costs:
        return 0.0
    if len(costs) == 1 or not shared:
        return max(c.time_s for c in costs)
    return max(c.time_s for c in simultaneous(model, costs))
