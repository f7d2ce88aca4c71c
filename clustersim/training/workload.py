"""What a training step asks of the hardware: the FLOPs and bytes of a dense transformer.

Counts are per rank (one tensor-parallel shard of one pipeline stage) for one micro-batch,
following Megatron-LM's layout (Narayanan et al. 2021; Korthikanti et al. 2022):

- per layer, forward: QKV projection (grouped-query aware), attention scores and the
  attention-weighted values (the quadratic term, counted in full as MFU conventions do),
  output projection, MLP (two matrices, or three when gated), two norms and residual adds;
- the embedding lookup on the first stage; the output layer and loss on the last;
- backward is twice the forward matrix work; recompute adds the attention core (selective)
  or the whole forward (full) to the backward pass.

The attention kernel is a property of the job (`attention`, defaulting to the hardware
family's usual stack, `framework.attention` in the catalog); FLOPs are the same either way:

- `flash` (FlashAttention, Dao et al. 2022; NeuronX Distributed's NKI kernel; Megatron-Core
  and Transformer Engine on GPUs): the s x s scores stay on chip, so HBM sees Q, K, V and the
  output only, and nothing of size s x s is kept for the backward pass;
- `unfused` (Megatron-LM of 2021-22: a QK^T GEMM, the fused scale-mask-softmax kernel,
  dropout, then the attention-over-values GEMM): the scores are written, read and written by
  softmax, read and written by dropout with a 1-byte mask, and read by the second GEMM; the
  softmax output, the dropout mask and output are kept for backward (Korthikanti et al.'s
  5as/h term per layer) unless recompute drops them.

Selective recompute recomputes the attention core (Korthikanti et al. 2022): the two GEMMs,
and with `unfused` also softmax and dropout and their HBM traffic; with `flash` the kernel's
forward.
Memory per rank is in `memory`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import Field

from clustersim.hardware import limits
from clustersim.hardware.precision import BYTES_PER_ELEMENT
from clustersim.hardware.spec import Spec
from clustersim.training.attention import (
    attention_flops_per_token,
    classic_attention,
    classic_core,
)
from clustersim.training.experts import (
    dispatch_bytes,
    expert_load,
    local_experts,
    moe_share,
)
from clustersim.training.layer_mix import LayerMix
from clustersim.training.layers import head_widths
from clustersim.training.mean_layer import mean_layer_ops
from clustersim.training.ops import Op, _attention_ops, _matmul, _vector
from clustersim.training.transformer import TransformerShape, sharded_heads

__all__ = [
    "Degrees",
    "ParallelismSpec",
    "TrainingJob",
    "Op",
    "StageWork",
    "layer_forward_ops",
    "model_flops_per_step",
    "hardware_flops_per_step",
    "stage_work",
    "cp_exchange_per_layer",
    "OPTIMIZER_BYTES_TOUCHED_PER_PARAM",
    "ATTENTION_KERNELS",
    "ATTENTION_CORE",
    "attention_of",
]

# One Adam step reads fp32 master weight, gradient, m and v, writes master, m, v and the
# 2-byte compute copy: 4 x 4 + 3 x 4 + 2 bytes per parameter.
OPTIMIZER_BYTES_TOUCHED_PER_PARAM = 30


class Degrees:
    """What follows from the degrees (shared by the scenario's spec and the planner's light
    stand-in for it), whose classes give tp, cp, pp, dp, zero and shard."""

    @property
    def ranks(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def replicas(self) -> int:
        """Ranks holding the same (dense) weights: dp x cp."""
        return self.dp * self.cp

    @property
    def shard_ranks(self) -> int:
        """Ranks a ZeRO shard group spreads the state over (1 without ZeRO)."""
        if self.zero == 0:
            return 1
        return self.shard if self.shard is not None else self.replicas


class ParallelismSpec(Spec, Degrees):
    """Degrees count ranks: tp x cp x pp x dp equals the job's ranks (by default rank = tp
    rank + tp x (cp rank + cp x (pp rank + pp x dp rank)); `order` and training.ranks)."""

    tp: int = Field(default=1, gt=0, le=limits.MAX_PARALLEL_DEGREE)
    pp: int = Field(default=1, gt=0, le=limits.MAX_PARALLEL_DEGREE)
    dp: int = Field(default=1, gt=0, le=limits.MAX_PARALLEL_DEGREE)
    cp: int = Field(default=1, gt=0, le=limits.MAX_PARALLEL_DEGREE,
                    description="context parallel: ranks that split each sequence between "
                    "them (attention exchanges keys and values); they hold the same weights")
    cp_comm: Literal["ring", "all-to-all"] = Field(
        default="ring", description="context parallelism's exchange: ring (keys and values "
        "passed around the cp ranks during attention, as ring attention and Megatron-Core "
        "do) or all-to-all (DeepSpeed Ulysses: heads and sequence swapped around attention)")
    zero: Literal[0, 1, 2, 3] = Field(
        default=0, description="sharded data parallelism (ZeRO stage): 1 shards the "
        "optimizer state over the data-parallel ranks, 2 also the gradients, 3 (FSDP) also "
        "the parameters, gathered layer by layer in forward and backward")
    shard: int | None = Field(
        default=None, gt=0, le=limits.MAX_PARALLEL_DEGREE,
        description="hybrid sharding: data-parallel ranks (of dp x cp) in a shard group; "
        "ZeRO shards within a group and replicates across groups (gradients all-reduced "
        "between them); default all of them")
    sequence_parallel: bool = Field(
        default=False, description="sequence parallelism (Megatron, NxD): the tp ranks split "
        "the sequence between the tensor-parallel blocks (norms, dropout); seq_len must be "
        "divisible by tp x cp")
    interleave: int = Field(default=1, gt=0, le=limits.MAX_INTERLEAVE,
                            description="virtual pipeline stages per rank")
    ep: int = Field(default=1, gt=0, le=limits.MAX_PARALLEL_DEGREE,
                    description="expert parallel: data-parallel ranks that "
                    "split a layer's experts between them (mixture-of-experts models)")
    order: Literal["tp-cp-pp-dp", "tp-cp-ep-pp-dp"] = Field(
        default="tp-cp-pp-dp", description="rank order, innermost first: tp-cp-pp-dp puts "
        "an expert group's members tp x cp x pp ranks apart (across instances once tp x cp "
        "x pp fills one); tp-cp-ep-pp-dp puts them next to tensor and context parallelism, "
        "tp x cp ranks apart, so the experts' all-to-all stays inside an instance or "
        "UltraServer while tp x cp x ep fits it (training.ranks)")


class TrainingJob(Protocol):
    """What the step model needs of a job (the scenario's JobSpec is one)."""

    model: TransformerShape
    global_batch: int
    micro_batch: int
    parallelism: ParallelismSpec
    precision: str
    recompute: str
    # `attention: "flash" | "unfused" | None` may also be given (None: the hardware's default).

    @property
    def sequence_length(self) -> int: ...


ATTENTION_KERNELS = ("flash", "unfused")


def attention_of(job: TrainingJob, default: str = "flash") -> str:
    """The job's attention kernel, or `default` (the hardware family's) when it names none."""
    kernel = getattr(job, "attention", None) or default
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention {kernel!r}: expected one of {', '.join(ATTENTION_KERNELS)}")
    return kernel


def layer_forward_ops(model: TransformerShape, micro_batch: int, seq: int, tp: int,
                      sequence_parallel: bool, precision: str, attention: str = "flash",
                      cp: int = 1, load: float = 1.0, ep: int | None = None) -> list[Op]:
    """See _layer_forward_ops (kept by its arguments: the planner asks for the same layer
    for many candidates; the operations are frozen, so they are shared)."""
    return list(_cached_layer_ops(model, micro_batch, seq, tp, sequence_parallel, precision,
                                  attention, cp, load, ep))


@functools.lru_cache(maxsize=4096)
def _cached_layer_ops(model: TransformerShape, micro_batch: int, seq: int, tp: int,
                      sequence_parallel: bool, precision: str, attention: str, cp: int,
                      load: float, ep: int | None, mix: LayerMix | None = None
                      ) -> tuple[Op, ...]:
    return tuple(_layer_forward_ops(model, micro_batch, seq, tp, sequence_parallel, precision,
                                    attention, cp, load, ep, mix))


def _layer_forward_ops(model: TransformerShape, micro_batch: int, seq: int, tp: int,
                       sequence_parallel: bool, precision: str, attention: str = "flash",
                       cp: int = 1, load: float = 1.0, ep: int | None = None,
                       mix: LayerMix | None = None) -> list[Op]:
    """Forward operations of one transformer layer on one tensor-parallel rank (of one
    context-parallel rank: `seq / cp` positions of each sequence, attending to all `seq`);
    a model with MLA, windows or mixed layers gives its mean layer (training.attention,
    training.experts; `load`: the busiest expert rank's routed tokens over the mean; `ep`:
    expert parallelism, whose rank's experts are a grouped GEMM, one per expert held; `mix`:
    a pipeline chunk's layers, whose mean layer it is, None for the model's).

    With `flash` attention the scores never reach HBM; with `unfused` they are written,
    softmaxed, dropped out and read back (b x heads x s x s values, see the module)."""
    e = BYTES_PER_ELEMENT[precision]
    b, s, h = micro_batch, seq // cp, model.hidden
    tokens = b * s
    # Heads per rank as NxD shards them: padded up to a multiple of tp, KV heads replicated
    # or converted (transformer.sharded_heads); the padded heads' work is done all the same.
    layout = sharded_heads(model, tp)
    heads, kv_heads = layout.per_rank, layout.kv_per_rank
    d = model.head_dim
    ffn = model.ffn // tp
    outside = tokens * h / (tp if sequence_parallel else 1)  # norms and residuals
    routed = tokens * model.top_k
    local = local_experts(model, ep)
    if mix is not None or not (classic_attention(model) and model.uniform and load == 1.0
                               and local == 1):
        return mean_layer_ops(model, b, s, seq, tp, sequence_parallel, e, attention, load,
                              local, mix)
    ops = [
        _vector("norm_attention", outside, e, passes=2),
        _matmul("qkv", tokens, h, (heads + 2 * kv_heads) * d, e),
        *_attention_ops(b, s, heads, kv_heads, d, e, attention, s_kv=seq),
        _matmul("projection", tokens, heads * d, h, e),
        _vector("residual_attention", outside, e, passes=3),
        _vector("norm_mlp", outside, e, passes=2),
        # Mixture of experts: a router scores every token; each token then passes through
        # top_k experts, so a rank's experts see top_k x its tokens when routing is balanced.
        # The router is replicated over tensor parallelism (on the rank's sequence shard with
        # sequence parallelism).
        *([_matmul("router", tokens // (tp if sequence_parallel else 1), h, model.experts, e)]
          if model.moe else []),
        _matmul("mlp_in", routed, h, ffn * (2 if model.gated else 1), e),
        _vector("activation", routed * ffn * (3 if model.gated else 2), e, passes=1),
        _matmul("mlp_out", routed, ffn, h, e),
        _vector("residual_mlp", outside, e, passes=3),
    ]
    return ops


def _attention_core(ops: list[Op]) -> list[Op]:
    return [op for op in ops if op.name in ATTENTION_CORE]


ATTENTION_CORE = ("attention", "scores", "softmax", "dropout", "attend")


def _output_ops(model: TransformerShape, micro_batch: int, seq: int, tp: int, precision: str
                ) -> list[Op]:
    """Final norm, output layer (vocabulary split over tp) and the fp32 loss."""
    e = BYTES_PER_ELEMENT[precision]
    tokens = micro_batch * seq
    vocab = math.ceil(model.vocab / tp)
    return [
        _vector("final_norm", tokens * model.hidden, e, passes=2),
        _matmul("logits", tokens, model.hidden, vocab, e),
        _vector("loss", tokens * vocab, 4, passes=3),
    ]


def _embedding_ops(model: TransformerShape, micro_batch: int, seq: int, precision: str
                   ) -> list[Op]:
    e = BYTES_PER_ELEMENT[precision]
    return [_vector("embedding", micro_batch * seq * model.hidden, e, passes=2)]


@dataclass(frozen=True)
class StageWork:
    """The operations of one pipeline chunk (a stage's share of layers) for one micro-batch."""

    forward: tuple[Op, ...]
    backward: tuple[Op, ...]  # including recompute
    layers: int
    tp_collectives_forward: tuple[tuple[str, float], ...]  # (op, bytes per rank) in order
    tp_collectives_backward: tuple[tuple[str, float], ...]
    first: bool
    last: bool
    ep_collectives_forward: tuple[tuple[str, float], ...] = ()  # over the expert group
    ep_collectives_backward: tuple[tuple[str, float], ...] = ()
    # The backward pass proper's TP collectives (not the recomputed forward's): those a
    # framework can run during the weight-gradient GEMMs.
    tp_collectives_overlappable: tuple[tuple[str, float], ...] = ()
    # Context parallelism's exchange over the cp group, and whether it runs during the
    # attention kernel (ring) or around it (all-to-all).
    cp_collectives_forward: tuple[tuple[str, float], ...] = ()
    cp_collectives_backward: tuple[tuple[str, float], ...] = ()
    cp_overlaps_attention: bool = False


def cp_exchange_per_layer(job: TrainingJob) -> tuple[list[tuple[str, float]],
                                                     list[tuple[str, float]]]:
    """Context parallelism's collectives of one layer for one micro-batch on one rank,
    forward and backward, as (operation, bytes of the whole buffer).

    Ring (ring attention; Megatron-Core's context parallelism): each rank's keys and values
    (2 x b x s / cp x kv heads / tp x head dim) go around the cp ranks while attention
    runs on the block already there: the traffic of an all-gather of the cp blocks, forward;
    backward the keys and values again and their gradients back (a reduce-scatter).
    All-to-all (DeepSpeed Ulysses): Q, K and V swapped from sequence to heads before
    attention and the output back after, forward and again (gradients) backward."""
    par = job.parallelism
    if par.cp == 1:
        return [], []
    model, b = job.model, job.micro_batch
    e = BYTES_PER_ELEMENT[job.precision]
    local = b * (job.sequence_length // par.cp) * e
    key, value = head_widths(model)  # (MLA: 192 and 128 wide for DeepSeek-V3)
    layout = sharded_heads(model, par.tp)
    heads, kv_heads = layout.per_rank, layout.kv_per_rank
    if par.cp_comm == "ring":
        # every rank's keys and values, gathered
        block = float(local * kv_heads * (key + value) * par.cp)
        return [("all-gather", block)], [("all-gather", block), ("reduce-scatter", block)]
    qkv = float(local * (heads * key + kv_heads * (key + value)))
    out = float(local * heads * value)
    return [("all-to-all", qkv), ("all-to-all", out)], [("all-to-all", out), ("all-to-all", qkv)]


def _backward_of(ops: list[Op]) -> list[Op]:
    """Backward of forward ops: matmuls twice (input and weight gradients), vector work twice."""
    out: list[Op] = []
    made: dict[int, tuple[Op, ...]] = {}  # a layer's ops repeat: one backward per distinct op
    for op in ops:
        grads = made.get(id(op))
        if grads is None:
            if op.kind == "matmul":
                grads = (Op(op.name + "_dgrad", "matmul", op.flops, op.bytes, op.m, op.k, op.n,
                            op.count),
                         Op(op.name + "_wgrad", "matmul", op.flops, op.bytes, op.k, op.n, op.m,
                            op.count))
            else:
                grads = (Op(op.name + "_grad", "vector", 0.0, op.grad_traffic * op.bytes),)
            made[id(op)] = grads
        out.extend(grads)
    return out


_BACKWARDS: dict[int, tuple[tuple[Op, ...], list[Op]]] = {}


def _layer_backward(layer: tuple[Op, ...]) -> list[Op]:
    """_backward_of a layer's shared operations, kept with them (by identity: the entry
    holds the layer, so its id stays its own), so its operations are shared too."""
    found = _BACKWARDS.get(id(layer))
    if found is not None and found[0] is layer:
        return found[1]
    if len(_BACKWARDS) >= 8192:
        _BACKWARDS.clear()
    backward = _backward_of(list(layer))
    _BACKWARDS[id(layer)] = (layer, backward)
    return backward


def stage_work(job: TrainingJob, layers: int, first: bool, last: bool,
               attention: str | None = None, mix: LayerMix | None = None) -> StageWork:
    """Work of one chunk of `layers` layers for one micro-batch on one tensor-parallel rank
    (`attention`: the kernel, default the job's own or flash; `mix`: which kinds of layer
    the chunk holds, `layer_mix.chunk_mixes`, None for the model's mean layer)."""
    par = job.parallelism
    model, b, seq = job.model, job.micro_batch, job.sequence_length
    s = seq // par.cp  # positions of each sequence on this rank
    load = expert_load(job) if model.moe else 1.0
    # The mean layer's operations, or those of each kind of layer the chunk holds.
    forward: list[Op] = []
    backward: list[Op] = []
    core: list[Op] = []
    if mix is not None and mix.layers != layers:
        raise ValueError(f"a mix of {mix.layers} layers for a chunk of {layers}")
    for kind, count in [(None, layers)] if mix is None else mix.kinds():
        shared = _cached_layer_ops(model, b, seq, par.tp, par.sequence_parallel,
                                   job.precision, attention or attention_of(job), par.cp,
                                   load, par.ep, kind)
        layer = list(shared)
        forward += layer * count
        # The layer's backward once, repeated (the same operations as over the whole list).
        backward += _layer_backward(shared) * count
        core += _attention_core(layer) * count
    extra_forward: list[Op] = []
    if first:
        extra_forward += _embedding_ops(model, b, s, job.precision)
    if last:
        extra_forward += _output_ops(model, b, s, par.tp, job.precision)
    backward += _backward_of(extra_forward)
    if job.recompute == "full":
        backward = list(forward) + backward
    elif job.recompute == "selective":
        backward = core + backward
    activation_bytes = float(b * s * model.hidden * BYTES_PER_ELEMENT[job.precision])
    ep_fwd: list[tuple[str, float]] = []
    ep_bwd: list[tuple[str, float]] = []
    if model.moe and par.ep > 1:
        # Per MoE layer: tokens dispatched to the ranks holding their experts and combined
        # back, an all-to-all each way (forward; the same again backward), of each TP rank's
        # share of the routed activations.
        # Mixed layers: as many pairs as the chunk's MoE layers, or without a mix its share
        # of the model's (at least one, their bytes scaled so the chunk moves its mean
        # layers' bytes).
        routed_bytes = dispatch_bytes(job, activation_bytes)
        pairs = layers if mix is None else mix.moe
        if not model.uniform and mix is None:
            pairs = max(1, round(layers * moe_share(model)))
            routed_bytes *= layers * moe_share(model) / pairs
        ep_fwd = [("all-to-all", routed_bytes)] * 2 * pairs
        ep_bwd = [("all-to-all", routed_bytes)] * 2 * pairs
        if job.recompute == "full":
            ep_bwd = ep_bwd + ep_fwd
    tp_fwd: list[tuple[str, float]] = []
    tp_bwd: list[tuple[str, float]] = []
    if par.tp > 1:
        # Per layer: attention and MLP each end (forward) and start (backward) with a
        # collective over the activations: an all-reduce, or with sequence parallelism an
        # all-gather before and a reduce-scatter after.
        if par.sequence_parallel:
            per_layer = [("all-gather", activation_bytes), ("reduce-scatter", activation_bytes)] * 2
        else:
            per_layer = [("all-reduce", activation_bytes)] * 2
        tp_fwd = per_layer * layers
        tp_bwd = per_layer * layers
        if job.recompute == "full":
            tp_bwd = tp_bwd + per_layer * layers
        if first:
            tp_fwd.append(("reduce-scatter" if par.sequence_parallel else "all-reduce",
                           activation_bytes))
    overlappable = tuple(per_layer * layers) if par.tp > 1 else ()
    cp_fwd, cp_bwd = cp_exchange_per_layer(job)
    cp_fwd, cp_bwd = cp_fwd * layers, cp_bwd * layers
    ring = par.cp_comm == "ring"
    if job.recompute == "full" or (job.recompute == "selective" and ring):
        cp_bwd = cp_fwd + cp_bwd  # the recomputed attention needs the keys and values again
    return StageWork(tuple(forward + extra_forward), tuple(backward), layers, tuple(tp_fwd),
                     tuple(tp_bwd), first, last, tuple(ep_fwd), tuple(ep_bwd), overlappable,
                     tuple(cp_fwd), tuple(cp_bwd), ring)


def _matmul_weights(model: TransformerShape) -> int:
    """Weights that take part in a token's matrix multiplies: every layer's (the top_k
    experts of a mixture of experts, and its router) and the output layer."""
    if not model.uniform or not classic_attention(model) or model.qk_norm:
        norms = model.layers * (2 * model.hidden + (2 * model.head_dim if model.qk_norm else 0))
        return model.parameter_count(active=True, input_embedding=False) - norms - model.hidden
    kv = model.n_kv_heads * model.head_dim
    q = model.heads * model.head_dim
    attention = model.hidden * (q + 2 * kv) + q * model.hidden
    mlp = model.expert_parameters * model.top_k + model.router_parameters
    return model.layers * (attention + mlp) + model.vocab * model.hidden


def _token_matmul_weights(job: TrainingJob) -> float:
    """_matmul_weights of the job's mean token: a capacity factor c below 1 lets each expert
    take at most c times its mean tokens, so at least 1 - c of the routed copies are dropped
    (they skip their expert) and their FLOPs are not the model's."""
    model = job.model
    weights = float(_matmul_weights(model))
    capacity = getattr(job, "capacity_factor", None)
    if model.moe and capacity is not None and capacity < 1.0:
        routed = model.moe_layers * model.top_k * model.expert_parameters
        weights -= (1.0 - capacity) * routed
    return weights


def model_flops_per_step(job: TrainingJob) -> float:
    """Model FLOPs of a step (no recompute): 6 x matmul weights x tokens + the attention term.

    The attention term is 12 x layers x hidden x seq per token (scores and values, forward and
    backward), as in PaLM's and Megatron's MFU accounting.
    """
    model, s = job.model, job.sequence_length
    tokens = job.global_batch * s
    if not classic_core(model):
        return 6.0 * _token_matmul_weights(job) * tokens + 3.0 * attention_flops_per_token(
            model, s) * tokens
    return 6.0 * _token_matmul_weights(job) * tokens + (
        12.0 * model.layers * model.hidden * s * tokens)


def hardware_flops_per_step(job: TrainingJob) -> float:
    """FLOPs actually computed, with recompute (HFU)."""
    model, s = job.model, job.sequence_length
    tokens = job.global_batch * s
    core = (4.0 * model.layers * model.hidden * s * tokens if classic_core(model)
            else attention_flops_per_token(model, s) * tokens)
    forward = 2.0 * _token_matmul_weights(job) * tokens + core
    base = model_flops_per_step(job)
    if job.recompute == "full":
        return base + forward - 2.0 * model.vocab * model.hidden * tokens
    if job.recompute == "selective":
        return base + core
    return base


# ---------------------------------------------------------------------------------------------
# Memory


