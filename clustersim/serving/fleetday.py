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
  Site events (power, cooling, partition): clustersim.serving.fleetday_sites.

Placement is by count of instances (no topology): a deployment's replicas smaller than an
instance share instances; the chips of a deployment's partly used instance count as idle in
the split below, and in the deployment's chip-hours and cost (it holds them).
Chip-time is split five ways that add up to the cluster's: serving (replicas up), scaling
(replicas loading, warming, draining or restarting), training (instances jobs hold), down
(instances in repair) and idle.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection

import numpy as np

from clustersim.scenario.models import Scenario
from clustersim.serving.elastic_growth import grow_by
from clustersim.serving.fleetday_latency import latency_books
from clustersim.serving.fleetday_sites import apply_site_event
from clustersim.serving.fleetday_state import (
    CHIP_STATES,
    DeploymentState,
    FleetDayResult,
    JobState,
    deployment_states,
    failure_events,
    job_states,
)
from clustersim.training.profile import StepProfile

__all__ = ["simulate_fleet_day"]


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

    deployments = deployment_states(scenario, seed, only, times, step)
    jobs = job_states(scenario, profiles)

    total_instances = scenario.total_instances
    state = {"free": total_instances, "down": 0}
    repairs: list[tuple[float, int]] = []
    failures = {"hardware": 0, "software": 0}
    events = failure_events(scenario, rng_failures, horizon)
    cursor = 0

    def instances_for(dep: DeploymentState, active: int) -> int:
        return -(-active * dep.chips // cpi)

    def resize(dep: DeploymentState) -> int:
        """Recount a deployment's instances; returns the change (taken from or given back
        to the free pool by the caller)."""
        new = instances_for(dep, dep.active)
        change, dep.instances = new - dep.instances, new
        return change

    def release_job(job: JobState, now: float, preempted: bool) -> None:
        lose(job)
        state["free"] += job.held
        job.held = 0
        job.missing = 0
        job.state = "queued"
        if preempted:
            job.preemptions += 1

    def lose(job: JobState) -> None:
        job.lost_work_s += job.since_checkpoint_s
        job.useful_s -= job.since_checkpoint_s
        job.tokens -= job.since_checkpoint_tokens
        job.since_checkpoint_s = job.since_checkpoint_tokens = 0.0

    def resize_job(job: JobState, held: int, now: float) -> None:
        """An elastic job to `held` instances: it restarts from its last checkpoint."""
        lose(job)
        state["free"] += job.held - held
        if held < job.held:
            job.shrinks += 1
            job.last_shrink_s = now
        else:
            job.grows += 1
        job.held = held
        job.state = "restarting"
        job.ready_at = now + f.restart_s + job.restore_s

    def preempt_for(dep: DeploymentState, need: int, now: float) -> None:
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

    def add_replica(dep: DeploymentState, now: float) -> bool:
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
            keep = job.held // job.group * job.group if job.group > 0 else 0
            if (job.smallest < job.instances and keep >= job.smallest
                    and job.state in ("running", "restarting")):
                # An elastic job goes on with the whole groups it has left once the failure
                # is detected (it grows back as instances come free), not holding them idle
                # until a repair or a spare.
                state["free"] += job.held - keep
                job.held = keep
                job.shrinks += 1
                job.last_shrink_s = now
                job.state = "restarting"
                job.ready_at = now + f.detect_s + f.restart_s + job.restore_s
            else:
                job.state = "waiting_for_hardware"
                job.missing += downed
                job.ready_at = now + f.detect_s
        else:
            downed = min(width, state["free"])
            state["free"] -= downed
        state["down"] += downed
        if downed and math.isfinite(repair_s):
            heapq.heappush(repairs, (now + f.detect_s + repair_s, downed))

    def fail_software(now: float, per: str) -> None:
        """A software fault, drawn over the whole population its rate is given for (every
        chip, or every job): as in the timeline it interrupts what runs there, a serving
        replica or a training job, and changes nothing on an idle chip or a job that is not
        training."""
        if per == "job":
            serving: list[DeploymentState] = []
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

    def place(dep: DeploymentState, k: int, now: float) -> None:
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
    columns = ("replicas", "starting", "draining", "instances", "load_per_s", "served",
               "arrived", "backlog_mean")
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
                apply_site_event(t, width, per, scenario, jobs, state, repairs, failures, lose)
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
            # An elastic job below its size grows back as instances come free.
            if job.state == "running" and job.smallest < job.instances:
                cost = f.restart_s + job.restore_s + job.since_checkpoint_s
                more = grow_by(job.instances, job.held, job.group, state["free"], cost,
                               now - job.last_shrink_s)
                if more:
                    resize_job(job, job.held + more, now)  # (takes them from the pool)
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
            stop = min(end, job.end_s)  # its end may come inside the step
            finished = None  # when it reached its step target inside the step
            if job.state in ("running", "restarting"):
                since = max(now, job.ready_at)
                run = max(0.0, end - since)
                overhead = dt - run
                job.time_by_state_s["restarting"] = job.time_by_state_s.get(
                    "restarting", 0.0) + min(overhead, max(0.0, stop - now))
                if job.state == "restarting" and job.ready_at <= end:
                    job.state = "running"
                run = min(run, max(0.0, stop - since))
                needed = _run_to_target_s(job)
                if needed <= run:
                    run, finished = needed, since + needed
                _train(job, run)
            elif job.state in ("queued", "waiting_for_hardware"):
                job.time_by_state_s[job.state] = job.time_by_state_s.get(
                    job.state, 0.0) + max(0.0, min(dt, stop - now))
            target = finished is not None or (
                job.steps_target is not None and job.state == "running"
                and job.tokens >= job.steps_target * job.tokens_per_step)
            if target or (job.state not in ("pending", "done") and end >= job.end_s):
                job.done_why = "reached its step target" if target else "its end came"
                job.done_s = finished if finished is not None else stop
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
            s["instances"][k] = dep.instances
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

    histograms = {dep.spec.name: latency_books(dep, series[dep.spec.name], dts)
                  for dep in deployments}
    for name, chips in job_chips.items():
        fleet[f"job:{name}"] = chips
    return FleetDayResult(times, dts, names, series, fleet, jobs, deployments, histograms,
                          total_instances * cpi, horizon, failures)


def _run_to_target_s(job: JobState) -> float:
    """Running seconds (training and blocking checkpoint writes, as `_train` counts them)
    until the job reaches its step target at its present size; infinite without one."""
    if job.steps_target is None or job.held <= 0:
        return math.inf
    rate = job.tokens_per_s * job.held / job.instances
    if math.isfinite(job.interval_s) and not job.async_write and job.write_s > 0:
        rate *= job.interval_s / (job.interval_s + job.write_s)
    left = job.steps_target * job.tokens_per_step - job.tokens
    return max(0.0, left) / rate if rate > 0 else math.inf


def _train(job: JobState, run_s: float) -> None:
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
