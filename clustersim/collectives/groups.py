"""Groups of ranks on chips, how nccom-test places them, and a group seen level by level."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from clustersim.collectives.ops import CollectiveError
from clustersim.hardware.topology import Topology

__all__ = ["Group", "Layout", "AsymmetricGroupError", "check_rank_split", "place_ranks",
           "build_layout"]


class AsymmetricGroupError(CollectiveError):
    """A group whose instances (or UltraServers) hold different local chips: no
    hierarchical layout (an all-to-all over it is costed by `collectives.uneven`)."""


@dataclass(frozen=True)
class Group:
    """Ranks placed on chips: `chips` (sorted, unique) each holding `ranks_per_chip` ranks."""

    chips: np.ndarray
    ranks_per_chip: int

    def __post_init__(self) -> None:
        chips = np.asarray(self.chips, dtype=np.int64)
        if len(chips) > 1 and not np.all(chips[1:] > chips[:-1]):  # not already sorted unique
            chips = np.unique(chips)
        object.__setattr__(self, "chips", chips)
        if len(chips) == 0:
            raise CollectiveError("a group needs at least one chip")
        if self.ranks_per_chip < 1:
            raise CollectiveError(f"ranks_per_chip must be at least 1, got {self.ranks_per_chip}")

    @classmethod
    def from_rank_chips(cls, rank_chips: Iterable[int]) -> Group:
        """A group from the chip of each rank; every chip must hold the same number of ranks."""
        given = rank_chips if isinstance(rank_chips, np.ndarray) else list(rank_chips)
        chips, counts = np.unique(np.asarray(given, dtype=np.int64), return_counts=True)
        if len(chips) and np.any(counts != counts[0]):
            raise CollectiveError("every chip of a group must hold the same number of its ranks")
        return cls(chips, int(counts[0]) if len(counts) else 1)

    @property
    def ranks(self) -> int:
        return len(self.chips) * self.ranks_per_chip


def check_rank_split(ranks: int, instances: int) -> None:
    """Ranks spread evenly over instances (checkable before any graph is built)."""
    if ranks < 1:
        raise CollectiveError(f"ranks must be at least 1, got {ranks}")
    if ranks % instances:
        raise CollectiveError(f"{ranks} ranks do not split evenly over {instances} instances")


def place_ranks(topology: Topology, ranks: int, instances: int | None = None) -> Group:
    """Place ranks as nccom-test and the Neuron runtime do: spread evenly over the first
    `instances` instances, filling each chip's ranks (cores) before the next chip."""
    hw = topology.hardware
    instances = instances or max(1, math.ceil(max(ranks, 1) / hw.ranks_per_instance))
    check_rank_split(ranks, instances)
    if instances > topology.instances:
        raise CollectiveError(f"{instances} instances asked, the topology has {topology.instances}")
    per_instance = ranks // instances
    if per_instance > hw.ranks_per_instance:
        raise CollectiveError(
            f"{per_instance} ranks per instance, but a {hw.instance.name} has {hw.ranks_per_instance}"
        )
    per_chip = min(hw.chip.ranks, per_instance)
    if per_instance % per_chip:
        raise CollectiveError(f"{per_instance} ranks per instance do not fill whole chips")
    chips_per_instance = per_instance // per_chip
    cpi = hw.chips_per_instance
    chips = (np.arange(instances)[:, None] * cpi + np.arange(chips_per_instance)[None, :]).ravel()
    return Group(chips, per_chip)


@dataclass(frozen=True)
class Layout:
    """A group seen level by level, with one representative of each level."""

    ranks_per_chip: int
    instance_chips: np.ndarray  # chips of the representative instance-level member set
    instance_key: tuple  # local positions (shape of the instance level)
    ultraserver_members: int  # instances per UltraServer taking part (Z level), 1 if none
    ultraserver_chips: np.ndarray  # chips of the representative UltraServer (Z level)
    domains: np.ndarray  # first chip of each NeuronLink domain taking part
    domain_leaves: np.ndarray  # leaf of each domain
    chips_per_domain: int
    # Across sites (clustersim.collectives.sites): `domains` are the representative site's
    # (the one holding most of them); the sites the group spans, first chip in each, and
    # the group's chips in all.
    sites: int = 1
    site_ids: tuple[int, ...] = ()
    site_first_chips: tuple[int, ...] = ()
    site_domain_counts: tuple[int, ...] = ()
    group_chips: int = 0

    @property
    def key(self) -> tuple:
        leaf_pattern = tuple(sorted(Counter(Counter(self.domain_leaves.tolist()).values()).items()))
        key = (self.ranks_per_chip, self.instance_key, self.ultraserver_members,
               len(self.domains), leaf_pattern)
        if self.sites > 1:  # which sites (their links differ) and how the group splits
            key += (self.site_ids, self.site_domain_counts)
        return key

    @property
    def levels(self) -> list[str]:
        """The levels the group spans, lowest first."""
        levels = ["instance"]
        if self.ultraserver_members > 1:
            levels.append("ultraserver")
        if len(self.domains) > 1:
            levels.append("fabric")
        if self.sites > 1:
            levels.append("site")
        return levels

    @property
    def ranks(self) -> int:
        if self.sites > 1:
            return self.group_chips * self.ranks_per_chip
        return len(self.domains) * self.chips_per_domain * self.ranks_per_chip


def build_layout(topology: Topology, group: Group) -> Layout:
    """The group's levels: instance (or switch UltraServer), Z rings, EFA domains."""
    chips = group.chips
    hw = topology.hardware
    if int(chips[-1]) >= topology.chips:
        raise CollectiveError(f"chip {int(chips[-1])} is not in the topology ({topology.chips} chips)")
    cpi = hw.chips_per_instance
    # The instance level: one instance, or the whole UltraServer under one NeuronSwitch.
    unit = cpi * hw.instances_per_ultraserver if hw.switch_spans_ultraserver else cpi
    units, unit_starts = np.unique(chips // unit, return_index=True)
    counts = np.diff(np.append(unit_starts, len(chips)))
    # A switch UltraServer is the node here: say so (each instance may hold the same).
    node = "UltraServer (NeuronSwitch domain)" if hw.switch_spans_ultraserver else "instance"
    if np.any(counts != counts[0]):
        raise AsymmetricGroupError(
            f"asymmetric group: every {node} must hold the same number of its chips "
            f"({sorted(set(counts.tolist()))} here; Neuron forms groups with the same local "
            "ranks on every node)"
        )
    local = (chips % unit).reshape(len(units), counts[0])
    if np.any(local != local[0]):
        raise AsymmetricGroupError(f"asymmetric group: {node}s hold different local chips")
    instance_chips = chips[: counts[0]]
    # The UltraServer (Z ring) level: used when every UltraServer holds the same instances
    # of the group; an uneven group is costed over EFA between its instances instead.
    even = False
    if hw.ultraserver is not None and not hw.switch_spans_ultraserver:
        ipu = hw.instances_per_ultraserver
        us_of_unit = units // ipu
        us_ids, us_starts = np.unique(us_of_unit, return_index=True)
        per_us = np.diff(np.append(us_starts, len(units)))
        even = bool(np.all(per_us == per_us[0]))
        if even:
            z_sets = (units % ipu).reshape(len(us_ids), per_us[0])
            even = bool(np.all(z_sets == z_sets[0]))
    if even:
        members = int(per_us[0])
        us_chips = chips[: counts[0] * members]
        domain_first = chips[np.append(us_starts, len(units))[:-1] * counts[0]]
        domain_size = counts[0] * members
    else:
        members = 1
        us_chips = instance_chips
        domain_first = chips[unit_starts]
        domain_size = int(counts[0])
    site_fields: dict = {}
    if topology.chip_site is not None:
        domain_sites = topology.chip_site[domain_first]
        site_ids, site_starts, site_counts = np.unique(domain_sites, return_index=True,
                                                       return_counts=True)
        if len(site_ids) > 1:
            # The site with the most domains stands for all in the within-site stages.
            rep = int(np.argmax(site_counts))
            site_fields = {
                "sites": len(site_ids), "site_ids": tuple(int(s) for s in site_ids),
                "site_first_chips": tuple(int(c) for c in domain_first[site_starts]),
                "site_domain_counts": tuple(int(c) for c in site_counts),
                "group_chips": len(chips),
            }
            domain_first = domain_first[domain_sites == site_ids[rep]]
    return Layout(
        ranks_per_chip=group.ranks_per_chip,
        instance_chips=instance_chips,
        instance_key=tuple(int(c) for c in local[0]),
        ultraserver_members=members,
        ultraserver_chips=us_chips,
        domains=domain_first,
        domain_leaves=topology.chip_leaf[domain_first],
        chips_per_domain=int(domain_size),
        **site_fields,
    )
