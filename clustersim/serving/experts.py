"""What a mixture-of-experts layer costs one serving iteration: the experts its tokens reach.

A decode iteration of B sequences routes each token to `top_k` of the layer's `experts`
routed experts. Only the experts some token reaches run, so only their weights are read from
HBM: under uniform routing, each expert is missed by one token with probability 1 - k/E, so
by B tokens with probability (1 - k/E)^B, and the expected number of distinct experts is

    D(B) = E x (1 - (1 - k/E)^B)

(k at B = 1, rising towards E as the batch grows). Real routers are skewed: `skew` in [0, 1)
concentrates the tokens on a (1 - skew) share of the experts (D computed over that many),
which reaches the same k at batch 1 and saturates sooner. The shared experts (DeepSeek-V3,
Llama 4) see every token and are read every iteration, as are the router's weights.

Expert parallelism (`ep` > 1) splits a layer's routed experts over `ep` groups of the
replica's ranks (each expert sharded over the tp / ep ranks of its group). A rank then reads
the experts its group holds that some token reaches; the iteration waits for the busiest
group, whose count is computed exactly: the distribution of the distinct experts reached (a
Markov chain over the tokens, each adding a hypergeometric number of new experts), and for
each count d the expected maximum over the groups of a d-subset of the experts drawn
uniformly (multivariate hypergeometric), which sees that the groups share the d: at batch 1
some group holds a whole reached expert. Tokens travel to their experts' groups
and back: two all-to-alls per MoE layer (dispatch and combine) over the expert group, each
rank sending its share of the routed tokens' hidden states.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from clustersim.training.transformer import TransformerShape
from clustersim.training.workload import Op, _matmul, _vector

__all__ = ["expected_distinct_experts", "expected_busiest_group", "moe_ffn_ops",
           "dispatch_bytes_per_rank", "moe_layer_count", "EXPERT_MATMULS", "routed_expert_ops",
           "every_expert_ops", "expert_loads", "BLOCK_SIZE", "context_moe_path",
           "blockwise_blocks", "blockwise_ops"]

# neuronx-distributed (SDK 2.26) modules/moe/model_utils.py: DEFAULT_BLOCK_SIZE, the token
# slots of a forward_blockwise block (optimum-neuron passes no blockwise config of its own).
BLOCK_SIZE = 512

# The routed experts' matmuls: their weight bytes are set here (per reached expert), not by
# the iteration model's per-op weight precision pass.
EXPERT_MATMULS = ("expert_in", "expert_out")


def _effective_experts(experts: int, top_k: int, skew: float) -> float:
    return max(float(top_k), experts * (1.0 - skew))


def expected_distinct_experts(experts: int, top_k: int, tokens: float, skew: float = 0.0
                              ) -> float:
    """Expected distinct routed experts `tokens` tokens reach, each choosing `top_k` of
    `experts` (uniformly, or concentrated on a (1 - skew) share of them)."""
    if tokens <= 0:
        return 0.0
    if top_k >= experts:
        return float(experts)
    e = _effective_experts(experts, top_k, skew)
    return e * (1.0 - (1.0 - top_k / e) ** tokens)


@lru_cache(maxsize=4096)
def expected_busiest_group(experts: int, top_k: int, tokens: int, groups: int,
                           skew: float = 0.0) -> float:
    """Expected reached experts of the busiest of `groups` equal groups of experts; D itself
    when there is one group. Exact under uniform routing: sum over d of P(d distinct experts
    reached) x E[busiest group | d reached, spread uniformly over the experts]. A skew
    concentrates the routing on (1 - skew) E experts (the reached ones still spread over
    every group): interpolated between the whole counts around it."""
    if groups <= 1:
        return expected_distinct_experts(experts, top_k, tokens, skew)
    tokens = int(tokens)
    if tokens <= 0:
        return 0.0
    per = experts // groups
    if top_k >= experts:
        return float(per)
    active = _effective_experts(experts, top_k, skew)
    low = int(math.floor(active))
    given = _busiest_given_reached(experts, groups)
    value = float(_distinct_pmf(low, top_k, tokens) @ given[:low + 1])
    if active > low:
        high = float(_distinct_pmf(low + 1, top_k, tokens) @ given[:low + 2])
        value += (active - low) * (high - value)
    return value


def _log_comb(log_fact: np.ndarray, n: np.ndarray | int, r: np.ndarray | int) -> np.ndarray:
    """log C(n, r), -inf where r < 0 or r > n."""
    n, r = np.asarray(n), np.asarray(r)
    ok = (r >= 0) & (r <= n)
    rs, ns = np.where(ok, r, 0), np.where(ok, n, 0)
    return np.where(ok, log_fact[ns] - log_fact[rs] - log_fact[ns - rs], -np.inf)


def _log_factorials(n: int) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1)))))


@lru_cache(maxsize=64)
def _distinct_powers(experts: int, top_k: int) -> list[np.ndarray]:
    """The distinct-experts chain's one-token transition matrix (row c: c experts reached;
    a token's top_k choices add r new ones with the hypergeometric probability
    C(E - c, r) C(c, k - r) / C(E, k)); its powers 2, 4, ... are appended as needed."""
    log_fact = _log_factorials(experts)
    c = np.arange(experts + 1)[:, None]
    r = np.arange(top_k + 1)[None, :]
    prob = np.exp(_log_comb(log_fact, experts - c, r) + _log_comb(log_fact, c, top_k - r)
                  - _log_comb(log_fact, experts, top_k))
    step = np.zeros((experts + 1, experts + 1))
    rows = np.broadcast_to(c, prob.shape)
    cols = np.minimum(rows + r, experts)
    np.add.at(step, (rows, cols), prob)
    return [step]


def _distinct_pmf(experts: int, top_k: int, tokens: int) -> np.ndarray:
    """P(d distinct experts reached by `tokens` tokens), d = 0..experts: the chain's state
    after `tokens` steps from 0, by its cached powers of two (log2(tokens) products)."""
    powers = _distinct_powers(experts, top_k)
    pmf = np.zeros(experts + 1)
    pmf[0] = 1.0
    bit = 0
    while tokens >> bit:
        if bit == len(powers):
            square = powers[-1] @ powers[-1]
            powers.append(square / square.sum(axis=1, keepdims=True))  # rounding drift
        if (tokens >> bit) & 1:
            pmf = pmf @ powers[bit]
        bit += 1
    return pmf


@lru_cache(maxsize=64)
def _busiest_given_reached(experts: int, groups: int) -> np.ndarray:
    """E[most reached experts in one of `groups` groups of E/groups | d reached, a uniform
    d-subset], d = 0..experts: sum over j of 1 - P(every group <= j | d). That probability
    is built a group at a time: P(the first g + 1 groups <= j | s among them) sums over the
    new group's i <= j (hypergeometric: C(n, i) C(g n, s - i) / C((g + 1) n, s)) of
    P(the first g <= j | s - i among them), all in [0, 1]."""
    per = experts // groups
    log_fact = _log_factorials(experts)
    j = np.arange(per)[:, None]                # thresholds 0 .. per - 1
    within = np.ones((per, per + 1))           # one group: P(i <= j | i of its per)
    within[np.arange(per + 1)[None, :] > j] = 0.0
    seen = per
    for _ in range(groups - 1):
        total = seen + per
        s = np.arange(total + 1)
        after = np.zeros((per, total + 1))
        for i in range(per + 1):
            weight = np.exp(_log_comb(log_fact, per, i) + _log_comb(log_fact, seen, s - i)
                            - _log_comb(log_fact, total, s))
            prior = np.zeros((per, total + 1))
            lo, hi = i, min(total, seen + i)
            prior[:, lo:hi + 1] = within[:, lo - i:hi - i + 1]
            after += np.where(i <= j, weight * prior, 0.0)
        within, seen = after, total
    return (1.0 - np.minimum(within, 1.0)).sum(axis=0)


def moe_layer_count(model: TransformerShape) -> int:
    """Layers with experts (the model format's `moe_layers` where it has one)."""
    if not model.moe:
        return 0
    return int(getattr(model, "moe_layers", model.layers))


def _expert_width(model: TransformerShape) -> int:
    return int(getattr(model, "expert_ffn", model.ffn))


def moe_ffn_ops(model: TransformerShape, tokens: int, tp: int, ep: int,
                activation_bytes: float, weight_bytes: float, on_chip: bool = False,
                skew: float = 0.0, loads: float | None = None) -> list[Op]:
    """The FFN of one MoE layer on the busiest rank for an iteration of `tokens` tokens (the
    norms and residuals are the attention block's): the router, the shared experts over
    every token, and the routed experts the tokens reach, each read once. The matmuls carry
    their weight operand's bytes (k x n) once per reached expert; their FLOPs are the routed
    tokens' (top_k per token), spread evenly over the reached experts. `on_chip`: the
    tokens' operands stay in SRAM (only weights travel from HBM)."""
    h, e = model.hidden, activation_bytes
    width = _expert_width(model)
    gated = 2 if model.gated else 1
    ops: list[Op] = [_matmul("router", tokens, h, model.experts, e)]
    shared = int(getattr(model, "shared_experts", 0))
    if shared:
        shard = math.ceil(shared * width / tp)
        ops += [_matmul("mlp_in", tokens, h, shard * gated, e),
                _vector("activation", tokens * shard * (3 if model.gated else 2), e, passes=1),
                _matmul("mlp_out", tokens, shard, h, e)]
    return ops + routed_expert_ops(model, tokens, tp, ep, e, weight_bytes, on_chip, skew,
                                   loads)


def expert_loads(model: TransformerShape, tokens: int, ep: int, mode: str) -> float | None:
    """The experts' weight loads of an iteration of `tokens` tokens in one MoE layer when
    the stack loads them per token (`mode` per-token, no expert parallelism: NxD's
    selective loading, each token's top-k by itself, while tokens x top_k <= experts, its
    threshold of 1.0; every expert beyond it, forward_all_experts): min(tokens x top_k,
    experts), continuous at the threshold. None: each reached expert once (`distinct`)."""
    if mode != "per-token" or not model.moe or ep > 1 or tokens <= 0:
        return None
    return float(min(tokens * model.top_k, model.experts))


def routed_expert_ops(model: TransformerShape, tokens: int, tp: int, ep: int,
                      activation_bytes: float, weight_bytes: float, on_chip: bool = False,
                      skew: float = 0.0, loads: float | None = None) -> list[Op]:
    """The routed experts' part of `moe_ffn_ops`: each reached expert's two matmuls over its
    share of the tokens, and their activation. `loads` (`expert_loads`): that many expert
    loads instead of the distinct experts reached."""
    e = activation_bytes
    reached = loads if loads is not None else \
        expected_busiest_group(model.experts, model.top_k, tokens, ep, skew)
    if reached <= 0:
        return []
    width = _expert_width(model)
    # An expert is sharded over the tp / ep ranks of its group.
    shard_ranks = max(1, tp // ep)
    n_in = math.ceil(width * (2 if model.gated else 1) / shard_ranks)
    n_out = math.ceil(width / shard_ranks)
    # The busiest group's share of the routed tokens (top_k per token, spread over the
    # groups), over its reached experts: rows per expert matmul.
    routed = tokens * model.top_k / ep
    rows = max(1, math.ceil(routed / reached))
    a = 0.0 if on_chip else e
    h = model.hidden
    return [_expert_matmul("expert_in", rows, h, n_in, a, weight_bytes, reached, reached),
            _vector("activation", routed * n_out * (3 if model.gated else 2), e, passes=1),
            _expert_matmul("expert_out", rows, n_out, h, a, weight_bytes, reached, reached)]


def every_expert_ops(model: TransformerShape, tokens: int, tp: int, activation_bytes: float,
                     weight_bytes: float, on_chip: bool = False) -> list[Op]:
    """The routed experts of one MoE layer run as NxD's ExpertMLPs forward_all_experts
    runs them in context encoding (no expert parallelism): every expert over every token,
    each rank its 1/tp column shard of every expert, every expert's weights read once. The
    experts' partial outputs (E x tokens x hidden on a rank) are scaled and summed on chip,
    tile by tile, and never travel to HBM: the port's TTFT through vLLM is about the same at
    batch 1 and 8 (8 x 512 padded tokens), which E x T x H values through HBM (1.9 GB a
    layer at 512 tokens) would not allow. The per-expert instruction streams of that combine
    are the stack's `expert_invocation_overhead`."""
    e, h, experts = activation_bytes, model.hidden, model.experts
    width = _expert_width(model)
    n_in = math.ceil(width * (2 if model.gated else 1) / tp)
    n_out = math.ceil(width / tp)
    rows = max(1, tokens)
    a = 0.0 if on_chip else e
    return [_expert_matmul("expert_in", rows, h, n_in, a, weight_bytes, experts, experts),
            _vector("activation", experts * rows * n_out * (3 if model.gated else 2), e,
                    passes=1),
            # its (small) input and the partial outputs stay on chip
            _expert_matmul("expert_out", rows, n_out, h, 0.0, weight_bytes, experts, experts)]


def _expert_matmul(name: str, rows: int, k: int, n: int, activation_bytes: float,
                   weight_bytes: float, reached: float, count: float) -> Op:
    """`reached` experts' matmuls (rows x k by k x n each; a fractional expectation scales
    the FLOPs and bytes), `count` of them for wave quantisation: the routed path passes the
    expectation itself, as a rounding of it against fractional FLOPs made the time fall
    between two roundings as the tokens grew."""
    flops = 2.0 * rows * k * n * reached
    traffic = (activation_bytes * (rows * k + rows * n) + weight_bytes * k * n) * reached
    return Op(name, "matmul", flops, float(traffic), rows, n, k, count)


def dispatch_bytes_per_rank(model: TransformerShape, tokens: int, ep: int,
                            hidden_bytes: int) -> float:
    """One all-to-all's buffer on each rank of the expert group (dispatch or combine): its
    share of the routed tokens' hidden states (top_k copies of each token)."""
    return tokens * model.top_k * model.hidden * hidden_bytes / ep


def context_moe_path(tokens: int, top_k: int, experts: int, block_size: int = BLOCK_SIZE
                     ) -> str:
    """The path NxD's ExpertMLPsV2.forward (SDK 2.26, inference, capacity_factor None, no
    expert parallelism) takes for a context-encoding graph of `tokens` tokens: `selective`
    (forward_selective_loading) while tokens x top_k / experts < 1.0, its selective loading
    threshold; `all-experts` (forward_all_experts) while tokens x top_k < block_size;
    `blockwise` (forward_blockwise) beyond."""
    if tokens * top_k < experts:  # tokens x top_k / experts < 1.0
        return "selective"
    if tokens * top_k < block_size:
        return "all-experts"
    return "blockwise"


def blockwise_blocks(tokens: int, top_k: int, experts: int, block_size: int = BLOCK_SIZE
                     ) -> int:
    """forward_blockwise's block count: the worst case of the tokens' routing (E - 1
    experts with one routed token each, a block apiece, the rest on one expert),
    ceil((T k - (E - 1)) / B) + E - 1, at most T k. Every block runs, full or padded."""
    routed = tokens * top_k
    return min(-(-(routed - (experts - 1)) // block_size) + experts - 1, routed)


def blockwise_ops(model: TransformerShape, tokens: int, tp: int, activation_bytes: float,
                  weight_bytes: float, block_size: int = BLOCK_SIZE) -> list[Op]:
    """The routed experts of one MoE layer as forward_blockwise runs them (no expert
    parallelism): each of `blockwise_blocks` blocks is one expert's two matmuls over
    block_size token rows (padded slots included), its rank's 1/tp column shard of that
    expert's weights read for the block; the block's rows travel from HBM by its gather of
    the tokens' hidden states and back by the scatter-add of its output into them (read and
    written): 3 x block_size x hidden values a block, on every rank (the tokens' hidden
    states are whole on each)."""
    e, h = activation_bytes, model.hidden
    blocks = blockwise_blocks(tokens, model.top_k, model.experts, block_size)
    width = _expert_width(model)
    n_in = math.ceil(width * (2 if model.gated else 1) / tp)
    n_out = math.ceil(width / tp)
    rows = blocks * block_size
    return [_expert_matmul("expert_in", block_size, h, n_in, 0.0, weight_bytes, blocks, blocks),
            _vector("activation", rows * n_out * (3 if model.gated else 2), e, passes=1),
            _expert_matmul("expert_out", block_size, n_out, h, 0.0, weight_bytes, blocks,
                           blocks),
            _vector("block_rows", rows * h, e, passes=3)]
