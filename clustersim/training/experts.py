"""Mixtures of experts in training: the FFN work of a mean layer, the weights a rank holds,
the expert-parallel all-to-all's bytes, and routing's imbalance.

A model's layers are dense (its `dense_layers`, and between MoE layers when `moe_every` > 1)
or MoE (routed experts, shared experts and a router). A pipeline rank's weights, gradients,
optimizer state and activations are those of the layers it holds (`stage_moe_share`: the
share of them that are MoE layers; DeepSeek-V3's first ranks hold its dense layers); so is
a pipeline chunk's work: its own layers' operations, each layer of its kind, and one
dispatch and combine per MoE layer it holds (training.layer_mix). The model's mean layer
(each kind weighted by its share of all the layers) stands for a chunk whose shares are
the model's.

Routing (job keys): `routing_imbalance` is the busiest expert-parallel rank's routed tokens
over the mean (1: balanced, as auxiliary-loss-free balancing aims for); a synchronous step
waits for the busiest rank, so its expert GEMMs, their activations and the tokens it
receives scale by it. `capacity_factor` caps every expert at that multiple of the mean
(tokens beyond it dropped) and pads every expert up to it, as GShard/Switch-style
capacity-based dispatch does: the busiest rank's load is then the capacity factor. Without
one (dropless, as Megatron-Core's and DeepSeek-V3's training), the load is the imbalance.

Expert parallelism: per MoE layer the routed tokens (top_k copies of each) go to the ranks
holding their experts and come back, an all-to-all each way (dispatch and combine), forward
and again backward; collectives.CollectiveModel prices it on the group's real levels (the
Trn2 instance torus, the UltraServer Z rings, EFA; a Trn3 UltraServer's NeuronSwitch).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from clustersim.training.attention import scaled
from clustersim.training.layers import is_moe_layer
from clustersim.training.ops import Op, _matmul, _vector
from clustersim.training.stages import rank_layer_indices

if TYPE_CHECKING:
    from clustersim.training.transformer import TransformerShape
__all__ = ["expert_load", "local_experts", "moe_share", "ffn_ops", "ffn_activation_width",
           "dispatch_bytes", "expert_weights_per_layer", "dense_weights_per_layer",
           "router_weights_per_layer", "stage_moe_share", "DEFAULT_ROUTING_IMBALANCE"]

DEFAULT_ROUTING_IMBALANCE = 1.0


def expert_load(job: Any) -> float:
    """The busiest expert rank's routed tokens over the mean (see the module): the
    capacity factor where one is given (every expert padded to it), else the routing
    imbalance, at most ep (one rank cannot receive more than every rank's tokens) and 1
    without expert parallelism (a rank holding every expert sees every routed token)."""
    if not job.model.moe:
        return 1.0
    capacity = getattr(job, "capacity_factor", None)
    if capacity is not None:
        return float(capacity)
    imbalance = float(getattr(job, "routing_imbalance", None) or DEFAULT_ROUTING_IMBALANCE)
    return min(imbalance, float(job.parallelism.ep)) if job.parallelism.ep > 1 else 1.0


def moe_share(model: TransformerShape) -> float:
    """Share of the layers that are MoE layers."""
    return model.moe_layers / model.layers


@functools.lru_cache(maxsize=4096)  # (asked for every stage of many planned candidates)
def stage_moe_share(model: TransformerShape, pp: int, interleave: int, rank: int) -> float:
    """Share of the layers pipeline rank `rank` holds that are MoE layers (the model's when
    pp x interleave exceeds the layers, a split the scenario's rules refuse)."""
    if not model.moe or pp == 1 or pp * interleave > model.layers:
        return moe_share(model)
    held = rank_layer_indices(model.layers, pp, interleave, rank)
    return sum(1 for i in held if is_moe_layer(model, i)) / len(held)


def local_experts(model: TransformerShape, ep: int | None) -> int:
    """Routed experts one rank holds (1 for a dense model, or when `ep` is None: the
    experts' work taken as one GEMM, as serving's iteration model does)."""
    if not model.moe or ep is None:
        return 1
    return max(1, model.experts // ep)


def ffn_ops(model: TransformerShape, tokens: int, routed_tokens: float, router_tokens: int,
            ffn_per_rank: int, expert_ffn_per_rank: int, e: int, local: int = 1,
            share: float | None = None) -> list[Op]:
    """FFN operations of a mean layer on one rank: the dense FFN (its share of the layers),
    and for MoE layers the router, the routed experts on `routed_tokens` (top_k x tokens x
    the load) and the shared experts on every token; `share`: of layers of which that share
    are MoE layers (default the model's; a pipeline chunk's: training.layer_mix).

    The routed experts of a rank are a grouped GEMM: `local` experts, each on its share of
    the routed tokens and with its own weights, so the HBM traffic has every held expert's
    weights and a small share makes short, poorly tiled GEMMs (why expert parallelism pays
    beyond memory)."""
    gate = 2 if model.gated else 1
    acts = 3 if model.gated else 2
    share = moe_share(model) if share is None else share
    ops: list[Op] = []
    if share < 1.0:
        dense = [_matmul("mlp_in", tokens, model.hidden, ffn_per_rank * gate, e),
                 _vector("activation", tokens * ffn_per_rank * acts, e, passes=1),
                 _matmul("mlp_out", tokens, ffn_per_rank, model.hidden, e)]
        ops += [scaled(op, 1.0 - share) for op in dense]
    if share > 0.0:
        routed = int(round(routed_tokens))
        per_expert = routed / local if local > 1 else routed
        moe = [_matmul("router", router_tokens, model.hidden, model.experts, e),
               _matmul("mlp_in", per_expert, model.hidden, expert_ffn_per_rank * gate, e,
                       count=local),
               _vector("activation", routed * expert_ffn_per_rank * acts, e, passes=1),
               _matmul("mlp_out", per_expert, expert_ffn_per_rank, model.hidden, e,
                       count=local)]
        if model.shared_experts:
            width = expert_ffn_per_rank * model.shared_experts
            moe += [_matmul("shared_in", tokens, model.hidden, width * gate, e),
                    _vector("shared_activation", tokens * width * acts, e, passes=1),
                    _matmul("shared_out", tokens, width, model.hidden, e)]
        ops += [scaled(op, share) for op in moe]
    return ops


def ffn_activation_width(model: TransformerShape, load: float,
                         share: float | None = None) -> float:
    """FFN intermediates kept for backward per token of a mean layer (of layers whose
    `share` are MoE layers: default the model's), in units of hidden: (gate and up, or up,
    plus the activation's output) x the FFN width, for the dense FFN and for top_k x load
    routed and the shared experts."""
    per_width = (2 if model.gated else 1) + 1
    share = moe_share(model) if share is None else share
    dense = (1.0 - share) * per_width * model.ffn / model.hidden
    moe = share * per_width * model.expert_ffn / model.hidden * (
        model.top_k * load + model.shared_experts)
    return dense + moe


def dispatch_bytes(job: Any, activation_bytes: float) -> float:
    """Bytes one rank sends in one MoE layer's dispatch (and again in its combine): its
    share over tensor parallelism of the routed copies of its tokens, times the load."""
    return activation_bytes * job.model.top_k / job.parallelism.tp * expert_load(job)


# The weights of a mean layer below: of layers whose `share` are MoE layers (default the
# model's: all its layers; a pipeline rank's, stage_moe_share, for the layers it holds).
def expert_weights_per_layer(model: TransformerShape, share: float | None = None) -> float:
    """Routed experts' weights of a mean layer (the part expert parallelism splits)."""
    if not model.moe:
        return 0.0
    return (moe_share(model) if share is None else share) * model.experts * (
        model.expert_parameters)


def router_weights_per_layer(model: TransformerShape, share: float | None = None) -> float:
    """Router weights of a mean layer (replicated over tensor parallelism)."""
    return (moe_share(model) if share is None else share) * model.router_parameters


def dense_weights_per_layer(model: TransformerShape, share: float | None = None) -> float:
    """Weights of a mean layer other than routed experts and router: attention, norms, the
    dense FFN's share and the shared experts' (split over tensor parallelism)."""
    share = moe_share(model) if share is None else share
    ffn = (1.0 - share) * model.dense_ffn_parameters + share * (
        model.shared_experts * model.expert_parameters)
    return model.attention_parameters + 2 * model.hidden + ffn
