"""Rank 0's parallel groups of a placed training job, the ones the step model costs its
collectives on: its tensor-parallel group, its context-parallel group and the slowest
expert-parallel group.

A synchronous step waits for the slowest expert group's all-to-all, so where the expert
groups split over the NeuronLink domains in several ways (`ranks.expert_groups_by_split`:
a group straddling two domains unevenly is costed by `collectives.uneven`) one of each way
is priced at the job's dispatch size and the slowest kept; where they split alike it is
rank 0's. A group uneven over several sites (not modelled) is left out. The expert and
context groups come with how many such groups share each of their chips (they exchange at
the same time through the same links).

Groups are kept by what they depend on (the degrees, the dispatch size and the placement),
the least recently used dropped past `SHAPES_KEPT`.
"""

from __future__ import annotations

import numpy as np

from clustersim.collectives.model import CollectiveModel, Group
from clustersim.collectives.ops import CollectiveError
from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.lru import LruCache, key_digest
from clustersim.hardware.precision import BYTES_PER_ELEMENT
from clustersim.training.experts import dispatch_bytes
from clustersim.training.ranks import expert_groups_by_split, experts_inside, rank_group
from clustersim.training.workload import TrainingJob

__all__ = ["ParallelGroups", "RankGroups", "SHAPES_KEPT"]

# Placements' parallel groups kept by shape, the least recently used dropped past it (the
# chips of one rank's groups: a few KB each). The year's first 6 days met 750 shapes.
SHAPES_KEPT = 16_384

# (tensor-parallel group, (expert group, sharing), (context group, sharing)), None where the
# job has no such group.
RankGroups = tuple[Group | None, tuple[Group, int] | None, tuple[Group, int] | None]


class ParallelGroups:
    """Rank 0's tensor-, expert- and context-parallel groups of jobs on one hardware."""

    def __init__(self, hardware: HardwareSpec, collectives: CollectiveModel):
        self.hardware = hardware
        self.collectives = collectives
        self._groups: LruCache = LruCache(SHAPES_KEPT)
        self._splits: LruCache = LruCache(SHAPES_KEPT)  # expert groups by split

    def of(self, job: TrainingJob, placed: np.ndarray) -> RankGroups:
        """Rank 0's tensor-parallel group, the slowest expert-parallel group (rank 0's, dp
        ranks 0 .. ep-1 where the rank order puts them, unless another splits worse over
        the NeuronLink domains: `slowest_expert_group`) and rank 0's context-parallel
        group, the last two with how many such groups share each chip; None where the job
        has no such group."""
        par = job.parallelism
        moe = job.model.moe and par.ep > 1
        key = (par.tp, par.cp, par.ep, par.pp if moe else 0, moe, experts_inside(par),
               par.dp if moe else 0, self.dispatch_size(job) if moe else 0.0,
               len(placed), key_digest(placed.tobytes()))
        found = self._groups.get(key)
        if found is None:
            found = self._groups[key] = self._groups_of(job, placed)
        return found

    def _groups_of(self, job: TrainingJob, placed: np.ndarray) -> RankGroups:
        par = job.parallelism
        tp_group = None
        if par.tp > 1:
            tp_group, _ = rank_group(self.hardware, np.arange(par.tp), placed)
        ep_group = None
        if job.model.moe and par.ep > 1:
            ep_group = self.slowest_expert_group(job, placed)
        cp_group = None
        if par.cp > 1:
            cp_group = rank_group(self.hardware, np.arange(par.cp) * par.tp, placed)
        return tp_group, ep_group, cp_group

    @staticmethod
    def dispatch_size(job: TrainingJob) -> float:
        """One rank's bytes in one MoE layer's dispatch (workload's, before the mixed
        layers' scaling)."""
        s = job.sequence_length // job.parallelism.cp
        activation = job.micro_batch * s * job.model.hidden * BYTES_PER_ELEMENT[job.precision]
        return dispatch_bytes(job, float(activation))

    def slowest_expert_group(self, job: TrainingJob, placed: np.ndarray
                             ) -> tuple[Group, int]:
        """The expert group whose all-to-all takes longest at the job's dispatch size, one
        of each way the groups split over NeuronLink domains (see the module): a synchronous
        step waits for it. Rank 0's where the groups split alike; a group uneven over
        several sites (not modelled) is left out."""
        size = self.dispatch_size(job)
        par = job.parallelism
        key = (par.tp, par.cp, par.pp, par.dp, par.ep, experts_inside(par), len(placed),
               key_digest(placed.tobytes()))
        groups = self._splits.get(key)
        if groups is None:  # the micro-batch, sequence and precision do not change them
            groups = self._splits[key] = [
                rank_group(self.hardware, ranks, placed)
                for ranks in expert_groups_by_split(self.hardware, par, placed)]
        found: tuple[float, tuple[Group, int]] | None = None
        for index, (group, sharing) in enumerate(groups):
            try:
                time_s = self.collectives.cost("all-to-all", group, size * sharing).time_s
            except CollectiveError:
                if index == 0:  # rank 0's group: the job cannot be costed, as before
                    raise
                continue  # uneven over several sites: not modelled, rank 0's stands
            if found is None or time_s > found[0]:
                found = (time_s, (group, sharing))
        assert found is not None
        return found[1]
