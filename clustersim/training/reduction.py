"""The data-parallel gradient reduction of a training step, per pipeline rank.

Each pipeline rank reduces its gradients over its data-parallel ranks (dp x cp: context-
parallel ranks hold the same weights): an all-reduce, or with ZeRO-1 and ZeRO-2 a reduce-
scatter and an all-gather of the updated parameters. With hybrid sharding (`shard` ranks per
group) the reduce-scatter and the gather run within a shard group and the shard's gradients are
all-reduced across the groups. ZeRO-3 reduce-scatters its gradients layer by layer in every
backward pass (the step model costs those with the passes): after the last one only the hybrid
all-reduce is left. A stage has one data-parallel group per TP rank. Groups on the same chips
run as one collective carrying all their gradients; groups on different chips of the same
instances share the instance's links max-min fairly (`simultaneous`) when they have several
chips per instance (one chip per instance each means their own NICs and Z links: nothing
shared). A mixture of experts reduces its expert weights afterwards, over the dp / ep ranks
that hold the same experts. This module gives durations; the step model starts the reduction
with the last backward pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

from clustersim.collectives.model import CollectiveCost, CollectiveModel, Group, simultaneous
from clustersim.collectives.sites import share_site_links
from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.lru import LruCache, key_digest
from clustersim.training.memory import (
    expert_params_per_rank,
    layer_params_per_rank,
    params_per_rank,
    stage_share,
)
from clustersim.training.ranks import (
    DEFAULT_ORDER,
    dp_rank_offsets,
    experts_inside,
    pipeline_stride,
    rank_chips,
)
from clustersim.training.shape import leaves_matter
from clustersim.training.spread_groups import GroupsOfRanks, SpreadClasses, SpreadKeys, chips_key
from clustersim.training.stages import rank_layers
from clustersim.training.workload import TrainingJob

__all__ = ["DataParallelTimes", "GradientReduction", "data_parallel_offsets"]

SOLVES_KEPT = 16_384  # reductions kept by groups' shape (two floats each), least recent dropped


class DataParallelTimes(NamedTuple):
    """One pipeline rank's data-parallel collectives: the gradient reduction (all-reduce or
    reduce-scatter) and the ZeRO-1 parameter gather (0 without ZeRO-1)."""

    reduce_s: float
    gather_s: float


def data_parallel_offsets(tp: int, cp: int, pp: int, dp: int, ep: int = 1,
                          order: str = DEFAULT_ORDER) -> np.ndarray:
    """Rank offsets of the dp x cp ranks holding the same weights as rank 0 (context-parallel
    rank innermost), in the order shard groups take them, under the rank order `order`
    (`ranks`)."""
    index = np.arange(dp * cp)
    par = SimpleNamespace(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, order=order)
    return tp * (index % cp) + dp_rank_offsets(par, index // cp)


def _offsets(par: Any) -> np.ndarray:
    return data_parallel_offsets(par.tp, par.cp, par.pp, par.dp, par.ep,
                                 getattr(par, "order", DEFAULT_ORDER))


class GradientReduction:
    """Durations of the data-parallel gradient reduction of jobs on one hardware."""

    def __init__(self, hardware: HardwareSpec, collectives: CollectiveModel):
        self.hardware = hardware
        self.collectives = collectives
        # By (ZeRO stage, the groups' shape, bytes): the planner and the timeline ask again
        # and again for the same groups, and collectives sharing links are costly to solve.
        self._cache: LruCache = LruCache(SOLVES_KEPT)
        self._leaves_matter = leaves_matter(collectives.topology)
        # Over several sites, groups inside one site see only that site's fabric, on which
        # the leaves may not matter either (`_groups_shape`).
        self._site_chips = collectives.topology.chip_site if not leaves_matter(
            collectives.topology, sites=False) else None
        # Over several sites, the same keys from the groups' ranks (`spread_groups`).
        self._spread = SpreadKeys(self.hardware, _instance_sites(
            collectives.topology, self._site_chips)) if self._leaves_matter else None
        self._first_groups: dict[tuple, tuple[Group, int]] = {}
        self._alone_times: dict[tuple, dict[int, DataParallelTimes]] = {}

    def per_pipeline_rank(self, job: TrainingJob, placed: np.ndarray, grad_bytes: int,
                          weight_bytes: int) -> dict[int, DataParallelTimes]:
        """(gradient reduction, parameter gather) of each pipeline rank of `job` on the
        instances `placed`, with `grad_bytes` and `weight_bytes` per parameter."""
        par = job.parallelism
        offsets = _offsets(par)
        z = par.shard_ranks if par.zero else len(offsets)
        per_rank = _layers_per_rank(job)
        self._pipeline_ranks = par.pp  # their reductions cross the inter-site links together
        out = {}
        for d in range(par.pp):
            layers, share = per_rank[d], stage_share(job, d)
            experts = expert_params_per_rank(job, layers, share)
            dense = params_per_rank(job, d == 0, d == par.pp - 1, layers, share) - experts
            base = d * pipeline_stride(par)
            tp_ranks = base + np.arange(par.tp)  # group t: base + t + the offsets
            shards = GroupsOfRanks(tp_ranks, offsets[:z])
            reduce_s, gather_s = self._over_groups(par.zero, shards, dense, grad_bytes,
                                                   weight_bytes, placed)
            if z < len(offsets):  # hybrid: the shard's gradients across the shard groups
                across = GroupsOfRanks(tp_ranks, offsets[::z])
                reduce_s += self._over_groups(0, across, dense / z, grad_bytes, weight_bytes,
                                              placed)[0]
            if experts and par.dp * par.cp > par.ep:
                # The dp x cp / ep ranks holding the same experts (every ep-th dp rank, each
                # with its cp ranks: context parallelism replicates the weights).
                replicas = np.arange(0, par.dp, par.ep)
                contexts = par.tp * np.arange(par.cp)
                expert_ranks = [base + t + (dp_rank_offsets(par, r + replicas)[:, None]
                                            + contexts[None, :]).ravel()
                                for t in range(par.tp) for r in range(par.ep)]
                more = self._over_groups(par.zero, expert_ranks, experts, grad_bytes,
                                         weight_bytes, placed)
                reduce_s, gather_s = reduce_s + more[0], gather_s + more[1]
            out[d] = DataParallelTimes(reduce_s, gather_s)
        return out

    def alone_per_pipeline_rank(self, job: TrainingJob, placed: np.ndarray, grad_bytes: int,
                                weight_bytes: int) -> dict[int, DataParallelTimes]:
        """A lower bound of `per_pipeline_rank`, cheap to get: each pipeline rank's first
        shard group alone (with the groups on its own chips carried in it), without the
        other groups it shares links with, the hybrid all-reduce or the experts'
        reduction. On one site only (over several the site stage is shared otherwise)."""
        par = job.parallelism
        # ZeRO-1 and 2 reduce alike; the micro-batch, recompute and sequence parallelism do
        # not change what is reduced (the planner bounds many candidates that share this).
        kind = (job.model, job.precision, par.tp, par.cp, par.pp, par.dp, par.ep,
                experts_inside(par), par.interleave, min(par.zero, 1) if par.zero < 3 else 3, par.shard_ranks,
                grad_bytes, weight_bytes, placed.tobytes())
        found = self._alone_times.get(kind)
        if found is None:
            found = self._alone_times[kind] = self._alone_per_rank(job, placed,
                                                                   grad_bytes, weight_bytes)
        return found

    def _alone_per_rank(self, job: TrainingJob, placed: np.ndarray, grad_bytes: int,
                        weight_bytes: int) -> dict[int, DataParallelTimes]:
        par = job.parallelism
        offsets = _offsets(par)
        z = par.shard_ranks if par.zero else len(offsets)
        per_rank = _layers_per_rank(job)
        out = {}
        for d in range(par.pp):
            if z == 1 or par.zero == 3:
                out[d] = DataParallelTimes(0.0, 0.0)
                continue
            layers, share = per_rank[d], stage_share(job, d)
            dense = (params_per_rank(job, d == 0, d == par.pp - 1, layers, share)
                     - expert_params_per_rank(job, layers, share))
            key = (par.tp, par.cp, par.pp, par.dp, par.ep, experts_inside(par), z, d,
                   placed.tobytes())
            found = self._first_groups.get(key)
            if found is None:
                base = d * pipeline_stride(par)
                groups = [base + t + offsets[:z] for t in range(par.tp)]
                found = self._first_groups[key] = self._first_group(groups, placed)
            group, together = found
            if par.zero in (1, 2):
                out[d] = DataParallelTimes(
                    self.collectives.cost("reduce-scatter", group,
                                          dense * grad_bytes * together).time_s,
                    self.collectives.cost("all-gather", group,
                                          dense * weight_bytes * together).time_s)
            else:
                out[d] = DataParallelTimes(
                    self.collectives.cost("all-reduce", group,
                                          dense * grad_bytes * together).time_s, 0.0)
        return out

    def zero3_layer_times(self, job: TrainingJob, placed: np.ndarray, params: float,
                          grad_bytes: int, weight_bytes: int, every_stage: bool = True
                          ) -> tuple[float, float]:
        """(all-gather, reduce-scatter) of `params` weights per rank over the shard group of
        rank 0, run at once with the other shard groups on the same instances, sharing their
        links and HBM as the ZeRO 0-2 reductions do (`_solve`): the groups of the other TP
        ranks and, with `every_stage` (a layer's weights: every pipeline stage gathers its
        layers at the same time in the steady state of the pipeline), those of the other
        pipeline ranks and of the other shard groups (hybrid sharding) on those instances.
        Groups on the same chips run as one collective carrying all their bytes; groups
        with one chip per instance each share nothing (their own NIC and Z links)."""
        par = job.parallelism
        offsets = _offsets(par)
        z = par.shard_ranks
        stride = pipeline_stride(par)
        bases = [t + stride * d for d in range(par.pp if every_stage else 1)
                 for t in range(par.tp)]
        shards = range(0, len(offsets), z) if every_stage else range(0, z, z)
        groups = [b + offsets[j: j + z] for j in shards for b in bases]
        if len(groups) > 1:  # keep the groups on the first group's instances
            hw = self.hardware
            instances = rank_chips(hw, np.stack(groups), placed) // hw.chips_per_instance
            mine = np.isin(instances, instances[0]).any(axis=1)
            groups = [g for g, keep in zip(groups, mine.tolist(), strict=True) if keep]
        scatter_s, gather_s = self._over_groups(1, groups, params, grad_bytes, weight_bytes,
                                                placed, pipeline_ranks=1)
        return gather_s, scatter_s

    def zero3_mean_layer_times(self, job: TrainingJob, placed: np.ndarray, grad_bytes: int,
                               weight_bytes: int, alone: bool = False,
                               share: float | None = None) -> tuple[float, float]:
        """(all-gather, reduce-scatter) of one mean layer's weights per rank under ZeRO-3
        (of layers whose `share` are MoE layers, default the model's):
        its dense weights over the shard group (`zero3_layer_times`, or `..._alone`), then
        with expert parallelism its routed experts over the ranks holding the same experts
        (dp x cp / ep of them, the ranks memory shards them over). Over the whole shard
        group they would be priced as if every rank of an instance wanted the same bytes,
        hiding that each of its ep ranks gathers different experts over the fabric."""
        par = job.parallelism
        layer = layer_params_per_rank(job, share)
        experts = expert_params_per_rank(job, 1.0, share) if par.ep > 1 else 0.0
        if alone:
            gather_s, scatter_s = self.zero3_layer_times_alone(job, placed, layer - experts,
                                                               grad_bytes, weight_bytes)
        else:
            gather_s, scatter_s = self.zero3_layer_times(job, placed, layer - experts,
                                                         grad_bytes, weight_bytes)
        if experts <= 0.0 or par.dp * par.cp == par.ep:
            return gather_s, scatter_s  # each rank holds its experts whole
        # The dp x cp / ep ranks holding rank 0's experts, as memory shards them (context
        # parallelism replicates the weights: a dp rank's cp ranks hold the same experts;
        # context rank innermost, as data_parallel_offsets), one such group per (pipeline,
        # tensor, expert) rank.
        holders = np.arange(0, par.dp, par.ep)
        contexts = par.tp * np.arange(par.cp)
        stride = pipeline_stride(par)
        groups = [stride * d + t + (dp_rank_offsets(par, r + holders)[:, None]
                                    + contexts[None, :]).ravel()
                  for d in range(1 if alone else par.pp)
                  for t in range(par.tp) for r in range(1 if alone else par.ep)]
        if alone:
            group, together = self._first_group(groups, placed)
            return (gather_s + self.collectives.cost(
                        "all-gather", group, experts * weight_bytes * together).time_s,
                    scatter_s + self.collectives.cost(
                        "reduce-scatter", group, experts * grad_bytes * together).time_s)
        hw = self.hardware  # keep the groups on the first group's instances
        instances = rank_chips(hw, np.stack(groups), placed) // hw.chips_per_instance
        mine = np.isin(instances, instances[0]).any(axis=1)
        groups = [g for g, keep in zip(groups, mine.tolist(), strict=True) if keep]
        more_scatter_s, more_gather_s = self._over_groups(1, groups, experts, grad_bytes,
                                                          weight_bytes, placed,
                                                          pipeline_ranks=1)
        return gather_s + more_gather_s, scatter_s + more_scatter_s

    def zero3_layer_times_alone(self, job: TrainingJob, placed: np.ndarray, params: float,
                                grad_bytes: int, weight_bytes: int) -> tuple[float, float]:
        """A lower bound of `zero3_layer_times`, cheap to get: rank 0's shard group alone,
        with the TP ranks' groups on its own chips carried in it (sharing links with the
        others only slows it)."""
        par = job.parallelism
        offsets = _offsets(par)
        groups = [t + offsets[: par.shard_ranks] for t in range(par.tp)]
        group, together = self._first_group(groups, placed)
        return (self.collectives.cost("all-gather", group,
                                      params * weight_bytes * together).time_s,
                self.collectives.cost("reduce-scatter", group,
                                      params * grad_bytes * together).time_s)

    def _first_group(self, groups: list[np.ndarray], placed: np.ndarray) -> tuple[Group, int]:
        """The first group's chips, and how many of the groups are on those chips."""
        chips = rank_chips(self.hardware, np.stack(groups), placed)
        together = int(np.count_nonzero((chips == chips[0]).all(axis=1)))
        return Group.from_rank_chips(chips[0].tolist()), together

    def _over_groups(self, zero: int, groups: list[np.ndarray] | GroupsOfRanks, params: float,
                     grad_bytes: int, weight_bytes: int, placed: np.ndarray,
                     pipeline_ranks: int | None = None) -> tuple[float, float]:
        """(reduction, gather) of `params` per rank over these groups of ranks at once:
        an all-reduce (ZeRO 0), a reduce-scatter and an all-gather (ZeRO 1 and 2), nothing
        after the step with ZeRO-3 (its reduce-scatters are in the passes). Over several
        sites, `pipeline_ranks` (default: the job's last asked) sets of such groups cross
        the inter-site links at once."""
        if not isinstance(groups, GroupsOfRanks):
            groups = GroupsOfRanks(matrix=np.stack(groups))
        if groups.shape[1] == 1 or zero == 3:
            return 0.0, 0.0
        if pipeline_ranks is None:
            pipeline_ranks = getattr(self, "_pipeline_ranks", 1)
        spread = self._spread.key(groups, placed) if self._spread is not None else None
        if spread is not None:  # over several sites: `_groups_shape`, without the chips
            shape, classes = spread
            chips = None
        else:
            chips = rank_chips(self.hardware, groups.matrix(), placed)
            shape, classes = self._groups_shape(chips), None
        # ZeRO-1 and ZeRO-2 reduce alike (a reduce-scatter and an all-gather).
        key = (min(zero, 1), shape, groups.shape[0], params, grad_bytes, weight_bytes,
               pipeline_ranks)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._solve(zero, groups, params, grad_bytes,
                                                    weight_bytes, placed, pipeline_ranks,
                                                    chips, classes)
        return cached

    def _groups_shape(self, chips: np.ndarray) -> Any:
        """The groups' chips (one row a group) up to renaming domains: for each UltraServer
        (or each instance, when no group runs on an UltraServer's Z rings), which groups hold
        which of its chips, as a multiset. The reduction's times depend on nothing else where
        leaves do not matter (`spread.leaves_matter`): every level below the fabric repeats
        identically in each domain, the fabric level counts domains, and groups sharing a
        domain's links share them alike wherever it is. So too for groups all inside one
        site of several (with the site: its own fabric, no inter-site stage), as when a hot
        spare or a free instance replaces a failed one of a job in a site: the replacement
        changes the chips but seldom this shape, and the year's thousands of replacements
        need not each solve the reduction again. Otherwise: the chips themselves."""
        if self._leaves_matter:
            site = self._one_site(chips)
            if site is None:
                return chips_key(chips, self.hardware.chips_per_instance)
            return site, self._domain_shape(chips)
        return self._domain_shape(chips)

    def _one_site(self, chips: np.ndarray) -> int | None:
        """The site holding all these chips, when there the leaves do not matter; else None."""
        if self._site_chips is None:
            return None
        sites = self._site_chips[chips]
        first = int(sites.flat[0])
        return first if bool((sites == first).all()) else None

    def _domain_shape(self, chips: np.ndarray) -> Any:
        hw = self.hardware
        unit = hw.chips_per_instance * hw.instances_per_ultraserver
        if not hw.switch_spans_ultraserver and not self._on_z_rings(
                chips // hw.chips_per_instance):
            unit = hw.chips_per_instance
        # (group, chip within the domain) as one code, ordered by domain, then code: one
        # sort of integers (the order of a lexsort by domain, group, chip, at a third of it)
        span = chips.shape[0] * unit
        domain, within = np.divmod(chips, unit)
        keys = np.sort((domain * span + np.arange(chips.shape[0])[:, None] * unit
                        + within).ravel())
        domain, codes = np.divmod(keys, span)
        cuts = np.flatnonzero(domain[1:] != domain[:-1]) + 1
        sizes = np.diff(cuts, prepend=0, append=len(codes))
        if bool((sizes == sizes[0]).all()):
            # Every domain holds as many: the multiset as the distinct rows and their counts,
            # in one array operation (a job of 8,192 instances has 2,048 domains).
            rows = codes.reshape(len(sizes), int(sizes[0]))
            rows = rows[np.lexsort(rows.T[::-1])]  # rows in order (first column first)
            starts = np.flatnonzero(np.concatenate(([True], (rows[1:] != rows[:-1]).any(
                axis=1))))
            counts = np.diff(starts, append=len(rows))
            return (unit, int(sizes[0]), key_digest(rows[starts].tobytes()),
                    key_digest(counts.tobytes()))
        return (unit, tuple(sorted(Counter(part.tobytes()
                                           for part in np.split(codes, cuts)).items())))

    def _on_z_rings(self, instances: np.ndarray) -> bool:
        """Whether a group on these instances (one row a group) runs a Z-ring stage: each
        UltraServer it touches holds the same two or more of its instances
        (`groups.build_layout`)."""
        ipu = self.hardware.instances_per_ultraserver
        if self.hardware.ultraserver is None or ipu == 1:
            return False
        for row in {row.tobytes(): row for row in instances}.values():
            members = np.unique(row)
            servers, counts = np.unique(members // ipu, return_counts=True)
            if counts[0] < 2 or np.any(counts != counts[0]):
                continue
            z_sets = (members % ipu).reshape(len(servers), counts[0])
            if np.all(z_sets == z_sets[0]):
                return True
        return False

    def _solve(self, zero: int, groups: GroupsOfRanks, params: float,
               grad_bytes: int, weight_bytes: int, placed: np.ndarray, pipeline_ranks: int,
               all_chips: np.ndarray | None, classes: SpreadClasses | None = None
               ) -> tuple[float, float]:
        """The reduction and gather of these groups, whose chips are `all_chips` (one row a
        group: `rank_chips` of them, as `_over_groups` has them), or over several sites
        the groups' `classes` of equal chips (`spread_groups`)."""
        hw = self.hardware
        if classes is None:
            by_chips: dict[bytes, tuple[np.ndarray, int]] = {}
            for ranks, chips in zip(groups.matrix(), all_chips, strict=True):
                key = chips.tobytes()
                first, count = by_chips.get(key, (ranks, 0))
                by_chips[key] = (first, count + 1)
            first_chips = rank_chips(hw, groups.row(0), placed)
            members = list(by_chips.values())
            own_instances = len(np.unique(first_chips // hw.chips_per_instance)) == len(
                first_chips)
        else:  # the same, from the groups' ranks (`SpreadClasses`)
            members = [(groups.row(i), count) for i, count in classes.members]
            own_instances = classes.own_instances
        # Over several sites, every group of every pipeline rank crosses the same inter-site
        # links at once (clustersim.collectives.sites.share_site_links).
        parallel = len(members) * pipeline_ranks
        if own_instances:
            # Each group has its own chip per instance (own NIC, own Z links): the groups
            # are translations of one another and share nothing; one stands for all.
            members = members[:1]
        reduces, gathers = [], []
        for ranks, together in members:
            group = Group.from_rank_chips(rank_chips(hw, ranks, placed))
            grads = params * grad_bytes * together
            if zero in (1, 2):
                reduces.append(self.collectives.cost("reduce-scatter", group, grads))
                gathers.append(self.collectives.cost(
                    "all-gather", group, params * weight_bytes * together))
            else:
                reduces.append(self.collectives.cost("all-reduce", group, grads))
        chips = reduces[0].group.chips
        instances = (classes.first_instances if classes is not None
                     else len(np.unique(chips // hw.chips_per_instance)))
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


def _instance_sites(topology: Any, site_chips: np.ndarray | None) -> np.ndarray | None:
    """Each instance's site (`SpreadKeys`), or None with no sites; a placement's chips are
    in one site exactly when its instances are."""
    if site_chips is None:
        return None
    cpi = topology.hardware.chips_per_instance
    by_instance = site_chips.reshape(-1, cpi)
    if not bool((by_instance == by_instance[:, :1]).all()):
        raise ValueError("an instance's chips in two sites")
    return np.ascontiguousarray(by_instance[:, 0])


def _layers_per_rank(job: TrainingJob) -> list[float]:
    par, layers = job.parallelism, job.model.layers
    if par.pp * par.interleave > layers:
        return [layers / par.pp] * par.pp
    return [float(n) for n in rank_layers(layers, par.pp, par.interleave)]


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
