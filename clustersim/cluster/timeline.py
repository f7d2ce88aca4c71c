"""The cluster timeline: jobs running for days to months while hardware fails, is repaired or
replaced from spares, and jobs restart from checkpoints.

Scale by design (DESIGN.md): one simpy process per job and one for all failures, never one
per chip or per step.

- A job advances its steps in bulk between discrete events (failure, repair, restart, end),
  its periodic checkpoints in closed form (`periodic`, `job_periodic`): `jobrun`, with its
  books in `job_accounting` and its recovery in `job_recovery`.
- Failures (`faults`): every exponential process of every component, per chip, instance,
  UltraServer or leaf, is one superposed Poisson stream; Weibull processes keep a heap of
  per-unit next-failure times, drawn vectorised.
- Blast radius: a hardware fault takes its instance down (an UltraServer fault the
  UltraServer, a leaf-switch fault every instance under the leaf); a software fault
  interrupts the job on that chip while it trains and downs nothing. A job loses the instances that went
  down; spares swap in; a failed instance is repaired after the repair time and returns to
  the pool. Jobs whose tensor parallelism spans instances over NeuronLink (Trn2 UltraServer
  Z rings) hold whole UltraServers: losing one instance takes the whole UltraServer out of
  the job (its Z rings are broken), and only a whole healthy UltraServer replaces it.
- Recovery: detection delay, waiting for replacement hardware, restart, restore from the last
  completed checkpoint; the work since that checkpoint is lost.
- Scheduling (`scheduler`, `policies`, `placement`, `uplinks`): FIFO, priority, EASY backfill
  and preemption; topology-aware placement; jobs sharing oversubscribed leaf uplinks.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import simpy

from clustersim.analysis.trace import JOB_STATES, MemoryRecorder
from clustersim.cluster.faults import FailureSource
from clustersim.cluster.fluid_holding import Holding, HoldingBook
from clustersim.cluster.freepool import FreePool
from clustersim.cluster.instants import event_at
from clustersim.cluster.jobrun import JobRun
from clustersim.cluster.outcomes import JobOutcome, TimelineResult
from clustersim.cluster.owners import FREE, SERVING
from clustersim.cluster.placement import Placer
from clustersim.cluster.queues import ActiveJobs
from clustersim.cluster.quotas import TeamBook
from clustersim.cluster.rates import (
    daly_interval,
    effective_rates,
    job_failure_rate,
    job_failure_rates,
    young_interval,
)
from clustersim.cluster.scheduler import Scheduler
from clustersim.cluster.sites import SiteEvents, SitePlacer, cut_off
from clustersim.cluster.uplinks import UplinkBook
from clustersim.scenario.models import Scenario
from clustersim.scenario.serving import deployment_instances
from clustersim.training.profile import StepProfile
from clustersim.training.step import StepModel

__all__ = [
    "JOB_STATES",
    "Timeline",
    "collector_paused",
    "heap_frozen",
    "freeze_heap",
    "TimelineResult",
    "JobOutcome",
    "young_interval",
    "daly_interval",
    "job_failure_rate",
    "effective_rates",
]


class Retired:
    """A job that is done, as the horizon's close reads it (JobAccounting.close of a done
    job: its time done since its end, that interval's row, its progress and chip-time)."""

    __slots__ = ("t", "index", "outcome", "state", "state_since", "progress",
                 "allocated_chip_s")
    held_count = 0
    site_cross_s = 0.0

    def __init__(self, timeline: Timeline, run: JobRun):
        self.t = timeline
        self.index = run.index
        self.outcome = run.outcome
        self.state = run.state
        self.state_since = run.state_since
        self.progress = run.progress
        self.allocated_chip_s = run.allocated_chip_s

    def close(self, horizon: float) -> None:
        self.outcome.time_in_state[self.state] += horizon - self.state_since
        if self.t.recorder is not None and horizon > self.state_since:
            self.t.recorder.interval("job", self.index, self.state, self.state_since, horizon)
        self.state_since = horizon
        self.outcome.progress_steps = self.progress
        self.outcome.held_chip_s = self.allocated_chip_s


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (as it was, afterwards).

    A run leaves next to no cyclic garbage (8 objects after 4 days of a 13,600-job fleet
    with failures and preemptions) while it keeps making long-lived objects, so the
    collector's passes over the whole heap were pure cost: 16 s of the 100,000-job month's
    134 s CPU, 9 s of them in the timeline's run. Reference counting still frees everything
    a run drops."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


_FROZEN = [0]  # `heap_frozen` blocks entered and not left


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Every object alive now left out of the cyclic garbage collector's passes
    (`gc.freeze`) until the outermost such block ends; `freeze_heap()` inside it leaves out
    what was made since. The collector stays on for what is made meanwhile (the serving
    simulators' garbage), but its full passes no longer walk a year's million job specs and
    outcomes, none of which is ever cyclic garbage: those passes were 6 s of the Rainier
    year's 30-day slice (104 s CPU), while the serving plans ran and after the timeline."""
    _FROZEN[0] += 1
    gc.freeze()
    try:
        yield
    finally:
        _FROZEN[0] -= 1
        if not _FROZEN[0]:
            gc.unfreeze()


def freeze_heap() -> None:
    """Inside `heap_frozen`: what was made since, out of the collector's passes too."""
    if _FROZEN[0]:
        gc.freeze()


class Timeline:
    """One simulation of a scenario's horizon. Use `run()` once."""

    # Jobs made when they arrive and kept only as `Retired` once done (tests turn it off:
    # every job made at the start and kept whole, as before, must give the same run).
    lazy_jobs = True

    def __init__(self, scenario: Scenario, profiles: dict[str, StepProfile],
                 seed_sequence: np.random.SeedSequence,
                 progress: Callable[[float, float], None] | None = None,
                 recorder: MemoryRecorder | None = None,
                 step_model: StepModel | None = None, *, checkpoint_events: bool = False,
                 holdings: list[Holding] | None = None):
        self.scenario = scenario
        # One discrete event per checkpoint (the reference the closed form of periodic
        # checkpoints, cluster.job_periodic, is tested against) instead of the closed form.
        self.checkpoint_events = checkpoint_events
        self.profiles = profiles
        self.step_model = step_model
        self.progress = progress
        self.recorder = recorder
        hw = scenario.hardware
        self.cpi = hw.chips_per_instance
        self.ipu = hw.instances_per_ultraserver
        self.n_instances = scenario.total_instances
        self.n_chips = self.n_instances * self.cpi
        self.per_leaf = scenario.cluster.fabric.leaf_size(self.ipu)
        self.n_leaves = math.ceil(self.n_instances / self.per_leaf)
        self.n_us = math.ceil(self.n_instances / self.ipu) if hw.ultraserver else 0
        streams = seed_sequence.spawn(4)
        self.rng_failures = np.random.default_rng(streams[0])
        self.rng_jobs = np.random.default_rng(streams[1])
        self.rng_stragglers = np.random.default_rng(streams[2])
        self.env = simpy.Environment()
        repair = scenario.failures.repair_s
        self.repair_s = math.inf if repair == "never" else float(repair)
        # Instance state: owner is a job's index, FREE, or SERVING for the instances the
        # scenario's deployments hold for the whole run (the first ones, in the order the
        # serving simulator takes them): jobs are placed around them.
        self.healthy = np.ones(self.n_instances, dtype=bool)
        self.owner = np.full(self.n_instances, FREE, dtype=np.int32)
        # (fluid deployments' `holdings` come and go instead: cluster.fluid_holding)
        self.serving_instances = 0 if holdings else min(self.n_instances, sum(
            deployment_instances(d, hw) for d in scenario.serve))
        self.owner[: self.serving_instances] = SERVING
        # The slot (position among the deployments' instances, as the serving simulator
        # numbers them) each serving instance holds; -1 elsewhere. A hot spare that replaces
        # a failed serving instance takes over its slot.
        self.serving_slot = np.full(self.n_instances, -1, dtype=np.int64)
        self.serving_slot[: self.serving_instances] = np.arange(self.serving_instances)
        # (time, slot, chip within the instance or -1 for the whole instance, seconds the
        # replicas stay down) of each hardware failure that downs a serving instance: the
        # serving simulator takes its replicas' hardware failures from these.
        self.serving_outages: list[tuple[float, int, int, float]] = []
        self.min_free = self.n_instances - self.serving_instances
        self.hardware_event = self.env.event()
        self.instance_leaf = np.arange(self.n_instances) // self.per_leaf
        # Serving instances per leaf (they never come free for jobs): kept up to date when a
        # hot spare takes a serving slot, so the scheduler need not recount them.
        self.serving_per_leaf = np.bincount(self.instance_leaf[: self.serving_instances],
                                            minlength=self.n_leaves)
        # The free instances and their counts per leaf, kept as owners and health change
        # (`set_owner`, `set_healthy`: the only writers of `owner` and `healthy`).
        self.free_pool = FreePool(self.healthy, self.owner, self.instance_leaf, self.n_leaves)
        ring = hw.ultraserver is not None and hw.ultraserver.interconnect.topology == "ring"
        self.placer = Placer(self.ipu, self.n_us, self.per_leaf, self.instance_leaf, ring)
        # Several sites (clustersim.cluster.sites): placement by site, site events.
        network = scenario.site_network
        self.site_network = network
        self.instance_site = (network.site_of_instances(self.n_instances) if network
                              else np.zeros(self.n_instances, dtype=np.int32))
        self.site_first_instance = (network.first_instance if network
                                    else np.array([0, self.n_instances]))
        self.partitioned = np.zeros(network.count if network else 1, dtype=np.int64)
        # Indices of the jobs whose last placement crossed sites (site_cross_s > 0), so that
        # sharing the inter-site links need not scan every job (a year's million).
        self.site_spread: set[int] = set()
        self.site_speeds: tuple | None = None  # (jobs and links, their speeds) of the last share
        # Whether a job of site_spread changed (placed, instances added or removed, done)
        # since the last share of the inter-site links: none, the share would be the same.
        self.site_changed = True
        self.site_seed = streams[3]
        self.site_events: SiteEvents | None = None
        if network is not None:
            self.placer = SitePlacer(self.ipu, self.n_us, self.per_leaf, self.instance_leaf,
                                     ring, self.site_first_instance, self.partitioned)
            if scenario.failures.site_events:
                self.site_events = SiteEvents(self, network, scenario.failures.site_events)
        self.failure_rate = job_failure_rates(scenario)  # a job's interruptions per second
        self.teams = TeamBook(scenario)
        self.scheduler = Scheduler(self, scenario.scheduler.policy, scenario.scheduler.preemption)
        self.uplinks = UplinkBook(self)
        # Stragglers: persistent slow instances.
        st = scenario.stragglers
        self.slow = np.ones(self.n_instances)
        if st.fraction > 0 and st.slowdown > 1:
            chosen = self.rng_stragglers.random(self.n_instances) < st.fraction
            self.slow[chosen] = st.slowdown
        self._any_slow = bool((self.slow != 1.0).any())  # fixed from here on
        self.transient_until = np.zeros(self.n_instances)
        self.taken_at = np.zeros(self.n_instances)  # when each instance was last allocated
        # Bookkeeping.
        self.instance_down_since = np.zeros(self.n_instances)
        self.recovering: set[JobRun] = set()  # jobs that lost instances, until running again
        # Jobs holding instances or granted them (the scheduler's passes look at these, not
        # at every job of a 100,000-job mix); order-free: every use sorts or counts.
        self.active = ActiveJobs()
        self.jobs: list[Any] = []  # JobRun, Retired once done, None before it arrives
        self.faults = FailureSource(self)
        self.holdings = HoldingBook(self, holdings) if holdings else None

    # ------------------------------------------------------------------ the free pool
    def release(self, instances: list[int]) -> None:
        """Instances back to the pool: wake waiting jobs and let the scheduler place more."""
        if len(instances):
            idx = np.asarray(instances, dtype=np.int64)
            # A repaired serving instance goes back to its deployment, not to the pool.
            self.set_owner(idx[self.owner[idx] != SERVING], FREE)
        self.wake_waiting()
        self.scheduler.schedule()

    def wake_waiting(self) -> None:
        """Wake the jobs waiting for hardware (each checks whether it has what it needs).
        With none waiting, nothing: an event nobody waits on would still be queued and
        processed (a sixth of a fleet's events, one each time instances come back)."""
        if not self.hardware_event.callbacks:
            return
        if not self.hardware_event.triggered:
            self.hardware_event.succeed()
        self.hardware_event = self.env.event()

    def set_owner(self, instances: Any, owner: int) -> None:
        """Who holds `instances` (an index, or distinct indices: a list, an array) from now:
        a job's index or one of `owners`; the free pool follows."""
        self.owner[instances] = owner
        if owner == FREE:
            self.free_pool.returned(instances)
        else:
            self.free_pool.taken(instances)

    def set_healthy(self, instances: Any, healthy: bool) -> None:
        """`instances` (an index, or distinct indices) up (True) or down (False) from now;
        the free pool follows."""
        self.healthy[instances] = healthy
        if healthy:
            self.free_pool.returned(instances)
        else:
            self.free_pool.taken(instances)

    def free_mask(self) -> np.ndarray:
        """The free instances (healthy, owned by nobody): a copy, the caller's to change."""
        return self.free_pool.mask.copy()

    def place(self, count: int, whole_ultraservers: bool, free: np.ndarray | None = None,
              held: np.ndarray | None = None) -> np.ndarray | None:
        """`count` free healthy instances for a job (see Placer.place); None when they are not
        there. `held`: what a recovering job still holds (on several sites, its
        replacements come from its own sites first)."""
        free = self.free_mask() if free is None else free
        # Fewer free instances than asked: no placement can be found (whole UltraServers
        # or not, on one site or several), so none of the packing is done. About one call
        # in ten of a fleet month's passes.
        if count > np.count_nonzero(free):
            return None
        if held is not None and isinstance(self.placer, SitePlacer):
            return self.placer.place(count, whole_ultraservers, free, held)
        return self.placer.place(count, whole_ultraservers, free)

    def cut_off(self, run: JobRun) -> bool:
        """A job spanning a site that a network partition has cut off (it cannot train)."""
        return cut_off(self, run) if self.site_events is not None else False

    def slowdown(self, held: np.ndarray) -> float:
        """The slowest of a job's instances (a mask) sets its pace (synchronous training)."""
        if not held.any():
            return 1.0
        idx = held
        # (the slowest of all ones is 1.0: no need to gather them at every event)
        persistent = float(self.slow[idx].max()) if self._any_slow else 1.0
        transient = self.scenario.stragglers.transient
        if transient is not None and np.any(self.transient_until[idx] > self.env.now):
            return max(persistent, transient.slowdown)
        return persistent

    def _transients(self):
        """Transient slowdown episodes, superposed over all instances."""
        spec = self.scenario.stragglers.transient
        assert spec is not None
        total = spec.rate_per_s * self.n_instances
        while True:
            yield self.env.timeout(self.rng_stragglers.exponential(1.0 / total))
            inst = int(self.rng_stragglers.integers(self.n_instances))
            self.transient_until[inst] = max(self.transient_until[inst],
                                             self.env.now + spec.duration_s)
            job = int(self.owner[inst])
            if job >= 0:
                self.jobs[job].pace_changed(self.env.now + spec.duration_s)

    def _arrivals(self, order: list[int]):
        """Each job of `order` (by submission) made and started at its submission: its
        process goes on as if it had waited for it from the start (`JobRun.main`)."""
        env = self.env
        jobs = self.scenario.jobs
        for index in order:
            job = jobs[index]
            if job.submit_s > env.now:
                yield event_at(env, job.submit_s)
            run = self.jobs[index] = JobRun(self, index, job, self.profiles[job.name])
            run.process = env.process(run.main(arrived=True))

    def retire(self, run: JobRun) -> None:
        """A job done, its process ending: only what closing its books at the horizon reads
        is kept (`Retired`), not the JobRun (7 KiB a job, a year's million)."""
        if (self.lazy_jobs and run.state == "done" and not run.held_count
                and run.segment is None
                and run.closed_segment is None and self.jobs[run.index] is run):
            self.jobs[run.index] = Retired(self, run)

    def _progress_ticks(self, horizon: float):
        step = horizon / 100
        while True:
            yield self.env.timeout(step)
            if self.progress is not None:
                self.progress(self.env.now, horizon)

    # ------------------------------------------------------------------ run
    def run(self) -> TimelineResult:
        horizon = self.scenario.duration_s
        jobs = self.scenario.jobs
        # A job submitted later (and without a deadline to watch) is made when it arrives,
        # not at the start (`_arrivals`): a year's million JobRuns and processes were
        # 3.2 KiB a job before the first one arrived.
        self.jobs = [None] * len(jobs)
        if self.holdings is not None:  # serving holds its instances before jobs come
            self.holdings.start()
            self.env.process(self.holdings.run())
        later = [index for index, job in enumerate(jobs)
                 if job.submit_s > 0 and job.deadline_s is None] if self.lazy_jobs else []
        arriving = set(later)
        for index, job in enumerate(jobs):
            if index not in arriving:
                self.jobs[index] = JobRun(self, index, job, self.profiles[job.name])
        for run in self.jobs:
            if run is None:
                continue
            run.process = self.env.process(run.main())
            if run.end_at is not None:
                self.env.process(run.end_watch())
        if later:
            later.sort(key=lambda index: jobs[index].submit_s)  # (stable: ties by index)
            self.env.process(self._arrivals(later))
        self.env.process(self.faults.run())
        if self.site_events is not None:
            self.env.process(self.site_events.run())
        if self.scenario.stragglers.transient is not None:
            self.env.process(self._transients())
        if self.progress is not None:
            self.env.process(self._progress_ticks(horizon))
        with collector_paused():
            self.env.run(until=horizon)
            # (the run's objects, before the collector is back: its first pass would walk
            # every one of them, all still in its youngest generation)
            freeze_heap()
        self.free_pool.check()  # every change went through set_owner and set_healthy
        for index, run in enumerate(self.jobs):  # never arrived: queued from its submission
            if run is None:
                self.jobs[index] = JobRun(self, index, jobs[index],
                                          self.profiles[jobs[index].name])
        allocated = useful = 0.0
        for run in self.jobs:
            run.close(horizon)
            allocated += run.allocated_chip_s
            useful += run.outcome.useful_s * run.outcome.chips
        faults = self.faults
        if self.recorder is not None:
            for inst in np.flatnonzero(~self.healthy).tolist():
                self.faults.record_down(inst, horizon)
        return TimelineResult(
            horizon_s=horizon, jobs={r.outcome.name: r.outcome for r in self.jobs},
            failures=faults.failures, failures_by_cause=faults.failures_by_cause,
            repairs_completed=faults.repairs, allocated_chip_s=allocated, useful_chip_s=useful,
            total_chips=self.n_chips,
            min_free_instances=self.min_free,
            fragmentation_mean=self.scheduler.fragmentation_mean(horizon),
            serving_outages=tuple(self.serving_outages),
            holdings=self.holdings.books() if self.holdings is not None else None,
            # Checkpoints are events only in the per-checkpoint reference.
            event_count=int(sum(faults.failures.values()) + faults.repairs + (sum(
                r.outcome.checkpoints_completed for r in self.jobs)
                if self.checkpoint_events else 0)),
        )
