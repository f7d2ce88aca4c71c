"""One training step of a job on placed chips, simulated with simpy, one process per
pipeline stage (never per chip).

Ranks are placed as Neuron and Megatron place them (`ranks`: tensor parallelism innermost,
then context parallelism, then pipeline stages, then data parallelism across instances, or
with `order: tp-cp-ep-pp-dp` the expert-parallel ranks before the pipeline stages);
stages may hold uneven layer counts (`stages`) and, in a model whose layers differ (dense
and MoE, global and windowed), their own kinds of layer (`layer_mix`: each chunk's
compute, all-to-alls and ZeRO-3 gathers are its layers', so the slowest stage paces the
pipeline); every collective runs on a real group of the graph:

- tensor-parallel collectives inside each layer (all-reduce, or all-gather and
  reduce-scatter with sequence parallelism), on the critical path, timed with each chunk's
  compute (`chunk`: the per-operation roofline and its three fitted constants);
- context parallelism's key/value exchange (ring, hidden behind the attention kernel as far
  as it goes, or all-to-all), timed with each chunk;
- ZeRO-3's per-layer parameter gathers and gradient reduce-scatters in every pass, the next
  layer's gather overlapping this layer's compute;
- send/receive of activations and gradients between neighbouring stages (each TP rank sends
  its shard);
- the data-parallel gradient reduction (all-reduce, or reduce-scatter then parameter
  all-gather with ZeRO-1 and 2, across shard groups with hybrid sharding; `reduction`),
  started with the last backward pass as bucketed frameworks do, shared by the
  data-parallel groups that run at once on the same links;
- the optimizer step, memory-bound.

The chunk times and the data-parallel times are public (`StepModel.chunk_times`,
`StepModel.data_parallel_times`) so the planner bounds a step from below with the same
costs, without the simpy pipeline.

The step time carries an error band (`step_time_s_band`): the largest under- and
over-prediction of the chip family's published rows, those it was fitted to and those it was
not (`efficiency.step_error_band`), applied to the step time.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from clustersim.collectives.model import CollectiveModel, Group
from clustersim.hardware.lru import LruCache
from clustersim.hardware.precision import BYTES_PER_ELEMENT
from clustersim.hardware.topology import Topology
from clustersim.training.bounds import pipeline_bound
from clustersim.training.chunk import (
    ChunkModel,
    ChunkTimes,
    chunk_affine,
    chunk_difference,
    matmul_quantisation,
)
from clustersim.training.layer_mix import LayerMix, chunk_mixes
from clustersim.training.memory import (
    MemoryBreakdown,
    busiest_memory,
    stage_optimizer_params,
    weight_bytes_per_param,
)
from clustersim.training.parallel_groups import SHAPES_KEPT, ParallelGroups, RankGroups
from clustersim.training.pipeline import kept_pipeline
from clustersim.training.profile import StepProfile, renamed
from clustersim.training.ranks import pipeline_stride, rank_chips
from clustersim.training.reduction import DataParallelTimes, GradientReduction
from clustersim.training.shape import alike_shape, leaves_matter, placement_shape
from clustersim.training.stages import chunk_layers
from clustersim.training.transformer import sharded_heads
from clustersim.training.workload import (
    OPTIMIZER_BYTES_TOUCHED_PER_PARAM,
    Op,
    TrainingJob,
    attention_of,
    hardware_flops_per_step,
    model_flops_per_step,
)
from clustersim.training.zero3 import Zero3Costs, Zero3Times, with_zero3

# Step profiles are kept by shape as the placements' parallel groups are (SHAPES_KEPT, the
# least recently used dropped past it): a profile is about 760 bytes pickled.

# matmul_quantisation lives in `chunk`; it stays importable from here.
__all__ = ["StepModel", "matmul_quantisation"]


class StepModel:
    """Step profiles of jobs on a topology, cached by (job, placement shape)."""

    def __init__(self, topology: Topology, collectives: CollectiveModel | None = None):
        self.topology = topology
        self.hardware = topology.hardware
        self.collectives = collectives or CollectiveModel(topology)
        self.chunks = ChunkModel(self.hardware, self.collectives)
        self.reduction = GradientReduction(self.hardware, self.collectives)
        # Bounded: a year of a fleet's placements would otherwise keep every shape it met.
        self._cache: LruCache = LruCache(SHAPES_KEPT)
        self._leaves_matter = leaves_matter(topology)  # (see `_shape`)
        self._alike_in_site = self._leaves_matter and not leaves_matter(topology, sites=False)
        self._alike: LruCache = LruCache(SHAPES_KEPT)  # by `shape.alike_shape`
        self.zero3 = Zero3Costs(self.hardware, self.reduction)
        self._optimizer_cache: dict[tuple, list[float]] = {}
        self.groups = ParallelGroups(self.hardware, self.collectives)
        self._pipelines: LruCache = LruCache(SHAPES_KEPT)  # (`pipeline.kept_pipeline`)

    # ------------------------------------------------------------------ public
    def profile(self, job: TrainingJob, name: str | None = "job", first_instance: int = 0,
                instances: Any = None) -> StepProfile:
        """Simulate one step of `job` on its instances: `instances` (in rank order), or those
        from `first_instance` on. Cached by the placement's shape, so the profile is computed
        on a canonical placement of that shape. `name` None: whatever name the cached
        profile has (a caller reading only its figures saves a copy)."""
        placed = self._placement(job, first_instance, instances)
        key, canonical = self._shape(job, placed)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._simulated_alike(job, name or "job", canonical)
        return cached if name is None or cached.name == name else renamed(cached, name)

    def _simulated_alike(self, job: TrainingJob, name: str, canonical: np.ndarray
                         ) -> StepProfile:
        """The step on `canonical`, or on a placement it cannot be told from (`alike_shape`)."""
        alike = alike_shape(self, job, canonical)
        if alike is None:
            return self._simulate(job, name, canonical)
        found = self._alike.get(alike)
        if found is None:
            found = self._alike[alike] = self._simulate(job, name, canonical)
        return found if found.name == name else renamed(found, name)

    def has_profile(self, job: TrainingJob, instances: Any) -> bool:
        """Whether `profile(job, instances=instances)` is cached (costs no simulation)."""
        return self._shape(job, self._placement(job, 0, instances))[0] in self._cache

    def attention(self, job: TrainingJob) -> str:
        """The job's attention kernel, or the hardware family's usual one."""
        return attention_of(job, self.hardware.chip.framework.attention)

    def memory(self, job: TrainingJob) -> MemoryBreakdown:
        """Memory of the busiest pipeline rank (`memory.busiest_memory`)."""
        par = job.parallelism
        chip = self.hardware.chip
        return busiest_memory(job, self._microbatches(job), chip.hbm_bytes,
                              min(chip.ranks, par.ranks), attention=self.attention(job),
                              gradients=chip.framework.gradients)

    def op_time(self, op: Op, precision: str) -> float:
        """Roofline time of one operation of one rank (the serving model times its ops here)."""
        return self.chunks.shared_op_time_s(op, precision)

    def chunk_times(self, job: TrainingJob, first: bool, last: bool,
                    placed: np.ndarray | None = None, layers: int | None = None,
                    mix: LayerMix | None = None) -> ChunkTimes:
        """One micro-batch through one chunk of `layers` of the job's layers (default the
        most a chunk holds: ceil(layers / (pp x interleave))), plus the embedding if `first`,
        the output layer and loss if `last`): compute and exposed TP, EP, CP and ZeRO-3
        collectives, on rank 0's groups when the job runs on the instances `placed`
        (default: from instance 0); `mix`: the kinds of those layers (`layer_mix`; None:
        the model's mean layer). The step simulates these chunks (`stage_chunks`)."""
        placed = self._placement(job) if placed is None else placed
        par = job.parallelism
        if layers is None:
            layers = -(-job.model.layers // (par.pp * par.interleave))
        groups = self._parallel_groups(job, placed)
        return self._chunk(job, layers, first, last, groups, placed, mix)

    def stage_chunks(self, job: TrainingJob, placed: np.ndarray) -> tuple[ChunkTimes, ...]:
        """Each global chunk's `chunk_times` (0 .. pp x interleave - 1), of its own layers:
        as many as `stages.chunk_layers` gives it, of the kinds `layer_mix.chunk_mixes`
        says, the first with the embedding, the last with the output layer and loss."""
        stages = job.parallelism.pp * job.parallelism.interleave
        counts = chunk_layers(job.model.layers, stages)
        mixes = chunk_mixes(job.model, stages)
        groups = self._parallel_groups(job, placed)
        kinds: dict[tuple, ChunkTimes] = {}
        for g in range(stages):
            kind = (counts[g], g == 0, g == stages - 1, mixes[g])
            if kind not in kinds:
                kinds[kind] = self._chunk(job, *kind[:3], groups, placed, kind[3])
        return tuple(kinds[counts[g], g == 0, g == stages - 1, mixes[g]]
                     for g in range(stages))

    def lower_bound(self, job: TrainingJob) -> float:
        """A lower bound of `profile(job).step_time_s` (on the job's first instances) from
        the step's own pieces, without the simpy pipeline and without solving the contention
        of the data-parallel groups (the planner's bound; `pipeline_bound` for the argument).
        Pass durations are the chunk times the pipeline runs, with ZeRO-3's collectives
        those of rank 0's shard group alone; each pipeline rank's data-parallel reduction
        and gather are those of its first group alone (sharing links only slows them:
        `contention.simultaneous`), left out over several sites. A chunk of layers other
        than the model's mean (`layer_mix`) is timed as the step times it."""
        placed = self._placement(job)
        par = job.parallelism
        stages = par.pp * par.interleave
        counts = chunk_layers(job.model.layers, stages)
        mixes = chunk_mixes(job.model, stages)
        groups = self._parallel_groups(job, placed)
        # ZeRO-3's collectives alone: sharing links only slows them, and a chunk's time does
        # not fall as they grow.
        zero3 = self._zero3(job, placed, alone=True)
        tp_group, ep_group, cp_group = groups

        def times(layers: int, first: bool, last: bool, mix: LayerMix | None = None
                  ) -> ChunkTimes:
            return self.chunks.times(job, layers, first, last, tp_group, ep_group, cp_group,
                                     mix)

        # A chunk's times are affine in its layers (each layer adds its operations and
        # collectives; what TP overlap hides and what the ring exchange hides behind
        # attention are per layer too): from chunks of one and two layers, any count
        # (rounding aside: the bound keeps a margin), without listing its operations.
        if any(mix is None for mix in mixes):
            one = {(first, last): times(1, first, last) for first in (False, True)
                   for last in (False, True)
                   if (first and last) == (stages == 1) or not (first or last)}
            per_layer = chunk_difference(times(2, False, False), one[False, False])
        kinds: dict[tuple, ChunkTimes] = {}
        forward, backward = [], []
        for g in range(stages):
            kind = (counts[g], g == 0, g == stages - 1, mixes[g])
            if kind not in kinds and kind[3] is None:
                chunk = chunk_affine(one[kind[1], kind[2]], per_layer, kind[0] - 1)
                kinds[kind] = with_zero3(chunk, kind[0], kind[1], kind[2], zero3)
            elif kind not in kinds:  # other layers than the mean's: as the step times them
                kinds[kind] = with_zero3(times(*kind), *kind[:3],
                                         self._zero3(job, placed, True, kind[3]))
            forward.append(kinds[kind].forward_s)
            backward.append(kinds[kind].backward_s)
        reduce_s = gather_s = [0.0] * par.pp
        if self.topology.site_count == 1:
            w_bytes, g_bytes, _ = weight_bytes_per_param(job.precision,
                                                         self.hardware.chip.framework.gradients)
            alone = self.reduction.alone_per_pipeline_rank(job, placed, g_bytes, w_bytes)
            reduce_s = [alone[d].reduce_s for d in range(par.pp)]
            gather_s = [alone[d].gather_s for d in range(par.pp)]
        return pipeline_bound(forward, backward, par.pp, self._microbatches(job), reduce_s,
                              gather_s, self._optimizer_s(job))

    def _optimizer_s(self, job: TrainingJob) -> list[float]:
        """The optimizer step of each pipeline rank: its state's bytes at HBM speed."""
        hw, par = self.hardware, job.parallelism
        key = (job.model, par.tp, par.cp, par.pp, par.dp, par.ep, par.interleave,
               par.zero > 0, par.shard_ranks)
        found = self._optimizer_cache.get(key)
        if found is None:
            hbm_rank = (hw.chip.hbm_bandwidth_bytes_per_s / hw.chip.ranks
                        * hw.chip.efficiency.vector)
            found = self._optimizer_cache[key] = [
                stage_optimizer_params(job, d) * OPTIMIZER_BYTES_TOUCHED_PER_PARAM / hbm_rank
                for d in range(par.pp)]
        return found

    def _chunk(self, job: TrainingJob, layers: int, first: bool, last: bool, groups: tuple,
               placed: np.ndarray, mix: LayerMix | None = None) -> ChunkTimes:
        tp_group, ep_group, cp_group = groups
        times = self.chunks.times(job, layers, first, last, tp_group, ep_group, cp_group, mix)
        return with_zero3(times, layers, first, last, self._zero3(job, placed, mix=mix))

    def zero3_traffic_s(self, job: TrainingJob, placed: np.ndarray | None = None
                        ) -> Zero3Times | None:
        """ZeRO-3's collectives, unoverlapped: (all-gather of one layer's weights,
        reduce-scatter of one layer's gradients, the same for the embedding or output
        layer) over rank 0's shard group; None without ZeRO-3."""
        placed = self._placement(job) if placed is None else placed
        return self._zero3(job, placed)

    def _zero3(self, job: TrainingJob, placed: np.ndarray, alone: bool = False,
               mix: LayerMix | None = None) -> Zero3Times | None:
        """ZeRO-3's layer and extra gathers and reduce-scatters (`zero3.Zero3Costs`)."""
        return self.zero3.layer_times(job, placed, alone, mix)

    def data_parallel_times(self, job: TrainingJob, placed: np.ndarray | None = None
                            ) -> dict[int, DataParallelTimes]:
        """(gradient reduction, ZeRO-1 parameter gather) per pipeline rank when the job
        runs on the instances `placed` (default: from instance 0), with the gradients in the
        framework's precision, as the step costs them."""
        placed = self._placement(job) if placed is None else placed
        w_bytes, g_bytes, _ = weight_bytes_per_param(job.precision,
                                                     self.hardware.chip.framework.gradients)
        return self.reduction.per_pipeline_rank(job, placed, g_bytes, w_bytes)

    # ------------------------------------------------------------------ placement
    def _placement(self, job: TrainingJob, first_instance: int = 0, instances: Any = None
                   ) -> np.ndarray:
        """The job's instances in rank order: `instances`, or those from `first_instance`."""
        count = math.ceil(job.parallelism.ranks / self.hardware.ranks_per_instance)
        placed = (np.arange(first_instance, first_instance + count) if instances is None
                  else np.asarray(instances, dtype=np.int64))
        if len(placed) != count:
            raise ValueError(f"the job needs {count} instances, {len(placed)} given")
        return placed

    def _shape(self, job: TrainingJob, placed: np.ndarray) -> tuple[tuple, np.ndarray]:
        """The placement's shape and its canonical placement (`shape.placement_shape`)."""
        return placement_shape(self, job, placed)

    def _microbatches(self, job: TrainingJob) -> int:
        par = job.parallelism
        return job.global_batch // (job.micro_batch * par.dp)

    def _parallel_groups(self, job: TrainingJob, placed: np.ndarray) -> RankGroups:
        """Rank 0's TP group, the slowest expert group and rank 0's CP group
        (`parallel_groups.ParallelGroups.of`)."""
        return self.groups.of(job, placed)

    def _dispatch_size(self, job: TrainingJob) -> float:
        """One rank's bytes in one MoE layer's dispatch (`ParallelGroups.dispatch_size`)."""
        return self.groups.dispatch_size(job)

    # ------------------------------------------------------------------ simulation
    def _simulate(self, job: TrainingJob, name: str, placed: np.ndarray) -> StepProfile:
        hw = self.hardware
        par = job.parallelism
        model = job.model
        if job.precision not in hw.chip.tflops:
            raise ValueError(f"{hw.chip.name} has no {job.precision} peak")
        microbatches = self._microbatches(job)
        instances = math.ceil(par.ranks / hw.ranks_per_instance)
        if int(placed.max()) >= self.topology.instances:
            raise ValueError(
                f"the job is placed on instance {int(placed.max())}, "
                f"the topology has {self.topology.instances}"
            )
        # Per global chunk g (0 .. pp x interleave - 1): forward and backward durations, by
        # its layers and whether it is the first or the last.
        chunks = self.stage_chunks(job, placed)

        # Send/receive between stages: each TP rank sends its shard of the activations (of
        # its context-parallel share of the sequence).
        act_bytes = job.micro_batch * (job.sequence_length // par.cp) * model.hidden * \
            BYTES_PER_ELEMENT[job.precision] / par.tp
        p2p = [0.0] * par.pp  # transfer from pipeline rank d to d+1 (mod pp)
        if par.pp > 1:
            stride = pipeline_stride(par)
            for d in range(par.pp):
                src = rank_chips(hw, np.array([d * stride]), placed)[0]
                dst = rank_chips(hw, np.array([((d + 1) % par.pp) * stride]), placed)[0]
                shards = min(par.tp, hw.chip.ranks)
                p2p[d] = self.collectives.cost("send-recv", Group(np.array([src]), 1),
                                               act_bytes * shards, peer=int(dst)).time_s

        ledgers = kept_pipeline(self._pipelines, par, microbatches, chunks, p2p)

        # Data-parallel reduction and optimizer, per pipeline rank.
        dp_times = self.data_parallel_times(job, placed)
        optimizer = dict(enumerate(self._optimizer_s(job)))
        exposed_dp = {}
        ends = {}
        for d in range(par.pp):
            reduce_time, gather_time = dp_times[d]
            led = ledgers[d]
            # The reduction starts with the last backward pass (bucketed overlap).
            reduce_end = max(led.end_s, led.last_backward_start_s + reduce_time)
            exposed_dp[d] = reduce_end - led.end_s + gather_time
            ends[d] = led.end_s + exposed_dp[d] + optimizer[d]
        critical = max(ends, key=lambda d: ends[d])
        led = ledgers[critical]
        step_time = ends[critical]
        bubble = led.idle_s - led.pp_s
        exposed = {"tp": led.tp_s, "pp": led.pp_s, "dp": exposed_dp[critical] + led.dp_s}
        if model.moe and par.ep > 1:
            exposed["ep"] = led.ep_s
        if par.cp > 1:
            exposed["cp"] = led.cp_s

        memory = self.memory(job)
        tokens = job.global_batch * job.sequence_length
        chips = par.ranks // hw.chip.ranks if par.ranks >= hw.chip.ranks else 1
        energy = None
        if hw.chip.power_w is not None:
            energy = chips * hw.chip.power_w * step_time / tokens
        cost = None
        if hw.instance.price_per_hour_usd is not None:
            cost = instances * hw.instance.price_per_hour_usd * step_time / 3600 / tokens * 1e6
        notes = []
        layout = sharded_heads(model, par.tp)
        if layout.padded(model):
            notes.append(
                f"attention heads padded from {model.heads} to {layout.heads} for tp {par.tp} "
                f"({layout.per_rank} per rank, KV heads {model.n_kv_heads} -> "
                f"{layout.kv_heads}), as NxD pads them: the padded heads' work and weights "
                "are costed")
        if not memory.fits:
            notes.append(
                f"does not fit: {memory.per_chip / 2**30:.1f} GiB per chip needed, "
                f"{hw.chip.hbm_bytes / 2**30:.0f} GiB available"
            )
        return StepProfile(
            name=name, step_time_s=step_time, compute_s=led.compute_s, exposed_comm_s=exposed,
            bubble_s=max(0.0, bubble), optimizer_s=optimizer[critical],
            tokens_per_step=tokens, sequences_per_step=job.global_batch,
            model_flops=model_flops_per_step(job), hardware_flops=hardware_flops_per_step(job),
            peak_flops=chips * hw.chip.peak_flops(job.precision), memory=memory, chips=chips,
            instances=instances, microbatches=microbatches, energy_per_token_j=energy,
            cost_per_million_tokens_usd=cost, notes=tuple(notes),
            error_band=tuple(hw.chip.efficiency.step_error_band),
        )


