"""Session 17 (helper fix17a3): a mixture's training memory is that of its busiest pipeline
stage, each stage counting the layers it holds (dense or MoE), not the mean layer. A job of
8 layers, the first 4 dense, at pp 2 was reported to fit (58.4 GiB) while its second stage
holds every expert (found by helper harden17a)."""

from __future__ import annotations

import pytest
from cli_helpers import invoke, write

from clustersim.scenario.models import JobSpec
from clustersim.serving.layers import busiest_stage_parameters_per_rank
from clustersim.training.experts import moe_share, stage_moe_share
from clustersim.training.layers import attention_parameters, is_moe_layer, layer_weights
from clustersim.training.memory import (
    BusiestMemory,
    activation_bytes_per_layer,
    busiest_memory,
    memory_per_rank,
    params_per_rank,
    stage_share,
)
from clustersim.training.stages import chunk_layers, rank_layer_indices, rank_layers
from clustersim.training.transformer import TransformerShape, model_preset_values, sharded_heads

HBM = 96 * 2**30
_HALF_DENSE = {"layers": 8, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
               "vocab": 32000, "seq_len": 4096, "gated": True, "experts": 80, "top_k": 2,
               "dense_layers": 4}


def _job(model: TransformerShape | dict | str, **parallelism) -> JobSpec:
    if isinstance(model, str):
        model = TransformerShape(**model_preset_values(model))
    elif isinstance(model, dict):
        model = TransformerShape(**{k: v for k, v in model.items() if k != "seq_len"})
    extra = {k: parallelism.pop(k) for k in ("micro_batch", "recompute") if k in parallelism}
    return JobSpec(name="j", model=model, global_batch=64, seq_len=4096,
                   parallelism=parallelism, **extra)


def _held_params(job: JobSpec, stage: int) -> float:
    """Weights one rank of pipeline rank `stage` holds, layer by layer (closed form): each
    layer's attention, norms and FFN (a dense FFN, or its experts over tp x ep and its
    router whole on every tensor-parallel rank), the embedding on the first rank, the output
    layer and final norm on the last."""
    m, par = job.model, job.parallelism
    # (padded heads' attention weights where tp does not divide the heads: 40 at tp 64)
    padding = sharded_heads(m, par.tp).extra_attention_parameters_per_rank(m, par.tp)
    total = 0.0
    for i in rank_layer_indices(m.layers, par.pp, par.interleave, stage):
        total += (attention_parameters(m) + 2 * m.hidden) / par.tp + padding
        if is_moe_layer(m, i):
            total += m.experts * m.expert_parameters / (par.tp * par.ep)
            total += m.shared_experts * m.expert_parameters / par.tp + m.router_parameters
        else:
            total += layer_weights(m, False, False) / par.tp
    if stage == 0:
        total += m.vocab * m.hidden / par.tp
    if stage == par.pp - 1:
        total += m.vocab * m.hidden / par.tp + m.hidden
    return total


def test_the_layers_a_rank_holds_are_its_chunks() -> None:
    """rank_layer_indices lists chunks d, d + pp, ... as chunk_layers splits them."""
    assert rank_layer_indices(8, 2, 1, 0) == (0, 1, 2, 3)
    assert rank_layer_indices(8, 2, 1, 1) == (4, 5, 6, 7)
    assert rank_layer_indices(8, 2, 2, 0) == (0, 1, 4, 5)
    assert rank_layer_indices(8, 2, 2, 1) == (2, 3, 6, 7)
    for layers, pp, v in ((61, 16, 1), (61, 8, 2), (126, 16, 1), (48, 4, 3)):
        held = [rank_layer_indices(layers, pp, v, d) for d in range(pp)]
        assert sorted(i for h in held for i in h) == list(range(layers))
        assert tuple(len(h) for h in held) == rank_layers(layers, pp, v)
        assert sum(chunk_layers(layers, pp * v)) == layers


@pytest.mark.parametrize(("model", "pp", "interleave"), [
    (_HALF_DENSE, 2, 1), (_HALF_DENSE, 2, 2), (_HALF_DENSE, 4, 1),
    ("deepseek-v3", 16, 1), ("deepseek-v3", 8, 2), ("llama4-maverick", 16, 1),
    ("llama4-maverick", 6, 2),
])
def test_a_ranks_weights_are_those_of_the_layers_it_holds(model, pp: int,
                                                          interleave: int) -> None:
    """Each pipeline rank's weights, layer by layer, against params_per_rank with the
    rank's share of MoE layers (the mean layer put the experts of 4 MoE layers half on each
    of 2 stages, though the second holds them all)."""
    j = _job(model, tp=4, pp=pp, dp=2, ep=2, interleave=interleave)
    per_rank = rank_layers(j.model.layers, pp, interleave)
    for d in range(pp):
        got = params_per_rank(j, d == 0, d == pp - 1, per_rank[d], stage_share(j, d))
        assert got == pytest.approx(_held_params(j, d), rel=1e-12)


def test_the_busiest_stage_is_the_one_serving_finds_heaviest() -> None:
    """At tp 1 the busiest rank's weights are serving's heaviest stage's (which sums each
    layer's weights; DeepSeek-V3's 3 dense layers lighten its first stage)."""
    for name, pp in (("deepseek-v3", 8), ("llama4-maverick", 16), ("qwen3-30b-a3b", 4)):
        j = _job(name, tp=1, pp=pp, dp=1)
        per_rank = rank_layers(j.model.layers, pp)
        heaviest = max(params_per_rank(j, d == 0, d == pp - 1, per_rank[d], stage_share(j, d))
                       - (j.model.hidden if d == pp - 1 else 0) for d in range(pp))
        assert heaviest == pytest.approx(
            busiest_stage_parameters_per_rank(j.model, 1, pp, 0.0), rel=1e-12)


def test_a_job_whose_second_stage_holds_every_expert_does_not_fit(tmp_path) -> None:
    """The finding's job: 8 layers, the first 4 dense, 80 experts, tp 32 x pp 2 on one
    trn2. Its second stage holds all 4 MoE layers: as many expert weights (and their
    gradients and optimizer state) as pp 1, which does not fit."""
    scenario = {"name": "h17a3", "hardware": "trn2", "cluster": {"instances": 1},
                "jobs": [{"name": "j", "model": _HALF_DENSE, "global_batch": 64,
                          "parallelism": {"tp": 32, "pp": 2, "dp": 1}}]}
    result = invoke("step", write(tmp_path, scenario))
    assert result.exit_code == 2, result.output
    assert "DOES NOT FIT" in result.output
    j = _job(_HALF_DENSE, tp=32, pp=2, dp=1)
    busiest = busiest_memory(j, 64, HBM, 1)
    assert busiest.stage == 1
    assert stage_share(j, 0) == 0.0 and stage_share(j, 1) == 1.0
    # Its weights hold every expert, as pp 1's do; only the dense layers are halved.
    whole = busiest_memory(_job(_HALF_DENSE, tp=32, pp=1, dp=2), 64, HBM, 1)
    m = j.model
    # (each layer with its 8 KV heads' K and V replicated to one per rank of the 32)
    dense_layer = (attention_parameters(m) + 2 * m.hidden + layer_weights(m, False, False)) / 32 \
        + sharded_heads(m, 32).extra_attention_parameters_per_rank(m, 32)
    assert busiest.weights == pytest.approx(whole.weights - 2 * (4 * dense_layer + m.vocab
                                                                 * m.hidden / 32), rel=1e-12)
    # Activations: its 4 MoE layers' (top 2 of 80: twice a dense layer's FFN intermediates).
    moe_layer = activation_bytes_per_layer(j, share=1.0)
    assert busiest.activations == pytest.approx(4 * moe_layer * busiest.in_flight_microbatches)
    assert moe_layer > activation_bytes_per_layer(j, share=0.0)


def test_maverick_at_pp16_counts_the_stages_with_two_moe_layers() -> None:
    """Llama 4 Maverick's MoE layers alternate: at pp 16 (3 layers a stage) half the stages
    hold 2 and the others 1; the busiest rank holds 2 (the mean layer counted 1.5)."""
    j = _job("llama4-maverick", tp=64, pp=16, dp=1, micro_batch=1)
    shares = [stage_share(j, d) for d in range(16)]
    assert shares == [1 / 3, 2 / 3] * 8
    busiest = busiest_memory(j, 64, HBM, 1)
    assert busiest.stage == 1
    assert busiest.weights == pytest.approx(_held_params(j, 1) * 2)  # bf16
    assert _held_params(j, 1) > 1.2 * params_per_rank(j, False, False, 3)  # the mean layer's
    assert memory_per_rank(j, 1.0, HBM, 1, stage=0).weights == pytest.approx(
        _held_params(j, 0) * 2)


@pytest.mark.parametrize(("model", "pp", "interleave", "zero", "ep"), [
    (_HALF_DENSE, 2, 1, 1, 1), (_HALF_DENSE, 4, 2, 3, 2), ("llama4-maverick", 16, 1, 1, 1),
    ("deepseek-v3", 16, 1, 2, 8), ("deepseek-v3", 8, 2, 1, 4),
])
def test_the_planners_screening_weighs_the_same_busiest_rank(model, pp, interleave, zero,
                                                             ep) -> None:
    """BusiestMemory (the planner's screening) and busiest_memory give the same bytes."""
    j = _job(model, tp=8, pp=pp, dp=8, ep=ep, interleave=interleave, zero=zero)
    screen = BusiestMemory("flash", "fp32")
    assert screen.per_rank(j, 64) == busiest_memory(j, 64, HBM, 1, "flash", "fp32").per_rank


def test_one_stage_and_dense_models_keep_the_models_share() -> None:
    """pp 1 holds every layer, and a dense model has no MoE layer: the model's share, the
    same figures to the bit."""
    for name in ("deepseek-v3", "llama4-maverick"):
        j = _job(name, tp=8, pp=1, dp=8)
        assert stage_moe_share(j.model, 1, 1, 0) == moe_share(j.model)
        assert params_per_rank(j, True, True, j.model.layers, stage_share(j, 0)) == \
            params_per_rank(j, True, True, j.model.layers)
    dense = _job("llama3-70b", tp=8, pp=4, dp=8)
    assert all(stage_share(dense, d) == 0.0 for d in range(4))
