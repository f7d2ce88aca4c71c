"""The quick bound and the simulation of a candidate's step, both on the step model.

The bound is a lower bound of the simulated step time from the same roofline the step model
uses (its per-operation time), with no communication: the busiest pipeline rank must run
every forward and backward chunk of every micro-batch one after another, and the last rank
cannot start before a forward chunk has passed through each rank before it. Candidates are
taken in order of that bound; one that could still win gets the tighter `quick_bound` (the
same chunks with their collectives, from the step model),
and only one that could still win after that is simulated.

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
from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.topology import FabricSpec, build_topology
from clustersim.training.stages import chunk_layers
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


def _chunk_seconds(model: StepModel, job: TrainingJob, first: bool, last: bool
                   ) -> tuple[float, float]:
    """(forward, backward) compute of one layer's chunk plus the first / last extras."""
    work = stage_work(job, 1, first, last)
    precision = job.precision
    return (sum(model.op_time(op, precision) for op in work.forward),
            sum(model.op_time(op, precision) for op in work.backward))


def step_lower_bound(model: StepModel, job: TrainingJob, cache: dict | None = None) -> float:
    """A lower bound of the step model's step time for this job (see the module doc)."""
    par = job.parallelism
    cache = cache if cache is not None else {}
    base = (job.model, job.sequence_length, job.micro_batch, par.tp, par.cp,
            par.sequence_parallel, par.ep, job.recompute, job.precision)

    microbatches = job.global_batch // (job.micro_batch * par.dp)
    whole = base + (par.pp, par.interleave, microbatches)  # ZeRO does not change it
    if whole in cache:
        return cache[whole]

    def one_layer(first: bool, last: bool) -> tuple[float, float]:
        key = base + (first, last)
        if key not in cache:
            cache[key] = _chunk_seconds(model, job, first, last)
        return cache[key]

    stages = par.pp * par.interleave
    counts = chunk_layers(job.model.layers, stages)
    mid_f, mid_b = one_layer(False, False)
    extra = {}
    for first, last in ((True, False), (False, True), (True, True)):
        f, b = one_layer(first, last)
        extra[first, last] = (f - mid_f) + (b - mid_b)

    def chunk(g: int) -> float:
        first, last = g == 0, g == stages - 1
        return counts[g] * (mid_f + mid_b) + (extra[first, last] if first or last else 0.0)

    if stages == 1:
        cache[whole] = microbatches * chunk(0)
        return cache[whole]
    # Every rank runs all its chunks for every micro-batch; the last rank cannot start before
    # the first micro-batch went forward through every chunk before its first.
    per_rank = [sum(chunk(c * par.pp + d) for c in range(par.interleave))
                for d in range(par.pp)]
    fill = mid_f * sum(counts[: par.pp - 1])
    cache[whole] = max(microbatches * max(per_rank), fill + microbatches * per_rank[-1])
    return cache[whole]


def quick_bound(model: StepModel, job: TrainingJob, fallback: float) -> float:
    """A tighter lower bound on the group's own step model: each pipeline rank's chunks with
    their tensor-, expert- and context-parallel collectives (and ZeRO-3's), as the step
    model costs them (`StepModel.chunk_times`, on the job's first instances, without the
    simpy pipeline). Falls back to `fallback` if the step model
    cannot cost the job."""
    try:
        par = job.parallelism
        stages = par.pp * par.interleave
        counts = chunk_layers(job.model.layers, stages)
        seen: dict[tuple[int, bool, bool], float] = {}

        def chunk(g: int) -> float:
            kind = (counts[g], g == 0, g == stages - 1)
            if kind not in seen:
                seen[kind] = model.chunk_times(job, kind[1], kind[2],
                                               layers=kind[0]).forward_and_backward_s
            return seen[kind]

        # The data-parallel reduction is left out: solving its groups' contention on a large
        # cluster costs more than simulating (the bound stays a lower bound without it).
        microbatches = job.global_batch // (job.micro_batch * par.dp)
        bound = max(microbatches * sum(chunk(c * par.pp + d) for c in range(par.interleave))
                    for d in range(par.pp))
        return max(fallback, bound)
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
            "bubble_s": profile.bubble_s,
            "energy_per_token_j": profile.energy_per_token_j,
        })
        if not math.isfinite(profile.step_time_s):
            raise ValueError(f"step time of {job.name} is not finite")
    return out
