"""Uneven pipeline stages, sharded data parallelism (ZeRO 1-3, hybrid) and context
parallelism: closed forms and hand counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.scenario.loader import ScenarioError, scenario_from_dict
from clustersim.training.memory import busiest_memory, layer_params_per_rank, memory_per_rank, params_per_rank
from clustersim.training.ranks import rank_group
from clustersim.training.reduction import data_parallel_offsets
from clustersim.training.schedule import in_flight, peak_in_flight, pipeline_order
from clustersim.training.stages import StageSplitError, chunk_layers, rank_layers
from clustersim.training.step import StepModel
from clustersim.training.workload import ParallelismSpec, cp_exchange_per_layer, stage_work

MODEL = {"name": "m", "layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000,
         "seq_len": 2048}


def _scenario(parallelism: dict, hardware: str = "trn2", instances: int = 4, model=None,
              **job):
    raw = {"name": "par", "hardware": hardware, "cluster": {"instances": instances},
           "jobs": [{"name": "j", "model": model or MODEL, "global_batch": 64,
                     "parallelism": parallelism, **job}]}
    return scenario_from_dict(raw)


# ---------------------------------------------------------------------------------- stages

def test_llama3_405b_on_16_stages_drops_a_layer_at_each_end():
    counts = chunk_layers(126, 16)
    assert counts == (7,) + (8,) * 14 + (7,)
    assert chunk_layers(128, 16) == (8,) * 16
    assert rank_layers(126, 8, 2) == (15,) + (16,) * 6 + (15,)
    with pytest.raises(StageSplitError):
        chunk_layers(4, 8)


@given(st.integers(1, 300), st.integers(1, 300))
def test_stages_are_as_even_as_possible(layers, chunks):
    if chunks > layers:
        return
    counts = chunk_layers(layers, chunks)
    assert sum(counts) == layers and max(counts) - min(counts) <= 1 and min(counts) >= 1
    if layers % chunks:  # the ends are the first to be shorter
        assert counts[0] == min(counts)


@settings(max_examples=60)
@given(st.integers(1, 12), st.integers(1, 40), st.integers(1, 4))
def test_in_flight_is_the_schedule_peak(pp, microbatches, interleave):
    if interleave > 1 and (pp == 1 or microbatches % pp):
        return
    orders = pipeline_order(pp, microbatches, interleave)
    assert [in_flight(pp, microbatches, interleave, d) for d in range(pp)] == [
        peak_in_flight(order) for order in orders]


def test_an_uneven_pipeline_steps_and_its_scenario_is_valid():
    """126 layers (405B's count) of a small width on pp 16 run: the first and last chunks
    take one layer less than the others."""
    model = {**MODEL, "layers": 126, "hidden": 512, "heads": 8}
    s = _scenario({"tp": 4, "pp": 16, "dp": 1}, model=model, global_batch=32)
    step = StepModel(build_topology(s.hardware, s.working_instances))
    job = s.jobs[0]
    full = step.chunk_times(job, False, False, layers=8).forward_compute_s
    short = step.chunk_times(job, False, False, layers=7).forward_compute_s
    assert short < full
    assert math.isfinite(step.profile(job).step_time_s)
    with pytest.raises(ScenarioError, match="cannot fill"):
        _scenario({"tp": 1, "pp": 8, "dp": 8}, model={**MODEL, "layers": 4})


# ---------------------------------------------------------------------------------- ZeRO

def _job(zero: int, dp: int = 8, shard: int | None = None, gated: bool = False):
    s = _scenario({"tp": 1, "pp": 2, "dp": dp, "zero": zero, "shard": shard},
                  hardware="p5en", instances=dp * 2 // 8, model={**MODEL, "gated": gated})
    return s.jobs[0]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_memory_per_stage_is_the_hand_count(zero):
    """Stage 0 of pp 2 (2 of 4 layers and the embedding), tp 1, dp 8, fp32 gradients:
    weights 2 bytes, gradients 4, optimizer 12 per parameter, each sharded by the stage."""
    h, v = MODEL["hidden"], MODEL["vocab"]
    layer = 4 * h * h + 8 * h * h + 2 * h  # Q, K, V, O; two MLP matrices of 4h; two norms
    params = 2 * layer + v * h
    job = _job(zero)
    assert layer_params_per_rank(job) == pytest.approx(layer)
    assert params_per_rank(job, True, False) == pytest.approx(params)
    m = memory_per_rank(job, 1, 96 * 2**30, 1, gradients="fp32", stage=0)
    z = 8
    weights = 2 * params if zero < 3 else 2 * params / z + 2 * 2 * layer
    grads = 4 * params if zero < 2 else 4 * params / z + 4 * layer
    optimizer = 12 * params if zero == 0 else 12 * params / z
    assert (m.weights, m.gradients, m.optimizer) == pytest.approx((weights, grads, optimizer))


def test_hybrid_sharding_shards_within_its_group():
    whole = memory_per_rank(_job(3, dp=8), 1, 1e12, 1, gradients="fp32")
    hybrid = memory_per_rank(_job(3, dp=8, shard=2), 1, 1e12, 1, gradients="fp32")
    h, v = MODEL["hidden"], MODEL["vocab"]
    params = 2 * (12 * h * h + 2 * h) + v * h
    assert hybrid.optimizer == pytest.approx(12 * params / 2)
    assert hybrid.optimizer > whole.optimizer
    with pytest.raises(ScenarioError, match="shard"):
        _job(1, dp=8, shard=3)
    with pytest.raises(ScenarioError, match="shard group needs zero"):
        _job(0, dp=8, shard=2)


def test_zero3_moves_three_times_the_parameters_per_step():
    """One micro-batch, no pipeline: every layer's weights gathered forward and backward,
    its gradients reduce-scattered (bf16 gradients on Trainium: 2 bytes like the weights):
    3 x the parameter bytes of a rank over the shard group's bandwidth."""
    model = {**MODEL, "hidden": 4096, "heads": 32, "layers": 4}
    raw = {"name": "z3", "hardware": "trn2", "cluster": {"instances": 8},
           "jobs": [{"name": "j", "model": model, "global_batch": 128,
                     "parallelism": {"tp": 4, "pp": 1, "dp": 128, "zero": 3}}]}
    job = scenario_from_dict(raw).jobs[0]
    hw = catalog_entry("trn2")
    step = StepModel(build_topology(hw, 8))
    gather_s, scatter_s, extra_gather_s, extra_scatter_s = step.zero3_traffic_s(job)
    layers = model["layers"]
    # The embedding and the output layer (each vocab x hidden / tp) the same way.
    traffic_s = layers * (2 * gather_s + scatter_s) + 2 * (2 * extra_gather_s + extra_scatter_s)
    params = params_per_rank(job, True, True)
    # Each collective of the shard group (the 4 TP ranks of a chip gather their own shards
    # together): its latency, and its bytes at the group's bandwidth, measured on a large
    # all-gather of the same group.
    group, _ = rank_group(hw, data_parallel_offsets(4, 1, 1, 128), np.arange(8))
    big = 4 * 2.0**32
    seconds_per_byte = step.collectives.cost("all-gather", group, big).transfer_s / big
    latency_s = step.collectives.cost("all-gather", group, big).latency_s
    collectives = 3 * layers + 3 * 2
    closed = 3 * params * 2 * 4 * seconds_per_byte + collectives * latency_s
    assert traffic_s == pytest.approx(closed, rel=0.01)
    profile = step.profile(job)
    assert profile.exposed_comm_s["dp"] > 0


def _zero3_gather(par: dict, hardware: str = "trn2") -> tuple[float, float, float]:
    """(the job's ZeRO-3 layer gather, the same over pipeline rank 0's TP groups only, rank
    0's shard group alone with the TP ranks on its chips carried in it) on 8 instances."""
    model = {**MODEL, "hidden": 4096, "heads": 32, "layers": 8}
    raw = {"name": "z3", "hardware": hardware, "cluster": {"instances": 8},
           "jobs": [{"name": "j", "model": model, "global_batch": 128,
                     "parallelism": {**par, "zero": 3}}]}
    job = scenario_from_dict(raw).jobs[0]
    hw = catalog_entry(hardware)
    step = StepModel(build_topology(hw, 8))
    placed = np.arange(8)
    gather_s = step.zero3_traffic_s(job)[0]
    layer = layer_params_per_rank(job)
    stage_only = step.reduction.zero3_layer_times(job, placed, layer, 2, 2,
                                                  every_stage=False)[0]
    p = job.parallelism
    group, sharing = rank_group(hw, data_parallel_offsets(p.tp, p.cp, p.pp, p.dp), placed)
    together = min(sharing, p.tp)
    alone = step.collectives.cost("all-gather", group, layer * 2 * together).time_s
    return gather_s, stage_only, alone


def test_zero3_shard_groups_share_the_links_of_their_instances():
    """ZeRO-3's per-layer gathers run at once in every shard group: groups on other chips
    of the same instances share their links (max-min fair, as the ZeRO 0-2 reductions),
    so a gather takes longer than alone but at most as long as the bytes of all of them
    through one group's links; groups on the same chips run as one, and groups with one chip
    per instance share nothing."""
    # TP 4 (one chip): the 4 TP ranks' groups are one collective over every chip.
    gather, _, alone = _zero3_gather({"tp": 4, "pp": 1, "dp": 128})
    assert gather == pytest.approx(alone, rel=1e-12)
    # TP 8 (two chips): two groups (even and odd chips) on the same torus.
    gather, stage_only, alone = _zero3_gather({"tp": 8, "pp": 1, "dp": 64})
    assert alone < gather <= 2 * alone and gather == stage_only
    # TP 4, PP 2: pipeline rank 1's groups gather their layers at the same time.
    gather, stage_only, alone = _zero3_gather({"tp": 4, "pp": 2, "dp": 64})
    assert stage_only == pytest.approx(alone, rel=1e-12) and alone < gather <= 2 * alone
    # TP 64 (a whole instance): each group has one chip per instance, its own NIC share.
    gather, _, alone = _zero3_gather({"tp": 64, "pp": 1, "dp": 8})
    assert gather == pytest.approx(alone, rel=1e-12)


def test_zero2_and_zero1_cost_the_same_step_zero2_less_memory():
    s1 = _scenario({"tp": 4, "pp": 1, "dp": 16, "zero": 1}, instances=1, global_batch=16)
    s2 = _scenario({"tp": 4, "pp": 1, "dp": 16, "zero": 2}, instances=1, global_batch=16)
    step = StepModel(build_topology(s1.hardware, 1))
    a, b = step.profile(s1.jobs[0]), step.profile(s2.jobs[0])
    assert a.step_time_s == pytest.approx(b.step_time_s)
    assert b.memory.per_chip < a.memory.per_chip


# ---------------------------------------------------------------------------------- CP

def test_ring_context_exchange_is_its_formula():
    """Ring attention: each rank's keys and values (2 x b x s/cp x kv heads/tp x head dim x
    2 bytes) go around the cp ranks: an all-gather of cp blocks forward, again with a
    reduce-scatter of their gradients backward; exposed beyond the attention kernel."""
    s = _scenario({"tp": 2, "cp": 4, "pp": 1, "dp": 8}, instances=1, global_batch=8,
                  seq_len=8192)
    job = s.jobs[0]
    b, seq, cp, tp = 1, 8192, 4, 2
    d = MODEL["hidden"] // MODEL["heads"]
    block = 2 * b * (seq // cp) * (MODEL["heads"] // tp) * d * 2
    forward, backward = cp_exchange_per_layer(job)
    assert forward == [("all-gather", block * cp)]
    assert backward == [("all-gather", block * cp), ("reduce-scatter", block * cp)]
    step = StepModel(build_topology(s.hardware, 1))
    group, sharing = rank_group(s.hardware, np.arange(cp) * tp, np.arange(1))
    exchange = step.collectives.cost("all-gather", group, block * cp * sharing).time_s
    work = stage_work(job, MODEL["layers"], True, True)
    attention = sum(step.op_time(op, job.precision) for op in work.forward
                    if op.name == "attention")
    times = step.chunk_times(job, True, True, layers=MODEL["layers"])
    assert times.forward_cp_s == pytest.approx(
        max(0.0, MODEL["layers"] * exchange - attention))


def test_context_parallelism_splits_the_sequence_in_compute_and_memory():
    one = _scenario({"tp": 2, "pp": 1, "dp": 32}, instances=1, global_batch=32, seq_len=8192)
    four = _scenario({"tp": 2, "cp": 4, "pp": 1, "dp": 8}, instances=1, global_batch=8,
                     seq_len=8192)
    hw = one.hardware
    m1 = busiest_memory(one.jobs[0], 1, hw.chip.hbm_bytes, 1)
    m4 = busiest_memory(four.jobs[0], 1, hw.chip.hbm_bytes, 1)
    assert m4.activations < m1.activations / 3
    f1 = sum(op.flops for op in stage_work(one.jobs[0], 4, False, False).forward)
    f4 = sum(op.flops for op in stage_work(four.jobs[0], 4, False, False).forward)
    assert f4 == pytest.approx(f1 / 4)
    a2a = _scenario({"tp": 2, "cp": 4, "pp": 1, "dp": 8, "cp_comm": "all-to-all"},
                    instances=1, global_batch=8, seq_len=8192)
    forward, backward = cp_exchange_per_layer(a2a.jobs[0])
    assert [op for op, _ in forward] == ["all-to-all"] * 2 and len(backward) == 2
    with pytest.raises(ScenarioError, match="not divisible by cp"):
        _scenario({"tp": 2, "cp": 4, "pp": 1, "dp": 8}, instances=1, global_batch=8,
                  seq_len=8190)


def test_parallelism_spec_counts_cp_in_the_ranks():
    par = ParallelismSpec(tp=8, cp=2, pp=4, dp=16, zero=3, shard=8)
    assert par.ranks == 8 * 2 * 4 * 16 and par.replicas == 32 and par.shard_ranks == 8
