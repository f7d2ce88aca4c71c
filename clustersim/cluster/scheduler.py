"""The scheduler: starts queued jobs and serves recovering ones, pass by pass, with the
policies of `clustersim.cluster.policies`; records the free pool's fragmentation."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from clustersim.cluster.policies import (
    easy_backfill,
    expected_returns,
    granted_below,
    preempt_for,
    queue_key,
    recovering_key,
    reservation,
    runtime_floor,
)
from clustersim.cluster.queues import FairShareQueue, JobQueue
from clustersim.cluster.uplinks import share_uplinks

if TYPE_CHECKING:
    from clustersim.cluster.jobrun import JobRun
    from clustersim.cluster.ports import SchedulerTimeline

__all__ = ["Scheduler"]


def _no_limit() -> float:
    """A queue walk's size bound when only quota bounds it (`JobQueue.after`)."""
    return math.inf


class Scheduler:
    """Starts queued jobs: FIFO, priority, EASY backfill, or fair share between teams (with
    EASY backfill); optional preemption; team quotas (`clustersim.cluster.quotas`).

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

    def __init__(self, timeline: SchedulerTimeline, policy: str, preemption: bool):
        self.t = timeline
        self.policy = policy
        self.preemption = preemption
        key = lambda run: queue_key(policy, run)  # noqa: E731
        self.queue = (FairShareQueue(key, timeline.teams, runtime_floor) if policy == "fairshare"
                      else JobQueue(key, runtime_floor))
        self._busy = False
        self._again = False
        self._retry_at = -math.inf  # the instant of the last preemption tried again
        # (time, head job, shadow time) of every backfill reservation, when a list (tests)
        self.reservations: list[tuple[float, int, float]] | None = None
        self.fragmentation_s = 0.0  # time integral of fragmentation
        self._last = (0.0, 0.0)
        # Instances per leaf: fixed, counted once (record_state runs after every pass).
        self._leaf_size = np.bincount(timeline.instance_leaf, minlength=timeline.n_leaves)
        self._even_leaves = bool((self._leaf_size == timeline.per_leaf).all())
        self._fragmentation = (-1, 0.0)  # (free pool version, its fragmentation)
        # Placements found since the free pool last changed (`_place`), and that pool state.
        self._placements: dict[tuple, np.ndarray | None] = {}
        self._placements_state: tuple | None = None

    def submit(self, run: JobRun) -> None:
        self.queue.append(run)
        self.schedule()

    def withdraw(self, run: JobRun) -> None:
        self.queue.discard(run)

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
        share_uplinks(self.t)
        self.record_state()

    def _pass(self) -> None:
        # A job that lost instances has first claim on the instances freed, before every
        # queued job (it holds the rest of its allocation idle meanwhile): they are reserved
        # for it from the failure and granted once the failure is detected.
        recovering = sorted((r for r in self.t.recovering if r.held_count < r.instances_needed),
                            key=recovering_key)
        free = self.t.free_mask()
        self._pool_state()
        changes: tuple | None = ()  # what this pass took from `free` (None: not followed)
        floor = -math.inf  # priority policy: queued jobs at or below it wait for a recovery
        blocked: tuple[JobRun, int] | None = None  # the first recovery that did not fit
        for run in recovering:
            need = run.instances_needed - run.held_count
            # (on several sites, its replacements come from its own sites first)
            chosen = self._place(changes, need, run, free, held=True)
            if chosen is None and self.preemption and run.state == "waiting_for_hardware":
                chosen = self._preempt(run, free, need, changes)
                changes = None if chosen is not None else changes  # (victims' instances added)
            if chosen is not None:
                if run.state == "waiting_for_hardware":
                    self._replace(run, chosen)
                free[chosen] = False  # granted, or reserved until its failure is detected
                changes = None if changes is None else (*changes, chosen.tobytes())
                continue
            # A recovery blocked on hardware does not hold back the recoveries after it;
            # under priority it holds back only the queued jobs it is not outranked by.
            if blocked is None:
                blocked = (run, need)
            floor = max(floor, run.job.priority)
        # The queue in order (a walk, not a copy or a sort of the queue per pass). A job over
        # its team's quota does not hold back the jobs after it; by team and size
        # (`JobQueue.after`), the walk does not even visit it (a month's queue holds thousands
        # such, and the walk used to step past each one at every pass).
        teams = self.t.teams
        by_team = isinstance(self.queue, JobQueue)
        order = (self.queue.after(None, _no_limit, teams.room) if by_team
                 else self.queue.ordered(admissible=True))
        backfill = self.policy in ("backfill", "fairshare")
        if blocked is not None and self.policy != "priority":
            # Every recovery had its turn; a blocked one is the queue's head.
            if backfill and len(self.queue):
                self._backfill(blocked[0], blocked[1], order, free)
            return
        while (run := next(order, None)) is not None:
            if run.job.priority <= floor:
                return
            if not teams.admits(run):
                continue
            need = run.instances_needed
            chosen = self._place(changes, need, run, free)
            if chosen is None and self.preemption:
                chosen = self._preempt(run, free, need, changes)
                changes = None if chosen is not None else changes  # (victims' instances added)
                if chosen is not None and by_team:
                    # Victims were evicted and their quota came back: the room a walk
                    # checks may only fall, so walk on from this job afresh.
                    order = self.queue.after(self.queue.key_of(run), _no_limit, teams.room)
                elif chosen is not None:
                    order.rooms_rose()  # (FairShareWalk: the same, team by team)
            if chosen is None:
                if backfill:
                    self._backfill(run, need, order, free)
                return
            self.start(run, chosen)
            free[chosen] = False
            changes = None if changes is None else (*changes, chosen.tobytes())

    def _pool_state(self) -> None:
        """Forget the placements found on another free pool (or another partition of the
        sites) than this pass starts from."""
        partitioned = getattr(self.t, "partitioned", None)
        state = (self.t.free_pool.version,
                 None if partitioned is None else partitioned.tobytes())
        if state != self._placements_state:
            self._placements_state = state
            self._placements = {}

    def _place(self, changes: tuple | None, need: int, run: JobRun, free: np.ndarray,
               held: bool = False) -> np.ndarray | None:
        """`Timeline.place` for `run` (with `held`, beside the instances it still holds),
        on `free`: the pool this pass started from less `changes` (the instances it took, in
        order). A placement depends on nothing else, and a recovering job is placed again at
        every pass until its failure is detected and replacements come (half of a fleet
        month's recovery placements were asked again of an unchanged pool): found once per
        pool state. (Read-only: the same array may be handed out again.)"""
        if changes is None:
            return self.t.place(need, run.whole_ultraservers, free,
                                run.held_mask if held else None)
        key = (changes, need, run.whole_ultraservers,
               (run.index, run.held_changes) if held else None)
        if key in self._placements:
            return self._placements[key]
        chosen = self.t.place(need, run.whole_ultraservers, free, run.held_mask if held else None)
        if chosen is not None:
            chosen.flags.writeable = False
        self._placements[key] = chosen
        return chosen

    def _backfill(self, head: JobRun, need: int, rest: Iterator[JobRun],
                  free: np.ndarray) -> None:
        """EASY backfill (`policies.easy_backfill`) around `head`, needing `need` instances:
        its reservation recorded (when kept), the jobs it lets start started."""
        t = self.t
        now = t.env.now
        available = int(np.count_nonzero(free))
        if available < self.queue.smallest():
            return  # nothing that waits fits in what is free (place would refuse each one)
        # Instances per job (those it holds, or those just granted it) back at its expected
        # end, in order of end (`ActiveJobs.expected_ends`), and those in repair.
        ends = expected_returns(t.active.expected_ends(head), t.healthy, t.owner,
                                t.instance_down_since, t.repair_s)
        shadow, extra = reservation(need, available, ends)
        if self.reservations is not None:  # kept for the tests' properties
            self.reservations.append((now, head.index, shadow))
        for run, chosen in easy_backfill(head, shadow, extra, rest, free, now, self.queue,
                                         t.teams, t.place):
            self.start(run, chosen)

    def _preempt(self, run: JobRun, free: np.ndarray, need: int,
                 changes: tuple | None = None) -> np.ndarray | None:
        """Preemption (`policies.preempt_for`): the victims evicted, their instances added to
        `free`; the instances `run` gets, or None (nobody evicted). `changes`: what the pass
        took from the pool so far (`_place`; None: not followed)."""
        now = self.t.env.now
        decision = preempt_for(run, free, need, self.t.active, self.t.env.active_process,
                               self.t.place, now,
                               None if changes is None else (self._placements, changes))
        if decision is None:
            # Jobs it outranks that were granted instances in this instant hold none yet:
            # once their processes take them up (later in this instant), they are victims.
            # Try again then, once an instant (a preemption that fails again waits for the
            # next change, as before).
            if self._retry_at != now and granted_below(run, self.t.active):
                self._retry_at = now
                self.t.env.process(self._retry())
            return None
        chosen, victims = decision
        for victim in victims:
            free[victim.held] = True  # (read before the eviction empties it)
            victim.evict()
        return chosen

    def _retry(self):
        """A pass after the processes of the jobs granted instances in this instant took
        them up (their wake-ups come before this one in the instant's order)."""
        yield self.t.env.timeout(0)
        self.schedule()

    def start(self, run: JobRun, chosen: np.ndarray) -> None:
        self.queue.remove(run)
        self.t.set_owner(chosen, run.index)
        self.t.active.add(run)  # granted: it holds them from now (its process takes them)
        self.t.teams.admit(run, self.t.env.now)
        run.grant(chosen)

    def _replace(self, run: JobRun, chosen: np.ndarray) -> None:
        """Replacement instances for a recovering job, held from now; its process wakes."""
        self.t.set_owner(chosen, run.index)
        run.outcome.replacements += len(chosen)
        run.add(chosen)
        run._placed(len(chosen))
        self.t.wake_waiting()

    def fragmentation_mean(self, horizon: float) -> float:
        last_time, last_value = self._last
        total = self.fragmentation_s + (horizon - last_time) * last_value
        return total / horizon if horizon > 0 else 0.0

    def record_state(self) -> None:
        """Fragmentation: the share of free instances not in a wholly free leaf (a leaf
        whose instances are all free, serving deployments' instances aside), from the free
        pool's counts per leaf (kept as instances change, not recounted per pass)."""
        now = self.t.env.now
        pool = self.t.free_pool
        count = pool.count
        if pool.version == self._fragmentation[0]:  # the pool as at the last pass
            self._record(now, count, self._fragmentation[1])
            return
        whole = 0
        if count and self._even_leaves and not self.t.serving_instances:
            # (every leaf as large: a count of the wholly free ones, 3 times as fast)
            whole = int(np.count_nonzero(pool.per_leaf == self.t.per_leaf)) * self.t.per_leaf
        elif count:
            size = self._leaf_size
            if self.t.serving_instances:  # serving instances never come free for jobs
                size = size - self.t.serving_per_leaf
            per_leaf = pool.per_leaf
            whole = int(per_leaf[per_leaf == size].sum())
        fragmentation = 1.0 - whole / count if count else 0.0
        # (a spare taking a serving slot changes serving_per_leaf and the pool together)
        self._fragmentation = (pool.version, fragmentation)
        self._record(now, count, fragmentation)

    def _record(self, now: float, count: int, fragmentation: float) -> None:
        last_time, last_value = self._last
        self.fragmentation_s += (now - last_time) * last_value
        self._last = (now, fragmentation)
        self.t.min_free = min(self.t.min_free, count)
        # Jobs holding instances, counting one granted them in this pass before its process
        # has taken them up: the active set (kept as jobs are granted, add, drop and end
        # instances; not a count over every job per pass).
        if self.t.recorder is not None:
            self.t.recorder.cluster_state(now, count, len(self.queue), len(self.t.active),
                                          fragmentation)
