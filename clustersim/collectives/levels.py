"""One level's stage of a collective: which algorithms apply there, which one `auto` takes,
and what it costs.

- ``instance``: chips of one instance (NeuronLink torus, an instance ring, or a switch); a
  Trn3 UltraServer's NeuronSwitch makes its whole UltraServer this level;
- ``ultraserver``: the instances of a Trn2 UltraServer, over the Z rings;
- ``fabric``: NeuronLink domains (instances, or UltraServers) over EFA.

How `auto` chooses inside an instance. Neuron documents its choice by size: mesh (and the
single-step mesh) under about 1 MB, RDH from there to about 56 MB, KangaRing above (a ring
where KangaRing does not apply). Read literally, that rule makes time fall with size where
a cheaper algorithm is switched on late (the old model ran RDH at 32 MB on 16 ranks, the
Neuron docs' own example ran KangaRing there). Here the published thresholds are where
Neuron *stops* using an algorithm: at a size n, `auto` takes the cheapest of the applicable
algorithms whose band has not ended (mesh and mesh1 below 1 MB, RDH below 56 MB, the rings
at any size). The set only shrinks as n grows and every algorithm's time is non-decreasing
in n, so the chosen time is non-decreasing too; where an algorithm's band ends while it was
the cheapest, time steps up, never down. With the physical costs (RDH: log2(ranks) steps,
one link per chip per step; KangaRing: ranks/2 - 1 steps per phase on every cycle link both
ways), KangaRing overtakes RDH well below 56 MB (at a few MB on 16 trn1 ranks), so the docs'
32 MB example runs KangaRing and the 2 MB example RDH. On a switch, over the Z rings and over
EFA, `auto` is the cheapest applicable algorithm (over EFA mesh only up to
`fabric_mesh_max_nodes` nodes).
"""

from __future__ import annotations

import math

import numpy as np

from clustersim.collectives.costs import StageCost, Step
from clustersim.collectives.fabric import fabric_algorithms, fabric_cost
from clustersim.collectives.groups import Layout
from clustersim.collectives.kangaring import CycleFinder, kangaring_steps
from clustersim.collectives.links import StepCoster
from clustersim.collectives.mesh import mesh1_steps, mesh_steps
from clustersim.collectives.ops import CollectiveError
from clustersim.collectives.rdh import rdh_steps
from clustersim.collectives.ring import ring_steps
from clustersim.collectives.sites import site_cost
from clustersim.collectives.zring import z_algorithms, z_columns, z_steps
from clustersim.hardware.lru import LruCache, key_digest
from clustersim.hardware.topology import Topology

__all__ = ["LevelCoster"]

# Instance, UltraServer and fabric stages kept by their inputs, the least recent dropped.
STAGES_KEPT = 16_384


class LevelCoster:
    """Stages at each level of one topology (instance, UltraServer Z rings, EFA fabric)."""

    def __init__(self, topology: Topology, coster: StepCoster):
        self.topology = topology
        self.hardware = topology.hardware
        self.constants = topology.hardware.collectives
        self.coster = coster
        self.cycles = CycleFinder(topology)
        # The instance and UltraServer stages by what they depend on (the representative's
        # chips, ranks per chip, op, buffer, algorithm): groups that differ above them (in
        # their domains or sites, as a spread job's placements do) share them.
        self._stages: LruCache = LruCache(STAGES_KEPT)

    def stage(self, level: str, op: str, layout: Layout, buffer: float, algorithm: str
              ) -> StageCost:
        """One level running `op` on a per-rank buffer of `buffer` bytes.

        `buffer` is the buffer each rank holds for all-reduce and reduce-scatter (input) and
        for all-gather (output), as nccl-tests counts sizes.
        """
        if level == "site":
            return self.site_stage(op, layout, buffer)
        if level == "fabric":
            return self.fabric_stage(op, layout, buffer, algorithm)
        if level == "ultraserver":
            return self.ultraserver_stage(op, layout, buffer, algorithm)
        return self.instance_stage(op, layout, buffer, algorithm)

    # ------------------------------------------------------------------ instance level
    def instance_candidates(self, op: str, layout: Layout) -> list[str]:
        chips = len(layout.instance_chips)
        k = layout.ranks_per_chip
        if chips * k == 1:
            return ["ring"]
        names = ["ring", "biring", "mesh"]
        if op == "all-reduce":
            names.append("mesh1")
        if chips > 1 and chips & (chips - 1) == 0 and op != "broadcast":
            names.append("rdh")
        # KangaRing pairs the ranks of a chip: all of them must be in the group (Neuron docs).
        if (k >= 2 and k == self.hardware.chip.ranks and chips > 1
                and op in ("all-reduce", "all-gather", "reduce-scatter")):
            names.append("kangaring")
        return names

    def auto_instance(self, op: str, layout: Layout, buffer: float) -> str:
        """The cheapest of the algorithms Neuron still uses at this size (module docstring
        of `clustersim.collectives.levels`); on a switch, the cheaper of mesh and ring."""
        names = self.instance_candidates(op, layout)
        if len(names) == 1:
            return names[0]
        if op == "broadcast":
            return "ring"
        if self.hardware.instance.interconnect.topology == "switch":
            names = ["mesh", "ring"]
        else:
            names = [n for n in names if buffer < self.band_max_bytes(n)]
        return min(names, key=lambda n: sum(self.instance_cost(op, layout, buffer, n)[:2]))

    def band_max_bytes(self, algorithm: str) -> float:
        """The size from which Neuron no longer uses an algorithm inside an instance: mesh
        and single-step mesh from about 1 MB, RDH from about 56 MB; the rings never."""
        c = self.constants
        return {"mesh": c.mesh_max_bytes, "mesh1": c.mesh_max_bytes,
                "rdh": c.rdh_max_bytes}.get(algorithm, math.inf)

    def instance_stage(self, op: str, layout: Layout, buffer: float, algorithm: str
                       ) -> StageCost:
        key = ("instance", op, layout.instance_chips.tobytes(), layout.ranks_per_chip,
               float(buffer), algorithm)
        return self._kept(key, self._instance_stage, op, layout, buffer, algorithm)

    def _kept(self, key: tuple, make, *args) -> StageCost:
        """A stage's cost kept by its exact inputs (`key`): groups that differ only above
        this level share it."""
        found = self._stages.get(key)
        if found is None:
            found = self._stages[key] = make(*args)
        return found

    def _instance_stage(self, op: str, layout: Layout, buffer: float, algorithm: str
                        ) -> StageCost:
        if algorithm in ("auto", "hierarchical"):
            algorithm = self.auto_instance(op, layout, buffer)
        if algorithm not in self.instance_candidates(op, layout):
            raise CollectiveError(
                f"{algorithm} does not apply to {op} over {len(layout.instance_chips)} chips x "
                f"{layout.ranks_per_chip} ranks; expected one of "
                f"{', '.join(self.instance_candidates(op, layout))}"
            )
        latency, transfer, steps = self.instance_cost(op, layout, buffer, algorithm)
        members = len(layout.instance_chips) * layout.ranks_per_chip
        return StageCost("instance", op, algorithm, members, buffer, steps, latency, transfer)

    def instance_cost(self, op: str, layout: Layout, buffer: float, algorithm: str
                      ) -> tuple[float, float, int]:
        chips = [int(c) for c in layout.instance_chips]
        steps = self.instance_steps(op, chips, layout.ranks_per_chip, buffer, algorithm)
        return self.coster.run(steps, self.constants.step_latency_s)

    def instance_steps(self, op: str, chips: list[int], k: int, buffer: float, algorithm: str
                       ) -> list[Step]:
        if algorithm in ("ring", "biring"):
            return ring_steps(self.topology, op, chips, k, buffer,
                              directions=1 if algorithm == "ring" else 2)
        if algorithm == "kangaring":
            return kangaring_steps(op, self.cycles.cycles(chips), chips, k, buffer)
        if algorithm == "rdh":
            return rdh_steps(self.topology, op, chips, k, buffer)
        if algorithm == "mesh1":
            return mesh1_steps(chips, k, buffer)
        if algorithm == "mesh":
            return mesh_steps(op, chips, k, buffer)
        raise CollectiveError(f"{algorithm} is not an instance-level algorithm")

    # ------------------------------------------------------------------ UltraServer (Z) level
    def ultraserver_stage(self, op: str, layout: Layout, buffer: float, algorithm: str
                          ) -> StageCost:
        """Instances of an UltraServer over the Z rings: each chip position runs its own
        group along its Z ring, with every rank of the chip in a parallel group."""
        key = ("ultraserver", op, layout.ultraserver_chips.tobytes(),
               len(layout.instance_chips), layout.ultraserver_members, layout.ranks_per_chip,
               float(buffer), algorithm)
        return self._kept(key, self._ultraserver_stage, op, layout, buffer, algorithm)

    def _ultraserver_stage(self, op: str, layout: Layout, buffer: float, algorithm: str
                           ) -> StageCost:
        m = layout.ultraserver_members
        k = layout.ranks_per_chip
        chips = [int(c) for c in layout.ultraserver_chips]
        columns = z_columns(chips, len(layout.instance_chips))
        names = z_algorithms(op)
        if algorithm in ("auto", "hierarchical"):
            algorithm = min(names, key=lambda n: sum(self.z_cost(op, columns, k, buffer, n)[:2]))
        if algorithm not in names:
            raise CollectiveError(f"{algorithm} does not apply on the Z rings; expected {names}")
        latency, transfer, steps = self.z_cost(op, columns, k, buffer, algorithm)
        return StageCost("ultraserver", op, algorithm, m, buffer, steps, latency, transfer)

    def z_cost(self, op: str, columns: list[list[int]], k: int, buffer: float, algorithm: str
               ) -> tuple[float, float, int]:
        return self.coster.run(z_steps(op, columns, k, buffer, algorithm),
                               self.constants.step_latency_s)

    # ------------------------------------------------------------------ fabric (EFA) level
    def fabric_stage(self, op: str, layout: Layout, buffer: float, algorithm: str
                     ) -> StageCost:
        """Domains over EFA, one group per local rank, run in parallel."""
        # Kept by all `fabric_cost` reads: the leaves only as their steps from the first
        # (a cost counts the flows that cross leaves and the busiest leaf, the same on leaves
        # shifted alike). A spread job's placements that split over the sites otherwise but
        # keep its largest site's share (the within-site stages' representative, `groups`)
        # share it: the year's spread solves costed this stage again for each split.
        leaves = layout.domain_leaves
        key = ("fabric", op, float(buffer), algorithm, layout.ranks_per_chip,
               layout.chips_per_domain, len(leaves),
               key_digest(np.ascontiguousarray(leaves - leaves[0], dtype=np.int64)))
        return self._kept(key, self._fabric_stage, op, layout, buffer, algorithm)

    def _fabric_stage(self, op: str, layout: Layout, buffer: float, algorithm: str
                      ) -> StageCost:
        x = len(layout.domains)
        names = fabric_algorithms(op, x, self.constants.fabric_mesh_max_nodes, algorithm)
        costs: dict[str, tuple[float, float, int]] = {}
        if algorithm in ("auto", "hierarchical"):
            # (each candidate's cost kept: the chosen one is not costed twice)
            costs = {n: fabric_cost(self.topology, op, layout, buffer, n) for n in names}
            algorithm = min(names, key=lambda n: sum(costs[n][:2]))
        if algorithm == "biring":
            algorithm = "ring"  # EFA links are full duplex per flow; a ring already uses both
        if algorithm not in names:
            raise CollectiveError(
                f"{algorithm} does not apply over EFA for {x} nodes; expected one of {names}"
            )
        latency, transfer, steps = costs.get(algorithm) or fabric_cost(
            self.topology, op, layout, buffer, algorithm)
        return StageCost("fabric", op, algorithm, x, buffer, steps, latency, transfer)

    # ------------------------------------------------------------------ site level
    def site_stage(self, op: str, layout: Layout, buffer: float) -> StageCost:
        """The group's sites over the inter-site links (`clustersim.collectives.sites`):
        a ring, or direct sends for all-to-all."""
        latency, transfer, steps = site_cost(self.topology, op, layout, buffer)
        algorithm = "mesh" if op == "all-to-all" else "ring"
        return StageCost("site", op, algorithm, layout.sites, buffer, steps, latency, transfer)
