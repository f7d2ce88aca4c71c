"""Unfused prefill attention: the passes over a prompt chunk's scores through HBM that a
context encoding without fused (flash) attention makes, beside the matmuls the iteration
model costs (transformers-neuronx's context encoding)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustersim.serving.iteration import IterationModel

__all__ = ["unfused_scores_s", "spilled_scores_s"]

# Unfused prefill attention (transformers-neuronx's context encoding, layers/attention_hsb.py
# score, mask and context_combined with hlo.softmax): each score element is written by the
# QK^T matmul, read and written by the mask's select, read by softmax's max, read and written
# by its subtract, exp and divide, read by its sum, and read by the P.V matmul: 12 passes.
_UNFUSED_SCORE_PASSES = 12


def unfused_scores_s(it: IterationModel, prefill: list[tuple[int, int]],
                     one_graph: bool) -> float:
    """Unfused attention's passes over the scores of an iteration's prompt chunks (heads
    x chunk x span on a rank, each layer). `one_graph`: the chunks are a static batch
    encoded by one graph, which holds their scores in one (sequences, heads, tokens,
    positions) tensor between its operations, so it is the batch's scores that must fit
    on chip (transformers-neuronx's batched context encoding, the published rows'
    setting). Otherwise each prompt's context is encoded on its own, as
    transformers-neuronx does under continuous batching, and each prompt's scores spill
    or not by themselves."""
    heads = it.heads.per_rank
    scores = [heads * chunk * (context + chunk) for chunk, context in prefill]
    layers = it.shape.model.layers
    if one_graph:
        return layers * spilled_scores_s(it, sum(scores))
    return layers * sum(spilled_scores_s(it, elements) for elements in scores)


def spilled_scores_s(it: IterationModel, elements: float) -> float:
    """Unfused attention: one layer's passes over its `elements` scores (heads x chunk x
    span on a rank) through HBM, when a pass's input and output do not both fit the
    rank's on-chip SRAM (while they fit, the passes stay on chip beside the matmuls)."""
    hw = it.hardware
    if hw.serving.attention != "unfused":
        return 0.0
    e = it.activation_bytes
    per_rank_sram = (hw.chip.sram_bytes or 0.0) / hw.chip.ranks
    if 2 * elements * e <= per_rank_sram:
        return 0.0
    bandwidth = hw.chip.hbm_bandwidth_bytes_per_s / hw.chip.ranks
    return _UNFUSED_SCORE_PASSES * elements * e / (bandwidth * hw.serving.score_efficiency)
