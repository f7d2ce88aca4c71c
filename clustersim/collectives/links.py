"""Costing a sequence of algorithm steps on the topology graph.

A step costs ``step_latency + route latency + max(link time, HBM time)``: the link time is
the heaviest directed link's bytes over its bandwidth x efficiency, from routing the step's
flows on the graph (so oversubscribed links, as mesh causes, cost what they cost); the HBM
time is the chip's memory traffic for the step over HBM bandwidth x efficiency.
"""

from __future__ import annotations

from collections import Counter

from clustersim.collectives.costs import Step
from clustersim.collectives.ops import FABRIC_KINDS
from clustersim.hardware.topology import Topology

__all__ = ["StepCoster"]


class StepCoster:
    """Link and HBM time of steps on one topology, with routed link loads cached."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.constants = topology.hardware.collectives
        self._link_time_cache: dict[tuple, tuple[float, float]] = {}

    def hbm_rate(self) -> float:
        return self.topology.hardware.chip.hbm_bandwidth_bytes_per_s * (
            self.constants.hbm_efficiency)

    def efficiency(self, kind: str) -> float:
        return self.constants.efa_efficiency if kind in FABRIC_KINDS else (
            self.constants.link_efficiency)

    def run(self, steps: list[Step], step_latency: float) -> tuple[float, float, int]:
        """(latency, transfer, step count) of a sequence of steps; a step that crosses no
        link (the ranks of one chip exchanging through HBM) costs the on-chip step latency."""
        latency = transfer = 0.0
        count = 0
        hbm = self.hbm_rate()
        on_chip = self.constants.chip_step_latency_s
        on_chip = step_latency if on_chip is None else on_chip
        for step in steps:
            link_time, route_latency = self.link_time(step.flows, step.flow_bytes)
            memory_time = step.hbm_bytes_per_chip / hbm
            fixed = step_latency if step.flows else on_chip
            latency += step.count * (fixed + route_latency)
            transfer += step.count * max(link_time, memory_time)
            count += step.count
        return latency, transfer, count

    def link_time(self, flows: list[tuple[int, int]], flow_bytes: float) -> tuple[float, float]:
        """(time for all flows to send flow_bytes at once, longest route latency)."""
        topo = self.topology
        if not flows or flow_bytes <= 0:
            latency = max((topo.path(a, b).latency_s for a, b in flows), default=0.0)
            return 0.0, latency
        key = (tuple(flows) if len(flows) < 2048 else (len(flows), flows[0], flows[-1]),)
        cached = self._link_time_cache.get(key)
        if cached is None:
            loads: Counter[tuple[int, int]] = Counter()
            latency = 0.0
            for a, b in flows:
                nodes = topo.route(a, b)
                for u, v in zip(nodes, nodes[1:], strict=False):
                    loads[(u, v)] += 1
                latency = max(latency, topo.path(a, b).latency_s)
            worst = 0.0  # seconds per byte of one flow on the busiest link
            for (u, v), count in loads.items():
                data = topo.edge(u, v)
                worst = max(worst, count / (data["bandwidth_bytes_per_s"] * self.efficiency(
                    data["kind"])))
            cached = (worst, latency)
            self._link_time_cache[key] = cached
        return cached[0] * flow_bytes, cached[1]
