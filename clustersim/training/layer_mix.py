"""Which kinds of layer each pipeline chunk holds, so a chunk's passes are those of its own
layers rather than the model's mean layer.

A model's layers differ in two ways the step costs: dense or MoE (`dense_layers`,
`moe_every`: DeepSeek-V3's first 3 layers dense, Llama 4 Maverick's every other one) and
global or windowed attention (`window`, `global_every`). A chunk of pipeline layers
(`stages.chunk_layers`) holds some of each: its `LayerMix` counts them. Its operations are
those of its layers, each of its own kind (`LayerMix.kinds`: training.mean_layer of one
layer of that kind); its expert all-to-alls are one dispatch and one combine per MoE layer
it holds (none when it holds none), and ZeRO-3 gathers the weights of its mean layer. So a
chunk of more MoE layers than the model's mean takes longer, and the pipeline waits for it.

A chunk whose shares are the model's gets None: the model's mean layer, as every chunk of
a model whose layers are alike (then nothing differs from the mean-layer step).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

from clustersim.training.layers import is_moe_layer, is_windowed_layer, windowed_layers
from clustersim.training.stages import chunk_layers

if TYPE_CHECKING:
    from clustersim.training.transformer import TransformerShape
__all__ = ["LayerMix", "chunk_mixes", "model_mix"]


class LayerMix(NamedTuple):
    """The layers of a chunk (or of a model): how many, how many MoE, how many windowed and
    how many both."""

    layers: int
    moe: int
    windowed: int
    moe_windowed: int = 0

    @property
    def moe_share(self) -> float:
        return self.moe / self.layers

    def kinds(self) -> tuple[tuple[LayerMix, int], ...]:
        """Each kind of layer held (a LayerMix of one layer) and how many of it."""
        return _kinds(self)

    def same_shares(self, other: LayerMix) -> bool:
        """Whether both hold the same shares of MoE and of windowed layers (exactly)."""
        return (self.moe * other.layers == other.moe * self.layers
                and self.windowed * other.layers == other.windowed * self.layers)


def model_mix(model: TransformerShape) -> LayerMix:
    """The model's own layers."""
    return LayerMix(model.layers, model.moe_layers if model.moe else 0, windowed_layers(model),
                    sum(1 for i in range(model.layers)
                        if is_moe_layer(model, i) and is_windowed_layer(model, i)))


@functools.lru_cache(maxsize=4096)
def _kinds(mix: LayerMix) -> tuple[tuple[LayerMix, int], ...]:
    both = mix.moe_windowed
    counts = {(1, 1): both, (1, 0): mix.moe - both, (0, 1): mix.windowed - both,
              (0, 0): mix.layers - mix.moe - mix.windowed + both}
    return tuple((LayerMix(1, moe, windowed, moe * windowed), count)
                 for (moe, windowed), count in counts.items() if count > 0)


@functools.lru_cache(maxsize=4096)  # (asked for every candidate the planner bounds)
def chunk_mixes(model: TransformerShape, chunks: int) -> tuple[LayerMix | None, ...]:
    """Each of `chunks` global chunks' LayerMix (`stages.chunk_layers` says which layers),
    None where its shares are the model's."""
    whole = model_mix(model)
    out: list[LayerMix | None] = []
    start = 0
    for count in chunk_layers(model.layers, chunks):
        held = range(start, start + count)
        start += count
        moe = [is_moe_layer(model, i) for i in held]
        windowed = [is_windowed_layer(model, i) for i in held]
        mix = LayerMix(count, sum(moe), sum(windowed),
                       sum(m and w for m, w in zip(moe, windowed, strict=True)))
        out.append(None if mix.same_shares(whole) else mix)
    return tuple(out)
