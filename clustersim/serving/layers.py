"""The kinds of layer a replica's iteration runs, and their operations.

A model whose layers are all alike (dense, grouped-query attention) is one kind, with the
training workload's operations (`layer_forward_ops`), as before mixtures were served. A
mixture has dense layers (DeepSeek-V3's first three; Llama 4 Maverick's every other one) and
MoE layers, whose FFN is the experts its tokens reach (serving.experts); MLA replaces the
query, key-value and output projections with its own (serving.attention). The attention
core over the context is costed apart by the iteration model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from clustersim.serving import attention as mla
from clustersim.serving.experts import (
    BLOCK_SIZE,
    EXPERT_MATMULS,
    blockwise_blocks,
    blockwise_ops,
    context_moe_path,
    every_expert_ops,
    expert_loads,
    moe_ffn_ops,
    moe_layer_count,
    routed_expert_ops,
)
from clustersim.training.workload import ATTENTION_CORE, Op, _matmul, _vector, layer_forward_ops

if TYPE_CHECKING:
    from clustersim.serving.iteration import IterationModel, ReplicaShape

__all__ = ["layer_kinds", "mixture_overheads_fitted", "busiest_stage_parameters_per_rank",
           "expert_weight_bytes_per_rank",
           "every_expert_prefill_s",
           "context_moe_s", "GRID_TOKENS", "on_grid",
           "layer_collectives_s", "stack_expert_loads", "moe_fixed_s"]

# Tokens: an iteration's layer work is evaluated exactly up to 256 tokens and at multiples of
# this beyond, linearly in between (the work is linear in tokens within a tile).
GRID_TOKENS = 32


def on_grid(tokens: int, exact: Callable[[int], float]) -> float:
    """`exact(tokens)` up to 256 tokens and at multiples of GRID_TOKENS; beyond, linear
    between the two multiples around `tokens` (how the iteration model times its layers:
    what is subtracted from that time must be read the same way)."""
    if tokens <= 256 or tokens % GRID_TOKENS == 0:
        return exact(tokens)
    low = tokens - tokens % GRID_TOKENS
    weight = (tokens - low) / GRID_TOKENS
    return (1 - weight) * exact(low) + weight * exact(low + GRID_TOKENS)


# The attention block of a layer (everything but its FFN and the attention core).
_ATTENTION_BLOCK = ("norm_attention", "qkv", "attention_gate", "projection",
                    "residual_attention", "norm_mlp", "residual_mlp")


def layer_kinds(it: IterationModel, tokens: int, on_chip: bool
                ) -> list[tuple[int, list[Op], bool]]:
    """(layers, operations with their weights at the weights' precision, MoE) of each kind
    of layer of the replica `it` for an iteration of `tokens` tokens (`on_chip`: the
    activations stay in SRAM), without the attention core."""
    s = it.shape
    m = s.model
    layer = [op for op in layer_forward_ops(m, 1, tokens, s.tp, False, s.activation_precision)
             if op.name not in ATTENTION_CORE]
    if not m.moe and not mla.is_mla(m):
        return [(m.layers, it._weights_at_precision(layer, on_chip), False)]
    e = it.activation_bytes
    block = [op for op in layer if op.name in _ATTENTION_BLOCK]
    if mla.is_mla(m):
        block = [op for op in block if op.name not in ("qkv", "projection")] + \
            mla.mla_projection_ops(m, tokens, it.heads.per_rank, s.tp, e)
    kinds = []
    moe_layers = moe_layer_count(m)
    if m.layers - moe_layers:
        ffn = -(-m.ffn // s.tp)
        dense = [_matmul("mlp_in", tokens, m.hidden, ffn * (2 if m.gated else 1), e),
                 _vector("activation", tokens * ffn * (3 if m.gated else 2), e, passes=1),
                 _matmul("mlp_out", tokens, ffn, m.hidden, e)]
        kinds.append((m.layers - moe_layers, it._weights_at_precision(block + dense, on_chip),
                      False))
    if moe_layers:
        routed = moe_ffn_ops(m, tokens, s.tp, s.ep, e, it.element_bytes, on_chip,
                             s.routing_skew, stack_expert_loads(it, tokens))
        ops = it._weights_at_precision(
            block + [op for op in routed if op.name not in EXPERT_MATMULS], on_chip)
        kinds.append((moe_layers, ops + [op for op in routed if op.name in EXPERT_MATMULS],
                      True))
    return kinds


def stack_expert_loads(it: IterationModel, tokens: int) -> float | None:
    """The expert loads of one MoE layer where the replica's stack loads experts per token
    (`serving.moe_decode_loads`: serving.experts.expert_loads); None otherwise."""
    return expert_loads(it.shape.model, tokens, it.shape.ep,
                        it.hardware.serving.moe_decode_loads)


def moe_fixed_s(it: IterationModel, tokens: int) -> float:
    """A MoE layer's fixed time in an iteration of `tokens` tokens: `moe_layer_overhead`,
    plus `moe_expert_load_overhead` per expert load where the stack loads them per token."""
    serving = it.hardware.serving
    loads = stack_expert_loads(it, tokens)
    return serving.moe_layer_overhead_s + (loads or 0.0) * serving.moe_expert_load_overhead_s


def busiest_stage_parameters_per_rank(model, tp: int, pp: int,
                                      padding_per_layer: float) -> float:
    """Weights one rank of the heaviest of `pp` pipeline stages holds: its layers, each with
    its own FFN (a mixture's dense layers are lighter than its MoE layers), the embedding on
    the first stage and the output layer on the last (pp = 1 holds both; one table when
    tied), split over `tp`, plus `padding_per_layer` (padded query heads, replicated KV
    heads: ShardedHeads.extra_attention_parameters_per_rank) per layer."""
    from clustersim.training.layers import attention_parameters, is_moe_layer, layer_weights
    from clustersim.training.stages import rank_layer_indices

    common = attention_parameters(model) + 2 * model.hidden  # attention and two norms
    layer = [common + layer_weights(model, is_moe_layer(model, i), False)
             for i in range(model.layers)]
    table = model.vocab * model.hidden
    heaviest = 0.0
    for stage in range(pp):
        # (the layers training gives the stage: an uneven split gives the ends fewer)
        held = rank_layer_indices(model.layers, pp, 1, stage)
        ends = (table if stage == 0 else 0) + (
            table if stage == pp - 1 and not (pp == 1 and model.tied_embeddings) else 0)
        heaviest = max(heaviest, (sum(layer[i] for i in held) + ends) / tp
                       + len(held) * padding_per_layer)
    return heaviest


def mixture_overheads_fitted(model, hardware) -> bool | None:
    """Whether a mixture's MoE layers have a fitted fixed time on `hardware` (its serving
    stack applied): any of the MoE overheads non-zero. None for a dense model. Without
    one, its MoE layers cost only their reads, FLOPs and all-to-all, which at small batches
    is several times fast (DeepSeek-V3 on 8 x H200 at batch 1: 3 ms a token, SGLang's
    published 33 ms): a run says so (docs/calibration.md)."""
    if not model.moe:
        return None
    s = hardware.serving
    return any(v > 0 for v in (s.moe_layer_overhead_s, s.moe_expert_load_overhead_s,
                               s.expert_invocation_overhead_s, s.blockwise_element_s))


def expert_weight_bytes_per_rank(shape: ReplicaShape, weight_bytes: float, tokens: int,
                                 mode: str = "distinct") -> float:
    """HBM bytes the busiest rank reads of routed experts' weights in one iteration of
    `tokens` tokens, over all MoE layers (`mode`: the stack's `moe_decode_loads`)."""
    m = shape.model
    if not m.moe:
        return 0.0
    ops = moe_ffn_ops(m, tokens, shape.tp, shape.ep, 0.0, weight_bytes, True,
                      shape.routing_skew, expert_loads(m, tokens, shape.ep, mode))
    return moe_layer_count(m) * sum(op.bytes for op in ops if op.name in EXPERT_MATMULS)


def every_expert_prefill_s(it: IterationModel, tokens: int) -> float:
    """What a context-encoding iteration of `tokens` tokens adds when its stack runs every
    routed expert over every token (`serving.moe_prefill: every-expert`; NxD refuses it
    with expert parallelism, which keeps the routed path): all MoE layers' every-expert
    work less the routed work the iteration model already counts, plus the fixed time per
    expert each layer runs (`serving.expert_invocation_overhead`). 0 for other stacks."""
    if it.hardware.serving.moe_prefill != "every-expert":
        return 0.0
    return _context_moe_s(it, tokens, "all-experts")


def context_moe_s(it: IterationModel, tokens: int) -> float:
    """What a context-encoding iteration of `tokens` tokens adds to the routed path the
    iteration model counts, by the stack's `serving.moe_prefill`: `every-expert`, as
    `every_expert_prefill_s`; `blockwise`, the path NxD's ExpertMLPsV2 takes at that
    many tokens (serving.experts.context_moe_path): selective loading (the routed path with
    per-token loads: nothing added), every expert, or forward_blockwise's blocks (their
    matmuls, weight reads and rows, plus `serving.blockwise_element` per element of the
    blocks' token rows). 0 for `routed`, a dense model, expert parallelism (another path)
    or no tokens."""
    mode = it.hardware.serving.moe_prefill
    if mode == "every-expert":
        return every_expert_prefill_s(it, tokens)
    if mode != "blockwise":
        return 0.0
    m = it.shape.model
    if not m.moe or tokens <= 0:
        return 0.0
    path = context_moe_path(tokens, m.top_k, m.experts)
    return 0.0 if path == "selective" else _context_moe_s(it, tokens, path)


def _context_moe_s(it: IterationModel, tokens: int, path: str) -> float:
    """All MoE layers' routed experts run on `path` (`all-experts`, `blockwise`) less the
    routed work the iteration model counts, plus the path's fixed times."""
    serving = it.hardware.serving
    s = it.shape
    if not s.model.moe or s.ep > 1 or tokens <= 0:
        return 0.0
    cache = it.__dict__.setdefault("_context_moe_s", {})
    if (tokens, path) not in cache:
        on_chip = it.activations_on_chip(tokens)
        e = it.activation_bytes

        def routed_s(count: int) -> float:
            return it._op_s(routed_expert_ops(
                s.model, count, s.tp, 1, e, it.element_bytes, it.activations_on_chip(count),
                s.routing_skew, stack_expert_loads(it, count)))

        if path == "all-experts":
            ops = every_expert_ops(s.model, tokens, s.tp, e, it.element_bytes, on_chip)
            fixed = s.model.experts * serving.expert_invocation_overhead_s
        else:
            ops = blockwise_ops(s.model, tokens, s.tp, e, it.element_bytes)
            rows = blockwise_blocks(tokens, s.model.top_k, s.model.experts) * BLOCK_SIZE
            fixed = rows * s.model.hidden * serving.blockwise_element_s
        # The routed work the iteration counts is read on its grid (on_grid): subtracted
        # exactly between grid points, a step of it (each expert's tokens crossing a tile)
        # came off whole where the iteration had added 1/32 of it, and a 2,049-token
        # prompt encoded faster than a 2,048-token one.
        layer_s = it._op_s(ops) - on_grid(tokens, routed_s) + fixed
        cache[(tokens, path)] = moe_layer_count(s.model) * layer_s
    return cache[(tokens, path)]


def layer_collectives_s(it: IterationModel, tokens: int, moe: bool) -> float:
    """One layer's collectives for an iteration of `tokens` tokens: the two TP all-reduces
    of the hidden state (after attention and after the FFN); a MoE layer with expert
    parallelism dispatches and combines in their place (the FFN's all-reduce kept when its
    groups are smaller than tp); MLA's compressions, their weights split over the tp ranks,
    each all-gathered before its norm (the query's and the latent's with its rotary key)."""
    s = it.shape
    hidden = it.hidden_bytes
    comm = 2 * it.tp_all_reduce_s(tokens * s.model.hidden * hidden) \
        if it.tp_group is not None else 0.0
    if moe and it.ep_group is not None:
        comm = 2 * it.ep_all_to_all_s(tokens) + comm / 2 * (1 if s.ep == s.tp else 2)
    if it.tp_group is not None and mla.is_mla(s.model):
        comm += sum(it.tp_collectives.cost("all-gather", it.tp_group,
                                           tokens * width * hidden).time_s
                    for width in mla.compressed_widths(s.model))
    return comm
