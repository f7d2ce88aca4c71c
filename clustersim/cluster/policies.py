"""The scheduler's policies: the queue order (FIFO, priority), EASY backfill and preemption.

Placement (which instances) is `clustersim.cluster.placement`; the pass that applies these
policies is `clustersim.cluster.scheduler`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from clustersim.cluster.owners import FREE

if TYPE_CHECKING:
    from clustersim.cluster.jobrun import JobRun
    from clustersim.cluster.scheduler import Scheduler
    from clustersim.cluster.timeline import Timeline

__all__ = ["queue_key", "recovering_key", "easy_backfill", "preempt_for"]


def queue_key(policy: str, run: JobRun) -> tuple:
    """FIFO: by time queued; priority and backfill: the highest priority first, then FIFO."""
    if policy == "fifo":
        return (run.queued_at, run.index)
    return (-run.job.priority, run.queued_at, run.index)


def recovering_key(run: JobRun) -> tuple:
    """Recovering jobs go before every queued job, the highest priority first."""
    return (-math.inf, -run.job.priority, run.index)


def easy_backfill(scheduler: Scheduler, head: JobRun, need: int, rest: list[JobRun],
                  free: np.ndarray) -> None:
    """EASY backfill: `head` (needing `need` instances) gets a reservation at the earliest time
    enough are expected free (the shadow time); a later job starts now if it ends before then,
    or uses only instances the reservation will not need."""
    now = scheduler.t.env.now
    available = int(np.count_nonzero(free))
    # Instances per job from the owner array: a job just granted holds them already,
    # even before its process has taken them up.
    owners = scheduler.t.owner[scheduler.t.owner >= 0]
    held = np.bincount(owners, minlength=len(scheduler.t.jobs)) if len(owners) else np.zeros(
        len(scheduler.t.jobs), dtype=np.int64)
    ends = [(scheduler.t.jobs[j].expected_end(), int(held[j]))
            for j in np.flatnonzero(held).tolist() if j != head.index]
    # Instances in repair come back at known times too.
    down = np.flatnonzero(~scheduler.t.healthy)
    if len(down) and math.isfinite(scheduler.t.repair_s):
        back = scheduler.t.instance_down_since[down] + scheduler.t.repair_s
        # (to the pool; a serving deployment's instance goes back to its deployment)
        ends += [(float(t), 1) for t in back[scheduler.t.owner[down] == FREE].tolist()]
    ends.sort()
    shadow, extra = math.inf, available
    for end, count in ends:
        available += count
        if available >= need:
            shadow, extra = end, available - need
            break
    for run in rest:
        chosen = scheduler.t.place(run.instances_needed, run.whole_ultraservers, free)
        if chosen is None:
            continue
        ends_before = now + run.expected_duration() <= shadow
        if ends_before or run.instances_needed <= extra:
            if not ends_before:
                extra -= run.instances_needed
            scheduler.start(run, chosen)
            free[chosen] = False


def preempt_for(t: Timeline, run: JobRun, free: np.ndarray, need: int) -> np.ndarray | None:
    """Evict lower-priority jobs (lowest priority, latest started first) until `run` fits;
    the instances it would get, with the victims' added to `free`, or None (nobody evicted)."""
    # A job whose own process runs this pass (releasing instances as it recovers) cannot
    # be interrupted from inside itself: it is not a victim this time.
    active = t.env.active_process
    victims = sorted((r for r in t.jobs if r.held_count and r.state != "done"
                      and r.job.priority < run.job.priority
                      and (active is None or r.process is not active)),
                     key=lambda r: (r.job.priority, -(r.outcome.start_s or 0.0)))
    trial = free.copy()
    chosen_victims = []
    for victim in victims:
        trial[victim.held] = True
        chosen_victims.append(victim)
        placement = t.place(need, run.whole_ultraservers, trial)
        if placement is not None:
            for v in chosen_victims:
                v.evict()
            free |= trial
            return placement
    return None
