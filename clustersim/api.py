"""The Python API behind the command line: simulate a scenario, write its outputs."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clustersim
from clustersim.outputs import atomic_output_dir
from clustersim.scenario import Scenario
from clustersim.step import StepModel, StepProfile
from clustersim.topology import Topology, build_topology

__all__ = ["RunResult", "simulate", "write_run", "cluster_figures", "topology_for",
           "step_profiles"]


@dataclass
class RunResult:
    """What a run produced: the scenario it ran, the cluster it built, and the summary."""

    scenario: Scenario
    topology: Topology
    summary: dict[str, Any]
    steps: dict[str, StepProfile]


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


def simulate(scenario: Scenario, seed: int | None = None, replications: int = 1) -> RunResult:
    """Run a scenario.

    Today this builds the cluster's topology, reports its figures, and simulates one training
    step of each job; the failure timeline adds its figures to the same summary.
    """
    if replications < 1:
        raise ValueError(f"replications must be at least 1, got {replications}")
    started = time.perf_counter()
    topology = topology_for(scenario)
    steps = step_profiles(scenario, topology)
    summary: dict[str, Any] = {
        "clustersim_version": clustersim.__version__,
        "scenario": scenario.name,
        "seed": scenario.seed if seed is None else seed,
        "replications": replications,
        "chips": topology.chips,
        "simulated_s": 0.0,
        "wall_s": 0.0,
        "jobs": _job_figures(scenario, steps),
        "cluster": cluster_figures(scenario, topology),
    }
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    return RunResult(scenario=scenario, topology=topology, summary=summary, steps=steps)


def write_run(result: RunResult, out: str | Path, force: bool = False) -> Path:
    """Write a run's outputs to `out` atomically (see clustersim.outputs)."""
    out = Path(out)
    with atomic_output_dir(out, force=force) as staging:
        text = json.dumps(result.summary, indent=2, sort_keys=False) + "\n"
        (staging / "summary.json").write_text(text, encoding="utf-8")
        (staging / "scenario.yaml").write_text(result.scenario.source_yaml, encoding="utf-8")
    return out
