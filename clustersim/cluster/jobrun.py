"""One job over the timeline: a simpy process that queues, trains in bulk between events,
checkpoints and finishes, with its books (`job_accounting`) and recovery (`job_recovery`).

A job advances its steps in bulk between discrete events (failure, repair, restart, end,
pace change); its periodic checkpoints in between are worked out in closed form
(`job_periodic`), with one event each only in the reference version. With step-time
jitter, a run of k Gamma-distributed steps is one Gamma draw of their sum. Checkpoints are
blocking (training pauses for the write) or asynchronous (a snapshot is taken and written
while training goes on; it counts once written).
`interval: auto` is Daly's optimum for the job's failure rate (asynchronous: back to back, as
each write costs no training time).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from clustersim.cluster.instants import event_at
from clustersim.cluster.job_accounting import JobAccounting
from clustersim.cluster.job_periodic import PeriodicTraining
from clustersim.cluster.job_recovery import Ended, JobRecovery, Preempted
from clustersim.cluster.outcomes import JobOutcome
from clustersim.cluster.owners import FREE
from clustersim.cluster.quotas import team_of
from clustersim.cluster.rates import checkpoint_intervals, job_checkpoint
from clustersim.cluster.uplinks import UplinkPacing
from clustersim.scenario.models import JobSpec
from clustersim.training.profile import StepProfile

if TYPE_CHECKING:
    from clustersim.cluster.ports import JobTimeline

__all__ = ["JobRun"]


class JobRun(JobAccounting, JobRecovery, UplinkPacing, PeriodicTraining):
    """One job's process: queued, running in bulk, checkpointing, recovering.

    Its books are kept by JobAccounting, its interruptions and recovery by JobRecovery, its
    step time on its placement and shared uplinks by UplinkPacing; this class holds the
    state and the life cycle: queue, train, checkpoint, finish."""

    # The watch of the end of its run time set at its first interruption, not at its start
    # (tests turn it off: set at the start, as before, must give the same run).
    lazy_end_watch = True

    def __init__(self, timeline: JobTimeline, index: int, job: JobSpec, profile: StepProfile):
        self.t = timeline
        self.index = index
        self.job = job
        self.profile = profile
        scenario = timeline.scenario
        hw = scenario.hardware
        self.instances_needed = scenario.job_instances(job)
        self.team = team_of(job.team)
        self.admitted = False  # counted against its team's quota (TeamBook)
        self.whole_ultraservers = hw.whole_ultraservers(job.parallelism.tp)
        self.outcome = JobOutcome(
            name=job.name, instances=self.instances_needed,
            chips=self.instances_needed * hw.chips_per_instance,
            step_time_s=profile.step_time_s, tokens_per_step=profile.tokens_per_step,
            steps_target=job.steps, submit_s=job.submit_s, team=team_of(job.team),
            trace_outcome=job.trace_outcome,
        )
        rate = timeline.failure_rate(job)
        self.outcome.mtbf_s = 1.0 / rate if rate > 0 else None
        ideal = [t for t in ((job.steps * profile.step_time_s) if job.steps else None,
                             job.run_for_s) if t is not None]
        self.outcome.ideal_s = min(ideal) if ideal else None
        # failures and no block: Daly's default, never silently none (rates.job_checkpoint)
        self.checkpoint, self.outcome.checkpoint_default = job_checkpoint(scenario, job, rate)
        self.interval, self.outcome.young_interval_s, self.outcome.daly_interval_s = (
            checkpoint_intervals(self.checkpoint, self.outcome.mtbf_s))
        if math.isfinite(self.interval):
            self.outcome.checkpoint_interval_s = self.interval
            self.outcome.checkpoint_write_s = self.checkpoint.write_s
        # Instances held: a mask over the cluster, changed incrementally (no O(n) per change),
        # allocated while the job holds instances (JobAccounting.add).
        self.held_mask: np.ndarray | None = None
        self.site_links: frozenset | None = None  # inter-site links its instances' sites use
        self._held_ids: np.ndarray | None = None  # `held`, kept until the mask changes
        self.held_count = 0
        self.held_changes = 0  # times its holding changed (add, remove)
        self.pace = 1.0  # step-time multiplier of the held instances (stragglers)
        self.state = "queued"
        self.state_since = job.submit_s
        self.requeued = False  # queued again after a preemption (lost_time_s.requeued)
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
        # Periodic checkpoints in closed form (job_periodic), unless the timeline is the
        # per-checkpoint reference: the segment planned, and the blocking cycle position.
        self.closed_form = math.isfinite(self.interval) and not timeline.checkpoint_events
        self.closed_segment: tuple[float, float, float, float, bool] | None = None
        self.cycle_u = 0.0
        self.interrupt_pending = False
        self.step_time = profile.step_time_s  # for the current placement
        self.placed_step_time = profile.step_time_s
        self.fabric_exposed_s = 0.0
        self.spans_leaves = False
        # The profile of its last placement solved exactly, and the instances replaced since
        # (UplinkPacing._placed keeps that profile through a few replacements).
        self.solved_profile: StepProfile | None = None
        self.replaced_since_solved = 0
        # Its UltraServers' fill then (ultraserver_class), found from the instances it held
        # then only when a replacement asks (most placements are never replaced).
        self.solved_class: tuple | None = ()
        self.solved_held: np.ndarray | None = None
        self.uplink_slowdown = 1.0
        self.queued_at = job.submit_s
        self.granted: simpy.Event | None = None
        self.end_at = job.submit_s + job.deadline_s if job.deadline_s is not None else None
        # The end of its run time (from its first start), and whether a watch that interrupts
        # it then is set. A closed-form training segment ends there itself
        # (PeriodicTraining._train_closed), so a job that is never interrupted needs no watch
        # (four events and an interrupt fewer, most of a year's million jobs); the first
        # interruption of any other kind sets one (arm_end), for the phases that follow.
        self.run_end: float | None = None
        self.end_armed = False

    def pace_changed(self, until: float) -> None:
        self.pace_until = max(self.pace_until, until)
        if (self.state == "running" and self.process is not None and self.process.is_alive
                and not self.interrupt_pending):
            self.arm_end()
            self.interrupt_pending = True
            self.process.interrupt("pace")

    def main(self, arrived: bool = False):
        """Its life; `arrived`: started at its submission (Timeline._arrivals), not before."""
        env = self.t.env
        if self.job.submit_s > 0 and not arrived:
            yield env.timeout(self.job.submit_s)
        self.state_since = env.now
        first = True
        while True:
            try:
                chosen = yield from self._queue()
            except simpy.Interrupt as signal:  # only the end can come while queued
                self.interrupt_pending = False
                self._finish(*self._ending(signal.cause))
                self.t.retire(self)
                return
            self.add(chosen)
            self._placed()
            try:
                if first:
                    first = False
                    self.outcome.start_s = env.now
                    if self.job.run_for_s is not None:
                        at = env.now + self.job.run_for_s
                        # (where the watch's timeout, set now, lands)
                        self.run_end = env.now + max(0.0, at - env.now)
                        if not (self.closed_form and self.lazy_end_watch):
                            self.arm_end()
                else:  # back after a preemption: restart and restore first
                    yield from self._guard(self._resume())
                self.set_state("running")
                yield from self._guard(self._training())
                self._finish("done", "reached its step target")
                self.t.retire(self)
                return
            except Preempted:
                continue
            except Ended as ended:
                self._finish(*self._ending(("end", ended.why)))
                self.t.retire(self)
                return

    def _queue(self):
        """Wait in the scheduler's queue until granted instances."""
        # Back in the queue after a preemption: that wait is within its wall time (from its
        # first start), unlike the wait before the first start.
        self.requeued = self.outcome.start_s is not None
        self.set_state("queued")
        self.queued_at = self.t.env.now
        self.granted = self.t.env.event()
        self.t.scheduler.submit(self)
        chosen = yield self.granted
        return chosen

    def grant(self, chosen: np.ndarray) -> None:
        assert self.granted is not None
        self.granted.succeed(chosen)

    def _training(self):
        train = self._train_closed if self.closed_form else self._train
        while True:
            finished = yield from train()
            if finished:
                return True

    def arm_end(self) -> None:
        """The watch that interrupts it at the end of its run time, set once (an event with
        a callback, not a process)."""
        if self.end_armed or self.run_end is None:
            return
        self.end_armed = True
        event_at(self.t.env, self.run_end).callbacks.append(self._run_end_came)

    def _run_end_came(self, _event: simpy.Event) -> None:
        if self.state == "done" or self.process is None or not self.process.is_alive:
            return
        self.interrupt_pending = True
        self.process.interrupt(("end", "run_for"))

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

    def expected_duration(self) -> float:
        """Run time alone, for backfill: the step target or run_for (infinite without)."""
        candidates = []
        if self.job.steps is not None:
            candidates.append((self.job.steps - self.progress) * self.step_time)
        if self.job.run_for_s is not None:
            candidates.append(self.job.run_for_s)
        return min(candidates) if candidates else math.inf

    def fixed_expected_end(self) -> float | None:
        """Its expected end when nothing can change it any more: started, with a run time and
        no step target (`expected_end` is then its start plus its run time, or its
        deadline); None otherwise."""
        start = self.outcome.start_s
        if self.job.steps is not None or self.job.run_for_s is None or start is None:
            return None
        end = start + self.job.run_for_s
        return end if self.end_at is None else min(end, self.end_at)

    def ends_by(self, now: float) -> bool:
        """Whether its deadline or run time (from its first start) has come by `now` (its
        end is then due in this instant, its watch not yet run)."""
        ends = [self.end_at] if self.end_at is not None else []
        if self.job.run_for_s is not None and self.outcome.start_s is not None:
            ends.append(self.outcome.start_s + self.job.run_for_s)
        # (the watch's timeout lands on its end to within a rounding of the sum)
        return any(end <= now + 1e-9 * max(1.0, abs(now)) for end in ends)

    def backfill_count(self) -> int:
        """Instances it holds, or those just granted it (its process has not taken them up
        yet): what backfill expects back at its end."""
        return self.held_count or (self.instances_needed if self.state == "queued"
                                   and self.granted is not None and self.granted.triggered
                                   else 0)

    def expected_end(self) -> float:
        now = self.t.env.now
        end = now + self.expected_duration()
        if self.job.run_for_s is not None:
            started = self.outcome.start_s if self.outcome.start_s is not None else now
            end = min(end, started + self.job.run_for_s)
        if self.end_at is not None:
            end = min(end, self.end_at)
        return end

    def _finish(self, status: str, reason: str) -> None:
        self.t.scheduler.withdraw(self)
        self.t.teams.release(self)
        self._credit_segment(self.t.env.now)  # ended mid-segment: credit what was done
        self.set_state("done")
        self.outcome.progress_steps = self.progress
        self.outcome.status = status
        self.outcome.end_s = self.t.env.now
        cause = self.low_ettr_cause()
        self.outcome.reason = f"{reason}; {cause}" if cause else reason
        held = self.held.tolist()
        self.t.active.discard(self)
        if not held and self.granted is not None and self.granted.triggered and (
                self.granted.ok and self.granted.value is not None):
            # Ended (deadline, run time) in the same instant it was granted instances, before
            # its process took them up: they go back to the pool, not to a finished job.
            granted = np.asarray(self.granted.value, dtype=np.int64)
            held = granted[self.t.owner[granted] == self.index].tolist()
            if held:
                self.t.set_owner(held, FREE)
                self.t.release([])
                return
        if held:
            self.remove(held)
            self.t.release(held)

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

    def _checkpoint(self):
        env = self.t.env
        ck = self.checkpoint
        assert ck is not None
        snapshot = (self.progress, self.outcome.running_s)
        self.since_snapshot = 0.0
        if ck.async_write:
            self.async_pending.append((env.now + ck.write_s, *snapshot))
            return
        self.set_state("checkpointing")
        yield env.timeout(ck.write_s)  # an interrupt here loses this checkpoint
        self.saved = snapshot
        self.outcome.checkpoints_completed += 1
        if self.t.recorder is not None:
            self.t.recorder.event(env.now, "checkpoint", "blocking", -1, -1, self.index)
        self.set_state("running")
