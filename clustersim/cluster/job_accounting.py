"""A job's books: time in each state, instances held and the chip-time they amount to, and
progress (steps done, work credited, work lost back to the last checkpoint).

A part of JobRun (`clustersim.cluster.jobrun`), which holds the state these methods keep.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from clustersim.scenario.teams import quota_bars

__all__ = ["JobAccounting"]


class JobAccounting:
    """Bookkeeping of a job run: states, held instances, progress."""

    def set_state(self, state: str) -> None:
        now = self.t.env.now
        if state == self.state:
            return
        self._count_state(now)
        if self.t.recorder is not None and now > self.state_since:
            self.t.recorder.interval("job", self.index, self.state, self.state_since, now)
        self.state, self.state_since = state, now
        if state == "done" and self.index in self.t.site_spread:
            self.t.site_changed = True  # (it leaves the inter-site links)
        if state in ("down", "waiting_for_hardware"):
            self.t.recovering.add(self)
        else:
            self.t.recovering.discard(self)

    def _count_state(self, now: float) -> None:
        """The time since the last change to the current state (a wait in the queue after a
        preemption also to the outcome's `requeued_s`)."""
        self.outcome.time_in_state[self.state] += now - self.state_since
        if self.state == "queued" and self.requeued:
            self.outcome.requeued_s += now - self.state_since

    def close(self, horizon: float) -> None:
        """Close the books at the horizon: credit a running segment, count the last state."""
        self._credit_segment(horizon)
        self._count_state(horizon)
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
        out.held_chip_s = self.allocated_chip_s
        if self.state != "done":
            out.status = "running at horizon" if self.state == "running" else (
                f"{self.state} at horizon")
            out.reason = self._why_not_done()

    def _why_not_done(self) -> str:
        out = self.outcome
        if self.state == "queued":
            teams = self.t.teams
            bars = quota_bars(self.instances_needed, teams.quota.get(self.team),
                              teams.borrowing, teams.cohort_quota)
            if bars:
                return (f"never started: it needs {self.instances_needed:,} instances, "
                        f"{bars} (team {self.team}): it can never start")
            if not self.t.teams.admits(self):
                return f"never started: its team {self.team} was at its quota"
            return "never started: not enough healthy instances"
        if self.state == "waiting_for_hardware":
            if not math.isfinite(self.t.repair_s):
                return "waiting for hardware: no spare left and repairs are disabled"
            return "waiting for hardware: no spare instances until repairs finish"
        cause = self.low_ettr_cause()
        if cause:
            return cause
        if out.steps_target is None:
            return "no step target: ran to the horizon"
        return "the horizon came before the step target"

    def low_ettr_cause(self) -> str:
        """What keeps the job's ETTR low, if something does: failures faster than its
        recovery, or no checkpoints to recover from; empty otherwise."""
        out = self.outcome
        f = self.t.scenario.failures
        recovery = f.detect_s + f.restart_s + (self.checkpoint.restore_s if self.checkpoint else 0)
        if out.mtbf_s is not None and out.mtbf_s < recovery:
            return (f"little progress: the job's mean time between failures ({out.mtbf_s:,.0f} s)"
                    f" is shorter than its recovery ({recovery:,.0f} s: detect, restart, restore)")
        interrupted = sum(out.interruptions.values())
        if self.checkpoint is None and interrupted:
            return (f"no checkpoints: each of its {interrupted:,} interruptions lost all the work "
                    f"since the start ({out.lost_work_s / 3600:,.1f} h lost in all); give the job a "
                    "checkpoint block (interval: auto)")
        return ""

    @property
    def held(self) -> np.ndarray:
        """The instances it holds, ascending (read-only: kept until it adds or removes some,
        not found again in the cluster-wide mask at each of its many uses)."""
        if self.held_mask is None:
            return np.empty(0, dtype=np.int64)
        ids = self._held_ids
        if ids is None:
            ids = np.flatnonzero(self.held_mask)
            ids.flags.writeable = False
            self._held_ids = ids
        return ids

    def holds(self, instances: np.ndarray) -> np.ndarray:
        """Whether the job holds each of these instances."""
        if self.held_mask is None:
            return np.zeros(len(instances), dtype=bool)
        return self.held_mask[instances]

    def _account(self) -> None:
        now = self.t.env.now
        self.allocated_chip_s += (now - self.held_since) * self.held_count * self.t.cpi
        self.held_since = now

    def add(self, instances: Any) -> None:
        """Start holding these instances."""
        added = np.asarray(instances, dtype=np.int64)
        self._account()
        ids = None
        if self.held_mask is None:
            # A mask over the cluster only while the job holds something: a 100,000-job mix
            # must not keep one per job (100,000 x 32,768 instances would be 3 GiB).
            self.held_mask = np.zeros(self.t.n_instances, dtype=bool)
            # Its `held` is these, sorted (distinct, as placements are): not searched for
            # in the new mask (a fleet's every start asks for it).
            ids = np.sort(added)
            if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
                ids = None
            else:
                ids.flags.writeable = False
        self.held_mask[added] = True
        self._held_ids = ids
        self.held_changes += 1  # (the scheduler keeps placements by it: `Scheduler._place`)
        self.site_links = None  # (sites.share_site_links: the links its sites use)
        if self.index in self.t.site_spread:
            self.t.site_changed = True
        self.held_count += len(added)
        self.t.active.add(self)
        self.t.taken_at[added] = self.t.env.now
        self.pace = self._pace()
        self.t.uplinks.update(self)

    def remove(self, instances: Any) -> None:
        """Stop holding these instances (an allocation row each)."""
        removed = np.asarray(instances, dtype=np.int64)
        self._account()
        if self.t.recorder is not None:
            self.t.recorder.allocations_ended(self.index, removed.tolist(),
                                              self.t.taken_at[removed].tolist(), self.t.env.now)
        if len(removed):
            self.held_mask[removed] = False
            self._held_ids = None
            self.held_changes += 1
            self.site_links = None
            self.held_count -= len(removed)
            if self.index in self.t.site_spread:
                self.t.site_changed = True
        if not self.held_count:
            self.t.active.discard(self)
            self.held_mask = None
        self.pace = self._pace()
        self.t.uplinks.update(self)

    def _pace(self) -> float:
        if self.held_count == 0:
            return 1.0
        return self.t.slowdown(self.held_mask)

    def _collect_async(self, now: float) -> None:
        """Asynchronous checkpoints whose write has finished become the restore point."""
        while self.async_pending and self.async_pending[0][0] <= now:
            done_at, progress, running = self.async_pending.pop(0)
            self.saved = (progress, running)
            self.outcome.checkpoints_completed += 1
            if self.t.recorder is not None:  # a row once written (first_s: when)
                self.t.recorder.event(now, "checkpoint", "async", -1, -1, self.index,
                                      first_s=done_at)

    def _credit_segment(self, now: float) -> None:
        """Credit the part of the running segment done by `now`, once (a preemption credits
        it, then the interrupted segment must not credit it again)."""
        if self.closed_segment is not None:
            self._credit_closed(now)
            return
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

    def _lose_work(self) -> None:
        """Back to the last completed checkpoint: the work since it is lost."""
        progress, running = self.saved
        self.outcome.lost_work_s += self.outcome.running_s - running
        self.progress = progress
        # Training resumes from that checkpoint: the lost stretch is counted once.
        self.saved = (progress, self.outcome.running_s)
        self.async_pending.clear()
        self.since_snapshot = 0.0
        self.cycle_u = 0.0
