"""Building a cluster's topology: the chips' graph, its fabric and its sites, from a hardware spec."""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import networkx as nx
import numpy as np

from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.fabric import (
    FabricSpec,
    check_topology_size,
)
from clustersim.hardware.sites import SiteNetwork
from clustersim.hardware.topology import Topology, ring_edges, torus_edges

__all__ = [
    "build_topology",
]


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
