"""Where expert-parallel groups sit (`parallelism.order`, training.ranks): the rank order
`tp-cp-ep-pp-dp` puts an expert group inside one instance, so its all-to-all runs on
NeuronLink; the default strides it over instances, so it crosses EFA. Closed forms for the
all-to-all on each, and the step and the planner's space with the order."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.collectives.model import CollectiveModel
from clustersim.collectives.ops import COPY_ACCESSES
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.planning.space import enumerate_space, space_size
from clustersim.scenario.loader import scenario_from_dict
from clustersim.training.ranks import (
    DEFAULT_ORDER,
    EXPERTS_INSIDE,
    ORDERS,
    dp_rank_offsets,
    expert_group_ranks,
    pipeline_stride,
    rank_chips,
    rank_group,
)
from clustersim.training.reduction import data_parallel_offsets
from clustersim.training.step import StepModel

TRN2 = catalog_entry("trn2")


def par(tp=4, cp=1, pp=16, dp=1024, ep=16, order=EXPERTS_INSIDE):
    return SimpleNamespace(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, order=order)


def all_ranks(p) -> np.ndarray:
    """Every (tp, cp, pp, dp) coordinate's rank, by the order's functions."""
    t = np.arange(p.tp)[:, None, None, None]
    c = np.arange(p.cp)[None, :, None, None]
    s = np.arange(p.pp)[None, None, :, None]
    d = dp_rank_offsets(p, np.arange(p.dp))[None, None, None, :]
    return (t + p.tp * c + pipeline_stride(p) * s + d).ravel()


degrees = st.tuples(*(st.sampled_from([1, 2, 3, 4]) for _ in range(4)),
                    st.sampled_from([1, 2, 4]), st.sampled_from(ORDERS))


@settings(max_examples=200, deadline=None)
@given(degrees)
def test_either_order_places_every_rank_once(d) -> None:
    tp, cp, pp, rest, ep, order = d
    p = par(tp, cp, pp, rest * ep, ep, order)
    ranks = all_ranks(p)
    assert sorted(ranks.tolist()) == list(range(tp * cp * pp * rest * ep))
    # each coordinate's rank by the formula docs/scenario.md gives (t varies fastest)
    t, c, s, d = np.meshgrid(np.arange(tp), np.arange(cp), np.arange(pp), np.arange(p.dp),
                             indexing="ij")
    if order == EXPERTS_INSIDE:
        e, r = d % ep, d // ep
        expected = t + tp * (c + cp * (e + ep * (s + pp * r)))
    else:
        expected = t + tp * (c + cp * (s + pp * d))
    assert np.array_equal(ranks, expected.ravel())
    group = expert_group_ranks(p)
    if order == EXPERTS_INSIDE:  # members tp x cp ranks apart
        assert np.array_equal(group, np.arange(ep) * tp * cp)
    else:  # the default: tp x cp x pp apart, as before the key existed
        assert np.array_equal(group, np.arange(ep) * tp * cp * pp)
    # the dp x cp ranks holding rank 0's weights: tp rank 0, pp rank 0, cp innermost
    offsets = data_parallel_offsets(tp, cp, pp, p.dp, ep, order)
    assert np.array_equal(offsets, expected[0, :, 0, :].T.ravel())


def test_with_ep_one_the_orders_are_the_same_ranks() -> None:
    a, b = par(ep=1, order=DEFAULT_ORDER), par(ep=1, order=EXPERTS_INSIDE)
    assert np.array_equal(all_ranks(a), all_ranks(b))
    assert pipeline_stride(a) == pipeline_stride(b) == 4


def test_the_inner_order_puts_an_expert_group_inside_one_instance() -> None:
    """DeepSeek-V3's planned layout on 16,384 Trn2 chips: TP 4 (one chip's 4 ranks), PP 16,
    DP 1,024, ep 16: strided, each member on another instance; inner, the instance's 16
    chips."""
    placed = np.arange(1024)
    inner = rank_chips(TRN2, expert_group_ranks(par()), placed)
    strided = rank_chips(TRN2, expert_group_ranks(par(order=DEFAULT_ORDER)), placed)
    assert np.array_equal(inner, np.arange(16))
    assert np.array_equal(strided // 16, np.arange(16))
    # 4 expert groups (one per TP rank) share each chip in the inner order
    assert rank_group(TRN2, expert_group_ranks(par()), placed)[1] == 4
    # the pipeline moves out by ep: stage d on instance d (it was a quarter of instance 0)
    assert pipeline_stride(par()) == 64 and pipeline_stride(par(order=DEFAULT_ORDER)) == 4


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_an_inner_group_leaves_the_instance_only_beyond_its_ranks(tp, cp, ep) -> None:
    p = par(tp=tp, cp=cp, pp=2, dp=ep * 2, ep=ep)
    placed = np.arange(tp * cp * ep * 4 // 64 + 2)
    instances = set((rank_chips(TRN2, expert_group_ranks(p), placed) // 16).tolist())
    assert (len(instances) == 1) == (tp * cp * (ep - 1) < TRN2.ranks_per_instance)


@pytest.fixture(scope="module")
def collectives() -> CollectiveModel:
    return CollectiveModel(build_topology(TRN2, 16))


def test_all_to_all_bytes_over_neuronlink_against_efa(collectives) -> None:
    """The inner group's all-to-all has one stage, on the instance's torus; the strided
    group's sends (ep - 1) / ep of each rank's buffer over EFA (its own share stays)."""
    size = 64e6
    placed = np.arange(16)
    inner = collectives.cost("all-to-all", rank_group(TRN2, expert_group_ranks(par()),
                                                      placed)[0], size)
    strided = collectives.cost("all-to-all", rank_group(
        TRN2, expert_group_ranks(par(order=DEFAULT_ORDER)), placed)[0], size)
    assert [s.level for s in inner.stages] == ["instance"]
    fabric = [s for s in strided.stages if s.level == "fabric"]
    assert len(fabric) == 1 and fabric[0].bytes_per_rank == pytest.approx(size * 15 / 16)
    assert inner.time_s < strided.time_s / 5


def test_all_to_all_closed_forms(collectives) -> None:
    """EFA: one rank per instance, each sends (ep - 1) / ep of its buffer through its chip's
    NIC share: S (ep - 1) / ep / (EFA per chip x efficiency). NeuronLink: on the 4 x 4 torus
    with dimension-order routes (antipodes one way round) the busiest link carries the flows
    of 3 of a row's 4 offsets (+1, +2 and the +2 of the chip behind) to each of 4 rows, 12
    flows of S / 16 each; HBM moves COPY_ACCESSES x S per chip; the slower of the two."""
    size = 64e6
    placed = np.arange(16)
    hw, c = TRN2, TRN2.collectives
    strided = collectives.cost("all-to-all", rank_group(
        hw, expert_group_ranks(par(order=DEFAULT_ORDER)), placed)[0], size)
    efa_s = size * 15 / 16 / (hw.efa_per_chip_bytes_per_s * c.efa_efficiency)
    assert strided.transfer_s == pytest.approx(efa_s, rel=1e-12)
    inner = collectives.cost("all-to-all", rank_group(hw, expert_group_ranks(par()),
                                                      placed)[0], size)
    link = collectives.topology.edge(0, 1)
    assert link["kind"] == "torus"
    link_s = 12 * size / 16 / (link["bandwidth_bytes_per_s"] * c.link_efficiency)
    hbm_s = COPY_ACCESSES * size / (hw.chip.hbm_bandwidth_bytes_per_s * c.hbm_efficiency)
    assert inner.transfer_s == pytest.approx(max(link_s, hbm_s), rel=1e-12)
    assert efa_s / inner.transfer_s > 5  # why the order matters on Trn2


def _job(order: str, model: str = "qwen3-30b-a3b", ep: int = 16, batch: int = 1024):
    scenario = scenario_from_dict({
        "name": "t", "hardware": "trn2", "cluster": {"instances": 16},
        "jobs": [{"name": "j", "model": model, "global_batch": batch, "seq_len": 4096,
                  "parallelism": {"tp": 4, "pp": 4, "dp": 64, "ep": ep, "order": order,
                                  "zero": 1}}]}, "test")
    return scenario.jobs[0]


@pytest.fixture(scope="module")
def steps() -> StepModel:
    return StepModel(build_topology(TRN2, 16))


def test_the_step_costs_the_inner_groups_all_to_all_on_neuronlink(steps) -> None:
    strided = steps.profile(_job(DEFAULT_ORDER))
    inner = steps.profile(_job(EXPERTS_INSIDE))
    assert inner.exposed_comm_s["ep"] < strided.exposed_comm_s["ep"] / 3
    assert inner.step_time_s < strided.step_time_s
    assert inner.compute_s == pytest.approx(strided.compute_s)  # the same work
    assert inner.memory.per_chip == strided.memory.per_chip


@pytest.mark.parametrize("model, ep", [("qwen3-30b-a3b", 1), ("llama3-8b", 1)])
def test_without_expert_parallelism_the_order_changes_nothing(steps, model, ep) -> None:
    a = steps.profile(_job(DEFAULT_ORDER, model, ep), "j")
    b = steps.profile(_job(EXPERTS_INSIDE, model, ep), "j")
    assert a.step_time_s == b.step_time_s and a.exposed_comm_s == b.exposed_comm_s


def test_the_planners_space_lists_the_inner_order_where_it_joins_a_group() -> None:
    """Every ep in the default order; ep > 1 also in the inner order where the default
    spreads an expert group over several instances (tp x cp x pp x ep beyond an instance's
    64 ranks) and the inner one keeps each inside one (tp x cp x ep tiles the instance)."""
    job = _job(DEFAULT_ORDER, batch=64)
    space = enumerate_space("trn2", TRN2, 64, job)
    assert {c.order for c in space if c.ep == 1} == {DEFAULT_ORDER}
    inner = [c for c in space if c.order == EXPERTS_INSIDE]
    default = {c.key()[:-1] for c in space if c.order == DEFAULT_ORDER}
    assert inner and all(c.key()[:-1] in default for c in inner)
    wanted = {(c.tp, c.cp, c.pp, c.ep) for c in space if c.ep > 1 and 64 % (c.tp * c.cp * c.ep)
              == 0 and c.tp * c.cp * c.pp * c.ep > 64}
    assert {(c.tp, c.cp, c.pp, c.ep) for c in inner} == wanted
    assert space_size(TRN2, 64, job) >= len(space)
    assert inner[0].parallelism.order == inner[0].as_dict()["order"] == EXPERTS_INSIDE
