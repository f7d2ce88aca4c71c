"""The scheduler's policies: the queue order (FIFO, priority), EASY backfill and preemption,
as plain functions of the queue state they are given (they return or yield their decisions;
the scheduler applies them).

Placement (which instances) is `clustersim.cluster.placement`; the pass that applies these
policies is `clustersim.cluster.scheduler`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from clustersim.cluster.owners import FREE

if TYPE_CHECKING:
    from clustersim.cluster.jobrun import JobRun
    from clustersim.cluster.ports import ActiveSet, TeamRules
    from clustersim.cluster.queues import FairShareQueue, JobQueue

    WaitingQueue = JobQueue | FairShareQueue

__all__ = ["queue_key", "recovering_key", "runtime_floor", "reservation", "expected_returns",
           "easy_backfill", "preempt_for", "granted_below"]

# `count` instances, whole UltraServers or not, among the free ones (Timeline.place)
Placement = Callable[[int, bool, np.ndarray], "np.ndarray | None"]


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


def reservation(need: int, available: int,
                ends: Iterable[tuple[float, int]]) -> tuple[float, int]:
    """EASY backfill's reservation for the head of the queue, needing `need` instances with
    `available` free now: the earliest time enough are expected free (the shadow time; infinite
    when never), from `ends` ((time, instances back) in order of time: running jobs' expected
    ends, repairs), and the instances left over then beyond the head's."""
    shadow, extra = math.inf, available
    for end, count in ends:
        available += count
        if available >= need:
            shadow, extra = end, available - need
            break
    return shadow, extra


def expected_returns(ends: Iterator[tuple[float, int]], healthy: np.ndarray,
                     owner: np.ndarray, down_since_s: np.ndarray,
                     repair_s: float) -> Iterator[tuple[float, int]]:
    """(time, instances back to the pool) in order of time: the running jobs' `ends`
    (`ActiveJobs.expected_ends`) and the instances in repair, back at known times too."""
    down = np.flatnonzero(~healthy)
    if len(down) and math.isfinite(repair_s):
        back = down_since_s[down] + repair_s
        # (to the pool; a serving deployment's instance goes back to its deployment)
        ends = heapq.merge(ends, [(when, 1) for when in np.sort(back[owner[down] == FREE])
                                  .tolist()])
    return ends


def easy_backfill(head: JobRun, shadow: float, extra: int, rest: Iterator[JobRun],
                  free: np.ndarray, now: float, queue: WaitingQueue, teams: TeamRules,
                  place: Placement) -> Iterator[tuple[JobRun, np.ndarray]]:
    """EASY backfill around `head`'s reservation (`reservation`: the shadow time and the
    instances left over then): a later job (`rest`: the walk of the queue after the head)
    starts now if it ends before the shadow time, or uses only instances the reservation
    will not need. Yields each job to start with its instances (marked taken in `free`); the
    caller starts it before asking for the next (it leaves the queue and takes its team's
    quota, which the walk reads)."""
    free_count = int(np.count_nonzero(free))
    smallest = queue.smallest()
    # The fewest instances that did not fit, whole UltraServers or not: the pool only shrinks
    # during the walk and placement fails for every larger count once it fails for one, so
    # no larger job of that kind is tried again (the same starts, far fewer placements).
    refused = {True: math.inf, False: math.inf}
    # By team and size, only the jobs that could still start are visited: a team's jobs of
    # a size larger than the reservation leaves over, none of which would end before the
    # shadow time, are not (`extra` only falls), nor those over the free instances.
    def limit() -> float:
        return min(free_count, max(refused.values()) - 1)

    def viable(size: int, shortest: float) -> bool:
        return size <= extra or now + shortest <= shadow

    if hasattr(queue, "after"):
        rest = queue.after(head, limit, teams.room, viable)
    elif hasattr(rest, "narrowed"):  # fair share's walk (queues.FairShareWalk), team by team
        rest = rest.narrowed(limit, teams.room, viable)
    for run in rest:
        if free_count < smallest:
            return  # nothing that waits fits any more
        need = run.instances_needed
        if need > free_count or need >= refused[run.whole_ultraservers]:
            continue  # cannot fit now (place would refuse it)
        if not teams.admits(run):
            continue  # over its team's quota
        # Whether it may start, before where: a job that would still run at the head's start
        # needs the instances the head leaves over, and must not take the quota the head
        # needs. (Placing it first and then refusing it cost a placement per such job per
        # pass. A placement refused here is no different: placement fails for every larger
        # count once it fails for one, and the pool only shrinks during the walk.)
        ends_before = now + run.expected_duration() <= shadow
        if not ends_before and (need > extra or not teams.admits_beside(run, head)):
            continue
        chosen = place(need, run.whole_ultraservers, free)
        if chosen is None:
            refused[run.whole_ultraservers] = need
            continue
        if not ends_before:
            extra -= need
        free[chosen] = False
        free_count -= len(chosen)
        yield run, chosen  # started by the caller: it leaves the queue, the walk moves on


def preempt_for(run: JobRun, free: np.ndarray, need: int, active: ActiveSet,
                running: object, place: Placement, now: float | None = None,
                kept: tuple[dict, tuple] | None = None
                ) -> tuple[np.ndarray, list[JobRun]] | None:
    """The lower-priority jobs to evict (lowest priority, latest started first) until `run`
    fits, and the instances it would get once they are evicted; None when no eviction makes
    it fit. `running`: the simpy process this pass runs in (a job's own process, releasing
    instances as it recovers, cannot be interrupted from inside itself: it is no victim this
    time). At time `now`, a job whose run time or deadline ends then is no victim either:
    its instances come back at this instant anyway, and evicting it would throw away the
    work it has just finished. The caller evicts the victims and adds their instances to
    `free`. `kept`: (placements, a key standing for `free`) where placements on a trial
    (`free` and the victims' instances) are kept by that key and the victims' holdings
    (`Scheduler._place`: a blocked job tries the same victims at pass after pass)."""
    if active.lowest_priority() >= run.job.priority:
        return None  # nobody it outranks holds anything
    victims = (r for r in active.by_preemption_order(run.job.priority)
               if r.held_count and r.state != "done"
               and (running is None or r.process is not running)
               and (now is None or not r.ends_by(now)))
    first = next(victims, None)
    if first is None:
        return None
    victims = itertools.chain([first], victims)
    trial = free.copy()
    count = int(np.count_nonzero(trial))
    chosen_victims = []
    holdings: tuple = ()  # the victims' (index, holding's version), in order
    for victim in victims:
        held = victim.held
        count += int(np.count_nonzero(~trial[held]))
        trial[held] = True
        chosen_victims.append(victim)
        if kept is not None:
            holdings = (*holdings, (victim.index, victim.held_changes))
        if count < need:
            continue  # not enough yet: placement would refuse
        if kept is None:
            placement = place(need, run.whole_ultraservers, trial)
        else:
            placements, base = kept
            key = (base, "trial", need, run.whole_ultraservers, holdings)
            if key in placements:
                placement = placements[key]
            else:
                placement = placements[key] = place(need, run.whole_ultraservers, trial)
                if placement is not None:
                    placement.flags.writeable = False
        if placement is not None:
            return placement, chosen_victims
    return None


def granted_below(run: JobRun, active: ActiveSet) -> bool:
    """Whether a job `run` outranks was granted instances it has not taken up yet (its
    process takes them up later in this instant): no victim now, one once it holds them."""
    if active.lowest_priority() >= run.job.priority:
        return False
    return any(not r.held_count and r.backfill_count()
               for r in active.by_preemption_order(run.job.priority))
