"""The step model against closed forms: FLOPs, pipeline bubbles, memory; and its calibration."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.runner.api import step_profiles, topology_for
from clustersim.scenario.loader import ScenarioError, scenario_from_dict
from clustersim.training.memory import expert_params_per_rank, memory_per_rank, params_per_rank
from clustersim.training.ranks import rank_group
from clustersim.training.schedule import peak_in_flight, pipeline_order
from clustersim.training.step import StepModel
from clustersim.training.transformer import TransformerShape, model_preset_values
from clustersim.training.workload import hardware_flops_per_step, model_flops_per_step, stage_work


def scenario(model="llama2-7b", hardware="trn2", instances=1, **job):
    raw_job = {"name": "train", "model": model, "global_batch": 64, "micro_batch": 1,
               "parallelism": {"tp": 8, "pp": 1, "dp": 8}, "recompute": "selective"}
    raw_job.update(job)
    return scenario_from_dict({"name": "t", "hardware": hardware,
                               "cluster": {"instances": instances}, "jobs": [raw_job]})


# ---------------------------------------------------------------------------------------------
# FLOPs


@pytest.mark.parametrize("model", ["llama2-7b", "llama3.1-8b", "gpt3-175b", "megatron-1.7b"])
def test_model_flops_are_6_n_t_plus_attention(model):
    s = scenario(model, instances=1)
    job = s.jobs[0]
    shape = job.model
    tokens = job.global_batch * job.sequence_length
    matmul_params = shape.parameter_count() - shape.vocab * shape.hidden - shape.hidden * (
        2 * shape.layers + 1)  # no input embedding, no norms
    expected = 6 * matmul_params * tokens + 12 * shape.layers * shape.hidden * (
        job.sequence_length) * tokens
    assert model_flops_per_step(job) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_operation_flops_add_up_to_the_model(tp):
    """Summing the per-rank forward operations over ranks and micro-batches gives one third
    of the model FLOPs; the backward operations are twice the forward."""
    s = scenario("llama2-7b", parallelism={"tp": tp, "pp": 1, "dp": 64 // tp},
                 recompute="none", seq_len=2048)
    job = s.jobs[0]
    work = stage_work(job, job.model.layers, first=True, last=True)
    microbatches = job.global_batch // job.micro_batch
    forward = sum(op.flops for op in work.forward) * tp * microbatches
    assert forward == pytest.approx(model_flops_per_step(job) / 3, rel=1e-9)
    backward = sum(op.flops for op in work.backward) * tp * microbatches
    assert backward == pytest.approx(2 * forward, rel=1e-9)


def test_recompute_adds_flops():
    base = scenario(recompute="none").jobs[0]
    selective = scenario(recompute="selective").jobs[0]
    full = scenario(recompute="full").jobs[0]
    assert hardware_flops_per_step(base) == model_flops_per_step(base)
    s, h, l_ = selective.sequence_length, selective.model.hidden, selective.model.layers
    tokens = selective.global_batch * s
    assert hardware_flops_per_step(selective) - model_flops_per_step(selective) == (
        pytest.approx(4 * l_ * h * s * tokens))
    assert hardware_flops_per_step(full) > hardware_flops_per_step(selective)
    work = stage_work(full, 4, first=False, last=False)
    plain = stage_work(base, 4, first=False, last=False)
    assert sum(op.flops for op in work.backward) == pytest.approx(
        1.5 * sum(op.flops for op in plain.backward))


# ---------------------------------------------------------------------------------------------
# Schedules and bubbles


@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (4, 8, 2), (2, 4, 3), (8, 16, 4), (1, 5, 1),
                                     (8, 3, 1)])
def test_every_pass_runs_once(p, m, v):
    for order in pipeline_order(p, m, v):
        forwards = sorted((c, mb) for kind, c, mb in order if kind == "F")
        backwards = sorted((c, mb) for kind, c, mb in order if kind == "B")
        assert forwards == backwards == sorted((c, mb) for c in range(v) for mb in range(m))


def test_in_flight_micro_batches():
    orders = pipeline_order(8, 32, 1)
    assert [peak_in_flight(o) for o in orders] == [8 - d for d in range(8)]
    interleaved = pipeline_order(4, 8, 2)
    # Megatron: activations of the first stage grow by 1 + (p - 1) / (p v)
    assert peak_in_flight(interleaved[0]) / 2 == pytest.approx(4 * (1 + 3 / 8))
    with pytest.raises(ValueError, match="multiple"):
        pipeline_order(4, 6, 2)


def free_communication_hardware():
    """Trn2 whose communication, memory traffic and per-pass overhead cost nothing: only
    matmuls take time."""
    base = catalog_entry("trn2")
    collectives = base.collectives.model_copy(update={"step_latency_s": 0.0,
                                                      "efa_step_latency_s": 0.0})
    link = base.instance.interconnect.model_copy(update={"latency_s": 0.0,
                                                         "bandwidth_bytes_per_s": 1e30})
    chip = base.chip.model_copy(update={
        "hbm_bandwidth_bytes_per_s": 1e30,
        "efficiency": base.chip.efficiency.model_copy(update={"pass_overhead_s": 0.0})})
    return base.model_copy(update={
        "collectives": collectives, "chip": chip,
        "instance": base.instance.model_copy(update={"interconnect": link}),
    })


def uniform_job(pp, microbatches, interleave=1):
    """Layers that divide evenly, a tiny vocabulary so the first and last stages weigh the
    same as the others, one rank per stage."""
    shape = TransformerShape(name="uniform", layers=48, hidden=4096, heads=32, vocab=128,
                             seq_len=2048)
    raw = {"name": "b", "hardware": "trn2", "cluster": {"instances": 1},
           "jobs": [{"name": "j", "model": shape.model_dump(), "global_batch": microbatches,
                     "micro_batch": 1, "parallelism": {"tp": 1, "pp": pp, "dp": 64 // pp,
                                                       "interleave": interleave}}]}
    raw["jobs"][0]["global_batch"] = microbatches * (64 // pp)
    return scenario_from_dict(raw).jobs[0]


@pytest.mark.parametrize("p, m", [(4, 8), (8, 8), (8, 32), (2, 16)])
def test_1f1b_bubble_fraction(p, m):
    hw = free_communication_hardware()
    model = StepModel(build_topology(hw, 1))
    profile = model.profile(uniform_job(p, m))
    total = profile.step_time_s
    assert profile.bubble_s / total == pytest.approx((p - 1) / (m + p - 1), rel=0.01)
    assert profile.compute_s + profile.bubble_s == pytest.approx(total, rel=0.01)


@pytest.mark.parametrize("v", [2, 4])
def test_interleaving_shrinks_the_bubble_by_the_virtual_stages(v):
    hw = free_communication_hardware()
    model = StepModel(build_topology(hw, 1))
    plain = model.profile(uniform_job(4, 8))
    interleaved = model.profile(uniform_job(4, 8, interleave=v))
    assert interleaved.bubble_s == pytest.approx(plain.bubble_s / v, rel=0.02)
    assert interleaved.compute_s == pytest.approx(plain.compute_s, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# Memory


def test_weights_gradients_optimizer_are_exact():
    s = scenario("llama2-7b", hardware="trn1", instances=16, seq_len=4096, global_batch=1024,
                 parallelism={"tp": 8, "pp": 1, "dp": 64, "zero": 1})
    job = s.jobs[0]
    params = model_preset_values("llama2-7b")
    shape = TransformerShape(**params)
    per_rank = (shape.parameter_count() - shape.hidden) / 8 + shape.hidden
    assert params_per_rank(job, True, True) == pytest.approx(per_rank)
    memory = memory_per_rank(job, 1, 32 * 2**30, 2)
    assert memory.weights == pytest.approx(2 * per_rank)
    assert memory.gradients == pytest.approx(4 * per_rank)
    assert memory.optimizer == pytest.approx(12 * per_rank / 64)
    without_zero = memory_per_rank(s.jobs[0].model_copy(update={
        "parallelism": job.parallelism.model_copy(update={"zero": 0})}), 1, 32 * 2**30, 2)
    # Megatron's 18 bytes per parameter for bf16 mixed precision with Adam
    assert (without_zero.weights + without_zero.gradients + without_zero.optimizer) == (
        pytest.approx(18 * per_rank))


def test_activation_memory_follows_korthikanti():
    """GPT-style layer (no GQA, 4h MLP): 32 s b h bytes without parallelism and recompute
    (Korthikanti et al.'s 34 less the two dropout masks) plus 5 a s^2 b with unfused attention
    (none with flash); with TP t and SP, divided by t; selective recompute drops the 5 a s^2 b;
    full recompute keeps only the layer input."""
    from clustersim.training.memory import activation_bytes_per_layer

    s = scenario("gpt3-175b", hardware="p5", instances=8, recompute="none",
                 parallelism={"tp": 1, "pp": 1, "dp": 64})
    job = s.jobs[0]
    seq, h, a = job.sequence_length, job.model.hidden, job.model.heads
    unfused = job.model_copy(update={"attention": "unfused"})
    assert activation_bytes_per_layer(unfused) == pytest.approx(32 * seq * h + 5 * a * seq**2)
    assert activation_bytes_per_layer(job, "flash") == pytest.approx(32 * seq * h)
    selective = unfused.model_copy(update={"recompute": "selective"})
    assert activation_bytes_per_layer(selective) == pytest.approx(32 * seq * h)
    sp = job.model_copy(update={"parallelism": job.parallelism.model_copy(update={
        "tp": 8, "dp": 8, "sequence_parallel": True}), "recompute": "selective"})
    assert activation_bytes_per_layer(sp) == pytest.approx(32 * seq * h / 8)
    full = job.model_copy(update={"recompute": "full"})
    assert activation_bytes_per_layer(full) == pytest.approx(2 * seq * h)


def test_gpt3_without_model_parallelism_does_not_fit_on_trn2():
    s = scenario("gpt3-175b", hardware="trn2", instances=1,
                 parallelism={"tp": 1, "pp": 1, "dp": 64}, global_batch=64)
    profile = step_profiles(s)["train"]
    assert profile.fits_memory is False
    assert profile.as_dict()["fits_memory"] is False
    assert profile.memory.per_chip > catalog_entry("trn2").chip.hbm_bytes
    assert "does not fit" in profile.notes[0]


# ---------------------------------------------------------------------------------------------
# The profile


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([4, 8, 16]), pp=st.sampled_from([1, 2, 4]),
       recompute=st.sampled_from(["none", "selective", "full"]),
       sp=st.booleans(), zero=st.sampled_from([0, 1]))
def test_breakdown_adds_up_to_the_step(tp, pp, recompute, sp, zero):
    dp = 128 // (tp * pp)
    s = scenario("llama2-7b", instances=2, global_batch=dp * 4, recompute=recompute,
                 parallelism={"tp": tp, "pp": pp, "dp": dp, "sequence_parallel": sp,
                              "zero": zero})
    profile = step_profiles(s)["train"]
    parts = (profile.compute_s + sum(profile.exposed_comm_s.values()) + profile.bubble_s
             + profile.optimizer_s)
    assert parts == pytest.approx(profile.step_time_s, rel=1e-9)
    assert profile.tokens_per_s == pytest.approx(
        s.jobs[0].global_batch * s.jobs[0].sequence_length / profile.step_time_s)
    assert 0 < profile.mfu <= profile.hfu < 1


def test_profiles_are_cached_by_job_and_placement_shape():
    s = scenario("llama2-7b", instances=4, parallelism={"tp": 8, "pp": 1, "dp": 8})
    model = StepModel(topology_for(s))
    first = model.profile(s.jobs[0], "a")
    again = model.profile(s.jobs[0], "b", first_instance=2)
    assert len(model._cache) == 1
    assert again.step_time_s == first.step_time_s
    assert again.name == "b"


@pytest.mark.parametrize("hardware, instances, dp, zero", [("trn2", 1, 8, 1), ("p5en", 4, 4, 0)])
def test_public_chunk_and_data_parallel_times_are_what_the_step_adds_up(hardware, instances,
                                                                         dp, zero):
    """One stage (what the planner's quick bound reads): the step's compute and exposed TP
    time are its micro-batches' `chunk_times`, and its exposed DP time is the ZeRO-1 gather
    plus what of the reduction outlasts the last backward pass (`data_parallel_times`):
    the gather on Trn2, the reduction over EFA behind a short GPU backward pass on P5en."""
    s = scenario("llama2-7b", hardware=hardware, instances=instances, global_batch=4 * dp,
                 parallelism={"tp": 8, "pp": 1, "dp": dp, "zero": zero})
    job = s.jobs[0]
    model = StepModel(topology_for(s))
    profile = model.profile(job)
    chunk = model.chunk_times(job, True, True)
    mb = profile.microbatches
    assert profile.compute_s == pytest.approx(
        mb * (chunk.forward_compute_s + chunk.backward_compute_s), rel=1e-9)
    assert profile.exposed_comm_s["tp"] == pytest.approx(
        mb * (chunk.forward_tp_s + chunk.backward_tp_s), rel=1e-9)
    assert chunk.forward_ep_s == chunk.backward_ep_s == 0.0
    assert chunk.forward_and_backward_s == pytest.approx(
        (chunk.forward_compute_s + chunk.forward_tp_s + chunk.backward_compute_s
         + chunk.backward_tp_s), rel=1e-12)
    times = model.data_parallel_times(job)
    assert set(times) == {0} and times[0].reduce_s > 0
    assert (times[0].gather_s > 0) == (zero == 1)
    exposed_reduce = max(0.0, times[0].reduce_s - chunk.backward_compute_s - chunk.backward_tp_s)
    assert profile.exposed_comm_s["dp"] == pytest.approx(exposed_reduce + times[0].gather_s,
                                                         rel=1e-9)
    assert profile.exposed_comm_s["dp"] > 0


def test_energy_and_cost_use_the_catalog():
    s = scenario("llama2-7b", instances=1)
    profile = step_profiles(s)["train"]
    hw = catalog_entry("trn2")
    tokens = s.jobs[0].global_batch * s.jobs[0].sequence_length
    assert profile.energy_per_token_j == pytest.approx(
        16 * hw.chip.power_w * profile.step_time_s / tokens)
    assert profile.cost_per_million_tokens_usd == pytest.approx(
        hw.instance.price_per_hour_usd * profile.step_time_s / 3600 / tokens * 1e6)
    trn1 = step_profiles(scenario("llama2-7b", hardware="trn1", instances=2,
                                  parallelism={"tp": 8, "pp": 1, "dp": 8}))["train"]
    assert trn1.energy_per_token_j is None  # Trn1 chip power is not published


# ---------------------------------------------------------------------------------------------
# Mixture of experts


def test_mixtral_parameters_match_the_paper():
    """Mixtral 8x7B: 46.7B parameters, 12.9B active per token (arXiv 2401.04088)."""
    shape = TransformerShape(**model_preset_values("mixtral-8x7b"))
    assert shape.parameter_count() == pytest.approx(46.7e9, rel=0.002)
    assert shape.parameter_count(active=True) == pytest.approx(12.9e9, rel=0.002)


def moe_scenario(instances=8, **parallelism):
    par = {"tp": 8, "pp": 4, "dp": 16, "ep": 8, "zero": 1, "sequence_parallel": True}
    par.update(parallelism)
    return scenario("mixtral-8x7b", instances=instances, seq_len=4096, global_batch=128,
                    parallelism=par)


def test_moe_flops_count_the_active_experts():
    """Model FLOPs are 6 x active matmul weights x tokens + attention, and the per-rank
    operations add up to them: each token goes through top_k experts and the router."""
    job = moe_scenario(tp=8, pp=1, dp=8, ep=1, sequence_parallel=False).jobs[0]
    shape = job.model
    tokens = job.global_batch * job.sequence_length
    matmul_params = shape.parameter_count(active=True) - shape.vocab * shape.hidden - (
        shape.hidden * (2 * shape.layers + 1))
    expected = 6 * matmul_params * tokens + 12 * shape.layers * shape.hidden * (
        job.sequence_length) * tokens
    assert model_flops_per_step(job) == pytest.approx(expected, rel=1e-12)
    # With sequence parallelism each TP rank routes its own tokens: the sum is exact.
    job = moe_scenario(tp=8, pp=1, dp=8, ep=1).jobs[0].model_copy(update={"recompute": "none"})
    work = stage_work(job, shape.layers, first=True, last=True)
    forward = sum(op.flops for op in work.forward) * 8 * job.global_batch
    assert forward == pytest.approx(model_flops_per_step(job) / 3, rel=1e-9)
    # Without it every TP rank routes every token (7 extra router copies here).
    job = job.model_copy(update={"parallelism": job.parallelism.model_copy(
        update={"sequence_parallel": False})})
    work = stage_work(job, shape.layers, first=True, last=True)
    replicated = sum(op.flops for op in work.forward) * 8 * job.global_batch
    router = 2.0 * tokens * shape.hidden * shape.experts * shape.layers
    assert replicated - forward == pytest.approx(7 * router, rel=1e-9)
    mlp = {op.name: op.flops for op in work.forward[:20]}
    dense = TransformerShape(**{**model_preset_values("mixtral-8x7b"), "experts": 1, "top_k": 1})
    dense_work = stage_work(job.model_copy(update={"model": dense}), 1, False, False)
    dense_mlp = {op.name: op.flops for op in dense_work.forward}
    assert mlp["mlp_in"] == pytest.approx(2 * dense_mlp["mlp_in"])  # top_k = 2
    assert "router" in mlp and "router" not in dense_mlp


def test_expert_parallelism_shards_experts_and_adds_all_to_alls():
    model = StepModel(topology_for(moe_scenario()))
    split = moe_scenario(ep=8).jobs[0]
    whole = moe_scenario(ep=1).jobs[0]
    shape = split.model
    experts_per_rank = shape.layers / 4 * shape.experts * shape.expert_parameters / 8
    assert params_per_rank(whole, True, False) - params_per_rank(split, True, False) == (
        pytest.approx(experts_per_rank * (1 - 1 / 8)))
    assert model.memory(split).weights < model.memory(whole).weights
    sharded = model.profile(split)
    replicated = model.profile(whole)
    assert "ep" not in replicated.exposed_comm_s and sharded.exposed_comm_s["ep"] > 0
    # Per micro-batch and MoE layer: two all-to-alls forward, two backward, of each rank's
    # routed activations, times the expert groups that share a chip's links.
    work = stage_work(split, shape.layers // 4, first=False, last=False)
    assert work.ep_collectives_forward == (("all-to-all", 4096 * shape.hidden * 2 * 2 / 8),) * (
        2 * shape.layers // 4)
    assert len(work.ep_collectives_backward) == len(work.ep_collectives_forward)


@pytest.mark.parametrize("change, message", [
    ({"model": "llama3-8b"}, "needs a mixture-of-experts model"),
    ({"parallelism": {"tp": 8, "pp": 4, "dp": 16, "ep": 3}}, "ep must divide"),
    ({"parallelism": {"tp": 8, "pp": 4, "dp": 16, "ep": 16}}, "ep must divide"),
])
def test_expert_parallelism_is_checked(change, message):
    raw_job = {"name": "train", "model": "mixtral-8x7b", "global_batch": 128,
               "parallelism": {"tp": 8, "pp": 4, "dp": 16, "ep": 8}}
    raw_job.update(change)
    if "model" in change:
        raw_job["parallelism"] = {"tp": 8, "pp": 4, "dp": 16, "ep": 8}
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict({"name": "t", "hardware": "trn2", "cluster": {"instances": 8},
                            "jobs": [raw_job]})
    with pytest.raises(ValueError, match="top_k 3: more than the model.s 2 experts"):
        TransformerShape(layers=2, hidden=64, heads=4, vocab=100, experts=2, top_k=3)


def test_expert_all_to_alls_are_costed_on_their_group():
    """One micro-batch, one stage: the exposed expert-parallel time is the 4 all-to-alls of
    each layer (two forward, two backward), each costed by the collectives model on the
    expert group (the ranks 0, 8, 16, ... of one data-parallel slice), with the other groups
    on the same chips counted in its bytes."""
    s = moe_scenario(tp=8, pp=1, dp=64, ep=8)
    s = s.model_copy(update={"jobs": [s.jobs[0].model_copy(update={"global_batch": 64})]})
    job = s.jobs[0]
    model = StepModel(topology_for(s))
    profile = model.profile(job)
    group, sharing = rank_group(model.hardware, np.arange(0, 8 * 8, 8), np.arange(8))
    routed = 4096 * job.model.hidden * 2 * job.model.top_k / job.parallelism.tp
    one = model.collectives.cost("all-to-all", group, routed * sharing).time_s
    assert len(set(group.chips.tolist())) == 8 and sharing == 4
    assert profile.exposed_comm_s["ep"] == pytest.approx(4 * job.model.layers * one, rel=1e-9)


@settings(max_examples=10, deadline=None)
@given(ep=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
       recompute=st.sampled_from(["selective", "full"]))
def test_moe_breakdown_adds_up_to_the_step(ep, pp, recompute):
    s = moe_scenario(tp=8, pp=pp, dp=64 // pp, ep=ep)
    s = s.model_copy(update={"jobs": [s.jobs[0].model_copy(update={
        "global_batch": 64 // pp * 4, "recompute": recompute})]})
    profile = step_profiles(s)["train"]
    parts = (profile.compute_s + sum(profile.exposed_comm_s.values()) + profile.bubble_s
             + profile.optimizer_s)
    assert parts == pytest.approx(profile.step_time_s, rel=1e-9)
    assert ("ep" in profile.exposed_comm_s) == (ep > 1)
    assert 0 < profile.mfu <= profile.hfu < 1


def test_expert_gradients_are_reduced_over_the_ranks_sharing_the_experts():
    """Dense gradients over all dp ranks; expert gradients over the dp / ep ranks that hold
    the same experts (ZeRO-1: reduce-scatter then all-gather), each with its own bytes."""
    s = moe_scenario(tp=8, pp=1, dp=64, ep=8)
    job = s.jobs[0]
    model = StepModel(topology_for(s))
    seen = []
    real = model.collectives.cost

    def spy(op, group, size, **kwargs):
        seen.append((op, len(group.chips) * group.ranks_per_chip, size))
        return real(op, group, size, **kwargs)

    model.collectives.cost = spy
    model.reduction.per_pipeline_rank(job, np.arange(8), 4, 2)
    reduced = {(ranks, size) for op, ranks, size in seen if op == "reduce-scatter"}
    experts = expert_params_per_rank(job)
    dense = params_per_rank(job, True, True) - experts
    sizes = {ranks: size for ranks, size in reduced}
    assert set(sizes) == {64, 8}
    for ranks, per_rank in ((64, dense * 4), (8, experts * 4)):  # groups on a chip add up
        together = sizes[ranks] / per_rank
        assert together == pytest.approx(round(together)) and round(together) >= 1


# ---------------------------------------------------------------------------------------------
# The cache by placement shape


def _ultraserver_cluster(parallelism, instances, oversubscription=1.0):
    """A 64-UltraServer Trn2 cluster (16 leaves of 16 instances) and a Llama 2 7B job on
    `instances` of its instances."""
    ranks = instances * 64
    dp = ranks // (parallelism["tp"] * parallelism["pp"])
    job = {"name": "train", "model": "llama2-7b", "global_batch": 2 * dp, "micro_batch": 1,
           "seq_len": 2048, "recompute": "selective",
           "parallelism": {**parallelism, "dp": dp}}
    s = scenario_from_dict({"name": "t", "hardware": "trn2u", "cluster": {
        "ultraservers": 64, "fabric": {"instances_per_leaf": 16,
                                       "oversubscription": oversubscription}},
        "jobs": [job]})
    return topology_for(s), s.jobs[0]


def _placement(pieces, servers):
    """Instances in rank order: each piece (first z, count) on an UltraServer of `servers`."""
    return np.concatenate([server * 4 + z + np.arange(count)
                           for (z, count), server in zip(pieces, servers, strict=False)])


def _figures(profile):
    return (profile.step_time_s, profile.compute_s, profile.bubble_s, profile.optimizer_s,
            *(profile.exposed_comm_s[kind] for kind in sorted(profile.exposed_comm_s)))


@st.composite
def _pieces(draw, instances):
    """`instances` instances as pieces of UltraServers, (first z, count) each: one piece
    repeated (whole UltraServers, or the same instances of each: a group on the Z rings)
    as far as it goes, then any."""
    z = draw(st.integers(0, 3))
    count = draw(st.integers(1, 4 - z))
    pieces = [(z, count)] * (instances // count if draw(st.booleans()) else 0)
    instances -= sum(n for _, n in pieces)
    while instances:
        z = draw(st.integers(0, 3))
        count = draw(st.integers(1, min(4 - z, instances)))
        pieces.append((z, count))
        instances -= count
    return pieces


@settings(max_examples=20, deadline=None)
@given(layout=st.sampled_from([{"tp": 32, "pp": 1, "zero": 1}, {"tp": 64, "pp": 2},
                               {"tp": 128, "pp": 1}, {"tp": 16, "pp": 1},
                               {"tp": 128, "pp": 4}]),
       instances=st.sampled_from([2, 4, 6, 8]), data=st.data(),
       oversubscription=st.sampled_from([1.0, 1.0, 1.0, 2.0]))
@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_a_cached_step_is_the_step_simulated_alone(layout, instances, data, oversubscription):
    """Placements of one shape on different UltraServers and leaves share a simulation (and
    groups of one shape a reduction); each placement's step, simulated alone by a fresh
    model (no cached collectives, no cached reductions), is the one the shared model gives:
    the caches are exact, not an approximation."""
    per_replica = max(1, layout["tp"] * layout["pp"] // 64)
    instances = -(-instances // per_replica) * per_replica
    topology, job = _ultraserver_cluster(layout, instances, oversubscription)
    shared = StepModel(topology)
    for _ in range(4):
        pieces = data.draw(_pieces(instances))
        placed = _placement(pieces, data.draw(st.permutations(range(64))))
        cached = shared.profile(job, instances=placed)
        alone = StepModel(topology).profile(job, instances=placed)
        assert _figures(cached) == pytest.approx(_figures(alone), rel=1e-12)
        # The same pieces elsewhere (other UltraServers, other leaves): one shape.
        elsewhere = _placement(pieces, data.draw(st.permutations(range(64))))
        assert _figures(shared.profile(job, instances=elsewhere)) == pytest.approx(
            _figures(StepModel(topology).profile(job, instances=elsewhere)), rel=1e-12)


def test_placements_differing_only_in_their_leaves_share_one_simulation():
    """Two whole UltraServers under one leaf, or under two: one shape on a non-blocking
    fabric (and the same step simulated alone), two on an oversubscribed one, and two where
    a pipeline stage sends to the next across a spine (the shape keeps which leaf each
    stage starts on)."""
    for layout, oversubscription, shapes in (({"tp": 32, "pp": 1}, 1.0, 1),
                                              ({"tp": 32, "pp": 1}, 2.0, 2),
                                              ({"tp": 128, "pp": 4}, 1.0, 2)):
        topology, job = _ultraserver_cluster(layout, 8, oversubscription)
        model = StepModel(topology)
        one_leaf = model.profile(job, instances=np.arange(8))
        two_leaves = model.profile(job, instances=np.r_[0:4, 16:20])
        assert len(model._cache) == shapes
        alone = StepModel(topology).profile(job, instances=np.r_[0:4, 16:20])
        assert _figures(two_leaves) == pytest.approx(_figures(alone), rel=1e-12)
        if shapes == 1:
            assert _figures(one_leaf) == pytest.approx(_figures(alone), rel=1e-12)


def test_the_shape_of_a_small_placement_is_the_general_one(monkeypatch):
    """Placements of a few instances take a path on Python integers (`small_placement_shape`): the
    same keys and canonical placements as the general one, on either fabric."""
    from clustersim.training import shape as shape_module

    rng = np.random.default_rng(3)
    for layout, oversubscription in (({"tp": 32, "pp": 1}, 1.0), ({"tp": 64, "pp": 2}, 1.0),
                                     ({"tp": 32, "pp": 1}, 2.0)):
        for instances in (1, 2, 3, 4, 6, 8, 12, 16):
            if instances % max(1, layout["tp"] * layout["pp"] // 64):
                continue
            topology, job = _ultraserver_cluster(layout, instances, oversubscription)
            model = StepModel(topology)
            for _ in range(40):
                kind = rng.integers(3)
                if kind == 0:  # scattered, in any order
                    placed = rng.choice(topology.instances, instances, replace=False)
                elif kind == 1:  # a run
                    start = int(rng.integers(topology.instances - instances))
                    placed = np.arange(start, start + instances)
                else:  # runs near the cluster's end (no room for the canonical form)
                    placed = np.sort(rng.choice(np.arange(topology.instances - 40,
                                                          topology.instances),
                                                instances, replace=False))
                placed = np.asarray(placed, dtype=np.int64)
                small = model._shape(job, placed)
                monkeypatch.setattr(shape_module, "SMALL", 0)
                general = model._shape(job, placed)
                monkeypatch.setattr(shape_module, "SMALL", 16)
                assert small[0] == general[0]
                assert np.array_equal(small[1], general[1])
