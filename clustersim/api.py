"""The Python API behind the command line: simulate a scenario, write its outputs."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import clustersim
from clustersim.outputs import atomic_output_dir
from clustersim.scenario import Scenario
from clustersim.step import JobDoesNotFit, StepModel, StepProfile
from clustersim.timeline import Timeline, TimelineResult
from clustersim.topology import Topology, build_topology

__all__ = ["RunResult", "simulate", "write_run", "cluster_figures", "topology_for",
           "step_profiles", "run_timelines", "check_fit"]


@dataclass
class RunResult:
    """What a run produced: the scenario it ran, the cluster it built, and the summary."""

    scenario: Scenario
    topology: Topology
    summary: dict[str, Any]
    steps: dict[str, StepProfile]
    timelines: list[TimelineResult] = field(default_factory=list)


def topology_for(scenario: Scenario) -> Topology:
    """The topology of a scenario's whole cluster, hot spares included."""
    return build_topology(scenario.hardware, scenario.total_instances, scenario.cluster.fabric)


def cluster_figures(scenario: Scenario, topology: Topology) -> dict[str, Any]:
    """Size, bandwidth, peak compute, memory, price and power of the whole cluster."""
    hw = scenario.hardware
    chips = topology.chips
    price = hw.instance.price_per_hour_usd
    power = hw.chip.power_w
    return {
        "hardware": hw.name,
        "instance_type": hw.instance.name,
        "chip": hw.chip.name,
        "chips": chips,
        "ranks": chips * hw.chip.ranks,
        "instances": topology.instances,
        "working_instances": scenario.working_instances,
        "spare_instances": scenario.cluster.spares,
        "ultraservers": topology.ultraservers,
        "leaf_switches": topology.leaves,
        "spine_switches": topology.spines,
        "links": dict(topology.edge_counts),
        "per_chip_bandwidth_gbps": {
            k: round(v / 1e9, 6) for k, v in topology.chip_bandwidth_bytes_per_s(0).items()
        },
        "bisection_gbps": topology.bisection_bytes_per_s() / 1e9,
        "peak_pflops": {p: chips * t / 1e3 for p, t in hw.chip.tflops.items()},
        "hbm_tib": chips * hw.chip.hbm_bytes / 2**40,
        "hbm_bandwidth_tbps": chips * hw.chip.hbm_bandwidth_bytes_per_s / 1e12,
        "price_per_hour_usd": None if price is None else price * topology.instances,
        "chip_power_kw": None if power is None else chips * power / 1e3,
    }


def step_profiles(scenario: Scenario, topology: Topology | None = None
                  ) -> dict[str, StepProfile]:
    """One step of each job, as if it ran alone from the cluster's first instance."""
    topology = topology or topology_for(scenario)
    model = StepModel(topology)
    return {job.name: model.profile(job, job.name) for job in scenario.jobs}


def _job_figures(scenario: Scenario, steps: dict[str, StepProfile]) -> dict[str, dict[str, Any]]:
    hw = scenario.hardware
    jobs = {}
    for job in scenario.jobs:
        instances = scenario.job_instances(job)
        par = job.parallelism
        jobs[job.name] = {
            "model": job.model.name,
            "parameters": job.model.parameter_count(),
            "ranks": job.ranks,
            "instances": instances,
            "chips": instances * hw.chips_per_instance,
            "tp": par.tp,
            "pp": par.pp,
            "dp": par.dp,
            "seq_len": job.sequence_length,
            "global_batch": job.global_batch,
            "tokens_per_step": job.global_batch * job.sequence_length,
        }
        profile = steps[job.name]
        figures = profile.as_dict()
        jobs[job.name].update({
            "step_time_s": profile.step_time_s,
            "tokens_per_s": profile.tokens_per_s,
            "sequences_per_s": profile.sequences_per_s,
            "mfu": profile.mfu,
            "hfu": profile.hfu,
            "fits_memory": profile.fits_memory,
            "memory_per_chip_gib": figures["memory_per_chip_gib"],
            "step_breakdown": figures["breakdown"],
            "energy_per_token_j": profile.energy_per_token_j,
            "cost_per_million_tokens_usd": profile.cost_per_million_tokens_usd,
        })
    return jobs


def check_fit(scenario: Scenario, steps: dict[str, StepProfile]) -> None:
    """Refuse a run with a job that does not fit in its chips' HBM."""
    for job in scenario.jobs:
        profile = steps[job.name]
        if not profile.fits_memory:
            gib = profile.memory.as_gib()
            raise JobDoesNotFit(
                f"job {job.name!r} does not fit: it needs {gib['total']:.1f} GiB per "
                f"{scenario.hardware.chip.name} chip, which has {gib['hbm']:.0f} GiB (weights "
                f"{gib['weights']:.1f}, gradients {gib['gradients']:.1f}, optimizer "
                f"{gib['optimizer']:.1f}, activations {gib['activations']:.1f}); use more "
                f"tensor or pipeline parallelism, ZeRO-1, sequence parallelism or recompute"
            )


def _one_timeline(args: tuple) -> TimelineResult:
    scenario, steps, seed_sequence, record = args
    return Timeline(scenario, steps, seed_sequence, record=record).run()


def run_timelines(scenario: Scenario, steps: dict[str, StepProfile], seed: int,
                  replications: int, workers: int | None = None,
                  progress: Callable[[float, float], None] | None = None) -> list[TimelineResult]:
    """Run the timeline once per replication, each with its own spawned seed stream; several
    replications run in parallel local processes. The first keeps its event trace."""
    children = np.random.SeedSequence(seed).spawn(replications)
    if replications == 1:
        return [Timeline(scenario, steps, children[0], progress=progress).run()]
    workers = workers or min(replications, os.cpu_count() or 1)
    jobs = [(scenario, steps, child, i == 0) for i, child in enumerate(children)]
    if workers <= 1:
        return [_one_timeline(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_one_timeline, jobs))


# Student t quantiles (0.975) for the 95% interval of a mean of n replications (n - 1 dof).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}


def _t975(dof: int) -> float:
    if dof in _T975:
        return _T975[dof]
    if dof > 30:
        return 1.96 + 2.4 / dof  # close to the t quantile past 30 degrees of freedom
    lower = max(k for k in _T975 if k < dof)
    upper = min(k for k in _T975 if k > dof)
    weight = (dof - lower) / (upper - lower)
    return _T975[lower] * (1 - weight) + _T975[upper] * weight


def _combine(values: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean of every number over replications, with `<name>_ci95` half-widths; nested
    mappings are combined key by key; other values are taken from the first."""
    first = values[0]
    n = len(values)
    if n == 1:
        return first
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, bool) or not isinstance(value, int | float | dict):
            out[key] = value
            continue
        if isinstance(value, dict):
            if all(isinstance(v.get(key), dict) for v in values):
                keys = list(dict.fromkeys(k for v in values for k in v[key]))
                # A key missing from a replication's mapping (a cause that did not occur) is 0.
                filled = [{k: v[key].get(k, 0) for k in keys} for v in values]
                out[key] = _combine(filled)
            else:
                out[key] = value
            continue
        numbers = [v.get(key) for v in values]
        if any(x is None for x in numbers):
            out[key] = value
            continue
        array = np.asarray(numbers, dtype=float)
        out[key] = float(array.mean())
        if n > 1:
            out[f"{key}_ci95"] = float(_t975(n - 1) * array.std(ddof=1) / math.sqrt(n))
    return out


def simulate(scenario: Scenario, seed: int | None = None, replications: int = 1,
             workers: int | None = None,
             progress: Callable[[float, float], None] | None = None) -> RunResult:
    """Run a scenario: build the cluster, simulate a step of each job, then the timeline of
    failures, repairs and checkpoints over the horizon, `replications` times.

    Raises JobDoesNotFit for a job that does not fit in memory.
    """
    if replications < 1:
        raise ValueError(f"replications must be at least 1, got {replications}")
    started = time.perf_counter()
    seed = scenario.seed if seed is None else seed
    topology = topology_for(scenario)
    steps = step_profiles(scenario, topology)
    check_fit(scenario, steps)
    timelines = run_timelines(scenario, steps, seed, replications, workers, progress)
    shapes = _job_figures(scenario, steps)
    per_replication = []
    for result in timelines:
        jobs = {name: {**shapes[name], **outcome.figures(result.horizon_s)}
                for name, outcome in result.jobs.items()}
        per_replication.append({"jobs": jobs, "cluster": result.cluster_figures()})
    combined = _combine(per_replication)
    cluster = cluster_figures(scenario, topology)
    cluster.update(combined["cluster"])
    summary: dict[str, Any] = {
        "clustersim_version": clustersim.__version__,
        "scenario": scenario.name,
        "seed": seed,
        "replications": replications,
        "chips": topology.chips,
        "simulated_s": scenario.duration_s,
        "wall_s": 0.0,
        "jobs": combined["jobs"],
        "cluster": cluster,
    }
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    return RunResult(scenario=scenario, topology=topology, summary=summary, steps=steps,
                     timelines=timelines)


def write_run(result: RunResult, out: str | Path, force: bool = False) -> Path:
    """Write a run's outputs to `out` atomically (see clustersim.outputs)."""
    out = Path(out)
    with atomic_output_dir(out, force=force) as staging:
        text = json.dumps(result.summary, indent=2, sort_keys=False) + "\n"
        (staging / "summary.json").write_text(text, encoding="utf-8")
        (staging / "scenario.yaml").write_text(result.scenario.source_yaml, encoding="utf-8")
    return out
