"""Activation memory of the mean layer of a model whose layers differ (MLA, windows, dense
and MoE layers, shared experts, uneven routing): Korthikanti et al.'s count per layer
(training.workload.activation_bytes_per_layer, which hands such models here), with

- the attention's tensors at their own widths: queries and the output projection's input
  (heads x head_dim, or with MLA heads x (qk_nope + qk_rope) queries, as wide keys and
  heads x v_head_dim values), keys and values (KV heads x head_dim), and a gated output's
  gate and the output it multiplies;
- MLA's latents (q_lora_rank, kv_lora_rank + qk_rope_head_dim), replicated over tensor
  parallelism like the down-projections that make them;
- the FFN intermediates of the mean layer (training.experts.ffn_activation_width);
- unfused attention's scores (kept without recompute) over each layer's span of keys.
"""

from __future__ import annotations

from typing import Any

from clustersim.training.experts import expert_load, ffn_activation_width
from clustersim.training.layers import mean_attention_span
from clustersim.training.transformer import sharded_heads

__all__ = ["mean_layer_activation_bytes"]


def mean_layer_activation_bytes(job: Any, attention: str, element_bytes: int,
                                share: float | None = None) -> float:
    """Bytes one rank keeps for one micro-batch of one mean layer (see the module) of
    layers whose `share` are MoE layers (default the model's)."""
    model, par = job.model, job.parallelism
    b, t = job.micro_batch, par.tp
    seq = job.sequence_length
    s, h = seq // par.cp, model.hidden
    e = element_bytes
    sbh = s * b * h
    if job.recompute == "full":
        return e * sbh / (t if par.sequence_parallel else 1)
    layout = sharded_heads(model, t)
    if model.attention == "mla":
        qk = layout.heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
        v = layout.heads * model.v_head_dim
        attention_split = (2 * qk + 2 * v) / h  # Q, K, V and the projection's input
        latents = ((model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim) / h
    else:
        q = layout.heads * model.head_dim
        kv = layout.kv_heads * model.head_dim
        # (a gated output keeps the gate's sigmoid and the output it multiplies)
        gate = 2 * q if model.attention_gate else 0
        attention_split = (2 * q + 2 * kv + gate) / h
        latents = 0.0
    load = expert_load(job) if model.moe else 1.0
    replicated = e * sbh * (4 + latents)
    split = e * sbh * (attention_split + ffn_activation_width(model, load, share))
    if job.recompute == "none" and attention == "unfused":
        split += 5.0 * model.heads * s * mean_attention_span(model, seq) * b
    if par.sequence_parallel:
        return (replicated + split) / t
    return replicated + split / t
