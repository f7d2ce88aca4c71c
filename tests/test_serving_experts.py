"""A mixture's serving iteration reads the experts its tokens reach (serving.experts)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.serving.experts import expected_busiest_group, expected_distinct_experts
from clustersim.serving.iteration import IterationModel, ReplicaShape, weight_element_bytes
from clustersim.training.transformer import TransformerShape, model_preset_values


def test_distinct_experts_closed_form():
    # one token reaches its top_k; E x (1 - (1 - k/E)^B) beyond
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8.0)
    assert expected_distinct_experts(256, 8, 8) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 8))
    assert expected_distinct_experts(256, 8, 0) == 0.0
    assert expected_distinct_experts(8, 8, 3) == 8.0
    # skew: the same top_k at batch 1, fewer distinct experts at a larger batch
    assert expected_distinct_experts(256, 8, 1, skew=0.5) == pytest.approx(8.0)
    assert expected_distinct_experts(256, 8, 64, skew=0.5) < expected_distinct_experts(256, 8, 64)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 256), st.integers(1, 16), st.integers(1, 4096))
def test_distinct_experts_bounded_and_growing(experts, top_k, tokens):
    top_k = min(top_k, experts)
    d = expected_distinct_experts(experts, top_k, tokens)
    assert top_k - 1e-9 <= d <= experts + 1e-9
    assert expected_distinct_experts(experts, top_k, tokens + 1) >= d - 1e-12


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(8, 2), (64, 4), (128, 8), (256, 8)]), st.integers(1, 512),
       st.sampled_from([2, 4, 8]))
def test_busiest_group_bounded(shape, tokens, groups):
    experts, top_k = shape
    distinct = expected_distinct_experts(experts, top_k, tokens)
    busiest = expected_busiest_group(experts, top_k, tokens, groups)
    assert distinct / groups - 1e-9 <= busiest <= experts / groups + 1e-9
    assert busiest <= distinct + 1e-9


def test_busiest_group_between_mean_and_group():
    # one group: the distinct count; many groups: above the mean share, at most a group
    assert expected_busiest_group(256, 8, 4, 1) == pytest.approx(
        expected_distinct_experts(256, 8, 4))
    busiest = expected_busiest_group(256, 8, 4, 8)
    mean = expected_distinct_experts(256, 8, 4) / 8
    assert mean < busiest <= 32
    # a single token on 64 groups of 4: at most its 8 experts in 8 groups, so the busiest
    # group holds at least one (the binomial approximation: close to 1)
    assert 1.0 <= expected_busiest_group(256, 8, 1, 64) < 1.5


@pytest.fixture(scope="module")
def mixtral_trn2():
    """Mixtral on a trn2 whose stack reads each reached expert once (`moe_decode_loads:
    distinct`, the default: NxD's per-token loads are tested apart)."""
    model = TransformerShape(**model_preset_values("mixtral-8x7b"))
    hw = catalog_entry("trn2")
    hw = hw.model_copy(update={"serving": hw.serving.model_copy(
        update={"moe_decode_loads": "distinct"})})
    return model, build_topology(hw, 1)


def test_decode_reads_top_k_at_batch_one_and_distinct_experts_beyond(mixtral_trn2):
    """At batch 1 a MoE decode reads top_k experts per layer; its HBM bytes per iteration
    grow with the batch as the expected distinct experts grow."""
    model, topology = mixtral_trn2
    tp = 16
    it = IterationModel(ReplicaShape(model, "bf16", tp, 1), topology)
    expert_bytes_per_rank = model.expert_parameters * 2 / tp
    layers = model.layers
    one = it.expert_weight_bytes_per_rank(1)
    assert one == pytest.approx(layers * model.top_k * expert_bytes_per_rank)
    for batch in (2, 4, 8, 32):
        distinct = expected_distinct_experts(model.experts, model.top_k, batch)
        assert it.expert_weight_bytes_per_rank(batch) == pytest.approx(
            layers * distinct * expert_bytes_per_rank)
    # and the iteration's time follows: a larger batch is slower, bounded by all experts
    times = [it.decode_base_s(b) for b in (1, 2, 4, 8)]
    assert times == sorted(times)
    assert it.expert_weight_bytes_per_rank(4096) <= layers * model.experts * \
        expert_bytes_per_rank * (1 + 1e-9)


def test_nxd_loads_each_tokens_experts_then_every_expert():
    """trn2's NxD (`moe_decode_loads: per-token`): min(tokens x top_k, experts) expert loads
    a layer (selective loading to its threshold, every expert beyond), each paying
    `moe_expert_load_overhead`: continuous at the threshold, so a larger batch is never
    faster (Mixtral: 2 loads at batch 1, 8 from batch 4 on)."""
    model = TransformerShape(**model_preset_values("mixtral-8x7b"))
    hw = catalog_entry("trn2")
    assert hw.serving.moe_decode_loads == "per-token"
    it = IterationModel(ReplicaShape(model, "bf16", 16, 1), build_topology(hw, 1))
    per_expert = model.expert_parameters * 2 / 16
    for batch, loads in ((1, 2), (2, 4), (3, 6), (4, 8), (5, 8), (64, 8)):
        assert it.expert_weight_bytes_per_rank(batch) == pytest.approx(
            model.layers * loads * per_expert), batch
    from clustersim.serving.layers import moe_fixed_s
    assert moe_fixed_s(it, 3) == pytest.approx(hw.serving.moe_layer_overhead_s
                                               + 6 * hw.serving.moe_expert_load_overhead_s)
    times = [it.decode_base_s(b) for b in range(1, 12)]
    assert times == sorted(times)
    # expert parallelism keeps the distinct experts (NxD's selective loading has none)
    ep = IterationModel(ReplicaShape(model, "bf16", 16, 1, ep=4), build_topology(hw, 1))
    assert moe_fixed_s(ep, 3) == pytest.approx(hw.serving.moe_layer_overhead_s)


def test_expert_parallel_busiest_rank_reads_whole_experts(mixtral_trn2):
    model, topology = mixtral_trn2
    tp_only = IterationModel(ReplicaShape(model, "bf16", 16, 1), topology)
    ep = IterationModel(ReplicaShape(model, "bf16", 16, 1, ep=4), topology)
    # At batch 1 the busiest of four groups of two experts holds at least one reached
    # expert, sharded over 4 ranks rather than 16: more bytes than tensor parallelism's.
    assert ep.expert_weight_bytes_per_rank(1) > tp_only.expert_weight_bytes_per_rank(1)
    # with every expert reached, both read the same share
    assert ep.expert_weight_bytes_per_rank(4096) == pytest.approx(
        tp_only.expert_weight_bytes_per_rank(4096), rel=1e-6)
    # the dispatch and combine all-to-alls are priced on the replica's chips
    assert ep.ep_all_to_all_s(8) > 0
    assert ep.ep_all_to_all_s(256) > ep.ep_all_to_all_s(8)


def test_skew_reads_fewer_experts(mixtral_trn2):
    model, topology = mixtral_trn2
    uniform = IterationModel(ReplicaShape(model, "bf16", 16, 1), topology)
    skewed = IterationModel(ReplicaShape(model, "bf16", 16, 1, routing_skew=0.5), topology)
    assert skewed.expert_weight_bytes_per_rank(1) == pytest.approx(
        uniform.expert_weight_bytes_per_rank(1))
    assert skewed.expert_weight_bytes_per_rank(8) < uniform.expert_weight_bytes_per_rank(8)


def test_mx_weight_bytes():
    # OCP MX: 4 or 8 bits per element plus an 8-bit scale per 32
    assert weight_element_bytes("mxfp4") == pytest.approx(0.53125)
    assert weight_element_bytes("mxfp8") == pytest.approx(1.03125)
    assert weight_element_bytes("bf16") == 2
    model = TransformerShape(**model_preset_values("llama3.1-8b"))
    topology = build_topology(catalog_entry("trn2"), 1)
    bf16 = IterationModel(ReplicaShape(model, "bf16", 4, 1), topology)
    mx = IterationModel(ReplicaShape(model, "mxfp4", 4, 1), topology)
    assert mx.shape.activation_precision == "bf16"
    assert mx.weight_bytes_per_chip() == pytest.approx(
        bf16.weight_bytes_per_chip() * 0.53125 / 2)
    assert mx.decode_base_s(1) < bf16.decode_base_s(1)
    assert math.isfinite(mx.prefill_s(512))


def _deployment(model: str, parallelism: dict, **extra) -> dict:
    return {"name": "serve", "duration": "60s", "hardware": "trn2",
            "cluster": {"instances": 1},
            "serve": [{"name": "chat", "model": model, "parallelism": parallelism,
                       "workload": {"arrival": "poisson", "rate": 1, "input_tokens": 128,
                                    "output_tokens": 16}, **extra}]}


@pytest.mark.parametrize("model, parallelism, extra, message", [
    ("llama3.1-8b", {"tp": 8, "ep": 2}, {}, "needs a mixture of experts"),
    ("mixtral-8x7b", {"tp": 16, "ep": 3}, {}, r"parallelism.ep = 3: ep must divide both tp \(16\)"),
    ("mixtral-8x7b", {"tp": 16}, {"routing_skew": 1.0}, "routing_skew"),
])
def test_bad_expert_parallelism_is_refused(model, parallelism, extra, message):
    from clustersim.scenario.loader import ScenarioError, scenario_from_dict
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict(_deployment(model, parallelism, **extra))


def test_expert_parallel_deployment_runs():
    import numpy as np

    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving import deployment_figures, simulate_serving
    raw = _deployment("mixtral-8x7b", {"tp": 16, "ep": 4}, routing_skew=0.2)
    s = scenario_from_dict(raw)
    figures = deployment_figures(s, simulate_serving(s, np.random.SeedSequence(0)))["chat"]
    assert figures["requests_completed"] > 20 and figures["tpot_p50_s"] > 0


def test_mxfp8_computes_at_trn3s_mx_peak_and_weight_only_elsewhere():
    """Trn3 has an MXFP8 peak: a prompt (compute-bound) runs faster with mxfp8 weights than
    with bf16 ones; Trn2 has none: mxfp8 is weight-only there (bf16 matmuls)."""
    model = TransformerShape(**model_preset_values("qwen3-32b"))
    trn3 = build_topology(catalog_entry("trn3-gen2"), 36)
    bf16 = IterationModel(ReplicaShape(model, "bf16", 16, 1), trn3)
    mx = IterationModel(ReplicaShape(model, "mxfp8", 16, 1), trn3)
    assert mx.compute_precision == "mxfp8"
    assert mx.prefill_s(8192) < 0.8 * bf16.prefill_s(8192)
    trn2 = build_topology(catalog_entry("trn2"), 1)
    assert IterationModel(ReplicaShape(model, "mxfp8", 64, 1), trn2).compute_precision == "bf16"
