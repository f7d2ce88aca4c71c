"""The scheduler's policies are plain functions of the queue state they are given: they run
here on hand-made state, with no Timeline or Scheduler, and only return their decisions."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from clustersim.cluster.owners import FREE, SERVING
from clustersim.cluster.policies import easy_backfill, expected_returns, preempt_for, reservation


def first_free(count: int, whole_ultraservers: bool, free: np.ndarray) -> np.ndarray | None:
    ids = np.flatnonzero(free)
    return ids[:count] if len(ids) >= count else None


def test_the_reservation_is_the_first_time_enough_come_back():
    ends = [(10.0, 1), (20.0, 2), (30.0, 4)]
    assert reservation(5, 2, iter(ends)) == (20.0, 0)  # 2 + 1 + 2
    assert reservation(6, 2, iter(ends)) == (30.0, 3)  # 2 + 1 + 2 + 4, 3 over
    assert reservation(2, 2, iter(ends)) == (10.0, 1)  # (free now: the first end still)
    assert reservation(10, 2, iter(ends)) == (math.inf, 2)  # never


def test_repairs_come_back_to_the_pool_in_order():
    healthy = np.array([True, False, False, False])
    owner = np.array([FREE, FREE, SERVING, FREE])
    down_since = np.array([0.0, 50.0, 0.0, 10.0])
    merged = list(expected_returns(iter([(40.0, 2)]), healthy, owner, down_since, 100.0))
    # the serving instance goes back to its deployment, not to the pool
    assert merged == [(40.0, 2), (110.0, 1), (150.0, 1)]
    assert list(expected_returns(iter([(40.0, 2)]), healthy, owner, down_since, math.inf)) == [
        (40.0, 2)]


def job(index: int, need: int, duration: float, priority: int = 0, held=()):
    return SimpleNamespace(index=index, instances_needed=need, whole_ultraservers=False,
                           team="t", expected_duration=lambda: duration,
                           job=SimpleNamespace(priority=priority),
                           held=np.asarray(held, dtype=np.int64), held_count=len(held),
                           state="running", process=None)


def test_backfill_yields_the_jobs_that_may_start_and_changes_nothing_else():
    head = job(0, 8, math.inf)
    ends_first, too_long, fits_beside = job(1, 2, 50.0), job(2, 2, 200.0), job(3, 1, 200.0)
    free = np.array([True] * 4 + [False] * 4)
    queue = SimpleNamespace(smallest=lambda: 1)  # no `after`: the walk given is used
    teams = SimpleNamespace(admits=lambda run: True, admits_beside=lambda run, ahead: True)
    starts = list(easy_backfill(head, 100.0, 1, iter([ends_first, too_long, fits_beside]),
                                free, 0.0, queue, teams, first_free))
    # the first ends before the shadow time; the second would run past it and needs more
    # than the one instance the reservation leaves over; the third uses that one
    assert [(run.index, chosen.tolist()) for run, chosen in starts] == [(1, [0, 1]), (3, [2])]
    assert free.tolist() == [False, False, False, True] + [False] * 4


def test_preemption_names_its_victims_and_evicts_none():
    low, lower = job(1, 2, math.inf, priority=1, held=[0, 1]), job(2, 2, math.inf, 0, [2, 3])
    active = SimpleNamespace(lowest_priority=lambda: 0,
                             by_preemption_order=lambda below: iter([lower, low]))
    free = np.zeros(4, dtype=bool)
    placement, victims = preempt_for(job(9, 3, 1.0, priority=5), free, 3, active, None,
                                     first_free)
    assert placement.tolist() == [0, 1, 2] and victims == [lower, low]
    assert not free.any() and lower.held_count == 2  # applying it is the caller's
    # nobody it outranks: no decision
    assert preempt_for(job(9, 3, 1.0, priority=0), free, 3, active, None, first_free) is None
