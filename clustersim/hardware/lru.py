"""A dictionary of at most a given number of entries, the least recently used dropped first:
the step model's caches over a year of placements (each entry is recomputed the same way if
asked again, so a bound changes the time a run takes, not its figures); and a digest for the
large keys of such caches."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

__all__ = ["LruCache", "key_digest"]

_MISSING = object()  # (a cached value may be anything, None too)


class LruCache(OrderedDict):
    """`get`, `[]` and `in` as a dict; storing past `bound` entries drops the entry least
    recently stored or got."""

    def __init__(self, bound: int):
        if bound < 1:
            raise ValueError(f"bound {bound}: expected at least 1")
        super().__init__()
        self.bound = bound

    def get(self, key, default=None):
        # Two hashes of the key, not three (`in`, then the item): a step profile's key
        # holds the job's model and parallelism, hashed field by field at each look-up.
        found = super().get(key, _MISSING)
        if found is _MISSING:
            return default
        self.move_to_end(key)
        return found

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > self.bound:
            self.popitem(last=False)


def key_digest(data: Any) -> bytes:
    """A 128-bit digest standing for `data` (bytes, or a C-contiguous array's buffer) in a
    cache key: a spread job's chips are megabytes (the Rainier year's reduction cache held
    949 MiB of such keys after 10 days); two different arrays share a digest with
    probability 2^-128. SHA-256, cut to 128 bits: where the CPU has SHA instructions
    (x86 SHA-NI, Arm SHA2) about twice as fast as BLAKE2b, which was a fifth of the step
    solves of the year's first 30 days."""
    return hashlib.sha256(data).digest()[:16]
