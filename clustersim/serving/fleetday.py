"""Serving and training on one fleet over days: the fleet-level (fluid) model.

The fleet is stepped at `fluid.interval` (a minute by default). Nothing is per request or per
token: each step costs a few operations per deployment and per job.

- **Load**: each deployment's arrival rate per step (clustersim.serving.load).
- **Serving**: a deployment's up replicas are a fluid queue: in a step of length dt, A = rate
  x dt requests arrive and at most n x capacity x dt are served (the replica's saturated
  capacity from its curve, clustersim.serving.curves); the rest wait in a backlog, served
  first. A request's latency is the replica curve's at the utilisation rate / (n x capacity),
  plus the backlog's wait (backlog / service rate) on its first token.
- **Autoscaling**: every `autoscale.interval` the observed rate (the last step's) and the
  backlog set the replicas needed (utilisation: rate / (target x capacity); slo: rate x
  (1 + headroom) over the highest rate a replica holds 99% within its SLO), clipped to
  [min, max]. Scale-down waits until the need stayed lower for `scale_down_after`. A new
  replica holds its chips from the decision, loads its weights from storage (the catalog's
  bandwidth per instance, clustersim/catalog/storage.yaml) and warms up before serving; a
  removed one holds its chips while it drains.
- **Training on what serving leaves**: jobs start, by priority then submission, on the free
  instances; a deployment that needs chips preempts jobs of lower priority than its own
  (`autoscale.priority`), lowest first, latest started first. A preempted or failed job loses
  its work since its last checkpoint and pays the restart and the restore when it runs again;
  it checkpoints at the interval the timeline would give it (Daly's for its failure rate, the
  storage bandwidth's write time when it has no `checkpoint:` block: clustersim.cluster.rates).
- **Failures**: the scenario's rates (the timeline's: clustersim.cluster.rates), drawn over
  the horizon. A hardware failure downs one instance (an UltraServer's or a leaf's, all of
  theirs) for the detection plus the repair, taken from a deployment, a job or the free
  pool in proportion to the instances each holds; its replicas are gone (the autoscaler
  replaces them), its job recovers on free instances. A software failure restarts the
  replica or the training job on the chip it hits (as in the timeline: nothing on an idle
  chip, nor a job that is not training), one job in every job's stream when per job.

Placement is by count of instances (no topology): a deployment's replicas smaller than an
instance share instances; the chips of a deployment's partly used instance count as idle.
Chip-time is split five ways that add up to the cluster's: serving (replicas up), scaling
(replicas loading, warming, draining or restarting), training (instances jobs hold), down
(instances in repair) and idle.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from clustersim.analysis.trace import SCHEMAS
from clustersim.cluster.rates import (
    checkpoint_intervals,
    default_checkpoint,
    effective_rates,
    job_failure_rate,
    storage_bandwidth_per_instance,
)
from clustersim.scenario.errors import Issue, ScenarioError
from clustersim.scenario.fleetday import elastic_smallest, elastic_unit, replica_chips
from clustersim.scenario.models import Scenario
from clustersim.scenario.serving import DeploymentSpec
from clustersim.serving.curves import LEVELS, ReplicaCurve, replica_curve
from clustersim.serving.load import load_rates, load_seed
from clustersim.serving.simulate import replica_models, weights_fit_issue
from clustersim.training.step import StepProfile

__all__ = ["FleetDayResult", "simulate_fleet_day", "fleet_day_figures", "day_table",
           "fleet_table", "CHIP_STATES", "HISTOGRAM_EDGES_S"]

CHIP_STATES = ("serving", "scaling", "training", "down", "idle")
# Log-spaced bins for the request-weighted latency distributions over the whole run.
HISTOGRAM_EDGES_S = np.logspace(-4, 6, 4001)
P50, P99 = 100, 198  # indices of LEVELS


@dataclass
class _Deployment:
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
class _Job:
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
    jobs: list[_Job]
    deployments: list[_Deployment]
    histograms: dict[str, dict[str, np.ndarray]]  # deployment -> ttft/tpot -> counts
    total_chips: int
    horizon_s: float
    failures: dict[str, int]


def _failure_events(scenario: Scenario, rng: np.random.Generator, horizon_s: float
                    ) -> list[tuple[float, bool, int, str]]:
    """(time, software?, instances downed, per) of every failure over the horizon, drawn at
    the mean rate of each process (Weibull ones too: their mean, as `--find-rate` does)."""
    hw = scenario.hardware
    n = scenario.total_instances
    ipu = hw.instances_per_ultraserver
    per_leaf = scenario.cluster.fabric.leaf_size(ipu)
    population = {"chip": n * hw.chips_per_instance, "instance": n,
                  "ultraserver": math.ceil(n / ipu) if hw.ultraserver else 0,
                  "leaf": math.ceil(n / per_leaf), "job": len(scenario.jobs)}
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
    events += _site_events(scenario, rng, horizon_s)
    events.sort()
    return events


def _site_events(scenario: Scenario, rng: np.random.Generator, horizon_s: float
                 ) -> list[tuple[float, bool, int, str]]:
    """(time, False, instances, "site-<kind>:<index>") of every site event: a power or
    cooling event downs its share of the site (whole UltraServers, as the timeline's), a
    partition (instances 0) stops the jobs larger than any one site. `index` is the event's
    in failures.site_events (its duration)."""
    net = scenario.site_network
    if net is None:
        return []
    hw = scenario.hardware
    ipu = hw.instances_per_ultraserver if hw.ultraserver else 1
    names = list(net.names)
    out = []
    for index, event in enumerate(scenario.failures.site_events):
        sites = [names.index(event.site)] if event.site is not None else range(net.count)
        for site in sites:
            units = max(1, net.instances[site] // ipu)
            width = 0 if event.kind == "partition" else (
                max(1, min(units, math.ceil(event.share * units))) * ipu)
            count = int(rng.poisson(event.rate_per_s * horizon_s))
            for t in np.sort(rng.uniform(0.0, horizon_s, count)).tolist():
                out.append((t, False, width, f"site-{event.kind}:{index}"))
    return out


def simulate_fleet_day(scenario: Scenario, seed: int, profiles: dict[str, StepProfile],
                       only: Collection[str] | None = None) -> FleetDayResult:
    """Step the scenario's fleet over its horizon (module docstring). `only`: the names of
    the deployments to simulate (the others left out; each keeps its index, so its load
    curve's noise stream)."""
    hw = scenario.hardware
    cpi = hw.chips_per_instance
    horizon = scenario.duration_s
    step = scenario.fluid.interval_s
    steps = max(1, math.ceil(horizon / step - 1e-9))
    times = np.arange(steps) * step
    dts = np.minimum(step, horizon - times)
    root = np.random.SeedSequence(seed, spawn_key=(19,))
    rng_failures, rng_victims = (np.random.default_rng(s) for s in root.spawn(2))
    f = scenario.failures
    repair_s = math.inf if f.repair_s == "never" else float(f.repair_s)
    storage = storage_bandwidth_per_instance()

    deployments: list[_Deployment] = []
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
        deployments.append(_Deployment(
            spec=d, curve=curve, chips=chips, rates=rates, per_replica_rate=max(per_rate, 1e-9),
            start_s=load_s + (a.warmup_s if a is not None else 0.0),
            priority=a.priority if a is not None else math.inf,
            minimum=minimum, maximum=maximum))

    jobs: list[_Job] = []
    for index, spec in enumerate(scenario.jobs):
        profile = profiles[spec.name]
        rate = job_failure_rate(scenario, spec)
        checkpoint = spec.checkpoint
        if checkpoint is None and rate > 0:
            checkpoint = default_checkpoint(scenario, spec)
        interval, _, _ = checkpoint_intervals(checkpoint, 1.0 / rate if rate > 0 else None)
        jobs.append(_Job(
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

    total_instances = scenario.total_instances
    state = {"free": total_instances, "down": 0}
    repairs: list[tuple[float, int]] = []
    failures = {"hardware": 0, "software": 0}
    site_net = scenario.site_network
    # Jobs larger than every site span sites: a partition of any stops them.
    largest_site = max(n - sp for n, sp in zip(site_net.instances, site_net.spares,
                                               strict=True)) if site_net is not None else 0
    events = _failure_events(scenario, rng_failures, horizon)
    cursor = 0

    def instances_for(dep: _Deployment, active: int) -> int:
        return -(-active * dep.chips // cpi)

    def resize(dep: _Deployment) -> int:
        """Recount a deployment's instances; returns the change (taken from or given back
        to the free pool by the caller)."""
        new = instances_for(dep, dep.active)
        change, dep.instances = new - dep.instances, new
        return change

    def release_job(job: _Job, now: float, preempted: bool) -> None:
        lose(job)
        state["free"] += job.held
        job.held = 0
        job.missing = 0
        job.state = "queued"
        if preempted:
            job.preemptions += 1

    def lose(job: _Job) -> None:
        job.lost_work_s += job.since_checkpoint_s
        job.useful_s -= job.since_checkpoint_s
        job.tokens -= job.since_checkpoint_tokens
        job.since_checkpoint_s = job.since_checkpoint_tokens = 0.0

    def resize_job(job: _Job, held: int, now: float) -> None:
        """An elastic job to `held` instances: it restarts from its last checkpoint."""
        lose(job)
        state["free"] += job.held - held
        if held < job.held:
            job.shrinks += 1
        else:
            job.grows += 1
        job.held = held
        job.state = "restarting"
        job.ready_at = now + f.restart_s + job.restore_s

    def preempt_for(dep: _Deployment, need: int, now: float) -> None:
        victims = sorted((j for j in jobs if j.held and j.priority < dep.priority),
                         key=lambda j: (j.priority, -j.last_start_s))
        for victim in victims:  # elastic ones shrink first, down to their minimum
            short = need - state["free"]
            if short <= 0:
                return
            spare = victim.held - victim.smallest
            if spare >= victim.group > 0 and victim.state != "waiting_for_hardware":
                # by at least a tenth of the job: a resize is a restart, not to be paid at
                # every step of a rising load
                want = max(short, math.ceil(victim.instances / 10))
                groups = min(spare // victim.group, -(-want // victim.group))
                resize_job(victim, victim.held - groups * victim.group, now)
                dep.preempted_for += 1
        for victim in victims:
            if state["free"] >= need:
                return
            if victim.held:
                release_job(victim, now, preempted=True)
                dep.preempted_for += 1

    def add_replica(dep: _Deployment, now: float) -> bool:
        extra = instances_for(dep, dep.active + 1) - dep.instances
        if extra > state["free"]:
            preempt_for(dep, extra, now)
        if extra > state["free"]:
            return False
        dep.starting.append(now + dep.start_s)
        state["free"] -= resize(dep)
        dep.scale_ups += 1
        return True

    def fail_hardware(now: float, width: int) -> None:
        failures["hardware"] += 1
        holders = [dep.instances for dep in deployments] + [j.held for j in jobs]
        weights = np.array(holders + [state["free"]], dtype=float)
        if weights.sum() <= 0:
            return
        choice = int(rng_victims.choice(len(weights), p=weights / weights.sum()))
        if choice < len(deployments):
            dep = deployments[choice]
            # the replicas with chips on the downed instances: those sharing one, or one per
            # instance-span of a replica over several
            hit = width * max(1, cpi // dep.chips) if dep.chips < cpi else \
                math.ceil(width * cpi / dep.chips)
            before = dep.instances
            for _ in range(min(hit, dep.active)):
                # the replicas on the failed instances: serving ones first
                if dep.up:
                    dep.up -= 1
                    dep.retries += dep.curve.e2e_mean_s[0] * dep.per_replica_rate
                elif dep.starting:
                    dep.starting.pop()
                elif dep.restarting:
                    dep.restarting.pop()
                else:
                    dep.draining.pop()
            dep.failures += 1
            resize(dep)
            taken = before - dep.instances
            downed = min(width, taken)
            state["free"] += taken - downed
        elif choice < len(deployments) + len(jobs):
            job = jobs[choice - len(deployments)]
            downed = min(width, job.held)
            job.held -= downed
            lose(job)
            job.interruptions += 1
            job.state = "waiting_for_hardware"
            job.missing += downed
            job.ready_at = now + f.detect_s
        else:
            downed = min(width, state["free"])
            state["free"] -= downed
        state["down"] += downed
        if downed and math.isfinite(repair_s):
            heapq.heappush(repairs, (now + f.detect_s + repair_s, downed))

    def site_event(now: float, width: int, what: str) -> None:
        """A site event (the timeline's `cluster.sites.SiteEvents`, on the fleet's pools):
        power or cooling downs `width` instances for its duration, taken from the jobs and
        the free pool in proportion to what each holds (the deployments' instances are left
        alone, as on the timeline); a partition stops every job spread over sites until it
        ends (no hardware goes down)."""
        kind, index = what.split(":")
        event = f.site_events[int(index)]
        failures[kind] = failures.get(kind, 0) + 1
        if kind == "site-partition":
            for job in jobs:
                if job.held and job.held > largest_site and job.state in ("running",
                                                                          "restarting"):
                    lose(job)
                    job.interruptions += 1
                    job.state = "restarting"
                    job.ready_at = (max(job.ready_at, now + event.duration_s) + f.restart_s
                                    + job.restore_s)
            return
        holders = [j for j in jobs if j.held]
        pool = sum(j.held for j in holders) + state["free"]
        if pool <= 0:
            return
        share = min(1.0, width / pool)
        downed_all = 0
        for job in holders:
            downed = min(job.held, round(job.held * share))
            if not downed:
                continue
            job.held -= downed
            lose(job)
            job.interruptions += 1
            job.state = "waiting_for_hardware"
            job.missing += downed
            job.ready_at = max(job.ready_at, now + event.duration_s)
            downed_all += downed
        free = min(state["free"], max(0, width - downed_all))
        state["free"] -= free
        downed_all += free
        state["down"] += downed_all
        if downed_all:
            heapq.heappush(repairs, (now + event.duration_s, downed_all))

    def fail_software(now: float, per: str) -> None:
        """A software fault, drawn over the whole population its rate is given for (every
        chip, or every job): as in the timeline it interrupts what runs there, a serving
        replica or a training job, and changes nothing on an idle chip or a job that is not
        training."""
        if per == "job":
            serving: list[_Deployment] = []
            holders = list(jobs)
            weights = np.ones(len(jobs))
        else:
            serving = [dep for dep in deployments if dep.up]
            holders = [j for j in jobs if j.held]
            weights = np.array([dep.up * dep.chips for dep in serving]
                               + [j.held * cpi for j in holders], dtype=float)
            rest = total_instances * cpi - weights.sum()  # idle, down, scaling: no one to stop
            weights = np.append(weights, max(rest, 0.0))
        if not len(weights) or weights.sum() <= 0:
            return
        choice = int(rng_victims.choice(len(weights), p=weights / weights.sum()))
        if choice < len(serving):
            failures["software"] += 1
            dep = serving[choice]
            dep.up -= 1
            dep.failures += 1
            dep.retries += dep.curve.e2e_mean_s[0] * dep.per_replica_rate
            dep.restarting.append(now + f.detect_s + f.restart_s)
            return
        if choice - len(serving) >= len(holders):
            return
        job = holders[choice - len(serving)]
        if job.state != "running" or not job.held:
            return  # software fails while it trains
        failures["software"] += 1
        lose(job)
        job.interruptions += 1
        job.state = "restarting"
        job.ready_at = now + f.detect_s + f.restart_s + job.restore_s

    def place(dep: _Deployment, k: int, now: float) -> None:
        """The deployment starts with the replicas its first step's load needs (at least
        `replicas`), within [min, max], loaded: it was loaded before the horizon, or before
        its `start` (from which it holds its chips). A later start takes its instances from
        the jobs below it when none are free, and starts with what fits."""
        first = dep.spec.replicas
        if dep.spec.autoscale is not None:
            first = max(first, math.ceil(float(dep.rates[k]) / dep.per_replica_rate - 1e-9))
        wanted = max(dep.minimum, min(dep.maximum, first))
        if k and instances_for(dep, wanted) > state["free"]:
            preempt_for(dep, instances_for(dep, wanted), now)
        fits = state["free"] * cpi // dep.chips  # whole free instances, shared by replicas
        dep.up = max(dep.minimum, min(dep.maximum, first, fits)) if not k else min(wanted, fits)
        dep.placed = True
        state["free"] -= resize(dep)

    # The fleet was serving before the horizon (or its deployment's start).
    for dep in sorted(deployments, key=lambda x: -x.priority):
        if dep.spec.start_s <= 0:
            place(dep, 0, 0.0)
    if state["free"] < 0:
        raise ValueError("the deployments' starting replicas do not fit the cluster")

    names = [dep.spec.name for dep in deployments]
    columns = ("replicas", "starting", "draining", "load_per_s", "served", "arrived",
               "backlog_mean")
    series = {n: {c: np.zeros(steps) for c in columns} for n in names}
    fleet = {s: np.zeros(steps) for s in CHIP_STATES}
    job_chips = {j.name: np.zeros(steps) for j in jobs}
    decide_every = {dep.spec.name: max(1, round((dep.spec.autoscale.interval_s
                                                 if dep.spec.autoscale else step) / step))
                    for dep in deployments}
    order = sorted(deployments, key=lambda x: -x.priority)
    job_order = sorted(jobs, key=lambda j: (-j.priority, j.submit_s, j.index))

    for k in range(steps):
        now = float(times[k])
        dt = float(dts[k])
        end = now + dt
        while repairs and repairs[0][0] <= now:
            _, count = heapq.heappop(repairs)
            state["down"] -= count
            state["free"] += count
        for dep in deployments:
            if dep.starting and min(dep.starting) <= now:
                ready = [t for t in dep.starting if t <= now]
                dep.starting = [t for t in dep.starting if t > now]
                dep.up += len(ready)
            if dep.restarting and min(dep.restarting) <= now:
                back = [t for t in dep.restarting if t <= now]
                dep.restarting = [t for t in dep.restarting if t > now]
                dep.up += len(back)
            if dep.draining and min(dep.draining) <= now:
                dep.draining = [t for t in dep.draining if t > now]
                state["free"] -= resize(dep)
        for dep in order:  # a deployment's start: its replicas, loaded, from this step
            if not dep.placed and now >= dep.spec.start_s:
                place(dep, k, now)
        while cursor < len(events) and events[cursor][0] < end:
            t, software, width, per = events[cursor]
            cursor += 1
            if software:
                fail_software(t, per)
            elif per.startswith("site-"):
                site_event(t, width, per)
            else:
                fail_hardware(t, width)
        # Autoscaling, the highest priority first.
        for dep in order:
            a = dep.spec.autoscale
            if a is None or not dep.placed or k % decide_every[dep.spec.name]:
                continue
            observed = float(dep.rates[k - 1]) if k else float(dep.rates[0])
            wanted = (observed + dep.backlog / a.interval_s) / dep.per_replica_rate
            need = min(dep.maximum, max(dep.minimum, math.ceil(wanted - 1e-9)))
            dep.needs.append((now, need))
            while dep.needs and dep.needs[0][0] < now - a.scale_down_after_s:
                dep.needs.pop(0)
            keep = max(n for _, n in dep.needs)
            serving_soon = dep.up + len(dep.starting) + len(dep.restarting)
            if need > serving_soon:
                for _ in range(need - serving_soon):
                    if not add_replica(dep, now):
                        break
            elif keep < serving_soon:
                surplus = serving_soon - keep
                while surplus and dep.starting:  # cancel loads first
                    dep.starting.pop()
                    surplus -= 1
                    dep.scale_downs += 1
                while surplus and dep.up:
                    dep.up -= 1
                    dep.draining.append(now + a.drain_s)
                    surplus -= 1
                    dep.scale_downs += 1
                state["free"] -= resize(dep)
        # Training on what is left: recoveries first, then the queue by priority.
        for job in job_order:
            if job.state == "pending" and job.submit_s <= now:
                job.state = "queued"
            if (job.state == "waiting_for_hardware" and job.ready_at <= end
                    and job.missing <= state["free"]):
                state["free"] -= job.missing
                job.held += job.missing
                job.missing = 0
                job.state = "restarting"
                job.ready_at = max(job.ready_at, now) + f.restart_s + job.restore_s
        for job in job_order:
            # An elastic job below its size grows back when the rest of it is free.
            if (job.state == "running" and job.smallest < job.instances
                    and job.held < job.instances and job.instances - job.held <= state["free"]):
                resize_job(job, job.instances, now)  # (takes them from the pool)
            fits = job.instances
            if job.smallest < job.instances and job.state == "queued":
                fits = min(job.instances, state["free"] // job.group * job.group)
            if job.state == "queued" and job.smallest <= fits <= state["free"]:
                state["free"] -= fits
                job.held = fits
                job.last_start_s = now
                if job.started:
                    job.state = "restarting"
                    job.ready_at = now + f.restart_s + job.restore_s
                else:
                    job.started, job.start_s = True, now
                    job.state = "running"
                    job.ready_at = now
                    if job.run_for_s is not None:
                        job.end_s = min(job.end_s, now + job.run_for_s)
        for job in jobs:
            job.held_chip_s += job.held * cpi * dt
            job_chips[job.name][k] = job.held * cpi
            if job.state in ("running", "restarting"):
                run = max(0.0, end - max(now, job.ready_at))
                overhead = dt - run
                job.time_by_state_s["restarting"] = job.time_by_state_s.get(
                    "restarting", 0.0) + overhead
                if job.state == "restarting" and job.ready_at <= end:
                    job.state = "running"
                _train(job, run)
            elif job.state in ("queued", "waiting_for_hardware"):
                job.time_by_state_s[job.state] = job.time_by_state_s.get(job.state, 0.0) + dt
            target = job.steps_target is not None and job.state == "running" and \
                job.tokens >= job.steps_target * job.tokens_per_step
            if target or (job.state not in ("pending", "done") and end >= job.end_s):
                job.done_why = "reached its step target" if target else "its end came"
                job.done_s = end
                job.state = "done"
                state["free"] += job.held
                job.held = 0
        # The fluid queues.
        serving = scaling = stranded = 0
        for dep in deployments:
            s = series[dep.spec.name]
            arrived = float(dep.rates[k]) * dt
            capacity = dep.up * dep.curve.capacity_per_s * dt
            served = min(dep.backlog + arrived, capacity)
            after = dep.backlog + arrived - served
            s["replicas"][k] = dep.up
            s["starting"][k] = len(dep.starting) + len(dep.restarting)
            s["draining"][k] = len(dep.draining)
            s["load_per_s"][k] = dep.rates[k]
            s["served"][k] = served
            s["arrived"][k] = arrived
            s["backlog_mean"][k] = (dep.backlog + after) / 2.0
            dep.backlog = after
            serving += dep.up * dep.chips
            scaling += (dep.active - dep.up) * dep.chips
            stranded += dep.instances * cpi - dep.active * dep.chips
        held = sum(j.held for j in jobs)
        counted = state["free"] + state["down"] + held + sum(d.instances for d in deployments)
        if counted != total_instances or state["free"] < 0:
            raise AssertionError(f"instance books at {now:g} s: {counted} counted, "
                                 f"{total_instances} in the cluster, {state['free']} free")
        fleet["serving"][k] = serving
        fleet["scaling"][k] = scaling
        fleet["training"][k] = held * cpi
        fleet["down"][k] = state["down"] * cpi
        fleet["idle"][k] = state["free"] * cpi + stranded

    histograms = {}
    for dep in deployments:
        histograms[dep.spec.name] = _latency(dep, series[dep.spec.name], dts)
    for name, chips in job_chips.items():
        fleet[f"job:{name}"] = chips
    return FleetDayResult(times, dts, names, series, fleet, jobs, deployments, histograms,
                          total_instances * cpi, horizon, failures)


def _train(job: _Job, run_s: float) -> None:
    """`run_s` seconds on the job's instances: training, and blocking checkpoint writes."""
    if run_s <= 0:
        return
    share = 1.0
    if math.isfinite(job.interval_s) and not job.async_write and job.write_s > 0:
        share = job.interval_s / (job.interval_s + job.write_s)
    work = run_s * share
    job.checkpointing_s += run_s - work
    job.useful_s += work
    tokens = work * job.tokens_per_s * job.held / job.instances  # fewer DP groups: fewer
    job.tokens += tokens
    job.since_checkpoint_tokens += tokens
    job.time_by_state_s["running"] = job.time_by_state_s.get("running", 0.0) + work
    job.time_by_state_s["checkpointing"] = job.time_by_state_s.get(
        "checkpointing", 0.0) + run_s - work
    job.since_checkpoint_s += work
    if math.isfinite(job.interval_s) and job.since_checkpoint_s >= job.interval_s:
        done = math.floor(job.since_checkpoint_s / job.interval_s)
        job.checkpoints += done
        # what is left since the last write, in time and (at the present size) tokens
        left = job.since_checkpoint_s - done * job.interval_s
        job.since_checkpoint_tokens *= left / job.since_checkpoint_s
        job.since_checkpoint_s = left


# Steps whose latency quantiles (LEVELS of them each) are held at once: the per-level
# matrices take about 8 KB a step, so a year at one step a minute was 4.7 GB at once.
LATENCY_CHUNK_STEPS = 4096


def _latency(dep: _Deployment, s: dict[str, np.ndarray], dts: np.ndarray
             ) -> dict[str, np.ndarray]:
    """Per step: TTFT and TPOT percentiles, SLO attainment, from the replica curve at the
    step's utilisation plus the backlog's wait (vectorised over the steps, a chunk of them
    at a time); returns the request-weighted histograms of TTFT and TPOT over the run (each
    step's quantiles weighted by the requests it served), for the run's percentiles."""
    curve = dep.curve
    n = s["replicas"]
    service = n * curve.capacity_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(service > 0, s["load_per_s"] / service, curve.rho[-1])
        wait = np.where(service > 0, s["backlog_mean"] / service,
                        np.where(s["backlog_mean"] > 0, dts, 0.0))
    rho = np.where(s["backlog_mean"] > 0, curve.rho[-1], rho)
    steps = len(rho)
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "slo_attainment",
                "in_system"):
        s[key] = np.empty(steps)
    histograms = {key: np.zeros(len(HISTOGRAM_EDGES_S) - 1) for key in ("ttft", "tpot")}
    for a in range(0, steps, LATENCY_CHUNK_STEPS):
        part = slice(a, min(steps, a + LATENCY_CHUNK_STEPS))
        ttft, tpot, slo, e2e = curve.at(rho[part])
        ttft = ttft + wait[part, None]
        s["ttft_p50_s"][part] = ttft[:, P50]
        s["ttft_p99_s"][part] = ttft[:, P99]
        s["tpot_p50_s"][part] = tpot[:, P50]
        s["tpot_p99_s"][part] = tpot[:, P99]
        s["slo_attainment"][part] = np.mean(slo + wait[part, None] <= dep.spec.slo.ttft_s,
                                            axis=1)
        # Little's law: requests in the system = rate through it x time in it, plus the
        # backlog.
        s["in_system"][part] = (np.minimum(s["load_per_s"][part], service[part]) * e2e
                                + s["backlog_mean"][part])
        weights = np.repeat(s["served"][part] / len(LEVELS), len(LEVELS))
        for key, values in (("ttft", ttft.ravel()), ("tpot", tpot.ravel())):
            finite = np.isfinite(values)
            histograms[key] += np.histogram(
                np.clip(values[finite], HISTOGRAM_EDGES_S[0], HISTOGRAM_EDGES_S[-1]),
                bins=HISTOGRAM_EDGES_S, weights=weights[finite])[0]
    s["wait_s"] = wait
    s["output_tokens"] = s["served"] * curve.output_tokens_mean
    return histograms


def _percentile(counts: np.ndarray, q: float) -> float | None:
    total = counts.sum()
    if total <= 0:
        return None
    cumulative = np.cumsum(counts) / total
    i = int(np.searchsorted(cumulative, q))
    i = min(i, len(counts) - 1)
    # geometric middle of the bin, interpolated within it
    low, high = HISTOGRAM_EDGES_S[i], HISTOGRAM_EDGES_S[i + 1]
    before = cumulative[i - 1] if i else 0.0
    share = (q - before) / max(cumulative[i] - before, 1e-12)
    return float(low * (high / low) ** min(max(share, 0.0), 1.0))


def fleet_day_figures(scenario: Scenario, result: FleetDayResult) -> dict[str, Any]:
    """summary.json `fleet_day` and `deployments.<name>` figures of a fleet-day run."""
    hw = scenario.hardware
    price = hw.instance.price_per_hour_usd
    chip_price_h = None if price is None else price / hw.chips_per_instance
    dts = result.dt_s
    hours = {s: float(np.dot(result.fleet[s], dts)) / 3600.0 for s in CHIP_STATES}
    deployments = {}
    serving_tokens = 0.0
    for dep in result.deployments:
        s = result.series[dep.spec.name]
        h = result.histograms[dep.spec.name]
        arrived = float(s["arrived"].sum())
        served = float(s["served"].sum())
        tokens = float(s["output_tokens"].sum())
        serving_tokens += tokens
        chip_h = float(np.dot((s["replicas"] + s["starting"] + s["draining"]) * dep.chips,
                              dts)) / 3600.0
        attained = np.clip(s["slo_attainment"], 0.0, 1.0)
        # Missed as its own sum of non-negative terms (arrived - met cancelled to -3.7e-9),
        # and the goodput from it: all met is exactly 0 missed and a goodput of 1.
        missed = float(np.dot(1.0 - attained, s["arrived"]))
        span = max(result.horizon_s - dep.spec.start_s, 1e-9)
        # Its replicas over its own span: from the step of its start (it holds none before).
        since = result.times_s >= dep.spec.start_s
        since[-1] = True  # a start in the last step
        live = s["replicas"][since]
        deployments[dep.spec.name] = {
            "model": dep.spec.model.name, "fidelity": "fluid", "tp": dep.spec.tp,
            "pp": dep.spec.pp, "chips_per_replica": dep.chips,
            "replicas_min": int(live.min()), "replicas_max": int(live.max()),
            "replicas_mean": float(np.dot(live, dts[since]) / dts[since].sum()),
            "capacity_per_replica_per_s": dep.curve.capacity_per_s,
            "provisioned_per_replica_per_s": dep.per_replica_rate,
            "replica_start_s": dep.start_s,
            "requests": arrived, "requests_completed": served,
            "requests_per_s": served / span,
            "peak_load_per_s": float(s["load_per_s"].max()),
            "output_tokens_per_s": tokens / span, "output_tokens": tokens,
            "ttft_p50_s": _percentile(h["ttft"], 0.5), "ttft_p99_s": _percentile(h["ttft"], 0.99),
            "tpot_p50_s": _percentile(h["tpot"], 0.5), "tpot_p99_s": _percentile(h["tpot"], 0.99),
            "slo_goodput": max(0.0, 1.0 - missed / arrived) if arrived > 0 else None,
            "slo_missed_requests": missed,
            "backlog_end": float(dep.backlog),
            "chip_hours": chip_h,
            "cost_per_million_output_tokens_usd": (chip_h * chip_price_h / tokens * 1e6
                                                   if chip_price_h is not None and tokens > 0
                                                   else None),
            "replica_failures": dep.failures, "retries": dep.retries,
            "scale_ups": dep.scale_ups, "scale_downs": dep.scale_downs,
            "jobs_preempted": dep.preempted_for,
        }
    jobs = {}
    trained = 0.0
    for job in result.jobs:
        tokens = max(0.0, job.tokens)
        trained += tokens
        end = job.done_s if job.done_s is not None else result.horizon_s
        jobs[job.name] = {
            # the timeline's words: done, or the state it was in "at horizon"
            "status": "done" if job.state == "done" else f"{job.state} at horizon",
            "reason": job.done_why,
            "instances": job.instances, "chips": job.instances * hw.chips_per_instance,
            "start_s": job.start_s, "tokens_trained": tokens,
            "useful_s": max(0.0, job.useful_s), "lost_work_s": job.lost_work_s,
            "checkpointing_s": job.checkpointing_s, "checkpoints_completed": job.checkpoints,
            "checkpoint_interval_s": job.interval_s if math.isfinite(job.interval_s) else None,
            "preemptions": job.preemptions, "interruptions": job.interruptions,
            "shrinks": job.shrinks, "grows": job.grows,
            "held_chip_s": job.held_chip_s,
            "time_by_state_s": dict(sorted(job.time_by_state_s.items())),
            # As the timeline's: useful time over the wall time since it started (ETTR) and
            # since it was submitted (goodput), up to its end or the horizon.
            "ettr": (max(0.0, job.useful_s) / max(end - job.start_s, 1e-9)
                     if job.start_s is not None else 0.0),
            "goodput": max(0.0, job.useful_s) / max(end - job.submit_s, 1e-9),
            "effective_cost_per_million_tokens_usd": (
                job.held_chip_s / 3600 * chip_price_h / tokens * 1e6
                if chip_price_h is not None and tokens > 0 else None),
        }
    cost = (None if chip_price_h is None else
            {s: hours[s] * chip_price_h for s in CHIP_STATES})
    serving_chip_h = hours["serving"] + hours["scaling"]
    return {
        "deployments": deployments, "jobs": jobs,
        "fleet_day": {
            "interval_s": scenario.fluid.interval_s, "steps": len(result.times_s),
            "chip_hours": hours, "chip_hours_total": sum(hours.values()),
            "cluster_chip_hours": result.total_chips * result.horizon_s / 3600.0,
            "peak_load_per_s": float(np.max(np.sum(
                [result.series[n]["load_per_s"] for n in result.names], axis=0)))
            if result.names else 0.0,
            "output_tokens": serving_tokens, "training_tokens": trained,
            "cost_usd": cost,
            "serving_cost_per_million_output_tokens_usd": (
                serving_chip_h * chip_price_h / serving_tokens * 1e6
                if chip_price_h is not None and serving_tokens > 0 else None),
            "training_cost_per_million_tokens_usd": (
                hours["training"] * chip_price_h / trained * 1e6
                if chip_price_h is not None and trained > 0 else None),
            "fleet_cost_per_million_output_tokens_usd": (
                sum(hours.values()) * chip_price_h / serving_tokens * 1e6
                if chip_price_h is not None and serving_tokens > 0 else None),
            "failures": dict(result.failures),
            "curve_requests_simulated": sum(d.curve.requests_simulated
                                            for d in result.deployments),
        },
    }


def day_table(result: FleetDayResult) -> pa.Table:
    """`day.parquet`: one row per deployment per step."""
    parts = []
    for index, name in enumerate(result.names):
        s = result.series[name]
        n = len(result.times_s)
        parts.append(pa.table({
            "deployment": pa.array([name] * n, pa.string()).dictionary_encode(),
            "deployment_id": np.full(n, index, dtype=np.int16),
            "time_s": result.times_s, "duration_s": result.dt_s,
            "replicas": s["replicas"].astype(np.int32),
            "replicas_starting": s["starting"].astype(np.int32),
            "replicas_draining": s["draining"].astype(np.int32),
            "load_per_s": s["load_per_s"], "served_per_s": s["served"] / result.dt_s,
            "backlog": s["backlog_mean"],
            "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"],
            "tpot_p50_s": s["tpot_p50_s"], "tpot_p99_s": s["tpot_p99_s"],
            "slo_attainment": s["slo_attainment"], "output_tokens": s["output_tokens"],
        }))
    schema = SCHEMAS["day"]
    return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()


def fleet_table(result: FleetDayResult) -> pa.Table:
    """`fleet.parquet`: one row per step, chips by state (and per job)."""
    columns: dict[str, Any] = {"time_s": result.times_s, "duration_s": result.dt_s}
    for key, values in result.fleet.items():
        name = f"{key}_chips" if not key.startswith("job:") else key
        columns[name] = values.astype(np.int64)
    return pa.table(columns)
