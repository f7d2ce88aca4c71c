"""Recursive halving and doubling (RDH) among the chips of an instance."""

from __future__ import annotations

from dataclasses import replace

from clustersim.collectives.costs import Step
from clustersim.collectives.ops import COPY_ACCESSES, REDUCE_ACCESSES
from clustersim.hardware.topology import Topology

__all__ = ["rdh_steps", "hypercube_index", "gray"]


def rdh_steps(topology: Topology, op: str, chips: list[int], k: int, buffer: float
              ) -> list[Step]:
    """Recursive halving then doubling among chips seen as a hypercube (the 4x4 torus is
    a 4D hypercube: Gray-coded coordinates make every partner a direct neighbour); the
    ranks of a chip first reduce (and last broadcast) among themselves."""
    index = hypercube_index(topology, chips)
    by_index = {i: c for c, i in index.items()}
    p = len(chips)
    dims = p.bit_length() - 1
    halving, doubling = [], []
    for j in range(dims):
        flows = [(c, by_index[i ^ (1 << j)]) for c, i in index.items()]
        sent = buffer / (2 ** (j + 1))  # per chip, over its k parallel groups
        halving.append(Step(1, flows, sent, REDUCE_ACCESSES * sent))
    for j in reversed(range(dims)):
        flows = [(c, by_index[i ^ (1 << j)]) for c, i in index.items()]
        sent = buffer / (2 ** (j + 1))
        doubling.append(Step(1, flows, sent, COPY_ACCESSES * sent))
    if k > 1:
        halving.insert(0, Step(1, [], 0.0, REDUCE_ACCESSES * buffer * k))
        doubling.append(Step(1, [], 0.0, COPY_ACCESSES * buffer * k))
    if op == "reduce-scatter":
        return halving
    if op == "all-gather":
        return doubling
    if op == "all-to-all":
        return [replace(s, hbm_bytes_per_chip=COPY_ACCESSES * s.flow_bytes) for s in halving]
    return halving + doubling


def hypercube_index(topology: Topology, chips: list[int]) -> dict[int, int]:
    """Each chip's hypercube coordinate: Gray-coded torus coordinates for a whole
    power-of-two torus, else the Gray code of its position on the instance ring."""
    hw = topology.hardware
    link = hw.instance.interconnect
    shape = link.shape
    whole_torus = (link.topology == "torus2d" and shape is not None
                   and len(chips) == hw.chips_per_instance
                   and all(s & (s - 1) == 0 for s in shape))
    if whole_torus:
        xbits = (shape[0] - 1).bit_length()
        return {c: gray(int(topology.chip_x[c])) | (gray(int(topology.chip_y[c])) << xbits)
                for c in chips}
    order = [int(c) for c in topology.ring_order(chips)]
    return {c: gray(i) for i, c in enumerate(order)}


def gray(i: int) -> int:
    return i ^ (i >> 1)
