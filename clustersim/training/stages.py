"""How a model's layers are split over pipeline stages, evenly or as evenly as possible.

With pp x interleave = S chunks (global stages) and L layers, each chunk gets ceil(L / S)
layers, and the S x ceil(L / S) - L layers too many are taken one each from the chunks that
also hold other work: the first chunk (the embedding), the last one (the output layer and
loss), then inwards from both ends (chunk 1, chunk S - 2, ...). This is Llama 3's layout for
405B (126 layers on 16 stages: "we reduce one Transformer layer each from the first and the
last stages", Llama 3 paper, section 3.3.2), and what Megatron-LM's
`--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers` give. When S
divides L every chunk has L / S layers, as before. Every chunk needs at least one layer
(S <= L).

Pipeline rank d holds chunks d, d + pp, d + 2 pp, ... (interleaved schedules).
"""

from __future__ import annotations

import functools

__all__ = ["chunk_layers", "rank_layers", "rank_layer_indices", "StageSplitError"]


class StageSplitError(ValueError):
    """More chunks than layers: some stage would hold no layer."""


@functools.lru_cache(maxsize=4096)
def chunk_layers(layers: int, chunks: int) -> tuple[int, ...]:
    """Layers of each of `chunks` global chunks (see the module doc)."""
    if chunks < 1 or layers < 1:
        raise StageSplitError(f"{layers} layers over {chunks} stages: both must be at least 1")
    if chunks > layers:
        raise StageSplitError(f"{layers} layers over pp x interleave = {chunks} stages: a stage "
                              f"would hold no layer")
    base = -(-layers // chunks)
    counts = [base] * chunks
    for i in range(chunks * base - layers):  # fewer than `chunks`
        # 0, S-1, 1, S-2, ...: the ends first.
        counts[i // 2 if i % 2 == 0 else chunks - 1 - i // 2] -= 1
    return tuple(counts)


@functools.lru_cache(maxsize=4096)
def rank_layers(layers: int, pp: int, interleave: int = 1) -> tuple[int, ...]:
    """Layers each pipeline rank holds (all its chunks)."""
    counts = chunk_layers(layers, pp * interleave)
    return tuple(sum(counts[c * pp + d] for c in range(interleave)) for d in range(pp))


@functools.lru_cache(maxsize=4096)
def rank_layer_indices(layers: int, pp: int, interleave: int, rank: int) -> tuple[int, ...]:
    """Indices (from 0) of the layers pipeline rank `rank` holds: those of its chunks rank,
    rank + pp, ... (which layers they are says which have experts)."""
    counts = chunk_layers(layers, pp * interleave)
    held = []
    for c in range(interleave):
        g = c * pp + rank
        start = sum(counts[:g])
        held.extend(range(start, start + counts[g]))
    return tuple(held)
