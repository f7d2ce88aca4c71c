"""The fabric level: NeuronLink domains (instances or UltraServers) over EFA.

One group per local rank, all run in parallel: computed on the domains as nodes whose NIC
capacity is their chips' EFA, vectorised over the domains, with leaf uplinks shared by the
flows that leave a leaf (ring, recursive halving/doubling, mesh and single-step mesh)."""

from __future__ import annotations

import numpy as np

from clustersim.collectives.groups import Layout
from clustersim.hardware.topology import Topology

__all__ = ["fabric_algorithms", "fabric_cost"]


def fabric_algorithms(op: str, nodes: int, max_mesh_nodes: int, forced: str) -> list[str]:
    """The algorithms that apply over EFA for `nodes` domains."""
    names = ["ring", "rdh"]
    if nodes <= max_mesh_nodes or forced in ("mesh", "mesh1"):
        names.append("mesh")  # forced mesh is allowed at any size; auto keeps it small
        if op == "all-reduce":
            names.append("mesh1")
    if op in ("broadcast", "all-to-all") and "rdh" in names:
        names.remove("rdh")
    return names


def fabric_cost(topology: Topology, op: str, layout: Layout, buffer: float, algorithm: str
                ) -> tuple[float, float, int]:
    """(latency, transfer, steps) of `op` over EFA on a per-rank buffer of `buffer` bytes."""
    topo, hw = topology, topology.hardware
    c = hw.collectives
    x = len(layout.domains)
    chips = layout.chips_per_domain
    node_bytes = buffer * layout.ranks_per_chip * chips  # what a node holds at this level
    nic = chips * hw.efa_per_chip_bytes_per_s * c.efa_efficiency
    per_leaf = topo.fabric.leaf_size(hw.instances_per_ultraserver)
    uplink = per_leaf * hw.instance.efa_bytes_per_s / topo.fabric.oversubscription * (
        c.efa_efficiency)
    leaves = layout.domain_leaves
    hop_latency = c.efa_step_latency_s + topo.fabric.latency_s
    index = np.arange(x)

    def pattern_time(partner: np.ndarray, flow_bytes: float) -> float:
        crossing = leaves != leaves[partner]
        out_count = np.bincount(leaves[crossing], minlength=topo.leaves)
        in_count = np.bincount(leaves[partner][crossing], minlength=topo.leaves)
        worst = max(int(out_count.max(initial=0)), int(in_count.max(initial=0)))
        return max(flow_bytes / nic, worst * flow_bytes / uplink if topo.leaves > 1 else 0.0)

    if algorithm == "ring":
        partner = np.roll(index, -1)
        chunk = node_bytes / x
        per_step = pattern_time(partner, chunk)
        if op == "broadcast":
            return (x - 1) * hop_latency, node_bytes / nic, x
        count = (2 if op == "all-reduce" else 1) * (x - 1)
        if op == "all-to-all":
            return count * hop_latency, count * per_step * x / 2 / max(1, x - 1), count
        return count * hop_latency, count * per_step, count
    if algorithm == "rdh":
        # Recursive halving/doubling on the largest power of two; the other nodes first
        # hand their whole buffer to a partner and get the result back at the end.
        dims = x.bit_length() - 1
        core = 1 << dims
        factor = 2 if op == "all-reduce" else 1
        transfer = 0.0
        for j in range(dims):
            sent = node_bytes / 2 ** (j + 1)
            partner = index[:core] ^ (1 << j)
            transfer += pattern_time(np.concatenate([partner, index[core:]]), sent)
        transfer *= factor
        steps = factor * dims
        extra = x - core
        if extra:
            fold = np.concatenate([index[:core], index[core:] - core])
            fold_time = pattern_time(fold, node_bytes)
            transfer += (2 if op == "all-reduce" else 1) * fold_time
            steps += 2 if op == "all-reduce" else 1
        return steps * hop_latency, transfer, steps
    # mesh and mesh1: every node sends to every other node at once.
    if algorithm == "mesh1":
        flow = node_bytes
    elif op == "all-to-all":  # the buffer is what leaves the domain, split over peers
        flow = node_bytes / (x - 1)
    else:
        flow = node_bytes / x
    counts = np.bincount(leaves, minlength=topo.leaves)
    crossing = counts * (x - counts)  # node pairs leaving each leaf
    nic_time = (x - 1) * flow / nic
    uplink_time = crossing.max(initial=0) * flow / uplink if topo.leaves > 1 else 0.0
    per_step = max(nic_time, uplink_time)
    count = 2 if op == "all-reduce" and algorithm == "mesh" else 1
    return count * hop_latency, count * per_step, count
