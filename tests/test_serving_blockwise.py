"""NxD's ExpertMLPsV2 context encoding (`serving.moe_prefill: blockwise`, SDK 2.26): the path
it takes by the graph's tokens, forward_blockwise's block count, and what the mode adds to a
prefill iteration (nothing for a dense model or on the selective-loading path)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.serving.experts import (
    BLOCK_SIZE,
    blockwise_blocks,
    context_moe_path,
    moe_layer_count,
)
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.serving.layers import context_moe_s, every_expert_prefill_s
from clustersim.training.transformer import TransformerShape, model_preset_values


@pytest.mark.parametrize("tokens, top_k, experts, blocks", [
    (4096, 8, 128, 191),  # Qwen3-MoE's 4,096-token graph: ceil(32641 / 512) = 64, + 127
    (4096, 1, 16, 23),    # Llama 4 Scout: ceil(4081 / 512) = 8, + 15
    (4096, 1, 128, 135),  # Llama 4 Maverick: ceil(3969 / 512) = 8, + 127
    (512, 8, 256, 263),   # DeepSeek-V3's 512-token graph: ceil(3841 / 512) = 8, + 255
    (64, 8, 128, 128),    # T k = 512: ceil(385 / 512) = 1, + 127
    (10, 8, 128, 80),     # T k = 80 < E - 1: ceil(-47 / 512) = 0, + 127, capped at T k
    (1024, 2, 8, 11),     # Mixtral: ceil(2041 / 512) = 4, + 7
])
def test_block_count_by_hand(tokens, top_k, experts, blocks):
    """min(ceil((T k - (E - 1)) / 512) + E - 1, T k), worked by hand from the source."""
    assert blockwise_blocks(tokens, top_k, experts) == blocks


@given(tokens=st.integers(1, 20000), top_k=st.integers(1, 8),
       experts=st.sampled_from([8, 16, 64, 128, 256]))
def test_blocks_hold_the_worst_routing(tokens, top_k, experts):
    """The blocks hold every routed token slot when one expert takes all but E - 1 of them
    (each of the others one block), and never exceed the routed slots."""
    routed = tokens * top_k
    blocks = blockwise_blocks(tokens, top_k, experts)
    assert 1 <= blocks <= routed
    if blocks < routed:  # not capped: the fewest blocks that hold the worst routing
        rest = routed - (experts - 1)
        assert (blocks - (experts - 1)) * BLOCK_SIZE >= rest
        assert (blocks - experts) * BLOCK_SIZE < rest


@pytest.mark.parametrize("top_k, experts, selective_below, blockwise_from", [
    (8, 128, 16, 64),   # Qwen3-MoE: 16 x 8 = 128 = E; 64 x 8 = 512
    (1, 16, 16, 512),   # Llama 4 Scout
    (1, 128, 128, 512),  # Llama 4 Maverick
    (8, 256, 32, 64),   # DeepSeek-V3
])
def test_dispatch_switch_points(top_k, experts, selective_below, blockwise_from):
    """Selective loading while T k / E < 1.0, every expert while T k < 512, blockwise
    from T k = 512 on (ExpertMLPsV2.forward, inference, capacity_factor None)."""
    assert context_moe_path(selective_below - 1, top_k, experts) == "selective"
    assert context_moe_path(selective_below, top_k, experts) == "all-experts"
    assert context_moe_path(blockwise_from - 1, top_k, experts) == "all-experts"
    assert context_moe_path(blockwise_from, top_k, experts) == "blockwise"
    assert context_moe_path(4096, top_k, experts) == "blockwise"


def _model(name: str, tp: int, **serving) -> IterationModel:
    hw = catalog_entry("trn2")
    hw = hw.model_copy(update={"serving": hw.serving.model_copy(update=serving)})
    shape = TransformerShape(**model_preset_values(name))
    return IterationModel(ReplicaShape(shape, "bf16", tp, 1), build_topology(hw, 1))


def test_what_the_mode_adds_by_path():
    """Qwen3-30B-A3B at TP 4: nothing on the selective path (the routed path with per-token
    loads is what runs); on the all-experts path what `every-expert` adds; on the
    blockwise path the element constant adds layers x blocks x 512 x hidden of it; a dense
    model gets nothing."""
    blockwise = _model("qwen3-30b-a3b", 4, moe_prefill="blockwise")
    assert context_moe_s(blockwise, 15) == 0.0
    every = _model("qwen3-30b-a3b", 4, moe_prefill="every-expert",
                   expert_invocation_overhead_s=0.0)
    assert context_moe_s(blockwise, 40) == pytest.approx(every_expert_prefill_s(every, 40),
                                                         rel=1e-12)
    c = 1e-10
    paid = _model("qwen3-30b-a3b", 4, moe_prefill="blockwise", blockwise_element_s=c)
    m = paid.shape.model
    assert context_moe_s(paid, 4096) - context_moe_s(blockwise, 4096) == pytest.approx(
        moe_layer_count(m) * 191 * 512 * m.hidden * c, rel=1e-9)
    # the blocks' work exceeds the routed work the iteration already counts
    assert context_moe_s(blockwise, 4096) > 0
    dense = _model("llama3.1-8b", 4, moe_prefill="blockwise", blockwise_element_s=c)
    routed = _model("llama3.1-8b", 4)
    assert dense.prefill_s(4096) == routed.prefill_s(4096)
