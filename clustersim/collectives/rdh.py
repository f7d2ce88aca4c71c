"""Recursive halving and doubling (RDH) among the chips of an instance."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from clustersim.collectives.costs import Step
from clustersim.collectives.ops import COPY_ACCESSES, REDUCE_ACCESSES
from clustersim.hardware.topology import Topology

__all__ = ["rdh_steps", "hypercube_index", "gray"]


def rdh_steps(topology: Topology, op: str, chips: list[int], k: int, buffer: float
              ) -> list[Step]:
    """Recursive halving then doubling over every rank, the ranks seen as a hypercube.

    A rank's coordinate puts its place on the chip in the low bits and its chip's hypercube
    coordinate (`hypercube_index`) in the high bits, so the first halving steps pair the
    ranks of one chip (through HBM, no link) and the rest pair chips that are direct
    neighbours where the torus allows it. Halving step j: every rank sends buffer / 2^(j+1)
    to its partner and reduces what it gets (3 HBM accesses per byte: read both halves,
    write the sum); the k ranks of a chip send to the k ranks of the partner chip over the
    one link between them. Doubling mirrors it with copies (2 accesses per byte). With k
    not a power of two the chip's ranks first reduce to one (and last broadcast from it).
    """
    index = hypercube_index(topology, chips)
    by_index = {i: c for c, i in index.items()}
    local_dims = (k - 1).bit_length() if k & (k - 1) == 0 else 0
    senders = k if local_dims else 1  # ranks of a chip taking part in the chip dimensions
    halving, doubling = [], []
    for j in range(local_dims):  # partners on the same chip
        sent = buffer / 2 ** (j + 1)
        halving.append(Step(1, [], 0.0, REDUCE_ACCESSES * sent * k))
        doubling.insert(0, Step(1, [], 0.0, COPY_ACCESSES * sent * k))
    for j in range((len(chips)).bit_length() - 1):
        flows = [(c, by_index[i ^ (1 << j)]) for c, i in index.items()]
        sent = buffer / 2 ** (local_dims + j + 1)  # per rank
        halving.append(Step(1, flows, sent * senders, REDUCE_ACCESSES * sent * senders))
        doubling.insert(0, Step(1, flows, sent * senders, COPY_ACCESSES * sent * senders))
    if not local_dims and k > 1:
        halving.insert(0, Step(1, [], 0.0, REDUCE_ACCESSES * buffer * k))
        doubling.append(Step(1, [], 0.0, COPY_ACCESSES * buffer * k))
    if op == "reduce-scatter":
        return halving
    if op == "all-gather":
        return doubling
    if op == "all-to-all":
        return [replace(s, hbm_bytes_per_chip=COPY_ACCESSES * s.hbm_bytes_per_chip
                        / REDUCE_ACCESSES) for s in halving]
    return halving + doubling


def hypercube_index(topology: Topology, chips: list[int]) -> dict[int, int]:
    """Each chip's hypercube coordinate, so that RDH partners are direct neighbours where the
    torus allows it (Neuron views the 4x4 torus as a 4D hypercube): a sub-grid of the torus
    whose extent along each axis is 1, 2 neighbouring positions, or a whole ring of 4 is
    Gray-coded axis by axis; any other set takes the Gray code of its ring position."""
    link = topology.hardware.instance.interconnect
    if link.topology == "torus2d" and link.shape is not None:
        index = _subgrid_index(topology, chips, link.shape)
        if index is not None:
            return index
    order = [int(c) for c in topology.ring_order(chips)]
    return {c: gray(i) for i, c in enumerate(order)}


def _subgrid_index(topology: Topology, chips: list[int], shape: Sequence[int]
                   ) -> dict[int, int] | None:
    xs = [int(topology.chip_x[c]) for c in chips]
    ys = [int(topology.chip_y[c]) for c in chips]
    axes = []
    for values, size in ((sorted(set(xs)), shape[0]), (sorted(set(ys)), shape[1])):
        n = len(values)
        adjacent = n == 2 and (values[1] - values[0]) % size in (1, size - 1)
        if not (n == 1 or adjacent or (n == 4 and size == 4)):
            return None
        axes.append({v: i for i, v in enumerate(values)})
    if len(chips) != len(axes[0]) * len(axes[1]):
        return None  # not a whole sub-grid
    xbits = (len(axes[0]) - 1).bit_length()
    return {c: gray(axes[0][x]) | (gray(axes[1][y]) << xbits)
            for c, x, y in zip(chips, xs, ys, strict=True)}


def gray(i: int) -> int:
    return i ^ (i >> 1)
