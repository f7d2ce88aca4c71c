"""The scheduler's policies: the queue order (FIFO, priority), EASY backfill and preemption.

Placement (which instances) is `clustersim.cluster.placement`; the pass that applies these
policies is `clustersim.cluster.scheduler`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from clustersim.cluster.owners import FREE

if TYPE_CHECKING:
    from clustersim.cluster.jobrun import JobRun
    from clustersim.cluster.scheduler import Scheduler
    from clustersim.cluster.timeline import Timeline

__all__ = ["queue_key", "recovering_key", "runtime_floor", "easy_backfill", "preempt_for"]


def queue_key(policy: str, run: JobRun) -> tuple:
    """FIFO: by time queued; priority and backfill (and within a team, fairshare): the
    highest priority first, then FIFO."""
    if policy == "fifo":
        return (run.queued_at, run.index)
    return (-run.job.priority, run.queued_at, run.index)


def recovering_key(run: JobRun) -> tuple:
    """Recovering jobs go before every queued job, the highest priority first."""
    return (-math.inf, -run.job.priority, run.index)


def runtime_floor(run: JobRun) -> float:
    """A lower bound of `run.expected_duration()` while it waits (JobQueue's `shortest`): its
    run time when it has no step target (its run_for, or infinite: fixed), else -infinity
    (its remaining steps' time is not assumed fixed)."""
    return run.expected_duration() if run.job.steps is None else -math.inf


def easy_backfill(scheduler: Scheduler, head: JobRun, need: int, rest: Iterator[JobRun],
                  free: np.ndarray) -> None:
    """EASY backfill: `head` (needing `need` instances) gets a reservation at the earliest time
    enough are expected free (the shadow time); a later job (`rest`: the walk of the queue
    after the head) starts now if it ends before then, or uses only instances the
    reservation will not need."""
    t = scheduler.t
    queue = scheduler.queue
    now = t.env.now
    available = int(np.count_nonzero(free))
    if available < queue.smallest():
        return  # nothing that waits fits in what is free (place would refuse each one)
    # Instances per job (those it holds, or those just granted it) back at its expected end,
    # over the jobs started and not done, in order of end (`ActiveJobs.expected_ends`).
    ends = t.active.expected_ends(head)
    # Instances in repair come back at known times too.
    down = np.flatnonzero(~t.healthy)
    if len(down) and math.isfinite(t.repair_s):
        back = t.instance_down_since[down] + t.repair_s
        # (to the pool; a serving deployment's instance goes back to its deployment)
        ends = heapq.merge(ends, [(when, 1) for when in np.sort(back[t.owner[down] == FREE])
                                  .tolist()])
    shadow, extra = math.inf, available
    for end, count in ends:
        available += count
        if available >= need:
            shadow, extra = end, available - need
            break
    if scheduler.reservations is not None:  # kept for the tests' properties
        scheduler.reservations.append((now, head.index, shadow))
    free_count = int(np.count_nonzero(free))
    smallest = queue.smallest()
    # The fewest instances that did not fit, whole UltraServers or not: the pool only shrinks
    # during the walk and placement fails for every larger count once it fails for one, so
    # no larger job of that kind is tried again (the same starts, far fewer placements).
    refused = {True: math.inf, False: math.inf}
    if hasattr(queue, "after"):  # by team and size: only the jobs that could still start
        # (a team's jobs of a size larger than the reservation leaves over, none of which
        # would end before the shadow time, are not visited: `extra` only falls)
        rest = queue.after(head, lambda: min(free_count, max(refused.values()) - 1),
                           t.teams.room,
                           lambda size, shortest: size <= extra or now + shortest <= shadow)
    for run in rest:
        if free_count < smallest:
            return  # nothing that waits fits any more
        need = run.instances_needed
        if need > free_count or need >= refused[run.whole_ultraservers]:
            continue  # cannot fit now (place would refuse it)
        if not t.teams.admits(run):
            continue  # over its team's quota
        # Whether it may start, before where: a job that would still run at the head's start
        # needs the instances the head leaves over, and must not take the quota the head
        # needs. (Placing it first and then refusing it cost a placement per such job per
        # pass. A placement refused here is no different: placement fails for every larger
        # count once it fails for one, and the pool only shrinks during the walk.)
        ends_before = now + run.expected_duration() <= shadow
        if not ends_before and (need > extra or not t.teams.admits_beside(run, head)):
            continue
        chosen = t.place(need, run.whole_ultraservers, free)
        if chosen is None:
            refused[run.whole_ultraservers] = need
            continue
        if not ends_before:
            extra -= need
        scheduler.start(run, chosen)  # it leaves the queue: the walk moves on
        free[chosen] = False
        free_count -= len(chosen)


def preempt_for(t: Timeline, run: JobRun, free: np.ndarray, need: int) -> np.ndarray | None:
    """Evict lower-priority jobs (lowest priority, latest started first) until `run` fits;
    the instances it would get, with the victims' added to `free`, or None (nobody evicted)."""
    # A job whose own process runs this pass (releasing instances as it recovers) cannot
    # be interrupted from inside itself: it is not a victim this time.
    if t.active.lowest_priority() >= run.job.priority:
        return None  # nobody it outranks holds anything
    active = t.env.active_process
    victims = (r for r in t.active.by_preemption_order(run.job.priority)
               if r.held_count and r.state != "done"
               and (active is None or r.process is not active))
    first = next(victims, None)
    if first is None:
        return None
    victims = itertools.chain([first], victims)
    trial = free.copy()
    count = int(np.count_nonzero(trial))
    chosen_victims = []
    for victim in victims:
        held = victim.held
        count += int(np.count_nonzero(~trial[held]))
        trial[held] = True
        chosen_victims.append(victim)
        if count < need:
            continue  # not enough yet: placement would refuse
        placement = t.place(need, run.whole_ultraservers, trial)
        if placement is not None:
            for v in chosen_victims:
                v.evict()
            free |= trial
            return placement
    return None
