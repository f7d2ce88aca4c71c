"""What the Rainier year's caches keep (issue 33) answers as the computation they stand for,
and stays bounded: spread_shape's last answers, the scheduler's placements per pool state,
the inter-site speeds by links, and the collector's frozen heap."""

from __future__ import annotations

import gc

import numpy as np

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
