"""KangaRing: the primaries of the chips' rank pairs on edge-disjoint Hamiltonian cycles of
the NeuronLink torus, each cycle run both ways."""

from __future__ import annotations

import networkx as nx

from clustersim.collectives.costs import Step
from clustersim.collectives.ops import NEURONLINK_KINDS
from clustersim.hardware.topology import Topology

__all__ = ["kangaring_steps", "CycleFinder"]


def kangaring_steps(op: str, cycles: list[list[int]], chips: list[int], k: int, buffer: float
                    ) -> list[Step]:
    """KangaRing over `cycles` (directed both ways), data split over them.

    Duplicated writes cut HBM accesses per chunk to 3 (all-gather) and 4 (reduce-scatter)
    per pair of ranks, against 4 and 6 for a ring."""
    members = len(chips) * k // 2
    directed = 2 * len(cycles)
    flows = []
    for cycle in cycles:
        hops = list(zip(cycle, cycle[1:] + cycle[:1], strict=True)) if len(cycle) > 1 else []
        flows += hops + [(b, a) for a, b in hops]
    chunk = buffer / members / directed
    primaries = k // 2
    copy = Step(members - 1, flows, chunk, 3 * chunk * primaries * directed)
    reduce = Step(members - 1, flows, chunk, 4 * chunk * primaries * directed)
    if op == "all-gather":
        return [copy]
    if op == "reduce-scatter":
        return [reduce]
    return [reduce, copy]


class CycleFinder:
    """Edge-disjoint Hamiltonian cycles of a set of chips on direct NeuronLink links,
    cached by the chips' local positions; the hardware ring when there is none."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self._cycles: dict[tuple, list[list[int]]] = {}

    def cycles(self, chips: list[int]) -> list[list[int]]:
        found = self.hamiltonian(chips)
        if not found:  # no cycle on direct links: the hardware ring, routed, both ways
            found = [[int(c) for c in self.topology.ring_order(chips)]]
        return found

    def hamiltonian(self, chips: list[int]) -> list[list[int]]:
        cpi = self.topology.hardware.chips_per_instance
        key = tuple(c % cpi for c in chips)
        base = chips[0] - chips[0] % cpi
        if key not in self._cycles:
            local = [c - base for c in chips]
            graph = nx.Graph()
            graph.add_nodes_from(local)
            members = set(chips)
            for u, v, data in (e for c in chips for e in self.topology.chip_edges(c)):
                if data["kind"] in NEURONLINK_KINDS and data["kind"] != "switch" and (
                        v in members):
                    graph.add_edge(u - base, v - base)
            self._cycles[key] = edge_disjoint_hamiltonian_cycles(graph)
        return [[c + base for c in cycle] for cycle in self._cycles[key]]


def edge_disjoint_hamiltonian_cycles(graph: nx.Graph, budget: int = 200_000) -> list[list[int]]:
    """As many edge-disjoint Hamiltonian cycles as the minimum degree allows (d // 2), found
    by depth-first search that backtracks over the choice of earlier cycles; within a work
    budget, the largest set found is returned (the 4x4 torus gives its 2)."""
    if graph.number_of_nodes() < 3:
        return []
    wanted = min(d for _, d in graph.degree) // 2
    work = [budget]
    best: list[list[int]] = []
    for count in range(wanted, 0, -1):
        found = _decompose(graph, count, work)
        if found:
            best = found
            break
        if work[0] <= 0:
            break
    return best


def _decompose(graph: nx.Graph, count: int, work: list[int]) -> list[list[int]] | None:
    start = min(graph.nodes)
    for cycle in _hamiltonian_cycles(graph, start, work):
        if count == 1:
            return [cycle]
        rest = graph.copy()
        rest.remove_edges_from(zip(cycle, cycle[1:] + cycle[:1], strict=True))
        if count == 2 and all(d == 2 for _, d in rest.degree):  # 2-regular: one cycle or none
            if nx.is_connected(rest):
                return [cycle, _walk_cycle(rest, start)]
            continue
        others = _decompose(rest, count - 1, work)
        if others:
            return [cycle] + others
        if work[0] <= 0:
            return None
    return None


def _walk_cycle(graph: nx.Graph, start: int) -> list[int]:
    cycle, previous, node = [start], None, start
    while True:
        nxt = next(v for v in sorted(graph[node]) if v != previous)
        if nxt == start:
            return cycle
        cycle.append(nxt)
        previous, node = node, nxt


def _hamiltonian_cycles(graph: nx.Graph, start: int, work: list[int]):
    """Hamiltonian cycles through `start`, each once per direction, lazily; counts work."""
    n = graph.number_of_nodes()
    path = [start]
    on_path = {start}
    stack = [iter(sorted(graph[start]))]
    while stack and work[0] > 0:
        work[0] -= 1
        advanced = False
        for nxt in stack[-1]:
            if nxt in on_path:
                continue
            if len(path) == n - 1:
                if graph.has_edge(nxt, start) and path[1] < nxt:  # one of the two directions
                    yield path + [nxt]
                continue
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(sorted(graph[nxt])))
            advanced = True
            break
        if not advanced:
            stack.pop()
            on_path.discard(path.pop())
            if not path:
                return
