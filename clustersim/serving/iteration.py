"""The time of one serving iteration of a replica, from the hardware (no lookup table).

A replica is one copy of the model on `tp x pp` ranks placed on real chips of the topology.
One iteration runs the model once over every token scheduled in it: the prompt chunks being
prefilled and one token of each sequence being decoded. Its time, per pipeline stage, is

- the per-layer matrix and vector work for all its tokens, timed by the training step
  model's roofline (`StepModel.op_time`: matmuls at peak x efficiency x tile quantisation,
  or reading their operands from HBM, whichever is longer), so a small decode batch is bound
  by streaming the weights from HBM and a long prompt by compute;
- attention: a prompt chunk's scores against its context (the quadratic term, as the
  training workload counts it) and each decoding sequence reading its keys and values from
  HBM (linear in the tokens it holds; a windowed layer reads min(context, window) of them,
  or the position in its chunk: serving.attention);
- the tensor-parallel all-reduces after attention and after the MLP, two per layer, costed
  by the collectives model on the replica's own group of chips; inside an instance they run
  mesh (or single-step mesh) at every size, as the catalog's `serving.all_reduce` says (the
  published Trn1 serving rows show it), or the training runtime's `auto` choice;
- between stages, the activations sent over the graph (send-recv); stages run in series for
  one batch (no micro-batching across iterations);
- one fixed host overhead per iteration, the catalog's `serving.iteration_overhead` for
  the chip family (launching the compiled graph, sampling, scheduling).

Decode iterations between two events differ only in the KV tokens they read, so the time of
the next n iterations is a closed form (`decode_run_s`, the windowed layers' reads split
where each context reaches its window): the simulator advances them at once.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from clustersim.collectives.model import CollectiveModel, Group
from clustersim.collectives.ops import CollectiveError
from clustersim.hardware.precision import BYTES_PER_ELEMENT
from clustersim.hardware.topology import Topology
from clustersim.scenario.serving import default_activations
from clustersim.serving import attention as mla
from clustersim.serving.experts import dispatch_bytes_per_rank
from clustersim.serving.layers import (
    busiest_stage_parameters_per_rank,
    context_moe_s,
    expert_weight_bytes_per_rank,
    layer_collectives_s,
    layer_kinds,
    moe_fixed_s,
    on_grid,
)
from clustersim.serving.unfused import unfused_scores_s
from clustersim.training.layers import WEIGHT_BYTES_PER_ELEMENT
from clustersim.training.step import StepModel
from clustersim.training.transformer import TransformerShape, sharded_heads
from clustersim.training.workload import (
    Op,
    _embedding_ops,
    _matmul,
    _output_ops,
    _vector,
)

__all__ = ["ReplicaShape", "IterationModel", "kv_bytes_per_token"]

_KV_CONTEXT = 1 << 16  # long enough that tile padding of the context is negligible


@dataclass(frozen=True)
class ReplicaShape:
    """What the iteration model needs of a deployment: model, precisions (weights,
    activations: default the weights', bf16 for fp8 weights; KV cache), tp, pp."""

    model: TransformerShape
    precision: str  # weights
    tp: int
    pp: int
    kv_precision: str = "bf16"
    activations: str | None = None
    ep: int = 1  # expert parallel: groups of the tp ranks a MoE layer's experts split over
    routing_skew: float = 0.0  # serving.experts: routing concentrated on 1 - skew of them
    # the most tokens a sequence of the deployment holds (None: unknown), which tells whether
    # a sliding window bounds its layers' KV cache
    longest_sequence: int | None = None

    @property
    def activation_precision(self) -> str:
        return self.activations or default_activations(self.precision)


# Matmuls with a weight operand (k x n): it streams at the weights' precision, the token
# operands (m x k in, m x n out) at the activations'.
_WEIGHT_MATMULS = frozenset(("qkv", "projection", "mlp_in", "mlp_out", "router", "logits"))


def weight_element_bytes(precision: str) -> float:
    """Bytes one weight takes in HBM at `precision` (MX formats: training.layers)."""
    return WEIGHT_BYTES_PER_ELEMENT[precision]


def _with_weight_bytes(ops: list[Op], weight_bytes: float, activation_bytes: float) -> list[Op]:
    """The ops (built at the activations' precision) with each weight operand's HBM traffic
    at the weights' precision (weight-only quantisation reads one byte per weight)."""
    if weight_bytes == activation_bytes:
        return ops
    return [op if op.name not in _WEIGHT_MATMULS else dataclasses.replace(
        op, bytes=op.count * (activation_bytes * (op.m * op.k + op.m * op.n)
                              + weight_bytes * op.k * op.n)) for op in ops]


def kv_bytes_per_token(model: TransformerShape, kv_precision: str,
                       longest_sequence: int | None = None) -> float:
    """Bytes one token adds to the KV cache of the whole model (keys and values, all layers;
    MLA's latent, sliding windows the sequences pass bounded: serving.attention)."""
    if mla.is_mla(model) or mla.sliding_window(model) is not None:
        return mla.kv_bytes_per_token(model, BYTES_PER_ELEMENT[kv_precision],
                                      longest_sequence)
    return 2.0 * model.layers * model.n_kv_heads * model.head_dim * BYTES_PER_ELEMENT[kv_precision]


def _with_hardware(topology: Topology, hardware: object) -> Topology:
    """A shallow copy of the topology that reports other hardware constants to the step
    model's roofline (the graph is shared, not rebuilt)."""
    twin = copy.copy(topology)
    twin.hardware = hardware  # type: ignore[assignment]
    return twin


class IterationModel:
    """Iteration times of one replica placed on `chips` (rank order) of a topology."""

    def __init__(self, shape: ReplicaShape, topology: Topology, first_instance: int = 0):
        self.shape = shape
        self.topology = topology
        hw = topology.hardware
        self.hardware = hw
        # The roofline of the training step model, with the serving HBM efficiency in place
        # of the training fit's vector efficiency, and the serving matmul efficiency where the
        # family has one (collectives keep their own constants).
        efficiency = hw.chip.efficiency.model_copy(
            update={"vector": hw.serving.hbm_efficiency,
                    "matmul": hw.serving.matmul_efficiency or hw.chip.efficiency.matmul})
        serving_hw = hw.model_copy(update={"chip": hw.chip.model_copy(
            update={"efficiency": efficiency})})
        self.steps = StepModel(_with_hardware(topology, serving_hw), CollectiveModel(topology))
        self.collectives = self.steps.collectives
        self.tp_collectives = self.collectives
        tp_constants = {field: value for field, value in (
            ("link_efficiency", hw.serving.tp_link_efficiency),
            ("step_latency_s", hw.serving.tp_step_latency_s)) if value is not None}
        if tp_constants:  # the inference stack's own TP all-reduce kernels
            tp_hw = hw.model_copy(update={
                "collectives": hw.collectives.model_copy(update=tp_constants)})
            self.tp_collectives = CollectiveModel(_with_hardware(topology, tp_hw))
        ranks = shape.tp * shape.pp
        instances = max(1, math.ceil(ranks / hw.ranks_per_instance))
        placed = np.arange(first_instance, first_instance + instances)
        k = hw.chip.ranks
        rank_ids = np.arange(ranks)
        rank_chips = (placed[rank_ids // hw.ranks_per_instance] * hw.chips_per_instance
                      + (rank_ids % hw.ranks_per_instance) // k)
        self.chips = int(len(np.unique(rank_chips)))
        self.instances = instances
        self.tp_group = Group.from_rank_chips(rank_chips[: shape.tp].tolist()) if shape.tp > 1 \
            else None
        # Expert parallelism: one rank of each of the ep groups of tp / ep ranks.
        self.ep_group = Group.from_rank_chips(
            rank_chips[: shape.tp: shape.tp // shape.ep].tolist()) if shape.ep > 1 else None
        self.stage_chips = [int(rank_chips[d * shape.tp]) for d in range(shape.pp)]
        self.layers_per_stage = shape.model.layers / shape.pp
        self.heads = sharded_heads(shape.model, shape.tp)  # as NxD pads and replicates them
        self.overhead_s = hw.serving.iteration_overhead_s
        self.element_bytes = weight_element_bytes(shape.precision)  # weights
        self.activation_bytes = BYTES_PER_ELEMENT[shape.activation_precision]
        # The hidden state between operations (the residual stream, and so the TP
        # all-reduces and the stage sends): fp8 activations are the matmuls' inputs,
        # quantised just before each GEMM (TensorRT-LLM's and ModelOpt's W8A8); the stream
        # itself stays 16-bit.
        self.hidden_bytes = 2 if shape.activation_precision == "fp8" else self.activation_bytes
        self.kv_element_bytes = BYTES_PER_ELEMENT[shape.kv_precision]
        # Matmuls run at the activations' precision where the chip has a peak for it (fp8
        # weights with fp8 activations run fp8 matmuls; weight-only fp8 runs bf16 ones), or
        # at an MX weight format's own peak (Trn3's MXFP8).
        compute = shape.precision if shape.precision.startswith("mx") else \
            shape.activation_precision
        self.compute_precision = compute if compute in hw.chip.tflops else "bf16"
        # Decode attention per token of context on every layer, and the part of it the
        # windowed layers do not read past their window (charged per token of excess).
        self.window = mla.decode_window(shape.model)
        self.kv_coefficient_s = self._kv_seconds_per_token()
        self.window_coefficient_s = self._kv_seconds_per_token(mla.window_split(shape.model)[1])
        serving = hw.serving
        self.prefill_fixed_s = (serving.prefill_overhead_s
                                + shape.model.layers * serving.prefill_layer_overhead_s)
        self._known: dict[tuple[int, int], float] = {}

    # ------------------------------------------------------------------ memory
    def weight_bytes_per_chip(self) -> float:
        """Weights one chip holds: its ranks' shards of the busiest stage, layer by layer (a
        mixture's dense layers are lighter than its MoE layers; DeepSeek-V3's three are all
        in the first stage), with the embedding on the first stage and the output layer on
        the last (pp = 1 holds both; one table when tied)."""
        m, pp = self.shape.model, self.shape.pp
        # Padded heads (tp not dividing them) add their attention weights on every rank, and
        # KV heads replicated past tp (or converted) their K and V projections.
        padding = self.heads.extra_attention_parameters_per_rank(m, self.shape.tp)
        per_rank = busiest_stage_parameters_per_rank(m, self.shape.tp, pp, padding)
        ranks_per_chip = min(self.hardware.chip.ranks, self.shape.tp * pp)
        return per_rank * self.element_bytes * ranks_per_chip

    def weight_bytes(self) -> float:  # all the replica's weights
        return self.shape.model.parameter_count() * self.element_bytes

    def _on_busiest_chip(self, kv_bytes: float) -> float:
        """The busiest chip's part of `kv_bytes` of the whole model's KV cache."""
        m = self.shape.model
        # Each rank holds its KV heads (split over tp, replicated when tp exceeds them,
        # padded with the query heads) for its stage's layers; MLA's latent is every head's,
        # so every rank holds all of it.
        per_rank = kv_bytes / self.shape.pp if mla.is_mla(m) else (
            kv_bytes / m.n_kv_heads * self.heads.kv_per_rank / self.shape.pp)
        return per_rank * min(self.hardware.chip.ranks, self.shape.tp * self.shape.pp)

    def kv_bytes_per_token_per_chip(self) -> float:
        """KV cache bytes one token adds on the busiest chip."""
        return self._on_busiest_chip(kv_bytes_per_token(
            self.shape.model, self.shape.kv_precision, self.shape.longest_sequence))

    def windowed_cache_bytes_per_chip(self, lines: int) -> float:
        """The sliding-window caches kv_bytes_per_token leaves out: `lines` sequences of
        `window` tokens on the busiest chip (Trinity-Large, TP 64: 360 MiB a sequence)."""
        m = self.shape.model
        global_layers, windowed = mla.layer_split(m, self.shape.longest_sequence)
        per_token = windowed * mla.kv_values_per_token_layer(m) * self.kv_element_bytes
        return lines * int(m.window) * self._on_busiest_chip(per_token) if global_layers \
            and windowed else 0.0

    def kv_capacity_tokens(self, reserve_fraction: float = 0.0, lines: int = 0) -> int:
        """Tokens the KV cache holds: the HBM left after weights on the busiest chip, less a
        reserved fraction of HBM (activations, runtime) and the sliding-window layers'
        caches of `lines` sequences (the batch limit), over one token's KV bytes per chip."""
        free = (self.usable_hbm_bytes(reserve_fraction) - self.weight_bytes_per_chip()
                - self.windowed_cache_bytes_per_chip(lines))
        return max(0, int(free // self.kv_bytes_per_token_per_chip()))

    def usable_hbm_bytes(self, reserve_fraction: float = 0.0) -> float:
        """HBM of the busiest chip this replica may use, less the reserved fraction: a
        replica smaller than a chip shares it, its ranks' share is its own (four TP-1
        replicas on a four-rank chip each counted the whole chip)."""
        hw = self.hardware
        share = min(hw.chip.ranks, self.shape.tp * self.shape.pp) / hw.chip.ranks
        return hw.chip.hbm_bytes * (1.0 - reserve_fraction) * share

    # ------------------------------------------------------------------ time
    def _op_s(self, ops: list[Op]) -> float:
        return sum(self.steps.op_time(op, self.compute_precision) for op in ops)

    def _linear(self, tokens: int, outputs: int) -> float:
        """Everything but attention over context for `tokens` tokens, `outputs` of which
        need logits, plus the fixed overhead. Exact up to 256 tokens and at multiples of 32,
        linear in between (the work is linear in tokens within a tile)."""
        key = (tokens, outputs)
        known = self._known.get(key)
        if known is not None:
            return known
        time_s = self.overhead_s + on_grid(tokens, self._body_s) + (
            self._outputs_s(outputs) if outputs else 0.0)
        self._known[key] = time_s
        return time_s

    @lru_cache(maxsize=65536)  # noqa: B019 - one model per replica shape, kept for the run
    def _outputs_s(self, outputs: int) -> float:
        """Final norm, output layer and sampling for the sequences emitting a token."""
        s = self.shape
        return self._op_s(self._weights_at_precision(
            _output_ops(s.model, 1, outputs, s.tp, s.activation_precision)))

    def _weights_at_precision(self, ops: list[Op], on_chip: bool = False) -> list[Op]:
        """The ops with each weight operand at the weights' precision; `on_chip`: the
        activations stay in the rank's on-chip SRAM, so only weights travel from HBM."""
        ops = _with_weight_bytes(ops, self.element_bytes, self.activation_bytes)
        if not on_chip:
            return ops
        return [dataclasses.replace(op, bytes=(
            op.count * self.element_bytes * op.k * op.n if op.name in _WEIGHT_MATMULS else 0.0))
            for op in ops]

    def activations_on_chip(self, tokens: int) -> bool:
        """Whether an iteration's hidden states (tokens x hidden at the activations'
        precision, replicated on every tensor-parallel rank) fit a rank's on-chip SRAM
        (the catalog's `chip.sram` over its ranks: 24 MiB of SBUF per NeuronCore-v2, 28 per
        v3). While they fit, the compiler keeps them there between operations: norms,
        residual adds and the matmuls' token operands never travel to HBM. Beyond it they
        are written out and read back around every operation."""
        sram = self.hardware.chip.sram_bytes
        if not sram:
            return False
        per_rank = sram / self.hardware.chip.ranks
        return tokens * self.shape.model.hidden * self.hidden_bytes <= per_rank

    @lru_cache(maxsize=65536)  # noqa: B019
    def _body_s(self, tokens: int) -> float:
        """The layers' matmuls and vector work and their TP all-reduces, the embedding, and
        the sends between stages, for `tokens` tokens."""
        s = self.shape
        on_chip = self.activations_on_chip(tokens)
        activation = tokens * s.model.hidden * self.hidden_bytes
        stages_s = 0.0
        for layers, ops, moe in layer_kinds(self, tokens, on_chip):
            layer_s = self._op_s(ops)
            comm_s = layer_collectives_s(self, tokens, moe)
            if moe:
                layer_s += moe_fixed_s(self, tokens)
            if self.hardware.serving.overlap_collectives and comm_s > 0:
                # a two-stage pipeline over the tokens' row tiles: the all-reduce of one tile
                # runs while the next is computed (one tile, as in decode: nothing overlaps).
                # Tiles counted as a fraction: a partial last tile adds its share of overlap,
                # where rounding up gave a 129-token prompt all of a second tile's and made
                # it 2% cheaper than a 128-token one.
                tiles = max(1.0, tokens / self.hardware.chip.efficiency.tile)
                per_layer_s = max(layer_s, comm_s) + min(layer_s, comm_s) / tiles
            else:
                per_layer_s = layer_s + comm_s
            stages_s += layers * per_layer_s
        ends_s = self._op_s(_embedding_ops(s.model, 1, tokens, s.activation_precision))
        send_s = 0.0
        for d in range(s.pp - 1):
            shards = min(s.tp, self.hardware.chip.ranks)
            send_s += self.collectives.cost(
                "send-recv", Group(np.array([self.stage_chips[d]]), 1),
                activation / s.tp * shards, peer=self.stage_chips[d + 1]).time_s
        return stages_s + ends_s + send_s

    def ep_all_to_all_s(self, tokens: int) -> float:
        """One expert-parallel all-to-all (dispatch or combine) of an iteration's tokens."""
        size = dispatch_bytes_per_rank(self.shape.model, tokens, self.shape.ep, self.hidden_bytes)
        return self.collectives.cost("all-to-all", self.ep_group, size).time_s

    def expert_weight_bytes_per_rank(self, tokens: int) -> float:
        """HBM bytes the busiest rank reads of routed experts' weights in one iteration of
        `tokens` tokens, all MoE layers (serving.layers)."""
        return expert_weight_bytes_per_rank(self.shape, self.element_bytes, tokens,
                                            self.hardware.serving.moe_decode_loads)

    def tp_all_reduce_s(self, size_bytes: float) -> float:
        """One tensor-parallel all-reduce of the replica: with the catalog's
        `serving.all_reduce: mesh`, the cheaper of mesh and single-step mesh inside the
        instance at every size (a minimum of non-decreasing costs, so still non-decreasing
        in size); with `auto`, the training runtime's choice. With the inference stack's own
        kernels (`serving.tp_link_efficiency`, `tp_step_latency`), those up to their
        workspace (`serving.tp_kernel_max`) and the collectives' algorithm beyond it; the
        kernels are capped at what the workspace-sized message costs there, which keeps the
        cost non-decreasing in size."""
        if self.tp_collectives is self.collectives:
            return self._tp_all_reduce_s(self.collectives, size_bytes)
        limit = self.hardware.serving.tp_kernel_max_bytes
        if limit is None:
            return self._tp_all_reduce_s(self.tp_collectives, size_bytes)
        if self.shape.tp > 2:
            limit /= 2
        beyond = self._tp_all_reduce_s(self.collectives, max(size_bytes, limit))
        if size_bytes > limit:
            return beyond
        return min(beyond, self._tp_all_reduce_s(self.tp_collectives, size_bytes))

    def _tp_all_reduce_s(self, collectives: CollectiveModel, size_bytes: float) -> float:
        cost = collectives.cost
        if self.hardware.serving.all_reduce == "auto":
            return cost("all-reduce", self.tp_group, size_bytes).time_s
        times = []
        names = ("mesh", "mesh1", "rdh", "kangaring") \
            if self.hardware.serving.all_reduce == "cheapest" else ("mesh", "mesh1")
        for name in names:
            try:  # a group over several instances runs a reduce-scatter inside each: no mesh1
                times.append(cost("all-reduce", self.tp_group, size_bytes, intra=name).time_s)
            except CollectiveError:
                continue
        if not times:  # no mesh applies (e.g. one rank per instance): the runtime's choice
            return cost("all-reduce", self.tp_group, size_bytes).time_s
        return min(times)

    def _kv_seconds_per_token(self, layers: int | None = None) -> float:
        """Seconds a decoding sequence's attention costs per token of its context on
        `layers` layers (all): reading that token's keys and values and scoring it."""
        layers = self.shape.model.layers if layers is None else layers
        return layers * self._layer_kv_s(_KV_CONTEXT) / _KV_CONTEXT

    def window_excess(self, context: float) -> float:
        """Tokens of a sequence's `context` its windowed layers do not read (0 without a
        window, or below it)."""
        if self.window is None:
            return 0.0
        return mla.window_excess(*self.window, context)

    def decode_kv_s(self, context_tokens: float, window_excess: float = 0.0) -> float:
        """Decode attention of sequences holding `context_tokens` in all, of which their
        windowed layers skip `window_excess` (the sum of window_excess over them)."""
        time_s = self.kv_coefficient_s * context_tokens
        if window_excess:
            time_s -= self.window_coefficient_s * window_excess
        return time_s

    def _layer_kv_s(self, context: int) -> float:
        """One layer's decode attention of one sequence's token over `context` tokens."""
        m = self.shape.model
        heads, kv_heads = self.heads.per_rank, self.heads.kv_per_rank
        e = self.kv_element_bytes
        if mla.is_mla(m):
            return self._op_s(mla.mla_decode_ops(m, heads, context, e))
        group = heads // kv_heads  # query heads sharing a KV head score together
        ops = [_matmul("scores", group, m.head_dim, context, e, count=kv_heads),
               _matmul("attend", group, context, m.head_dim, e, count=kv_heads)]
        return self._op_s(ops)  # traffic: the keys and values, at the KV cache's precision

    @lru_cache(maxsize=65536)  # noqa: B019
    def _prefill_attention_s(self, chunk: int, context: int) -> float:
        """Attention of a prompt chunk of `chunk` tokens over `context` earlier tokens plus
        itself, every layer: the quadratic term (scores and values) as fused (flash)
        attention runs it; a windowed layer's queries score only their window's keys (MLA's
        too). Unfused attention adds the iteration's passes over its scores (unfused)."""
        m = self.shape.model
        span = context + chunk
        if self.window is None or span <= self.window[0]:
            return m.layers * self._layer_prefill_s(chunk, context, span)
        global_layers, windowed = mla.window_split(m)
        earlier, narrow = mla.window_prefill(*self.window, chunk, context)
        return (global_layers * self._layer_prefill_s(chunk, context, span)
                + windowed * self._layer_prefill_s(chunk, earlier, narrow))

    def _layer_prefill_s(self, chunk: int, earlier: int, span: int) -> float:
        """One layer's prefill attention of `chunk` queries over `span` keys, `earlier` of
        them before the chunk: MLA unabsorbed (mla_prefill_ops), else grouped-query."""
        m = self.shape.model
        heads, kv_heads = self.heads.per_rank, self.heads.kv_per_rank
        e = self.activation_bytes
        if mla.is_mla(m):
            return self._op_s(mla.mla_prefill_ops(m, chunk, earlier, heads, e,
                                                  self.kv_element_bytes, span))
        return self._op_s([
            _matmul("scores", chunk, m.head_dim, span, e, count=heads),
            _matmul("attend", chunk, span, m.head_dim, e, count=heads),
            _vector("attention_io", chunk * heads * m.head_dim * 2, e, passes=1),
            _vector("kv_io", span * kv_heads * m.head_dim * 2, self.kv_element_bytes,
                    passes=1)])

    def iteration_s(self, prefill: list[tuple[int, int]], decode_batch: int,
                    decode_context_tokens: float, prefill_outputs: int = 0,
                    static_batch: bool = False, window_excess: float = 0.0) -> float:
        """One iteration: prompt chunks (tokens, earlier context) of which `prefill_outputs`
        end a prompt (and so emit a first token), plus `decode_batch` decoding sequences
        holding `decode_context_tokens` KV tokens in all, `window_excess` of which their
        windowed layers do not read (see `window_excess`). `static_batch`: the prompts are
        one statically batched context encoding (see serving.unfused)."""
        tokens = decode_batch + sum(c for c, _ in prefill)
        if tokens == 0:
            return 0.0
        time_s = self._linear(tokens, decode_batch + prefill_outputs)
        if prefill:  # the context-encoding graph's fixed times; its MoE path
            time_s += self.prefill_fixed_s + context_moe_s(self, tokens)
        time_s += sum(self._prefill_attention_s(c, p) for c, p in prefill)
        if prefill and self.hardware.serving.attention == "unfused":
            time_s += unfused_scores_s(self, prefill, static_batch)
        return time_s + self.decode_kv_s(decode_context_tokens, window_excess)

    def prefill_s(self, input_tokens: int) -> float:
        """A whole prompt alone in one iteration (time to first token on an idle replica)."""
        return self.iteration_s([(input_tokens, 0)], 0, 0.0, prefill_outputs=1)

    def step_s(self, batch: int) -> float:
        """A decode step of `batch` sequences without the host overhead or attention over
        context: a draft's step inside a fused speculation graph."""
        return self._linear(batch, batch) - self.overhead_s

    def decode_base_s(self, batch: int) -> float:
        """A decode iteration of `batch` sequences, without their attention over context."""
        return self._linear(batch, batch)

    def decode_run_s(self, contexts: list[float], iterations: int) -> float:
        """Total time of the next `iterations` decode iterations of a fixed batch whose
        sequences hold `contexts` tokens, each growing by one token an iteration, in closed
        form: n x base + kv x (n x context + batch x n(n-1)/2), less each sequence's window
        excess summed over the run (serving.attention.window_excess_sum)."""
        n, batch = int(iterations), len(contexts)
        if n <= 0 or batch == 0:
            return 0.0
        total = float(sum(contexts))
        time_s = n * self.decode_base_s(batch) + self.kv_coefficient_s * (
            n * total + batch * n * (n - 1) / 2.0)
        if self.window is not None:
            time_s -= self.window_coefficient_s * sum(
                mla.window_excess_sum(*self.window, c, n) for c in contexts)
        return time_s
