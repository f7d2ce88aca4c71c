"""The timeline's free pool (clustersim.cluster.freepool), kept as owners and health change
(`Timeline.set_owner`, `Timeline.set_healthy`), equals a recount from the owner and health
arrays after any sequence of changes; its mask is handed out as a copy; a job ending in the
instant it was granted instances gives them back to the pool."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.cluster.freepool import FreePool
from clustersim.cluster.jobrun import JobRun
from clustersim.cluster.owners import FLUID, FREE, SERVING
from clustersim.cluster.timeline import Timeline
from clustersim.runner.api import step_profiles
from clustersim.scenario.loader import scenario_from_dict

INSTANCES = 12
PER_LEAF = 4


def _scenario(jobs: list[dict] | None = None, duration: str = "1d"):
    job = {"name": "train", "model": "llama2-7b", "seq_len": 2048, "global_batch": 64,
           "parallelism": {"tp": 8, "pp": 1, "dp": 8}, "recompute": "selective"}
    return scenario_from_dict({
        "name": "pool", "hardware": "trn2", "seed": 0, "duration": duration,
        "cluster": {"instances": INSTANCES, "fabric": {"instances_per_leaf": PER_LEAF}},
        "failures": {"preset": "none"}, "jobs": jobs or [job]})


def _timeline(scenario=None) -> Timeline:
    scenario = scenario or _scenario()
    return Timeline(scenario, step_profiles(scenario), np.random.SeedSequence(0))


def _assert_kept(t: Timeline) -> None:
    mask, per_leaf, count = t.free_pool.recount()
    assert np.array_equal(t.free_pool.mask, mask)
    assert np.array_equal(t.free_pool.per_leaf, per_leaf)
    assert t.free_pool.count == count
    assert np.array_equal(t.free_mask(), t.healthy & (t.owner == FREE))


_DISTINCT = st.lists(st.integers(0, INSTANCES - 1), max_size=6, unique=True)
_INDICES = st.one_of(
    st.integers(0, INSTANCES - 1),  # one index
    _DISTINCT,  # a list
    _DISTINCT.map(lambda xs: np.array(xs, dtype=np.int64)),
    st.lists(st.booleans(), min_size=INSTANCES, max_size=INSTANCES).map(np.array),  # a mask
)
_CHANGES = st.lists(st.one_of(
    st.tuples(st.just("owner"), _INDICES, st.sampled_from([FREE, SERVING, FLUID, 0, 3])),
    st.tuples(st.just("healthy"), _INDICES, st.booleans())), max_size=25)


@settings(max_examples=80, deadline=None)
@given(changes=_CHANGES)
def test_the_kept_pool_equals_a_recount_after_any_changes(changes):
    t = _timeline()
    _assert_kept(t)
    for kind, instances, value in changes:
        if kind == "owner":
            t.set_owner(instances, value)
        else:
            t.set_healthy(instances, value)
        _assert_kept(t)


def test_counts_per_leaf():
    t = _timeline()
    assert t.free_pool.count == INSTANCES
    assert t.free_pool.per_leaf.tolist() == [4, 4, 4]
    t.set_owner([0, 1, 5], 0)
    t.set_healthy(np.array([1, 2, 11]), False)  # 1: owned and down, counted out once
    assert t.free_pool.per_leaf.tolist() == [1, 3, 3]
    assert t.free_pool.count == 7
    t.set_owner([0, 1, 5], FREE)  # 1 still down
    assert t.free_pool.per_leaf.tolist() == [2, 4, 3]
    t.set_healthy(1, True)
    assert t.free_pool.per_leaf.tolist() == [3, 4, 3]
    assert t.free_pool.count == 10


def test_free_mask_is_a_copy():
    t = _timeline()
    free = t.free_mask()
    free[:] = False  # (the scheduler's passes mark what they grant in their copy)
    assert t.free_pool.mask.all() and t.free_mask().all() and t.free_pool.count == INSTANCES
    t.set_owner(3, 0)
    assert not free.any() and t.free_mask().sum() == INSTANCES - 1


def test_a_write_past_the_setters_is_caught_at_the_end():
    """Timeline.run checks the kept pool against a recount once the run is over."""
    t = _timeline()
    t.free_pool.check()
    t.owner[5] = 0  # (what set_owner is for)
    with pytest.raises(AssertionError, match="free pool: 12 kept, 11 counted"):
        t.free_pool.check()


def test_a_pool_built_on_arrays_counts_what_is_there():
    healthy = np.array([True, True, False, True, True, True])
    owner = np.array([FREE, 2, FREE, SERVING, FREE, FREE], dtype=np.int32)
    pool = FreePool(healthy, owner, np.arange(6) // 3, 2)
    assert pool.mask.tolist() == [True, False, False, False, True, True]
    assert pool.per_leaf.tolist() == [1, 2] and pool.count == 3
    pool.taken([])  # nothing changed: nothing to do
    pool.returned(np.array([], dtype=np.int64))
    assert pool.count == 3 and pool.per_leaf.tolist() == [1, 2]
    owner[1] = FREE
    pool.returned(np.array([True, True, True, False, False, False]))  # a mask: 1 comes free
    assert pool.mask.tolist() == [True, True, False, False, True, True] and pool.count == 4


def test_a_job_ending_in_the_instant_it_was_granted_gives_its_instances_back():
    """JobRun._finish of a job granted instances that its process has not taken up yet (its
    deadline came in that instant): they go back to the pool through `set_owner`."""
    job = {"name": "late", "model": "llama2-7b", "seq_len": 2048, "global_batch": 128,
           "parallelism": {"tp": 8, "pp": 1, "dp": 16}, "recompute": "selective",
           "instances": 2}
    s = _scenario([job])
    t = _timeline(s)
    profiles = step_profiles(s)
    run = JobRun(t, 0, s.jobs[0], profiles["late"])
    t.jobs = [run]
    run.granted = t.env.event()
    t.scheduler.queue.append(run)
    chosen = t.place(2, False)
    t.scheduler.start(run, chosen)  # granted: owned by the job, not yet held
    assert t.free_pool.count == INSTANCES - 2 and run.held_count == 0
    _assert_kept(t)
    run._finish("stopped at deadline", "its deadline came")
    assert t.free_pool.count == INSTANCES and (t.owner == FREE).all()
    _assert_kept(t)
