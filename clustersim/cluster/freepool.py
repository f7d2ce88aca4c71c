"""The free pool of a timeline, kept incrementally: which instances are free (healthy and
owned by nobody, `owners.FREE`), how many, and how many under each leaf switch.

The scheduler reads the pool at every pass (its free mask to place jobs, its counts per leaf
for the fragmentation it records after each pass), and a year's fleet makes hundreds of
thousands of passes over 66,304 instances: recomputing `healthy & (owner == FREE)` and
recounting the leaves each time was a per-pass cost over the whole cluster. Here every change
of an instance's owner or health (`Timeline.set_owner`, `Timeline.set_healthy`, the only
writers of those arrays) updates the pool at the instances it touched (`taken`: owned or
down, none free; `returned`: unowned or repaired, free where both), so a read costs nothing
beyond a copy of the mask. The indices of one change must be distinct (each is counted once
per index given); `check`, at the end of every run, compares the pool with a recount.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clustersim.cluster.owners import FREE

__all__ = ["FreePool"]


class FreePool:
    """The free instances of `healthy` and `owner` (arrays it reads and never writes), and
    their counts: in all (`count`) and per leaf (`per_leaf`, by `instance_leaf`)."""

    def __init__(self, healthy: np.ndarray, owner: np.ndarray, instance_leaf: np.ndarray,
                 n_leaves: int):
        self._healthy = healthy
        self._owner = owner
        self._leaf = instance_leaf
        self.mask = healthy & (owner == FREE)  # kept: read it, never write it (free_mask)
        self.per_leaf = np.bincount(instance_leaf[self.mask], minlength=n_leaves).astype(
            np.int64)
        self.count = int(np.count_nonzero(self.mask))
        # Bumped at every change of the mask: what reads the pool may keep what it found
        # until it moves (Scheduler.record_state, after every pass, most of which change
        # nothing).
        self.version = 0

    def taken(self, instances: Any) -> None:
        """`instances` (an index, or distinct indices: a list or an array) were just made
        owned or down: none of them is free now."""
        if isinstance(instances, int | np.integer):
            if self.mask[instances]:
                self.mask[instances] = False
                self.per_leaf[self._leaf[instances]] -= 1
                self.count -= 1
                self.version += 1
            return
        idx = _indices(instances)
        were = idx[self.mask[idx]]
        if were.size:
            self.mask[were] = False
            np.subtract.at(self.per_leaf, self._leaf[were], 1)
            self.count -= were.size
            self.version += 1

    def returned(self, instances: Any) -> None:
        """`instances` (an index, or distinct indices) were just made unowned or healthy:
        those now both (and not free before) are free."""
        if isinstance(instances, int | np.integer):
            if (not self.mask[instances] and self._healthy[instances]
                    and self._owner[instances] == FREE):
                self.mask[instances] = True
                self.per_leaf[self._leaf[instances]] += 1
                self.count += 1
                self.version += 1
            return
        idx = _indices(instances)
        now = idx[~self.mask[idx]]
        if now.size:
            now = now[self._healthy[now] & (self._owner[now] == FREE)]
        if now.size:
            self.mask[now] = True
            np.add.at(self.per_leaf, self._leaf[now], 1)
            self.count += now.size
            self.version += 1

    def recount(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(mask, per leaf, count) recomputed from the arrays: what the kept ones must equal
        (tests)."""
        mask = self._healthy & (self._owner == FREE)
        per_leaf = np.bincount(self._leaf[mask], minlength=len(self.per_leaf))
        return mask, per_leaf, int(np.count_nonzero(mask))

    def check(self) -> None:
        """Raises AssertionError unless the kept pool equals a recount (a writer of `owner`
        or `healthy` that bypassed the timeline's setters, or indices given twice)."""
        mask, per_leaf, count = self.recount()
        if count != self.count or not (np.array_equal(mask, self.mask)
                                       and np.array_equal(per_leaf, self.per_leaf)):
            raise AssertionError(f"free pool: {self.count} kept, {count} counted")


def _indices(instances: Any) -> np.ndarray:
    """Indices as an integer array (from a list, an array of indices or a boolean mask)."""
    idx = np.asarray(instances)
    if idx.dtype == bool:
        return np.flatnonzero(idx)
    return idx if idx.dtype.kind in "iu" else idx.astype(np.int64)  # ([] reads as floats)
