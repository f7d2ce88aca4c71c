"""Rings over groups of chips that follow the hardware (leaf by leaf, UltraServer by
UltraServer, a snake over each instance's torus), costed on the links their hops share and
cached by the group's shape.

A part of Topology (`clustersim.hardware.topology`), which holds the graph and the per-chip
arrays these methods read.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from clustersim.hardware.routing import EDGE_KINDS

__all__ = ["Ring", "Rings"]


@dataclass(frozen=True)
class Ring:
    """A ring over a group of chips, in order, costed on the links it shares."""

    order: tuple[int, ...]
    bottleneck_bytes_per_s: float  # per direction, narrowest link share along the ring
    max_hop_latency_s: float
    link_kinds: tuple[str, ...]
    max_link_load: int  # ring hops crossing the busiest directed link


class Rings:
    """Rings over groups of chips."""

    def ring_order(self, chips: Any) -> np.ndarray:
        """A ring over a group that follows the hardware: leaf by leaf, UltraServer by
        UltraServer, instance by instance along the Z ring, each instance in a snake over its
        torus (reversed on odd z so consecutive instances meet on a Z link)."""
        group = np.unique(np.asarray(chips, dtype=np.int64))
        cpi = self.hardware.chips_per_instance
        link = self.hardware.instance.interconnect
        width = link.shape[0] if link.shape else cpi
        local = group % cpi
        x, y = local % width, local // width
        snake = y * width + np.where(y % 2 == 0, x, width - 1 - x)
        z = self.chip_z[group]
        snake = np.where(z % 2 == 0, snake, cpi - 1 - snake)
        keys = (snake, z, self.chip_ultraserver[group], self.chip_leaf[group])
        return group[np.lexsort(keys)]

    def ring(self, chips: Any) -> Ring:
        """The ring over a group of chips and its bottleneck share of the links, per direction.

        Each ring hop is routed; hops that cross the same directed link share it, so the
        bottleneck is min over links of bandwidth / hops using it. Cached by the group's shape.
        """
        group = np.unique(np.asarray(chips, dtype=np.int64))
        key = self._shape_key(group)
        if key is not None and self.chip_site is not None:
            sites = np.unique(self.chip_site[group])
            if len(sites) > 1:  # across sites: which sites (their links differ)
                key = (*key, tuple(sites.tolist()))
        if key is not None and key in self._ring_cache:
            cached = self._ring_cache[key]
            order = tuple(int(c) for c in self.ring_order(group))
            return Ring(order, cached.bottleneck_bytes_per_s, cached.max_hop_latency_s,
                        cached.link_kinds, cached.max_link_load)
        order = self.ring_order(group)
        loads: Counter[tuple[int, int]] = Counter()
        max_latency = 0.0
        n = len(order)
        for i in range(n if n > 1 else 0):
            a, b = int(order[i]), int(order[(i + 1) % n])
            nodes = self.route(a, b)
            for u, v in zip(nodes, nodes[1:], strict=False):
                loads[(u, v)] += 1
            max_latency = max(max_latency, self.path(a, b).latency_s)
        if loads:
            shares = []
            kinds = set()
            for (u, v), count in loads.items():
                data = self.edge(u, v)
                shares.append(data["bandwidth_bytes_per_s"] / count)
                kinds.add(data["kind"])
            bottleneck = min(shares)
            max_load = max(loads.values())
        else:
            bottleneck, kinds, max_load = math.inf, set(), 0
        ring = Ring(tuple(int(c) for c in order), bottleneck, max_latency,
                    tuple(k for k in EDGE_KINDS if k in kinds), max_load)
        if key is not None:
            self._ring_cache[key] = ring
        return ring

    def _shape_key(self, group: np.ndarray) -> tuple | None:
        """A key equal for groups that are translations of one another on the hardware.

        Regular groups (the same local chips in every instance, the same instances in every
        UltraServer, the same number of UltraServers under each leaf) have a key; others
        return None and are computed without caching.
        """
        cpi = self.hardware.chips_per_instance
        instances = group // cpi
        inst_ids, starts = np.unique(instances, return_index=True)
        locals_first = tuple(int(c) for c in group[instances == inst_ids[0]] % cpi)
        counts = np.diff(np.append(starts, len(group)))
        if np.any(counts != len(locals_first)):
            return None
        local_all = (group % cpi).reshape(len(inst_ids), len(locals_first))
        if np.any(local_all != local_all[0]):
            return None
        us = self.chip_ultraserver[inst_ids * cpi]
        zs = self.chip_z[inst_ids * cpi]
        us_ids, us_starts = np.unique(us, return_index=True)
        z_sets = Counter(
            tuple(zs[s:e]) for s, e in zip(us_starts, np.append(us_starts[1:], len(zs)),
                                          strict=False)
        )
        if len(z_sets) != 1:
            return None
        leaves = self.chip_leaf[us_ids * cpi * self.hardware.instances_per_ultraserver]
        per_leaf = Counter(Counter(leaves.tolist()).values())
        return (locals_first, next(iter(z_sets)), tuple(sorted(per_leaf.items())))
