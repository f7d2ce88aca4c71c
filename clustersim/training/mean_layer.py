"""The mean layer of a model whose layers differ (MLA, windows, dense and MoE layers, shared
experts, an uneven routing load, experts grouped per rank): training.workload's
layer_forward_ops hands such models here; training.attention and training.experts give the
parts. A pipeline chunk whose layers differ from the model's mean lists each of its
layers by kind: the mean of one layer of that kind (training.layer_mix)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustersim.training.attention import core_ops, projection_ops
from clustersim.training.experts import ffn_ops
from clustersim.training.ops import Op, _matmul, _vector
from clustersim.training.transformer import sharded_heads

if TYPE_CHECKING:
    from clustersim.training.layer_mix import LayerMix
    from clustersim.training.transformer import TransformerShape
__all__ = ["mean_layer_ops"]


def mean_layer_ops(model: TransformerShape, b: int, s: int, seq: int, tp: int,
                   sequence_parallel: bool, e: int, attention: str, load: float,
                   local: int = 1, mix: LayerMix | None = None) -> list[Op]:
    """layer_forward_ops of a model whose layers differ (MLA, windows, dense and MoE layers,
    shared experts, an uneven routing load, experts grouped per rank): the mean layer of
    the model's layers, or of those of `mix` (a pipeline chunk's: training.layer_mix)."""
    h, tokens = model.hidden, b * s
    layout = sharded_heads(model, tp)
    heads, kv_heads = layout.per_rank, layout.kv_per_rank
    outside = tokens * h / (tp if sequence_parallel else 1)
    after_core: list[Op] = []
    if model.attention == "mla":
        before = projection_ops(model, tokens, heads, e)
        out_width = heads * model.v_head_dim
    else:
        # (with a gate, its projection rides in the same matmul: as wide as the queries)
        q_heads = 2 * heads if model.attention_gate else heads
        before = [_matmul("qkv", tokens, h, (q_heads + 2 * kv_heads) * model.head_dim, e)]
        out_width = heads * model.head_dim
        if model.attention_gate:  # sigmoid of the gate, times the attention output
            after_core = [_vector("attention_gate", tokens * out_width, e, passes=3)]
    router_tokens = tokens // (tp if sequence_parallel else 1)
    return [
        _vector("norm_attention", outside, e, passes=2),
        *before,
        *core_ops(model, b, s, seq, heads, kv_heads, e, attention, mix),
        *after_core,
        _matmul("projection", tokens, out_width, h, e),
        _vector("residual_attention", outside, e, passes=3),
        _vector("norm_mlp", outside, e, passes=2),
        *ffn_ops(model, tokens, tokens * model.top_k * load, router_tokens, model.ffn // tp,
                 model.expert_ffn // tp, e, local, None if mix is None else mix.moe_share),
        _vector("residual_mlp", outside, e, passes=3),
    ]
