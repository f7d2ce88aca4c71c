"""Collectives against closed forms on uniform topologies, algorithm choice, invariants,
contention and the calibration against published nccom-test measurements."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.calibration.collectives import LARGE_MESSAGE_BYTES, MEASUREMENTS, predict_times
from clustersim.collectives import (
    OPS,
    CollectiveError,
    CollectiveModel,
    Group,
    bus_factor,
    normalise_op,
    place_ranks,
    simultaneous,
)
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import HardwareSpec, catalog_entry, neighbours_per_dimension
from clustersim.hardware.topology import FabricSpec

LINK = 100e9  # bytes/s per link per direction on the uniform test hardware
HOP = 2e-6
STEP = 10e-6
EFA_STEP = 40e-6
FABRIC_LATENCY = 15e-6


def uniform_hardware(topology: str = "ring", chips: int = 8, ranks: int = 1,
                     shape: list[int] | None = None, efa: str = "800Gbps") -> HardwareSpec:
    """Hardware whose links are all LINK bytes/s each way, HBM never limiting, efficiency 1."""
    links = {"ring": max(1, neighbours_per_dimension(chips)), "switch": 1, "torus2d": 4}[topology]
    interconnect = {"topology": topology, "bandwidth": LINK * links, "duplex_counted": False,
                    "latency": HOP}
    if shape is not None:
        interconnect["shape"] = shape
    return HardwareSpec.model_validate({
        "name": "uniform",
        "chip": {"name": "u", "tflops": {"bf16": 100}, "hbm": "96GiB", "hbm_bandwidth": 1e20,
                 "ranks": ranks},
        "instance": {"chips": chips, "interconnect": interconnect, "efa": efa},
        "collectives": {"link_efficiency": 1, "efa_efficiency": 1, "hbm_efficiency": 1,
                        "step_latency": STEP, "efa_step_latency": EFA_STEP},
    })


def model_for(hardware: HardwareSpec, instances: int = 1, fabric: FabricSpec | None = None):
    fabric = fabric or FabricSpec(latency=FABRIC_LATENCY)
    return CollectiveModel(build_topology(hardware, instances, fabric))


SIZES = [1e3, 1e6, 64e6, 1e9]


@pytest.mark.parametrize("p", [2, 3, 8, 16])
@pytest.mark.parametrize("size", SIZES)
def test_ring_all_reduce_closed_form(p, size):
    model = model_for(uniform_hardware("ring", chips=p))
    cost = model.cost("all-reduce", Group(np.arange(p), 1), size, algorithm="ring")
    expected = 2 * (p - 1) / p * size / LINK + 2 * (p - 1) * (STEP + HOP)
    assert cost.time_s == pytest.approx(expected, rel=1e-9)
    assert cost.steps == 2 * (p - 1)


@pytest.mark.parametrize("op", ["all-gather", "reduce-scatter"])
@pytest.mark.parametrize("size", SIZES)
def test_ring_all_gather_and_reduce_scatter_closed_form(op, size):
    p = 8
    model = model_for(uniform_hardware("ring", chips=p))
    cost = model.cost(op, Group(np.arange(p), 1), size, algorithm="ring")
    expected = (p - 1) / p * size / LINK + (p - 1) * (STEP + HOP)
    assert cost.time_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("size", SIZES)
def test_bidirectional_ring_halves_the_transfer(size):
    p = 8
    model = model_for(uniform_hardware("ring", chips=p))
    group = Group(np.arange(p), 1)
    cost = model.cost("all-reduce", group, size, algorithm="biring")
    expected = 2 * (p - 1) / p * size / (2 * LINK) + 2 * (p - 1) * (STEP + HOP)
    assert cost.time_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("size", SIZES)
def test_rdh_on_the_4x4_torus_closed_form(size):
    """The 4x4 torus is a 4D hypercube: every partner is one hop away, one flow per link."""
    model = model_for(uniform_hardware("torus2d", chips=16, shape=[4, 4]))
    cost = model.cost("all-reduce", Group(np.arange(16), 1), size, algorithm="rdh")
    expected = 2 * 4 * (STEP + HOP) + 2 * (1 - 1 / 16) * size / LINK
    assert cost.time_s == pytest.approx(expected, rel=1e-9)
    assert cost.steps == 8


@pytest.mark.parametrize("size", SIZES)
def test_rdh_over_ranks_pairs_a_chips_ranks_first(size):
    """Two ranks per chip: the first halving step (and last doubling step) pairs the ranks
    of a chip through HBM (on-chip step latency, no link), the other four pair torus
    neighbours; every rank sends buffer / 2^(j+1) at step j, the chip's two ranks over the
    same link, so a link carries 15/16 of the buffer per phase as with one rank per chip."""
    chip_step = 3e-6
    hardware = uniform_hardware("torus2d", chips=16, shape=[4, 4], ranks=2)
    constants = hardware.collectives.model_copy(update={"chip_step_latency_s": chip_step})
    model = model_for(hardware.model_copy(update={"collectives": constants}))
    cost = model.cost("all-reduce", Group(np.arange(16), 2), size, algorithm="rdh")
    expected = 2 * chip_step + 2 * 4 * (STEP + HOP) + 2 * (1 - 1 / 16) * size / LINK
    assert cost.time_s == pytest.approx(expected, rel=1e-8)
    assert cost.steps == 10
    gather = model.cost("all-gather", Group(np.arange(16), 2), size, algorithm="rdh")
    assert gather.time_s == pytest.approx(expected / 2, rel=1e-8)


def test_rdh_partners_are_neighbours_on_a_half_torus():
    """Eight chips of a 4x4 torus (two rows) are a 3D hypercube of neighbours: no RDH step
    routes through a third chip."""
    model = model_for(uniform_hardware("torus2d", chips=16, shape=[4, 4]))
    cost = model.cost("all-reduce", Group(np.arange(8), 1), 1e9, algorithm="rdh")
    expected = 2 * 3 * (STEP + HOP) + 2 * (1 - 1 / 8) * 1e9 / LINK
    assert cost.time_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("size", SIZES)
def test_kangaring_uses_two_hamiltonian_cycles_both_ways(size):
    """Two ranks per chip; primaries on the 2 edge-disjoint Hamiltonian cycles of the 4x4
    torus, each run in both directions: 4 directed rings share the data."""
    model = model_for(uniform_hardware("torus2d", chips=16, shape=[4, 4], ranks=2))
    cost = model.cost("all-reduce", Group(np.arange(16), 2), size, algorithm="kangaring")
    p = 16
    expected = 2 * (p - 1) * (STEP + HOP) + 2 * (p - 1) / p * size / (4 * LINK)
    assert cost.time_s == pytest.approx(expected, rel=1e-9)
    cycles = model.levels.cycles.hamiltonian(list(range(16)))
    assert len(cycles) == 2
    edges = [{frozenset(e) for e in zip(c, c[1:] + c[:1], strict=True)} for c in cycles]
    assert not edges[0] & edges[1]
    assert all(len(c) == 16 for c in cycles)


@pytest.mark.parametrize("size", SIZES)
def test_mesh_through_a_switch_closed_form(size):
    p = 8
    model = model_for(uniform_hardware("switch", chips=p))
    group = Group(np.arange(p), 1)
    mesh = model.cost("all-reduce", group, size, algorithm="mesh")
    # reduce-scatter writes, a local reduction step, all-gather writes; 2 hops through the switch
    expected = 3 * STEP + 2 * (2 * HOP) + 2 * (p - 1) / p * size / LINK
    assert mesh.time_s == pytest.approx(expected, rel=1e-9)
    single = model.cost("all-reduce", group, size, algorithm="mesh1")
    assert single.time_s == pytest.approx(STEP + 2 * HOP + (p - 1) * size / LINK, rel=1e-9)


def test_mesh_oversubscribes_a_torus():
    """Routed mesh traffic shares torus links: slower per byte than the direct switch."""
    size = 256e6
    torus = model_for(uniform_hardware("torus2d", chips=16, shape=[4, 4]))
    mesh = torus.cost("all-reduce", Group(np.arange(16), 1), size, algorithm="mesh")
    ideal = 2 * (15 / 16) * size / (4 * LINK)  # if every link of the chip carried its share
    assert mesh.transfer_s > 1.5 * ideal


def test_fabric_ring_closed_form_and_oversubscription():
    hw = uniform_hardware("ring", chips=1, efa="400Gbps")  # 50 GB/s per instance
    x, size = 4, 64e6
    flat = model_for(hw, x, FabricSpec(latency=FABRIC_LATENCY, instances_per_leaf=16))
    group = Group(np.arange(x), 1)
    cost = flat.cost("all-reduce", group, size, inter="ring")
    expected = 2 * (x - 1) * (EFA_STEP + FABRIC_LATENCY) + 2 * (x - 1) / x * size / 50e9
    assert cost.time_s == pytest.approx(expected, rel=1e-9)
    thin = model_for(hw, x, FabricSpec(latency=FABRIC_LATENCY, instances_per_leaf=1,
                                       oversubscription=4.0, spines=2))
    slow = thin.cost("all-reduce", group, size, inter="ring")
    assert slow.transfer_s == pytest.approx(4 * cost.transfer_s, rel=1e-9)


def test_hierarchical_all_reduce_levels_and_buffers():
    topo = build_topology(catalog_entry("trn2u"), 8)
    model = CollectiveModel(topo)
    group = Group(np.arange(topo.chips), 4)  # 2 UltraServers x 4 instances x 16 chips x 4
    size = 1e9
    cost = model.cost("all-reduce", group, size)
    levels = [(s.level, s.op) for s in cost.stages]
    assert levels == [("instance", "reduce-scatter"), ("ultraserver", "reduce-scatter"),
                      ("fabric", "all-reduce"), ("ultraserver", "all-gather"),
                      ("instance", "all-gather")]
    buffers = [s.bytes_per_rank for s in cost.stages]
    assert buffers == pytest.approx([size, size / 64, size / 256, size / 64, size])
    assert cost.ranks == 512
    assert cost.algorithm.startswith("hierarchical(")


def test_all_gather_runs_the_fabric_first_and_reduce_scatter_last():
    topo = build_topology(catalog_entry("trn2"), 4)
    model = CollectiveModel(topo)
    group = Group(np.arange(topo.chips), 4)
    gather = model.cost("all-gather", group, 256e6)
    assert [s.level for s in gather.stages] == ["fabric", "instance"]
    assert [s.bytes_per_rank for s in gather.stages] == pytest.approx([256e6 / 64, 256e6])
    scatter = model.cost("reduce-scatter", group, 256e6)
    assert [s.level for s in scatter.stages] == ["instance", "fabric"]


# With Trn2's fitted constants (a 2.3 us step: docs/calibration.md, "Trn2: its own fit")
# KangaRing's 62 steps cost less than RDH's from a few MB on a whole instance and from 2 MB
# on the 16-rank example, inside RDH's band: the model's `auto` disagrees with the runtime
# there. Kept as strict expected failures until the collective costs meet both.
_TRN2_RDH_BAND = pytest.mark.xfail(strict=True, reason="Trn2-fitted step latency: the model "
                                   "finds KangaRing cheaper inside RDH's band")


@pytest.mark.parametrize(
    "size, expected",
    [(64e3, ("mesh", "mesh1")), (2e6, ("rdh",)),
     pytest.param(8e6, ("rdh",), marks=_TRN2_RDH_BAND),
     pytest.param(40e6, ("rdh",), marks=_TRN2_RDH_BAND), (512e6, ("kangaring",))],
)
def test_auto_picks_by_size_as_neuron(size, expected):
    topo = build_topology(catalog_entry("trn2"), 1)
    model = CollectiveModel(topo)
    cost = model.cost("all-reduce", place_ranks(topo, 64), size)
    assert cost.algorithm in expected


def test_auto_uses_a_ring_when_kangaring_does_not_apply():
    topo = build_topology(catalog_entry("trn2"), 1)
    model = CollectiveModel(topo)
    one_rank_per_chip = Group(np.arange(16), 1)
    assert model.cost("all-reduce", one_rank_per_chip, 512e6).algorithm == "biring"
    with pytest.raises(CollectiveError, match="kangaring does not apply"):
        model.cost("all-reduce", one_rank_per_chip, 512e6, algorithm="kangaring")
    with pytest.raises(CollectiveError, match="rdh does not apply"):
        model.cost("all-reduce", Group(np.arange(12), 4), 8e6, algorithm="rdh")


ALGORITHM_CASES = [("trn2", 64, 1, a) for a in ("ring", "biring", "mesh", "mesh1", "rdh",
                                                  "kangaring")] + [
    ("trn2u", 512, 8, "hierarchical"), ("p5", 16, 2, "hierarchical"), ("trn1", 64, 2, "ring"),
    ("trn3-gen2", 144, 36, "mesh")]


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(ALGORITHM_CASES),
       sizes=st.lists(st.floats(1, 4e9), min_size=2, max_size=4))
def test_time_is_monotone_in_size(case, sizes):
    name, ranks, instances, algorithm = case
    model = _cached_model(name, instances)
    group = place_ranks(model.topology, ranks, instances)
    times = [model.cost("all-reduce", group, s, algorithm=algorithm).time_s for s in sorted(sizes)]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(times, times[1:], strict=False))


# (hardware, ranks, instances): one instance (whole and half), several instances over EFA,
# a whole Trn2 UltraServer (Z rings) and two of them, a Trn3 UltraServer (one switch).
GROUP_SHAPES = [
    ("trn1", 16, 1), ("trn1", 32, 1), ("trn1", 64, 2), ("trn1", 128, 4),
    ("trn2", 32, 1), ("trn2", 64, 1), ("trn2", 128, 2),
    ("trn2u", 256, 4), ("trn2u", 512, 8), ("trn2u", 128, 2),
    ("trn3-gen1", 4, 1), ("trn3-gen1", 64, 16), ("trn3-gen2", 144, 36),
    ("p5", 8, 1), ("p5", 16, 2), ("p5", 64, 8),
]


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from(GROUP_SHAPES),
       op=st.sampled_from([op for op in OPS if op != "send-recv"]),
       sizes=st.lists(st.integers(8, 4 * 2**30), min_size=2, max_size=5))
def test_auto_time_is_non_decreasing_in_size(shape, op, sizes):
    """For every operation and group shape, the automatic choice's time never
    falls as the message grows (scripts/collective_monotonicity.py runs every catalog
    entry on a dense grid of sizes)."""
    name, ranks, instances = shape
    model = _cached_model(name, instances)
    group = place_ranks(model.topology, ranks, instances)
    times = [model.cost(op, group, s).time_s for s in sorted(sizes)]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(times, times[1:], strict=False)), (
        sorted(sizes), times)


@pytest.mark.parametrize("size, expected", [
    (131072, ("mesh", "mesh1")), pytest.param(2e6, ("rdh",), marks=_TRN2_RDH_BAND),
    (32e6, ("kangaring",)), (512e6, ("kangaring",)), (64e3, ("mesh", "mesh1"))])
def test_auto_agrees_with_the_published_nccom_test_examples(size, expected):
    """The Neuron docs' 16-rank nccom-test example (Trn2: KangaRing exists only there; 4
    chips at LNC 2) ran mesh at 128 KiB, RDH at 2 MB and KangaRing at 32 MB and 512 MB."""
    model = _cached_model("trn2", 1)
    assert model.cost("all-reduce", place_ranks(model.topology, 16, 1), size).algorithm in (
        expected)


def test_auto_never_runs_an_algorithm_past_its_neuron_band():
    """Mesh stops at 1 MB and RDH at 56 MB even where the model finds them cheaper."""
    model = _cached_model("trn1", 1)
    group = place_ranks(model.topology, 32, 1)
    for size in (1e6, 4e6, 30e6, 56e6, 200e6):
        algorithm = model.cost("all-reduce", group, size).algorithm
        assert algorithm not in ("mesh", "mesh1")
        assert size < 56e6 or algorithm != "rdh"


_MODELS: dict = {}


def _cached_model(name: str, instances: int) -> CollectiveModel:
    key = (name, instances)
    if key not in _MODELS:
        hw = catalog_entry(name)
        n = math.ceil(instances / hw.instances_per_ultraserver) * hw.instances_per_ultraserver
        _MODELS[key] = CollectiveModel(build_topology(hw, n))
    return _MODELS[key]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["trn1", "trn2", "trn3-gen1", "p5"]),
       chips=st.sampled_from([2, 4, 8, 16]),
       op=st.sampled_from(["all-reduce", "all-gather", "reduce-scatter"]),
       algorithm=st.sampled_from(["auto", "ring", "biring", "mesh", "rdh", "kangaring"]),
       size=st.floats(1e3, 4e9))
def test_bus_bandwidth_never_exceeds_the_links(name, chips, op, algorithm, size):
    """Per chip, a collective must move (r-1)/r of the buffer out per pass: busbw cannot beat
    the chip's outgoing link bandwidth (times efficiency), however the algorithm routes."""
    model = _cached_model(name, 1)
    hw = model.hardware
    chips = min(chips, hw.chips_per_instance)
    k = hw.chip.ranks
    group = Group(np.arange(chips), k)
    try:
        cost = model.cost(op, group, size, algorithm=algorithm)
    except CollectiveError:
        return  # the algorithm does not apply to this group
    egress = sum(bw for _, kind, bw in model.topology.neighbours(0) if kind != "efa")
    limit = egress * hw.collectives.link_efficiency
    ranks = chips * k
    # bus factors count ranks; links only carry what crosses chips
    allowance = ((ranks - 1) / ranks) / ((chips - 1) / chips)
    assert cost.busbw_bytes_per_s <= limit * allowance * (1 + 1e-9)


def test_two_identical_collectives_on_shared_links_get_half_the_bandwidth():
    topo = build_topology(catalog_entry("trn2"), 2)
    model = CollectiveModel(topo)
    group = Group(np.arange(16), 4)
    alone = model.cost("all-reduce", group, 1e9, algorithm="ring")
    together = simultaneous(model, [alone, alone])
    for cost in together:
        assert cost.transfer_s == pytest.approx(2 * alone.transfer_s)
        assert cost.latency_s == pytest.approx(alone.latency_s)
    other = model.cost("all-reduce", Group(np.arange(16, 32), 4), 1e9, algorithm="ring")
    apart = simultaneous(model, [alone, other])
    assert apart[0].transfer_s == pytest.approx(alone.transfer_s)
    assert apart[1].transfer_s == pytest.approx(other.transfer_s)


def test_contention_through_switches_stays_per_instance():
    topo = build_topology(catalog_entry("p5"), 2)
    model = CollectiveModel(topo)
    first = model.cost("all-reduce", Group(np.arange(8), 1), 1e9, algorithm="ring")
    second = model.cost("all-reduce", Group(np.arange(8, 16), 1), 1e9, algorithm="ring")
    apart = simultaneous(model, [first, second])
    assert apart[1].transfer_s == pytest.approx(second.transfer_s)
    both = simultaneous(model, [first, first])
    assert both[0].transfer_s == pytest.approx(2 * first.transfer_s)


def test_contention_on_a_shared_fabric():
    topo = build_topology(catalog_entry("trn2"), 4)
    model = CollectiveModel(topo)
    group = Group(np.arange(topo.chips), 4)
    alone = model.cost("all-reduce", group, 1e9)
    together = simultaneous(model, [alone, alone])
    assert together[0].transfer_s == pytest.approx(2 * alone.transfer_s, rel=1e-6)


@pytest.mark.parametrize("hardware", ["trn2", "trn2u"])
def test_groups_on_the_same_instances_share_alike_on_each(hardware, monkeypatch):
    """Data-parallel groups of different chips of the same instances (several chips of each
    per instance): solving their shares on the first instance only gives the speeds solving
    them on every link of every instance gives, to the bit."""
    from clustersim.collectives import contention

    hw = catalog_entry(hardware)
    topo = build_topology(hw, 8)
    model = CollectiveModel(topo)
    cpi = hw.chips_per_instance
    # Four groups of four chips of each of the 8 instances, on diagonals of the 4 x 4 torus
    # (their rings cross the same links).
    groups = [Group(np.array(sorted(i * cpi + c for i in range(8)
                                    for c in (t, (t + 5) % 16, (t + 10) % 16, (t + 15) % 16))), 2)
              for t in range(4)]
    for op in ("all-reduce", "reduce-scatter", "all-gather"):
        costs = [model.cost(op, g, 3e8) for g in groups]
        fast = [c.transfer_s for c in simultaneous(model, costs)]
        assert contention._common_instance(model, costs) == 0
        monkeypatch.setattr(contention, "_common_instance", lambda model, costs: None)
        full = [c.transfer_s for c in simultaneous(model, costs)]
        monkeypatch.undo()
        assert fast == full
        assert fast[0] > costs[0].transfer_s  # they do share


def test_send_recv_costs_the_path():
    topo = build_topology(catalog_entry("trn2"), 2)
    model = CollectiveModel(topo)
    c = catalog_entry("trn2").collectives
    near = model.cost("send-recv", Group(np.array([0]), 1), 64e6, peer=1)
    link = topo.path(0, 1)
    expected = c.step_latency_s + link.latency_s + 64e6 / (
        link.bottleneck_bytes_per_s * c.link_efficiency)
    assert near.time_s == pytest.approx(expected)
    far = model.cost("send-recv", Group(np.array([0]), 1), 64e6, peer=20)
    assert far.time_s > near.time_s


def test_results_are_cached_by_shape():
    topo = build_topology(catalog_entry("trn2u"), 8)
    model = CollectiveModel(topo)
    first = model.cost("all-reduce", Group(np.arange(64), 4), 1e8)
    entries = len(model._cache)
    second = model.cost("all-reduce", Group(np.arange(64, 128), 4), 1e8)
    assert len(model._cache) == entries
    assert second.time_s == first.time_s


def test_groups_must_be_symmetric():
    topo = build_topology(catalog_entry("trn2"), 2)
    model = CollectiveModel(topo)
    with pytest.raises(CollectiveError, match="asymmetric"):
        model.cost("all-reduce", Group(np.array([0, 1, 2, 16]), 4), 1e6)
    with pytest.raises(CollectiveError, match="same number"):
        Group.from_rank_chips([0, 0, 1])
    with pytest.raises(CollectiveError, match="unknown collective"):
        model.cost("all-sum", Group(np.arange(4), 4), 1e6)


def test_place_ranks_as_nccom_test():
    trn1 = build_topology(catalog_entry("trn1"), 2)
    two = place_ranks(trn1, 2)
    assert (len(two.chips), two.ranks_per_chip) == (1, 2)
    sixty_four = place_ranks(trn1, 64, 2)
    assert sixty_four.chips.tolist() == list(range(32))
    with pytest.raises(CollectiveError):
        place_ranks(trn1, 65, 2)


def test_bus_factors():
    assert bus_factor("allr", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all-gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("broadcast", 4) == 1.0
    assert normalise_op("redsct") == "reduce-scatter"


@pytest.mark.parametrize("op", ["all-to-all", "broadcast", "all-gather", "reduce-scatter"])
def test_every_op_runs_on_every_level(op):
    topo = build_topology(catalog_entry("trn2u"), 8)
    model = CollectiveModel(topo)
    cost = model.cost(op, Group(np.arange(topo.chips), 4), 64e6)
    assert cost.time_s > 0
    assert {s.level for s in cost.stages} == {"instance", "ultraserver", "fabric"}


def test_published_curves_within_25_percent_from_1_mib():
    """The nccom-test page's 2-rank and 64-rank curves (and its 2-rank and 64-rank
    rows) within 25% in time from 1 MiB up; scripts/calibrate_collectives.py prints every
    point, the README lists them."""
    predicted = predict_times()
    checked = 0
    for measurement, time_s in zip(MEASUREMENTS, predicted, strict=True):
        if measurement.size_bytes < 2**20:
            continue
        error = time_s / (measurement.time_us * 1e-6) - 1
        assert abs(error) < 0.25, (measurement, error)
        checked += 1
    assert checked == 15


def test_every_published_row_within_a_factor_of_two():
    """The four Trn1 nccom-test rows (2 ranks, and 64 ranks on two instances) within a factor
    of two, the large ones within 35% in bus bandwidth. The 16-rank example is Trn2's
    (tests/test_calibration_trn2.py)."""
    predicted = predict_times()
    rows = [(m, t) for m, t in zip(MEASUREMENTS, predicted, strict=True)
            if m.busbw_gib_s is not None or m.size_bytes == 8]
    assert len(rows) == 4
    assert all(m.ranks in (2, 64) for m, _ in rows)
    for measurement, time_s in rows:
        assert 0.5 < time_s / (measurement.time_us * 1e-6) < 2, measurement
    large = [(m, t) for m, t in rows if m.size_bytes >= LARGE_MESSAGE_BYTES]
    assert len(large) == 2
    assert all(abs(m.time_us * 1e-6 / t - 1) < 0.35 for m, t in large)


def test_half_million_chip_all_reduce_is_evaluated_on_representatives():
    """The structure of the 524,288-chip case on a smaller cluster of the same shape."""
    topo = build_topology(catalog_entry("trn2u"), 64)
    model = CollectiveModel(topo)
    group = Group(np.arange(topo.chips), 4)
    cost = model.cost("all-reduce", group, 1e9)
    fabric = [s for s in cost.stages if s.level == "fabric"][0]
    assert fabric.members == 16
    assert cost.ranks == 4096
