"""The site level: a group's sites over the inter-site links, above the fabric level.

A hierarchical collective over several sites reduces inside each site first (instance,
UltraServer, EFA fabric, as for one site), then exchanges across sites, then gathers back
down: the site level is one more level on top, as the fabric is above the UltraServers.
Every rank position of a site runs its own group over the sites, all at once, so what a
site sends at this level is its ranks' per-rank buffers together, over its link to the next
site.

Ring over the sites in site order (all-reduce: 2 (S - 1) steps; reduce-scatter, all-gather:
S - 1): each step moves a site's share / S over one inter-site hop (its own link, or two
backbone access links, each carrying one flow per direction). A step costs the EFA step
latency, the fabric latency and the slowest hop's inter-site latency; its transfer is the
chunk over the narrowest of the hops' bandwidth x EFA efficiency and the site's injection
(its chips' EFA x efficiency over the leaf oversubscription). All-to-all sends each site's
cross-site share to every other site at once.
"""

from __future__ import annotations

from dataclasses import replace

from clustersim.collectives.costs import CollectiveCost, StageCost
from clustersim.collectives.groups import Layout
from clustersim.hardware.topology import Topology

__all__ = ["site_cost", "site_ring_hops", "site_hop_rate", "site_link_rates",
           "share_site_links"]


def site_ring_hops(layout: Layout) -> list[tuple[int, int]]:
    """(from site, to site) of each hop of the ring over the group's sites."""
    ids = list(layout.site_ids)
    return [(ids[i], ids[(i + 1) % len(ids)]) for i in range(len(ids))] if len(ids) > 1 else []


def _site_injection(topology: Topology, layout: Layout) -> float:
    """What one site's chips of the group can send across at once (bytes/s)."""
    hw, c = topology.hardware, topology.hardware.collectives
    chips = len(layout.domains) * layout.chips_per_domain
    return chips * hw.efa_per_chip_bytes_per_s * c.efa_efficiency / max(
        1.0, topology.fabric.oversubscription)


def site_hop_rate(topology: Topology, layout: Layout, a: int, b: int) -> float:
    """Bytes/s one site-level flow from site a to site b reaches alone."""
    net = topology.sites
    assert net is not None
    link = net.pair_bandwidth(a, b) * topology.hardware.collectives.efa_efficiency
    return min(link, _site_injection(topology, layout))


def site_cost(topology: Topology, op: str, layout: Layout, buffer: float
              ) -> tuple[float, float, int]:
    """(latency, transfer, steps) of `op` over the group's sites on a per-rank buffer of
    `buffer` bytes (the buffer each rank holds at this level)."""
    net = topology.sites
    assert net is not None
    c = topology.hardware.collectives
    x = layout.sites
    site_ranks = len(layout.domains) * layout.chips_per_domain * layout.ranks_per_chip
    node_bytes = buffer * site_ranks  # what a site holds at this level
    hops = site_ring_hops(layout)
    slowest_s = max(net.pair_latency(a, b) for a, b in hops)
    hop_latency = c.efa_step_latency_s + topology.fabric.latency_s + slowest_s
    rate = min(site_hop_rate(topology, layout, a, b) for a, b in hops)
    if op == "broadcast":
        return (x - 1) * hop_latency, node_bytes / rate, x - 1
    if op == "all-to-all":
        # Each site sends its cross-site share, split evenly over the other sites, at once:
        # a pair link carries one piece; a backbone access link every piece not on a link.
        piece = node_bytes / (x - 1)
        worst = 0.0
        for a in layout.site_ids:
            via_backbone = 0
            for b in layout.site_ids:
                if b == a:
                    continue
                if net.direct(a, b):
                    worst = max(worst, piece / site_hop_rate(topology, layout, a, b))
                else:
                    via_backbone += 1
            if via_backbone:
                access = net.backbone_bandwidth_bytes_per_s * c.efa_efficiency
                worst = max(worst, via_backbone * piece / access)
        worst = max(worst, node_bytes / _site_injection(topology, layout))
        return hop_latency, worst, 1
    count = (2 if op == "all-reduce" else 1) * (x - 1)
    return count * hop_latency, count * (node_bytes / x) / rate, count


def site_link_rates(topology: Topology, layout: Layout, stage: StageCost
                    ) -> dict[tuple, float]:
    """Peak use of each directed inter-site link (and backbone access link) by a site stage,
    in bytes/s, as `contention.resource_rates` counts links: the rate each hop's flow
    reaches alone, on every link of its route between the two site nodes."""
    if stage.transfer_s <= 0 or layout.sites < 2:
        return {}
    rates: dict[tuple, float] = {}
    if stage.op == "all-to-all":
        ids = list(layout.site_ids)
        hops = [(a, b) for a in ids for b in ids if a != b]
    else:
        hops = site_ring_hops(layout)
    # A ring moves at its slowest hop's pace; all-to-all's pieces each at their own.
    paced = min(site_hop_rate(topology, layout, a, b) for a, b in hops)
    for a, b in hops:
        nodes = topology.route(layout.site_first_chips[layout.site_ids.index(a)],
                               layout.site_first_chips[layout.site_ids.index(b)])
        rate = site_hop_rate(topology, layout, a, b) if stage.op == "all-to-all" else paced
        for u, v in zip(nodes, nodes[1:], strict=False):
            if u >= topology.first_site and v >= topology.first_site:
                key = ("link", u, v)
                rates[key] = rates.get(key, 0.0) + rate
    return rates


def share_site_links(topology: Topology, cost: CollectiveCost, layout: Layout,
                     parallel: float) -> CollectiveCost:
    """`cost` when `parallel` collectives like it (a job's other data-parallel groups) cross
    the same inter-site links at once: each site stage's transfer stretched by the links'
    demand over their capacity (each group alone reaches `site_hop_rate`; together they
    share the link's bandwidth x efficiency). Nothing changes below the site level, where
    each group has its own chips, NICs and Z links."""
    if parallel <= 1 or layout.sites < 2:
        return cost
    net = topology.sites
    assert net is not None
    eff = topology.hardware.collectives.efa_efficiency
    hops = site_ring_hops(layout)
    slowdown = max(1.0, max(parallel * site_hop_rate(topology, layout, a, b)
                            / (net.pair_bandwidth(a, b) * eff) for a, b in hops))
    if slowdown <= 1.0:
        return cost
    stages = tuple(replace(s, transfer_s=s.transfer_s * slowdown) if s.level == "site" else s
                   for s in cost.stages)
    return replace(cost, stages=stages)
