"""Collectives on the topology graph, as the Neuron runtime runs them.

A collective over a group of ranks placed on chips is split by the hardware's levels, as
Neuron's hierarchical algorithm does (a group inside one instance runs one flat algorithm):

- ``instance``: chips of one instance (NeuronLink torus, an instance ring, or a switch); a
  Trn3 UltraServer's NeuronSwitch makes its whole UltraServer this level;
- ``ultraserver``: the instances of a Trn2 UltraServer, over the Z rings;
- ``fabric``: NeuronLink domains (instances, or UltraServers) over EFA.

All-reduce = reduce-scatter up the levels, all-reduce at the top, all-gather back down;
all-gather runs the upper levels first and reduce-scatter the lower levels first, as Neuron
does. Each level runs one algorithm (`ring`, `biring`, `mesh`, `mesh1` single-step mesh,
`rdh`, `kangaring`; on a switch `mesh` is the direct switch algorithm), chosen by `auto` or
forced.

Every algorithm is a sequence of steps. A step costs

    step_latency + route latency + max(link time, HBM time)

where the link time is the heaviest directed link's bytes over its bandwidth x efficiency,
from routing the step's flows on the graph (so oversubscribed links, as mesh causes, cost
what they cost), and the HBM time is the chip's memory traffic for the step (ranks sharing
a chip share its HBM). Step latencies and efficiencies are the calibrated constants of
`HardwareSpec.collectives`; bandwidths and hop latencies come from the graph.

Costs are cached by the group's shape, so an all-reduce over 2 million ranks is evaluated on
one representative instance, one UltraServer and a vectorised fabric stage in milliseconds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx
import numpy as np

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

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "send-recv")
ALGORITHMS = ("auto", "ring", "biring", "mesh", "mesh1", "rdh", "kangaring", "hierarchical")
_OP_ALIASES = {
    "allr": "all-reduce", "all_reduce": "all-reduce", "allreduce": "all-reduce",
    "allg": "all-gather", "all_gather": "all-gather", "allgather": "all-gather",
    "redsct": "reduce-scatter", "reduce_scatter": "reduce-scatter",
    "reducescatter": "reduce-scatter",
    "alltoall": "all-to-all", "all_to_all": "all-to-all", "a2a": "all-to-all",
    "bcast": "broadcast", "sendrecv": "send-recv", "send_recv": "send-recv", "p2p": "send-recv",
}
NEURONLINK_KINDS = ("torus", "ring", "zring", "switch")
FABRIC_KINDS = ("efa", "uplink")

# HBM accesses per byte a rank moves in one step (Neuron docs on KangaRing: a ring hop is
# one read and one write when copying, two reads and a write when reducing).
_COPY_ACCESSES = 2
_REDUCE_ACCESSES = 3


class CollectiveError(ValueError):
    """A collective that cannot run as asked (bad group, algorithm not applicable)."""


def normalise_op(op: str) -> str:
    """Canonical op name from the usual spellings (allr, all_reduce, all-reduce, ...)."""
    name = _OP_ALIASES.get(op.lower(), op.lower())
    if name not in OPS:
        raise CollectiveError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
    return name


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw x factor."""
    op = normalise_op(op)
    if ranks <= 1:
        return 0.0 if op != "send-recv" else 1.0
    if op == "all-reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return (ranks - 1) / ranks
    return 1.0


# ---------------------------------------------------------------------------------------------
# Groups


@dataclass(frozen=True)
class Group:
    """Ranks placed on chips: `chips` (sorted, unique) each holding `ranks_per_chip` ranks."""

    chips: np.ndarray
    ranks_per_chip: int

    def __post_init__(self) -> None:
        chips = np.asarray(self.chips, dtype=np.int64)
        if len(chips) > 1 and not np.all(chips[1:] > chips[:-1]):  # not already sorted unique
            chips = np.unique(chips)
        object.__setattr__(self, "chips", chips)
        if len(chips) == 0:
            raise CollectiveError("a group needs at least one chip")
        if self.ranks_per_chip < 1:
            raise CollectiveError(f"ranks_per_chip must be at least 1, got {self.ranks_per_chip}")

    @classmethod
    def from_rank_chips(cls, rank_chips: Iterable[int]) -> Group:
        """A group from the chip of each rank; every chip must hold the same number of ranks."""
        chips, counts = np.unique(np.asarray(list(rank_chips), dtype=np.int64), return_counts=True)
        if len(chips) and np.any(counts != counts[0]):
            raise CollectiveError("every chip of a group must hold the same number of its ranks")
        return cls(chips, int(counts[0]) if len(counts) else 1)

    @property
    def ranks(self) -> int:
        return len(self.chips) * self.ranks_per_chip


def check_rank_split(ranks: int, instances: int) -> None:
    """Ranks spread evenly over instances (checkable before any graph is built)."""
    if ranks < 1:
        raise CollectiveError(f"ranks must be at least 1, got {ranks}")
    if ranks % instances:
        raise CollectiveError(f"{ranks} ranks do not split evenly over {instances} instances")


def place_ranks(topology: Topology, ranks: int, instances: int | None = None) -> Group:
    """Place ranks as nccom-test and the Neuron runtime do: spread evenly over the first
    `instances` instances, filling each chip's ranks (cores) before the next chip."""
    hw = topology.hardware
    instances = instances or max(1, math.ceil(max(ranks, 1) / hw.ranks_per_instance))
    check_rank_split(ranks, instances)
    if instances > topology.instances:
        raise CollectiveError(f"{instances} instances asked, the topology has {topology.instances}")
    per_instance = ranks // instances
    if per_instance > hw.ranks_per_instance:
        raise CollectiveError(
            f"{per_instance} ranks per instance, but a {hw.instance.name} has {hw.ranks_per_instance}"
        )
    per_chip = min(hw.chip.ranks, per_instance)
    if per_instance % per_chip:
        raise CollectiveError(f"{per_instance} ranks per instance do not fill whole chips")
    chips_per_instance = per_instance // per_chip
    cpi = hw.chips_per_instance
    chips = (np.arange(instances)[:, None] * cpi + np.arange(chips_per_instance)[None, :]).ravel()
    return Group(chips, per_chip)


@dataclass(frozen=True)
class _Layout:
    """A group seen level by level, with one representative of each level."""

    ranks_per_chip: int
    instance_chips: np.ndarray  # chips of the representative instance-level member set
    instance_key: tuple  # local positions (shape of the instance level)
    ultraserver_members: int  # instances per UltraServer taking part (Z level), 1 if none
    ultraserver_chips: np.ndarray  # chips of the representative UltraServer (Z level)
    domains: np.ndarray  # first chip of each NeuronLink domain taking part
    domain_leaves: np.ndarray  # leaf of each domain
    chips_per_domain: int

    @property
    def key(self) -> tuple:
        leaf_pattern = tuple(sorted(Counter(Counter(self.domain_leaves.tolist()).values()).items()))
        return (self.ranks_per_chip, self.instance_key, self.ultraserver_members,
                len(self.domains), leaf_pattern)


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class StageCost:
    """One level's part of a collective."""

    level: str  # instance | ultraserver | fabric | chip
    op: str
    algorithm: str
    members: int  # ranks (instance level) or chips/domains taking part at this level
    bytes_per_rank: float
    steps: int
    latency_s: float
    transfer_s: float

    @property
    def time_s(self) -> float:
        return self.latency_s + self.transfer_s


@dataclass(frozen=True)
class CollectiveCost:
    """Time of one collective and why: its stages, algbw and busbw (nccom-test's figures)."""

    op: str
    size_bytes: float
    ranks: int
    algorithm: str
    stages: tuple[StageCost, ...]
    group: Group | None = field(default=None, repr=False, compare=False)

    @property
    def latency_s(self) -> float:
        return sum(s.latency_s for s in self.stages)

    @property
    def transfer_s(self) -> float:
        return sum(s.transfer_s for s in self.stages)

    @property
    def time_s(self) -> float:
        return self.latency_s + self.transfer_s

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.stages)

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.size_bytes / self.time_s if self.time_s > 0 else math.inf

    @property
    def busbw_bytes_per_s(self) -> float:
        return self.algbw_bytes_per_s * bus_factor(self.op, self.ranks)

    def scaled(self, slowdown: float) -> CollectiveCost:
        """The same collective with its transfer time stretched (contention)."""
        stages = tuple(replace(s, transfer_s=s.transfer_s * slowdown) for s in self.stages)
        return replace(self, stages=stages)


# ---------------------------------------------------------------------------------------------
# The model


@dataclass
class _Step:
    """One algorithm step: flows between chips, HBM traffic per chip, and how many times."""

    count: int
    flows: list[tuple[int, int]]  # directed chip pairs sending at once
    flow_bytes: float
    hbm_bytes_per_chip: float


class CollectiveModel:
    """Costs collectives on a topology; results are cached by group shape."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.hardware = topology.hardware
        self.constants = topology.hardware.collectives
        self._cache: dict[tuple, CollectiveCost] = {}
        self._layouts: dict[tuple, _Layout] = {}
        self._cycles: dict[tuple, list[list[int]]] = {}
        self._link_time_cache: dict[tuple, tuple[float, float]] = {}

    # ------------------------------------------------------------------ public API
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
        layout = self._layout(group)
        key = (op, float(size_bytes), algorithm, intra, inter, layout.key)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._evaluate(op, layout, size_bytes, algorithm, intra, inter)
            self._cache[key] = cached
        return replace(cached, group=group)

    def sweep(self, op: str, group: Group, sizes: Sequence[float], **options: Any
              ) -> list[CollectiveCost]:
        return [self.cost(op, group, size, **options) for size in sizes]

    # ------------------------------------------------------------------ layout
    def _layout(self, group: Group) -> _Layout:
        chips = group.chips
        cache_key = (len(chips), group.ranks_per_chip, hash(chips.tobytes()))
        found = self._layouts.get(cache_key)
        if found is not None:
            return found
        topo, hw = self.topology, self.hardware
        if int(chips[-1]) >= topo.chips:
            raise CollectiveError(f"chip {int(chips[-1])} is not in the topology ({topo.chips} chips)")
        cpi = hw.chips_per_instance
        # The instance level: one instance, or the whole UltraServer under one NeuronSwitch.
        unit = cpi * hw.instances_per_ultraserver if hw.switch_spans_ultraserver else cpi
        units, unit_starts = np.unique(chips // unit, return_index=True)
        counts = np.diff(np.append(unit_starts, len(chips)))
        if np.any(counts != counts[0]):
            raise CollectiveError(
                "asymmetric group: every instance must hold the same number of its chips "
                "(Neuron forms groups with the same local ranks on every node)"
            )
        local = (chips % unit).reshape(len(units), counts[0])
        if np.any(local != local[0]):
            raise CollectiveError("asymmetric group: instances hold different local chips")
        instance_chips = chips[: counts[0]]
        # The UltraServer (Z ring) level: used when every UltraServer holds the same instances
        # of the group; an uneven group is costed over EFA between its instances instead.
        even = False
        if hw.ultraserver is not None and not hw.switch_spans_ultraserver:
            ipu = hw.instances_per_ultraserver
            us_of_unit = units // ipu
            us_ids, us_starts = np.unique(us_of_unit, return_index=True)
            per_us = np.diff(np.append(us_starts, len(units)))
            even = bool(np.all(per_us == per_us[0]))
            if even:
                z_sets = (units % ipu).reshape(len(us_ids), per_us[0])
                even = bool(np.all(z_sets == z_sets[0]))
        if even:
            members = int(per_us[0])
            us_chips = chips[: counts[0] * members]
            domain_first = chips[np.append(us_starts, len(units))[:-1] * counts[0]]
            domain_size = counts[0] * members
        else:
            members = 1
            us_chips = instance_chips
            domain_first = chips[unit_starts]
            domain_size = int(counts[0])
        layout = _Layout(
            ranks_per_chip=group.ranks_per_chip,
            instance_chips=instance_chips,
            instance_key=tuple(int(c) for c in local[0]),
            ultraserver_members=members,
            ultraserver_chips=us_chips,
            domains=domain_first,
            domain_leaves=topo.chip_leaf[domain_first],
            chips_per_domain=int(domain_size),
        )
        self._layouts[cache_key] = layout
        return layout

    # ------------------------------------------------------------------ evaluation
    def _levels(self, layout: _Layout) -> list[str]:
        levels = ["instance"]
        if layout.ultraserver_members > 1:
            levels.append("ultraserver")
        if len(layout.domains) > 1:
            levels.append("fabric")
        return levels

    def _evaluate(self, op: str, layout: _Layout, size: float, algorithm: str, intra: str,
                  inter: str) -> CollectiveCost:
        levels = self._levels(layout)
        k = layout.ranks_per_chip
        ranks = len(layout.domains) * layout.chips_per_domain * k
        if algorithm in ("ring", "biring") and len(levels) > 1:
            stage = self._flat_ring_over_all(op, layout, size, algorithm)
            return CollectiveCost(op, size, ranks, f"flat-{algorithm}", (stage,))
        if len(levels) == 1 and algorithm not in ("auto", "hierarchical"):
            intra = algorithm
        elif algorithm not in ("auto", "hierarchical"):
            raise CollectiveError(
                f"{algorithm} applies inside one instance; across instances use hierarchical "
                f"(with intra/inter choices) or a flat ring/biring"
            )
        choice = {"instance": intra, "ultraserver": "auto", "fabric": inter}
        members = {
            "instance": len(layout.instance_chips) * k,
            "ultraserver": layout.ultraserver_members,
            "fabric": len(layout.domains),
        }
        stages: list[StageCost] = []
        if op == "all-to-all":
            stages = self._all_to_all(layout, size, levels, choice)
        elif op == "broadcast":
            for level in reversed(levels):
                stages.append(self._stage(level, "broadcast", layout, size, choice[level]))
        else:
            # Per-rank buffer at each level: all-reduce and reduce-scatter shrink it going up.
            plan: list[tuple[str, str]] = []
            if op == "all-reduce":
                plan = [(lv, "reduce-scatter") for lv in levels[:-1]] + [(levels[-1], "all-reduce")]
                plan += [(lv, "all-gather") for lv in reversed(levels[:-1])]
            elif op == "reduce-scatter":
                plan = [(lv, "reduce-scatter") for lv in levels]
            else:  # all-gather: upper levels first, on the smaller pieces
                plan = [(lv, "all-gather") for lv in reversed(levels)]
            buffer = size
            if op == "all-gather":
                below = 1
                for lv in levels:
                    below *= members[lv]
                buffer = size / below  # the piece each rank starts with
            for level, stage_op in plan:
                if stage_op == "all-gather":
                    buffer *= members[level]
                stages.append(self._stage(level, stage_op, layout, buffer, choice[level]))
                if stage_op == "reduce-scatter":
                    buffer /= members[level]
        names = [s.algorithm for s in stages]
        label = names[0] if len(levels) == 1 and op != "all-to-all" else (
            "hierarchical(" + "+".join(dict.fromkeys(names)) + ")"
        )
        return CollectiveCost(op, size, ranks, label, tuple(stages))

    def _stage(self, level: str, op: str, layout: _Layout, buffer: float, algorithm: str
               ) -> StageCost:
        """One level running `op` on a per-rank buffer of `buffer` bytes.

        `buffer` is the buffer each rank holds for all-reduce and reduce-scatter (input) and
        for all-gather (output), as nccl-tests counts sizes.
        """
        if level == "fabric":
            return self._fabric_stage(op, layout, buffer, algorithm)
        if level == "ultraserver":
            return self._ultraserver_stage(op, layout, buffer, algorithm)
        return self._instance_stage(op, layout, buffer, algorithm)

    # ------------------------------------------------------------------ instance level
    def _instance_candidates(self, op: str, layout: _Layout) -> list[str]:
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

    def _auto_instance(self, op: str, layout: _Layout, buffer: float) -> str:
        """Neuron's choice by size: mesh under ~1 MB, RDH to ~56 MB, KangaRing above (ring
        when KangaRing does not apply); on a switch, the faster of mesh and ring."""
        names = self._instance_candidates(op, layout)
        if len(names) == 1:
            return names[0]
        if self.hardware.instance.interconnect.topology == "switch":
            return min(("mesh", "ring"), key=lambda n: self._instance_cost(op, layout, buffer, n)[0])
        c = self.constants
        if op == "broadcast":
            return "ring"
        if buffer < c.mesh_max_bytes:
            return "mesh1" if op == "all-reduce" and self._mesh1_wins(layout, buffer) else "mesh"
        if buffer < c.rdh_max_bytes and "rdh" in names:
            return "rdh"
        return "kangaring" if "kangaring" in names else "biring"

    def _mesh1_wins(self, layout: _Layout, buffer: float) -> bool:
        one = self._instance_cost("all-reduce", layout, buffer, "mesh1")
        two = self._instance_cost("all-reduce", layout, buffer, "mesh")
        return one[0] + one[1] < two[0] + two[1]

    def _instance_stage(self, op: str, layout: _Layout, buffer: float, algorithm: str
                        ) -> StageCost:
        if algorithm in ("auto", "hierarchical"):
            algorithm = self._auto_instance(op, layout, buffer)
        if algorithm not in self._instance_candidates(op, layout):
            raise CollectiveError(
                f"{algorithm} does not apply to {op} over {len(layout.instance_chips)} chips x "
                f"{layout.ranks_per_chip} ranks; expected one of "
                f"{', '.join(self._instance_candidates(op, layout))}"
            )
        latency, transfer, steps = self._instance_cost(op, layout, buffer, algorithm)
        members = len(layout.instance_chips) * layout.ranks_per_chip
        return StageCost("instance", op, algorithm, members, buffer, steps, latency, transfer)

    def _instance_cost(self, op: str, layout: _Layout, buffer: float, algorithm: str
                       ) -> tuple[float, float, int]:
        chips = [int(c) for c in layout.instance_chips]
        steps = self._instance_steps(op, chips, layout.ranks_per_chip, buffer, algorithm)
        return self._run_steps(steps, self.constants.step_latency_s)

    def _instance_steps(self, op: str, chips: list[int], k: int, buffer: float, algorithm: str
                        ) -> list[_Step]:
        p = len(chips)
        if algorithm in ("ring", "biring"):
            return self._ring_steps(op, chips, k, buffer, directions=1 if algorithm == "ring" else 2)
        if algorithm == "kangaring":
            return self._kangaring_steps(op, chips, k, buffer)
        if algorithm == "rdh":
            return self._rdh_steps(op, chips, k, buffer)
        flows = [(a, b) for a in chips for b in chips if a != b]
        if algorithm == "mesh1":
            # Each chip reduces its ranks' buffers, sends the whole buffer to every other chip,
            # reduces the p buffers it then holds, and broadcasts the result to its ranks.
            steps = [_Step(1, [], 0.0, (k + 1) * buffer)] if k > 1 else []
            if p > 1:
                steps.append(_Step(1, flows, buffer, (p + 1) * buffer))
            if k > 1:
                steps.append(_Step(1, [], 0.0, (k + 1) * buffer))
            return steps
        if algorithm == "mesh":
            # Writes go straight to every other chip (routed, so links may be oversubscribed);
            # the ranks of a chip reduce (or share) what arrives in one more step.
            if op == "all-to-all":
                return [_Step(1, flows, buffer * k / p, _COPY_ACCESSES * buffer * k)]
            if op == "broadcast":
                return [_Step(1, flows[: p - 1], buffer, _COPY_ACCESSES * buffer)]
            reduce_scatter = [_Step(1, flows, buffer / p, (k + 1) * buffer)]
            all_gather = [_Step(1, flows, buffer / p, buffer)] if p > 1 else []
            if p > 1:
                reduce_scatter.append(_Step(1, [], 0.0, buffer * (1 + 1 / p)))
            if k > 1:
                all_gather.append(_Step(1, [], 0.0, (k + 1) * buffer))
            if op == "reduce-scatter":
                return reduce_scatter
            if op == "all-gather":
                return all_gather
            return reduce_scatter + all_gather
        raise CollectiveError(f"{algorithm} is not an instance-level algorithm")

    def _ring_steps(self, op: str, chips: list[int], k: int, buffer: float, directions: int
                    ) -> list[_Step]:
        """A flat ring over every rank (ranks of a chip consecutive), in one or both directions.

        Per step each rank passes one chunk (buffer / ranks) downstream; the chunk crosses a
        link only at chip boundaries, and every rank's copy or reduction goes through HBM.
        """
        ranks = len(chips) * k
        if ranks == 1:
            return []
        order = [int(c) for c in self.topology.ring_order(chips)]
        hops = list(zip(order, order[1:] + order[:1], strict=True)) if len(order) > 1 else []
        flows = hops + ([(b, a) for a, b in hops] if directions == 2 else [])
        chunk = buffer / ranks / directions
        if op == "broadcast":  # pipelined chain: latency per hop, bandwidth once
            return [_Step(ranks - 1, [], 0.0, 0.0),
                    _Step(1, flows, buffer / directions, _COPY_ACCESSES * buffer)]
        copy = _Step(ranks - 1, flows, chunk, _COPY_ACCESSES * chunk * k * directions)
        reduce = _Step(ranks - 1, flows, chunk, _REDUCE_ACCESSES * chunk * k * directions)
        if op == "all-gather":
            return [copy]
        if op == "reduce-scatter":
            return [reduce]
        if op == "all-to-all":  # chunks travel half the ring on average
            return [_Step(ranks - 1, flows, chunk * ranks / 2 / (ranks - 1) if ranks > 1 else 0,
                          _COPY_ACCESSES * chunk * k * directions)]
        return [reduce, copy]

    def _kangaring_steps(self, op: str, chips: list[int], k: int, buffer: float) -> list[_Step]:
        """KangaRing: primaries (one per pair of ranks on a chip) on the edge-disjoint
        Hamiltonian cycles of the chips, each cycle run both ways, data split over them.

        Duplicated writes cut HBM accesses per chunk to 3 (all-gather) and 4 (reduce-scatter)
        per pair of ranks, against 4 and 6 for a ring."""
        cycles = self._hamiltonian_cycles(chips)
        if not cycles:  # no cycle on direct links: the hardware ring, routed, both ways
            cycles = [[int(c) for c in self.topology.ring_order(chips)]]
        members = len(chips) * k // 2
        directed = 2 * len(cycles)
        flows = []
        for cycle in cycles:
            hops = list(zip(cycle, cycle[1:] + cycle[:1], strict=True)) if len(cycle) > 1 else []
            flows += hops + [(b, a) for a, b in hops]
        chunk = buffer / members / directed
        primaries = k // 2
        copy = _Step(members - 1, flows, chunk, 3 * chunk * primaries * directed)
        reduce = _Step(members - 1, flows, chunk, 4 * chunk * primaries * directed)
        if op == "all-gather":
            return [copy]
        if op == "reduce-scatter":
            return [reduce]
        return [reduce, copy]

    def _rdh_steps(self, op: str, chips: list[int], k: int, buffer: float) -> list[_Step]:
        """Recursive halving then doubling among chips seen as a hypercube (the 4x4 torus is
        a 4D hypercube: Gray-coded coordinates make every partner a direct neighbour); the
        ranks of a chip first reduce (and last broadcast) among themselves."""
        index = self._hypercube_index(chips)
        by_index = {i: c for c, i in index.items()}
        p = len(chips)
        dims = p.bit_length() - 1
        halving, doubling = [], []
        for j in range(dims):
            flows = [(c, by_index[i ^ (1 << j)]) for c, i in index.items()]
            sent = buffer / (2 ** (j + 1))  # per chip, over its k parallel groups
            halving.append(_Step(1, flows, sent, _REDUCE_ACCESSES * sent))
        for j in reversed(range(dims)):
            flows = [(c, by_index[i ^ (1 << j)]) for c, i in index.items()]
            sent = buffer / (2 ** (j + 1))
            doubling.append(_Step(1, flows, sent, _COPY_ACCESSES * sent))
        if k > 1:
            halving.insert(0, _Step(1, [], 0.0, _REDUCE_ACCESSES * buffer * k))
            doubling.append(_Step(1, [], 0.0, _COPY_ACCESSES * buffer * k))
        if op == "reduce-scatter":
            return halving
        if op == "all-gather":
            return doubling
        if op == "all-to-all":
            return [replace(s, hbm_bytes_per_chip=_COPY_ACCESSES * s.flow_bytes) for s in halving]
        return halving + doubling

    def _hypercube_index(self, chips: list[int]) -> dict[int, int]:
        topo = self.topology
        link = self.hardware.instance.interconnect
        cpi = self.hardware.chips_per_instance
        shape = link.shape
        whole_torus = (link.topology == "torus2d" and shape is not None and len(chips) == cpi
                       and all(s & (s - 1) == 0 for s in shape))
        if whole_torus:
            xbits = (shape[0] - 1).bit_length()
            return {c: _gray(int(topo.chip_x[c])) | (_gray(int(topo.chip_y[c])) << xbits)
                    for c in chips}
        order = [int(c) for c in topo.ring_order(chips)]
        return {c: _gray(i) for i, c in enumerate(order)}

    def _hamiltonian_cycles(self, chips: list[int]) -> list[list[int]]:
        """Edge-disjoint Hamiltonian cycles of the chips on direct NeuronLink links."""
        key = tuple(c % self.hardware.chips_per_instance for c in chips)
        if key not in self._cycles:
            base = chips[0] - chips[0] % self.hardware.chips_per_instance
            local = [c - base for c in chips]
            graph = nx.Graph()
            graph.add_nodes_from(local)
            for u, v, data in self.topology.graph.edges(chips, data=True):
                if data["kind"] in NEURONLINK_KINDS and data["kind"] != "switch" and (
                        v in set(chips)):
                    graph.add_edge(u - base, v - base)
            self._cycles[key] = _edge_disjoint_hamiltonian_cycles(graph)
        base = chips[0] - chips[0] % self.hardware.chips_per_instance
        return [[c + base for c in cycle] for cycle in self._cycles[key]]

    # ------------------------------------------------------------------ UltraServer (Z) level
    def _ultraserver_stage(self, op: str, layout: _Layout, buffer: float, algorithm: str
                           ) -> StageCost:
        """Instances of an UltraServer over the Z rings: each chip position runs its own
        group along its Z ring, with every rank of the chip in a parallel group."""
        m = layout.ultraserver_members
        k = layout.ranks_per_chip
        per_instance = len(layout.instance_chips)
        chips = [int(c) for c in layout.ultraserver_chips]
        columns = [chips[i::per_instance] for i in range(per_instance)]  # same (x, y), each z
        names = ["ring", "biring", "mesh"] + (["mesh1"] if op == "all-reduce" else [])
        if algorithm in ("auto", "hierarchical"):
            algorithm = min(names, key=lambda n: sum(self._z_cost(op, columns, k, buffer, n)[:2]))
        if algorithm not in names:
            raise CollectiveError(f"{algorithm} does not apply on the Z rings; expected {names}")
        latency, transfer, steps = self._z_cost(op, columns, k, buffer, algorithm)
        return StageCost("ultraserver", op, algorithm, m, buffer, steps, latency, transfer)

    def _z_cost(self, op: str, columns: list[list[int]], k: int, buffer: float, algorithm: str
                ) -> tuple[float, float, int]:
        return self._run_steps(self._z_pattern(op, columns, k, buffer, algorithm),
                               self.constants.step_latency_s)

    def _z_steps(self, op: str, chips: list[int], layout: _Layout, buffer: float,
                 algorithm: str) -> list[_Step]:
        per_instance = len(layout.instance_chips)
        columns = [chips[i::per_instance] for i in range(per_instance)]
        return self._z_pattern(op, columns, layout.ranks_per_chip, buffer, algorithm)

    def _z_pattern(self, op: str, columns: list[list[int]], k: int, buffer: float,
                   algorithm: str) -> list[_Step]:
        m = len(columns[0])
        per_chip = buffer * k  # k ranks of a chip, each in its own Z group
        flows_one: list[tuple[int, int]] = []
        flows_both: list[tuple[int, int]] = []
        all_pairs: list[tuple[int, int]] = []
        for column in columns:
            hops = list(zip(column, column[1:] + column[:1], strict=True)) if m > 2 else (
                [(column[0], column[1])] if m == 2 else [])
            flows_one += hops
            flows_both += hops + [(b, a) for a, b in hops]
            all_pairs += [(a, b) for a in column for b in column if a != b]
        if m == 2:
            flows_one = flows_both  # two members exchange both ways in a ring step
        if algorithm in ("ring", "biring"):
            directions = 1 if algorithm == "ring" else 2
            flows = flows_one if directions == 1 else flows_both
            chunk = per_chip / m / directions
            if op == "broadcast":
                return [_Step(m - 1, [], 0.0, 0.0), _Step(1, flows, per_chip / directions, 0.0)]
            count = (2 if op == "all-reduce" else 1) * (m - 1)
            return [_Step(count, flows, chunk, _REDUCE_ACCESSES * chunk * directions)]
        if algorithm == "mesh1":
            return [_Step(1, all_pairs, per_chip, _REDUCE_ACCESSES * per_chip * m)]
        if op == "broadcast":
            return [_Step(1, all_pairs[: m - 1], per_chip, _COPY_ACCESSES * per_chip)]
        if op == "all-to-all":  # the buffer is what leaves the instance, split over peers
            return [_Step(1, all_pairs, per_chip / (m - 1), _COPY_ACCESSES * per_chip)]
        count = 2 if op == "all-reduce" else 1
        return [_Step(count, all_pairs, per_chip / m, _REDUCE_ACCESSES * per_chip)]

    # ------------------------------------------------------------------ fabric (EFA) level
    def _fabric_stage(self, op: str, layout: _Layout, buffer: float, algorithm: str
                      ) -> StageCost:
        """Domains over EFA, one group per local rank, run in parallel: computed on the
        domains as nodes whose NIC capacity is their chips' EFA, vectorised."""
        x = len(layout.domains)
        names = ["ring", "rdh"]
        if x <= self.constants.fabric_mesh_max_nodes or algorithm in ("mesh", "mesh1"):
            names.append("mesh")  # forced mesh is allowed at any size; auto keeps it small
            if op == "all-reduce":
                names.append("mesh1")
        if op in ("broadcast", "all-to-all") and "rdh" in names:
            names.remove("rdh")
        if algorithm in ("auto", "hierarchical"):
            algorithm = min(names, key=lambda n: sum(self._fabric_cost(op, layout, buffer, n)[:2]))
        if algorithm == "biring":
            algorithm = "ring"  # EFA links are full duplex per flow; a ring already uses both
        if algorithm not in names:
            raise CollectiveError(
                f"{algorithm} does not apply over EFA for {x} nodes; expected one of {names}"
            )
        latency, transfer, steps = self._fabric_cost(op, layout, buffer, algorithm)
        return StageCost("fabric", op, algorithm, x, buffer, steps, latency, transfer)

    def _fabric_cost(self, op: str, layout: _Layout, buffer: float, algorithm: str
                     ) -> tuple[float, float, int]:
        topo, hw, c = self.topology, self.hardware, self.constants
        x = len(layout.domains)
        chips = layout.chips_per_domain
        node_bytes = buffer * layout.ranks_per_chip * chips  # what a node holds at this level
        nic = chips * hw.efa_per_chip_bytes_per_s * c.efa_efficiency
        per_leaf = topo.fabric.leaf_size(hw.instances_per_ultraserver)
        uplink = per_leaf * hw.instance.efa_bytes_per_s / topo.fabric.oversubscription * (
            c.efa_efficiency)
        leaves = layout.domain_leaves
        hop_latency = c.efa_step_latency_s + topo.fabric.latency_s
        index = np.arange(x)

        def pattern_time(partner: np.ndarray, flow_bytes: float) -> float:
            crossing = leaves != leaves[partner]
            out_count = np.bincount(leaves[crossing], minlength=topo.leaves)
            in_count = np.bincount(leaves[partner][crossing], minlength=topo.leaves)
            worst = max(int(out_count.max(initial=0)), int(in_count.max(initial=0)))
            return max(flow_bytes / nic, worst * flow_bytes / uplink if topo.leaves > 1 else 0.0)

        if algorithm == "ring":
            partner = np.roll(index, -1)
            chunk = node_bytes / x
            per_step = pattern_time(partner, chunk)
            if op == "broadcast":
                return (x - 1) * hop_latency, node_bytes / nic, x
            count = (2 if op == "all-reduce" else 1) * (x - 1)
            if op == "all-to-all":
                return count * hop_latency, count * per_step * x / 2 / max(1, x - 1), count
            return count * hop_latency, count * per_step, count
        if algorithm == "rdh":
            # Recursive halving/doubling on the largest power of two; the other nodes first
            # hand their whole buffer to a partner and get the result back at the end.
            dims = x.bit_length() - 1
            core = 1 << dims
            factor = 2 if op == "all-reduce" else 1
            transfer = 0.0
            for j in range(dims):
                sent = node_bytes / 2 ** (j + 1)
                partner = index[:core] ^ (1 << j)
                transfer += pattern_time(np.concatenate([partner, index[core:]]), sent)
            transfer *= factor
            steps = factor * dims
            extra = x - core
            if extra:
                fold = np.concatenate([index[:core], index[core:] - core])
                fold_time = pattern_time(fold, node_bytes)
                transfer += (2 if op == "all-reduce" else 1) * fold_time
                steps += 2 if op == "all-reduce" else 1
            return steps * hop_latency, transfer, steps
        # mesh and mesh1: every node sends to every other node at once.
        if algorithm == "mesh1":
            flow = node_bytes
        elif op == "all-to-all":  # the buffer is what leaves the domain, split over peers
            flow = node_bytes / (x - 1)
        else:
            flow = node_bytes / x
        counts = np.bincount(leaves, minlength=topo.leaves)
        crossing = counts * (x - counts)  # node pairs leaving each leaf
        nic_time = (x - 1) * flow / nic
        uplink_time = crossing.max(initial=0) * flow / uplink if topo.leaves > 1 else 0.0
        per_step = max(nic_time, uplink_time)
        count = 2 if op == "all-reduce" and algorithm == "mesh" else 1
        return count * hop_latency, count * per_step, count

    # ------------------------------------------------------------------ other patterns
    def _all_to_all(self, layout: _Layout, size: float, levels: list[str], choice: dict
                    ) -> list[StageCost]:
        """All-to-all: each level's share of the buffer is exchanged by that level's links,
        all levels at once (the pieces for other domains go over EFA, the rest stays)."""
        k = layout.ranks_per_chip
        per_instance = len(layout.instance_chips) * k
        total = per_instance * layout.ultraserver_members * len(layout.domains)
        stages = [self._stage("instance", "all-to-all", layout, size * per_instance / total,
                              "mesh" if choice["instance"] == "auto" else choice["instance"])]
        if "ultraserver" in levels:
            share = size * per_instance * (layout.ultraserver_members - 1) / total
            stages.append(self._ultraserver_stage("all-to-all", layout, share, "mesh"))
        if "fabric" in levels:
            inside = per_instance * layout.ultraserver_members
            share = size * (total - inside) / total
            stages.append(self._fabric_stage("all-to-all", layout, share, "mesh"))
        if len(stages) > 1:  # concurrent: the slowest level's transfer, every level's latency
            slowest = max(stages, key=lambda s: s.transfer_s)
            stages = [replace(s, transfer_s=s.transfer_s if s is slowest else 0.0) for s in stages]
        return stages

    def _flat_ring_over_all(self, op: str, layout: _Layout, size: float, algorithm: str
                            ) -> StageCost:
        """One ring over every rank of a multi-node group (Neuron uses it on Trn1 for large
        messages): NeuronLink hops inside a node, one EFA hop between nodes."""
        x = len(layout.domains)
        k = layout.ranks_per_chip
        ranks = x * layout.chips_per_domain * k
        directions = 1 if algorithm == "ring" else 2
        chunk = size / ranks / directions
        c = self.constants
        local = [int(ch) for ch in self.topology.ring_order(layout.ultraserver_chips)]
        intra_hops = list(zip(local, local[1:], strict=False))
        intra_flows = intra_hops + ([(b, a) for a, b in intra_hops] if directions == 2 else [])
        intra_time, intra_latency = self._link_time(intra_flows, chunk)
        nic = self.hardware.efa_per_chip_bytes_per_s * c.efa_efficiency
        per_step = max(intra_time, chunk / nic,
                       _REDUCE_ACCESSES * chunk * k * directions / self._hbm_rate())
        latency = c.efa_step_latency_s + self.topology.fabric.latency_s
        count = (2 if op == "all-reduce" else 1) * (ranks - 1)
        return StageCost("fabric", op, algorithm, ranks, size, count, count * max(
            latency, c.step_latency_s + intra_latency), count * per_step)

    def _send_recv(self, group: Group, size: float, peer: int | None) -> CollectiveCost:
        """Point to point from the group's first chip to `peer` (pipeline stages)."""
        src = int(group.chips[0])
        dst = int(group.chips[-1]) if peer is None else int(peer)
        c = self.constants
        if src == dst:
            transfer = _COPY_ACCESSES * size / self._hbm_rate()
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

    # ------------------------------------------------------------------ step costing
    def _hbm_rate(self) -> float:
        return self.hardware.chip.hbm_bandwidth_bytes_per_s * self.constants.hbm_efficiency

    def _run_steps(self, steps: list[_Step], step_latency: float) -> tuple[float, float, int]:
        latency = transfer = 0.0
        count = 0
        hbm = self._hbm_rate()
        for step in steps:
            link_time, route_latency = self._link_time(step.flows, step.flow_bytes)
            memory_time = step.hbm_bytes_per_chip / hbm
            latency += step.count * (step_latency + route_latency)
            transfer += step.count * max(link_time, memory_time)
            count += step.count
        return latency, transfer, count

    def _link_time(self, flows: list[tuple[int, int]], flow_bytes: float) -> tuple[float, float]:
        """(time for all flows to send flow_bytes at once, longest route latency)."""
        if not flows or flow_bytes <= 0:
            latency = max((self.topology.path(a, b).latency_s for a, b in flows), default=0.0)
            return 0.0, latency
        key = (tuple(flows) if len(flows) < 2048 else (len(flows), flows[0], flows[-1]),)
        cached = self._link_time_cache.get(key)
        if cached is None:
            loads: Counter[tuple[int, int]] = Counter()
            latency = 0.0
            for a, b in flows:
                nodes = self.topology.route(a, b)
                for u, v in zip(nodes, nodes[1:], strict=False):
                    loads[(u, v)] += 1
                latency = max(latency, self.topology.path(a, b).latency_s)
            worst = 0.0  # seconds per byte of one flow on the busiest link
            for (u, v), count in loads.items():
                data = self.topology.graph.edges[u, v]
                worst = max(worst, count / (data["bandwidth_bytes_per_s"] * self._efficiency(
                    data["kind"])))
            cached = (worst, latency)
            self._link_time_cache[key] = cached
        return cached[0] * flow_bytes, cached[1]

    def _efficiency(self, kind: str) -> float:
        return self.constants.efa_efficiency if kind in FABRIC_KINDS else (
            self.constants.link_efficiency)

    # ------------------------------------------------------------------ contention
    def resource_rates(self, cost: CollectiveCost) -> dict[tuple, float]:
        """Peak rate at which the collective uses each resource while it transfers.

        Resources: directed links (`("link", u, v)`, bytes/s) and chips' HBM
        (`("hbm", chip)`, bytes/s) of its instance and UltraServer levels, for every instance
        of the group; and each domain's EFA (`("efa", first chip)`, as a fraction of it: 1 when
        a fabric stage runs). The rate of a resource is the highest over the stages that use
        it, so collectives sharing it are assumed to meet in their busiest phases.
        """
        if cost.group is None or cost.transfer_s <= 0:
            return {}
        layout = self._layout(cost.group)
        rates: dict[tuple, float] = {}

        def peak(key: tuple, rate: float) -> None:
            if rate > rates.get(key, 0.0):
                rates[key] = rate

        cpi = self.hardware.chips_per_instance
        for stage in cost.stages:
            if stage.transfer_s <= 0:
                continue
            if stage.level == "fabric":
                for domain in layout.domains.tolist():
                    peak(("efa", domain), 1.0)
                continue
            if stage.level == "instance":
                chips = [int(c) for c in layout.instance_chips]
                steps = self._instance_steps(stage.op, chips, layout.ranks_per_chip,
                                             stage.bytes_per_rank, stage.algorithm)
                span = cpi * (self.hardware.instances_per_ultraserver
                              if self.hardware.switch_spans_ultraserver else 1)
            else:
                chips = [int(c) for c in layout.ultraserver_chips]
                steps = self._z_steps(stage.op, chips, layout, stage.bytes_per_rank,
                                      stage.algorithm)
                span = cpi * self.hardware.instances_per_ultraserver
            link_bytes: Counter[tuple[int, int]] = Counter()
            hbm_bytes = 0.0
            for step in steps:
                hbm_bytes += step.count * step.hbm_bytes_per_chip
                for a, b in step.flows:
                    nodes = self.topology.route(a, b)
                    for u, v in zip(nodes, nodes[1:], strict=False):
                        link_bytes[(u, v)] += step.count * step.flow_bytes
            rep_base = chips[0] - chips[0] % span
            bases = (np.unique(cost.group.chips // span) * span).tolist()
            for base in bases:
                shift = base - rep_base
                for (u, v), count in link_bytes.items():
                    su, sv = self._translate(u, v, shift), self._translate(v, u, shift)
                    peak(("link", su, sv), count / stage.transfer_s)
                for chip in chips:
                    peak(("hbm", chip + shift), hbm_bytes / stage.transfer_s)
        return rates

    def _translate(self, node: int, other: int, shift: int) -> int:
        """A node of the representative's links, moved to another instance: chips shift,
        a chip switch becomes the switch of the shifted chip at the link's other end."""
        if node < self.topology.chips:
            return node + shift
        return self.topology._switch_of(other + shift)

    def capacity(self, key: tuple) -> float:
        """What a resource of `resource_rates` can carry."""
        if key[0] == "link":
            data = self.topology.graph.edges[key[1], key[2]]
            return data["bandwidth_bytes_per_s"] * self._efficiency(data["kind"])
        if key[0] == "hbm":
            return self._hbm_rate()
        return 1.0


def simultaneous(model: CollectiveModel, costs: Sequence[CollectiveCost]) -> list[CollectiveCost]:
    """Collectives running at the same time, sharing links, HBM and EFA max-min fairly.

    Each collective alone uses each resource at some peak rate. Run together, each one's
    transfer runs at a speed found by progressive filling: every speed rises together until
    some shared resource is full; the collectives using it are frozen there, the others go on
    rising (to at most their speed alone). Two identical collectives on the same links each
    get half the bandwidth. Only the transfer part slows; latency does not.
    """
    rates = [model.resource_rates(c) for c in costs]
    keys = {key for r in rates for key in r}
    capacity = {key: model.capacity(key) for key in keys}
    speed = [0.0 if r else 1.0 for r in rates]
    frozen = [not r for r in rates]
    while not all(frozen):
        active = [i for i in range(len(costs)) if not frozen[i]]
        step = min(1.0 - speed[i] for i in active)
        for key in keys:
            growth = sum(rates[i].get(key, 0.0) for i in active)
            if growth > 0:
                load = sum(speed[i] * rates[i].get(key, 0.0) for i in range(len(costs)))
                step = min(step, max(0.0, capacity[key] - load) / growth)
        for i in active:
            speed[i] += step
        full = {key for key in keys
                if sum(speed[i] * rates[i].get(key, 0.0) for i in range(len(costs)))
                >= capacity[key] * (1 - 1e-9)}
        for i in active:
            if speed[i] >= 1.0 - 1e-12 or any(rates[i].get(key, 0.0) > 0 for key in full):
                frozen[i] = True
    return [c.scaled(1.0 / s) if 0 < s < 1 else c for c, s in zip(costs, speed, strict=True)]


def _gray(i: int) -> int:
    return i ^ (i >> 1)


def _edge_disjoint_hamiltonian_cycles(graph: nx.Graph, budget: int = 200_000) -> list[list[int]]:
    """As many edge-disjoint Hamiltonian cycles as the minimum degree allows (d // 2), found
    by depth-first search that backtracks over the choice of earlier cycles; within a work
    budget, the largest set found is returned (the 4x4 torus gives its 2)."""
    if graph.number_of_nodes() < 3:
        return []
    wanted = min(d for _, d in graph.degree) // 2
    work = [budget]
    best: list[list[int]] = []
    for count in range(wanted, 0, -1):
        found = _decompose(graph, count, work)
        if found:
            best = found
            break
        if work[0] <= 0:
            break
    return best


def _decompose(graph: nx.Graph, count: int, work: list[int]) -> list[list[int]] | None:
    start = min(graph.nodes)
    for cycle in _hamiltonian_cycles(graph, start, work):
        if count == 1:
            return [cycle]
        rest = graph.copy()
        rest.remove_edges_from(zip(cycle, cycle[1:] + cycle[:1], strict=True))
        if count == 2 and all(d == 2 for _, d in rest.degree):  # 2-regular: one cycle or none
            if nx.is_connected(rest):
                return [cycle, _walk_cycle(rest, start)]
            continue
        others = _decompose(rest, count - 1, work)
        if others:
            return [cycle] + others
        if work[0] <= 0:
            return None
    return None


def _walk_cycle(graph: nx.Graph, start: int) -> list[int]:
    cycle, previous, node = [start], None, start
    while True:
        nxt = next(v for v in sorted(graph[node]) if v != previous)
        if nxt == start:
            return cycle
        cycle.append(nxt)
        previous, node = node, nxt


def _hamiltonian_cycles(graph: nx.Graph, start: int, work: list[int]):
    """Hamiltonian cycles through `start`, each once per direction, lazily; counts work."""
    n = graph.number_of_nodes()
    path = [start]
    on_path = {start}
    stack = [iter(sorted(graph[start]))]
    while stack and work[0] > 0:
        work[0] -= 1
        advanced = False
        for nxt in stack[-1]:
            if nxt in on_path:
                continue
            if len(path) == n - 1:
                if graph.has_edge(nxt, start) and path[1] < nxt:  # one of the two directions
                    yield path + [nxt]
                continue
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(sorted(graph[nxt])))
            advanced = True
            break
        if not advanced:
            stack.pop()
            on_path.discard(path.pop())
            if not path:
                return
