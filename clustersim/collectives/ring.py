"""Ring and bidirectional ring: inside the instance, and one flat ring over every rank of a
multi-node group."""

from __future__ import annotations

from clustersim.collectives.costs import StageCost, Step
from clustersim.collectives.groups import Layout
from clustersim.collectives.links import StepCoster
from clustersim.collectives.ops import COPY_ACCESSES, REDUCE_ACCESSES
from clustersim.hardware.topology import Topology

__all__ = ["ring_steps", "flat_ring_over_all"]


def ring_steps(topology: Topology, op: str, chips: list[int], k: int, buffer: float,
               directions: int) -> list[Step]:
    """A flat ring over every rank (ranks of a chip consecutive), in one or both directions.

    Per step each rank passes one chunk (buffer / ranks) downstream; the chunk crosses a
    link only at chip boundaries, and every rank's copy or reduction goes through HBM.
    """
    ranks = len(chips) * k
    if ranks == 1:
        return []
    order = [int(c) for c in topology.ring_order(chips)]
    hops = list(zip(order, order[1:] + order[:1], strict=True)) if len(order) > 1 else []
    flows = hops + ([(b, a) for a, b in hops] if directions == 2 else [])
    chunk = buffer / ranks / directions
    if op == "broadcast":  # pipelined chain: latency per hop, bandwidth once
        return [Step(ranks - 1, [], 0.0, 0.0),
                Step(1, flows, buffer / directions, COPY_ACCESSES * buffer)]
    copy = Step(ranks - 1, flows, chunk, COPY_ACCESSES * chunk * k * directions)
    reduce = Step(ranks - 1, flows, chunk, REDUCE_ACCESSES * chunk * k * directions)
    if op == "all-gather":
        return [copy]
    if op == "reduce-scatter":
        return [reduce]
    if op == "all-to-all":  # chunks travel half the ring on average
        return [Step(ranks - 1, flows, chunk * ranks / 2 / (ranks - 1) if ranks > 1 else 0,
                     COPY_ACCESSES * chunk * k * directions)]
    return [reduce, copy]


def flat_ring_over_all(coster: StepCoster, op: str, layout: Layout, size: float,
                       algorithm: str) -> StageCost:
    """One ring over every rank of a multi-node group (Neuron uses it on Trn1 for large
    messages): NeuronLink hops inside a node, one EFA hop between nodes."""
    topology = coster.topology
    c = coster.constants
    x = len(layout.domains)
    k = layout.ranks_per_chip
    ranks = x * layout.chips_per_domain * k
    directions = 1 if algorithm == "ring" else 2
    chunk = size / ranks / directions
    local = [int(ch) for ch in topology.ring_order(layout.ultraserver_chips)]
    intra_hops = list(zip(local, local[1:], strict=False))
    intra_flows = intra_hops + ([(b, a) for a, b in intra_hops] if directions == 2 else [])
    intra_time, intra_latency = coster.link_time(intra_flows, chunk)
    nic = topology.hardware.efa_per_chip_bytes_per_s * c.efa_efficiency
    per_step = max(intra_time, chunk / nic,
                   REDUCE_ACCESSES * chunk * k * directions / coster.hbm_rate())
    latency = c.efa_step_latency_s + topology.fabric.latency_s
    count = (2 if op == "all-reduce" else 1) * (ranks - 1)
    return StageCost("fabric", op, algorithm, ranks, size, count, count * max(
        latency, c.step_latency_s + intra_latency), count * per_step)
