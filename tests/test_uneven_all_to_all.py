"""All-to-all over expert groups that straddle NeuronLink domains unevenly
(`collectives.uneven`): the closed form (each domain's part over its NeuronSwitch, the rest
over EFA, the slowest member bounding it), the even group's cost where the parts are equal,
a property (more of a member's group across EFA is never faster), and the step model
costing the slowest of a job's expert groups (Trn3 Gen2 layouts whose groups straddle two
UltraServers)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.collectives.groups import AsymmetricGroupError, Group
from clustersim.collectives.model import CollectiveModel
from clustersim.collectives.ops import COPY_ACCESSES
from clustersim.collectives.uneven import domain_parts, uneven_all_to_all
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.scenario.loader import scenario_from_dict
from clustersim.training.ranks import (
    DEFAULT_ORDER,
    expert_group_ranks,
    expert_groups_by_split,
    rank_group,
)
from clustersim.training.step import StepModel

TRN3 = catalog_entry("trn3-gen2")
TRN2 = catalog_entry("trn2")
US = TRN3.chips_per_instance * TRN3.instances_per_ultraserver  # 144 chips a switch domain


@pytest.fixture(scope="module")
def trn3() -> CollectiveModel:
    return CollectiveModel(build_topology(TRN3, 5 * TRN3.instances_per_ultraserver))


def switch_part_s(model: CollectiveModel, chips: int, buffer: float) -> tuple[float, float]:
    """(latency, transfer) of a mesh all-to-all of one rank per chip on `chips` chips of a
    NeuronSwitch: each chip's port to the switch carries chips - 1 pieces of buffer / chips;
    HBM moves COPY_ACCESSES x buffer; one step, chip -> switch -> chip. A lone rank's
    piece stays where it is: nothing."""
    if chips == 1:
        return 0.0, 0.0
    hw, c, topo = model.hardware, model.hardware.collectives, model.topology
    route = topo.route(0, 1)
    port = topo.edge(route[0], route[1])
    link_s = (chips - 1) * buffer / chips / (port["bandwidth_bytes_per_s"] * c.link_efficiency)
    hbm_s = COPY_ACCESSES * buffer / (hw.chip.hbm_bandwidth_bytes_per_s * c.hbm_efficiency)
    return c.step_latency_s + topo.path(0, 1).latency_s, max(link_s, hbm_s)


def closed_form_s(model: CollectiveModel, split: list[int], size: float) -> float:
    """The slowest member of a group of one rank per chip with split[j] members in
    UltraServer j: its part over the switch (S r / n) and S (n - r) / n over its chip's
    EFA, at once; both latencies."""
    hw, c = model.hardware, model.hardware.collectives
    n = sum(split)
    efa_latency = c.efa_step_latency_s + model.topology.fabric.latency_s
    times = []
    for r in split:
        latency, transfer = switch_part_s(model, r, size * r / n)
        efa_s = size * (n - r) / n / (hw.efa_per_chip_bytes_per_s * c.efa_efficiency)
        times.append(latency + efa_latency + max(transfer, efa_s))
    return max(times)


def straddling(split: list[int], offset: int = 0, stride: int = 6) -> Group:
    """A group with split[j] chips in UltraServer j, `stride` chips apart, starting
    `offset` chips into each (different local chips in each: no even layout)."""
    chips = [j * US + offset * (j + 1) + stride * i for j, r in enumerate(split)
             for i in range(r)]
    return Group(np.array(chips), 1)


@pytest.mark.parametrize("split", [[8, 8], [3, 13], [13, 3], [1, 15], [5, 6, 5]])
@pytest.mark.parametrize("size", [64e3, 8e6, 235e6])
def test_against_the_closed_form(trn3, split, size) -> None:
    group = straddling(split, offset=1)
    cost = trn3.cost("all-to-all", group, size)
    assert cost.algorithm.startswith("uneven")
    assert cost.time_s == pytest.approx(closed_form_s(trn3, split, size), rel=1e-12)
    fabric = [s for s in cost.stages if s.level == "fabric"]
    assert len(fabric) == 1  # the slowest member's
    crossing = [size * (1 - r / sum(split)) for r in split]
    assert any(fabric[0].bytes_per_rank == pytest.approx(x) for x in crossing)
    if size > 100e6:  # bandwidth-bound: the smallest part's, the most across EFA
        assert fabric[0].bytes_per_rank == pytest.approx(max(crossing))


def test_the_plans_straddling_expert_group_is_refused_no_more(trn3) -> None:
    """Trn3's DeepSeek-V3 layout (TP 4, CP 2, PP 3, EP 16 in the default order): groups of
    384 ranks in 576-rank domains, every third one split 8 / 8 over two UltraServers."""
    p = SimpleNamespace(tp=4, cp=2, pp=3, dp=3 * 16, ep=16, order=DEFAULT_ORDER)
    placed = np.arange(3 * TRN3.instances_per_ultraserver)
    groups = expert_groups_by_split(TRN3, p, placed)
    assert np.array_equal(groups[0], expert_group_ranks(p))  # rank 0's first
    assert len(groups) == 2
    split, sharing = rank_group(TRN3, groups[1], placed)
    assert sharing == 4
    assert np.unique(split.chips // US, return_counts=True)[1].tolist() == [8, 8]
    with pytest.raises(AsymmetricGroupError):
        trn3.layout(split)  # no hierarchical tree over it
    size = 58.7e6 * sharing
    inside = trn3.cost("all-to-all", rank_group(TRN3, groups[0], placed)[0], size)
    across = trn3.cost("all-to-all", split, size)
    assert across.time_s == pytest.approx(closed_form_s(trn3, [8, 8], size), rel=1e-12)
    assert across.time_s > 5 * inside.time_s


def test_equal_parts_cost_what_the_even_group_costs(trn3) -> None:
    """The same local chips in each UltraServer: the even hierarchical all-to-all, and the
    uneven formula gives the same."""
    group = straddling([8, 8], offset=0)
    even = trn3.cost("all-to-all", group, 32e6)
    assert not even.algorithm.startswith("uneven")
    assert uneven_all_to_all(trn3, group, 32e6).time_s == pytest.approx(even.time_s,
                                                                        rel=1e-12)


def test_other_collectives_on_an_asymmetric_group_are_refused(trn3) -> None:
    with pytest.raises(AsymmetricGroupError, match="asymmetric"):
        trn3.cost("all-reduce", straddling([3, 5]), 1e6)
    with pytest.raises(AsymmetricGroupError):
        trn3.cost("all-to-all", straddling([3, 5]), 1e6, intra="mesh")


def test_trn2_parts_are_instances() -> None:
    """Without an UltraServer a domain is the instance; each part an ordinary group."""
    model = CollectiveModel(build_topology(TRN2, 4))
    group = Group(np.array([3, 5, 16, 17, 18, 40]), 1)
    assert [p.tolist() for p in domain_parts(model, group)] == [[3, 5], [16, 17, 18], [40]]
    assert model.cost("all-to-all", group, 4e6).time_s > 0


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(2, 16), min_size=1, max_size=3), st.data(),
       st.sampled_from([4e3, 1e6, 32e6, 512e6]))
def test_more_of_the_group_across_efa_is_never_faster(trn3, split, data, size) -> None:
    """Moving some members of one domain's part into another UltraServer: every member's
    peers across EFA are then a superset of what they were, and the all-to-all is never
    faster (the members left behind wait for more EFA pieces; the parts not touched take
    as long as before). Two bounds keep the statement true, both physical: every part
    keeps at least two members (a member alone in its domain has no switch step to take,
    so at latency-bound sizes it can finish sooner), and groups have at most 48 chips (the
    switch carries a part's pieces about 40 times faster than a chip's EFA, so only a part
    more than 40 times the group beyond it could be bound by its switch and gain from
    losing a member)."""
    parts = [j for j, r in enumerate(split) if r >= 4]
    if not parts:
        split = split + [4]
        parts = [len(split) - 1]
    j = data.draw(st.sampled_from(parts))
    moved = data.draw(st.integers(2, split[j] - 2))
    offset = data.draw(st.integers(0, 2))
    before = straddling(split, offset, stride=2)
    kept = split[:j] + [split[j] - moved] + split[j + 1:]
    after = Group(np.concatenate([straddling(kept, offset, stride=2).chips,
                                  4 * US + 2 * np.arange(moved)]), 1)  # a fifth domain
    slower = trn3.cost("all-to-all", after, size).time_s
    assert slower >= trn3.cost("all-to-all", before, size).time_s * (1 - 1e-12)
    inside = trn3.cost("all-to-all", Group(np.arange(sum(split)) * 2, 1), size).time_s
    assert slower > inside


def _trn3_job(order: str = DEFAULT_ORDER):
    scenario = scenario_from_dict({
        "name": "t", "hardware": "trn3-gen2", "cluster": {"ultraservers": 4},
        "jobs": [{"name": "j", "model": "qwen3-30b-a3b", "global_batch": 192, "seq_len": 4096,
                  "parallelism": {"tp": 4, "cp": 2, "pp": 3, "dp": 96, "ep": 16,
                                  "order": order, "zero": 3}}]}, "test")
    return scenario.jobs[0]


def test_the_step_waits_for_the_straddling_expert_group() -> None:
    """The job's expert groups are 384 ranks in 576-rank UltraServers: one in three spans
    two. The step's chunks cost that one (rank 0's is inside a switch), so the exposed
    all-to-all is the straddling group's. The whole step cannot be placed: the 6 ranks
    holding the same experts, 24 instances apart, split unevenly over the UltraServers, and
    their gradient reduction (ZeRO-3: their gathers) needs an even group (it stepped while
    ZeRO-3 gathered the experts over the whole shard group)."""
    hw_topology = build_topology(TRN3, 4 * TRN3.instances_per_ultraserver)
    steps = StepModel(hw_topology)
    job = _trn3_job()
    placed = np.arange(job.parallelism.ranks // TRN3.ranks_per_instance)
    groups = steps._parallel_groups(job, placed)
    group, sharing = groups[1]
    assert len(np.unique(group.chips // US)) == 2 and sharing == 4
    # rank 0's group alone: the same step costed on the group inside the switch
    rank0 = rank_group(TRN3, expert_group_ranks(job.parallelism), placed)
    size = steps._dispatch_size(job) * sharing
    ratio = (steps.collectives.cost("all-to-all", group, size).time_s
             / steps.collectives.cost("all-to-all", rank0[0], size).time_s)
    assert ratio > 5
    layers = -(-job.model.layers // job.parallelism.pp)
    chunk = steps.chunks.times(job, layers, True, False, *groups)
    assert chunk.forward_ep_s == pytest.approx(
        steps.collectives.cost("all-to-all", group, size).time_s
        * len(stage_all_to_alls(job)), rel=1e-9)
    with pytest.raises(AsymmetricGroupError):
        steps.profile(job)


def stage_all_to_alls(job) -> list:
    """The dispatches and combines of one forward chunk (two per MoE layer)."""
    layers = -(-job.model.layers // job.parallelism.pp)
    return [None] * (2 * layers)


def test_uneven_over_sites_is_refused_clearly() -> None:
    """A group uneven over two sites: not modelled, refused by name (the step model then
    keeps rank 0's group when it can cost that one)."""
    from clustersim.runner.api import topology_for
    raw = {"name": "two-sites", "hardware": "trn2u", "duration": "1d",
           "cluster": {"fabric": {"spines": 4},
                       "sites": [{"name": "east", "ultraservers": 4},
                                 {"name": "west", "ultraservers": 4}],
                       "inter_site": {"links": [{"sites": ["east", "west"],
                                                 "bandwidth": "1TB/s", "latency": "2ms"}]}}}
    model = CollectiveModel(topology_for(scenario_from_dict(raw)))
    half = model.topology.chips // 2  # the first chip of the second site
    with pytest.raises(AsymmetricGroupError, match="several sites"):
        model.cost("all-to-all", Group(np.array([0, 1, 17, half]), 1), 1e6)
    even = Group(np.array([0, half]), 1)  # one chip in each: an even group, the site level
    assert model.cost("all-to-all", even, 1e6).time_s > 0
