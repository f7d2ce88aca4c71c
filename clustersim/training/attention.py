"""Attention beyond 2023's: multi-head latent attention (MLA) and windowed layers, as
operations of one layer on one tensor-parallel rank (training.workload builds the layer).

MLA (DeepSeek-V2, arXiv 2405.04434; DeepSeek-V3, arXiv 2412.19437), as trained (no weight
absorption, which only pays at decode): the hidden state is compressed to a query latent
(`q_lora_rank`, or projected directly) and a key-value latent (`kv_lora_rank`) plus one
rotary key of `qk_rope_head_dim` shared by the heads; up-projections give each head
`qk_nope_head_dim + qk_rope_head_dim` wide queries and keys and `v_head_dim` wide values.
The down-projections are replicated over tensor parallelism (each rank computes them, as
Megatron-Core's MLA duplicates them); the up-projections and the output projection are split
by heads.

Windowed layers (GPT-OSS's 128-token sliding window on alternating layers; Llama 4's
8,192-token chunks with every 4th layer global): a windowed layer's scores cover
min(window, seq) keys per query, a global layer's all `seq` (counted in full, as the dense
model's are). The two kinds are separate operations, each weighted by its share of the
layers (or one layer of one kind, as a pipeline chunk lists its own: training.layer_mix).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from clustersim.training.layers import attention_span, query_width, value_width, windowed_layers
from clustersim.training.ops import Op, _attention_ops, _matmul, _vector

if TYPE_CHECKING:
    from clustersim.training.layer_mix import LayerMix
    from clustersim.training.transformer import TransformerShape
__all__ = ["classic_attention", "classic_core", "projection_ops", "core_ops", "scaled",
           "attention_flops_per_token", "projection_widths"]


def classic_attention(model: TransformerShape) -> bool:
    """Grouped-query attention on every layer without a window or gate: the 2023 layer."""
    return model.attention == "gqa" and model.window is None and not model.attention_gate


def classic_core(model: TransformerShape) -> bool:
    """Attention of query width hidden on every layer, no window: 4 x layers x hidden x seq
    FLOPs per token forward (attention_flops_per_token in general)."""
    return classic_attention(model) and model.heads * model.head_dim == model.hidden


def scaled(op: Op, share: float) -> Op:
    """An operation standing for `share` of the layers: FLOPs and bytes scaled (its shape
    kept, so its efficiency is the full operation's)."""
    if share == 1.0:
        return op
    return replace(op, flops=op.flops * share, bytes=op.bytes * share)


def projection_widths(model: TransformerShape, heads: int) -> tuple[int, int]:
    """(query and key width, value width) of `heads` heads of an MLA layer."""
    return (heads * (model.qk_nope_head_dim + model.qk_rope_head_dim),
            heads * model.v_head_dim)


def projection_ops(model: TransformerShape, tokens: int, heads: int, e: int) -> list[Op]:
    """MLA's projections before attention on a rank computing `heads` heads."""
    h = model.hidden
    qk, _ = projection_widths(model, heads)
    if model.q_lora_rank is not None:
        q = [_matmul("q_down", tokens, h, model.q_lora_rank, e),
             _matmul("q_up", tokens, model.q_lora_rank, qk, e)]
    else:
        q = [_matmul("q", tokens, h, qk, e)]
    latent = model.kv_lora_rank + model.qk_rope_head_dim
    up = heads * (model.qk_nope_head_dim + model.v_head_dim)
    return q + [_matmul("kv_down", tokens, h, latent, e),
                _matmul("kv_up", tokens, model.kv_lora_rank, up, e)]


def core_ops(model: TransformerShape, b: int, s: int, seq: int, heads: int, kv_heads: int,
             e: int, kernel: str, mix: LayerMix | None = None) -> list[Op]:
    """The attention core of a mean layer: `s` query positions per sequence on this rank
    against the keys of the whole `seq` (global layers) or of the window (windowed ones),
    of the model's layers or those of `mix` (a pipeline chunk's)."""
    w, layers = ((windowed_layers(model), model.layers) if mix is None
                 else (mix.windowed, mix.layers))
    kinds = [(layers - w, attention_span(model, seq, False)),
             (w, attention_span(model, seq, True))]
    out: list[Op] = []
    for count, span in kinds:
        if count == 0:
            continue
        share = count / layers
        if model.attention == "mla":
            ops = _mla_core(model, b, s, int(span), heads, e, kernel)
        else:
            ops = _attention_ops(b, s, heads, kv_heads, model.head_dim, e, kernel,
                                 s_kv=int(span))
        out += [scaled(op, share) for op in ops]
    return out


def _mla_core(model: TransformerShape, b: int, s: int, s_kv: int, heads: int, e: int,
              kernel: str) -> list[Op]:
    """MLA's core: scores over qk_nope + qk_rope wide heads, values v_head_dim wide (every
    head has its own keys and values once expanded)."""
    dqk = model.qk_nope_head_dim + model.qk_rope_head_dim
    dv = model.v_head_dim
    if kernel == "flash":
        flops = 2.0 * b * heads * s * s_kv * (dqk + dv)
        traffic = float(e * b * heads * (s * (dqk + dv) + s_kv * (dqk + dv)))
        return [Op("attention", "matmul", flops, traffic, s, s_kv, dqk, b * heads)]
    scores = float(b) * heads * s * s_kv
    return [
        _matmul("scores", s, dqk, s_kv, e, count=b * heads),
        _vector("softmax", scores, e, passes=2, grad_traffic=1.5),
        _vector("dropout", scores, e, passes=2 + 1 / e, grad_traffic=1.0),
        _matmul("attend", s, s_kv, dv, e, count=b * heads),
    ]


def attention_flops_per_token(model: TransformerShape, seq: int) -> float:
    """Forward FLOPs of the attention core per token over all layers (scores and weighted
    values, counted over the full square as MFU conventions do; windows bound it):
    2 x span x (query width + value width) per layer, 4 x hidden x seq for 2023's models."""
    total = 0.0
    w = windowed_layers(model)
    width = query_width(model) + value_width(model)
    for count, windowed in ((model.layers - w, False), (w, True)):
        total += count * 2.0 * attention_span(model, seq, windowed) * width
    return total
