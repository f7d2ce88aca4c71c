"""All-to-all over a group that its NeuronLink domains hold unevenly (an expert group that
straddles two Trn3 UltraServers, or two Trn2 instances, with different members in each).

Neuron forms hierarchical groups only with the same local ranks on every node
(`groups.build_layout` refuses the others), but an all-to-all needs no reduction tree: every
rank sends a piece of S / n bytes (S its buffer, n the group's ranks) to every rank. A rank
in a domain holding r of the n ranks writes r pieces inside the domain, over NeuronLink or
the NeuronSwitch (the domain's part of the group is an ordinary group there, costed as
such), and sends the other n - r pieces over EFA, receiving as many. Both run at once, as
in the even hierarchical all-to-all (`model.CollectiveModel._all_to_all`), so a member
takes

    its domain part's latency + one EFA step + max(its domain part's transfer,
    S (n - r) / n x ranks of the group on its chip / (the chip's EFA x efficiency))

and the leaf uplinks carry the pieces between domains under different leaves. The members
of the smallest part send the most over EFA; the slowest member bounds the collective
(every rank waits for all its pieces). With equal parts this is the even group's cost.

The domain is the UltraServer (its NeuronSwitch, or a Trn2 UltraServer's Z rings when each
part holds the same chips in each of its instances), else the instance.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from clustersim.collectives.costs import CollectiveCost, StageCost
from clustersim.collectives.groups import AsymmetricGroupError, Group

if TYPE_CHECKING:
    from clustersim.collectives.model import CollectiveModel

__all__ = ["domain_parts", "uneven_all_to_all"]


def domain_parts(model: CollectiveModel, group: Group) -> list[np.ndarray]:
    """The group's chips split by NeuronLink domain: by UltraServer where every part is an
    even group there (its layout builds), else by instance (a part of one instance always
    is)."""
    topo, hw = model.topology, model.hardware
    if topo.chip_site is not None and len(np.unique(topo.chip_site[group.chips])) > 1:
        raise AsymmetricGroupError(
            "asymmetric group over several sites: not modelled (Neuron forms groups with "
            "the same local ranks on every node)")
    cpi = hw.chips_per_instance
    for unit in dict.fromkeys((cpi * hw.instances_per_ultraserver, cpi)):
        _, starts = np.unique(group.chips // unit, return_index=True)
        parts = np.split(group.chips, starts[1:])
        try:
            for part in parts:
                model.layout(Group(part, group.ranks_per_chip))
        except AsymmetricGroupError:
            continue
        return parts
    raise AsymmetricGroupError("a part of one instance did not form a group")  # unreachable


def uneven_all_to_all(model: CollectiveModel, group: Group, size: float) -> CollectiveCost:
    """The all-to-all of `size` bytes per rank over `group`, its domains holding different
    parts of it (module docstring): the slowest member's stages."""
    topo, hw = model.topology, model.hardware
    c = hw.collectives
    k = group.ranks_per_chip
    parts = domain_parts(model, group)
    ranks = np.array([len(p) * k for p in parts], dtype=np.float64)
    n = float(ranks.sum())
    nic = hw.efa_per_chip_bytes_per_s * c.efa_efficiency
    crossing = size * (n - ranks) / n  # what each member of a part sends over EFA
    nic_s = crossing * k / nic
    leaf_s = 0.0
    if topo.leaves > 1:  # pieces between parts under different leaves share the uplinks
        per_leaf = topo.fabric.leaf_size(hw.instances_per_ultraserver)
        uplink = per_leaf * hw.instance.efa_bytes_per_s / topo.fabric.oversubscription * (
            c.efa_efficiency)
        leaves = np.array([int(topo.chip_leaf[int(p[0])]) for p in parts])
        for leaf in np.unique(leaves):  # each rank under it sends S / n to each outside
            inside = float(ranks[leaves == leaf].sum())
            leaf_s = max(leaf_s, inside * (n - inside) * size / n / uplink)
    efa_latency = c.efa_step_latency_s + topo.fabric.latency_s
    slowest: tuple[float, tuple[StageCost, ...]] | None = None
    for j, part in enumerate(parts):
        inner = model.cost("all-to-all", Group(part, k), size * ranks[j] / n)
        fabric_s = max(float(nic_s[j]), leaf_s)
        fabric = StageCost("fabric", "all-to-all", "mesh", len(parts), float(crossing[j]), 1,
                           efa_latency, fabric_s)
        if fabric_s >= inner.transfer_s:  # concurrent: the slower transfer counts
            stages = tuple(_no_transfer(s) for s in inner.stages) + (fabric,)
        else:
            stages = inner.stages + (_no_transfer(fabric),)
        time_s = sum(s.time_s for s in stages)
        if slowest is None or time_s > slowest[0]:
            slowest = (time_s, stages)
    assert slowest is not None
    names = dict.fromkeys(s.algorithm for s in slowest[1])
    return CollectiveCost("all-to-all", size, int(n), "uneven(" + "+".join(names) + ")",
                          slowest[1], group)


def _no_transfer(stage: StageCost) -> StageCost:
    return replace(stage, transfer_s=0.0)
