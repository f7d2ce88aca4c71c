"""Topology structure against formulas: counts by kind, degrees, bandwidth sums, isomorphisms."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import HardwareSpec, catalog_entry, resolve_hardware_mapping
from clustersim.hardware.topology import FabricSpec, ring_edges, torus_edges


def subgraph_of(topo, kinds, nodes):
    """The subgraph over `nodes` keeping only edges of the given kinds."""
    graph = nx.Graph()
    graph.add_nodes_from(nodes)
    node_set = set(nodes)
    for u, v, data in topo.graph.edges(nodes, data=True):
        if data["kind"] in kinds and u in node_set and v in node_set:
            graph.add_edge(u, v)
    return graph


def test_torus_edges_match_networkx_torus():
    pairs = torus_edges((4, 4))
    assert len(pairs) == 32
    ours = nx.Graph([tuple(p) for p in pairs.tolist()])
    assert nx.is_isomorphic(ours, nx.grid_2d_graph(4, 4, periodic=True))
    # Older Neuron docs call the Trn1 topology a 4D hypercube; a 4x4 torus is one.
    assert nx.is_isomorphic(ours, nx.hypercube_graph(4))


@pytest.mark.parametrize("dims", [(1,), (2,), (3,), (4,), (2, 2), (3, 5), (4, 4, 4)])
def test_torus_edges_small_and_odd_shapes(dims):
    ours = nx.Graph()
    ours.add_nodes_from(range(math.prod(dims)))
    ours.add_edges_from(tuple(p) for p in torus_edges(dims).tolist())
    reference = nx.grid_graph(list(reversed(dims)), periodic=True)
    reference = nx.Graph(reference)  # drop parallel edges of size-2 dimensions
    reference.remove_edges_from(nx.selfloop_edges(reference))
    assert ours.number_of_edges() == reference.number_of_edges()
    assert nx.is_isomorphic(ours, reference)


def test_ring_edges():
    assert len(ring_edges(1)) == 0
    assert len(ring_edges(2)) == 1
    assert len(ring_edges(4)) == 4


def test_single_trn2_instance_is_a_4x4_torus():
    topo = build_topology(catalog_entry("trn2"), 1)
    chips = list(range(16))
    torus = subgraph_of(topo, {"torus"}, chips)
    assert nx.is_isomorphic(torus, nx.grid_2d_graph(4, 4, periodic=True))
    assert topo.edge_counts == {"torus": 32, "efa": 16}
    assert topo.leaves == 1 and topo.spines == 0


def test_trn2_ultraserver_is_a_4x4x4_torus():
    topo = build_topology(catalog_entry("trn2u"), 4)
    chips = list(range(64))
    links = subgraph_of(topo, {"torus", "zring"}, chips)
    assert nx.is_isomorphic(links, nx.grid_graph([4, 4, 4], periodic=True))
    # Z links join chips with the same (x, y) in neighbouring instances.
    for u, v, data in topo.graph.edges(chips, data=True):
        if data["kind"] == "zring":
            assert (topo.chip_x[u], topo.chip_y[u]) == (topo.chip_x[v], topo.chip_y[v])
            assert topo.chip_ultraserver[u] == topo.chip_ultraserver[v]
            assert topo.chip_instance[u] != topo.chip_instance[v]


@pytest.mark.parametrize(
    "name, instances, per_leaf, spines",
    [("trn2", 40, 16, 4), ("trn2u", 64, 16, 8), ("trn1", 3, 16, 16), ("p5", 20, 8, 2),
     ("trn3-gen1", 16, 8, 4), ("trn3-gen2", 72, 36, 3)],
)
def test_counts_by_kind_match_formulas(name, instances, per_leaf, spines):
    hw = catalog_entry(name)
    fabric = FabricSpec(instances_per_leaf=per_leaf, spines=spines)
    topo = build_topology(hw, instances, fabric)
    cpi = hw.chips_per_instance
    chips = instances * cpi
    leaves = math.ceil(instances / per_leaf)
    expected = {"efa": chips}
    link = hw.instance.interconnect
    if link.topology == "torus2d":
        expected["torus"] = instances * len(torus_edges(tuple(link.shape)))
    else:
        expected["switch"] = chips
    if hw.ultraserver is not None and hw.ultraserver.interconnect.topology == "ring":
        expected["zring"] = instances // hw.instances_per_ultraserver * cpi * len(
            ring_edges(hw.instances_per_ultraserver))
    if leaves > 1:
        expected["uplink"] = leaves * spines
    assert topo.edge_counts == expected
    assert topo.graph.number_of_edges() == sum(expected.values())
    switches = 0
    if link.topology == "switch":
        switches = instances // hw.instances_per_ultraserver if hw.switch_spans_ultraserver \
            else instances
    spine_nodes = spines if leaves > 1 else 0
    assert topo.graph.number_of_nodes() == chips + switches + leaves + spine_nodes
    kinds = nx.get_node_attributes(topo.graph, "kind")
    assert sum(1 for k in kinds.values() if k == "chip") == chips
    assert sum(1 for k in kinds.values() if k == "leaf") == leaves


@pytest.mark.parametrize(
    "name, chip_degree", [("trn2", 5), ("trn2u", 7), ("trn1", 5), ("p5", 2), ("trn3-gen2", 2)]
)
def test_chip_degrees(name, chip_degree):
    hw = catalog_entry(name)
    topo = build_topology(hw, 2 * hw.instances_per_ultraserver)
    degrees = {topo.graph.degree(c) for c in range(topo.chips)}
    assert degrees == {chip_degree}


@pytest.mark.parametrize("name", ["trn1", "trn1n", "trn2", "trn2u", "trn3-gen1", "trn3-gen2",
                                  "p4d", "p4de", "p5", "p5e", "p5en"])
def test_bandwidth_sums_equal_catalog_figures(name):
    hw = catalog_entry(name)
    topo = build_topology(hw, 2 * hw.instances_per_ultraserver)
    link = hw.instance.interconnect
    for chip in (0, topo.chips - 1):
        quoted = topo.chip_bandwidth_bytes_per_s(chip)
        in_instance = quoted.get("torus", quoted.get("switch"))
        assert in_instance == pytest.approx(link.bandwidth_bytes_per_s)
        if hw.ultraserver is not None and hw.ultraserver.interconnect.topology == "ring":
            assert quoted["zring"] == pytest.approx(hw.ultraserver.interconnect.bandwidth_bytes_per_s)
        assert quoted["efa"] == pytest.approx(hw.efa_per_chip_bytes_per_s)
    # EFA of one instance adds up to the instance's figure.
    instance_efa = sum(
        topo.graph.edges[c, topo.leaf_node(0)]["bandwidth_bytes_per_s"]
        for c in range(hw.chips_per_instance)
    )
    assert instance_efa == pytest.approx(hw.instance.efa_bytes_per_s)


def test_trn2_link_bandwidths_follow_the_documented_split():
    topo = build_topology(catalog_entry("trn2u"), 4)
    assert topo.link_bandwidth["torus"] == pytest.approx(1024e9 / 4 / 2)
    assert topo.link_bandwidth["zring"] == pytest.approx(256e9 / 2 / 2)
    assert topo.link_bandwidth["efa"] == pytest.approx(200e9 / 8)


def test_uplinks_carry_leaf_bandwidth_over_oversubscription():
    hw = catalog_entry("trn2")
    fabric = FabricSpec(instances_per_leaf=4, spines=4, oversubscription=2.0)
    topo = build_topology(hw, 16, fabric)
    leaf = topo.leaf_node(0)
    uplink_total = sum(
        d["bandwidth_bytes_per_s"] for _, _, d in topo.graph.edges(leaf, data=True)
        if d["kind"] == "uplink"
    )
    assert uplink_total == pytest.approx(4 * hw.instance.efa_bytes_per_s / 2.0)


def _max_flow_between_halves(topo) -> float:
    """Max flow from the first half of the instances to the second, on directed capacities."""
    flow = nx.DiGraph()
    for u, v, data in topo.graph.edges(data=True):
        flow.add_edge(u, v, capacity=data["bandwidth_bytes_per_s"])
        flow.add_edge(v, u, capacity=data["bandwidth_bytes_per_s"])
    half = topo.instances // 2
    for chip in range(topo.chips):
        if topo.chip_instance[chip] < half:
            flow.add_edge("source", chip)  # no capacity attribute: unbounded
        else:
            flow.add_edge(chip, "sink")
    value, _ = nx.maximum_flow(flow, "source", "sink")
    return value


@pytest.mark.parametrize("oversubscription, per_leaf", [(1.0, 2), (2.0, 2), (3.0, 4), (1.0, 16)])
def test_bisection_formula_matches_max_flow(oversubscription, per_leaf):
    fabric = FabricSpec(instances_per_leaf=per_leaf, spines=2, oversubscription=oversubscription)
    topo = build_topology(catalog_entry("trn2"), 8, fabric)
    assert _max_flow_between_halves(topo) == pytest.approx(topo.bisection_bytes_per_s())


def test_routes_inside_an_ultraserver_are_shortest_neuronlink_paths():
    topo = build_topology(catalog_entry("trn2u"), 4)
    links = subgraph_of(topo, {"torus", "zring"}, list(range(64)))
    lengths = dict(nx.all_pairs_shortest_path_length(links))
    for a in range(0, 64, 5):
        for b in range(64):
            route = topo.route(a, b)
            assert route[0] == a and route[-1] == b
            assert len(route) - 1 == lengths[a][b]
            for u, v in zip(route, route[1:], strict=False):
                assert topo.graph.has_edge(u, v)


def test_routes_between_ultraservers_use_the_fabric():
    fabric = FabricSpec(instances_per_leaf=4, spines=4)
    topo = build_topology(catalog_entry("trn2u"), 12, fabric)
    across_leaves = topo.route(0, 64 + 7)  # UltraServer 0 is under leaf 0, UltraServer 1 leaf 1
    assert [topo.graph.nodes[n]["kind"] for n in across_leaves] == ["chip", "leaf", "spine", "leaf",
                                                                    "chip"]
    path = topo.path(0, 64 + 7)
    assert path.kinds == ("efa", "uplink", "uplink", "efa")
    assert path.latency_s == pytest.approx(15e-6)
    assert path.bottleneck_bytes_per_s == pytest.approx(25e9)
    one_leaf = build_topology(catalog_entry("trn2u"), 8, FabricSpec(instances_per_leaf=8))
    assert one_leaf.path(0, 64 + 7).kinds == ("efa", "efa")


def test_switch_routes():
    p5 = build_topology(catalog_entry("p5"), 2)
    assert p5.path(0, 7).kinds == ("switch", "switch")
    assert p5.path(0, 8).kinds == ("efa", "efa")
    trn3 = build_topology(catalog_entry("trn3-gen2"), 36)
    assert trn3.path(0, 143).kinds == ("switch", "switch")
    assert trn3.path(0, 143).bottleneck_bytes_per_s == pytest.approx(2.56e12 / 2)


@settings(max_examples=60, deadline=None)
@given(a=st.integers(0, 12 * 16 - 1), b=st.integers(0, 12 * 16 - 1))
def test_path_summary_agrees_with_its_route(a, b):
    topo = _small_trn2u()
    route = topo.route(a, b)
    edges = [topo.graph.edges[u, v] for u, v in zip(route, route[1:], strict=False)]
    summary = topo.path(a, b)
    assert summary.hops == len(edges)
    assert summary.latency_s == pytest.approx(sum(e["latency_s"] for e in edges))
    expected = min((e["bandwidth_bytes_per_s"] for e in edges), default=math.inf)
    assert summary.bottleneck_bytes_per_s == pytest.approx(expected)


_SMALL = {}


def _small_trn2u():
    if "trn2u" not in _SMALL:
        _SMALL["trn2u"] = build_topology(catalog_entry("trn2u"), 12, FabricSpec(
            instances_per_leaf=4, spines=2))
    return _SMALL["trn2u"]


def test_ring_over_one_instance_uses_torus_links_once():
    topo = build_topology(catalog_entry("trn2"), 2)
    ring = topo.ring(range(16))
    assert sorted(ring.order) == list(range(16))
    assert ring.link_kinds == ("torus",)
    assert ring.max_link_load == 1
    assert ring.bottleneck_bytes_per_s == pytest.approx(128e9)
    for a, b in zip(ring.order, ring.order[1:] + ring.order[:1], strict=True):
        assert topo.graph.has_edge(a, b)  # a Hamiltonian cycle of the torus


def test_ring_over_an_ultraserver_and_beyond():
    topo = _small_trn2u()
    us_ring = topo.ring(range(64))
    assert us_ring.link_kinds == ("torus", "zring")
    assert us_ring.bottleneck_bytes_per_s == pytest.approx(64e9)
    assert us_ring.max_link_load == 1
    wide = topo.ring(range(192))
    assert "efa" in wide.link_kinds
    assert wide.bottleneck_bytes_per_s == pytest.approx(25e9)


def test_ring_of_scattered_chips_shares_links():
    topo = build_topology(catalog_entry("trn2"), 1)
    ring = topo.ring([0, 2, 8, 10])  # every hop crosses two torus links
    assert ring.max_link_load >= 1
    assert ring.bottleneck_bytes_per_s <= 128e9


def test_ring_results_are_cached_by_shape():
    topo = _small_trn2u()
    topo._ring_cache.clear()
    first = topo.ring(np.arange(0, 16))
    second = topo.ring(np.arange(64, 80))  # the same shape, another UltraServer
    assert len(topo._ring_cache) == 1
    assert first.bottleneck_bytes_per_s == second.bottleneck_bytes_per_s
    assert set(second.order) == set(range(64, 80))
    topo.ring([0, 1, 2])  # a different shape
    assert len(topo._ring_cache) == 2


def test_neighbours_of_a_trn2u_chip():
    topo = build_topology(catalog_entry("trn2u"), 4)
    kinds = sorted(kind for _, kind, _ in topo.neighbours(0))
    assert kinds == ["efa", "torus", "torus", "torus", "torus", "zring", "zring"]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="UltraServers of 4"):
        build_topology(catalog_entry("trn2u"), 6)
    with pytest.raises(ValueError, match="at least one instance"):
        build_topology(catalog_entry("trn2"), 0)


def test_custom_ring_instance():
    mapping = resolve_hardware_mapping({
        "base": "trn2",
        "instance": {"chips": 8, "interconnect": {"topology": "ring", "shape": None,
                                                  "bandwidth": "400GB/s"}},
    })
    hw = HardwareSpec.model_validate(mapping)
    topo = build_topology(hw, 1)
    assert topo.edge_counts["ring"] == 8
    assert topo.chip_bandwidth_bytes_per_s(0)["ring"] == pytest.approx(400e9)
    assert topo.path(0, 4).hops == 4
