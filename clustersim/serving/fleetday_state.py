"""A fleet day's state: each deployment's replicas and each training job's progress,
stepped by the fluid level in `fleetday`, and the result."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from clustersim.cluster.rates import (
    checkpoint_intervals,
    default_checkpoint,
    effective_rates,
    failure_population,
    job_failure_rate,
    storage_bandwidth_per_instance,
)
from clustersim.scenario.errors import Issue, ScenarioError
from clustersim.scenario.fleetday import elastic_smallest, elastic_unit, replica_chips
from clustersim.scenario.models import Scenario
from clustersim.scenario.serving import DeploymentSpec
from clustersim.serving.curves import ReplicaCurve, replica_curve
from clustersim.serving.load import load_rates, load_seed
from clustersim.serving.simulate import replica_models, weights_fit_issue
from clustersim.training.profile import StepProfile

__all__ = ["CHIP_STATES", "HISTOGRAM_EDGES_S", "DeploymentState", "JobState", "FleetDayResult",
           "deployment_states", "job_states", "failure_events"]


CHIP_STATES = ("serving", "scaling", "training", "down", "idle")


# Log-spaced bins for the request-weighted latency distributions over the whole run.
HISTOGRAM_EDGES_S = np.logspace(-4, 6, 4001)


@dataclass
class DeploymentState:
    spec: DeploymentSpec
    curve: ReplicaCurve
    chips: int  # per replica
    rates: np.ndarray  # requests per second per step
    per_replica_rate: float  # what the autoscaler provisions per replica
    start_s: float  # weights load plus warm-up
    priority: float
    minimum: int
    maximum: int
    up: int = 0
    starting: list[float] = field(default_factory=list)  # ready times
    draining: list[float] = field(default_factory=list)  # release times
    restarting: list[float] = field(default_factory=list)  # back times (software failures)
    instances: int = 0
    backlog: float = 0.0
    needs: list[tuple[float, int]] = field(default_factory=list)  # (time, need) decisions
    failures: int = 0
    retries: float = 0.0
    preempted_for: int = 0
    scale_ups: int = 0
    scale_downs: int = 0
    placed: bool = False  # holds instances from its `start` on, none before

    @property
    def active(self) -> int:
        return self.up + len(self.starting) + len(self.draining) + len(self.restarting)


@dataclass
class JobState:
    index: int
    name: str
    instances: int
    tokens_per_s: float
    priority: int
    submit_s: float
    interval_s: float
    write_s: float
    restore_s: float
    async_write: bool
    steps_target: float | None
    tokens_per_step: float
    step_time_s: float
    group: int = 0  # instances per data-parallel group
    smallest: int = 0  # instances it runs on at the least (its minimum when elastic)
    state: str = "pending"  # pending, queued, running, restarting, waiting_for_hardware, done
    held: int = 0
    ready_at: float = 0.0
    missing: int = 0
    started: bool = False
    start_s: float | None = None
    since_checkpoint_s: float = 0.0
    since_checkpoint_tokens: float = 0.0
    tokens: float = 0.0
    useful_s: float = 0.0
    shrinks: int = 0
    grows: int = 0
    end_s: float = math.inf  # the deadline (since submission) or run_for (since the start)
    run_for_s: float | None = None
    done_why: str = ""
    done_s: float | None = None  # when it finished (its target or its end)
    lost_work_s: float = 0.0
    checkpointing_s: float = 0.0
    checkpoints: int = 0
    preemptions: int = 0
    interruptions: int = 0
    held_chip_s: float = 0.0
    time_by_state_s: dict[str, float] = field(default_factory=dict)
    last_start_s: float = 0.0


@dataclass
class FleetDayResult:
    """A fleet-day run: per step and per deployment, per step for the fleet, and the books."""

    times_s: np.ndarray  # (T,) step starts
    dt_s: np.ndarray  # (T,)
    names: list[str]
    series: dict[str, dict[str, np.ndarray]]  # deployment -> column -> (T,)
    fleet: dict[str, np.ndarray]  # chip state / jobs -> (T,) chips
    jobs: list[JobState]
    deployments: list[DeploymentState]
    histograms: dict[str, dict[str, np.ndarray]]  # deployment -> ttft/tpot -> counts
    total_chips: int
    horizon_s: float
    failures: dict[str, int]


def deployment_states(scenario: Scenario, seed: int, only: Collection[str] | None,
                      times: np.ndarray, step: float) -> list[DeploymentState]:
    """Each simulated deployment at the start: its replica's curve and chips, its load per
    interval (zero before its start) and the load one replica takes under its autoscaler."""
    hw = scenario.hardware
    cpi = hw.chips_per_instance
    horizon = scenario.duration_s
    steps = len(times)
    storage = storage_bandwidth_per_instance()
    deployments: list[DeploymentState] = []
    for index, d in enumerate(scenario.serve):
        if only is not None and d.name not in only:
            continue
        cost, kv_tokens, _ = replica_models(scenario, d)
        issue = weights_fit_issue(scenario, d, cost, kv_tokens)
        if issue is not None:
            raise ScenarioError(scenario.source, [issue])
        try:
            curve = replica_curve(scenario, d)
        except ValueError as error:  # a replica that serves nothing: the scenario's fault
            raise ScenarioError(scenario.source, [Issue(
                f"serve.{index}", str(error), d.name, True)]) from None
        chips = replica_chips(d, hw.chip.ranks)
        if d.workload.load is not None:
            rates = load_rates(d.workload.load, 0.0, horizon, step, load_seed(seed, index))
        else:
            rates = np.full(steps, float(d.workload.rate_per_s or 0.0))
        rates = np.where(times >= d.start_s, rates, 0.0)
        a = d.autoscale
        if a is not None and a.policy == "slo":
            per_rate = curve.slo_rate_per_s(d.slo.ttft_s) / (1.0 + a.headroom)
        else:
            per_rate = curve.capacity_per_s * (a.target if a is not None else 1.0)
        # Each of a replica's instances reads its share of the weights at the storage
        # bandwidth (a replica on part of an instance gets that part of it).
        load_s = curve.weight_bytes / (storage * chips / cpi)
        minimum = a.min_replicas if a is not None else d.replicas
        maximum = a.max_replicas if a is not None else d.replicas
        deployments.append(DeploymentState(
            spec=d, curve=curve, chips=chips, rates=rates, per_replica_rate=max(per_rate, 1e-9),
            start_s=load_s + (a.warmup_s if a is not None else 0.0),
            priority=a.priority if a is not None else math.inf,
            minimum=minimum, maximum=maximum))
    return deployments


def job_states(scenario: Scenario, profiles: dict[str, StepProfile]) -> list[JobState]:
    """Each training job at the start: its rate from its step profile, its checkpoints (the
    rules of `cluster.rates`) and its elastic unit."""
    jobs: list[JobState] = []
    for index, spec in enumerate(scenario.jobs):
        profile = profiles[spec.name]
        rate = job_failure_rate(scenario, spec)
        checkpoint = spec.checkpoint
        if checkpoint is None and rate > 0:
            checkpoint = default_checkpoint(scenario, spec)
        interval, _, _ = checkpoint_intervals(checkpoint, 1.0 / rate if rate > 0 else None)
        jobs.append(JobState(
            index=index, name=spec.name, instances=scenario.job_instances(spec),
            tokens_per_s=profile.tokens_per_s, priority=spec.priority, submit_s=spec.submit_s,
            interval_s=interval, write_s=checkpoint.write_s if checkpoint else 0.0,
            restore_s=checkpoint.restore_s if checkpoint else 0.0,
            async_write=bool(checkpoint and checkpoint.async_write),
            steps_target=spec.steps, tokens_per_step=profile.tokens_per_step,
            step_time_s=profile.step_time_s))
        job = jobs[-1]
        if spec.deadline_s is not None:
            job.end_s = spec.submit_s + spec.deadline_s
        job.run_for_s = spec.run_for_s
        dp = spec.parallelism.dp
        unit = elastic_unit(job.instances, dp)
        if spec.elastic is not None and unit is not None:
            job.group = unit
            job.smallest = elastic_smallest(job.instances, dp, spec.elastic.min_dp)
        else:
            job.group = job.smallest = job.instances
    return jobs


def failure_events(scenario: Scenario, rng: np.random.Generator, horizon_s: float
                    ) -> list[tuple[float, bool, int, str]]:
    """(time, software?, instances downed, per) of every failure over the horizon, drawn at
    the mean rate of each process (Weibull ones too: their mean, as `--find-rate` does)."""
    ipu = scenario.hardware.instances_per_ultraserver
    per_leaf = scenario.cluster.fabric.leaf_size(ipu)
    population = failure_population(scenario)
    width = {"chip": 1, "instance": 1, "ultraserver": ipu, "leaf": per_leaf, "job": 0}
    events = []
    for r in effective_rates(scenario):
        rate = r.events_per_s * population[r.per] * scenario.failures.scale
        if rate <= 0:
            continue
        count = int(rng.poisson(rate * horizon_s))
        software = r.component == "software"
        for t in np.sort(rng.uniform(0.0, horizon_s, count)).tolist():
            events.append((t, software, width[r.per], r.per))
    events.sort()
    return events
