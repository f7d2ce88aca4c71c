"""Collectives on the topology graph, as the Neuron runtime runs them: the level planner.

A collective over a group of ranks placed on chips is split by the hardware's levels, as
Neuron's hierarchical algorithm does (a group inside one instance runs one flat algorithm):
the instance (or a Trn3 UltraServer's NeuronSwitch), the Trn2 UltraServer's Z rings, and
EFA between NeuronLink domains (see `clustersim.collectives.levels`).

All-reduce = reduce-scatter up the levels, all-reduce at the top, all-gather back down;
all-gather runs the upper levels first and reduce-scatter the lower levels first, as Neuron
does. Each level runs one algorithm (`ring`, `biring`, `mesh`, `mesh1` single-step mesh,
`rdh`, `kangaring`; on a switch `mesh` is the direct switch algorithm; one module each),
chosen by `auto` or forced. Every algorithm is a sequence of steps, costed on the graph by
`clustersim.collectives.links`; step latencies and efficiencies are the calibrated constants
of `HardwareSpec.collectives`, bandwidths and hop latencies come from the graph.

Costs are cached by the group's shape, so an all-reduce over 2 million ranks is evaluated on
one representative instance, one UltraServer and a vectorised fabric stage in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from clustersim.collectives.contention import capacity, resource_rates, simultaneous
from clustersim.collectives.costs import CollectiveCost, StageCost, Step
from clustersim.collectives.groups import (
    AsymmetricGroupError,
    Group,
    Layout,
    build_layout,
    check_rank_split,
    place_ranks,
)
from clustersim.collectives.levels import LevelCoster
from clustersim.collectives.links import StepCoster
from clustersim.collectives.ops import (
    ALGORITHMS,
    COPY_ACCESSES,
    OPS,
    CollectiveError,
    bus_factor,
    normalise_op,
)
from clustersim.collectives.ring import flat_ring_over_all
from clustersim.collectives.uneven import uneven_all_to_all
from clustersim.collectives.zring import z_columns, z_steps
from clustersim.hardware.lru import LruCache
from clustersim.hardware.topology import Topology

__all__ = [
    "OPS",
    "ALGORITHMS",
    "CollectiveError",
    "check_rank_split",
    "Group",
    "StageCost",
    "CollectiveCost",
    "CollectiveModel",
    "bus_factor",
    "normalise_op",
    "place_ranks",
    "simultaneous",
]


# Collective costs and group layouts kept (`CollectiveModel`): a step profile is computed once
# per placement shape (`training.step.SHAPES_KEPT` kept) and asks for a few dozen costs.
COSTS_KEPT = 65_536
LAYOUTS_KEPT = 16_384


class CollectiveModel:
    """Costs collectives on a topology; results are cached by group shape."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.hardware = topology.hardware
        self.constants = topology.hardware.collectives
        self.coster = StepCoster(topology)
        self.levels = LevelCoster(topology, self.coster)
        # Bounded, the least recently used dropped past it: a year of a fleet's placements
        # met about 170,000 groups' layouts (7.8 KB each) and 400,000 costs (1.9 KB each).
        self._cache: LruCache = LruCache(COSTS_KEPT)
        self._layouts: LruCache = LruCache(LAYOUTS_KEPT)
        self._capacities: dict[tuple, float] = {}  # the topology is fixed: look a link up once

    def cost(
        self,
        op: str,
        group: Group,
        size_bytes: float,
        algorithm: str = "auto",
        intra: str = "auto",
        inter: str = "auto",
        peer: int | None = None,
    ) -> CollectiveCost:
        """Cost of `op` over `group` for a buffer of `size_bytes` (nccl-tests' size).

        `algorithm` forces the algorithm of a single-level group, or for a multi-level group
        `hierarchical` (the default) or a flat `ring`/`biring` over all ranks. `intra` and
        `inter` force the algorithm at the instance and the fabric level. For `send-recv`,
        `peer` is the receiving chip (default: the group's last chip).
        """
        op = normalise_op(op)
        if size_bytes < 0 or not math.isfinite(size_bytes):
            raise CollectiveError(f"size must be a finite number of bytes, got {size_bytes}")
        for name in (algorithm, intra, inter):
            if name not in ALGORITHMS:
                raise CollectiveError(
                    f"unknown algorithm {name!r}; expected one of {', '.join(ALGORITHMS)}"
                )
        if op == "send-recv":
            return self._send_recv(group, size_bytes, peer)
        try:
            layout = self.layout(group)
        except AsymmetricGroupError:
            if op != "all-to-all" or (algorithm, intra, inter) != ("auto",) * 3:
                raise
            # Direct sends need no common tree: each domain's part over NeuronLink, the
            # rest over EFA (`collectives.uneven`).
            key = (op, float(size_bytes), "uneven", group.ranks_per_chip,
                   hash(group.chips.tobytes()))
            cached = self._cache.get(key)
            if cached is None:
                cached = self._cache[key] = uneven_all_to_all(self, group, size_bytes)
            return replace(cached, group=group)
        key = (op, float(size_bytes), algorithm, intra, inter, layout.key)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._evaluate(op, layout, size_bytes, algorithm, intra, inter)
            self._cache[key] = cached
        return replace(cached, group=group)

    def sweep(self, op: str, group: Group, sizes: Sequence[float], **options: Any
              ) -> list[CollectiveCost]:
        return [self.cost(op, group, size, **options) for size in sizes]

    def layout(self, group: Group) -> Layout:
        """The group seen level by level (cached by its chips)."""
        key = (len(group.chips), group.ranks_per_chip, hash(group.chips.tobytes()))
        found = self._layouts.get(key)
        if found is None:
            found = build_layout(self.topology, group)
            self._layouts[key] = found
        return found

    # ------------------------------------------------------------------ the level plan
    def _evaluate(self, op: str, layout: Layout, size: float, algorithm: str, intra: str,
                  inter: str) -> CollectiveCost:
        levels = layout.levels
        ranks = layout.ranks
        if algorithm in ("ring", "biring") and "site" in levels:
            raise CollectiveError("a flat ring over ranks in several sites is not modelled; "
                                  "use hierarchical (the site level runs a ring over sites)")
        if algorithm in ("ring", "biring") and len(levels) > 1:
            stage = flat_ring_over_all(self.coster, op, layout, size, algorithm)
            return CollectiveCost(op, size, ranks, f"flat-{algorithm}", (stage,))
        if len(levels) == 1 and algorithm not in ("auto", "hierarchical"):
            intra = algorithm
        elif algorithm not in ("auto", "hierarchical"):
            raise CollectiveError(
                f"{algorithm} applies inside one instance; across instances use hierarchical "
                f"(with intra/inter choices) or a flat ring/biring"
            )
        choice = {"instance": intra, "ultraserver": "auto", "fabric": inter, "site": "ring"}
        if op == "all-to-all":
            stages = self._all_to_all(layout, size, levels, choice)
        elif op == "broadcast":
            stages = [self.levels.stage(level, "broadcast", layout, size, choice[level])
                      for level in reversed(levels)]
        else:
            stages = [self.levels.stage(level, stage_op, layout, buffer, choice[level])
                      for level, stage_op, buffer in hierarchical_plan(op, layout, size)]
        names = [s.algorithm for s in stages]
        label = names[0] if len(levels) == 1 and op != "all-to-all" else (
            "hierarchical(" + "+".join(dict.fromkeys(names)) + ")"
        )
        return CollectiveCost(op, size, ranks, label, tuple(stages))

    def _all_to_all(self, layout: Layout, size: float, levels: list[str], choice: dict
                    ) -> list[StageCost]:
        """All-to-all: each level's share of the buffer is exchanged by that level's links,
        all levels at once (the pieces for other domains go over EFA, the rest stays)."""
        k = layout.ranks_per_chip
        per_instance = len(layout.instance_chips) * k
        site_total = per_instance * layout.ultraserver_members * len(layout.domains)
        total = layout.ranks if "site" in levels else site_total
        intra = choice["instance"]
        if intra == "auto":  # direct writes, unless the level is a single rank
            intra = "mesh" if per_instance > 1 else "ring"
        stages = [self.levels.stage("instance", "all-to-all", layout,
                                    size * per_instance / total, intra)]
        if "ultraserver" in levels:
            share = size * per_instance * (layout.ultraserver_members - 1) / total
            stages.append(self.levels.ultraserver_stage("all-to-all", layout, share, "mesh"))
        if "fabric" in levels:
            inside = per_instance * layout.ultraserver_members
            share = size * (site_total - inside) / total
            stages.append(self.levels.fabric_stage("all-to-all", layout, share, "mesh"))
        if "site" in levels:  # what goes to the other sites
            share = size * (total - site_total) / total
            stages.append(self.levels.site_stage("all-to-all", layout, share))
        if len(stages) > 1:  # concurrent: the slowest level's transfer, every level's latency
            slowest = max(stages, key=lambda s: s.transfer_s)
            stages = [replace(s, transfer_s=s.transfer_s if s is slowest else 0.0) for s in stages]
        return stages

    def _send_recv(self, group: Group, size: float, peer: int | None) -> CollectiveCost:
        """Point to point from the group's first chip to `peer` (pipeline stages)."""
        src = int(group.chips[0])
        dst = int(group.chips[-1]) if peer is None else int(peer)
        c = self.constants
        if src == dst:
            transfer = COPY_ACCESSES * size / self.coster.hbm_rate()
            latency = c.step_latency_s
            hops = 0
        else:
            path = self.topology.path(src, dst)
            efficiency = c.efa_efficiency if "efa" in path.kinds else c.link_efficiency
            transfer = size / (path.bottleneck_bytes_per_s * efficiency)
            step = c.efa_step_latency_s if "efa" in path.kinds else c.step_latency_s
            latency = step + path.latency_s
            hops = path.hops
        stage = StageCost("fabric" if hops and "efa" in self.topology.path(src, dst).kinds
                          else "instance", "send-recv", "direct", 2, size, 1, latency, transfer)
        return CollectiveCost("send-recv", size, 2, "direct", (stage,), group)

    # ------------------------------------------------------------------ contention
    def stage_steps(self, stage: StageCost, layout: Layout) -> tuple[list[int], list[Step], int]:
        """(representative chips, steps, chips per repeated unit) of an instance or
        UltraServer stage, for the contention model."""
        hw = self.hardware
        cpi = hw.chips_per_instance
        if stage.level == "instance":
            chips = [int(c) for c in layout.instance_chips]
            steps = self.levels.instance_steps(stage.op, chips, layout.ranks_per_chip,
                                               stage.bytes_per_rank, stage.algorithm)
            span = cpi * (hw.instances_per_ultraserver if hw.switch_spans_ultraserver else 1)
            return chips, steps, span
        chips = [int(c) for c in layout.ultraserver_chips]
        columns = z_columns(chips, len(layout.instance_chips))
        steps = z_steps(stage.op, columns, layout.ranks_per_chip, stage.bytes_per_rank,
                        stage.algorithm)
        return chips, steps, cpi * hw.instances_per_ultraserver

    def resource_rates(self, cost: CollectiveCost, instance: int | None = None
                       ) -> dict[tuple, float]:
        """Peak rate of use of each link, HBM and EFA (see `contention.resource_rates`)."""
        return resource_rates(self, cost, instance)

    def capacity(self, key: tuple) -> float:
        """What a resource of `resource_rates` can carry."""
        found = self._capacities.get(key)
        if found is None:
            found = self._capacities[key] = capacity(self, key)
        return found


def hierarchical_plan(op: str, layout: Layout, size: float) -> list[tuple[str, str, float]]:
    """(level, op, per-rank buffer) of each stage of a hierarchical all-reduce, all-gather
    or reduce-scatter: all-reduce and reduce-scatter shrink the buffer going up; all-gather
    runs the upper levels first, on the smaller pieces."""
    levels = layout.levels
    members = {
        "instance": len(layout.instance_chips) * layout.ranks_per_chip,
        "ultraserver": layout.ultraserver_members,
        "fabric": len(layout.domains),
        "site": layout.sites,
    }
    if op == "all-reduce":
        plan = [(lv, "reduce-scatter") for lv in levels[:-1]] + [(levels[-1], "all-reduce")]
        plan += [(lv, "all-gather") for lv in reversed(levels[:-1])]
    elif op == "reduce-scatter":
        plan = [(lv, "reduce-scatter") for lv in levels]
    else:
        plan = [(lv, "all-gather") for lv in reversed(levels)]
    buffer = size
    if op == "all-gather":
        below = 1
        for lv in levels:
            below *= members[lv]
        buffer = size / below  # the piece each rank starts with
    stages = []
    for level, stage_op in plan:
        if stage_op == "all-gather":
            buffer *= members[level]
        stages.append((level, stage_op, buffer))
        if stage_op == "reduce-scatter":
            buffer /= members[level]
    return stages
