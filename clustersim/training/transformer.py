"""Decoder-only transformer shapes and their presets (Llama 2/3/3.1, GPT-3, Megatron, Mixtral,
and the 2025 mixtures: DeepSeek-V3, Qwen3, Llama 4, GPT-OSS).

The shape is all the step model needs to count FLOPs, bytes and memory; the presets are data
(`catalog/models.yaml`) with the paper or model card each came from.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from clustersim.catalog import read_catalog
from clustersim.hardware import limits
from clustersim.hardware.spec import KeyedError, Spec

__all__ = ["TransformerShape", "model_preset_names", "model_preset_values", "model_preset_source",
           "ShardedHeads", "sharded_heads"]


# id of a shape already checked -> a weak reference to it (`TransformerShape._check`)
_CHECKED: dict[int, weakref.ref] = {}


class TransformerShape(Spec):
    """Shape of a decoder transformer: dense, or a mixture of experts (`experts` FFNs per
    layer, each token routed to `top_k` of them, beside `shared_experts` every token
    passes through), with grouped-query (`gqa`) or multi-head latent (`mla`) attention,
    optionally windowed on some layers. training.layers holds what follows from it (layer
    kinds, parameter counts, KV bytes); docs/models.md describes every variant."""

    name: str = "custom"
    layers: int = Field(gt=0, le=limits.MAX_LAYERS)
    hidden: int = Field(gt=0, le=limits.MAX_HIDDEN)
    heads: int = Field(gt=0, le=limits.MAX_HEADS)
    kv_heads: int | None = Field(default=None, gt=0, le=limits.MAX_HEADS,
                                 description="defaults to heads (no GQA; mla: heads only)")
    head_dim: int | None = Field(default=None, gt=0, le=limits.MAX_HIDDEN,
                                 description="width of one attention head (query width = "
                                 "heads x head_dim, independent of hidden); defaults to "
                                 "hidden / heads (mla: its ranks set the widths, none)")
    ffn_hidden: int | None = Field(default=None, gt=0, le=4 * limits.MAX_HIDDEN,
                                   description="dense FFN width; defaults to 4 x hidden")
    vocab: int = Field(gt=0, le=limits.MAX_VOCAB)
    seq_len: int = Field(default=2048, gt=0, le=limits.MAX_SEQ_LEN,
                         description="default training sequence length")
    gated: bool = Field(default=False, description="SwiGLU-style FFN with three matrices")
    experts: int = Field(default=1, gt=0, le=limits.MAX_EXPERTS,
                         description="routed FFN experts per MoE layer (1: dense)")
    top_k: int = Field(default=1, gt=0, le=limits.MAX_EXPERTS,
                       description="routed experts each token is sent to")
    expert_ffn_hidden: int | None = Field(default=None, gt=0, le=4 * limits.MAX_HIDDEN,
                                          description="width of one expert's FFN (routed "
                                          "and shared); defaults to ffn_hidden")
    shared_experts: int = Field(default=0, ge=0, le=limits.MAX_EXPERTS,
                                description="experts of each MoE layer every token passes "
                                "through (DeepSeek-V3, Llama 4)")
    dense_layers: int = Field(default=0, ge=0, le=limits.MAX_LAYERS,
                              description="the first k layers have a dense FFN of ffn_hidden "
                              "(DeepSeek-V3: 3)")
    moe_every: int = Field(default=1, gt=0, le=limits.MAX_LAYERS,
                           description="after the dense layers, every n-th layer is a MoE "
                           "layer and the others dense (Llama 4 Maverick: 2, layers 2, 4, "
                           "...; its interleave_moe_layer_step)")
    attention: Literal["gqa", "mla"] = Field(
        default="gqa", description="gqa: multi-head or grouped-query attention; mla: "
        "multi-head latent attention (DeepSeek-V2/V3) with the ranks below")
    q_lora_rank: int | None = Field(default=None, gt=0, le=limits.MAX_HIDDEN,
                                    description="mla: rank of the query compression "
                                    "(none: queries projected directly)")
    kv_lora_rank: int | None = Field(default=None, gt=0, le=limits.MAX_HIDDEN,
                                     description="mla: rank of the key-value latent (cached)")
    qk_rope_head_dim: int | None = Field(default=None, gt=0, le=limits.MAX_HIDDEN,
                                         description="mla: rotary part of a query/key head "
                                         "(its key part is shared by the heads and cached)")
    qk_nope_head_dim: int | None = Field(default=None, gt=0, le=limits.MAX_HIDDEN,
                                         description="mla: non-rotary part of a query/key head")
    v_head_dim: int | None = Field(default=None, gt=0, le=limits.MAX_HIDDEN,
                                   description="mla: width of a value head")
    qk_norm: bool = Field(default=False, description="RMSNorm weights on each query and key "
                          "head (Qwen3)")
    attention_gate: bool = Field(default=False, description="gated attention: a sigmoid gate "
                                 "on every element of the attention output before its "
                                 "projection, projected from the layer's input (hidden x "
                                 "heads x head_dim weights; Trinity)")
    window: int | None = Field(default=None, gt=0, le=limits.MAX_SEQ_LEN,
                               description="tokens a windowed layer attends to: the last "
                               "`window` (sliding) or those of its chunk (chunked); none: "
                               "every layer attends to the whole context")
    window_kind: Literal["sliding", "chunked"] = Field(
        default="sliding", description="with a window: sliding (GPT-OSS: 128) or chunked "
        "(Llama 4: 8,192)")
    global_every: int | None = Field(default=None, gt=0, le=limits.MAX_LAYERS,
                                     description="with a window, every n-th layer attends "
                                     "globally (GPT-OSS: 2, Llama 4: 4; from 2 to layers); "
                                     "none: every layer is windowed")
    tied_embeddings: bool = Field(default=False, description="the output layer shares the "
                                  "input embedding's weights")
    encoder_parameters: int = Field(default=0, ge=0, le=10**13,
                                    description="weights of a modality encoder (Llama 4's "
                                    "vision encoder) counted in the parameters but not "
                                    "simulated")

    @model_validator(mode="before")
    @classmethod
    def _default_head_dim(cls, data: Any) -> Any:
        """head_dim defaults to hidden / heads (kept as a value, so `model.head_dim` is
        always the head width)."""
        if isinstance(data, dict) and data.get("head_dim") is None:
            hidden, heads = data.get("hidden"), data.get("heads")
            if (isinstance(hidden, int) and isinstance(heads, int) and heads > 0
                    and not isinstance(hidden, bool) and not isinstance(heads, bool)):
                if hidden % heads and data.get("attention") != "mla":  # (MLA's: unused)
                    raise KeyedError("heads", f"does not divide hidden ({hidden}); give "
                                     "head_dim", heads)
                data = {**data, "head_dim": hidden // heads}
        return data

    @model_validator(mode="after")
    def _check(self) -> TransformerShape:
        # Pydantic runs an "after" validator again on an instance given to a field, and a
        # million generated jobs share a few shapes: each instance is checked once (kept
        # outside it: a private attribute would take part in equality).
        key = id(self)
        known = _CHECKED.get(key)
        if known is not None and known() is self:
            return self
        self._check_values()
        _CHECKED[key] = weakref.ref(self, lambda _, key=key: _CHECKED.pop(key, None))
        return self

    def _check_values(self) -> None:
        if self.top_k > self.experts:
            raise KeyedError("top_k", f"more than the model's {self.experts} experts",
                             self.top_k)
        if self.heads % self.n_kv_heads:
            raise KeyedError("kv_heads", f"expected a divisor of heads ({self.heads})",
                             self.n_kv_heads)
        moe_only = {"shared_experts": self.shared_experts, "dense_layers": self.dense_layers,
                    "expert_ffn_hidden": self.expert_ffn_hidden,
                    "moe_every": self.moe_every if self.moe_every != 1 else None}
        for key, value in moe_only.items():
            if value and not self.moe:
                raise KeyedError(key, "needs a mixture of experts (experts > 1)", value)
        if self.moe and self.moe_layers == 0:
            if self.dense_layers == 0:  # moe_every alone is past the last layer
                raise KeyedError("moe_every", f"leaves none of the {self.layers} layers a MoE "
                                 f"layer; expected at most {self.layers}", self.moe_every)
            raise KeyedError("dense_layers", f"with moe_every {self.moe_every}, leaves none of "
                             f"the {self.layers} layers a MoE layer", self.dense_layers)
        ranks = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        if self.attention == "mla":
            missing = [k for k in ranks if getattr(self, k) is None]
            if missing:
                raise KeyedError("attention", f"needs {', '.join(missing)}", "mla")
            for key in ("attention_gate", "qk_norm"):  # no MLA model has either
                if getattr(self, key):
                    raise KeyedError(key, "only with attention: gqa (no MLA model has it)",
                                     True)
            # MLA's heads are qk_nope + qk_rope wide (v_head_dim for values) and it has no
            # KV heads: a head_dim or kv_heads of their own would go unused
            if self.head_dim != self.hidden // self.heads:
                raise KeyedError("head_dim", "unused with attention: mla (its widths are "
                                 "qk_nope_head_dim + qk_rope_head_dim and v_head_dim)",
                                 self.head_dim)
            if self.n_kv_heads != self.heads:
                raise KeyedError("kv_heads", "unused with attention: mla (every head reads "
                                 "the one latent); expected none, or heads", self.n_kv_heads)
        else:
            given = [k for k in (*ranks, "q_lora_rank") if getattr(self, k) is not None]
            if given:
                raise KeyedError(given[0], "only with attention: mla"
                                 + (f" (and {', '.join(given[1:])})" if given[1:] else ""),
                                 getattr(self, given[0]))
        if self.window is None and self.global_every is not None:
            raise KeyedError("global_every", "needs a window", self.global_every)
        if self.window is None and self.window_kind != "sliding":  # (a dump has the default)
            raise KeyedError("window_kind", "needs a window", self.window_kind)
        if self.window is not None and self.global_every == 1:
            raise KeyedError("global_every", "makes every layer global, so no layer uses the "
                             "window; expected at least 2, or no window", 1)
        if self.window is not None and (self.global_every or 0) > self.layers:
            raise KeyedError("global_every", f"leaves none of the {self.layers} layers global; "
                             f"expected at most {self.layers}, or none (every layer windowed)",
                             self.global_every)

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def expert_ffn(self) -> int:
        return self.expert_ffn_hidden if self.expert_ffn_hidden is not None else self.ffn

    @property
    def moe(self) -> bool:
        return self.experts > 1

    @property
    def moe_layers(self) -> int:
        """Layers with experts: after the dense_layers, every moe_every-th (none if dense)."""
        if not self.moe:
            return 0
        return max(0, self.layers - self.dense_layers) // self.moe_every

    @property
    def uniform(self) -> bool:
        """Every layer's FFN alike (all dense or all MoE, no shared experts, experts as wide
        as the dense FFN): the FFN counts of 2023's models, kept as they were."""
        return (self.moe_layers in (0, self.layers) and self.shared_experts == 0
                and self.expert_ffn_hidden is None)

    @property
    def expert_parameters(self) -> int:
        """Weights of one FFN expert of one layer (2 or 3 matrices)."""
        return (3 if self.gated else 2) * self.hidden * self.expert_ffn

    @property
    def dense_ffn_parameters(self) -> int:
        """Weights of the FFN of a dense layer."""
        return (3 if self.gated else 2) * self.hidden * self.ffn

    @property
    def router_parameters(self) -> int:
        """Router weights of a MoE layer."""
        return self.hidden * self.experts if self.moe else 0

    @property
    def attention_parameters(self) -> int:
        """Weights of one layer's attention (training.layers.attention_parameters)."""
        from clustersim.training.layers import attention_parameters
        return attention_parameters(self)

    def parameter_count(self, tied_embeddings: bool | None = None, active: bool = False,
                        input_embedding: bool = True) -> int:
        """Weights: attention (Q, K, V, O, or MLA's projections; Qwen3's q/k norms), FFNs
        (dense layers', and per MoE layer the routed experts, shared experts and router),
        2 norms per layer, embeddings (tied or not), the final norm, an encoder's.

        `active`: with only the top_k routed experts a token uses (and no encoder);
        `input_embedding=False` leaves out the input embedding (a lookup, not a matmul), as
        DeepSeek's and OpenAI's active counts do. Biases are not counted."""
        from clustersim.training.layers import parameter_count
        tied = self.tied_embeddings if tied_embeddings is None else tied_embeddings
        return parameter_count(self, tied, active, input_embedding)

    @property
    def active_parameters(self) -> int:
        return self.parameter_count(active=True)


@dataclass(frozen=True)
class ShardedHeads:
    """Attention heads over a tensor-parallel group, laid out as NxD lays them out."""

    heads: int  # query heads after padding (a multiple of tp)
    kv_heads: int  # KV heads after replication or padding
    per_rank: int  # query heads each rank computes
    kv_per_rank: int  # KV heads each rank holds

    def padded(self, model: TransformerShape) -> bool:
        return self.heads != model.heads

    def extra_attention_parameters_per_rank(self, model: TransformerShape, tp: int) -> float:
        """Weights a rank holds beyond its 1/tp share of a layer's attention: the padded
        query heads' (Q, K, V, the output projection and the gate, where the model has
        one), and the K and V projections of the KV heads replicated or converted to reach
        one per rank (8 KV heads at tp 64: each rank holds a whole head's, not an eighth of
        one). Zero when tp divides both the heads and the KV heads."""
        d = model.head_dim
        q = 3 if model.attention_gate else 2  # Q, the output projection (and the gate)
        held = model.hidden * d * (q * self.per_rank + 2 * self.kv_per_rank)
        share = model.hidden * d * (q * model.heads + 2 * model.n_kv_heads) / tp
        return held - share


def sharded_heads(model: TransformerShape, tp: int) -> ShardedHeads:
    """NxD's layout (neuronx-distributed's GQA sharding: get_shardable_head_counts): query
    heads are padded with zero heads up to a multiple of tp; KV heads are replicated to one
    per rank when tp is a multiple of them, and otherwise converted to one per query head
    (multi-head attention) when tp does not divide them; multi-head models pad both alike.
    Llama 2 13B (40 heads) at tp 32 computes 64 heads, two per rank."""
    heads = -(-model.heads // tp) * tp
    kv = model.n_kv_heads
    if kv == model.heads:
        kv = heads
    elif kv < tp or kv % tp:
        kv = tp if tp % kv == 0 else heads
    return ShardedHeads(heads, kv, heads // tp, kv // tp)


def _document() -> dict[str, Any]:
    return read_catalog("models")


def model_preset_names() -> list[str]:
    return list(_document()["models"])


def model_preset_values(name: str) -> dict[str, Any]:
    """Preset as a plain mapping (raises KeyError for an unknown name)."""
    values = {k: v for k, v in _document()["models"][name].items() if k != "source"}
    return {"name": name, **values}


def model_preset_source(name: str) -> str:
    document = _document()
    return document["sources"][document["models"][name]["source"]]
