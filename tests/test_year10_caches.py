"""What the Rainier year's caches keep (issue 33) answers as the computation they stand for,
and stays bounded: spread_shape's last answers, the scheduler's placements per pool state,
the inter-site speeds by links, and the collector's frozen heap."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from clustersim.cluster.sites import max_min_speeds
from clustersim.cluster.timeline import freeze_heap, heap_frozen
from clustersim.training import shape


class _Sites:
    first_instance = np.array([0, 8, 16, 24])


class _Hardware:
    chips_per_instance = 2


class _Topology:
    """Three sites of 8 instances (2 chips each), as spread_shape reads a topology."""

    hardware = _Hardware()
    sites = _Sites()
    chip_site = np.repeat(np.arange(3), 16)


def _read_only(ids):
    placed = np.array(ids, dtype=np.int64)
    placed.flags.writeable = False
    return placed


def test_spread_shape_kept_answers_equal_fresh_ones_and_stay_bounded():
    topology = _Topology()
    rng = np.random.default_rng(3)
    for _ in range(100):
        ids = np.sort(rng.choice(24, size=int(rng.integers(2, 20)), replace=False))
        if ids[0] // 8 == ids[-1] // 8:
            continue
        placed = _read_only(ids)
        split, canonical = shape.spread_shape(topology, placed)
        again = shape.spread_shape(topology, placed)
        fresh = shape.spread_shape(topology, ids.copy())  # writeable: never kept
        assert again[0] == split == fresh[0]
        assert np.array_equal(again[1], fresh[1]) and np.array_equal(canonical, fresh[1])
        sites, counts = np.unique(ids // 8, return_counts=True)
        assert split == tuple(zip(sites.tolist(), counts.tolist(), strict=True))
        assert len(shape._SPREAD_KEPT) <= shape._SPREAD_KEEP
    assert shape.spread_shape(topology, _read_only([1, 2, 3])) is None  # one site


def test_kept_inter_site_speeds_are_max_min_speeds():
    from clustersim.cluster import sites

    uses = [frozenset({("a", "b")}), frozenset({("a", "b"), ("b", "c")}), frozenset()]
    assert max_min_speeds([set(u) for u in uses]) == [0.5, 0.5, 1.0]
    assert len(sites._SPEEDS_KEPT) <= sites._SPEEDS_KEEP


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_heap_frozen_freezes_until_the_outermost_block_ends():
    assert gc.get_freeze_count() == 0
    with heap_frozen():
        assert gc.get_freeze_count() > 0
        with heap_frozen():
            made = [[] for _ in range(1000)]
            freeze_heap()
            assert gc.get_freeze_count() >= 1000
        assert gc.get_freeze_count() > 0  # (the inner block's end unfreezes nothing)
        del made
    assert gc.get_freeze_count() == 0
    freeze_heap()  # outside any block: nothing frozen
    assert gc.get_freeze_count() == 0


class _Job:
    def __init__(self, priority):
        self.priority = priority


class _Run:
    def __init__(self, index, team, size, priority, queued_at):
        self.index, self.team, self.instances_needed = index, team, size
        self.job, self.queued_at = _Job(priority), queued_at


def test_a_walk_from_the_head_is_the_heap_walk_of_every_group():
    """JobQueue.after(None, ...) merges the kept first keys of the groups: the same jobs in
    the same order as the walk over a heap of every group's first key (what `viable`, here
    always true, still takes), with the walker starting (removing) some jobs it is given
    and the teams' room falling as it goes."""
    from clustersim.cluster.queues import JobQueue

    rng = np.random.default_rng(7)
    queue = JobQueue(lambda run: (-run.job.priority, run.queued_at, run.index))
    runs, index = {}, 0
    for _ in range(60):
        for _ in range(int(rng.integers(1, 30))):  # arrivals
            run = _Run(index, f"t{rng.integers(4)}", int(rng.choice([1, 2, 4, 8, 64])),
                       int(rng.integers(3)), float(rng.integers(50)))
            runs[index] = run
            queue.append(run)
            index += 1
        for i in rng.permutation(list(runs))[: int(rng.integers(0, 10))].tolist():
            queue.remove(runs.pop(i))  # departures
        walks = []
        rooms = {f"t{t}": float(rng.integers(1, 80)) for t in range(4)}
        for heap_walk in (False, True):
            room = dict(rooms)
            room_rng = np.random.default_rng(index)
            walk = queue.after(None, lambda: 70.0, room.__getitem__,
                               (lambda size, shortest: True) if heap_walk else None)
            seen = []
            for run in walk:
                seen.append(run.index)
                if room_rng.random() < 0.3:  # started: out of the queue, its team's room falls
                    queue.remove(run)
                    room[run.team] -= run.instances_needed
            walks.append(seen)
            for i in seen:  # back for the other walk
                if i not in queue._runs:
                    queue.append(runs[i])
        assert walks[0] == walks[1]
        assert queue._heads == sorted((keys[0], *group) for group, keys in queue._groups.items())
