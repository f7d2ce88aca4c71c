"""A run's figures: the cluster's, each job's, and the mean with its 95% interval over replications."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from clustersim.hardware.topology import Topology
from clustersim.scenario.models import Scenario
from clustersim.scenario.serving import deployment_instances
from clustersim.training.profile import StepProfile

__all__ = [
    "capped_workers",
    "cluster_figures",
    "combine_replications",
    "effective_figures",
    "job_shape",
    "JobFigures",
    "largest_of_columns",
    "t_quantile",
]


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
        "chips_per_instance": hw.chips_per_instance,
        "instances_per_ultraserver": hw.instances_per_ultraserver,
        "ranks": chips * hw.chip.ranks,
        "instances": topology.instances,
        "working_instances": scenario.working_instances,
        "spare_instances": scenario.total_instances - scenario.working_instances,
        # held by the serving deployments for the whole run; jobs are placed around them
        "serving_instances": sum(deployment_instances(d, hw) for d in scenario.serve),
        "ultraservers": topology.ultraservers,
        "leaf_switches": topology.leaves,
        "spine_switches": topology.spines,
        "links": dict(topology.edge_counts),
        "per_chip_bandwidth_gbyte_per_s": {
            k: round(v / 1e9, 6) for k, v in topology.chip_bandwidth_bytes_per_s(0).items()
        },
        "bisection_gbyte_per_s": topology.bisection_bytes_per_s() / 1e9,
        "peak_pflops": {p: chips * t / 1e3 for p, t in hw.chip.tflops.items()},
        "hbm_tib": chips * hw.chip.hbm_bytes / 2**40,
        "hbm_bandwidth_tbyte_per_s": chips * hw.chip.hbm_bandwidth_bytes_per_s / 1e12,
        "price_per_hour_usd": None if price is None else price * topology.instances,
        "chip_power_kw": None if power is None else chips * power / 1e3,
    }


def _job_figures(scenario: Scenario, steps: dict[str, StepProfile]) -> dict[str, dict[str, Any]]:
    return {job.name: job_shape(scenario, job, steps[job.name]) for job in scenario.jobs}


def job_shape(scenario: Scenario, job: Any, profile: StepProfile,
              parameters: tuple[int, int] | None = None) -> dict[str, Any]:
    """A job's size, parallelism and step figures (the summary's per-job figures before what
    the timeline made of it). `parameters`: its model's parameter count and active
    parameters, when the caller has them (`JobFigures` counts them once per model)."""
    hw = scenario.hardware
    instances = scenario.job_instances(job)
    par = job.parallelism
    count, active = parameters if parameters is not None else (
        job.model.parameter_count(), job.model.active_parameters)
    shape = {
        "model": job.model.name,
        "parameters": count,
        "active_parameters": active,
        "ranks": job.ranks,
        "instances": instances,
        "chips": instances * hw.chips_per_instance,
        "tp": par.tp,
        "pp": par.pp,
        "dp": par.dp,
        "cp": par.cp,
        "ep": par.ep,
        "zero": par.zero,
        "seq_len": job.sequence_length,
        "global_batch": job.global_batch,
        "tokens_per_step": job.global_batch * job.sequence_length,
    }
    figures = profile.as_dict()
    shape.update({
        "step_time_s": profile.step_time_s,
        "step_time_s_band": list(profile.step_time_s_band),
        "tokens_per_s": profile.tokens_per_s,
        "sequences_per_s": profile.sequences_per_s,
        "mfu": profile.mfu,
        "hfu": profile.hfu,
        "fits_memory": profile.fits_memory,
        "memory_per_chip_gib": figures["memory_per_chip_gib"],
        "step_breakdown": figures["step_breakdown"],
        "energy_per_token_j": profile.energy_per_token_j,
        "cost_per_million_tokens_usd": profile.cost_per_million_tokens_usd,
    })
    return shape


def effective_figures(scenario: Scenario, job: dict[str, Any]) -> dict[str, float | None]:
    """Cost and energy per token over the run: the chip-time the job held (wall time on its
    instances, lost and waiting hours included) at the on-demand price and at the chips'
    power, over the tokens it trained. The step figures are the ideal; these, about the ideal
    over the ETTR, are what the run paid. None without a price, a power or any token."""
    hw = scenario.hardware
    tokens = job["tokens_trained"]
    held_chip_h = job["held_chip_s"] / 3600
    price = hw.instance.price_per_hour_usd
    power = hw.chip.power_w
    return {
        "effective_cost_per_million_tokens_usd": (
            held_chip_h * price / hw.chips_per_instance / tokens * 1e6
            if tokens and price is not None else None),
        "effective_energy_per_token_j": (
            job["held_chip_s"] * power / tokens if tokens and power is not None else None),
    }


def capped_workers(workers: int | None, tasks: int) -> int:
    """Processes worth starting: at most one per task and per core (`workers` or not)."""
    cores = os.cpu_count() or 1
    return max(1, min(workers or cores, tasks, cores))


def t_quantile(dof: int) -> float:
    """The 0.975 quantile of Student's t with `dof` degrees of freedom (nan below 1): the
    95% interval of a mean of dof + 1 values is this x their standard deviation / sqrt(n)."""
    if dof <= 0:
        return math.nan
    if dof in _T975:
        return _T975[dof]
    if dof > 30:
        return 1.96 + 2.4 / dof  # close to the t quantile past 30 degrees of freedom
    lower = max(k for k in _T975 if k < dof)
    upper = min(k for k in _T975 if k > dof)
    weight = (dof - lower) / (upper - lower)
    return _T975[lower] * (1 - weight) + _T975[upper] * weight


def combine_replications(values: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean of every number over replications, with `<name>_ci95` half-widths; nested
    mappings are combined key by key (a key a replication's mapping lacks, a cause that did
    not occur there, is 0). A number that is null in some replications (the end of a job
    that did not end in all) is the mean over those where it is defined, with `<name>_n`
    their count (null, without a count, when none is). A job's `status` is replication 0's, with
    `status_by_replication` counting each status over the replications; other text, flags
    and lists are the first replication's (the same in every one)."""
    first = values[0]
    n = len(values)
    if n == 1:
        return first
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for v in values for k in v):
        numbers = [v.get(key) for v in values]
        value = next((x for x in numbers if x is not None), None)
        if isinstance(value, dict):
            if all(isinstance(x, dict) for x in numbers):
                keys = list(dict.fromkeys(k for x in numbers for k in x))
                # A key missing from a replication's mapping (a cause that did not occur) is 0.
                out[key] = combine_replications([{k: x.get(k, 0) for k in keys}
                                                 for x in numbers])
            else:
                out[key] = first.get(key)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            out[key] = first.get(key)
            if key == "status" and isinstance(value, str):
                out["status_by_replication"] = dict(sorted(Counter(
                    str(x) for x in numbers).items()))
            continue
        defined = [x for x in numbers if x is not None]
        array = np.asarray(defined, dtype=float)
        same_int = all(isinstance(x, int) and x == defined[0] for x in defined)
        out[key] = defined[0] if same_int else float(array.mean())  # 1,024 chips, not 1,024.0
        count = len(defined)
        out[f"{key}_ci95"] = (float(t_quantile(count - 1) * array.std(ddof=1) / math.sqrt(count))
                              if count > 1 else None)
        if count < n:  # undefined in some replications: the mean is over the others
            out[f"{key}_n"] = count
    return out


# Student t quantiles (0.975) for the 95% interval of a mean of n replications (n - 1 dof).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}


class JobFigures(Mapping):
    """Every job's figures as the summary gives them (its shape, what the timeline made of it,
    its effective cost, its team), made when read and not kept: a year's million as dicts
    were about 6 GB. Read in order by `items`, or one by one by `at` (its index)."""

    def __init__(self, scenario: Scenario, steps: dict[str, StepProfile], model: Any,
                 outcomes: dict[str, Any], horizon_s: float, with_teams: bool):
        self.scenario = scenario
        self.steps = steps
        self.model = model
        self.outcomes = list(outcomes.values())  # in the scenario's order of jobs
        self.names = list(outcomes)
        self.horizon_s = horizon_s
        self.with_teams = with_teams
        self.sites = model is not None and model.topology.site_count > 1
        self._index: dict[str, int] | None = None
        # id(model) -> (model, parameters, active parameters): a fleet's jobs share a few
        # models, and counting a model's parameters is most of a job's shape figures.
        self._parameters: dict[int, tuple[Any, int, int]] = {}
        # A shape's figures (`job_shape`), by what they are made of: a fleet's jobs share far
        # fewer shapes than there are jobs, and making them again was a third of making a
        # job's figures (profiled on the 30-day slice of rainier-year).
        self._shapes: dict[tuple, tuple[Any, Any, dict[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __getitem__(self, name: str) -> dict[str, Any]:
        if self._index is None:
            self._index = {name: index for index, name in enumerate(self.names)}
        return self.at(self._index[name])

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:  # type: ignore[override]
        for index, name in enumerate(self.names):
            yield name, self.at(index)

    def at(self, index: int) -> dict[str, Any]:
        from clustersim.training.sites import cross_site_step

        scenario = self.scenario
        job = scenario.jobs[index]
        outcome = self.outcomes[index]
        figures = dict(self._shape(job))
        if self.sites:  # its step over the sites, synchronous and not
            crossing = cross_site_step(self.model, job, job.name)
            if crossing is not None:
                figures["cross_site"] = crossing.figures()
        figures.update(outcome.figures(self.horizon_s))
        figures.update(effective_figures(scenario, figures))
        if self.with_teams:
            figures["team"] = outcome.team
        return figures

    def _shape(self, job: Any) -> dict[str, Any]:
        """`job_shape` of the job, shared with the jobs of its shape (its nested figures too:
        read them, do not change them)."""
        profile, par = self.steps[job.name], job.parallelism
        # Everything job_shape reads of the job (the ids: of objects the key's entry keeps)
        key = (id(profile), id(job.model), self.scenario.job_instances(job), par.tp, par.pp,
               par.dp, par.cp, par.ep, par.zero, par.ranks, job.sequence_length,
               job.global_batch)
        found = self._shapes.get(key)
        if found is None or found[0] is not profile or found[1] is not job.model:
            counted = self._parameters.get(id(job.model))
            if counted is None or counted[0] is not job.model:
                counted = self._parameters[id(job.model)] = (
                    job.model, job.model.parameter_count(), job.model.active_parameters)
            found = self._shapes[key] = (profile, job.model,
                                         job_shape(self.scenario, job, profile, counted[1:]))
        return found[2]


def largest_of_columns(jobs: JobFigures, columns: Any, count: int
                       ) -> dict[str, dict[str, Any]]:
    """`fleet.largest_jobs` of the jobs whose columns these are (`job_columns.ArrowRows`:
    chips, then chip-time held, then name), in the jobs' order, each job's figures made
    again."""
    names, chips, held = (columns.column(key) for key in ("name", "chips", "held_chip_s"))
    ranked = sorted(range(len(names)), key=lambda i: (-chips[i], -held[i], names[i]))[:count]
    return {names[i]: jobs.at(i) for i in sorted(ranked)}
