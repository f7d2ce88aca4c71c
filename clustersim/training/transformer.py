"""Decoder-only transformer shapes and their presets (Llama 2/3/3.1, GPT-3, Megatron, and the
Mixtral mixture of experts).

The shape is all the step model needs to count FLOPs, bytes and memory; the presets are data
(`catalog/models.yaml`) with the paper or model card each came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from clustersim.catalog import read_catalog
from clustersim.hardware import limits
from clustersim.hardware.spec import Spec

__all__ = ["TransformerShape", "model_preset_names", "model_preset_values", "model_preset_source",
           "ShardedHeads", "sharded_heads"]


class TransformerShape(Spec):
    """Shape of a decoder transformer: dense, or a mixture of experts (`experts` FFNs per
    layer, each token routed to `top_k` of them)."""

    name: str = "custom"
    layers: int = Field(gt=0, le=limits.MAX_LAYERS)
    hidden: int = Field(gt=0, le=limits.MAX_HIDDEN)
    heads: int = Field(gt=0, le=limits.MAX_HEADS)
    kv_heads: int | None = Field(default=None, gt=0, le=limits.MAX_HEADS,
                                 description="defaults to heads (no GQA)")
    ffn_hidden: int | None = Field(default=None, gt=0, le=4 * limits.MAX_HIDDEN,
                                   description="defaults to 4 x hidden")
    vocab: int = Field(gt=0, le=limits.MAX_VOCAB)
    seq_len: int = Field(default=2048, gt=0, le=limits.MAX_SEQ_LEN,
                         description="default training sequence length")
    gated: bool = Field(default=False, description="SwiGLU-style FFN with three matrices")
    experts: int = Field(default=1, gt=0, le=limits.MAX_EXPERTS,
                         description="FFN experts per layer (1: dense)")
    top_k: int = Field(default=1, gt=0, le=limits.MAX_EXPERTS,
                       description="experts each token is routed to")

    @model_validator(mode="after")
    def _check(self) -> TransformerShape:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} is more than the {self.experts} experts")
        if self.heads % self.n_kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.n_kv_heads}")
        return self

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def moe(self) -> bool:
        return self.experts > 1

    @property
    def expert_parameters(self) -> int:
        """Weights of one FFN expert of one layer (2 or 3 matrices)."""
        return (3 if self.gated else 2) * self.hidden * self.ffn

    @property
    def router_parameters(self) -> int:
        return self.hidden * self.experts if self.moe else 0

    def parameter_count(self, tied_embeddings: bool = False, active: bool = False) -> int:
        """Weights: attention (Q, K, V, O), FFN (2 or 3 matrices, per expert, plus the router),
        2 norms per layer, embeddings; `active`: with only the top_k experts a token uses.

        Llama-style models have untied input and output embeddings; biases are not counted.
        """
        kv_width = self.n_kv_heads * self.head_dim
        attention = self.hidden * (self.hidden + 2 * kv_width) + self.hidden * self.hidden
        ffn = self.expert_parameters * (self.top_k if active else self.experts)
        ffn += self.router_parameters
        norms = 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if tied_embeddings else 2)
        return self.layers * (attention + ffn + norms) + embeddings + self.hidden


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
        """Weights a rank holds beyond its 1/tp share of a layer's attention when the query
        heads are padded (Q, K, V and the output projection of the padded heads); zero when
        tp divides the heads."""
        if not self.padded(model):
            return 0.0
        d = model.head_dim
        held = model.hidden * d * (2 * self.per_rank + 2 * self.kv_per_rank)
        share = model.hidden * d * (2 * model.heads + 2 * model.n_kv_heads) / tp
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
