"""The reduction's key for groups spread over several sites, computed from their ranks
(clustersim.training.spread_groups), each against what it stands in for: the key of the
groups' chips, their classes of equal chips, the reduction solved from the chips; and the
contention model's resource rates against translating each link of each instance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from year_helpers import year_slice

from clustersim.collectives import contention
from clustersim.runner.api import topology_for
from clustersim.training.ranks import rank_chips
from clustersim.training.reduction import _offsets
from clustersim.training.spread_groups import GroupsOfRanks, chips_key
from clustersim.training.step import StepModel


@pytest.fixture(scope="module")
def model() -> StepModel:
    scenario = year_slice("cluster.sites.2.ultraservers=12", "cluster.sites.3.ultraservers=12")
    return StepModel(topology_for(scenario))


@pytest.fixture(scope="module")
def jobs():
    """A large job (one instance a TP group: one chip per instance in each group) and a
    small one (four data-parallel ranks an instance: groups share instances)."""
    scenario = year_slice()
    large = next(j for j in scenario.jobs if j.parallelism.tp == 128
                 and scenario.job_instances(j) >= 256)
    small = next(j for j in scenario.jobs if j.parallelism.tp == 32
                 and scenario.job_instances(j) >= 8)
    return {"large": (large, scenario.job_instances(large)),
            "small": (small, scenario.job_instances(small))}


def _shard_groups(job) -> GroupsOfRanks:
    par = job.parallelism
    offsets = _offsets(par)
    return GroupsOfRanks(np.arange(par.tp), offsets[: par.shard_ranks if par.zero else None])


def _spread(model: StepModel, n: int, seed: int, sites=(0, 1)) -> np.ndarray:
    """n instances drawn from two sites (at least one in each), in order."""
    rng = np.random.default_rng(seed)
    first = model.topology.sites.first_instance
    pools = [np.arange(int(first[s]), int(first[s + 1])) for s in sites]
    k = int(rng.integers(1, n))
    return np.sort(np.concatenate([rng.choice(pools[0], k, replace=False),
                                   rng.choice(pools[1], n - k, replace=False)]))


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_the_chips_key_is_equal_exactly_when_the_chips_are(data):
    rows, cols = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 6))
    cells = st.lists(st.integers(0, 4 * 16 - 1), min_size=rows * cols, max_size=rows * cols)
    a = np.array(data.draw(cells), dtype=np.int64).reshape(rows, cols)
    b = a.copy()
    if data.draw(st.booleans()):  # a change of one chip, or of the shape
        if data.draw(st.booleans()):
            b[data.draw(st.integers(0, rows - 1)), data.draw(st.integers(0, cols - 1))] += (
                data.draw(st.sampled_from([1, 16, -16, 3])))
        else:
            b = b.reshape(cols, rows)
    same = a.shape == b.shape and np.array_equal(a, b)
    assert (chips_key(a, 16) == chips_key(b, 16)) == same


def test_chips_on_instances_named_alike_in_another_order_are_other_chips():
    """Two groups on instances (3, 5) and (5, 3): the same instances renamed by first
    appearance, other chips."""
    a = np.array([[3 * 16, 5 * 16]], dtype=np.int64)
    b = np.array([[5 * 16, 3 * 16]], dtype=np.int64)
    assert chips_key(a, 16) != chips_key(b, 16)
    assert chips_key(a, 16) == chips_key(a.copy(), 16)


@pytest.mark.parametrize("size", ["large", "small"])
def test_the_key_from_ranks_is_the_key_of_the_chips(model, jobs, size):
    """Over two sites, the key and the classes the ranks give are those of the chips; in
    one site there is none (the domain shape keys it)."""
    job, n = jobs[size]
    hw = model.hardware
    spread_keys = model.reduction._spread
    groups = _shard_groups(job)
    for seed in range(3):
        placed = _spread(model, n, seed)
        found = spread_keys.key(groups, placed)
        assert found is not None
        key, classes = found
        chips = rank_chips(hw, groups.matrix(), placed)
        assert key == chips_key(chips, hw.chips_per_instance)
        assert key == model.reduction._groups_shape(chips)
        # classes of equal chips, first rows in order, as `_solve` groups the chips
        members: dict[bytes, list[int]] = {}
        for i, row in enumerate(chips):
            members.setdefault(row.tobytes(), [i, 0])[1] += 1
        assert classes.members == [tuple(m) for m in members.values()]
        spans = len(np.unique(chips[0] // hw.chips_per_instance))
        assert classes.first_instances == spans
        assert classes.own_instances == (spans == chips.shape[1])
        # the same ranks on the placement shuffled: other chips, another key
        shuffled = placed.copy()
        shuffled[[0, -1]] = shuffled[[-1, 0]]
        other = spread_keys.key(groups, shuffled)[0]
        assert other != key
        assert other == chips_key(rank_chips(hw, groups.matrix(), shuffled),
                                  hw.chips_per_instance)
    first = model.topology.sites.first_instance
    assert spread_keys.key(groups, np.arange(int(first[1]), int(first[1]) + n)) is None


def test_a_placement_repeating_an_instance_is_keyed_by_its_chips(model, jobs):
    job, n = jobs["small"]
    placed = _spread(model, n, 0)
    placed[1] = placed[0]
    assert model.reduction._spread.key(_shard_groups(job), placed) is None


@pytest.mark.parametrize("size", ["large", "small"])
def test_spread_reductions_are_those_solved_from_the_chips(model, jobs, size):
    """Each pipeline rank's reduction over two sites, keyed from the ranks, is the one the
    chips give (a fresh model keying by the chips); a placement over the same sites with
    other instances is solved again, not taken from the cache."""
    job, n = jobs[size]
    fresh = StepModel(model.topology)
    from_chips = StepModel(model.topology)
    from_chips.reduction._spread = None  # `_groups_shape` of the chips, as before
    for seed in range(3):
        placed = _spread(model, n, seed + 10)
        solved = len(fresh.reduction._cache)
        assert fresh.data_parallel_times(job, placed) == from_chips.data_parallel_times(
            job, placed)
        assert len(fresh.reduction._cache) == solved + 1  # a new key, a new solve
    assert list(fresh.reduction._cache.values()) == list(from_chips.reduction._cache.values())


def _resource_rates_reference(model, cost):
    """`contention.resource_rates` as it was: every link of the representative translated
    to each instance and peaked one call at a time."""
    if cost.group is None or cost.transfer_s <= 0:
        return {}
    layout = model.layout(cost.group)
    rates: dict[tuple, float] = {}

    def peak(key, rate):
        if rate > rates.get(key, 0.0):
            rates[key] = rate

    for stage in cost.stages:
        if stage.transfer_s <= 0 or stage.level == "site":
            assert stage.level != "site"
            continue
        if stage.level == "fabric":
            for domain in layout.domains.tolist():
                peak(("efa", domain), 1.0)
            continue
        chips, steps, span = model.stage_steps(stage, layout)
        link_rate: dict = {}
        hbm_rate = 0.0
        for step in steps:
            step_s = max(model.coster.link_time(step.flows, step.flow_bytes)[0],
                         step.hbm_bytes_per_chip / model.coster.hbm_rate())
            if step_s <= 0:
                continue
            hbm_rate = max(hbm_rate, step.hbm_bytes_per_chip / step_s)
            loads: dict = {}
            for a, b in step.flows:
                nodes = model.topology.route(a, b)
                for u, v in zip(nodes, nodes[1:], strict=False):
                    loads[(u, v)] = loads.get((u, v), 0) + 1
            for edge, count in loads.items():
                link_rate[edge] = max(link_rate.get(edge, 0.0), count * step.flow_bytes / step_s)
        rep_base = chips[0] - chips[0] % span
        for base in (np.unique(cost.group.chips // span) * span).tolist():
            shift = base - rep_base
            for (u, v), rate in link_rate.items():
                peak(("link", contention._translate(model, u, v, shift),
                      contention._translate(model, v, u, shift)), rate)
            for chip in chips:
                peak(("hbm", chip + shift), hbm_rate)
    return rates


def test_resource_rates_are_each_link_translated_to_each_instance(model, jobs):
    """The small job's groups over one site: instance and UltraServer stages over every
    instance, and the EFA stage; the rates as translating each link one call at a time."""
    from clustersim.collectives.model import Group

    job, n = jobs["small"]
    hw = model.hardware
    groups = _shard_groups(job)
    placed = np.arange(n)
    collectives = model.collectives
    for row in range(0, groups.shape[0], 4):
        group = Group.from_rank_chips(rank_chips(hw, groups.row(row), placed))
        for op in ("reduce-scatter", "all-gather", "all-reduce"):
            cost = collectives.cost(op, group, 2.0**28)
            got = contention.resource_rates(collectives, cost)
            assert got == _resource_rates_reference(collectives, cost)
            assert any(key[0] == "link" for key in got) and any(key[0] == "hbm" for key in got)


def test_instance_and_ultraserver_stages_kept_are_those_computed(model, jobs):
    """The level coster keeps instance and UltraServer stages by their inputs: groups over
    other sites (the same first UltraServer, other domains) get the stage computed for the
    first, which is what computing theirs gives."""
    from clustersim.collectives.model import Group

    job, n = jobs["small"]
    hw = model.hardware
    collectives = StepModel(model.topology).collectives
    levels = collectives.levels
    first = model.topology.sites.first_instance
    asked = 0
    for other in (1, 2, 3):  # an UltraServer from site 0's start, the rest from another's
        placed = np.concatenate([np.arange(int(first[0]), int(first[0]) + 4),
                                 np.arange(int(first[other]), int(first[other]) + n - 4)])
        group = Group.from_rank_chips(rank_chips(hw, _shard_groups(job).row(0), placed))
        layout = collectives.layout(group)
        assert layout.sites == 2 and layout.ultraserver_members > 1
        for op in ("reduce-scatter", "all-gather"):
            assert levels.instance_stage(op, layout, 2.0**26, "auto") == (
                levels._instance_stage(op, layout, 2.0**26, "auto"))
            assert levels.ultraserver_stage(op, layout, 2.0**24, "auto") == (
                levels._ultraserver_stage(op, layout, 2.0**24, "auto"))
            asked += 2
    assert len(levels._stages) == 4 < asked  # one of each op and level, whatever the split


def test_fabric_stages_kept_are_those_computed(model, jobs):
    """The level coster keeps fabric stages by what `fabric_cost` reads, the domains'
    leaves up to a shift: splits of a large job that keep its largest site's share (the
    within-site stages' representative) share the stage, in whichever site it is, and it
    is what computing each gives; another share is another stage."""
    from clustersim.collectives.model import Group

    job, n = jobs["large"]
    hw = model.hardware
    collectives = StepModel(model.topology).collectives
    levels = collectives.levels
    first = model.topology.sites.first_instance
    big = n - 16
    layouts = []
    # the largest share from the start of site 0 or 1, the small one anywhere else
    for site, other, start in ((0, 1, 0), (0, 2, 0), (1, 3, 16), (1, 0, 32)):
        small = int(first[other]) + start
        for size in (big, big - 8):
            placed = np.concatenate([np.arange(int(first[site]), int(first[site]) + size),
                                     np.arange(small, small + n - size)])
            placed.sort()
            group = Group.from_rank_chips(rank_chips(hw, _shard_groups(job).row(0), placed))
            layout = collectives.layout(group)
            assert layout.sites == 2 and len(layout.domains) > 1
            layouts.append(layout)
    for op in ("reduce-scatter", "all-gather"):
        for layout in layouts:
            assert levels.fabric_stage(op, layout, 2.0**26, "auto") == (
                levels._fabric_stage(op, layout, 2.0**26, "auto"))
    # two largest shares, two ops: four stages for sixteen asked
    assert sum(key[0] == "fabric" for key in levels._stages) == 4
