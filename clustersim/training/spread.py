"""The shape of a placement over several sites, for the step model's cache: how many
instances in which sites, and a canonical placement of that shape (each site's share from
the start of the site, whole UltraServers first). Within a site the leaf pattern is left
out: a spread job's step is set by its cross-site reduction, and on a non-blocking fabric
the leaves do not change it (an oversubscribed one is paced by the timeline's uplink
sharing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from clustersim.hardware.topology import Topology

__all__ = ["spread_shape", "leaves_matter"]


def spread_shape(topology: Topology, placed: np.ndarray) -> tuple[tuple, np.ndarray] | None:
    """((site, instances) per site in order, canonical placement), or None in one site."""
    if topology.chip_site is None or topology.sites is None:
        return None
    sites = topology.chip_site[placed * topology.hardware.chips_per_instance]
    first, last = int(sites.min()), int(sites.max())
    if first == last:
        return None
    ids, counts = np.unique(sites, return_counts=True)
    starts = topology.sites.first_instance
    canonical = np.concatenate([np.arange(starts[s], starts[s] + c)
                                for s, c in zip(ids.tolist(), counts.tolist(), strict=True)])
    split = tuple(zip(ids.tolist(), counts.tolist(), strict=True))
    return split, canonical


def leaves_matter(topology: Topology) -> bool:
    """Whether the leaves a placement's instances fall on can change a collective beyond
    which spine a send crosses: over several sites, on an oversubscribed fabric, or with
    UltraServers split across leaves. Otherwise a leaf's uplinks carry all its chips' EFA,
    so crossing flows never outrun their NICs (`collectives.fabric`), and the step model
    keys its caches without the leaves."""
    hw = topology.hardware
    ipu = hw.instances_per_ultraserver
    fabric = topology.fabric
    return (topology.site_count > 1 or fabric.oversubscription > 1.0
            or fabric.leaf_size(ipu) % ipu != 0)
