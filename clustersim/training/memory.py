"""Memory per rank of a training job: weights, gradients, optimizer state and activations.

Memory (bytes per rank): weights, gradients and optimizer state by precision (16-bit mixed
precision: 2-byte weights; gradients in the family's `framework.gradients` precision, 4 bytes
for Megatron-LM's fp32 main gradients, 2 for NeuronX Distributed, whose gradients take the
bf16 parameters' type; 12 bytes of fp32 master weights and Adam moments, sharded over data
parallelism by ZeRO-1), activations per layer after Korthikanti et al. with tensor and
sequence parallelism and recompute, times the micro-batches a pipeline stage holds at once.
Each pipeline rank's are those of the layers it holds (a mixture's dense and MoE layers
differ: `stage_share`), and the busiest rank's are the job's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from clustersim.hardware.precision import BYTES_PER_ELEMENT
from clustersim.training.activations import mean_layer_activation_bytes
from clustersim.training.attention import classic_attention
from clustersim.training.experts import (
    dense_weights_per_layer,
    expert_load,
    expert_weights_per_layer,
    router_weights_per_layer,
    stage_moe_share,
)
from clustersim.training.layers import head_widths
from clustersim.training.schedule import in_flight
from clustersim.training.stages import rank_layers
from clustersim.training.transformer import TransformerShape, sharded_heads
from clustersim.training.workload import ParallelismSpec, TrainingJob, attention_of

__all__ = [
    "BusiestMemory",
    "MemoryBreakdown",
    "activation_bytes_per_layer",
    "busiest_memory",
    "expert_params_per_rank",
    "layer_params_per_rank",
    "memory_per_rank",
    "optimizer_params_per_rank",
    "params_per_rank",
    "stage_optimizer_params",
    "stage_share",
    "weight_bytes_per_param",
]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per rank, and per chip (the ranks of a chip share its HBM)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    ranks_per_chip: int
    hbm_bytes: float
    in_flight_microbatches: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    stage: int = 0  # the pipeline rank these are of

    @property
    def per_rank(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits

    @property
    def per_chip(self) -> float:
        return self.per_rank * self.ranks_per_chip

    @property
    def fits(self) -> bool:
        return self.per_chip <= self.hbm_bytes

    def as_gib(self) -> dict[str, float]:
        gib = 2.0**30
        return {
            "weights": self.weights * self.ranks_per_chip / gib,
            "gradients": self.gradients * self.ranks_per_chip / gib,
            "optimizer": self.optimizer * self.ranks_per_chip / gib,
            "activations": self.activations * self.ranks_per_chip / gib,
            "logits": self.logits * self.ranks_per_chip / gib,
            "total": self.per_chip / gib,
            "hbm": self.hbm_bytes / gib,
        }


def weight_bytes_per_param(precision: str, gradients: str = "fp32") -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) bytes per parameter for mixed precision Adam.

    `gradients`: the precision gradients are kept and reduced in with 16-bit training (fp32
    in Megatron-LM's main-gradient buffers; bf16 in NeuronX Distributed, where they take the
    parameters' type and ZeRO-1 upcasts only the optimizer's shard)."""
    if precision in ("fp32", "tf32"):
        return 4, 4, 8  # the weights are the master copy; Adam m and v
    return BYTES_PER_ELEMENT[precision] if precision != "fp8" else 2, BYTES_PER_ELEMENT[
        gradients], 12


def stage_share(job: TrainingJob, stage: int) -> float:
    """Share of the layers pipeline rank `stage` holds that are MoE layers."""
    par = job.parallelism
    return stage_moe_share(job.model, par.pp, par.interleave, stage)


# `share` below: the share of the stage's layers that are MoE layers (stage_share; default
# the model's, as if every stage held its mean layer).
def params_per_rank(job: TrainingJob, first: bool, last: bool,
                    layers: float | None = None, share: float | None = None) -> float:
    """Parameters one rank of a (first/last) pipeline stage of `layers` layers holds (default:
    layers / pp) before any ZeRO-3 sharding."""
    return _dense_params_per_rank(job, first, last, layers, share) + expert_params_per_rank(
        job, layers, share)


def expert_params_per_rank(job: TrainingJob, layers: float | None = None,
                           share: float | None = None) -> float:
    """Expert weights one rank holds: its stage's layers' experts, split over tp and ep."""
    model, par = job.model, job.parallelism
    if not model.moe:
        return 0.0
    layers = model.layers / par.pp if layers is None else layers
    return layers * expert_weights_per_layer(model, share) / (par.tp * par.ep)


def _expert_shard(par: ParallelismSpec) -> int:
    """Ranks of a shard group holding the same experts (every ep-th data-parallel rank)."""
    return max(1, par.shard_ranks // par.ep)


def optimizer_params_per_rank(job: TrainingJob, first: bool, last: bool,
                              layers: float | None = None, share: float | None = None) -> float:
    """Parameters whose optimizer state one rank keeps: with ZeRO (any stage), its share over
    the shard group (all of dp x cp, or `shard` ranks with hybrid sharding; a share over the
    ranks of the group holding the same experts for experts)."""
    par = job.parallelism
    experts = expert_params_per_rank(job, layers, share)
    dense = params_per_rank(job, first, last, layers, share) - experts
    if par.zero == 0:
        return dense + experts
    return dense / par.shard_ranks + experts / _expert_shard(par)


def stage_optimizer_params(job: TrainingJob, stage: int) -> float:
    """optimizer_params_per_rank of one rank of pipeline rank `stage` (its layers)."""
    return optimizer_params_per_rank(job, stage == 0, stage == job.parallelism.pp - 1,
                                     _stage_layers(job, stage), stage_share(job, stage))


def layer_params_per_rank(job: TrainingJob, share: float | None = None) -> float:
    """Weights of one (mean) layer on one tensor-parallel rank (a ZeRO-3 gather or
    reduce-scatter moves these for every layer)."""
    return params_per_rank(job, False, False, 1.0, share)


@functools.lru_cache(maxsize=256)
def _dense_layer_params(model: TransformerShape, share: float | None = None) -> float:
    """Weights of one layer other than its experts and router (cached: the planner asks
    for it for every candidate)."""
    return dense_weights_per_layer(model, share)


def _dense_params_per_rank(job: TrainingJob, first: bool, last: bool,
                           layers: float | None = None, share: float | None = None) -> float:
    model, par = job.model, job.parallelism
    per_layer = _dense_layer_params(model, share)
    layers = model.layers / par.pp if layers is None else layers
    # The router is replicated over tensor parallelism; the rest is split (with the padded
    # heads' attention weights when tp does not divide the heads, and the K and V
    # projections of KV heads replicated to one per rank when tp exceeds them).
    padding = sharded_heads(model, par.tp).extra_attention_parameters_per_rank(model, par.tp)
    count = layers * (per_layer / par.tp + router_weights_per_layer(model, share) + padding)
    if first:
        count += model.vocab * model.hidden / par.tp
    if last:
        # The output layer, unless it is the input embedding (tied) held on this rank too:
        # with pipeline stages the last keeps its own copy, as Megatron-LM does.
        if not (first and model.tied_embeddings):
            count += model.vocab * model.hidden / par.tp
        count += model.hidden
    return count


def activation_bytes_per_layer(job: TrainingJob, attention: str | None = None,
                               share: float | None = None) -> float:
    """Activation memory of one (mean) layer, of layers whose `share` are MoE layers
    (default the model's), for one micro-batch on one rank (Korthikanti et al.
    2022, generalised to grouped-query attention and gated MLPs; no dropout masks outside
    attention). The 5as/h term (softmax output, dropout mask and output: 5 a s^2 b bytes) is
    kept only with `unfused` attention and no recompute: flash attention never stores it,
    selective recompute recomputes it. Context parallelism keeps s / cp positions per rank
    (the scores: s / cp queries against all s keys)."""
    attention = attention or attention_of(job)
    model, par = job.model, job.parallelism
    if not (classic_attention(model) and model.uniform
            and model.heads * model.head_dim == model.hidden
            and (not model.moe or expert_load(job) == 1.0)):
        return mean_layer_activation_bytes(job, attention, BYTES_PER_ELEMENT[job.precision],
                                           share)
    b, t = job.micro_batch, par.tp
    seq = job.sequence_length
    s, h = seq // par.cp, model.hidden
    e = BYTES_PER_ELEMENT[job.precision]
    sbh = s * b * h
    attention_width = 1.0  # the query heads' share of the hidden size, over all ranks
    layout = sharded_heads(model, t)
    if layout.padded(model):  # padded heads hold activations too
        attention_width = layout.heads / model.heads
    # KV heads as laid out: replicated to one per rank when tp exceeds them (4 KV heads at
    # tp 8 hold a whole head's keys and values on every rank, not half of one)
    kv = layout.kv_heads / model.heads
    f = model.ffn / h
    if job.recompute == "full":
        return e * sbh / (t if par.sequence_parallel else 1)
    # Kept whole without sequence parallelism: the two norms' inputs, the QKV and MLP inputs.
    replicated = e * sbh * 4  # 4 tensors of b x s x h
    split = e * sbh * (2 * attention_width + 2 * kv)  # Q, K, V (grouped), projection input
    # MLP intermediates (of top_k experts per token with a mixture of experts).
    split += e * sbh * (f * (2 if model.gated else 1) + f) * model.top_k
    if job.recompute == "none" and attention == "unfused":
        split += 5.0 * model.heads * s * seq * b
    if par.sequence_parallel:
        return (replicated + split) / t
    return replicated + split / t


def _ring_buffer_bytes(job: TrainingJob) -> float:
    """Ring attention's buffers: the keys and values of the block being received and of the
    one attended to (MLA's expanded per head: 192 + 128 wide for DeepSeek-V3)."""
    par = job.parallelism
    key, value = head_widths(job.model)
    return 2.0 * job.micro_batch * (job.sequence_length // par.cp) * (
        sharded_heads(job.model, par.tp).kv_per_rank) * (key + value) * (
        BYTES_PER_ELEMENT[job.precision])


def _stage_layers(job: TrainingJob, stage: int) -> float:
    """Layers pipeline rank `stage` holds: as evenly as possible (training.stages)."""
    par, layers = job.parallelism, job.model.layers
    if par.pp * par.interleave > layers:
        return layers / par.pp  # cannot be split; refused by the scenario's rules
    return float(rank_layers(layers, par.pp, par.interleave)[stage])


def memory_per_rank(job: TrainingJob, in_flight_microbatches: float, hbm_bytes: float,
                    ranks_per_chip: int, attention: str | None = None,
                    gradients: str = "fp32", stage: int = 0) -> MemoryBreakdown:
    """Memory of one rank of pipeline rank `stage` (default the first, which holds the most
    micro-batches and the embedding) when it keeps `in_flight_microbatches` chunk
    micro-batches of activations over its interleave (`gradients`: see
    weight_bytes_per_param).

    ZeRO: 1 keeps 1/Z of the optimizer state (Z: the shard group's ranks), 2 also 1/Z of the
    gradients plus one layer's whole gradients (the bucket being reduce-scattered), 3 also
    1/Z of the weights plus two layers' whole weights (the layer computing and the one
    being gathered ahead). Gradients are otherwise kept whole: Megatron-LM's distributed
    optimizer (ZeRO-1) shards its fp32 master weights and Adam moments but not the fp32
    gradient buffer ("[no] distribute model gradients", 6 + 12/d bytes per parameter with
    bf16 parameters and fp32 gradients), nor does NeuronX Distributed's ZeRO-1."""
    par = job.parallelism
    last = stage == par.pp - 1
    layers = _stage_layers(job, stage)
    weights, grads, optimizer = _state_bytes(job, stage, gradients)
    activations = _activation_bytes(job, attention, stage_share(job, stage)) * layers * (
        in_flight_microbatches)
    if par.cp > 1 and par.cp_comm == "ring":
        # Keys and values of the block being received and of the one attended to.
        activations += _ring_buffer_bytes(job)
    logits = 0.0
    if last:  # fp32 logits of the vocabulary shard for one micro-batch
        logits = 4.0 * job.micro_batch * (job.sequence_length // par.cp) * math.ceil(
            job.model.vocab / par.tp)
    return MemoryBreakdown(
        weights=weights, gradients=grads, optimizer=optimizer, activations=activations,
        logits=logits, ranks_per_chip=ranks_per_chip, hbm_bytes=hbm_bytes,
        in_flight_microbatches=in_flight_microbatches, stage=stage,
    )


# The planner asks for the memory of tens of thousands of candidates that share their
# degrees (the state's bytes) or their micro-batch and recompute (the activations): both
# parts are kept by what they depend on. Bounded: cleared when full.
_STATE_CACHE: dict[tuple, tuple[float, float, float]] = {}


_ACTIVATION_CACHE: dict[tuple, float] = {}


_CACHE_SIZE = 200_000


def _state_bytes(job: TrainingJob, stage: int, gradients: str) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes of one rank of pipeline rank `stage`."""
    par = job.parallelism
    key = (job.model, job.precision, gradients, par.tp, par.cp, par.pp, par.dp, par.ep,
           par.interleave, par.zero, par.shard_ranks, stage)
    cached = _STATE_CACHE.get(key)
    if cached is not None:
        return cached
    first, last = stage == 0, stage == par.pp - 1
    layers = _stage_layers(job, stage)
    share = stage_share(job, stage)
    params = params_per_rank(job, first, last, layers, share)
    w, g, o = weight_bytes_per_param(job.precision, gradients)
    optimizer = optimizer_params_per_rank(job, first, last, layers, share) * o
    z = par.shard_ranks
    layer = layer_params_per_rank(job, share)
    if par.ep > 1 and par.zero >= 2:
        # Expert weights are sharded over the ranks holding the same experts (z / ep).
        experts = expert_params_per_rank(job, layers, share)
        sharded = (params - experts) / z + experts / _expert_shard(par)
        weights = params * w if par.zero < 3 else sharded * w + 2 * layer * w
        grads = sharded * g + layer * g
    else:
        weights = params * w if par.zero < 3 else params * w / z + 2 * layer * w
        grads = params * g if par.zero < 2 else params * g / z + layer * g
    if len(_STATE_CACHE) >= _CACHE_SIZE:
        _STATE_CACHE.clear()
    _STATE_CACHE[key] = (weights, grads, optimizer)
    return weights, grads, optimizer


def _activation_bytes(job: TrainingJob, attention: str | None, share: float) -> float:
    """activation_bytes_per_layer, kept by what it depends on."""
    par = job.parallelism
    key = (job.model, job.precision, job.micro_batch, job.sequence_length, job.recompute,
           attention or attention_of(job), par.tp, par.cp, par.sequence_parallel,
           expert_load(job), share)
    cached = _ACTIVATION_CACHE.get(key)
    if cached is None:
        if len(_ACTIVATION_CACHE) >= _CACHE_SIZE:
            _ACTIVATION_CACHE.clear()
        cached = _ACTIVATION_CACHE[key] = activation_bytes_per_layer(job, attention, share)
    return cached


def busiest_memory(job: TrainingJob, microbatches: int, hbm_bytes: float, ranks_per_chip: int,
                   attention: str | None = None, gradients: str = "fp32") -> MemoryBreakdown:
    """Memory of the busiest pipeline rank: the most of `_candidate_stages`'."""
    par = job.parallelism
    out = None
    for d in _candidate_stages(job):
        held = in_flight(par.pp, microbatches, par.interleave, d) / par.interleave
        m = memory_per_rank(job, held, hbm_bytes, ranks_per_chip, attention, gradients, d)
        if out is None or m.per_rank > out.per_rank:
            out = m
    assert out is not None
    return out


def _candidate_stages(job: TrainingJob) -> list[int]:
    """The pipeline ranks the busiest is among: the first (most micro-batches in flight, the
    embedding), the first of those holding the most layers (uneven stages), the last (the
    output layer and its logits) and, for a mixture, the first holding each mix of its
    layers (a rank with more MoE layers holds more weights). A rank further on holds no
    more than the first of its kind: as many layers of each kind, fewer micro-batches."""
    par, model = job.parallelism, job.model
    candidates = {0, par.pp - 1}
    if par.pp * par.interleave <= model.layers:
        per_rank = rank_layers(model.layers, par.pp, par.interleave)
        candidates.add(per_rank.index(max(per_rank)))
        if model.moe:
            kinds = {(per_rank[d], stage_share(job, d)): d for d in reversed(range(par.pp))}
            candidates.update(kinds.values())
    return sorted(candidates)


class BusiestMemory:
    """`busiest_memory(...).per_rank` of many configurations of one job (the planner's
    screening): the same pieces and the same arithmetic, in the same order, without building
    a breakdown per configuration, its pieces kept by the integers they depend on (the job's
    model, sequence, batch and precision are this object's)."""

    def __init__(self, attention: str, gradients: str):
        self.attention = attention
        self.gradients = gradients
        self._state: dict[tuple, tuple[float, float, float]] = {}
        self._activation: dict[tuple, float] = {}
        self._stages: dict[tuple, tuple[tuple[int, float, float, float], ...]] = {}
        self._extras: dict[tuple, tuple[float, float]] = {}

    def per_rank(self, job: TrainingJob, microbatches: int) -> float:
        """Bytes per rank of the busiest pipeline rank of `job` (a job of this object's)."""
        par = job.parallelism
        degrees = (par.tp, par.cp, par.pp, par.dp, par.ep, par.interleave)
        stages = self._stages.get(degrees + (microbatches,))
        if stages is None:
            stages = self._stages[degrees + (microbatches,)] = self._stage_shape(job,
                                                                                 microbatches)
        act_key = (job.micro_batch, job.recompute, par.tp, par.cp, par.sequence_parallel,
                   expert_load(job))
        extra_key = (job.micro_batch, par.tp, par.cp, par.cp_comm)
        extras = self._extras.get(extra_key)
        if extras is None:
            extras = self._extras[extra_key] = self._ring_and_logits(job)
        ring, logits_last = extras
        best = None
        for d, layers, held, share in stages:
            per_layer = self._activation.get(act_key + (share,))
            if per_layer is None:
                per_layer = self._activation[act_key + (share,)] = activation_bytes_per_layer(
                    job, self.attention, share)
            state_key = degrees + (par.zero, par.shard_ranks, d)
            state = self._state.get(state_key)
            if state is None:
                state = self._state[state_key] = _state_bytes(job, d, self.gradients)
            weights, grads, optimizer = state
            activations = per_layer * layers * held
            if ring is not None:
                activations += ring
            logits = logits_last if d == par.pp - 1 else 0.0
            total = weights + grads + optimizer + activations + logits
            if best is None or total > best:
                best = total
        assert best is not None
        return best

    @staticmethod
    def _stage_shape(job: TrainingJob, microbatches: int
                     ) -> tuple[tuple[int, float, float, float], ...]:
        """(pipeline rank, layers, chunk micro-batches held, MoE share of its layers) of
        the ranks busiest_memory weighs, in its order."""
        par = job.parallelism
        return tuple((d, _stage_layers(job, d),
                      in_flight(par.pp, microbatches, par.interleave, d) / par.interleave,
                      stage_share(job, d))
                     for d in _candidate_stages(job))

    @staticmethod
    def _ring_and_logits(job: TrainingJob) -> tuple[float | None, float]:
        """Context parallelism's ring buffers (None without) and the last rank's logits, as
        memory_per_rank counts them."""
        par = job.parallelism
        ring = None
        if par.cp > 1 and par.cp_comm == "ring":
            ring = _ring_buffer_bytes(job)
        logits = 4.0 * job.micro_batch * (job.sequence_length // par.cp) * math.ceil(
            job.model.vocab / par.tp)
        return ring, logits
