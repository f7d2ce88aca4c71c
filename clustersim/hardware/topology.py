"""The cluster as a networkx graph: chips, NeuronLink (or NVLink) links and the EFA Clos fabric.

`build_topology(hardware, instances, fabric)` (in `build`) is a pure function returning a
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

With several sites (`clustersim.hardware.sites`), each site has its own leaves and spines (a
site's leaves uplink only to its spines), one ``site`` node (its gateway) and, with a shared
backbone, one ``backbone`` node; more edges:

- ``gateway``: each spine of a site to its site node, carrying together what the site's
  inter-site links can carry (no latency);
- ``intersite``: a site to another, per pair given, with the pair's bandwidth and latency;
- ``backbone``: a site to the backbone node (its access link; half the backbone latency).

Link bandwidths follow the reading documented in :mod:`clustersim.hardware.catalog`. EFA figures are
line rates, per direction. The fabric latency (one EFA message, HBM to HBM) is split evenly
over the two ``efa`` edges of a path; switch-to-switch hops add none.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
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
from clustersim.hardware.rings import Ring, Rings
from clustersim.hardware.routing import EDGE_KINDS, NODE_KINDS, PathSummary, Routing
from clustersim.hardware.sites import SiteNetwork

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
    "torus_edges",
    "ring_edges",
]


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
class Topology(Routing, Rings):
    """A built cluster graph with per-chip arrays and cached structural queries: routes and
    paths between chips (Routing), rings over groups of chips (Rings)."""

    hardware: HardwareSpec
    fabric: FabricSpec
    instances: int
    _graph: nx.Graph | None  # built on first use of `graph` (see `graph`)
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
    # Several sites (None for one): per-chip site, the first site node, spines per site.
    sites: SiteNetwork | None = None
    chip_site: np.ndarray | None = field(default=None, repr=False)
    first_site: int = -1
    spines_per_site: int = -1
    _graph_factory: Any = field(default=None, repr=False)
    _edge_kinds: dict[str, dict] = field(default_factory=dict, repr=False)
    _local_neighbours: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.spines_per_site < 0:
            self.spines_per_site = self.spines
        self._edge_kinds = {
            kind: {"kind": kind, "bandwidth_bytes_per_s": bw, "latency_s": self.link_latency[kind]}
            for kind, bw in self.link_bandwidth.items()}
        link = self.hardware.instance.interconnect
        cpi = self.hardware.chips_per_instance
        self._local_neighbours = [[] for _ in range(cpi)]
        if link.topology in ("torus2d", "ring"):
            for a, b in torus_edges(tuple(link.shape) if link.topology == "torus2d"
                                    else (cpi,)).tolist():
                self._local_neighbours[a].append(b)
                self._local_neighbours[b].append(a)

    # ------------------------------------------------------------------ the graph
    @property
    def graph(self) -> nx.Graph:
        """The networkx graph: built on first use, not with the topology. Routes, paths,
        rings and collectives read links from the arrays (`edge`, `chip_edges`), so a run on a
        million chips never builds it; `clustersim topology`, drawings and tests that walk
        the graph do (about 4.5 M edges and 2 GiB at 1,048,576 chips)."""
        if self._graph is None:
            self._graph = self._graph_factory()
        return self._graph

    @property
    def graph_built(self) -> bool:
        return self._graph is not None

    def edge(self, u: int, v: int) -> dict:
        """The attributes of the link between nodes u and v (kind, bandwidth per direction,
        latency), as the graph holds them; read from the arrays when the graph is not built.
        Only for linked nodes (routes' hops)."""
        if self._graph is not None:
            return self._graph.edges[u, v]
        if u > v:
            u, v = v, u
        if v < self.first_switch:  # two chips
            if self.chip_instance[u] == self.chip_instance[v]:
                link = self.hardware.instance.interconnect
                return self._edge_kinds["ring" if link.topology == "ring" else "torus"]
            return self._edge_kinds["zring"]
        if u < self.first_switch:
            return self._edge_kinds["switch" if v < self.first_leaf else "efa"]
        if v < self.first_spine or u >= self.first_spine:
            return self._site_edge(u, v)
        return self._edge_kinds["uplink"]

    def _site_edge(self, u: int, v: int) -> dict:
        net = self.sites
        assert net is not None and self._graph is None
        if u < self.first_site:  # a spine to its site's gateway
            site = v - self.first_site
            return {"kind": "gateway",
                    "bandwidth_bytes_per_s": net.capacity_out(site) / self.spines_per_site,
                    "latency_s": 0.0}
        a, b = u - self.first_site, v - self.first_site
        if b == net.count:
            return {"kind": "backbone", "bandwidth_bytes_per_s": net.backbone_bandwidth_bytes_per_s,
                    "latency_s": net.backbone_latency_s / 2}
        return {"kind": "intersite", "bandwidth_bytes_per_s": net.pair_bandwidth(a, b),
                "latency_s": net.pair_latency(a, b)}

    def chip_edges(self, chip: int) -> Iterator[tuple[int, int, dict]]:
        """(chip, neighbour, link attributes) of each link of a chip, as
        `graph.edges(chip, data=True)` gives them; from the arrays when the graph is not
        built."""
        if self._graph is not None:
            yield from self._graph.edges(chip, data=True)
            return
        hw = self.hardware
        cpi = hw.chips_per_instance
        base = chip - chip % cpi
        link = hw.instance.interconnect
        if link.topology == "switch":
            yield chip, self._switch_of(chip), self._edge_kinds["switch"]
        else:
            data = self._edge_kinds["ring" if link.topology == "ring" else "torus"]
            for n in self._local_neighbours[chip % cpi]:
                yield chip, base + n, data
        us = hw.ultraserver
        if us is not None and us.interconnect.topology == "ring" and "zring" in self._edge_kinds:
            ipu = hw.instances_per_ultraserver
            z = int(self.chip_z[chip])
            zs = sorted({(z + 1) % ipu, (z - 1) % ipu} - {z})
            for other in zs:
                yield chip, chip + (other - z) * cpi, self._edge_kinds["zring"]
        yield chip, self.leaf_node(int(self.chip_leaf[chip])), self._edge_kinds["efa"]

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
        for _, _, data in self.chip_edges(chip):
            factor = self.link_quote_factor[data["kind"]] if quoted else 1
            totals[data["kind"]] += factor * data["bandwidth_bytes_per_s"]
        return dict(totals)

    def neighbours(self, chip: int) -> list[tuple[int, str, float]]:
        """(node, link kind, bytes/s per direction) for each neighbour of a chip."""
        return sorted((n, d["kind"], d["bandwidth_bytes_per_s"]) for _, n, d in self.chip_edges(chip))

    @property
    def site_count(self) -> int:
        return 1 if self.sites is None else self.sites.count

    def site_of(self, chip: int) -> int:
        return 0 if self.chip_site is None else int(self.chip_site[chip])

    def site_node(self, site: int) -> int:
        return self.first_site + site

    def bisection_bytes_per_s(self) -> float:
        """EFA bisection bandwidth, per direction: half the instances talking to the other half.

        With one leaf it is (instances / 2) x EFA per instance. For a two-tier Clos whose
        leaves hold equal halves it is
        (instances / 2) x EFA per instance / max(1, oversubscription): traffic between the
        halves crosses the leaves' uplinks, which carry their downlink over the
        oversubscription (and never more than the NICs can inject).
        """
        efa = self.hardware.instance.efa_bytes_per_s
        if self.sites is not None and self.sites.count > 1:
            # Across sites: the narrowest cut between halves of the sites, unless the
            # halves' NICs and leaf uplinks carry less.
            chips = [n * self.hardware.chips_per_instance for n in self.sites.instances]
            cut = self.sites.bisection_cut_bytes_per_s(chips)
            return min(cut, (self.instances // 2) * efa / max(1.0, self.fabric.oversubscription))
        if self.leaves == 1:  # one non-blocking leaf switch: only the NICs limit
            return (self.instances // 2) * efa
        return (self.instances // 2) * efa / max(1.0, self.fabric.oversubscription)

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
        } | ({} if self.sites is None else {"sites": self.site_summary()})

    def site_summary(self) -> list[dict[str, Any]]:
        """Each site's size and its links to the others (`topology --json`)."""
        net = self.sites
        assert net is not None
        cpi = self.hardware.chips_per_instance
        per_leaf = self.fabric.leaf_size(self.hardware.instances_per_ultraserver)
        rows = []
        for s, name in enumerate(net.names):
            links = {}
            for t, other in enumerate(net.names):
                if t != s and net.pair_bandwidth(s, t) > 0:
                    links[other] = {
                        "gbyte_per_s": net.pair_bandwidth(s, t) / 1e9,
                        "latency_ms": net.pair_latency(s, t) * 1e3,
                        "via": "link" if net.direct(s, t) else "backbone"}
            rows.append({"name": name, "instances": net.instances[s],
                         "chips": net.instances[s] * cpi, "spares": net.spares[s],
                         "leaves": math.ceil(net.instances[s] / per_leaf),
                         "spines": self.spines_per_site, "links": links})
        return rows


