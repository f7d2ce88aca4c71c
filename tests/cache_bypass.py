"""The event-driven fleet's kept answers bypassed (tests only): every cache the Rainier
year's caching work added (`tests/test_year10_caches.py`) is swapped for the computation it
stands for, so a run with them and a run without can be compared byte for byte.

    with caches_bypassed():
        ...  # runs here place, shape and share afresh every time

Bypassed: the scheduler's placements per free-pool state and preemption's trial placements
(`Scheduler._place`, `Scheduler._preempt`), `placement_shape`'s last answer,
`spread_shape`'s kept answers, the inter-site speeds by links (`sites._SPEEDS_KEPT`), the
JobQueue's kept group heads (the heap walk of every group instead), a job's held instances
taken from its first placement, and the collector's frozen heap (`heap_frozen`,
`freeze_heap`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["caches_bypassed"]


class _NeverKept(dict):
    """A dict that keeps nothing: every look-up misses."""

    def get(self, key: Any, default: Any = None) -> Any:
        return default

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def _always(size: int, shortest: float) -> bool:
    return True


@contextlib.contextmanager
def caches_bypassed() -> Iterator[None]:
    from clustersim.cluster import job_accounting, queues, scheduler, timeline
    from clustersim.cluster import sites as cluster_sites
    from clustersim.runner import api
    from clustersim.training import shape, step

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    def place(self, changes, need, run, free, held=False):
        return self.t.place(need, run.whole_ultraservers, free,
                            run.held_mask if held else None)

    preempt = scheduler.Scheduler._preempt

    def preempt_afresh(self, run, free, need, changes=None):
        return preempt(self, run, free, need, None)

    after = queues.JobQueue.after

    def heap_walk(self, run, limit, room=None, viable=None):
        return after(self, run, limit, room, _always if viable is None else viable)

    add = job_accounting.JobAccounting.add

    def add_afresh(self, instances):
        add(self, instances)
        self._held_ids = None  # (found again in the mask, as before)

    patch(scheduler.Scheduler, "_place", place)
    patch(scheduler.Scheduler, "_preempt", preempt_afresh)
    patch(step, "placement_shape", shape._placement_shape)
    patch(shape, "_SPREAD_KEPT", _NeverKept())
    patch(cluster_sites, "_SPEEDS_KEPT", _NeverKept())
    patch(queues.JobQueue, "after", heap_walk)
    patch(job_accounting.JobAccounting, "add", add_afresh)
    patch(api, "heap_frozen", contextlib.nullcontext)
    patch(api, "freeze_heap", lambda: None)
    patch(timeline, "freeze_heap", lambda: None)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
