"""Routes on the topology graph: the node and link kinds, the route the hardware takes
between two chips (dimension order on the torus, the Z ring, the switch, or EFA through the
leaf and spine switches), and its hops, latency and bottleneck, cached by how the two chips
relate.

A part of Topology (`clustersim.hardware.topology`), which holds the graph and the per-chip
arrays these methods read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EDGE_KINDS", "NODE_KINDS", "PathSummary", "Routing"]

EDGE_KINDS = ("torus", "ring", "zring", "switch", "efa", "uplink", "gateway", "intersite",
              "backbone")
NODE_KINDS = ("chip", "switch", "leaf", "spine", "site", "backbone")


@dataclass(frozen=True)
class PathSummary:
    """A route between two chips: hops, summed latency and the narrowest link on it."""

    hops: int
    latency_s: float
    bottleneck_bytes_per_s: float
    kinds: tuple[str, ...]


class Routing:
    """Routes and paths between chips."""

    def route(self, a: int, b: int) -> list[int]:
        """Nodes on the route from chip a to chip b, as the hardware routes it.

        Inside an instance: dimension order on the torus (x, then y, shorter way round), or
        through the switch. Inside a ring UltraServer: along the Z ring first, then the torus.
        Otherwise over EFA: chip, leaf, (spine chosen by hashing the pair, as ECMP does), leaf,
        chip.
        """
        if a == b:
            return [a]
        hw = self.hardware
        ia, ib = int(self.chip_instance[a]), int(self.chip_instance[b])
        ua, ub = int(self.chip_ultraserver[a]), int(self.chip_ultraserver[b])
        if hw.switch_spans_ultraserver and ua == ub:
            return [a, self._switch_of(a), b]
        if ia == ib:
            return self._route_in_instance(a, b)
        if hw.ultraserver is not None and ua == ub:  # Z ring, then the torus of b's instance
            ipu, cpi = hw.instances_per_ultraserver, hw.chips_per_instance
            z, zb = int(self.chip_z[a]), int(self.chip_z[b])
            step = _ring_step(z, zb, ipu)
            path = [a]
            while z != zb:
                z = (z + step) % ipu
                path.append((ua * ipu + z) * cpi + a % cpi)
            return path + self._route_in_instance(path[-1], b)[1:]
        la, lb = int(self.chip_leaf[a]), int(self.chip_leaf[b])
        if la == lb:
            return [a, self.leaf_node(la), b]
        sa, sb = self.site_of(a), self.site_of(b)
        per_site = self.spines_per_site
        spine_a = self.spine_node(sa * per_site + (a + b) % per_site)
        if sa == sb:
            return [a, self.leaf_node(la), spine_a, self.leaf_node(lb), b]
        # Across sites: up to a spine of a's site, its gateway, the pair's link (or the
        # backbone), b's site gateway, down through a spine of b's site.
        spine_b = self.spine_node(sb * per_site + (a + b) % per_site)
        middle = [self.site_node(sa)]
        if not self.sites.direct(sa, sb):
            middle.append(self.site_node(self.sites.count))  # the backbone node
        middle.append(self.site_node(sb))
        return [a, self.leaf_node(la), spine_a, *middle, spine_b, self.leaf_node(lb), b]

    def _switch_of(self, chip: int) -> int:
        if self.hardware.switch_spans_ultraserver:
            return self.first_switch + int(self.chip_ultraserver[chip])
        return self.first_switch + int(self.chip_instance[chip])

    def _route_in_instance(self, a: int, b: int) -> list[int]:
        link = self.hardware.instance.interconnect
        if a == b:
            return [a]
        if link.topology == "switch":
            return [a, self._switch_of(a), b]
        cpi = self.hardware.chips_per_instance
        base = a - a % cpi
        if link.topology == "ring":
            dims = (cpi, 1)
        else:
            assert link.shape is not None
            dims = (link.shape[0], link.shape[1])
        x, y = (a - base) % dims[0], (a - base) // dims[0]
        xb, yb = (b - base) % dims[0], (b - base) // dims[0]
        path = [a]
        while x != xb:
            x = (x + _ring_step(x, xb, dims[0])) % dims[0]
            path.append(base + x + dims[0] * y)
        while y != yb:
            y = (y + _ring_step(y, yb, dims[1])) % dims[1]
            path.append(base + x + dims[0] * y)
        return path

    def _relation(self, a: int, b: int) -> tuple:
        """What a route's cost depends on: the level two chips share and their distances."""
        hw = self.hardware
        if a == b:
            return ("self",)
        same_instance = self.chip_instance[a] == self.chip_instance[b]
        same_us = hw.ultraserver is not None and self.chip_ultraserver[a] == self.chip_ultraserver[b]
        if hw.switch_spans_ultraserver and same_us:
            return ("switch",)
        link = hw.instance.interconnect
        if link.topology == "switch" and same_instance:
            return ("switch",)
        dims = (link.shape or (hw.chips_per_instance, 1))
        dx = _ring_distance(int(self.chip_x[a]), int(self.chip_x[b]), dims[0])
        dy = _ring_distance(int(self.chip_y[a]), int(self.chip_y[b]), dims[1])
        if same_instance:
            return ("instance", dx, dy)
        if same_us:
            dz = _ring_distance(int(self.chip_z[a]), int(self.chip_z[b]),
                                hw.instances_per_ultraserver)
            return ("ultraserver", dz, dx, dy)
        if self.chip_leaf[a] == self.chip_leaf[b]:
            return ("leaf",)
        sa, sb = self.site_of(a), self.site_of(b)
        return ("spine",) if sa == sb else ("site", sa, sb)

    def path(self, a: int, b: int) -> PathSummary:
        """Hops, latency and bottleneck of the route from a to b, cached by their relation."""
        key = self._relation(a, b)
        cached = self._path_cache.get(key)
        if cached is not None:
            return cached
        nodes = self.route(a, b)
        edges = [self.edge(u, v) for u, v in zip(nodes, nodes[1:], strict=False)]
        summary = PathSummary(
            hops=len(edges),
            latency_s=sum(e["latency_s"] for e in edges),
            bottleneck_bytes_per_s=min(
                (e["bandwidth_bytes_per_s"] for e in edges), default=math.inf
            ),
            kinds=tuple(e["kind"] for e in edges),
        )
        self._path_cache[key] = summary
        return summary


def _ring_distance(a: int, b: int, size: int) -> int:
    d = (b - a) % size
    return min(d, size - d)


def _ring_step(a: int, b: int, size: int) -> int:
    d = (b - a) % size
    return 1 if d <= size - d else -1
