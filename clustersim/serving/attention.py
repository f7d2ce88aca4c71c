"""Serving attention beyond grouped-query: multi-head latent attention (MLA) and windowed
layers, as a replica's iterations see them.

MLA (DeepSeek-V2 and V3; DeepSeek-AI 2024, section 2.1.1): the cache holds, per token and
layer, one compressed latent of `kv_lora_rank` values and one rotary key of
`qk_rope_head_dim` values shared by all heads (576 for DeepSeek-V3, against 128 heads x
(192 + 128) = 40,960 keys and values uncompressed). Every head needs the whole latent, so
tensor parallelism over heads does not split the cache: each rank holds all of it (vLLM and NxD
Inference replicate it over the TP group). Decode runs absorbed (the key up-projection folded
into the query, the value up-projection applied after attention): per context token a head
scores the query against the latent and rotary key (kv_lora_rank + qk_rope_head_dim) and
accumulates the latent (kv_lora_rank), and the rank reads the latent once for all its heads.
A prompt runs unabsorbed: its keys and values are decompressed (the projection's FLOPs on
every context token) and attention runs at head width qk_nope + qk_rope for the scores and
v_head_dim for the values.

Windowed layers (`window`, `window_kind`, `global_every`): at a decode iteration a sequence
holding `c` tokens reads, on each windowed layer, the keys and values its token attends to:
min(c, window) on a sliding-window layer (GPT-OSS: 128 tokens on every other layer), c mod
window on a chunked one (Llama 4: 8,192-token chunks on three layers of four; its position in
its chunk, about half a chunk on average once the context passes one). Both are c less an
excess (`window_excess`), 0 until the context reaches the window, so a window no request
reaches costs exactly what no window does; `window_excess_sum` is the excess summed over a
run of iterations in closed form. A prompt's attention on a windowed layer scores each query
against the keys of its window (`window_pairs`). Sliding-window layers keep at most `window`
tokens per sequence in the KV cache (`kv_bytes_per_token`).
"""

from __future__ import annotations

import math

from clustersim.training.transformer import TransformerShape
from clustersim.training.workload import Op, _matmul, _vector

__all__ = ["is_mla", "layer_split", "kv_values_per_token_layer",
           "kv_bytes_per_token", "mla_projection_ops", "mla_decode_ops", "mla_prefill_ops",
           "sliding_window", "decode_window", "window_split", "window_excess",
           "window_excess_sum", "window_pairs", "window_prefill", "sequence_kv_bytes"]


def is_mla(model: TransformerShape) -> bool:
    return getattr(model, "attention", "gqa") == "mla"


def sliding_window(model: TransformerShape) -> int | None:
    """The sliding window's tokens, or None (no window, or a chunked one)."""
    window = getattr(model, "window", None)
    if window is None or getattr(model, "window_kind", "sliding") != "sliding":
        return None
    return int(window)


def decode_window(model: TransformerShape) -> tuple[int, str] | None:
    """(window tokens, kind) of a model's windowed layers, sliding or chunked, or None."""
    window = getattr(model, "window", None)
    if window is None:
        return None
    return int(window), str(getattr(model, "window_kind", "sliding"))


def window_split(model: TransformerShape) -> tuple[int, int]:
    """(global layers, windowed layers), sliding or chunked: every `global_every`-th layer
    attends to the whole context (all layers windowed without it)."""
    if decode_window(model) is None:
        return model.layers, 0
    every = getattr(model, "global_every", None)
    global_layers = model.layers // every if every else 0
    return global_layers, model.layers - global_layers


def window_excess(window: int, kind: str, context: float) -> float:
    """Tokens of a `context`-token sequence a windowed layer does not read at a decode
    iteration: context - min(context, window) sliding, context - (context mod window)
    chunked (the earlier chunks'). 0 while the context is below the window."""
    if context < window:
        return 0.0
    if kind == "sliding":
        return context - window
    return context - math.fmod(context, window)


def _triangle(first: float, n: float, step: float) -> float:
    """first + (first + step) + ... over n terms."""
    return n * first + step * n * (n - 1) / 2.0


def _reaching(context: float, growth: float, level: float, least: int) -> int:
    """The first t >= least with context + growth t >= level, as that sum rounds."""
    t = max(least, math.ceil((level - context) / growth))
    while t > least and context + growth * (t - 1) >= level:
        t -= 1
    while context + growth * t < level:
        t += 1
    return t


def window_excess_sum(window: int, kind: str, context: float, iterations: int,
                      growth: float = 1.0) -> float:
    """sum over t < iterations of window_excess(context + growth t), in closed form: split
    where the context reaches the window (sliding: 0 before, context - window after; chunked:
    window x the chunks passed, constant over each chunk)."""
    n = int(iterations)
    if n <= 0 or growth <= 0:
        return float(n * window_excess(window, kind, context)) if n > 0 else 0.0
    first = _reaching(context, growth, window, 0)
    if first >= n:
        return 0.0
    if kind == "sliding":
        k = n - first
        return _triangle(context + growth * first - window, k, growth)
    # chunked: iterations t with context + growth t in [j w, (j + 1) w) add j w each
    total = 0.0
    t = first
    while t < n:
        chunks = math.floor((context + growth * t) / window)
        end = min(n, _reaching(context, growth, (chunks + 1) * window, t + 1))
        total += (end - t) * chunks * window
        t = end
    return total


def window_pairs(window: int, kind: str, chunk: int, context: int) -> float:
    """Query-key pairs of a prompt chunk of `chunk` tokens after `context` earlier ones on a
    windowed layer, causally: query q (0-based position) scores min(q + 1, window) keys
    (sliding) or (q mod window) + 1 (chunked). Below the window: the global layer's
    chunk x context + chunk (chunk + 1) / 2."""
    if kind == "sliding":
        below = max(0, min(context + chunk, window - 1) - context)  # queries q + 1 < window
        return (below * context + below * (below + 1) / 2.0) + (chunk - below) * window
    total = 0.0
    q = context
    while q < context + chunk:  # one run per chunk of the window the queries cross
        start = q - q % window
        end = min(context + chunk, start + window)
        first, last = q - start + 1, end - start  # spans of its first and last query
        total += (first + last) * (end - q) / 2.0
        q = end
    return total


def window_prefill(window: int, kind: str, chunk: int, context: int) -> tuple[int, int]:
    """(earlier tokens, span) of a windowed layer's prompt chunk of `chunk` tokens after
    `context`: the earlier tokens its queries' windows reach (sliding: the window - 1 before
    the chunk; chunked: those of the chunk's first window since it began), and the span of
    keys a global layer's would need for as many query-key pairs (the global span scaled by
    its causal pairs over a global layer's, which counts the chunk's full square, as the
    training workload does)."""
    span = context + chunk
    causal = chunk * context + chunk * (chunk + 1) / 2.0
    narrow = max(1, round(span * window_pairs(window, kind, chunk, context) / causal))
    earlier = min(context, window - 1) if kind == "sliding" else context % window
    return earlier, narrow


def layer_split(model: TransformerShape, longest_sequence: int | None = None
                ) -> tuple[int, int]:
    """(layers whose KV cache grows with the context, sliding-window layers whose cache is
    bounded): every `global_every`-th layer attends to the whole context (all layers
    windowed without it). A window no sequence passes (`longest_sequence` tokens at most)
    bounds nothing: its layers hold the whole context, as global ones do."""
    window = sliding_window(model)
    if window is None or (longest_sequence is not None and longest_sequence <= window):
        return model.layers, 0
    every = getattr(model, "global_every", None)
    global_layers = model.layers // every if every else 0
    return global_layers, model.layers - global_layers


def kv_values_per_token_layer(model: TransformerShape) -> int:
    """Values one token adds to one layer's cache: MLA's latent and rotary key, or keys and
    values of every KV head."""
    if is_mla(model):
        return int(model.kv_lora_rank + model.qk_rope_head_dim)
    return 2 * model.n_kv_heads * model.head_dim


def kv_bytes_per_token(model: TransformerShape, element_bytes: float,
                       longest_sequence: int | None = None) -> float:
    """Bytes one token adds to the whole model's KV cache. Sliding-window layers hold at
    most `window` tokens per sequence: bounded, they are left to the HBM reserve, unless
    every layer is windowed (then they are counted in full, an upper bound) or no sequence
    (of at most `longest_sequence` tokens) passes the window. A chunked layer's cache (its
    current chunk, up to `window` tokens) is counted per token: exact within the first
    chunk, an upper bound past it."""
    global_layers, windowed = layer_split(model, longest_sequence)
    layers = global_layers if global_layers else windowed
    return float(layers * kv_values_per_token_layer(model) * element_bytes)


def sequence_kv_bytes(model: TransformerShape, element_bytes: float, tokens: int,
                      longest_sequence: int | None = None) -> float:
    """Bytes a sequence of `tokens` tokens holds in the whole model's KV cache (what a
    disaggregated prefill sends): kv_bytes_per_token's layers per token, and the sliding
    layers it leaves out their last min(tokens, window) tokens."""
    global_layers, windowed = layer_split(model, longest_sequence)
    per_layer = kv_values_per_token_layer(model) * element_bytes
    if not (global_layers and windowed):
        return tokens * kv_bytes_per_token(model, element_bytes, longest_sequence)
    return per_layer * (tokens * global_layers + min(tokens, model.window) * windowed)


def mla_projection_ops(model: TransformerShape, tokens: int, heads: int, tp: int,
                       e: float) -> list[Op]:
    """MLA's projections of one layer for `tokens` tokens on a rank computing `heads` heads
    (in place of GQA's qkv and output projection): query (through its low-rank compression
    where the model has one), the latent and rotary key, the latent's up-projection to keys
    and values (decode's absorbed form has the same weights and FLOPs per token), and the
    output projection. The compressions' weights are split over the tp ranks."""
    h = model.hidden
    nope, rope, v = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    latent = model.kv_lora_rank
    q_rank = getattr(model, "q_lora_rank", None)
    q_width = heads * (nope + rope)
    ops = []
    if q_rank:
        ops += [_matmul("qkv", tokens, h, math.ceil(q_rank / tp), e),
                _vector("q_norm", tokens * q_rank, e, passes=2),
                _matmul("qkv", tokens, q_rank, q_width, e)]
    else:
        ops.append(_matmul("qkv", tokens, h, q_width, e))
    ops += [_matmul("qkv", tokens, h, math.ceil((latent + rope) / tp), e),
            _vector("kv_norm", tokens * latent, e, passes=2),
            _matmul("qkv", tokens, latent, heads * (nope + v), e),
            _matmul("projection", tokens, heads * v, h, e)]
    return ops


def compressed_widths(model: TransformerShape) -> tuple[int, ...]:
    """MLA's compressed vectors a token carries into its norms: the query's (where the
    model compresses it) and the key-value latent with the rotary key."""
    q_rank = getattr(model, "q_lora_rank", None)
    latent = model.kv_lora_rank + model.qk_rope_head_dim
    return (q_rank, latent) if q_rank else (latent,)


def mla_decode_ops(model: TransformerShape, heads: int, context: int, kv_e: float
                   ) -> list[Op]:
    """Absorbed decode attention of one sequence's token over `context` cached tokens on a
    rank with `heads` heads: scores against latent and rotary key, then the latent
    accumulated; the latent is read once (the second matmul's operand traffic is its
    scores)."""
    latent, rope = model.kv_lora_rank, model.qk_rope_head_dim
    scores = _matmul("scores", heads, latent + rope, context, kv_e)
    flops = 2.0 * heads * context * latent
    attend = Op("attend", "matmul", flops, float(kv_e * heads * (context + latent)),
                heads, latent, context, 1)
    return [scores, attend]


def mla_prefill_ops(model: TransformerShape, chunk: int, context: int, heads: int,
                    e: float, kv_e: float, span: int | None = None) -> list[Op]:
    """A prompt chunk of `chunk` tokens over `context` earlier tokens plus itself on a rank
    with `heads` heads, unabsorbed: the earlier tokens' latents decompressed to keys and
    values (the chunk's own are in the projections), then fused attention at head width
    qk_nope + qk_rope for the scores and v_head_dim for the values, over `span` keys
    (default context + chunk; a windowed layer's: window_prefill)."""
    nope, rope, v = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    latent = model.kv_lora_rank
    span = context + chunk if span is None else span
    ops = []
    if context:
        ops.append(_matmul("decompress", context, latent, heads * (nope + v), kv_e))
    ops += [_matmul("scores", chunk, nope + rope, span, e, count=heads),
            _matmul("attend", chunk, span, v, e, count=heads),
            _vector("attention_io", chunk * heads * (nope + rope + v), e, passes=1),
            _vector("kv_io", (context + chunk) * (latent + rope), kv_e, passes=1)]
    return ops
