"""The quick bound and the simulation of a candidate's step, both on the step model.

The bound is a lower bound of the simulated step time from the same roofline the step model
uses (its per-operation time and pass overhead), with no communication, through the
pipeline's dependencies (`training.step.pipeline_bound`): each pipeline rank runs every
forward and backward pass of its chunks one after another, starts only after the first
micro-batch went forward through the ranks before it, and its last backward pass still has
to go back through them. Candidates are taken in order of that bound; one that could still
win gets the tighter `quick_bound` (the same passes with their collectives, each pipeline
rank's data-parallel reduction alone and its optimizer step, from the step model), and only
one that could still win after that is simulated.

Simulation runs the step model (simpy, one process per pipeline stage) on the candidate's
own cluster (its instances plus the scenario's spares, as `clustersim run` builds it), one
step model per (hardware, size) kept per process, so shapes seen before come from its cache.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from clustersim.collectives.ops import CollectiveError
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.topology import FabricSpec
from clustersim.training.layer_mix import LayerMix, chunk_mixes
from clustersim.training.stages import chunk_layers, rank_layers
from clustersim.training.step import StepModel
from clustersim.training.workload import TrainingJob, stage_work

__all__ = ["GroupKey", "step_model", "op_model", "step_lower_bound", "quick_bound",
           "simulate_task"]


@dataclass(frozen=True)
class GroupKey:
    """A (hardware, size) group: what a worker needs to build the cluster."""

    name: str  # the hardware's name as the plan shows it
    hardware_json: str  # the HardwareSpec, as JSON (catalog entries may be overridden)
    instances: int  # the cluster's, spares included
    fabric_json: str


@functools.lru_cache(maxsize=8)
def _hardware(hardware_json: str) -> HardwareSpec:
    return HardwareSpec.model_validate_json(hardware_json)


@functools.lru_cache(maxsize=8)
def step_model(key: GroupKey) -> StepModel:
    """The step model of a group's cluster, built once per process."""
    topology = build_topology(_hardware(key.hardware_json), key.instances,
                              FabricSpec.model_validate_json(key.fabric_json))
    return StepModel(topology)


@functools.lru_cache(maxsize=8)
def op_model(hardware_json: str) -> StepModel:
    """A step model on the smallest cluster of this hardware, for per-operation times."""
    hw = _hardware(hardware_json)
    return StepModel(build_topology(hw, hw.instances_per_ultraserver))


def _pass_seconds(model: StepModel, job: TrainingJob, first: bool, last: bool,
                  mix: LayerMix | None = None) -> tuple[float, float]:
    """(forward, backward) compute of one pass through a one-layer chunk plus the first /
    last extras: each operation's roofline time and the pass overhead; the layer is the
    mean of `mix`'s (a chunk's: training.layer_mix), or of the model's."""
    work = stage_work(job, 1, first, last, mix=mix)
    precision = job.precision
    overhead = model.hardware.chip.efficiency.pass_overhead_s
    return (overhead + sum(model.op_time(op, precision) for op in work.forward),
            overhead + sum(model.op_time(op, precision) for op in work.backward))


def step_lower_bound(model: StepModel, job: TrainingJob, cache: dict | None = None) -> float:
    """A lower bound of the step model's step time for this job (see the module doc):
    `pipeline_bound` on compute alone, without the data-parallel terms, that is the most over
    the pipeline ranks of fill + drain + micro-batches x busy (`pipeline_terms`), kept by
    what they depend on (not dp, nor ZeRO)."""
    par = job.parallelism
    cache = cache if cache is not None else {}
    base = (job.model, job.sequence_length, job.micro_batch, par.tp, par.cp,
            par.sequence_parallel, par.ep, job.recompute, job.precision)
    microbatches = job.global_batch // (job.micro_batch * par.dp)
    whole = base + (par.pp, par.interleave, microbatches)
    found = cache.get(whole)
    if found is not None:
        return found
    shape = base + (par.pp, par.interleave)
    terms = cache.get(shape)
    if terms is None:
        terms = cache[shape] = _pipeline_terms(model, job, cache, base)
    bound = max(ends + microbatches * busy for ends, busy in terms) * (1.0 - 1e-9)
    cache[whole] = bound
    return bound


def _pipeline_terms(model: StepModel, job: TrainingJob, cache: dict, base: tuple
                    ) -> list[tuple[float, float]]:
    """(fill + drain, busy per micro-batch) of each pipeline rank on compute alone
    (`pipeline_terms`), from one layer's passes: a chunk of n layers runs n layers'
    operations, one pass overhead and the embedding (first chunk) or the output layer (last
    chunk), so each term is a count of layers, of passes and of those extras."""
    par = job.parallelism

    def one_layer(first: bool, last: bool) -> tuple[float, float]:
        key = base + (first, last)
        if key not in cache:
            cache[key] = _pass_seconds(model, job, first, last)
        return cache[key]

    overhead = model.hardware.chip.efficiency.pass_overhead_s
    mid_f, mid_b = one_layer(False, False)
    first_f, first_b = one_layer(True, False)
    last_f, last_b = one_layer(False, True)
    layer = mid_f + mid_b - 2 * overhead  # one layer's operations, forward and backward
    passes = 2 * overhead
    embedding = first_f + first_b - mid_f - mid_b
    output = last_f + last_b - mid_f - mid_b
    forward_layer = mid_f - overhead
    backward_layer = mid_b - overhead
    held = rank_layers(job.model.layers, par.pp, par.interleave)
    stages = par.pp * par.interleave
    counts = chunk_layers(job.model.layers, stages)
    mixes = chunk_mixes(job.model, stages)
    if any(mix is not None for mix in mixes):  # chunks of other layers than the mean's
        layers_s: dict[tuple, float] = {}  # a chunk's layers' forward and backward passes
        for count, mix in zip(counts, mixes, strict=True):
            if (count, mix) in layers_s:
                continue
            busy = 0.0
            for kind, n in ((None, count),) if mix is None else mix.kinds():
                key = base + (False, False, kind)  # one layer of that kind
                if key not in cache:
                    cache[key] = _pass_seconds(model, job, False, False, kind)
                forward_s, backward_s = cache[key]
                busy += n * (forward_s + backward_s - 2 * overhead)
            layers_s[count, mix] = busy
        chunk_s = [layers_s[key] for key in zip(counts, mixes, strict=True)]
        return [(sum(chunk_s[:d]) + d * passes + (embedding if d > 0 else 0.0),
                 sum(chunk_s[d::par.pp]) + par.interleave * passes
                 + (embedding if d == 0 else 0.0)
                 + (output if d == (stages - 1) % par.pp else 0.0))
                for d in range(par.pp)]
    terms = []
    before = 0  # layers of chunks 0 .. d-1
    for d in range(par.pp):
        busy = held[d] * layer + par.interleave * passes
        if d == 0:
            busy += embedding
        if d == (stages - 1) % par.pp:
            busy += output
        # The forward and backward passes of chunks 0 .. d-1 (the first with the embedding).
        ends = before * (forward_layer + backward_layer) + d * passes
        if d > 0:
            ends += embedding
        terms.append((ends, busy))
        before += counts[d]
    return terms


def quick_bound(model: StepModel, job: TrainingJob, fallback: float) -> float:
    """A tighter lower bound on the group's own step model (`StepModel.lower_bound`): the
    pipeline's fill and drain and each rank's passes with their tensor-, expert- and
    context-parallel collectives (and ZeRO-3's), as the step model costs them, each pipeline
    rank's data-parallel reduction alone and its optimizer step. Falls back to `fallback`
    if the step model cannot cost the job."""
    try:
        return max(fallback, model.lower_bound(job))
    except (AttributeError, TypeError, KeyError, ValueError):
        return fallback


def simulate_task(task: tuple[GroupKey, list[Any]]) -> list[dict[str, Any]]:
    """Simulate the steps of jobs of one group; their figures (picklable)."""
    key, jobs = task
    model = step_model(key)
    out = []
    for job in jobs:
        try:
            profile = model.profile(job, job.name)
        except CollectiveError as error:
            # A group the collectives cannot form on this placement (an uneven split over
            # sites, say): the candidate is out for its placement, not a crash of the plan.
            out.append({"unplaceable": str(error)})
            continue
        band = getattr(profile, "step_time_s_band", None)
        out.append({
            "step_time_s": profile.step_time_s,
            "step_time_s_band": tuple(band) if band is not None else None,
            "mfu": profile.mfu,
            "hfu": profile.hfu,
            "tokens_per_s": profile.tokens_per_s,
            "memory_per_chip_gib": profile.memory.per_chip / 2**30,
            "fits_memory": profile.fits_memory,
            "compute_s": profile.compute_s,
            "exposed_comm_s": float(sum(profile.exposed_comm_s.values())),
            # the experts' all-to-all (dispatch and combine) not hidden behind compute
            "all_to_all_s": float(profile.exposed_comm_s.get("ep", 0.0)),
            "bubble_s": profile.bubble_s,
            "energy_per_token_j": profile.energy_per_token_j,
        })
        if not math.isfinite(profile.step_time_s):
            raise ValueError(f"step time of {job.name} is not finite")
    return out
