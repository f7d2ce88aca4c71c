"""The cluster as a networkx graph: chips, NeuronLink (or NVLink) links and the EFA Clos fabric.

`build_topology(hardware, instances, fabric)` is a pure function returning a
:class:`Topology`: the graph (integer node ids, attributes on every node and edge) plus numpy
arrays of per-chip coordinates, and the queries later layers need, cached by shape.

Node ids: chips are ``0 .. chips-1`` (chip = instance x chips_per_instance + local index),
then NeuronSwitch/NVSwitch nodes, then leaf switches, then spine switches.

Edges, by ``kind`` (bandwidth per direction, bytes/s; latency per hop, s):

- ``torus``: NeuronLink inside an instance on an X x Y torus (Trn1, Trn2: 4 x 4);
- ``ring``: NeuronLink inside an instance joined as a ring (an ``interconnect: ring`` instance);
- ``zring``: NeuronLink between the instances of a Trn2 UltraServer: chips with the same
  (x, y) form a ring over the instances' z index, making a 4 x 4 x 4 torus;
- ``switch``: a chip to its NeuronSwitch (Trn3, one per UltraServer) or NVSwitch (GPUs, one
  per instance);
- ``efa``: a chip's share of its instance's EFA bandwidth, to the instance's leaf switch;
- ``uplink``: a leaf switch to each spine switch; a leaf's uplinks carry its instances' EFA
  bandwidth divided by the oversubscription, split evenly over the spines.

Link bandwidths follow the reading documented in :mod:`clustersim.hardware.catalog`. EFA figures are
line rates, per direction. The fabric latency (one EFA message, HBM to HBM) is split evenly
over the two ``efa`` edges of a path; switch-to-switch hops add none.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.fabric import (
    FabricSpec,
    TopologyTooLarge,
    check_topology_size,
    topology_elements,
)

__all__ = [
    "EDGE_KINDS",
    "NODE_KINDS",
    "Topology",
    "PathSummary",
    "Ring",
    "FabricSpec",
    "TopologyTooLarge",
    "topology_elements",
    "check_topology_size",
    "build_topology",
    "torus_edges",
    "ring_edges",
]

EDGE_KINDS = ("torus", "ring", "zring", "switch", "efa", "uplink")
NODE_KINDS = ("chip", "switch", "leaf", "spine")


@dataclass(frozen=True)
class PathSummary:
    """A route between two chips: hops, summed latency and the narrowest link on it."""

    hops: int
    latency_s: float
    bottleneck_bytes_per_s: float
    kinds: tuple[str, ...]


@dataclass(frozen=True)
class Ring:
    """A ring over a group of chips, in order, costed on the links it shares."""

    order: tuple[int, ...]
    bottleneck_bytes_per_s: float  # per direction, narrowest link share along the ring
    max_hop_latency_s: float
    link_kinds: tuple[str, ...]
    max_link_load: int  # ring hops crossing the busiest directed link


def torus_edges(dims: tuple[int, ...]) -> np.ndarray:
    """Edges (pairs of indices into a row-major grid, x fastest) of a periodic torus.

    A dimension of 2 gives one edge per pair (not two), and of 1 none, as on a real torus.
    """
    n = math.prod(dims)
    index = np.arange(n)
    coords = []
    rest = index
    for size in dims:
        coords.append(rest % size)
        rest = rest // size
    pairs = []
    stride = 1
    for axis, size in enumerate(dims):
        if size >= 2:
            c = coords[axis]
            keep = index if size >= 3 else index[c == 0]
            step = np.where(coords[axis][keep] == size - 1, -(size - 1) * stride, stride)
            pairs.append(np.stack([keep, keep + step], axis=1))
        stride *= size
    if not pairs:
        return np.empty((0, 2), dtype=np.int64)
    return np.concatenate(pairs)


def ring_edges(size: int) -> np.ndarray:
    """Edges of a cycle over `size` members (a single edge for two, none for one)."""
    return torus_edges((size,))


@dataclass
class Topology:
    """A built cluster graph with per-chip arrays and cached structural queries."""

    hardware: HardwareSpec
    fabric: FabricSpec
    instances: int
    graph: nx.Graph
    chip_instance: np.ndarray
    chip_ultraserver: np.ndarray
    chip_leaf: np.ndarray
    chip_x: np.ndarray
    chip_y: np.ndarray
    chip_z: np.ndarray
    first_switch: int
    first_leaf: int
    first_spine: int
    leaves: int
    spines: int
    edge_counts: dict[str, int]
    link_bandwidth: dict[str, float]  # kind -> bytes/s per direction
    link_latency: dict[str, float]  # kind -> s per hop
    link_quote_factor: dict[str, int]  # kind -> 2 where vendors count both directions
    _path_cache: dict[tuple, PathSummary] = field(default_factory=dict, repr=False)
    _ring_cache: dict[tuple, Ring] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ sizes
    @property
    def chips(self) -> int:
        return len(self.chip_instance)

    @property
    def ultraservers(self) -> int:
        return math.ceil(self.instances / self.hardware.instances_per_ultraserver) if (
            self.hardware.ultraserver
        ) else 0

    @property
    def switches(self) -> int:
        return self.first_leaf - self.first_switch

    def leaf_node(self, leaf: int) -> int:
        return self.first_leaf + leaf

    def spine_node(self, spine: int) -> int:
        return self.first_spine + spine

    # ------------------------------------------------------------------ per-chip figures
    def chip_bandwidth_bytes_per_s(self, chip: int = 0, quoted: bool = True) -> dict[str, float]:
        """A chip's bandwidth on each kind of link, summed over its links.

        With `quoted`, read as the catalog quotes it (NeuronLink and NVLink with both directions
        added where `duplex_counted`; EFA per direction); otherwise per direction.
        """
        totals: Counter[str] = Counter()
        for _, _, data in self.graph.edges(chip, data=True):
            factor = self.link_quote_factor[data["kind"]] if quoted else 1
            totals[data["kind"]] += factor * data["bandwidth_bytes_per_s"]
        return dict(totals)

    def neighbours(self, chip: int) -> list[tuple[int, str, float]]:
        """(node, link kind, bytes/s per direction) for each neighbour of a chip."""
        return sorted(
            (n, d["kind"], d["bandwidth_bytes_per_s"]) for n, d in self.graph[chip].items()
        )

    def bisection_bytes_per_s(self) -> float:
        """EFA bisection bandwidth, per direction: half the instances talking to the other half.

        With one leaf it is (instances / 2) x EFA per instance. For a two-tier Clos whose
        leaves hold equal halves it is
        (instances / 2) x EFA per instance / max(1, oversubscription): traffic between the
        halves crosses the leaves' uplinks, which carry their downlink over the
        oversubscription (and never more than the NICs can inject).
        """
        efa = self.hardware.instance.efa_bytes_per_s
        if self.leaves == 1:  # one non-blocking leaf switch: only the NICs limit
            return (self.instances // 2) * efa
        return (self.instances // 2) * efa / max(1.0, self.fabric.oversubscription)

    # ------------------------------------------------------------------ routing
    def route(self, a: int, b: int) -> list[int]:
        """Nodes on the route from chip a to chip b, as the hardware routes it.

        Inside an instance: dimension order on the torus (x, then y, shorter way round), or
        through the switch. Inside a ring UltraServer: along the Z ring first, then the torus.
        Otherwise over EFA: chip, leaf, (spine chosen by hashing the pair, as ECMP does), leaf,
        chip.
        """
        if a == b:
            return [a]
        hw = self.hardware
        ia, ib = int(self.chip_instance[a]), int(self.chip_instance[b])
        ua, ub = int(self.chip_ultraserver[a]), int(self.chip_ultraserver[b])
        if hw.switch_spans_ultraserver and ua == ub:
            return [a, self._switch_of(a), b]
        if ia == ib:
            return self._route_in_instance(a, b)
        if hw.ultraserver is not None and ua == ub:  # Z ring, then the torus of b's instance
            ipu, cpi = hw.instances_per_ultraserver, hw.chips_per_instance
            z, zb = int(self.chip_z[a]), int(self.chip_z[b])
            step = _ring_step(z, zb, ipu)
            path = [a]
            while z != zb:
                z = (z + step) % ipu
                path.append((ua * ipu + z) * cpi + a % cpi)
            return path + self._route_in_instance(path[-1], b)[1:]
        la, lb = int(self.chip_leaf[a]), int(self.chip_leaf[b])
        if la == lb:
            return [a, self.leaf_node(la), b]
        spine = self.spine_node((a + b) % self.spines)
        return [a, self.leaf_node(la), spine, self.leaf_node(lb), b]

    def _switch_of(self, chip: int) -> int:
        if self.hardware.switch_spans_ultraserver:
            return self.first_switch + int(self.chip_ultraserver[chip])
        return self.first_switch + int(self.chip_instance[chip])

    def _route_in_instance(self, a: int, b: int) -> list[int]:
        link = self.hardware.instance.interconnect
        if a == b:
            return [a]
        if link.topology == "switch":
            return [a, self._switch_of(a), b]
        cpi = self.hardware.chips_per_instance
        base = a - a % cpi
        if link.topology == "ring":
            dims = (cpi, 1)
        else:
            assert link.shape is not None
            dims = (link.shape[0], link.shape[1])
        x, y = (a - base) % dims[0], (a - base) // dims[0]
        xb, yb = (b - base) % dims[0], (b - base) // dims[0]
        path = [a]
        while x != xb:
            x = (x + _ring_step(x, xb, dims[0])) % dims[0]
            path.append(base + x + dims[0] * y)
        while y != yb:
            y = (y + _ring_step(y, yb, dims[1])) % dims[1]
            path.append(base + x + dims[0] * y)
        return path

    def _relation(self, a: int, b: int) -> tuple:
        """What a route's cost depends on: the level two chips share and their distances."""
        hw = self.hardware
        if a == b:
            return ("self",)
        same_instance = self.chip_instance[a] == self.chip_instance[b]
        same_us = hw.ultraserver is not None and self.chip_ultraserver[a] == self.chip_ultraserver[b]
        if hw.switch_spans_ultraserver and same_us:
            return ("switch",)
        link = hw.instance.interconnect
        if link.topology == "switch" and same_instance:
            return ("switch",)
        dims = (link.shape or (hw.chips_per_instance, 1))
        dx = _ring_distance(int(self.chip_x[a]), int(self.chip_x[b]), dims[0])
        dy = _ring_distance(int(self.chip_y[a]), int(self.chip_y[b]), dims[1])
        if same_instance:
            return ("instance", dx, dy)
        if same_us:
            dz = _ring_distance(int(self.chip_z[a]), int(self.chip_z[b]),
                                hw.instances_per_ultraserver)
            return ("ultraserver", dz, dx, dy)
        return ("leaf",) if self.chip_leaf[a] == self.chip_leaf[b] else ("spine",)

    def path(self, a: int, b: int) -> PathSummary:
        """Hops, latency and bottleneck of the route from a to b, cached by their relation."""
        key = self._relation(a, b)
        cached = self._path_cache.get(key)
        if cached is not None:
            return cached
        nodes = self.route(a, b)
        edges = [self.graph.edges[u, v] for u, v in zip(nodes, nodes[1:], strict=False)]
        summary = PathSummary(
            hops=len(edges),
            latency_s=sum(e["latency_s"] for e in edges),
            bottleneck_bytes_per_s=min(
                (e["bandwidth_bytes_per_s"] for e in edges), default=math.inf
            ),
            kinds=tuple(e["kind"] for e in edges),
        )
        self._path_cache[key] = summary
        return summary

    # ------------------------------------------------------------------ rings
    def ring_order(self, chips: Any) -> np.ndarray:
        """A ring over a group that follows the hardware: leaf by leaf, UltraServer by
        UltraServer, instance by instance along the Z ring, each instance in a snake over its
        torus (reversed on odd z so consecutive instances meet on a Z link)."""
        group = np.unique(np.asarray(chips, dtype=np.int64))
        cpi = self.hardware.chips_per_instance
        link = self.hardware.instance.interconnect
        width = link.shape[0] if link.shape else cpi
        local = group % cpi
        x, y = local % width, local // width
        snake = y * width + np.where(y % 2 == 0, x, width - 1 - x)
        z = self.chip_z[group]
        snake = np.where(z % 2 == 0, snake, cpi - 1 - snake)
        keys = (snake, z, self.chip_ultraserver[group], self.chip_leaf[group])
        return group[np.lexsort(keys)]

    def ring(self, chips: Any) -> Ring:
        """The ring over a group of chips and its bottleneck share of the links, per direction.

        Each ring hop is routed; hops that cross the same directed link share it, so the
        bottleneck is min over links of bandwidth / hops using it. Cached by the group's shape.
        """
        group = np.unique(np.asarray(chips, dtype=np.int64))
        key = self._shape_key(group)
        if key is not None and key in self._ring_cache:
            cached = self._ring_cache[key]
            order = tuple(int(c) for c in self.ring_order(group))
            return Ring(order, cached.bottleneck_bytes_per_s, cached.max_hop_latency_s,
                        cached.link_kinds, cached.max_link_load)
        order = self.ring_order(group)
        loads: Counter[tuple[int, int]] = Counter()
        max_latency = 0.0
        n = len(order)
        for i in range(n if n > 1 else 0):
            a, b = int(order[i]), int(order[(i + 1) % n])
            nodes = self.route(a, b)
            for u, v in zip(nodes, nodes[1:], strict=False):
                loads[(u, v)] += 1
            max_latency = max(max_latency, self.path(a, b).latency_s)
        if loads:
            shares = []
            kinds = set()
            for (u, v), count in loads.items():
                data = self.graph.edges[u, v]
                shares.append(data["bandwidth_bytes_per_s"] / count)
                kinds.add(data["kind"])
            bottleneck = min(shares)
            max_load = max(loads.values())
        else:
            bottleneck, kinds, max_load = math.inf, set(), 0
        ring = Ring(tuple(int(c) for c in order), bottleneck, max_latency,
                    tuple(k for k in EDGE_KINDS if k in kinds), max_load)
        if key is not None:
            self._ring_cache[key] = ring
        return ring

    def _shape_key(self, group: np.ndarray) -> tuple | None:
        """A key equal for groups that are translations of one another on the hardware.

        Regular groups (the same local chips in every instance, the same instances in every
        UltraServer, the same number of UltraServers under each leaf) have a key; others
        return None and are computed without caching.
        """
        cpi = self.hardware.chips_per_instance
        instances = group // cpi
        inst_ids, starts = np.unique(instances, return_index=True)
        locals_first = tuple(int(c) for c in group[instances == inst_ids[0]] % cpi)
        counts = np.diff(np.append(starts, len(group)))
        if np.any(counts != len(locals_first)):
            return None
        local_all = (group % cpi).reshape(len(inst_ids), len(locals_first))
        if np.any(local_all != local_all[0]):
            return None
        us = self.chip_ultraserver[inst_ids * cpi]
        zs = self.chip_z[inst_ids * cpi]
        us_ids, us_starts = np.unique(us, return_index=True)
        z_sets = Counter(
            tuple(zs[s:e]) for s, e in zip(us_starts, np.append(us_starts[1:], len(zs)),
                                          strict=False)
        )
        if len(z_sets) != 1:
            return None
        leaves = self.chip_leaf[us_ids * cpi * self.hardware.instances_per_ultraserver]
        per_leaf = Counter(Counter(leaves.tolist()).values())
        return (locals_first, next(iter(z_sets)), tuple(sorted(per_leaf.items())))

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict[str, Any]:
        """The figures `clustersim topology` prints."""
        hw = self.hardware
        per_chip = self.chip_bandwidth_bytes_per_s(0) if self.chips else {}
        return {
            "hardware": hw.name,
            "chips": self.chips,
            "instances": self.instances,
            "ultraservers": self.ultraservers,
            "switches": self.switches,
            "leaves": self.leaves,
            "spines": self.spines,
            "links": dict(self.edge_counts),
            "link_bandwidth_gbyte_per_s": {k: v / 1e9 for k, v in self.link_bandwidth.items()},
            "link_latency_us": {k: v * 1e6 for k, v in self.link_latency.items()},
            "per_chip_bandwidth_gbyte_per_s": {k: v / 1e9 for k, v in per_chip.items()},
            "bisection_gbyte_per_s": self.bisection_bytes_per_s() / 1e9,
            "ranks": self.chips * hw.chip.ranks,
        }


def _ring_distance(a: int, b: int, size: int) -> int:
    d = (b - a) % size
    return min(d, size - d)


def _ring_step(a: int, b: int, size: int) -> int:
    d = (b - a) % size
    return 1 if d <= size - d else -1


def build_topology(hardware: HardwareSpec, instances: int, fabric: FabricSpec | None = None
                   ) -> Topology:
    """Build the graph of `instances` instances of `hardware` on an EFA Clos fabric (refused
    with TopologyTooLarge beyond the limit)."""
    if instances < 1:
        raise ValueError(f"a topology needs at least one instance, got {instances}")
    fabric = fabric or FabricSpec()
    check_topology_size(hardware, instances, fabric)
    hw = hardware
    cpi = hw.chips_per_instance
    ipu = hw.instances_per_ultraserver
    if hw.ultraserver is not None and instances % ipu:
        raise ValueError(f"{hw.name} instances come in UltraServers of {ipu}, got {instances}")
    n_chips = instances * cpi
    chip = np.arange(n_chips, dtype=np.int64)
    local = chip % cpi
    instance = chip // cpi
    link = hw.instance.interconnect
    width = link.shape[0] if link.shape else cpi
    chip_x = (local % width).astype(np.int32)
    chip_y = (local // width).astype(np.int32)
    if hw.ultraserver is not None:
        ultraserver = instance // ipu
        chip_z = (instance % ipu).astype(np.int32)
    else:
        ultraserver = np.full(n_chips, -1, dtype=np.int64)
        chip_z = np.zeros(n_chips, dtype=np.int32)
    per_leaf = fabric.leaf_size(ipu)
    if per_leaf % ipu:
        raise ValueError(f"a leaf holds whole UltraServers of {ipu} instances, got {per_leaf}")
    leaf = instance // per_leaf
    n_leaves = int(leaf[-1]) + 1
    n_spines = fabric.spines if n_leaves > 1 else 0

    n_switches = 0
    if link.topology == "switch":
        n_switches = (instances // ipu) if hw.switch_spans_ultraserver else instances
    first_switch = n_chips
    first_leaf = first_switch + n_switches
    first_spine = first_leaf + n_leaves

    graph = nx.Graph(hardware=hw.name, instances=instances)
    chip_ultraserver = ultraserver.astype(np.int32)
    node_rows = zip(
        chip.tolist(), instance.tolist(), chip_ultraserver.tolist(), leaf.tolist(),
        chip_x.tolist(), chip_y.tolist(), chip_z.tolist(), strict=True,
    )
    graph.add_nodes_from(
        (c, {"kind": "chip", "instance": i, "ultraserver": u, "leaf": lf, "x": x, "y": y, "z": z})
        for c, i, u, lf, x, y, z in node_rows
    )
    graph.add_nodes_from((first_switch + s, {"kind": "switch"}) for s in range(n_switches))
    graph.add_nodes_from((first_leaf + s, {"kind": "leaf"}) for s in range(n_leaves))
    graph.add_nodes_from((first_spine + s, {"kind": "spine"}) for s in range(n_spines))

    counts: dict[str, int] = {}
    bandwidth: dict[str, float] = {}
    latency: dict[str, float] = {}
    quote_factor: dict[str, int] = {}

    def add(kind: str, pairs: np.ndarray, bw: float, lat: float, duplex_counted: bool) -> None:
        if len(pairs) == 0:
            return
        graph.add_edges_from(
            zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), strict=True),
            kind=kind, bandwidth_bytes_per_s=bw, latency_s=lat,
        )
        counts[kind] = counts.get(kind, 0) + len(pairs)
        bandwidth[kind] = bw
        latency[kind] = lat
        quote_factor[kind] = 2 if duplex_counted else 1

    # NeuronLink / NVLink inside the instance.
    if link.topology in ("torus2d", "ring"):
        dims = tuple(link.shape) if link.topology == "torus2d" else (cpi,)
        local_pairs = torus_edges(dims)
        offsets = (np.arange(instances, dtype=np.int64) * cpi)[:, None, None]
        pairs = (local_pairs[None, :, :] + offsets).reshape(-1, 2)
        add("torus" if link.topology == "torus2d" else "ring", pairs,
            link.link_bandwidth_per_direction(cpi), link.latency_s, link.duplex_counted)
    else:
        span = cpi * (ipu if hw.switch_spans_ultraserver else 1)
        pairs = np.stack([chip, first_switch + chip // span], axis=1)
        add("switch", pairs, link.link_bandwidth_per_direction(span), link.latency_s,
            link.duplex_counted)

    # Z rings between the instances of an UltraServer.
    us = hw.ultraserver
    if us is not None and us.interconnect.topology == "ring":
        z_pairs = ring_edges(ipu)  # pairs of z indices
        # chip (u, z, local) = (u * ipu + z) * cpi + local
        base = (np.arange(instances // ipu, dtype=np.int64) * ipu * cpi)[:, None, None, None]
        loc = np.arange(cpi, dtype=np.int64)[None, None, None, :]
        pair_chips = base + z_pairs[None, :, :, None] * cpi + loc
        pairs = pair_chips.transpose(0, 1, 3, 2).reshape(-1, 2)
        add("zring", pairs, us.interconnect.link_bandwidth_per_direction(ipu),
            us.interconnect.latency_s, us.interconnect.duplex_counted)

    # EFA: each chip's share of the instance's NICs, to the leaf; leaves to every spine.
    add("efa", np.stack([chip, first_leaf + leaf], axis=1), hw.efa_per_chip_bytes_per_s,
        fabric.latency_s / 2, False)
    if n_spines:
        uplink = per_leaf * hw.instance.efa_bytes_per_s / fabric.oversubscription
        leaf_ids = np.repeat(np.arange(n_leaves, dtype=np.int64), n_spines)
        spine_ids = np.tile(np.arange(n_spines, dtype=np.int64), n_leaves)
        add("uplink", np.stack([first_leaf + leaf_ids, first_spine + spine_ids], axis=1),
            uplink / n_spines, 0.0, False)

    return Topology(
        hardware=hw, fabric=fabric, instances=instances, graph=graph,
        chip_instance=instance.astype(np.int32), chip_ultraserver=chip_ultraserver,
        chip_leaf=leaf.astype(np.int32), chip_x=chip_x, chip_y=chip_y, chip_z=chip_z,
        first_switch=first_switch, first_leaf=first_leaf, first_spine=first_spine,
        leaves=n_leaves, spines=n_spines, edge_counts=counts, link_bandwidth=bandwidth,
        link_latency=latency, link_quote_factor=quote_factor,
    )
