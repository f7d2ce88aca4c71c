"""Session 13's hardening of the training surfaces on the mixtures, MLA and the attention
variants: what a demanding user found with `step`, `run` and `plan`. One test (or a few)
per defect."""

from __future__ import annotations

import pytest
from cli_helpers import invoke, refused, write

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.scenario.loader import scenario_from_dict
from clustersim.training.memory import memory_per_rank, params_per_rank
from clustersim.training.step import StepModel
from clustersim.training.workload import cp_exchange_per_layer, model_flops_per_step

# 1. A capacity factor below 1 drops tokens: their expert FLOPs are not the model's ---------

_HEAVY_EXPERTS = {"layers": 4, "hidden": 4096, "heads": 32, "vocab": 1024, "experts": 8,
                  "top_k": 8, "expert_ffn_hidden": 65536, "gated": True, "seq_len": 512}


def _capped(capacity: float | None, top_k: int = 8):
    job = {"name": "j", "model": {**_HEAVY_EXPERTS, "top_k": top_k}, "global_batch": 256,
           "micro_batch": 4,
           "parallelism": {"tp": 1, "dp": 64, "zero": 1}}
    if capacity is not None:
        job["capacity_factor"] = capacity
    return scenario_from_dict({"name": "cf", "hardware": "trn2", "cluster": {"instances": 1},
                               "jobs": [job]}).jobs[0]


def test_dropped_tokens_leave_the_model_flops():
    """Every expert takes at most c x its mean tokens: 1 - c of the routed copies skip their
    expert, so the model FLOPs lose 6 x (1 - c) x the routed experts' weights per token."""
    full, half = model_flops_per_step(_capped(None)), model_flops_per_step(_capped(0.5))
    m = _capped(None).model
    routed = m.layers * m.top_k * 3 * 4096 * 65536
    assert full - half == pytest.approx(6.0 * 0.5 * routed * 256 * 512)
    # padding is not the model's work (top 2 of 8: up to 4x the mean is a capacity)
    assert model_flops_per_step(_capped(1.25, top_k=2)) == model_flops_per_step(
        _capped(None, top_k=2))


@pytest.mark.parametrize("capacity", [0.1, 1e-9])
def test_mfu_stays_below_one_when_a_capacity_factor_drops_most_tokens(capacity: float):
    """Experts are nearly all of this model's FLOPs; at capacity 0.1 the step computes a
    tenth of them. Counting the dropped ones put MFU at 1.76 (0.1) and 1.86 (1e-9)."""
    hw = catalog_entry("trn2")
    profile = StepModel(build_topology(hw, 1)).profile(_capped(capacity))
    assert 0.0 < profile.mfu <= profile.hfu <= 1.0


# 2. Context parallelism moves MLA's expanded keys and values, not hidden / heads wide -------


def _mla_cp(cp_comm: str):
    raw = {"name": "mla", "hardware": "trn2", "cluster": {"instances": 2},
           "jobs": [{"name": "j", "model": {"base": "deepseek-v3", "layers": 8, "experts": 16},
                     "seq_len": 16384, "global_batch": 16,
                     "parallelism": {"tp": 8, "cp": 2, "pp": 2, "dp": 4, "ep": 4,
                                     "zero": 1, "cp_comm": cp_comm}}]}
    return scenario_from_dict(raw).jobs[0]


def test_mla_context_parallel_exchange_carries_192_wide_keys_and_128_wide_values():
    """DeepSeek-V3's heads are 7,168 / 128 = 56 wide by hidden / heads, but its expanded
    keys are 128 + 64 = 192 wide and its values 128: a rank's 16 heads (tp 8) of 8,192
    positions. Before, both exchanges were counted 56 wide (ring 2.9x, Ulysses 3x short)."""
    positions, heads, e = 16384 // 2, 128 // 8, 2
    ring_fwd, ring_bwd = cp_exchange_per_layer(_mla_cp("ring"))
    assert ring_fwd == [("all-gather", positions * heads * (192 + 128) * e * 2)]
    assert [op for op, _ in ring_bwd] == ["all-gather", "reduce-scatter"]
    a2a_fwd, _ = cp_exchange_per_layer(_mla_cp("all-to-all"))
    assert a2a_fwd == [("all-to-all", positions * e * (heads * 192 + heads * (192 + 128))),
                       ("all-to-all", positions * e * heads * 128)]


def test_mla_ring_buffers_hold_the_expanded_keys_and_values():
    """Ring attention keeps two blocks of keys and values: 2 x 8,192 positions x 16 heads x
    (192 + 128) x 2 bytes a rank, on top of the all-to-all variant's activations."""
    ring, a2a = _mla_cp("ring"), _mla_cp("all-to-all")
    held = 3.0  # any micro-batch count: the buffers are one micro-batch's
    extra = (memory_per_rank(ring, held, 96 * 2**30, 4).activations
             - memory_per_rank(a2a, held, 96 * 2**30, 4).activations)
    assert extra == 2 * 8192 * 16 * (192 + 128) * 2


# 3. Tied embeddings on one pipeline stage are one matrix ------------------------------------


@pytest.mark.parametrize("pp", [1, 2])
def test_a_tied_output_layer_is_not_held_twice_by_one_stage(pp: int):
    """Llama 3.2 1B with its embeddings tied: 1,235,814,400 weights. On one stage a rank
    held 1,498,482,688 (the 262.7M vocabulary matrix twice); with two stages each end keeps
    its copy, so the two ranks hold the model plus one matrix."""
    raw = {"name": "t", "hardware": "trn2", "cluster": {"instances": 1},
           "jobs": [{"name": "j", "model": {"base": "llama3.2-1b", "tied_embeddings": True},
                     "global_batch": 64, "parallelism": {"tp": 1, "pp": pp, "dp": 64 // pp}}]}
    job = scenario_from_dict(raw).jobs[0]
    held = sum(params_per_rank(job, d == 0, d == pp - 1, 16 / pp) for d in range(pp))
    copies = 0 if pp == 1 else 1
    assert held == job.model.parameter_count() + copies * 128256 * 2048


# 4. A refused rank count shows the degrees it multiplies -----------------------------------


def test_a_rank_count_refusal_shows_the_context_parallel_degree_it_counts(tmp_path):
    """tp 1 x cp 4 x pp 1 x dp 2 = 8 ranks on trn2 (64 a trn2.48xlarge): the value shown
    was {tp: 1, pp: 1, dp: 2}, whose product is not the 8 ranks the message names."""
    path = write(tmp_path, {"name": "r", "hardware": "trn2", "cluster": {"instances": 1},
                            "jobs": [{"name": "j", "model": "llama3-8b", "global_batch": 8,
                                      "parallelism": {"tp": 1, "cp": 4, "dp": 2}}]})
    result = invoke("step", path)
    refused(result, "jobs.0.parallelism = {tp: 1, cp: 4, pp: 1, dp: 2}",
            "tp 1 x cp 4 x pp 1 x dp 2 = 8 ranks", "expected a multiple of 64")


# 5. moe_every past the last layer is named as the key at fault -----------------------------


def test_moe_every_past_the_last_layer_names_moe_every(tmp_path):
    """Qwen3-30B-A3B (48 layers, no dense ones) with moe_every 49 has no MoE layer: the
    refusal named `dense_layers = 0`, a key the user never wrote."""
    path = write(tmp_path, {"name": "m", "hardware": "trn2", "cluster": {"instances": 1},
                            "jobs": [{"name": "j", "model": {"base": "qwen3-30b-a3b",
                                                             "moe_every": 49},
                                      "global_batch": 64, "parallelism": {"tp": 4, "dp": 16}}]})
    refused(invoke("step", path), "jobs.0.model.moe_every = 49",
            "leaves none of the 48 layers a MoE layer; expected at most 48")


# 6. Llama 3.2 1B ties its embeddings, as its config (and the catalog's source note) says -----


def test_llama32_1b_counts_its_tied_embeddings_once():
    """config.json: tie_word_embeddings true; the model card's 1.23B (1.24B on its Hugging
    Face page). The preset left the tie out: 1.50B, the 262.7M vocabulary matrix twice."""
    from clustersim.training.transformer import TransformerShape, model_preset_values

    model = TransformerShape(**model_preset_values("llama3.2-1b"))
    assert model.tied_embeddings
    count = model.parameter_count()
    assert count == 16 * (2048 * (2048 + 2 * 512 + 2048) + 3 * 2048 * 8192 + 2 * 2048) + (
        128256 * 2048 + 2048)
    assert round(count / 1e9, 2) == 1.24 and abs(count / 1.23e9 - 1) < 0.01
