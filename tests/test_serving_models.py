"""Serving 2025's models: every new preset on trn2, trn2u, trn3-gen2 and p5en; MLA's cache and
absorbed decode; sliding windows; DeepSeek-V3's decode reading top-k plus shared experts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving import deployment_figures, simulate_serving
from clustersim.serving.experts import expected_distinct_experts
from clustersim.serving.iteration import IterationModel, ReplicaShape, kv_bytes_per_token
from clustersim.training.transformer import TransformerShape, model_preset_values

PRESETS = ("deepseek-v3", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b",
           "llama4-scout", "llama4-maverick", "gpt-oss-20b", "gpt-oss-120b",
           "trinity-nano", "trinity-mini", "trinity-large")
# (tp, precision) per hardware: one instance (or trn3's UltraServer servers) holding the weights
BIG = ("deepseek-v3", "llama4-maverick", "trinity-large")
LAYOUT = {"trn2": lambda m: (64, "bf16"), "trn2u": lambda m: (64, "bf16"),
          "trn3-gen2": lambda m: (64 if m in BIG else 16, "bf16"),
          "p5en": lambda m: (8, "fp8" if m == "deepseek-v3" else "bf16")}


def model(name: str) -> TransformerShape:
    return TransformerShape(**model_preset_values(name))


@pytest.mark.parametrize("hardware", list(LAYOUT))
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_serves(name: str, hardware: str) -> None:
    tp, precision = LAYOUT[hardware](name)
    hw = catalog_entry(hardware)
    instances = max(1, math.ceil(tp / hw.ranks_per_instance)) * hw.instances_per_ultraserver
    raw = {"name": "serve", "duration": "120s", "hardware": hardware,
           "cluster": {"instances": instances},
           "serve": [{"name": "chat", "model": name, "precision": precision,
                      "parallelism": {"tp": tp}, "server": {"max_batch": 16},
                      "workload": {"arrival": "poisson", "rate": 0.5, "input_tokens": 512,
                                   "output_tokens": 64}}]}
    scenario = scenario_from_dict(raw)
    result = simulate_serving(scenario, np.random.SeedSequence(0))
    figures = deployment_figures(scenario, result)["chat"]
    assert figures["requests_completed"] > 10
    for key in ("ttft_p50_s", "tpot_p50_s"):
        assert 0 < figures[key] < math.inf, key


def test_every_preset_prices_an_iteration_on_each_hardware() -> None:
    """Each preset's replica on each family: KV room, decode growing with the batch, a
    prefill in bounded time."""
    for hardware, layout in LAYOUT.items():
        hw = catalog_entry(hardware)
        for name in PRESETS:
            tp, precision = layout(name)
            instances = max(1, math.ceil(tp / hw.ranks_per_instance))
            ipu = hw.instances_per_ultraserver
            topology = build_topology(hw, ipu * math.ceil(instances / ipu))
            it = IterationModel(ReplicaShape(model(name), precision, tp, 1), topology)
            assert it.kv_capacity_tokens(0.1) > 0, (name, hardware)
            assert 0 < it.decode_base_s(1) < it.decode_base_s(16) < 1.0, (name, hardware)
            assert 0 < it.prefill_s(512) < 10.0, (name, hardware)


@pytest.fixture(scope="module")
def deepseek_trn2() -> IterationModel:
    return IterationModel(ReplicaShape(model("deepseek-v3"), "bf16", 64, 1),
                          build_topology(catalog_entry("trn2"), 1))


def test_deepseek_decode_reads_top_k_plus_shared_experts(deepseek_trn2) -> None:
    m = deepseek_trn2.shape.model
    assert (m.experts, m.top_k, m.shared_experts, m.moe_layers) == (256, 8, 1, 58)
    per_expert_rank = m.expert_parameters * 2 / 64
    assert deepseek_trn2.expert_weight_bytes_per_rank(1) == pytest.approx(
        58 * 8 * per_expert_rank)
    # a stack that reads each reached expert once: the expected distinct experts
    hw = catalog_entry("trn2")
    distinct = IterationModel(deepseek_trn2.shape, build_topology(hw.model_copy(update={
        "serving": hw.serving.model_copy(update={"moe_decode_loads": "distinct"})}), 1))
    for batch in (2, 8, 64):
        assert distinct.expert_weight_bytes_per_rank(batch) == pytest.approx(
            58 * expected_distinct_experts(256, 8, batch) * per_expert_rank)
    # trn2's NxD loads each token's top-k by itself while tokens x 8 <= 256 (selective
    # loading), every expert beyond
    for batch in (2, 8, 32):
        assert deepseek_trn2.expert_weight_bytes_per_rank(batch) == pytest.approx(
            58 * 8 * batch * per_expert_rank)
    assert deepseek_trn2.expert_weight_bytes_per_rank(33) == pytest.approx(
        58 * 256 * per_expert_rank)
    # The whole iteration's weight reads at batch 1: attention, dense layers, shared experts
    # and the top-8 routed experts of each MoE layer (not all 256): the active parameters
    # but the input embedding (a lookup), with the router replicated on every rank; far
    # below the total.
    from clustersim.calibration.models_serving import decode_breakdown
    hw = deepseek_trn2.hardware
    bandwidth = hw.chip.hbm_bandwidth_bytes_per_s / hw.chip.ranks * hw.serving.hbm_efficiency
    read = decode_breakdown(deepseek_trn2, 1)["weight_reads"] * bandwidth * 64 / 2
    expected = (m.parameter_count(active=True, input_embedding=False)
                + 63 * m.moe_layers * m.router_parameters)
    assert read == pytest.approx(expected, rel=0.01)
    assert read / 1e9 == pytest.approx(43.3, abs=0.1)  # docs/calibration.md: 43 billion
    # distinct experts at batch 1, 2, 4, 8 (docs/calibration.md: 8, 16, 31 and 57 of 256)
    assert [round(expected_distinct_experts(256, 8, b)) for b in (1, 2, 4, 8)] == \
        [8, 16, 31, 57]
    # a 512-token prompt: about 38 TFLOP in all (2 x active weights x tokens)
    assert 2 * m.parameter_count(active=True) * 512 / 1e12 == pytest.approx(38, abs=1)
    assert read < 0.1 * m.parameter_count()


def test_mla_cache_is_the_latent_replicated_on_every_rank(deepseek_trn2) -> None:
    m = deepseek_trn2.shape.model
    # 61 layers x (512 latent + 64 rope) x 2 bytes: 70,272 bytes a token
    assert kv_bytes_per_token(m, "bf16") == 61 * (512 + 64) * 2
    # every rank holds all of it (four ranks a chip at LNC 2)
    assert deepseek_trn2.kv_bytes_per_token_per_chip() == 4 * 61 * 576 * 2
    # absorbed decode reads the latent once per layer (not 128 heads' keys and values):
    # its time per context token is at least the latent's bytes over a rank's bandwidth,
    # and within twice it (a rank's two heads fill few rows of the matmul unit)
    hw = deepseek_trn2.hardware
    bandwidth = hw.chip.hbm_bandwidth_bytes_per_s / hw.chip.ranks * hw.serving.hbm_efficiency
    latent_s = 61 * 576 * 2 / bandwidth
    assert latent_s * 0.999 < deepseek_trn2.kv_coefficient_s < 2 * latent_s


def test_sliding_window_bounds_kv() -> None:
    m = model("gpt-oss-120b")
    assert (m.window, m.window_kind, m.global_every) == (128, "sliding", 2)
    full = m.model_copy(update={"window": None, "global_every": None})
    # half the layers keep at most 128 tokens: the per-token cache is the global layers'
    assert kv_bytes_per_token(m, "bf16") == pytest.approx(kv_bytes_per_token(full, "bf16") / 2)
    topology = build_topology(catalog_entry("trn2"), 1)
    windowed = IterationModel(ReplicaShape(m, "bf16", 64, 1), topology)
    dense = IterationModel(ReplicaShape(full, "bf16", 64, 1), topology)
    # every layer reads the context up to the window; the windowed half skips the rest
    assert windowed.kv_coefficient_s == dense.kv_coefficient_s
    assert windowed.window_coefficient_s == pytest.approx(dense.kv_coefficient_s / 2)
    assert windowed.decode_kv_s(4096, windowed.window_excess(4096)) == pytest.approx(
        dense.kv_coefficient_s * (4096 + 128) / 2)
    assert windowed.kv_capacity_tokens() > dense.kv_capacity_tokens()
    # a long prompt's attention on the windowed layers spans the window, not the context
    assert windowed.prefill_s(16384) < dense.prefill_s(16384)


def _served(model: dict, output_tokens: int = 64) -> dict:
    raw = {"name": "serve", "duration": "60s", "hardware": "trn2", "cluster": {"instances": 1},
           "serve": [{"name": "chat", "model": model, "parallelism": {"tp": 64},
                      "server": {"max_batch": 16},
                      "workload": {"arrival": "poisson", "rate": 1, "input_tokens": 512,
                                   "output_tokens": output_tokens}}]}
    scenario = scenario_from_dict(raw)
    result = simulate_serving(scenario, np.random.SeedSequence(0))
    return deployment_figures(scenario, result)["chat"]


def test_a_sliding_window_no_request_reaches_is_no_window() -> None:
    """A window longer than any request (prompt and output) bounds nothing: its layers read
    and keep the context as global ones do, not `window` tokens per sequence (a window of a
    million tokens made every decode read a million tokens a layer: TPOT x15)."""
    plain = _served({"base": "gpt-oss-20b", "window": None, "global_every": None})
    wide = _served({"base": "gpt-oss-20b", "window": 1_000_000})
    assert wide["requests_completed"] == plain["requests_completed"]
    for key in ("ttft_p50_s", "tpot_p50_s", "tpot_p99_s"):
        assert wide[key] == plain[key], key  # to the bit: the excess is 0, not small
    # a window the requests pass still bounds the windowed layers' reads
    assert _served({"base": "gpt-oss-20b"})["tpot_p50_s"] < plain["tpot_p50_s"]
