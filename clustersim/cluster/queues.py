"""The scheduler's queue of waiting jobs, kept in order as jobs come and go.

A pass of the scheduler walks the queue from its head and stops at the first job that does
not fit (FIFO, priority) or tries the rest for backfill: it must not sort or rescan every
waiting job at every pass. Jobs are kept sorted by their queue key (fixed while a job
waits: priority, time queued, index) in a list updated by bisection, and the sizes waiting
are counted so a backfill pass stops as soon as nothing that waits can fit.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustersim.cluster.jobrun import JobRun

__all__ = ["JobQueue"]


class JobQueue:
    """Waiting jobs in queue order (`key(run)`, unique per job: it ends with the index)."""

    def __init__(self, key: Callable[[JobRun], tuple]):
        self.key = key
        self._keys: list[tuple] = []
        self._runs: dict[int, JobRun] = {}
        self._key_of: dict[int, tuple] = {}
        self.sizes: Counter = Counter()  # instances needed -> jobs waiting

    def append(self, run: JobRun) -> None:
        """Queue a job (its key is taken now and kept while it waits)."""
        if run.index in self._runs:
            return
        key = self.key(run)
        bisect.insort(self._keys, key)
        self._runs[run.index] = run
        self._key_of[run.index] = key
        self.sizes[run.instances_needed] += 1

    def remove(self, run: JobRun) -> None:
        key = self._key_of.pop(run.index)
        del self._runs[run.index]
        del self._keys[bisect.bisect_left(self._keys, key)]
        self.sizes[run.instances_needed] -= 1
        if not self.sizes[run.instances_needed]:
            del self.sizes[run.instances_needed]

    def discard(self, run: JobRun) -> None:
        if run.index in self._runs:
            self.remove(run)

    def __contains__(self, run: object) -> bool:
        return getattr(run, "index", None) in self._runs and self._runs[run.index] is run

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[JobRun]:
        return (self._runs[key[-1]] for key in list(self._keys))

    def smallest(self) -> int:
        """The fewest instances any waiting job needs (0 when none waits)."""
        return min(self.sizes) if self.sizes else 0

    def at(self, position: int) -> JobRun:
        """The job at this position (0: the head). A pass walks the queue by position: a job
        it starts leaves the queue, and the next one moves up to its position."""
        return self._runs[self._keys[position][-1]]
