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

import gc
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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
    "build_topology",
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


class _Filler:
    """Adds nodes and edges to a fresh graph as `add_nodes_from` / `add_edges_from` do (same
    dicts, same insertion order, so the same graph), writing networkx's adjacency dicts
    directly: a million edges through the generic methods cost seconds. Falls back to those
    methods for a graph class with other storage."""

    def __init__(self, graph: nx.Graph):
        self.graph = graph
        self.direct = (type(graph) is nx.Graph and graph.node_attr_dict_factory is dict
                       and graph.adjlist_inner_dict_factory is dict
                       and graph.edge_attr_dict_factory is dict
                       and isinstance(getattr(graph, "_adj", None), dict)
                       and isinstance(getattr(graph, "_node", None), dict))

    def nodes(self, rows: Iterable[tuple[int, dict]]) -> None:
        """New nodes with their attribute dicts (each node added once)."""
        if not self.direct:
            self.graph.add_nodes_from(rows)
            return
        node, adj = self.graph._node, self.graph._adj
        for n, data in rows:
            if n in node:
                node[n].update(data)
                continue
            adj[n] = {}
            node[n] = dict(data)
        self._changed()

    def edges(self, pairs: Iterable[tuple[int, int]], data: dict) -> None:
        """Edges between existing nodes (KeyError or ValueError otherwise), each with (a
        copy of) `data`."""
        if not self.direct:
            self.graph.add_edges_from(pairs, **data)
            return
        node, adj = self.graph._node, self.graph._adj
        for u, v in pairs:
            known = adj[u].get(v)
            if known is None:
                if v not in node:
                    raise ValueError(f"edge ({u}, {v}) to a node not in the graph")
                known = data.copy()
            else:
                known.update(data)
            adj[u][v] = known
            adj[v][u] = known
        self._changed()

    def _changed(self) -> None:
        cache = getattr(self.graph, "__networkx_cache__", None)
        if cache:
            cache.clear()


@contextmanager
def _without_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector. Building a large graph allocates millions of
    node and edge dicts, none in a reference cycle, and each allocation burst would trigger a
    collection that walks all of them (half the build time at 524,288 chips)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def build_topology(hardware: HardwareSpec, instances: int, fabric: FabricSpec | None = None,
                   sites: SiteNetwork | None = None) -> Topology:
    """The topology of `instances` instances of `hardware` on an EFA Clos fabric (refused
    with TopologyTooLarge beyond the limit); with `sites`, one Clos per site joined by the
    inter-site links. Arrays now; its networkx graph on first use of `Topology.graph`."""
    with _without_gc():
        topology = _build(hardware, instances, fabric, sites, with_graph=False)

    def graph() -> nx.Graph:
        with _without_gc():
            return _build(hardware, instances, fabric, sites, with_graph=True)._graph

    topology._graph_factory = graph
    return topology


class _NoGraph:
    """Stands for _Filler when the graph is not built: adds nothing."""

    def nodes(self, rows: Iterable[tuple[int, dict]]) -> None:
        pass

    def edges(self, pairs: Iterable[tuple[int, int]], data: dict) -> None:
        pass


def _build(hardware: HardwareSpec, instances: int, fabric: FabricSpec | None,
           sites: SiteNetwork | None = None, with_graph: bool = True) -> Topology:
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
    n_sites = 0
    if sites is not None:
        _check_sites(sites, instances, per_leaf, ipu)
        n_sites = sites.count
        n_spines = fabric.spines * n_sites

    n_switches = 0
    if link.topology == "switch":
        n_switches = (instances // ipu) if hw.switch_spans_ultraserver else instances
    first_switch = n_chips
    first_leaf = first_switch + n_switches
    first_spine = first_leaf + n_leaves

    graph = nx.Graph(hardware=hw.name, instances=instances) if with_graph else None
    chip_ultraserver = ultraserver.astype(np.int32)
    fill: _Filler | _NoGraph = _NoGraph()
    if graph is not None:
        node_rows = zip(
            chip.tolist(), instance.tolist(), chip_ultraserver.tolist(), leaf.tolist(),
            chip_x.tolist(), chip_y.tolist(), chip_z.tolist(), strict=True,
        )
        fill = _Filler(graph)
        fill.nodes(
            (c, {"kind": "chip", "instance": i, "ultraserver": u, "leaf": lf, "x": x, "y": y,
                 "z": z})
            for c, i, u, lf, x, y, z in node_rows
        )
    fill.nodes((first_switch + s, {"kind": "switch"}) for s in range(n_switches))
    fill.nodes((first_leaf + s, {"kind": "leaf"}) for s in range(n_leaves))
    fill.nodes((first_spine + s, {"kind": "spine"}) for s in range(n_spines))
    first_site = first_spine + n_spines
    if sites is not None:
        fill.nodes((first_site + s, {"kind": "site", "name": name})
                   for s, name in enumerate(sites.names))
        if sites.backbone_bandwidth_bytes_per_s > 0:
            fill.nodes([(first_site + n_sites, {"kind": "backbone"})])

    counts: dict[str, int] = {}
    bandwidth: dict[str, float] = {}
    latency: dict[str, float] = {}
    quote_factor: dict[str, int] = {}

    def add(kind: str, pairs: np.ndarray, bw: float, lat: float, duplex_counted: bool) -> None:
        if len(pairs) == 0:
            return
        if graph is not None:
            fill.edges(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), strict=True),
                       {"kind": kind, "bandwidth_bytes_per_s": bw, "latency_s": lat})
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
    chip_site = None
    if sites is not None:
        chip_site = sites.site_of_instances(instances)[instance]
        _site_edges(add, sites, fabric, per_leaf, hw.instance.efa_bytes_per_s, n_leaves,
                    first_leaf, first_spine, first_site)
    elif n_spines:
        uplink = per_leaf * hw.instance.efa_bytes_per_s / fabric.oversubscription
        leaf_ids = np.repeat(np.arange(n_leaves, dtype=np.int64), n_spines)
        spine_ids = np.tile(np.arange(n_spines, dtype=np.int64), n_leaves)
        add("uplink", np.stack([first_leaf + leaf_ids, first_spine + spine_ids], axis=1),
            uplink / n_spines, 0.0, False)

    return Topology(
        hardware=hw, fabric=fabric, instances=instances, _graph=graph,
        chip_instance=instance.astype(np.int32), chip_ultraserver=chip_ultraserver,
        chip_leaf=leaf.astype(np.int32), chip_x=chip_x, chip_y=chip_y, chip_z=chip_z,
        first_switch=first_switch, first_leaf=first_leaf, first_spine=first_spine,
        leaves=n_leaves, spines=n_spines, edge_counts=counts, link_bandwidth=bandwidth,
        link_latency=latency, link_quote_factor=quote_factor,
        sites=sites, chip_site=chip_site, first_site=first_site if sites is not None else -1,
        spines_per_site=fabric.spines if sites is not None else n_spines,
    )


def _check_sites(sites: SiteNetwork, instances: int, per_leaf: int, ipu: int) -> None:
    """Sites fill the cluster, each with whole leaves (its own switches) of whole
    UltraServers."""
    if sum(sites.instances) != instances:
        raise ValueError(f"the sites hold {sum(sites.instances):,} instances, the topology "
                         f"{instances:,}")
    for name, count in zip(sites.names, sites.instances, strict=True):
        if count <= 0:
            raise ValueError(f"site {name} has no hardware")
        if count % ipu:
            raise ValueError(f"site {name}: {count} instances, expected whole UltraServers "
                             f"of {ipu}")
        if sites.count > 1 and count % per_leaf:
            raise ValueError(f"site {name}: {count} instances (spares included), expected a "
                             f"multiple of the {per_leaf} instances of a leaf (a site has "
                             "its own leaf switches)")


def _site_edges(add: Any, sites: SiteNetwork, fabric: FabricSpec, per_leaf: int,
                efa_bytes_per_s: float, n_leaves: int, first_leaf: int, first_spine: int,
                first_site: int) -> None:
    """Each site's leaves to its own spines, its spines to its gateway, the sites to one
    another (pair links) and to the backbone."""
    spines = fabric.spines
    leaf_site = sites.site_of_instances(n_leaves * per_leaf)[::per_leaf].astype(np.int64)
    uplink = per_leaf * efa_bytes_per_s / fabric.oversubscription
    leaf_ids = np.repeat(np.arange(n_leaves, dtype=np.int64), spines)
    spine_ids = np.repeat(leaf_site, spines) * spines + np.tile(np.arange(spines), n_leaves)
    add("uplink", np.stack([first_leaf + leaf_ids, first_spine + spine_ids], axis=1),
        uplink / spines, 0.0, False)
    for s in range(sites.count):
        out = sites.capacity_out(s)
        if out <= 0:
            continue
        pairs = np.stack([first_spine + s * spines + np.arange(spines),
                          np.full(spines, first_site + s)], axis=1)
        add("gateway", pairs, out / spines, 0.0, False)
    for a, b in itertools.combinations(range(sites.count), 2):
        if sites.direct(a, b):
            add("intersite", np.array([[first_site + a, first_site + b]]),
                sites.pair_bandwidth(a, b), sites.pair_latency(a, b), False)
    if sites.backbone_bandwidth_bytes_per_s > 0:
        hub = first_site + sites.count
        add("backbone", np.array([[first_site + s, hub] for s in range(sites.count)]),
            sites.backbone_bandwidth_bytes_per_s, sites.backbone_latency_s / 2, False)
