"""The reduction cache's key for data-parallel groups spread over several sites, computed
from the groups' ranks and the placement without the groups' chips.

Over several sites `GradientReduction` keys a reduction by the groups' chips themselves (a
digest of them): a spread job's groups hold every chip it has (a 8,192-instance job's 128
groups, a million chips), and each placement of a spread job that no step was solved for
(a replacement that moves an instance to another site) computed those chips, hashed them
and looked at each chip's site, most of a new shape's solve in the Rainier year. The chips
are `rank_chips`: chip = placed[instance] x chips per instance + chip in the instance, with
`instance` and `chip in the instance` functions of the ranks alone. So the same key comes
from the ranks' part, computed once per kind of groups (`GroupsOfRanks.ranks_digest`), and
the instances the groups use, `placed[used]`: `chips_key` is a function of the chips that
keeps them apart (equal chips, equal key; other chips, another key, up to the digest), and
`SpreadKeys.key` computes that same function from the ranks when the placement holds
distinct instances (as every placement does): then two ranks' chips are equal exactly when
their instances and chips in the instance are. The groups' classes of equal chips, and
whether the first group has a chip per instance, come from the ranks alike
(tests/test_spread_groups.py checks each against the chips).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np

from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.lru import LruCache, key_digest

__all__ = ["GroupsOfRanks", "SpreadClasses", "SpreadKeys", "chips_key"]

KINDS_KEPT = 1_024  # kinds of groups (a job's shape, pipeline rank, shard or hybrid) kept


class GroupsOfRanks:
    """Groups of ranks, one a row: `rows[i] + cols` (an outer sum, as a pipeline rank's
    shard groups are: base + TP rank + the data-parallel offsets), or a matrix as given."""

    def __init__(self, rows: np.ndarray | None = None, cols: np.ndarray | None = None,
                 matrix: np.ndarray | None = None):
        self.rows, self.cols, self._matrix = rows, cols, matrix

    @property
    def shape(self) -> tuple[int, int]:
        if self._matrix is not None:
            return self._matrix.shape
        return len(self.rows), len(self.cols)

    def matrix(self) -> np.ndarray:
        if self._matrix is None:
            self._matrix = self.rows[:, None] + self.cols[None, :]
        return self._matrix

    def row(self, i: int) -> np.ndarray:
        return self._matrix[i] if self._matrix is not None else self.rows[i] + self.cols

    def kind(self) -> bytes:
        """A digest standing for the ranks (the same ranks, the same digest)."""
        if self._matrix is not None:
            return b"m" + key_digest(np.ascontiguousarray(self._matrix))
        return (b"o" + key_digest(np.ascontiguousarray(self.rows))
                + key_digest(np.ascontiguousarray(self.cols)))


class SpreadClasses(NamedTuple):
    """The groups' classes of equal chips: (first row, rows) each in order of first row;
    whether the first group holds one chip per instance; how many instances it spans."""

    members: list[tuple[int, int]]
    own_instances: bool
    first_instances: int


class _Kind(NamedTuple):
    used: np.ndarray  # the instances (indices into the placement) in order of first use
    ranks_digest: bytes
    classes: SpreadClasses


def chips_key(chips: np.ndarray, chips_per_instance: int) -> tuple:
    """A key of the groups' chips (one row a group) that two chips arrays share exactly
    when they are equal (up to a 128-bit digest): the shape, and a digest of each chip's
    instance renamed by first appearance, its chip in the instance, and the instances in
    order of first appearance (from which the chips are rebuilt)."""
    instances = (chips // chips_per_instance).ravel()
    labels, first = _first_seen(instances)
    digest = _ranks_digest(labels.reshape(chips.shape), chips % chips_per_instance)
    return chips.shape, key_digest(digest + instances[first].tobytes())


def _first_seen(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each id renamed by the order of its first appearance, and the position of each
    name's first appearance: [7, 3, 7, 9] -> [0, 1, 0, 2], [0, 1, 3]."""
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(first), dtype=np.int64)
    rank[order] = np.arange(len(first))
    return rank[inverse.ravel()], first[order]


def _ranks_digest(labels: np.ndarray, within: np.ndarray) -> bytes:
    digest = hashlib.sha256(np.ascontiguousarray(labels, dtype=np.int64))
    digest.update(np.ascontiguousarray(within, dtype=np.int64))
    return digest.digest()[:16]


class SpreadKeys:
    """`chips_key` of groups' chips from their ranks, for groups over several sites."""

    def __init__(self, hardware: HardwareSpec, instance_site: np.ndarray | None):
        """`instance_site`: each instance's site (None: every placement is keyed so)."""
        self.hardware = hardware
        self.instance_site = instance_site
        self._kinds: LruCache = LruCache(KINDS_KEPT)

    def key(self, groups: GroupsOfRanks, placed: np.ndarray
            ) -> tuple[tuple, SpreadClasses] | None:
        """(`chips_key` of the groups' chips, their classes), or None when the groups are in
        one site (keyed otherwise) or the placement repeats an instance."""
        if len(placed) > 1 and not bool((placed[1:] > placed[:-1]).all()) and len(
                np.unique(placed)) != len(placed):
            return None
        kind = self._kind(groups)
        instances = np.asarray(placed, dtype=np.int64)[kind.used]
        if self.instance_site is not None:
            sites = self.instance_site[instances]
            if bool((sites == sites[0]).all()):
                return None
        return ((groups.shape, key_digest(kind.ranks_digest + instances.tobytes())),
                kind.classes)

    def _kind(self, groups: GroupsOfRanks) -> _Kind:
        name = groups.kind()
        found = self._kinds.get(name)
        if found is None:
            found = self._kinds[name] = self._new_kind(groups.matrix())
        return found

    def _new_kind(self, ranks: np.ndarray) -> _Kind:
        hw = self.hardware
        rpi = hw.ranks_per_instance
        instance = ranks // rpi
        within = (ranks % rpi) // hw.chip.ranks  # as `rank_chips` has it
        labels, first = _first_seen(instance.ravel())
        labels = labels.reshape(ranks.shape)
        members: dict[bytes, list[int]] = {}
        for i in range(len(ranks)):
            # two groups' chips are equal when their instances and chips in them are
            row = labels[i].tobytes() + within[i].tobytes()
            members.setdefault(row, [i, 0])[1] += 1
        spans = len(np.unique(instance[0]))
        classes = SpreadClasses([(i, n) for i, n in members.values()],
                                spans == ranks.shape[1], spans)
        return _Kind(instance.ravel()[first], _ranks_digest(labels, within), classes)
