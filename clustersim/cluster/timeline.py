"""The cluster timeline: jobs running for days to months while hardware fails, is repaired or
replaced from spares, and jobs restart from checkpoints.

Scale by design (DESIGN.md): one simpy process per job and one for all failures, never one
per chip or per step.

- A job advances its steps in bulk between discrete events (failure, repair, checkpoint,
  restart, end). With step-time jitter, a run of k Gamma-distributed steps is one Gamma draw
  of their sum.
- Failures: every exponential process of every component (chip, HBM, NeuronLink, NIC, host,
  leaf switch, software, ...), per chip, instance, UltraServer or leaf, is one superposed
  Poisson stream: one exponential draw for the next failure, then which process and which
  unit. Weibull processes keep a heap of per-unit next-failure times, drawn vectorised.
- Blast radius: a hardware fault takes its instance down (an UltraServer fault the
  UltraServer, a leaf-switch fault every instance under the leaf); a software fault
  interrupts the job on that chip while it trains and downs nothing. A job loses the instances that went
  down; spares swap in; a failed instance is repaired after the repair time and returns to
  the pool. Jobs whose tensor parallelism spans instances over NeuronLink (Trn2 UltraServer
  Z rings) hold whole UltraServers: losing one instance takes the whole UltraServer out of
  the job (its Z rings are broken), and only a whole healthy UltraServer replaces it.
- Recovery: detection delay, waiting for replacement hardware, restart, restore from the last
  completed checkpoint; the work since that checkpoint is lost. Checkpoints are blocking
  (training pauses for the write) or asynchronous (a snapshot is taken and written while
  training goes on; it counts once written). `interval: auto` is Daly's optimum for the
  job's failure rate (asynchronous: back to back, as each write costs no training time).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from clustersim.analysis.trace import JOB_STATES, MemoryRecorder
from clustersim.hardware.failures import FailureRateSpec, failure_preset_rates, weibull_scale
from clustersim.scenario.models import JobSpec, Scenario
from clustersim.training.step import StepModel, StepProfile

__all__ = [
    "JOB_STATES",
    "Timeline",
    "TimelineResult",
    "JobOutcome",
    "young_interval",
    "daly_interval",
    "job_failure_rate",
    "effective_rates",
]

# What each state is called in summaries (the time a job spent in it).
STATE_LABELS = {"down": "detecting", "waiting": "waiting_for_hardware"}


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974): tau = sqrt(2 C M)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006, eq. 37): for delta < 2M, sqrt(2 delta M)[1 + sqrt(delta/2M)/3 +
    (delta/2M)/9] - delta; otherwise M."""
    delta, m = checkpoint_s, mtbf_s
    if delta >= 2 * m:
        return m
    ratio = delta / (2 * m)
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - delta


def effective_rates(scenario: Scenario) -> list[FailureRateSpec]:
    """The preset's rates plus the scenario's, before scaling."""
    return failure_preset_rates(scenario.failures.preset) + list(scenario.failures.rates)


def job_failure_rate(scenario: Scenario, job: JobSpec) -> float:
    """Interruptions per second of a job: every process that can hit its hardware or it."""
    hw = scenario.hardware
    instances = scenario.job_instances(job)
    chips = instances * hw.chips_per_instance
    per_leaf = scenario.cluster.fabric.leaf_size(hw.instances_per_ultraserver)
    units = {
        "chip": chips,
        "instance": instances,
        # Without UltraServers there is nothing for a per-UltraServer rate to hit (as in
        # the timeline, which has no such units then).
        "ultraserver": math.ceil(instances / hw.instances_per_ultraserver) if hw.ultraserver
        else 0,
        "leaf": math.ceil(instances / per_leaf),
        "job": 1,
    }
    scale = scenario.failures.scale
    return sum(r.events_per_s * units[r.per] * scale for r in effective_rates(scenario))


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class JobOutcome:
    """What happened to one job over the horizon."""

    name: str
    instances: int
    chips: int
    step_time_s: float
    tokens_per_step: int
    steps_target: int | None
    submit_s: float
    start_s: float | None = None
    end_s: float | None = None
    progress_steps: float = 0.0
    time_in_state: Counter = field(default_factory=Counter)
    interruptions: Counter = field(default_factory=Counter)
    lost_work_s: float = 0.0
    running_s: float = 0.0
    checkpoints_completed: int = 0
    checkpoint_interval_s: float | None = None
    young_interval_s: float | None = None
    daly_interval_s: float | None = None
    mtbf_s: float | None = None
    status: str = "queued"
    reason: str = ""
    replacements: int = 0
    ultraservers_lost: int = 0
    preemptions: int = 0
    placement_step_time_s: float | None = None
    contention_slowdown: float = 1.0  # worst slowdown of its uplink traffic by other jobs
    ideal_s: float | None = None  # run time alone, without failures or queueing

    @property
    def steps_completed(self) -> int:
        return int(math.floor(self.progress_steps + 1e-9))

    @property
    def useful_s(self) -> float:
        return self.running_s - self.lost_work_s

    def figures(self, horizon_s: float) -> dict[str, Any]:
        """The contract's job figures and where the lost hours went."""
        start = self.start_s if self.start_s is not None else horizon_s
        end = self.end_s if self.end_s is not None else horizon_s
        wall = max(0.0, end - start)
        since_submit = max(0.0, end - self.submit_s)
        states = {STATE_LABELS.get(s, s): self.time_in_state.get(s, 0.0) for s in JOB_STATES
                  if s != "done"}
        lost = {
            "queued": states["queued"],
            "checkpointing": states["checkpointing"],
            "detecting": states["detecting"],
            "waiting_for_hardware": states["waiting_for_hardware"],
            "restarting": states["restarting"],
            "restoring": states["restoring"],
            "lost_work": self.lost_work_s,
        }
        return {
            "status": self.status,
            "reason": self.reason,
            "steps_completed": self.steps_completed,
            "tokens_trained": self.steps_completed * self.tokens_per_step,
            "interruptions": int(sum(self.interruptions.values())),
            "interruptions_by_cause": dict(sorted(self.interruptions.items())),
            "ettr": self.useful_s / wall if wall > 0 else 0.0,
            "goodput": self.useful_s / since_submit if since_submit > 0 else 0.0,
            "useful_s": self.useful_s,
            "lost_work_s": self.lost_work_s,
            "wall_s": wall,
            "time_by_state_s": states,
            "lost_time_s": lost,
            "checkpoints_completed": self.checkpoints_completed,
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "young_interval_s": self.young_interval_s,
            "daly_interval_s": self.daly_interval_s,
            "job_mtbf_s": self.mtbf_s,
            "instances_replaced": self.replacements,
            "ultraservers_lost": self.ultraservers_lost,
            "preemptions": self.preemptions,
            "queue_wait_s": states["queued"],
            "slowdown": ((end - self.submit_s) / (self.steps_completed * self.step_time_s)
                         if self.steps_completed > 0 else None),
            "placement_slowdown": (self.placement_step_time_s / self.step_time_s
                                   if self.placement_step_time_s else None),
            "uplink_contention": self.contention_slowdown,
            "start_s": self.start_s,
            "end_s": self.end_s,
        }


@dataclass
class TimelineResult:
    """Everything a run of the timeline produced."""

    horizon_s: float
    jobs: dict[str, JobOutcome]
    failures: Counter
    failures_by_cause: Counter
    repairs_completed: int
    allocated_chip_s: float
    useful_chip_s: float
    total_chips: int
    min_free_instances: int
    event_count: int
    fragmentation_mean: float = 0.0

    def cluster_figures(self) -> dict[str, Any]:
        chip_time = self.total_chips * self.horizon_s
        statuses = Counter(outcome.status for outcome in self.jobs.values())
        waits = [outcome.time_in_state.get("queued", 0.0) for outcome in self.jobs.values()]
        return {
            "jobs": len(self.jobs),
            "jobs_by_status": dict(sorted(statuses.items())),
            "mean_queue_wait_s": float(np.mean(waits)) if waits else 0.0,
            "fragmentation": self.fragmentation_mean,
            "utilisation": self.allocated_chip_s / chip_time if chip_time else 0.0,
            "useful_utilisation": self.useful_chip_s / chip_time if chip_time else 0.0,
            "failures": dict(sorted(self.failures.items())),
            "failures_by_cause": dict(sorted(self.failures_by_cause.items())),
            "repairs_completed": self.repairs_completed,
            "min_free_instances": self.min_free_instances,
            "discrete_events": self.event_count,
        }


# ---------------------------------------------------------------------------------------------
# The engine


@dataclass(frozen=True)
class _Process:
    """One failure process over a population of units."""

    component: str
    cause: str
    per: str
    rate_per_s: float  # per unit
    shape: float | None  # Weibull shape, None for exponential


class Timeline:
    """One simulation of a scenario's horizon. Use `run()` once."""

    def __init__(self, scenario: Scenario, profiles: dict[str, StepProfile],
                 seed_sequence: np.random.SeedSequence,
                 progress: Callable[[float, float], None] | None = None,
                 recorder: MemoryRecorder | None = None,
                 step_model: StepModel | None = None):
        self.scenario = scenario
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
        # Instance state.
        self.healthy = np.ones(self.n_instances, dtype=bool)
        self.owner = np.full(self.n_instances, -1, dtype=np.int32)
        self.min_free = self.n_instances
        self.hardware_event = self.env.event()
        self.instance_leaf = np.arange(self.n_instances) // self.per_leaf
        self.scheduler = Scheduler(self, scenario.scheduler.policy, scenario.scheduler.preemption)
        # Stragglers: persistent slow instances.
        st = scenario.stragglers
        self.slow = np.ones(self.n_instances)
        if st.fraction > 0 and st.slowdown > 1:
            chosen = self.rng_stragglers.random(self.n_instances) < st.fraction
            self.slow[chosen] = st.slowdown
        self.transient_until = np.zeros(self.n_instances)
        self.taken_at = np.zeros(self.n_instances)  # when each instance was last allocated
        # Bookkeeping.
        self.failures: Counter = Counter()
        self.failures_by_cause: Counter = Counter()
        self.repairs = 0
        self.instance_down_since = np.zeros(self.n_instances)
        self.recovering: set[_JobRun] = set()  # jobs that lost instances, until running again
        self.jobs: list[_JobRun] = []
        self._build_processes()

    # ------------------------------------------------------------------ failure processes
    def _build_processes(self) -> None:
        scale = self.scenario.failures.scale
        self.exp_processes: list[_Process] = []
        self.exp_weights: list[float] = []
        self.weibull_heap: list[tuple[float, int, int]] = []
        self.weibull_processes: list[_Process] = []
        for spec in effective_rates(self.scenario):
            rate = spec.events_per_s * scale
            if rate <= 0:
                continue
            proc = _Process(spec.component, spec.cause or spec.component, spec.per, rate,
                            spec.shape if spec.distribution == "weibull" else None)
            count = self._population(spec.per)
            if count == 0:
                continue
            if proc.shape is None:
                self.exp_processes.append(proc)
                self.exp_weights.append(rate * count)
            else:
                index = len(self.weibull_processes)
                self.weibull_processes.append(proc)
                scale_s = weibull_scale(1.0 / rate, proc.shape)
                times = scale_s * self.rng_failures.weibull(proc.shape, count)
                self.weibull_heap.extend(zip(times.tolist(), [index] * count, range(count),
                                             strict=True))
        heapq.heapify(self.weibull_heap)
        self.exp_total = float(sum(self.exp_weights))
        self.exp_cumulative = np.cumsum(self.exp_weights) / self.exp_total if self.exp_total else (
            np.array([]))

    def _failure_source(self):
        env = self.env
        next_exp = env.now + (self.rng_failures.exponential(1.0 / self.exp_total)
                              if self.exp_total > 0 else math.inf)
        while True:
            next_weibull = self.weibull_heap[0][0] if self.weibull_heap else math.inf
            when = min(next_exp, next_weibull)
            if not math.isfinite(when):
                return
            yield env.timeout(max(0.0, when - env.now))
            if next_exp <= next_weibull:
                index = int(np.searchsorted(self.exp_cumulative, self.rng_failures.random(),
                                            side="right"))
                proc = self.exp_processes[min(index, len(self.exp_processes) - 1)]
                unit = int(self.rng_failures.integers(self._population(proc.per)))
                next_exp = env.now + self.rng_failures.exponential(1.0 / self.exp_total)
            else:
                _, index, unit = heapq.heappop(self.weibull_heap)
                proc = self.weibull_processes[index]
                # Renewal: the unit's next failure is drawn from its return to service.
                back = env.now + (self.repair_s if proc.component != "software" else 0.0)
                if math.isfinite(back):
                    gap = weibull_scale(1.0 / proc.rate_per_s, proc.shape) * (
                        self.rng_failures.weibull(proc.shape))
                    heapq.heappush(self.weibull_heap, (back + gap, index, unit))
            self._fail(proc, unit)

    def _population(self, per: str) -> int:
        return {"chip": self.n_chips, "instance": self.n_instances, "ultraserver": self.n_us,
                "leaf": self.n_leaves, "job": len(self.scenario.jobs)}[per]

    def _instances_of(self, per: str, unit: int) -> range:
        if per == "chip":
            first = unit // self.cpi
            return range(first, first + 1)
        if per == "instance":
            return range(unit, unit + 1)
        if per == "ultraserver":
            return range(unit * self.ipu, min(self.n_instances, (unit + 1) * self.ipu))
        return range(unit * self.per_leaf, min(self.n_instances, (unit + 1) * self.per_leaf))

    def _fail(self, proc: _Process, unit: int) -> None:
        """Apply one failure: down the hardware it hits and interrupt the jobs on it."""
        now = self.env.now
        if proc.per == "job":  # a job-level fault (software): no hardware goes down
            run = self.jobs[unit]
            if run.state in ("running", "checkpointing"):  # software fails while it trains
                first = int(np.argmax(run.held_mask))
                self._count(proc, first * self.cpi, first, unit)
                run.interrupt(proc.component, [])
            return
        instances = self._instances_of(proc.per, unit)
        chip = unit if proc.per == "chip" else instances[0] * self.cpi
        if proc.component == "software":
            job = int(self.owner[instances[0]])
            if job >= 0 and self.jobs[job].state in ("running", "checkpointing"):
                self._count(proc, chip, instances[0], job)
                self.jobs[job].interrupt(proc.component, [])
            return
        hit_jobs: dict[int, list[int]] = {}
        downed = free_downed = False
        for inst in instances:
            if not self.healthy[inst]:
                continue  # already down: this failure changes nothing
            downed = True
            self.healthy[inst] = False
            self.instance_down_since[inst] = now
            job = int(self.owner[inst])
            if job >= 0:
                hit_jobs.setdefault(job, []).append(inst)
            else:
                free_downed = True
            if math.isfinite(self.repair_s):
                self.env.process(self._repair(inst))
        if not downed:
            return
        self._count(proc, chip, instances[0], next(iter(hit_jobs), -1))
        if free_downed:  # the free pool shrank with no job to tell: record it now
            self.scheduler._record()
        for job, lost in hit_jobs.items():
            self.jobs[job].interrupt(proc.component, lost)

    def _count(self, proc: _Process, chip: int, instance: int, job: int) -> None:
        self.failures[proc.component] += 1
        self.failures_by_cause[proc.cause] += 1
        if self.recorder is not None:
            self.recorder.event(self.env.now, "failure", proc.component, chip, instance, job)

    def _repair(self, inst: int):
        yield self.env.timeout(self.repair_s)
        self.healthy[inst] = True
        self.repairs += 1
        if self.recorder is not None:
            self._record_down(inst, self.env.now)
            self.recorder.event(self.env.now, "repair", "", inst * self.cpi, inst, -1)
        self._release([inst])

    def _record_down(self, inst: int, end_s: float) -> None:
        """Chip intervals of a downed instance: `failed` until the failure is detected, then
        `repairing` until it is back (or the horizon). The instance is the unit of repair, so
        all its chips share the two intervals. Without repairs it stays `failed`."""
        assert self.recorder is not None
        start = float(self.instance_down_since[inst])
        detected = min(start + self.scenario.failures.detect_s, end_s)
        if not math.isfinite(self.repair_s):
            detected = end_s
        first = inst * self.cpi
        for chip in range(first, first + self.cpi):
            if detected > start:
                self.recorder.interval("chip", chip, "failed", start, detected)
            if end_s > detected:
                self.recorder.interval("chip", chip, "repairing", detected, end_s)

    # ------------------------------------------------------------------ the free pool
    def _release(self, instances: list[int]) -> None:
        """Instances back to the pool: wake waiting jobs and let the scheduler place more."""
        if len(instances):
            self.owner[np.asarray(instances, dtype=np.int64)] = -1
        self.wake_waiting()
        self.scheduler.schedule()

    def wake_waiting(self) -> None:
        """Wake the jobs waiting for hardware (each checks whether it has what it needs)."""
        if not self.hardware_event.triggered:
            self.hardware_event.succeed()
        self.hardware_event = self.env.event()

    def free_mask(self) -> np.ndarray:
        return self.healthy & (self.owner < 0)

    def place(self, count: int, whole_ultraservers: bool, free: np.ndarray | None = None
              ) -> np.ndarray | None:
        """Choose `count` free healthy instances, topology-aware: under as few leaf switches
        as possible (the leaf that fits it most tightly, else the emptiest leaves first),
        whole UltraServers when the job needs them; None when they are not there."""
        free = self.free_mask() if free is None else free
        if (not whole_ultraservers and self.n_us and count % self.ipu == 0
                and self.scenario.hardware.ultraserver.interconnect.topology == "ring"):
            # A job the size of whole UltraServers takes whole ones when it can: its groups
            # then sit evenly on the Z rings.
            aligned = self.place(count, True, free)
            if aligned is not None:
                return aligned
        if whole_ultraservers:
            ipu = self.ipu
            units = free[: self.n_us * ipu].reshape(self.n_us, ipu).all(axis=1)
            need = math.ceil(count / ipu)
            chosen_units = _pack(np.flatnonzero(units), (np.arange(self.n_us) * ipu
                                                         // self.per_leaf), need)
            if chosen_units is None:
                return None
            return (chosen_units[:, None] * ipu + np.arange(ipu)[None, :]).ravel()[:count]
        return _pack(np.flatnonzero(free), self.instance_leaf, count)

    def slowdown(self, held: np.ndarray) -> float:
        """The slowest of a job's instances (a mask) sets its pace (synchronous training)."""
        if not held.any():
            return 1.0
        idx = held
        persistent = float(self.slow[idx].max())
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

    def _progress_ticks(self, horizon: float):
        step = horizon / 100
        while True:
            yield self.env.timeout(step)
            if self.progress is not None:
                self.progress(self.env.now, horizon)

    # ------------------------------------------------------------------ run
    def run(self) -> TimelineResult:
        horizon = self.scenario.duration_s
        for index, job in enumerate(self.scenario.jobs):
            run = _JobRun(self, index, job, self.profiles[job.name])
            self.jobs.append(run)
        for run in self.jobs:
            run.process = self.env.process(run.main())
            if run.end_at is not None:
                self.env.process(run.end_watch())
        self.env.process(self._failure_source())
        if self.scenario.stragglers.transient is not None:
            self.env.process(self._transients())
        if self.progress is not None:
            self.env.process(self._progress_ticks(horizon))
        self.env.run(until=horizon)
        allocated = useful = 0.0
        for run in self.jobs:
            run.close(horizon)
            allocated += run.allocated_chip_s
            useful += run.outcome.useful_s * run.outcome.chips
        if self.recorder is not None:
            for inst in np.flatnonzero(~self.healthy).tolist():
                self._record_down(inst, horizon)
        return TimelineResult(
            horizon_s=horizon, jobs={r.outcome.name: r.outcome for r in self.jobs},
            failures=self.failures, failures_by_cause=self.failures_by_cause,
            repairs_completed=self.repairs, allocated_chip_s=allocated, useful_chip_s=useful,
            total_chips=self.n_chips,
            min_free_instances=self.min_free,
            fragmentation_mean=self.scheduler.fragmentation_mean(horizon),
            event_count=int(sum(self.failures.values()) + self.repairs + sum(
                r.outcome.checkpoints_completed for r in self.jobs)),
        )


def _pack(free_ids: np.ndarray, leaf_of: np.ndarray, count: int) -> np.ndarray | None:
    """`count` of the free ids under as few leaves as possible: the leaf that holds them most
    tightly, else the emptiest leaves first (ids ascending within a leaf)."""
    if len(free_ids) < count:
        return None
    if count <= 0:
        return np.empty(0, dtype=np.int64)
    leaves = leaf_of[free_ids]
    _, starts, counts = np.unique(leaves, return_index=True, return_counts=True)
    fits = np.flatnonzero(counts >= count)
    if len(fits):
        best = fits[np.argmin(counts[fits])]
        return free_ids[starts[best]: starts[best] + count]
    chosen, got = [], 0
    for i in np.argsort(-counts, kind="stable").tolist():
        take = min(int(counts[i]), count - got)
        chosen.append(free_ids[starts[i]: starts[i] + take])
        got += take
        if got == count:
            break
    return np.sort(np.concatenate(chosen))


class Scheduler:
    """Starts queued jobs: FIFO, priority, or EASY backfill; optional preemption.

    FIFO and priority start jobs strictly in order (the first that does not fit blocks the
    rest). Backfill (EASY) gives the first waiting job a reservation (the earliest time enough
    instances are expected free, from running jobs' expected ends) and lets later jobs start
    now if they end before it or use only instances it will not need. With preemption, a job
    that does not fit evicts lower-priority running jobs (lowest priority, latest started
    first), which go back to the queue and lose the work since their last checkpoint.

    Jobs that lost instances to a failure come first: freed instances are reserved for them
    from the failure and granted when it is detected. One still waiting for hardware blocks
    the queue like a head job (FIFO; backfill around its reservation), or under priority
    only the queued jobs that do not outrank it.
    """

    def __init__(self, timeline: Timeline, policy: str, preemption: bool):
        self.t = timeline
        self.policy = policy
        self.preemption = preemption
        self.queue: list[_JobRun] = []
        self._busy = False
        self._again = False
        self.fragmentation_s = 0.0  # time integral of fragmentation
        self._last = (0.0, 0.0)

    def submit(self, run: _JobRun) -> None:
        self.queue.append(run)
        self.schedule()

    def withdraw(self, run: _JobRun) -> None:
        if run in self.queue:
            self.queue.remove(run)

    def _key(self, run: _JobRun) -> tuple:
        if self.policy == "fifo":
            return (run.queued_at, run.index)
        return (-run.job.priority, run.queued_at, run.index)

    def schedule(self) -> None:
        if self._busy:  # a start or an eviction changed the pool: pass again afterwards
            self._again = True
            return
        self._busy = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._pass()
        finally:
            self._busy = False
        self.share_uplinks()
        self._record()

    @staticmethod
    def _recovering_key(run: _JobRun) -> tuple:
        """Recovering jobs go before every queued job, the highest priority first."""
        return (-math.inf, -run.job.priority, run.index)

    def _pass(self) -> None:
        # A job that lost instances has first claim on the instances freed, before every
        # queued job (it holds the rest of its allocation idle meanwhile): they are reserved
        # for it from the failure and granted once the failure is detected.
        recovering = [(self._recovering_key(r), False, r) for r in self.t.recovering
                      if r.held_count < r.instances_needed]
        order = sorted([(self._key(r), True, r) for r in self.queue] + recovering,
                       key=lambda entry: entry[0])
        free = self.t.free_mask()
        floor = -math.inf  # priority policy: queued jobs at or below it wait for a recovery
        blocked: tuple[_JobRun, int] | None = None  # the first recovery that did not fit
        for position, (_, queued, run) in enumerate(order):
            if queued and blocked is not None and self.policy != "priority":
                # Every recovery had its turn; a blocked one is the queue's head.
                if self.policy == "backfill":
                    self._backfill(blocked[0], blocked[1],
                                   [r for _, q, r in order[position:] if q], free)
                return
            if queued and run.job.priority <= floor:
                return
            need = run.instances_needed - (0 if queued else run.held_count)
            chosen = self.t.place(need, run.whole_ultraservers, free)
            if chosen is None and self.preemption and (queued or run.state == "waiting"):
                chosen = self._preempt_for(run, free, need)
            if chosen is not None:
                if queued:
                    self._start(run, chosen)
                elif run.state == "waiting":
                    self._replace(run, chosen)
                free[chosen] = False  # granted, or reserved until its failure is detected
                continue
            if not queued:
                # A recovery blocked on hardware does not hold back the recoveries after it;
                # under priority it holds back only the queued jobs it is not outranked by.
                if blocked is None:
                    blocked = (run, need)
                floor = max(floor, run.job.priority)
                continue
            if self.policy == "backfill":
                self._backfill(run, need, [r for _, q, r in order[position + 1:] if q],
                               free)
            return

    def _start(self, run: _JobRun, chosen: np.ndarray) -> None:
        self.queue.remove(run)
        self.t.owner[chosen] = run.index
        run.grant(chosen)

    def _replace(self, run: _JobRun, chosen: np.ndarray) -> None:
        """Replacement instances for a recovering job, held from now; its process wakes."""
        self.t.owner[chosen] = run.index
        run.outcome.replacements += len(chosen)
        run.add(chosen)
        run._placed()
        self.t.wake_waiting()

    def _backfill(self, head: _JobRun, need: int, rest: list[_JobRun], free: np.ndarray
                  ) -> None:
        now = self.t.env.now
        available = int(np.count_nonzero(free))
        # Instances per job from the owner array: a job just granted holds them already,
        # even before its process has taken them up.
        owners = self.t.owner[self.t.owner >= 0]
        held = np.bincount(owners, minlength=len(self.t.jobs)) if len(owners) else np.zeros(
            len(self.t.jobs), dtype=np.int64)
        ends = [(self.t.jobs[j].expected_end(), int(held[j]))
                for j in np.flatnonzero(held).tolist() if j != head.index]
        # Instances in repair come back at known times too.
        down = np.flatnonzero(~self.t.healthy)
        if len(down) and math.isfinite(self.t.repair_s):
            back = self.t.instance_down_since[down] + self.t.repair_s
            ends += [(float(t), 1) for t in back[self.t.owner[down] < 0].tolist()]
        ends.sort()
        shadow, extra = math.inf, available
        for end, count in ends:
            available += count
            if available >= need:
                shadow, extra = end, available - need
                break
        for run in rest:
            chosen = self.t.place(run.instances_needed, run.whole_ultraservers, free)
            if chosen is None:
                continue
            ends_before = now + run.expected_duration() <= shadow
            if ends_before or run.instances_needed <= extra:
                if not ends_before:
                    extra -= run.instances_needed
                self._start(run, chosen)
                free[chosen] = False

    def _preempt_for(self, run: _JobRun, free: np.ndarray, need: int) -> np.ndarray | None:
        # A job whose own process runs this pass (releasing instances as it recovers) cannot
        # be interrupted from inside itself: it is not a victim this time.
        active = self.t.env.active_process
        victims = sorted((r for r in self.t.jobs if r.held_count and r.state != "done"
                          and r.job.priority < run.job.priority
                          and (active is None or r.process is not active)),
                         key=lambda r: (r.job.priority, -(r.outcome.start_s or 0.0)))
        trial = free.copy()
        chosen_victims = []
        for victim in victims:
            trial[victim.held] = True
            chosen_victims.append(victim)
            placement = self.t.place(need, run.whole_ultraservers, trial)
            if placement is not None:
                for v in chosen_victims:
                    v.evict()
                free |= trial
                return placement
        return None

    def fragmentation_mean(self, horizon: float) -> float:
        last_time, last_value = self._last
        total = self.fragmentation_s + (horizon - last_time) * last_value
        return total / horizon if horizon > 0 else 0.0

    def share_uplinks(self) -> None:
        """Jobs spread over several leaves send their data-parallel traffic through the leaf
        uplinks. Each such job puts its instances' EFA bandwidth on every leaf it spans; where
        that demand exceeds a leaf's uplink capacity (its instances' EFA over the
        oversubscription) the crossing traffic is slowed by demand / capacity. A job's own
        demand is already in its step profile (its collectives were costed on the uplinks),
        so what sharing adds is the slowdown with everyone over the slowdown alone, at its
        worst leaf. On a non-blocking fabric demand never exceeds capacity."""
        t = self.t
        fabric = t.scenario.cluster.fabric
        if t.n_leaves <= 1 or fabric.oversubscription <= 1.0:
            return  # a leaf's uplinks carry all its instances' EFA: never oversubscribed
        efa = t.scenario.hardware.instance.efa_bytes_per_s
        capacity = t.per_leaf * efa / fabric.oversubscription
        spread = [r for r in t.jobs if r.held_count and r.state != "done" and r.spans_leaves]
        demand: Counter = Counter()
        per_job = {}
        for run in spread:
            leaves, counts = np.unique(t.instance_leaf[run.held], return_counts=True)
            per_job[run.index] = dict(zip(leaves.tolist(), counts.tolist(), strict=True))
            for leaf, count in per_job[run.index].items():
                demand[leaf] += count * efa
        for run in spread:
            worst = 1.0
            for leaf, count in per_job[run.index].items():
                together = max(1.0, demand[leaf] / capacity)
                alone = max(1.0, count * efa / capacity)
                worst = max(worst, together / alone)
            run.set_uplink_slowdown(worst)

    def _record(self) -> None:
        """Fragmentation: the share of free instances not in a wholly free leaf."""
        now = self.t.env.now
        free = self.t.free_mask()
        count = int(np.count_nonzero(free))
        whole = 0
        if count:
            per_leaf = np.bincount(self.t.instance_leaf[free], minlength=self.t.n_leaves)
            size = np.bincount(self.t.instance_leaf, minlength=self.t.n_leaves)
            whole = int(per_leaf[per_leaf == size].sum())
        fragmentation = 1.0 - whole / count if count else 0.0
        last_time, last_value = self._last
        self.fragmentation_s += (now - last_time) * last_value
        self._last = (now, fragmentation)
        self.t.min_free = min(self.t.min_free, count)
        # Jobs holding instances, counting one granted them in this pass before its process
        # has taken them up (O(jobs): this runs at every failure of a 500k-chip job).
        running = sum(1 for r in self.t.jobs if r.state != "done" and (
            r.held_count or (r.state == "queued" and r.granted is not None
                             and r.granted.triggered)))
        if self.t.recorder is not None:
            self.t.recorder.cluster_state(now, count, len(self.queue), running, fragmentation)


class _Preempted(Exception):
    """The scheduler evicted the job for a higher-priority one."""


class _Ended(Exception):
    """The job's deadline or run time came."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class _JobRun:
    """One job's process: queued, running in bulk, checkpointing, recovering."""

    def __init__(self, timeline: Timeline, index: int, job: JobSpec, profile: StepProfile):
        self.t = timeline
        self.index = index
        self.job = job
        self.profile = profile
        scenario = timeline.scenario
        hw = scenario.hardware
        self.instances_needed = scenario.job_instances(job)
        self.whole_ultraservers = (hw.ultraserver is not None
                                   and hw.ultraserver.interconnect.topology == "ring"
                                   and job.parallelism.tp > hw.ranks_per_instance)
        self.outcome = JobOutcome(
            name=job.name, instances=self.instances_needed,
            chips=self.instances_needed * hw.chips_per_instance,
            step_time_s=profile.step_time_s, tokens_per_step=profile.tokens_per_step,
            steps_target=job.steps, submit_s=job.submit_s,
        )
        rate = job_failure_rate(scenario, job)
        self.outcome.mtbf_s = 1.0 / rate if rate > 0 else None
        ideal = [t for t in ((job.steps * profile.step_time_s) if job.steps else None,
                             job.run_for_s) if t is not None]
        self.outcome.ideal_s = min(ideal) if ideal else None
        ck = job.checkpoint
        self.checkpoint = ck
        if ck is not None:
            mtbf = self.outcome.mtbf_s or math.inf
            if math.isfinite(mtbf):
                self.outcome.young_interval_s = young_interval(ck.write_s, mtbf)
                self.outcome.daly_interval_s = daly_interval(ck.write_s, mtbf)
            if ck.interval_s == "auto":
                if ck.async_write:
                    interval = max(ck.write_s, 1e-9)  # back to back: a write costs no training
                else:
                    interval = self.outcome.daly_interval_s or math.inf
            else:
                interval = float(ck.interval_s)
            self.outcome.checkpoint_interval_s = interval if math.isfinite(interval) else None
            self.interval = interval
        else:
            self.interval = math.inf
        # Instances held: a mask over the cluster, changed incrementally (no O(n) per change).
        self.held_mask = np.zeros(timeline.n_instances, dtype=bool)
        self.held_count = 0
        self.pace = 1.0  # step-time multiplier of the held instances (stragglers)
        self.state = "queued"
        self.state_since = job.submit_s
        self.allocated_chip_s = 0.0
        self.held_since = 0.0
        self.pending: list[tuple[str, list[int]]] = []
        self.process: simpy.Process | None = None
        # Progress: steps done (float), and running wall time.
        self.progress = 0.0
        self.saved = (0.0, 0.0)  # (progress, running time) of the last completed checkpoint
        self.async_pending: list[tuple[float, float, float]] = []  # (done at, progress, running)
        self.since_snapshot = 0.0  # running time since the last checkpoint snapshot
        self.pace_until = 0.0
        self.segment: tuple[float, float, float] | None = None
        self.interrupt_pending = False
        self.step_time = profile.step_time_s  # for the current placement
        self.placed_step_time = profile.step_time_s
        self.fabric_exposed_s = 0.0
        self.spans_leaves = False
        self.uplink_slowdown = 1.0
        self.queued_at = job.submit_s
        self.granted: simpy.Event | None = None
        self.end_at = job.submit_s + job.deadline_s if job.deadline_s is not None else None

    # ------------------------------------------------------------------ state accounting
    def set_state(self, state: str) -> None:
        now = self.t.env.now
        if state == self.state:
            return
        self.outcome.time_in_state[self.state] += now - self.state_since
        if self.t.recorder is not None and now > self.state_since:
            self.t.recorder.interval("job", self.index, self.state, self.state_since, now)
        self.state, self.state_since = state, now
        if state in ("down", "waiting"):
            self.t.recovering.add(self)
        else:
            self.t.recovering.discard(self)

    def close(self, horizon: float) -> None:
        """Close the books at the horizon: credit a running segment, count the last state."""
        self._credit_segment(horizon)
        self.outcome.time_in_state[self.state] += horizon - self.state_since
        if self.t.recorder is not None and horizon > self.state_since:
            self.t.recorder.interval("job", self.index, self.state, self.state_since, horizon)
        self.state_since = horizon
        if self.held_count:
            self.allocated_chip_s += (horizon - self.held_since) * self.held_count * self.t.cpi
            self.held_since = horizon
            if self.t.recorder is not None:
                for inst in self.held.tolist():
                    self.t.recorder.allocation(self.index, inst, float(self.t.taken_at[inst]),
                                               horizon)
        out = self.outcome
        out.progress_steps = self.progress
        if self.state != "done":
            out.status = "running at horizon" if self.state == "running" else (
                f"{STATE_LABELS.get(self.state, self.state)} at horizon")
            out.reason = self._why_not_done()

    def _why_not_done(self) -> str:
        out = self.outcome
        if self.state == "queued":
            return "never started: not enough healthy instances"
        if self.state == "waiting":
            if not math.isfinite(self.t.repair_s):
                return "waiting for hardware: no spare left and repairs are disabled"
            return "waiting for hardware: no spare instances until repairs finish"
        f = self.t.scenario.failures
        recovery = f.detect_s + f.restart_s + (self.checkpoint.restore_s if self.checkpoint else 0)
        if out.mtbf_s is not None and out.mtbf_s < recovery:
            return (f"little progress: the job's mean time between failures ({out.mtbf_s:,.0f} s)"
                    f" is shorter than its recovery ({recovery:,.0f} s)")
        if out.steps_target is None:
            return "no step target: ran to the horizon"
        return "the horizon came before the step target"

    def interrupt(self, component: str, lost: list[int]) -> None:
        if self.state in ("queued", "done") or self.process is None or not self.held_count:
            return
        self.pending.append((component, lost))
        if self.process.is_alive and not self.interrupt_pending:
            self.interrupt_pending = True
            self.process.interrupt("failure")

    def pace_changed(self, until: float) -> None:
        self.pace_until = max(self.pace_until, until)
        if (self.state == "running" and self.process is not None and self.process.is_alive
                and not self.interrupt_pending):
            self.interrupt_pending = True
            self.process.interrupt("pace")

    # ------------------------------------------------------------------ the process
    def main(self):
        env = self.t.env
        if self.job.submit_s > 0:
            yield env.timeout(self.job.submit_s)
        self.state_since = env.now
        first = True
        while True:
            try:
                chosen = yield from self._queue()
            except simpy.Interrupt as signal:  # only the end can come while queued
                self.interrupt_pending = False
                self._finish(*self._ending(signal.cause))
                return
            self.add(chosen)
            self._placed()
            try:
                if first:
                    first = False
                    self.outcome.start_s = env.now
                    if self.job.run_for_s is not None:
                        env.process(self._watch(env.now + self.job.run_for_s, "run_for"))
                else:  # back after a preemption: restart and restore first
                    yield from self._guard(self._resume())
                self.set_state("running")
                yield from self._guard(self._training())
                self._finish("done", "reached its step target")
                return
            except _Preempted:
                continue
            except _Ended as ended:
                self._finish(*self._ending(("end", ended.why)))
                return

    def _queue(self):
        """Wait in the scheduler's queue until granted instances."""
        self.set_state("queued")
        self.queued_at = self.t.env.now
        self.granted = self.t.env.event()
        self.t.scheduler.submit(self)
        chosen = yield self.granted
        return chosen

    def grant(self, chosen: np.ndarray) -> None:
        assert self.granted is not None
        self.granted.succeed(chosen)

    def _guard(self, body):
        """Run a phase; turn preemption and the end into exceptions, recover from failures
        (and re-plan on pace changes) inside it."""
        while True:
            try:
                result = yield from body
                return result
            except simpy.Interrupt as signal:
                self.interrupt_pending = False
                cause = signal.cause
                if cause == "preempt":
                    raise _Preempted() from None
                if isinstance(cause, tuple) and cause[0] == "end":
                    raise _Ended(cause[1]) from None
                if cause == "pace":
                    body = self._training()
                    continue
                yield from self._recover()
                body = self._training()

    def _training(self):
        while True:
            finished = yield from self._train()
            if finished:
                return True

    def _resume(self):
        env = self.t.env
        self.set_state("restarting")
        yield env.timeout(self.t.scenario.failures.restart_s)
        self.set_state("restoring")
        yield env.timeout(self.checkpoint.restore_s if self.checkpoint else 0.0)

    def _placed(self) -> None:
        """The step time of the current placement (a job spread wider pays on the fabric)."""
        model = self.t.step_model
        if model is None or self.held_count != self.instances_needed:
            return
        profile = model.profile(self.job, self.job.name, instances=self.held)
        self.placed_step_time = profile.step_time_s
        leaves = np.unique(self.t.instance_leaf[self.held])
        self.spans_leaves = len(leaves) > 1
        # What crosses leaf uplinks: the exposed data-, pipeline- and expert-parallel
        # communication of a job spread over several leaves (tensor parallelism stays inside
        # instances).
        exposed = profile.exposed_comm_s
        self.fabric_exposed_s = (exposed.get("dp", 0.0) + exposed.get("pp", 0.0)
                                 + exposed.get("ep", 0.0)) if len(leaves) > 1 else 0.0
        self.step_time = self.placed_step_time * self.fabric_factor_step()
        if self.outcome.placement_step_time_s is None:
            self.outcome.placement_step_time_s = profile.step_time_s
        self.t.scheduler.share_uplinks()  # its traffic now loads the leaves it spans

    def fabric_factor_step(self) -> float:
        """Step time multiplier from sharing leaf uplinks with other jobs (1 when alone)."""
        if self.fabric_exposed_s <= 0 or self.placed_step_time <= 0:
            return 1.0
        extra = self.fabric_exposed_s * (self.uplink_slowdown - 1.0)
        return (self.placed_step_time + extra) / self.placed_step_time

    def set_uplink_slowdown(self, slowdown: float) -> None:
        """The scheduler's verdict on this job's share of its leaves' uplinks."""
        if abs(slowdown - self.uplink_slowdown) < 1e-9:
            return
        self.uplink_slowdown = slowdown
        self.outcome.contention_slowdown = max(self.outcome.contention_slowdown, slowdown)
        if self.placed_step_time > 0:
            self.step_time = self.placed_step_time * self.fabric_factor_step()
            self.pace_changed(self.t.env.now)  # re-plan the running segment at the new pace

    def _watch(self, at: float, why: str):
        yield self.t.env.timeout(max(0.0, at - self.t.env.now))
        if self.state == "done" or self.process is None or not self.process.is_alive:
            return
        self.interrupt_pending = True
        self.process.interrupt(("end", why))

    def end_watch(self):
        assert self.end_at is not None
        yield from self._watch(self.end_at, "deadline")

    def _ending(self, cause: Any) -> tuple[str, str]:
        why = cause[1] if isinstance(cause, tuple) else str(cause)
        if why == "run_for":
            return "done", "ran for its run_for"
        return "stopped at deadline", "its deadline came"

    def evict(self) -> None:
        """Preempted by the scheduler: give every instance back now; the process then loses
        the work since the last checkpoint and queues again."""
        if self.state in ("running", "checkpointing"):
            self._credit_segment(self.t.env.now)
            self._lose_work()
        self.outcome.preemptions += 1
        held = self.held
        self.remove(held)
        self.t.owner[held] = -1
        if self.process is not None and self.process.is_alive:
            self.interrupt_pending = True
            self.process.interrupt("preempt")

    def expected_duration(self) -> float:
        """Run time alone, for backfill: the step target or run_for (infinite without)."""
        candidates = []
        if self.job.steps is not None:
            candidates.append((self.job.steps - self.progress) * self.step_time)
        if self.job.run_for_s is not None:
            candidates.append(self.job.run_for_s)
        return min(candidates) if candidates else math.inf

    def expected_end(self) -> float:
        now = self.t.env.now
        end = now + self.expected_duration()
        if self.job.run_for_s is not None:
            started = self.outcome.start_s if self.outcome.start_s is not None else now
            end = min(end, started + self.job.run_for_s)
        if self.end_at is not None:
            end = min(end, self.end_at)
        return end

    @property
    def held(self) -> np.ndarray:
        return np.flatnonzero(self.held_mask)

    def _account(self) -> None:
        now = self.t.env.now
        self.allocated_chip_s += (now - self.held_since) * self.held_count * self.t.cpi
        self.held_since = now

    def add(self, instances: Any) -> None:
        """Start holding these instances."""
        added = np.asarray(instances, dtype=np.int64)
        self._account()
        self.held_mask[added] = True
        self.held_count += len(added)
        self.t.taken_at[added] = self.t.env.now
        self.pace = self._pace()

    def remove(self, instances: Any) -> None:
        """Stop holding these instances (an allocation row each)."""
        removed = np.asarray(instances, dtype=np.int64)
        self._account()
        if self.t.recorder is not None:
            for inst in removed.tolist():
                self.t.recorder.allocation(self.index, inst, float(self.t.taken_at[inst]),
                                           self.t.env.now)
        self.held_mask[removed] = False
        self.held_count -= len(removed)
        self.pace = self._pace()

    def _pace(self) -> float:
        if self.held_count == 0:
            return 1.0
        return self.t.slowdown(self.held_mask)

    def _finish(self, status: str, reason: str) -> None:
        self.t.scheduler.withdraw(self)
        self._credit_segment(self.t.env.now)  # ended mid-segment: credit what was done
        self.set_state("done")
        self.outcome.progress_steps = self.progress
        self.outcome.status = status
        self.outcome.end_s = self.t.env.now
        self.outcome.reason = reason
        held = self.held.tolist()
        if held:
            self.remove(held)
            self.t._release(held)

    def _collect_async(self, now: float) -> None:
        """Asynchronous checkpoints whose write has finished become the restore point."""
        while self.async_pending and self.async_pending[0][0] <= now:
            _, progress, running = self.async_pending.pop(0)
            self.saved = (progress, running)
            self.outcome.checkpoints_completed += 1

    def _train(self):
        """Run until the next checkpoint, the step target or a pace change. Returns True when
        the step target is reached."""
        env = self.t.env
        out = self.outcome
        if self.t.scenario.stragglers.transient is not None:
            self.pace = self._pace()  # episodes come and go
        speed_factor = self.pace
        step_s = self.step_time * speed_factor
        remaining = math.inf if out.steps_target is None else out.steps_target - self.progress
        if remaining <= 1e-9:
            return True
        to_checkpoint = self.interval - self.since_snapshot
        duration = min(remaining * step_s, to_checkpoint)
        if self.pace_until > env.now:  # a transient episode ends: re-plan then
            duration = min(duration, self.pace_until - env.now)
        # Never plan past the horizon (no checkpoints and no target would plan forever).
        duration = max(min(duration, self.t.scenario.duration_s - env.now), 0.0)
        steps_planned = duration / step_s
        jitter = self.t.scenario.stragglers.jitter
        wall = duration
        if jitter > 0 and steps_planned > 0:
            # Gamma steps: the sum of k of them is Gamma(k / cv^2, mean x cv^2).
            wall = float(self.t.rng_jobs.gamma(steps_planned / jitter**2, step_s * jitter**2))
        self.segment = (env.now, wall, steps_planned)
        try:
            yield env.timeout(wall)
        except simpy.Interrupt:
            self._credit_segment(env.now)  # unless evict() has credited it already
            raise
        self.segment = None
        self._advance(steps_planned, wall, env.now)
        if out.steps_target is not None and self.progress >= out.steps_target - 1e-9:
            self.progress = float(out.steps_target)
            return True
        if self.since_snapshot >= self.interval - 1e-9:
            yield from self._checkpoint()
        return False

    def _credit_segment(self, now: float) -> None:
        """Credit the part of the running segment done by `now`, once (a preemption credits
        it, then the interrupted segment must not credit it again)."""
        if self.segment is None:
            return
        start, wall, steps = self.segment
        self.segment = None
        elapsed = now - start
        self._advance(steps * (elapsed / wall if wall > 0 else 1.0), elapsed, now)

    def _advance(self, steps: float, wall: float, now: float) -> None:
        self.progress += steps
        if self.outcome.steps_target is not None:
            self.progress = min(self.progress, float(self.outcome.steps_target))
        self.outcome.running_s += wall
        self.since_snapshot += wall
        self._collect_async(now)

    def _checkpoint(self):
        env = self.t.env
        ck = self.checkpoint
        assert ck is not None
        snapshot = (self.progress, self.outcome.running_s)
        self.since_snapshot = 0.0
        if ck.async_write:
            self.async_pending.append((env.now + ck.write_s, *snapshot))
            if self.t.recorder is not None:
                self.t.recorder.event(env.now, "checkpoint", "async", -1, -1, self.index)
            return
        self.set_state("checkpointing")
        yield env.timeout(ck.write_s)  # an interrupt here loses this checkpoint
        self.saved = snapshot
        self.outcome.checkpoints_completed += 1
        if self.t.recorder is not None:
            self.t.recorder.event(env.now, "checkpoint", "blocking", -1, -1, self.index)
        self.set_state("running")

    def _recover(self):
        """From a failure to running again: detect, replace, restart, restore."""
        env = self.t.env
        out = self.outcome
        f = self.t.scenario.failures
        restore = self.checkpoint.restore_s if self.checkpoint else 0.0
        while True:
            # Take in every failure that has hit the job so far.
            pending, self.pending = self.pending, []
            lost_instances: set[int] = set()
            for component, lost in pending:
                out.interruptions[component] += 1
                lost_instances.update(lost)
            if self.state == "running" or self.state == "checkpointing":
                self._lose_work()
            self.set_state("down")
            self._drop(lost_instances)
            try:
                yield env.timeout(f.detect_s)
                self.set_state("waiting")
                # Replacements come from the scheduler, which serves recovering jobs before
                # queued ones (Scheduler._pass) and adds them to this job as it grants them.
                self.t.scheduler.schedule()
                while self.held_count < self.instances_needed:
                    yield self.t.hardware_event
                self.set_state("restarting")
                yield env.timeout(f.restart_s)
                self.set_state("restoring")
                yield env.timeout(restore)
            except simpy.Interrupt as signal:
                self.interrupt_pending = False
                if signal.cause == "preempt":
                    raise _Preempted() from None
                if isinstance(signal.cause, tuple) and signal.cause[0] == "end":
                    raise _Ended(signal.cause[1]) from None
                continue  # another failure (or a pace change): start the recovery again
            self.set_state("running")
            return

    def _lose_work(self) -> None:
        """Back to the last completed checkpoint: the work since it is lost."""
        progress, running = self.saved
        self.outcome.lost_work_s += self.outcome.running_s - running
        self.progress = progress
        # Training resumes from that checkpoint: the lost stretch is counted once.
        self.saved = (progress, self.outcome.running_s)
        self.async_pending.clear()
        self.since_snapshot = 0.0

    def _drop(self, lost: set[int]) -> None:
        """Give up the instances that went down (for UltraServer jobs, their whole
        UltraServers: the healthy siblings go back to the pool)."""
        if not lost:
            return
        ipu = self.t.ipu
        lost_array = np.fromiter(lost, dtype=np.int64)
        if self.whole_ultraservers:
            units = np.unique(lost_array // ipu)
            candidates = (units[:, None] * ipu + np.arange(ipu)[None, :]).ravel()
            held = self.held_mask[candidates]
            self.outcome.ultraservers_lost += int(held.reshape(len(units), ipu).any(axis=1).sum())
            gone = candidates[held]
        else:
            gone = lost_array[self.held_mask[lost_array]]
        self.remove(gone)
        healthy = self.t.healthy[gone]
        self.t._release(gone[healthy].tolist())
        self.t.owner[gone[~healthy]] = -1  # they go to repair, then back to the pool
