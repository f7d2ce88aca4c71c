"""How a job is interrupted and recovers: a failure (detect, wait for replacement hardware,
restart, restore from the last completed checkpoint), a preemption (evicted, queued again),
or its end (deadline, run_for) arriving in the middle of any phase.

A part of JobRun (`clustersim.cluster.jobrun`), which holds the state these methods keep.
"""

from __future__ import annotations

import numpy as np
import simpy

from clustersim.cluster.owners import FREE

__all__ = ["Preempted", "Ended", "JobRecovery"]


class Preempted(Exception):
    """The scheduler evicted the job for a higher-priority one."""


class Ended(Exception):
    """The job's deadline or run time came."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class JobRecovery:
    """Interruptions of a job run: failures, preemption, the end; and recovery."""

    def interrupt(self, component: str, lost: list[int]) -> None:
        if self.state in ("queued", "done") or self.process is None or not self.held_count:
            return
        self.pending.append((component, lost))
        if self.process.is_alive and not self.interrupt_pending:
            self.arm_end()
            self.interrupt_pending = True
            self.process.interrupt("failure")

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
                    raise Preempted() from None
                if isinstance(cause, tuple) and cause[0] == "end":
                    raise Ended(cause[1]) from None
                if cause == "pace":
                    body = self._training()
                    continue
                yield from self._recover()
                body = self._training()

    def _resume(self):
        env = self.t.env
        self.set_state("restarting")
        yield env.timeout(self.t.scenario.failures.restart_s)
        self.set_state("restoring")
        yield env.timeout(self.checkpoint.restore_s if self.checkpoint else 0.0)

    def evict(self) -> None:
        """Preempted by the scheduler: give every instance back now; the process then loses
        the work since the last checkpoint and queues again."""
        if self.state in ("running", "checkpointing"):
            self._credit_segment(self.t.env.now)
            self._lose_work()
        self.outcome.preemptions += 1
        self.t.teams.release(self)  # queued again: admitted again when it restarts
        held = self.held
        self.remove(held)
        self.t.set_owner(held, FREE)
        if self.process is not None and self.process.is_alive:
            self.arm_end()
            self.interrupt_pending = True
            self.process.interrupt("preempt")

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
                self.set_state("waiting_for_hardware")
                # Replacements come from the scheduler, which serves recovering jobs before
                # queued ones (Scheduler._pass in scheduler.py) and adds them to this job as it grants them.
                self.t.scheduler.schedule()
                while self.held_count < self.instances_needed or self.t.cut_off(self):
                    yield self.t.hardware_event
                self.set_state("restarting")
                yield env.timeout(f.restart_s)
                self.set_state("restoring")
                yield env.timeout(restore)
            except simpy.Interrupt as signal:
                self.interrupt_pending = False
                if signal.cause == "preempt":
                    raise Preempted() from None
                if isinstance(signal.cause, tuple) and signal.cause[0] == "end":
                    raise Ended(signal.cause[1]) from None
                continue  # another failure (or a pace change): start the recovery again
            self.set_state("running")
            return

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
            held = self.holds(candidates)
            self.outcome.ultraservers_lost += int(held.reshape(len(units), ipu).any(axis=1).sum())
            gone = candidates[held]
        else:
            gone = lost_array[self.holds(lost_array)]
        self.remove(gone)
        healthy = self.t.healthy[gone]
        # The failed ones go to repair, then back to the pool: no longer the job's before the
        # scheduler's pass that the release runs (backfill would count them as coming back
        # at the job's end).
        self.t.set_owner(gone[~healthy], FREE)
        self.t.release(gone[healthy].tolist())
