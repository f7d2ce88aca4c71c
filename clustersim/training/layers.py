"""What follows from a transformer's shape, layer by layer: which layers have experts and
which attend through a window, the weights of each part, and the KV cache a token leaves.

Counts follow the Hugging Face implementations of each family (the configs are cited in
catalog/models.yaml): grouped-query attention has Q (heads x head_dim), K and V
(kv_heads x head_dim each) and O; multi-head latent attention (DeepSeek-V2/V3) compresses
queries to `q_lora_rank` and keys and values to a `kv_lora_rank` latent plus one shared
rotary key of `qk_rope_head_dim`, expanded per head to `qk_nope_head_dim` keys and
`v_head_dim` values, with an RMSNorm on each compressed vector. Biases are not counted
(GPT-OSS's are 0.03% of its weights).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustersim.training.transformer import TransformerShape

__all__ = [
    "attention_parameters",
    "parameter_count",
    "moe_layer_indices",
    "is_moe_layer",
    "windowed_layers",
    "is_windowed_layer",
    "attention_span",
    "mean_attention_span",
    "query_width",
    "value_width",
    "head_widths",
    "kv_elements_per_token",
    "kv_elements_per_token_per_layer",
    "layer_weights",
    "WEIGHT_BYTES_PER_ELEMENT",
    "compute_precision",
]


def is_moe_layer(model: TransformerShape, index: int) -> bool:
    """Whether layer `index` (from 0) has experts: none of the first dense_layers, then
    every moe_every-th (Llama 4 Maverick's interleave_moe_layer_step: layers 1, 3, 5, ...)."""
    if not model.moe or index < model.dense_layers:
        return False
    return (index - model.dense_layers + 1) % model.moe_every == 0


def moe_layer_indices(model: TransformerShape) -> list[int]:
    return [i for i in range(model.layers) if is_moe_layer(model, i)]


def is_windowed_layer(model: TransformerShape, index: int) -> bool:
    """Whether layer `index` attends through the window: all layers, or all but every
    global_every-th (GPT-OSS: even layers slide, odd are global; Llama 4: every 4th is
    global, its NoPE layers)."""
    if model.window is None:
        return False
    if model.global_every is None:
        return True
    return (index + 1) % model.global_every != 0


def windowed_layers(model: TransformerShape) -> int:
    if model.window is None:
        return 0
    if model.global_every is None:
        return model.layers
    return model.layers - model.layers // model.global_every


def attention_span(model: TransformerShape, seq: int, windowed: bool) -> float:
    """Keys each query of a `seq`-token sequence is counted against (the step model counts
    the full square as MFU conventions do, so a global layer is `seq`): a sliding window
    bounds it to `window`; a chunked layer attends within its chunk of `window` tokens."""
    if not windowed or model.window is None:
        return float(seq)
    return float(min(seq, model.window))


def mean_attention_span(model: TransformerShape, seq: int) -> float:
    """attention_span averaged over the layers (exactly `seq` without a window)."""
    if model.window is None:
        return float(seq)
    w = windowed_layers(model)
    return ((model.layers - w) * float(seq) + w * attention_span(model, seq, True)) / model.layers


def query_width(model: TransformerShape) -> int:
    """Width of the queries (and keys) of all heads: heads x head_dim, or with MLA heads x
    (nope + rope part)."""
    if model.attention == "mla":
        return model.heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
    return model.heads * model.head_dim


def value_width(model: TransformerShape) -> int:
    """Width of the attention output before the output projection."""
    if model.attention == "mla":
        return model.heads * model.v_head_dim
    return model.heads * model.head_dim


def head_widths(model: TransformerShape) -> tuple[int, int]:
    """(key width, value width) of one key-value head as attention reads it: head_dim
    each, or with MLA (expanded per head, as trained) qk_nope + qk_rope and v_head_dim."""
    if model.attention == "mla":
        return model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    return model.head_dim, model.head_dim


def attention_parameters(model: TransformerShape) -> int:
    """Weights of one layer's attention (projections and, where the model has them, the
    q/k head norms, the output gate's projection or MLA's latent norms)."""
    h = model.hidden
    if model.attention == "mla":
        q_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        if model.q_lora_rank is not None:
            q = h * model.q_lora_rank + model.q_lora_rank + model.q_lora_rank * model.heads * q_head
        else:
            q = h * model.heads * q_head
        kv = (h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
              + model.kv_lora_rank * model.heads * (model.qk_nope_head_dim + model.v_head_dim))
        return q + kv + model.heads * model.v_head_dim * h
    d = model.head_dim
    kv_width = model.n_kv_heads * d
    q_width = model.heads * d
    norms = 2 * d if model.qk_norm else 0
    gate = h * q_width if model.attention_gate else 0
    return h * (q_width + 2 * kv_width) + q_width * h + norms + gate


def layer_weights(model: TransformerShape, moe_layer: bool, active: bool) -> int:
    """FFN weights of one layer: a dense FFN, or the routed experts (top_k of them when
    `active`), the shared experts and the router."""
    if not moe_layer:
        return model.dense_ffn_parameters
    routed = model.top_k if active else model.experts
    return (model.expert_parameters * (routed + model.shared_experts)
            + model.router_parameters)


def parameter_count(model: TransformerShape, tied: bool, active: bool,
                    input_embedding: bool = True) -> int:
    """See TransformerShape.parameter_count."""
    h = model.hidden
    moe = model.moe_layers
    dense = model.layers - moe
    per_layer = attention_parameters(model) + 2 * h
    ffn = moe * layer_weights(model, True, active) + dense * layer_weights(model, False, active)
    if tied:
        embeddings = model.vocab * h
    else:
        embeddings = model.vocab * h * (2 if input_embedding else 1)
    encoder = 0 if active else model.encoder_parameters
    return model.layers * per_layer + ffn + embeddings + h + encoder


def kv_elements_per_token_per_layer(model: TransformerShape) -> int:
    """Values one token leaves in one layer's KV cache: keys and values of the KV heads, or
    with MLA the latent and the shared rotary key (kv_lora_rank + qk_rope_head_dim)."""
    if model.attention == "mla":
        return model.kv_lora_rank + model.qk_rope_head_dim
    return 2 * model.n_kv_heads * model.head_dim


def kv_elements_per_token(model: TransformerShape, context: int | None = None) -> float:
    """KV-cache values per token of context, over all layers. With a window and a
    `context` of tokens, a windowed layer keeps at most `window` tokens, so its share is
    scaled by min(1, window / context); without `context`, every layer counts in full."""
    per_layer = kv_elements_per_token_per_layer(model)
    if context is None or model.window is None or context <= 0:
        return float(model.layers * per_layer)
    w = windowed_layers(model)
    kept = min(1.0, model.window / context)
    return per_layer * ((model.layers - w) + w * kept)


# Bytes per weight as stored. MX formats (OCP Microscaling Formats v1.0): blocks of 32
# elements share one 8-bit scale, so MXFP8 is 8 + 8/32 bits and MXFP4 4 + 8/32 (GPT-OSS
# stores its experts so: "4.25 bits per parameter" in its model card).
WEIGHT_BYTES_PER_ELEMENT = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0,
                            "mxfp8": 33 / 32, "mxfp4": 17 / 32}


def compute_precision(weight_precision: str, tflops: dict[str, float]) -> str:
    """The precision a chip computes weights stored in `weight_precision` at: their own
    where the chip has a peak for it (Trn3's MXFP8), otherwise bf16 (weight-only: stored
    small, expanded to bf16 to compute)."""
    if weight_precision in tflops:
        return weight_precision
    return "bf16"
