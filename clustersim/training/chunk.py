"""The time of one micro-batch's forward and backward pass through one chunk of layers on one
rank: roofline compute per operation plus the chunk's tensor- and expert-parallel collectives.

Compute time per operation is a roofline whose achievable fraction depends on the shape
(`ChunkModel.op_time_s`): a matrix multiply reaches the chip's peak x `matmul` (the fraction
large GEMMs reach) x its tile quantisation (rows and columns padded to the `tile`, the
contraction to `k_tile`: the 128 x 128 systolic array of a NeuronCore, a thread-block tile on
a GPU) x its wave quantisation (output tiles spread over `wave_units`, a GPU's SMs: a last
wave that is partly empty costs a whole one), or is bound by HBM traffic; vector work runs at
HBM bandwidth x `vector`; each forward or backward pass of a micro-batch through a stage adds
a fixed `pass_overhead` (launching the stage's compiled graph or kernels and synchronising
its transfers: per pass, so it weighs on many small micro-batches and deep pipelines).
`matmul`, `vector` and `pass_overhead` are the three fitted constants of a chip family; the
rest are physical (NVIDIA's "Matrix Multiplication Background" guide describes tile and wave
quantisation). Small or tensor-parallel-sliced matrices therefore reach a lower fraction of
peak.

The tensor-parallel collectives of each layer (all-reduce, or all-gather and reduce-scatter
with sequence parallelism) are on the critical path, except the backward ones a framework
overlaps with the weight-gradient GEMMs (`framework.tp_overlap`); the expert-parallel
all-to-alls of a mixture of experts count the bytes of the chip's other expert groups, which
exchange at the same time through the same links.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clustersim.collectives.model import CollectiveModel, Group
from clustersim.hardware.catalog import HardwareSpec
from clustersim.training.experts import expert_load
from clustersim.training.layer_mix import LayerMix
from clustersim.training.workload import (
    Op,
    TrainingJob,
    attention_of,
    stage_work,
)

__all__ = ["ChunkTimes", "ChunkModel", "matmul_quantisation", "distinct_ops"]

# The linear layers' weight-gradient GEMMs, behind which `tp_overlap` hides TP collectives.
_TP_WGRADS = ("qkv_wgrad", "projection_wgrad", "mlp_in_wgrad", "mlp_out_wgrad")


@dataclass(frozen=True)
class ChunkTimes:
    """One micro-batch through one chunk of layers on one rank, forward and backward: compute
    (with the pass overhead), exposed tensor-parallel and expert-parallel collectives."""

    forward_compute_s: float
    forward_tp_s: float
    backward_compute_s: float
    backward_tp_s: float
    forward_ep_s: float = 0.0  # expert-parallel all-to-alls (mixture of experts)
    backward_ep_s: float = 0.0
    forward_cp_s: float = 0.0  # context parallelism's exchange, exposed
    backward_cp_s: float = 0.0
    forward_dp_s: float = 0.0  # ZeRO-3's parameter gathers (and gradient reduce-scatters)
    backward_dp_s: float = 0.0

    @property
    def forward_s(self) -> float:
        return self.forward_compute_s + self.forward_tp_s + self.forward_ep_s + (
            self.forward_cp_s + self.forward_dp_s)

    @property
    def backward_s(self) -> float:
        return self.backward_compute_s + self.backward_tp_s + self.backward_ep_s + (
            self.backward_cp_s + self.backward_dp_s)

    @property
    def forward_and_backward_s(self) -> float:
        """Every part added up: the chunk's busy time for one micro-batch."""
        return self.forward_s + self.backward_s


class ChunkModel:
    """Per-operation roofline times and per-chunk times on one hardware, chunk times cached
    by (job, chunk, the shape of its tensor- and expert-parallel groups)."""

    def __init__(self, hardware: HardwareSpec, collectives: CollectiveModel):
        self.hardware = hardware
        self.collectives = collectives
        self._cache: dict[tuple, ChunkTimes] = {}
        # Operation times by identity (training.workload shares a layer's operations between
        # the chunks and bounds of its shape); each entry holds its operation, so the id
        # stays its own.
        self._op_times: dict[int, tuple[Op, str, float]] = {}

    def op_time_s(self, op: Op, precision: str) -> float:
        """Time of one operation on one rank (see the module docstring)."""
        hw = self.hardware
        ranks = hw.chip.ranks
        eff = hw.chip.efficiency
        hbm = hw.chip.hbm_bandwidth_bytes_per_s / ranks * eff.vector
        memory_time = op.bytes / hbm
        if op.kind == "vector":
            return memory_time
        peak = hw.chip.peak_flops(precision) / ranks
        return max(op.flops / (peak * eff.matmul * matmul_quantisation(op, eff)), memory_time)

    def shared_op_time_s(self, op: Op, precision: str) -> float:
        """op_time_s, kept by the operation's identity."""
        found = self._op_times.get(id(op))
        if found is not None and found[0] is op and found[1] == precision:
            return found[2]
        if len(self._op_times) >= 200_000:
            self._op_times.clear()
        time_s = self.op_time_s(op, precision)
        self._op_times[id(op)] = (op, precision, time_s)
        return time_s

    def times(self, job: TrainingJob, layers: int, first: bool, last: bool,
              tp_group: Group | None, ep_group: tuple[Group, int] | None = None,
              cp_group: tuple[Group, int] | None = None, mix: LayerMix | None = None
              ) -> ChunkTimes:
        """`layers` layers (plus the embedding if `first`, the output layer and loss if
        `last`) with their TP collectives on `tp_group`, their all-to-alls on `ep_group` and
        context parallelism's exchange on `cp_group` (each: the group, and how many such
        groups share each of its chips); `mix`: which kinds of layer they are
        (`layer_mix.chunk_mixes`; None: the model's mean layer).

        The ring exchange of context parallelism runs during the attention kernel: only
        what it takes beyond the attention's own time is exposed; the all-to-alls are."""
        shape = None
        if tp_group is not None:  # the TP group's shape: chips relative to its instance
            cpi = self.hardware.chips_per_instance
            base = int(tp_group.chips[0]) - int(tp_group.chips[0]) % cpi
            shape = (tuple((tp_group.chips - base).tolist()), tp_group.ranks_per_chip,
                     (base // cpi) % self.hardware.instances_per_ultraserver)
        ep_shape = None if ep_group is None else (tuple(ep_group[0].chips.tolist()),
                                                  ep_group[0].ranks_per_chip, ep_group[1])
        cp_shape = None if cp_group is None else (tuple(cp_group[0].chips.tolist()),
                                                  cp_group[0].ranks_per_chip, cp_group[1])
        attention = attention_of(job, self.hardware.chip.framework.attention)
        par = job.parallelism  # what stage_work reads of it: not pp, dp, ZeRO or interleave
        key = (job.model, job.sequence_length, job.micro_batch, par.tp, par.cp,
               par.sequence_parallel, par.ep, par.cp_comm, job.precision, job.recompute,
               attention, layers, first, last, shape, ep_shape, cp_shape, expert_load(job), mix)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        work = stage_work(job, layers, first, last, attention, mix)
        overhead = self.hardware.chip.efficiency.pass_overhead_s
        seen: dict[int, float] = {}  # a layer's operations repeat (the same objects)

        def op_time(op: Op) -> float:
            found = seen.get(id(op))
            if found is None:
                found = seen[id(op)] = self.shared_op_time_s(op, job.precision)
            return found

        distinct: dict[int, list[tuple[Op, int]]] = {}  # forward, backward: counted once

        def total(ops: tuple[Op, ...], keep: Callable[[Op], bool] | None = None) -> float:
            if mix is None:  # in the listed order, as before chunks had mixes
                return (sum(map(op_time, ops)) if keep is None
                        else sum(op_time(op) for op in ops if keep(op)))
            counted = distinct.get(id(ops))
            if counted is None:
                counted = distinct[id(ops)] = distinct_ops(ops)
            return sum(op_time(op) * n for op, n in counted if keep is None or keep(op))

        fwd = overhead + total(work.forward)
        bwd = overhead + total(work.backward)

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
        tp_backward = comm(work.tp_collectives_backward, tp_group)
        if self.hardware.chip.framework.tp_overlap and tp_group is not None:
            # Hidden behind the weight-gradient GEMMs of the linear layers (Korthikanti et
            # al. 2022, section 6.2): as much as those take.
            wgrad = total(work.backward, lambda op: op.name in _TP_WGRADS)
            tp_backward -= min(comm(work.tp_collectives_overlappable, tp_group), wgrad)
        cp_fwd = cp_bwd = 0.0
        if cp_group is not None:
            cp_fwd = comm(work.cp_collectives_forward, cp_group[0], cp_group[1])
            cp_bwd = comm(work.cp_collectives_backward, cp_group[0], cp_group[1])
            if work.cp_overlaps_attention:
                names = ("attention", "scores", "softmax", "dropout", "attend")
                hidden_f = total(work.forward, lambda op: op.name in names)
                hidden_b = total(work.backward, lambda op: op.name.split("_")[0] in names)
                cp_fwd = max(0.0, cp_fwd - hidden_f)
                cp_bwd = max(0.0, cp_bwd - hidden_b)
        cached = ChunkTimes(fwd, comm(work.tp_collectives_forward, tp_group), bwd,
                            tp_backward,
                            comm(work.ep_collectives_forward, expert_group, sharing),
                            comm(work.ep_collectives_backward, expert_group, sharing),
                            cp_fwd, cp_bwd)
        self._cache[key] = cached
        return cached


def distinct_ops(ops: tuple[Op, ...]) -> list[tuple[Op, int]]:
    """Each distinct operation of `ops` (by identity: a layer's repeat) with how many times
    it comes, in order of first coming: a chunk's layers list the same few operations many
    times over, so a sum over them times each once and counts it."""
    counts = Counter(map(id, ops))
    by_id = dict(zip(map(id, ops), ops, strict=True))
    return [(by_id[i], n) for i, n in counts.items()]


def matmul_quantisation(op: Op, eff: Any) -> float:
    """Fraction of the array's work that is useful for this shape: rows and columns padded
    to the tile and the contraction to k_tile (tile quantisation), and the output tiles of
    all `count` products spread over `wave_units` in whole waves (wave quantisation; when
    they are fewer than the units, split along the contraction)."""
    def padded(size: int, step: int) -> int:
        return math.ceil(size / step) * step

    if not (op.m and op.n and op.k):
        return 1.0
    tiles = padded(op.m, eff.tile) * padded(op.n, eff.tile) * padded(op.k, eff.k_tile)
    quantisation = op.m * op.n * op.k / tiles
    if eff.wave_units > 1:
        blocks = math.ceil(op.m / eff.tile) * math.ceil(op.n / eff.tile) * op.count
        if blocks < eff.wave_units:
            # Too few output tiles to fill the units: the contraction is split between them
            # (split-K / stream-K in cuBLAS and CUTLASS), in chunks of at least 4 k-steps.
            blocks *= max(1, min(eff.wave_units // blocks, math.ceil(op.k / (4 * eff.k_tile))))
        quantisation *= blocks / (math.ceil(blocks / eff.wave_units) * eff.wave_units)
    return quantisation


def chunk_difference(a: ChunkTimes, b: ChunkTimes) -> ChunkTimes:
    return ChunkTimes(*(x - y for x, y in zip(vars(a).values(), vars(b).values(),
                                               strict=True)))


def chunk_affine(base: ChunkTimes, step: ChunkTimes, times: int) -> ChunkTimes:
    """`base` plus `times` x `step`, field by field."""
    if times == 0:
        return base
    return ChunkTimes(*(x + times * y for x, y in zip(vars(base).values(),
                                                       vars(step).values(), strict=True)))
