"""One training step of a job on placed chips, simulated with simpy, one process per
pipeline stage (never per chip).

Placement follows Neuron and Megatron: rank r = tp_rank + tp x (pp_rank + pp x dp_rank);
ranks fill a chip's cores, chips an instance, in order, so tensor parallelism is innermost
(on the torus or switch), then pipeline stages, then data parallelism across instances.
Every collective therefore runs on a real group of the graph:

- tensor-parallel collectives inside each layer (all-reduce, or all-gather and
  reduce-scatter with sequence parallelism), on the critical path;
- send/receive of activations and gradients between neighbouring stages (each TP rank sends
  its shard);
- the data-parallel gradient reduction (all-reduce, or reduce-scatter then parameter
  all-gather with ZeRO-1), started with the last backward pass as bucketed frameworks do,
  shared by the data-parallel groups that run at once on the same links;
- the optimizer step, memory-bound.

Compute time per operation is a roofline: matrix work at the chip's peak x its matmul
efficiency x the tile quantisation of the shape (dimensions padded to the tile), vector work
at HBM bandwidth x its vector efficiency (the calibrated constants of the catalog).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from clustersim.collectives.model import CollectiveCost, CollectiveModel, Group, simultaneous
from clustersim.hardware.topology import Topology
from clustersim.training.schedule import peak_in_flight, pipeline_order
from clustersim.training.workload import (
    BYTES_PER_ELEMENT,
    OPTIMIZER_BYTES_TOUCHED_PER_PARAM,
    MemoryBreakdown,
    Op,
    TrainingJob,
    expert_params_per_rank,
    hardware_flops_per_step,
    memory_per_rank,
    model_flops_per_step,
    optimizer_params_per_rank,
    params_per_rank,
    stage_work,
    weight_bytes_per_param,
)

__all__ = ["StepProfile", "StepModel", "JobDoesNotFit"]


class JobDoesNotFit(Exception):
    """Raised by callers that refuse to run a job whose memory exceeds the chip's HBM."""


@dataclass(frozen=True)
class StepProfile:
    """One step of one job: its time, where the time goes, throughput, efficiency, memory."""

    name: str
    step_time_s: float
    compute_s: float
    exposed_comm_s: dict[str, float]  # tp, pp, dp
    bubble_s: float
    optimizer_s: float
    tokens_per_step: int
    sequences_per_step: int
    model_flops: float
    hardware_flops: float
    peak_flops: float  # of all the job's chips at its precision
    memory: MemoryBreakdown
    chips: int
    instances: int
    microbatches: int
    energy_per_token_j: float | None
    cost_per_million_tokens_usd: float | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def sequences_per_s(self) -> float:
        return self.sequences_per_step / self.step_time_s

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.step_time_s * self.peak_flops)

    @property
    def hfu(self) -> float:
        return self.hardware_flops / (self.step_time_s * self.peak_flops)

    @property
    def fits_memory(self) -> bool:
        return self.memory.fits

    def as_dict(self) -> dict[str, Any]:
        """The contract's `step --json` entry (plus more detail)."""
        return {
            "name": self.name,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "sequences_per_s": self.sequences_per_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "memory_per_chip_gib": self.memory.per_chip / 2**30,
            "fits_memory": self.fits_memory,
            "step_breakdown": {
                "compute_s": self.compute_s,
                "exposed_comm_s": sum(self.exposed_comm_s.values()),
                "bubble_s": self.bubble_s,
                "optimizer_s": self.optimizer_s,
                **{f"{kind}_comm_s": value for kind, value in self.exposed_comm_s.items()},
            },
            "memory_gib": self.memory.as_gib(),
            "chips": self.chips,
            "instances": self.instances,
            "microbatches": self.microbatches,
            "tokens_per_step": self.tokens_per_step,
            "energy_per_token_j": self.energy_per_token_j,
            "cost_per_million_tokens_usd": self.cost_per_million_tokens_usd,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class _ChunkTimes:
    forward_compute: float
    forward_tp: float
    backward_compute: float
    backward_tp: float
    forward_ep: float = 0.0  # expert-parallel all-to-alls (mixture of experts)
    backward_ep: float = 0.0


class StepModel:
    """Step profiles of jobs on a topology, cached by (job, placement shape)."""

    def __init__(self, topology: Topology, collectives: CollectiveModel | None = None):
        self.topology = topology
        self.hardware = topology.hardware
        self.collectives = collectives or CollectiveModel(topology)
        self._cache: dict[tuple, StepProfile] = {}
        self._chunk_cache: dict[tuple, _ChunkTimes] = {}

    # ------------------------------------------------------------------ public
    def profile(self, job: TrainingJob, name: str = "job", first_instance: int = 0,
                instances: Any = None) -> StepProfile:
        """Simulate one step of `job` on its instances: `instances` (in rank order), or those
        from `first_instance` on. Cached by the placement's shape, so the profile is computed
        on a canonical placement of that shape."""
        hw = self.hardware
        count = math.ceil(job.parallelism.ranks / hw.ranks_per_instance)
        placed = (np.arange(first_instance, first_instance + count) if instances is None
                  else np.asarray(instances, dtype=np.int64))
        if len(placed) != count:
            raise ValueError(f"the job needs {count} instances, {len(placed)} given")
        key, canonical = self._shape(job, placed)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._simulate(job, name, canonical)
            self._cache[key] = cached
        return cached if cached.name == name else _renamed(cached, name)

    def memory(self, job: TrainingJob) -> MemoryBreakdown:
        par = job.parallelism
        microbatches = self._microbatches(job)
        orders = pipeline_order(par.pp, microbatches, par.interleave)
        in_flight = peak_in_flight(orders[0]) / par.interleave
        return memory_per_rank(job, in_flight, self.hardware.chip.hbm_bytes,
                               min(self.hardware.chip.ranks, par.ranks))

    # ------------------------------------------------------------------ placement
    def _shape(self, job: TrainingJob, placed: np.ndarray) -> tuple[tuple, np.ndarray]:
        """The placement's shape (instances per leaf, in order, and per UltraServer) and a
        canonical placement of that shape: each leaf's share from the start of a leaf."""
        par = job.parallelism
        hw = self.hardware
        per_leaf = self.topology.fabric.leaf_size(hw.instances_per_ultraserver)
        ipu = hw.instances_per_ultraserver
        leaves = placed // per_leaf
        _, first_seen = np.unique(leaves, return_index=True)
        order = leaves[np.sort(first_seen)]
        leaf_counts = tuple(int(np.count_nonzero(leaves == leaf)) for leaf in order)
        us_counts = tuple(sorted(np.unique(placed // ipu, return_counts=True)[1].tolist()))
        offset = int(placed[0] % ipu)
        key = (job.model, job.sequence_length, job.global_batch, job.micro_batch, par,
               job.precision, job.recompute, hw.name, len(placed), offset, leaf_counts,
               us_counts)
        if np.array_equal(placed, np.arange(placed[0], placed[0] + len(placed))):
            return key, placed
        canonical = np.concatenate([leaf * per_leaf + offset % per_leaf + np.arange(count)
                                    for leaf, count in enumerate(leaf_counts)])
        if canonical.max() >= self.topology.instances or len(np.unique(canonical)) != len(placed):
            canonical = placed  # no room for the canonical form: use the placement itself
        return key, canonical

    def _microbatches(self, job: TrainingJob) -> int:
        par = job.parallelism
        return job.global_batch // (job.micro_batch * par.dp)

    def _rank_chips(self, ranks: np.ndarray, placed: np.ndarray) -> np.ndarray:
        """Chip of each rank: ranks fill a chip's cores, chips an instance, instances in order."""
        hw = self.hardware
        k = hw.chip.ranks
        rpi = hw.ranks_per_instance
        return placed[ranks // rpi] * hw.chips_per_instance + (ranks % rpi) // k

    def _group(self, ranks: np.ndarray, placed: np.ndarray) -> tuple[Group, int]:
        """The group of these ranks, and how many such groups share each of its chips."""
        chips = self._rank_chips(ranks, placed)
        group = Group.from_rank_chips(chips.tolist())
        return group, max(1, self.hardware.chip.ranks // group.ranks_per_chip)

    # ------------------------------------------------------------------ compute
    def op_time(self, op: Op, precision: str) -> float:
        """Roofline time of one operation of one rank (the serving model times its ops here)."""
        return self._op_time(op, precision)

    def _op_time(self, op: Op, precision: str) -> float:
        hw = self.hardware
        k = hw.chip.ranks
        eff = hw.chip.efficiency
        hbm = hw.chip.hbm_bandwidth_bytes_per_s / k * eff.vector
        memory_time = op.bytes / hbm
        if op.kind == "vector":
            return memory_time
        peak = hw.chip.peak_flops(precision) / k
        tile = eff.tile
        padded = (math.ceil(op.m / tile) * tile * math.ceil(op.n / tile) * tile
                  * math.ceil(op.k / tile) * tile)
        quantisation = op.m * op.n * op.k / padded if padded else 1.0
        return max(op.flops / (peak * eff.matmul * quantisation), memory_time)

    def _chunk_times(self, job: TrainingJob, layers: int, first: bool, last: bool,
                     tp_group: Group | None, ep_group: tuple[Group, int] | None = None
                     ) -> _ChunkTimes:
        shape = None
        if tp_group is not None:  # the TP group's shape: chips relative to its instance
            cpi = self.hardware.chips_per_instance
            base = int(tp_group.chips[0]) - int(tp_group.chips[0]) % cpi
            shape = (tuple((tp_group.chips - base).tolist()), tp_group.ranks_per_chip,
                     (base // cpi) % self.hardware.instances_per_ultraserver)
        ep_shape = None if ep_group is None else (tuple(ep_group[0].chips.tolist()),
                                                  ep_group[0].ranks_per_chip, ep_group[1])
        key = (job.model, job.sequence_length, job.micro_batch, job.parallelism, job.precision,
               job.recompute, layers, first, last, shape, ep_shape)
        cached = self._chunk_cache.get(key)
        if cached is not None:
            return cached
        work = stage_work(job, layers, first, last)
        fwd = sum(self._op_time(op, job.precision) for op in work.forward)
        bwd = sum(self._op_time(op, job.precision) for op in work.backward)

        def comm(collectives: tuple[tuple[str, float], ...], group: Group | None,
                 sharing: int = 1) -> float:
            if group is None:
                return 0.0
            counts = Counter(collectives)  # the same collective, layer after layer
            return sum(self.collectives.cost(op, group, size * sharing).time_s * n
                       for (op, size), n in counts.items())

        # The expert groups of a chip's other ranks exchange at the same time through the
        # same links: their bytes are counted together.
        expert_group, sharing = ep_group if ep_group is not None else (None, 1)
        cached = _ChunkTimes(fwd, comm(work.tp_collectives_forward, tp_group), bwd,
                             comm(work.tp_collectives_backward, tp_group),
                             comm(work.ep_collectives_forward, expert_group, sharing),
                             comm(work.ep_collectives_backward, expert_group, sharing))
        self._chunk_cache[key] = cached
        return cached

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
        stages = par.pp * par.interleave
        layers_per_chunk = model.layers // stages
        all_ranks = np.arange(par.ranks)
        tp_group = None
        if par.tp > 1:
            tp_group, _ = self._group(all_ranks[: par.tp], placed)
        ep_group = None
        if model.moe and par.ep > 1:  # rank 0's expert group: dp ranks 0 .. ep-1
            stride = par.tp * par.pp
            ep_group = self._group(all_ranks[: par.ep * stride: stride], placed)

        # Per global chunk g (0 .. stages-1): forward and backward durations.
        kinds = {}
        for g in (0, stages - 1, 1 if stages > 2 else 0):
            kinds[g] = self._chunk_times(job, layers_per_chunk, g == 0, g == stages - 1, tp_group,
                                         ep_group)

        def times(g: int) -> _ChunkTimes:
            return kinds[g] if g in kinds else kinds[1 if stages > 2 else 0]

        # Send/receive between stages: each TP rank sends its shard of the activations.
        act_bytes = job.micro_batch * job.sequence_length * model.hidden * BYTES_PER_ELEMENT[
            job.precision] / par.tp
        p2p = [0.0] * par.pp  # transfer from pipeline rank d to d+1 (mod pp)
        if par.pp > 1:
            for d in range(par.pp):
                src = self._rank_chips(np.array([d * par.tp]), placed)[0]
                dst = self._rank_chips(np.array([((d + 1) % par.pp) * par.tp]), placed)[0]
                shards = min(par.tp, hw.chip.ranks)
                p2p[d] = self.collectives.cost("send-recv", Group(np.array([src]), 1),
                                               act_bytes * shards, peer=int(dst)).time_s

        orders = pipeline_order(par.pp, microbatches, par.interleave)
        env = simpy.Environment()
        done: dict[tuple[str, int, int], simpy.Event] = {}
        finished_at: dict[tuple[str, int, int], float] = {}
        ledger = {d: {"compute": 0.0, "tp": 0.0, "ep": 0.0, "pp": 0.0, "idle": 0.0, "end": 0.0,
                      "last_backward": 0.0, "last_backward_start": 0.0} for d in range(par.pp)}

        def event(key: tuple[str, int, int]) -> simpy.Event:
            if key not in done:
                done[key] = env.event()
            return done[key]

        def stage(d: int):
            for kind, chunk, mb in orders[d]:
                g = chunk * par.pp + d
                ready_from: tuple[str, int, int] | None = None
                transfer = 0.0
                if kind == "F" and g > 0:
                    ready_from = ("F", g - 1, mb)
                    transfer = p2p[(d - 1) % par.pp]
                elif kind == "B" and g < stages - 1:
                    ready_from = ("B", g + 1, mb)
                    transfer = p2p[d]  # gradients flow back over the same pair of chips
                waited_from = env.now
                if ready_from is not None:
                    yield event(ready_from)
                    arrival = finished_at[ready_from] + transfer
                    if arrival > env.now:
                        in_transfer = arrival - max(finished_at[ready_from], waited_from)
                        ledger[d]["pp"] += max(0.0, in_transfer)
                        yield env.timeout(arrival - env.now)
                ledger[d]["idle"] += env.now - waited_from
                t = times(g)
                compute = t.forward_compute if kind == "F" else t.backward_compute
                tp = t.forward_tp if kind == "F" else t.backward_tp
                ep = t.forward_ep if kind == "F" else t.backward_ep
                start = env.now
                yield env.timeout(compute + tp + ep)
                ledger[d]["compute"] += compute
                ledger[d]["tp"] += tp
                ledger[d]["ep"] += ep
                key = (kind, g, mb)
                finished_at[key] = env.now
                event(key).succeed()
                if kind == "B":
                    ledger[d]["last_backward_start"] = start
                    ledger[d]["last_backward"] = env.now
            ledger[d]["end"] = env.now

        for d in range(par.pp):
            env.process(stage(d))
        env.run()

        # Data-parallel reduction and optimizer, per pipeline rank.
        w_bytes, g_bytes, _ = weight_bytes_per_param(job.precision)
        dp_times = self._data_parallel_times(job, placed, g_bytes, w_bytes)
        optimizer = {}
        hbm_rank = hw.chip.hbm_bandwidth_bytes_per_s / hw.chip.ranks * hw.chip.efficiency.vector
        ends = {}
        for d in range(par.pp):
            shard = optimizer_params_per_rank(job, d == 0, d == par.pp - 1)
            optimizer[d] = shard * OPTIMIZER_BYTES_TOUCHED_PER_PARAM / hbm_rank
            reduce_time, gather_time = dp_times[d]
            led = ledger[d]
            # The reduction starts with the last backward pass (bucketed overlap).
            reduce_end = max(led["end"], led["last_backward_start"] + reduce_time)
            led["dp"] = reduce_end - led["end"] + gather_time
            ends[d] = led["end"] + led["dp"] + optimizer[d]
        critical = max(ends, key=lambda d: ends[d])
        led = ledger[critical]
        step_time = ends[critical]
        bubble = led["idle"] - led["pp"]
        exposed = {"tp": led["tp"], "pp": led["pp"], "dp": led["dp"]}
        if model.moe and par.ep > 1:
            exposed["ep"] = led["ep"]

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
        if not memory.fits:
            notes.append(
                f"does not fit: {memory.per_chip / 2**30:.1f} GiB per chip needed, "
                f"{hw.chip.hbm_bytes / 2**30:.0f} GiB available"
            )
        return StepProfile(
            name=name, step_time_s=step_time, compute_s=led["compute"], exposed_comm_s=exposed,
            bubble_s=max(0.0, bubble), optimizer_s=optimizer[critical],
            tokens_per_step=tokens, sequences_per_step=job.global_batch,
            model_flops=model_flops_per_step(job), hardware_flops=hardware_flops_per_step(job),
            peak_flops=chips * hw.chip.peak_flops(job.precision), memory=memory, chips=chips,
            instances=instances, microbatches=microbatches, energy_per_token_j=energy,
            cost_per_million_tokens_usd=cost, notes=tuple(notes),
        )

    def _data_parallel_times(self, job: TrainingJob, placed: np.ndarray, grad_bytes: int,
                             weight_bytes: int) -> dict[int, tuple[float, float]]:
        """(gradient reduction, parameter gather) per pipeline rank.

        A stage has one data-parallel group per TP rank. Groups on the same chips run as one
        collective carrying all their gradients; groups on different chips of the same
        instances share the instance's links max-min fairly (`simultaneous`) when they have
        several chips per instance (one chip per instance each means their own NICs and Z
        links: nothing shared). A mixture of experts reduces its expert weights afterwards,
        over the dp / ep ranks that hold the same experts.
        """
        par = job.parallelism
        stride = par.tp * par.pp
        experts = expert_params_per_rank(job)
        out = {}
        for d in range(par.pp):
            dense = params_per_rank(job, d == 0, d == par.pp - 1) - experts
            dp_ranks = [d * par.tp + t + stride * np.arange(par.dp) for t in range(par.tp)]
            reduce_s, gather_s = self._reduction(par.zero, dp_ranks, dense, grad_bytes,
                                                 weight_bytes, placed)
            if experts and par.dp > par.ep:
                replicas = np.arange(0, par.dp, par.ep)  # dp ranks holding the same experts
                expert_ranks = [d * par.tp + t + stride * (r + replicas)
                                for t in range(par.tp) for r in range(par.ep)]
                more = self._reduction(par.zero, expert_ranks, experts, grad_bytes,
                                       weight_bytes, placed)
                reduce_s, gather_s = reduce_s + more[0], gather_s + more[1]
            out[d] = (reduce_s, gather_s)
        return out

    def _reduction(self, zero: int, groups: list[np.ndarray], params: float, grad_bytes: int,
                   weight_bytes: int, placed: np.ndarray) -> tuple[float, float]:
        """(reduction, gather) of `params` per rank over these groups of ranks at once."""
        if len(groups[0]) == 1:
            return 0.0, 0.0
        by_chips: dict[bytes, tuple[np.ndarray, int]] = {}
        for ranks in groups:
            key = self._rank_chips(ranks, placed).tobytes()
            first, count = by_chips.get(key, (ranks, 0))
            by_chips[key] = (first, count + 1)
        first_chips = self._rank_chips(groups[0], placed)
        if len(np.unique(first_chips // self.hardware.chips_per_instance)) == len(first_chips):
            # Each group has its own chip per instance (own NIC, own Z links): the groups
            # are translations of one another and share nothing; one stands for all.
            first_key = next(iter(by_chips))
            by_chips = {first_key: by_chips[first_key]}
        reduces, gathers = [], []
        for ranks, together in by_chips.values():
            group = Group.from_rank_chips(self._rank_chips(ranks, placed).tolist())
            grads = params * grad_bytes * together
            if zero == 1:
                reduces.append(self.collectives.cost("reduce-scatter", group, grads))
                gathers.append(self.collectives.cost(
                    "all-gather", group, params * weight_bytes * together))
            else:
                reduces.append(self.collectives.cost("all-reduce", group, grads))
        chips = reduces[0].group.chips
        instances = len(np.unique(chips // self.hardware.chips_per_instance))
        shared = len(chips) > instances  # several chips of one group in an instance
        return (_slowest(self.collectives, reduces, shared),
                _slowest(self.collectives, gathers, shared))


def _slowest(model: CollectiveModel, costs: list[CollectiveCost], shared: bool) -> float:
    """Time until the last of collectives running at once is done."""
    if not costs:
        return 0.0
    if len(costs) == 1 or not shared:
        return max(c.time_s for c in costs)
    return max(c.time_s for c in simultaneous(model, costs))


def _renamed(profile: StepProfile, name: str) -> StepProfile:
    from dataclasses import replace

    return replace(profile, name=name)
