"""Placement: which free healthy instances a job gets, topology-aware (few leaf switches,
whole UltraServers when its tensor parallelism spans them)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["pack", "pack_runs", "runs_of", "whole_units", "Placer"]


def pack(free_ids: np.ndarray, leaf_of: np.ndarray, count: int) -> np.ndarray | None:
    """`count` of the free ids under as few leaves as possible: the leaf that holds them most
    tightly, else the emptiest leaves first (ids ascending within a leaf)."""
    if len(free_ids) < count:
        return None
    if count <= 0:
        return np.empty(0, dtype=np.int64)
    leaves = leaf_of[free_ids]
    if len(leaves) > 1 and bool((leaves[1:] >= leaves[:-1]).all()):
        # Ids ascending under leaves numbered in id order (every caller's case): each leaf's
        # ids are one run, found in one pass (np.unique would sort them again).
        starts = np.concatenate(([0], np.flatnonzero(leaves[1:] != leaves[:-1]) + 1))
        counts = np.diff(np.append(starts, len(leaves)))
    else:
        _, starts, counts = np.unique(leaves, return_index=True, return_counts=True)
    fits = np.flatnonzero(counts >= count)
    if len(fits):
        best = fits[np.argmin(counts[fits])]
        return free_ids[starts[best]: starts[best] + count]
    chosen, got = [], 0
    for i in np.argsort(-counts, kind="stable").tolist():
        take = min(int(counts[i]), count - got)
        chosen.append(free_ids[starts[i]: starts[i] + take])
        got += take
        if got == count:
            break
    return np.sort(np.concatenate(chosen))


_WORDS = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_BYTE_ONES = np.uint64(0x0101010101010101)  # x this: a word's bytes summed in its top byte


def runs_of(leaf_of: np.ndarray) -> int:
    """The leaf size when `leaf_of` numbers leaves as whole runs of consecutive ids (leaf i:
    ids i x size .. i x size + size - 1), the geometry `pack_runs` packs; 0 otherwise."""
    n = len(leaf_of)
    if n == 0:
        return 0
    size = int(np.count_nonzero(leaf_of == leaf_of[0]))
    if n % size or not np.array_equal(leaf_of, np.arange(n) // size + leaf_of[0]):
        return 0
    return size


def _set_per_run(mask: np.ndarray, size: int) -> np.ndarray:
    """How many of each run of `size` consecutive booleans are set, 8 at a time where the
    run is whole words (each word's bytes summed by one multiplication), else 2 or 4."""
    if mask.dtype == np.bool_ and mask.flags.c_contiguous:
        if size % 8 == 0:
            words = (mask.view(np.uint64) * _BYTE_ONES) >> np.uint64(56)
            k = size // 8
            counts = words[0::k].copy()
            for j in range(1, k):
                counts += words[j::k]
            return counts.astype(np.int64)
        word = _WORDS.get(size)
        if word is not None:
            ones = word(int.from_bytes(b"\x01" * size, "little"))
            return ((mask.view(word) * ones) >> word(8 * (size - 1))).astype(np.int64)
    return mask.reshape(-1, size).sum(axis=1, dtype=np.int64)


def pack_runs(mask: np.ndarray, size: int, count: int) -> np.ndarray | None:
    """`pack(np.flatnonzero(mask), leaf_of, count)` when the leaves are whole runs of `size`
    consecutive ids (`runs_of`): the same ids, from each leaf's count of set ids (no list of
    every free id, no leaf looked up per id: most of a fleet's placements)."""
    per_leaf = _set_per_run(mask, size)
    if int(per_leaf.sum()) < count:
        return None
    if count <= 0:
        return np.empty(0, dtype=np.int64)
    # Leaves in leaf order (those with none set can neither fit nor come first below).
    fits = np.flatnonzero(per_leaf >= count)
    if len(fits):
        best = int(fits[np.argmin(per_leaf[fits])])
        return np.flatnonzero(mask[best * size: best * size + size])[:count] + best * size
    # The emptiest leaves first (ties in leaf order), all of each but the last one needed.
    present = np.flatnonzero(per_leaf)
    order = present[np.argsort(-per_leaf[present], kind="stable")]
    taken = np.cumsum(per_leaf[order])
    k = int(np.searchsorted(taken, count))  # the leaf that completes the count
    whole = order[:k]
    rows, cols = np.nonzero(mask.reshape(-1, size)[whole])
    last = int(order[k])
    rest = count - (int(taken[k - 1]) if k else 0)
    tail = np.flatnonzero(mask[last * size: last * size + size])[:rest] + last * size
    return np.sort(np.concatenate([whole[rows] * size + cols, tail]))


def whole_units(free: np.ndarray, n_units: int, per_unit: int) -> np.ndarray:
    """Which units (UltraServers) have all their instances free. With 2, 4 or 8 instances a
    unit, each unit's booleans are read as one machine word (all ones: 0x01 in every byte),
    one comparison a unit instead of a reduction over its instances."""
    block = free[: n_units * per_unit]
    word = _WORDS.get(per_unit)
    if word is not None and block.dtype == np.bool_ and block.flags.c_contiguous:
        return block.view(word) == word(int.from_bytes(b"\x01" * per_unit, "little"))
    return block.reshape(n_units, per_unit).all(axis=1)


class Placer:
    """Chooses instances on one cluster's geometry (instances per UltraServer and per leaf)."""

    def __init__(self, ipu: int, n_us: int, per_leaf: int, instance_leaf: np.ndarray,
                 ring: bool):
        self.ipu = ipu
        self.n_us = n_us
        self.per_leaf = per_leaf
        self.instance_leaf = instance_leaf
        self.ring = ring  # UltraServers joined by NeuronLink rings (Trn2 Z rings)
        self.unit_leaf = np.arange(n_us) * ipu // per_leaf  # each UltraServer's leaf
        # Leaves as runs of consecutive instances (and UltraServers): packed from counts
        # per leaf (`pack_runs`); 0: another geometry, packed id by id (`pack`).
        self.instance_run = runs_of(instance_leaf)
        self.unit_run = runs_of(self.unit_leaf)

    def place(self, count: int, whole_ultraservers: bool, free: np.ndarray
              ) -> np.ndarray | None:
        """Choose `count` free healthy instances, topology-aware: under as few leaf switches
        as possible (the leaf that fits it most tightly, else the emptiest leaves first),
        whole UltraServers when the job needs them; None when they are not there."""
        if (not whole_ultraservers and self.n_us and count % self.ipu == 0
                and self.ring):
            # A job the size of whole UltraServers takes whole ones when it can: its groups
            # then sit evenly on the Z rings.
            aligned = self.place(count, True, free)
            if aligned is not None:
                return aligned
        if whole_ultraservers:
            ipu = self.ipu
            units = whole_units(free, self.n_us, ipu)
            need = math.ceil(count / ipu)
            chosen_units = (pack_runs(units, self.unit_run, need) if self.unit_run
                            else pack(np.flatnonzero(units), self.unit_leaf, need))
            if chosen_units is None:
                return None
            return (chosen_units[:, None] * ipu + np.arange(ipu)[None, :]).ravel()[:count]
        if self.instance_run and len(free) == len(self.instance_leaf):
            return pack_runs(free, self.instance_run, count)
        return pack(np.flatnonzero(free), self.instance_leaf, count)
