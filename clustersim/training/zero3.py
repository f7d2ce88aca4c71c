"""ZeRO-3 in a training step's passes: each layer's weights gathered over the shard group
before its forward and again before its backward, its gradients reduce-scattered after.

The costs (`Zero3Costs.layer_times`) are one layer's gather and reduce-scatter and those of
the embedding or output layer (the first or last stage's), unoverlapped, on rank 0's shard
group run at once with the others on the same links (`GradientReduction.zero3_layer_times`;
`alone`: rank 0's group by itself, a lower bound). A mixture's routed experts are gathered
over the ranks holding the same experts (`GradientReduction.zero3_mean_layer_times`). A
pipeline chunk's layer is the mean of the layers it holds (training.layer_mix): a chunk of
dense layers gathers no experts. The other stages gathering at the same time are taken to
move as many bytes as this one.

The overlap (`with_zero3`): the next layer's gather runs during this layer's compute (one
ahead), so a chunk's first gather is exposed and each later one by what it takes beyond its
layer's compute; the last reduce-scatter too.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from clustersim.hardware.catalog import HardwareSpec
from clustersim.training.chunk import ChunkTimes
from clustersim.training.layer_mix import LayerMix
from clustersim.training.memory import weight_bytes_per_param
from clustersim.training.ranks import experts_inside
from clustersim.training.reduction import GradientReduction
from clustersim.training.workload import TrainingJob

__all__ = ["Zero3Costs", "Zero3Times", "with_zero3"]

# (all-gather of one layer's weights, reduce-scatter of one layer's gradients, the same for
# the embedding or output layer), unoverlapped, in seconds.
Zero3Times = tuple[float, float, float, float]


class Zero3Costs:
    """ZeRO-3's per-layer collectives of jobs on one hardware, kept by what they depend on
    (the planner asks for many candidates that share it)."""

    def __init__(self, hardware: HardwareSpec, reduction: GradientReduction):
        self.hardware = hardware
        self.reduction = reduction
        self._cache: dict[tuple, Zero3Times] = {}

    def layer_times(self, job: TrainingJob, placed: np.ndarray, alone: bool = False,
                    mix: LayerMix | None = None) -> Zero3Times | None:
        """ZeRO-3's layer and extra gathers and reduce-scatters; `alone`: rank 0's shard
        group without the others it shares links with (a lower bound); `mix`: the layer is
        the mean of a chunk's (`layer_mix.chunk_mixes`; None: of the model's); None without
        ZeRO-3."""
        par = job.parallelism
        if par.zero != 3 or par.shard_ranks == 1:
            return None
        key = (job.model, job.precision, par.tp, par.cp, par.pp, par.dp, par.ep,
               experts_inside(par), par.shard_ranks, placed.tobytes(), alone, mix)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        w_bytes, g_bytes, _ = weight_bytes_per_param(job.precision,
                                                     self.hardware.chip.framework.gradients)
        extra = job.model.vocab * job.model.hidden / par.tp
        # A layer's dense weights over the shard group, its experts over their holders.
        share = None if mix is None else mix.moe_share
        layer_s = self.reduction.zero3_mean_layer_times(job, placed, g_bytes, w_bytes, alone,
                                                        share)
        if alone:
            cached = self._cache[key] = (
                *layer_s,
                *self.reduction.zero3_layer_times_alone(job, placed, extra, g_bytes, w_bytes))
            return cached
        gather_s, scatter_s = layer_s
        # The embedding's and output layer's: the first or last stage's TP ranks at once.
        extra_gather_s, extra_scatter_s = self.reduction.zero3_layer_times(
            job, placed, extra, g_bytes, w_bytes, every_stage=False)
        cached = self._cache[key] = (gather_s, scatter_s, extra_gather_s, extra_scatter_s)
        return cached


def with_zero3(times: ChunkTimes, layers: int, first: bool, last: bool,
               zero3: Zero3Times | None) -> ChunkTimes:
    """`times` of a chunk of `layers` layers with ZeRO-3's exposed gathers and
    reduce-scatters (see the module); unchanged without ZeRO-3."""
    if zero3 is None:
        return times
    gather_s, scatter_s, extra_gather_s, extra_scatter_s = zero3
    units = layers + (1 if first or last else 0)
    extra_g = extra_gather_s * (first + last)
    extra_r = extra_scatter_s * (first + last)
    fwd_comm = layers * gather_s + extra_g
    bwd_gather = layers * gather_s + extra_g
    bwd_comm = bwd_gather + layers * scatter_s + extra_r
    fwd_c = times.forward_compute_s / units
    bwd_c = times.backward_compute_s / units
    fwd = fwd_comm / units + (units - 1) * max(0.0, fwd_comm / units - fwd_c)
    bwd = (bwd_gather / units + (units - 1) * max(0.0, bwd_comm / units - bwd_c)
           + (layers * scatter_s + extra_r) / units)
    return replace(times, forward_dp_s=fwd, backward_dp_s=bwd)
