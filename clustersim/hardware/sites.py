"""Several sites (data centers) in one cluster: each with its own instances and its own
leaf-spine fabric, joined by inter-site links (one per site pair, or a shared backbone every
site reaches through its own access link).

The specs here are what a scenario's `cluster.sites`, `cluster.inter_site` and
`failures.site_events` hold; :class:`SiteNetwork` is the resolved plan the topology builds
from: sites in order (site s holds a contiguous block of instances, its working instances then
its spares), and the inter-site bandwidth and latency of each site pair.

A single-site cluster (no `sites`) has no SiteNetwork and builds exactly as before.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from clustersim.hardware import limits
from clustersim.hardware.spec import Bandwidth, Duration, NonNegativeDuration, Rate, Spec

__all__ = [
    "SiteSpec",
    "SiteLinkSpec",
    "BackboneSpec",
    "InterSiteSpec",
    "SiteEventSpec",
    "SiteNetwork",
    "SiteError",
    "site_network",
]

MAX_SITES = 16  # the bisection enumerates the 2^(sites-1) ways to split them


class SiteError(ValueError):
    """Sites that do not make a cluster (unknown site in a link, no hardware, ...)."""


class SiteSpec(Spec):
    """One site: its instances (or UltraServers) and hot spares; its fabric is the
    cluster's `fabric` (a leaf-spine Clos of its own: its leaves uplink only to its spines)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)
    instances: int | None = Field(default=None, ge=0, le=limits.MAX_INSTANCES)
    ultraservers: int | None = Field(default=None, ge=0, le=limits.MAX_INSTANCES)
    spares: int = Field(default=0, ge=0, le=limits.MAX_INSTANCES,
                        description="hot-spare instances of this site, beyond the rest")

    @model_validator(mode="after")
    def _one_size(self) -> SiteSpec:
        if (self.instances is None) == (self.ultraservers is None):
            raise ValueError(f"site {self.name}: give exactly one of instances or ultraservers")
        if (self.instances or self.ultraservers or 0) + self.spares <= 0:
            raise ValueError(f"site {self.name} has no hardware: expected instances or "
                             "ultraservers above zero")
        return self


class SiteLinkSpec(Spec):
    """The link between two sites: bandwidth per direction (or the sites' EFA over an
    oversubscription) and one-way latency."""

    sites: list[str] = Field(min_length=2, max_length=2, description="the two sites' names")
    bandwidth_bytes_per_s: Bandwidth | None = Field(
        default=None, alias="bandwidth", description="per direction; or give oversubscription")
    oversubscription: float | None = Field(
        default=None, ge=1.0, le=1e6,
        description="the smaller site's EFA over this link's bandwidth (instead of bandwidth)")
    latency_s: NonNegativeDuration = Field(default=1e-3, alias="latency",
                                           description="one way, added to the fabric's")

    @model_validator(mode="after")
    def _one_size(self) -> SiteLinkSpec:
        if (self.bandwidth_bytes_per_s is None) == (self.oversubscription is None):
            raise ValueError("give exactly one of bandwidth or oversubscription")
        if self.latency_s > limits.MAX_LATENCY_S:
            raise ValueError(f"latency at most {limits.MAX_LATENCY_S:g}s, got {self.latency_s:g}s")
        return self


class BackboneSpec(Spec):
    """A shared backbone: every site reaches it through an access link of `bandwidth` per
    direction; traffic between two sites crosses both their access links."""

    bandwidth_bytes_per_s: Bandwidth = Field(alias="bandwidth",
                                             description="each site's access, per direction")
    latency_s: NonNegativeDuration = Field(default=2e-3, alias="latency",
                                           description="one way, site to site")

    @model_validator(mode="after")
    def _bounded(self) -> BackboneSpec:
        if self.latency_s > limits.MAX_LATENCY_S:
            raise ValueError(f"latency at most {limits.MAX_LATENCY_S:g}s, got {self.latency_s:g}s")
        return self


class InterSiteSpec(Spec):
    """How sites are joined: links per site pair, a shared backbone, or both (a pair's own
    link is used where there is one)."""

    links: list[SiteLinkSpec] = Field(default_factory=list)
    backbone: BackboneSpec | None = None


class SiteEventSpec(Spec):
    """A site-wide event: a power or cooling loss downs `share` of a site's instances for
    `duration`; a network partition cuts the site off from the others (jobs spanning it and
    another site stop; no hardware goes down)."""

    kind: Literal["power", "cooling", "partition"]
    site: str | None = Field(default=None, description="one site's name; default every site")
    rate_per_s: Rate = Field(alias="rate", description="events per site")
    share: float = Field(default=1.0, gt=0, le=1.0,
                         description="fraction of the site's instances downed (power, cooling)")
    duration_s: Duration = Field(alias="duration", description="until power, cooling or the "
                                 "network is back")

    @model_validator(mode="after")
    def _partition_has_no_share(self) -> SiteEventSpec:
        # (a share was accepted and did nothing: a partition cuts the whole site off)
        if self.kind == "partition" and "share" in self.model_fields_set:
            raise ValueError("share: a partition cuts the whole site off and downs no "
                             "hardware; expected no share (power and cooling take one)")
        return self


@dataclass(frozen=True)
class SiteNetwork:
    """Sites in instance order and the links between them (the topology's plan)."""

    names: tuple[str, ...]
    instances: tuple[int, ...]  # per site, spares included
    spares: tuple[int, ...]
    pair_bandwidth_bytes_per_s: np.ndarray  # S x S, 0 where the pair has no link of its own
    pair_latency_s: np.ndarray  # S x S
    backbone_bandwidth_bytes_per_s: float  # 0 without a backbone
    backbone_latency_s: float

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def first_instance(self) -> np.ndarray:
        """First instance of each site, and the total at the end."""
        return np.concatenate([[0], np.cumsum(self.instances)]).astype(np.int64)

    def site_of_instances(self, n_instances: int) -> np.ndarray:
        return np.repeat(np.arange(self.count, dtype=np.int32), self.instances)[:n_instances]

    def direct(self, a: int, b: int) -> bool:
        return bool(self.pair_bandwidth_bytes_per_s[a, b] > 0)

    def pair_bandwidth(self, a: int, b: int) -> float:
        """Bytes/s per direction from site a to site b: their own link, else the backbone."""
        if self.direct(a, b):
            return float(self.pair_bandwidth_bytes_per_s[a, b])
        return self.backbone_bandwidth_bytes_per_s

    def pair_latency(self, a: int, b: int) -> float:
        if self.direct(a, b):
            return float(self.pair_latency_s[a, b])
        return self.backbone_latency_s

    def capacity_out(self, site: int) -> float:
        """What leaves a site at most, per direction: its pair links plus its backbone access."""
        return float(self.pair_bandwidth_bytes_per_s[site].sum()) + (
            self.backbone_bandwidth_bytes_per_s)

    def cut_bytes_per_s(self, side: set[int]) -> float:
        """Capacity between `side` and the other sites, per direction: the pair links crossing
        the cut, plus what the backbone carries across (the smaller side's access links)."""
        other = [s for s in range(self.count) if s not in side]
        pairs = sum(float(self.pair_bandwidth_bytes_per_s[a, b]) for a in side for b in other)
        backbone = self.backbone_bandwidth_bytes_per_s * min(len(side), len(other))
        return pairs + backbone

    def bisection_cut_bytes_per_s(self, chips_per_site: list[int]) -> float:
        """The narrowest cut between two halves of the sites holding as equal shares of the
        chips as the sites allow (the cross-site part of the bisection)."""
        total = sum(chips_per_site)
        best_gap, best = math.inf, math.inf
        for r in range(1, self.count):
            for side in itertools.combinations(range(1, self.count), r - 1):
                chosen = {0, *side}
                gap = abs(2 * sum(chips_per_site[s] for s in chosen) - total)
                cut = self.cut_bytes_per_s(chosen)
                if gap < best_gap:
                    best_gap, best = gap, cut
                elif gap == best_gap:
                    best = min(best, cut)
        return best


def site_network(sites: list[SiteSpec], inter: InterSiteSpec | None, instances_per_ultraserver: int,
                 efa_bytes_per_s: float) -> SiteNetwork:
    """Resolve the scenario's sites and links (SiteError for a malformed set)."""
    if len(sites) > MAX_SITES:
        raise SiteError(f"{len(sites)} sites; expected at most {MAX_SITES}")
    names = [s.name for s in sites]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SiteError(f"site {name} is named twice")
        seen.add(name)
    index = {name: i for i, name in enumerate(names)}
    counts = []
    for s in sites:
        working = s.instances if s.instances is not None else (s.ultraservers or 0) * (
            instances_per_ultraserver)
        counts.append(working + s.spares)
    n = len(sites)
    bandwidth = np.zeros((n, n))
    latency = np.zeros((n, n))
    inter = inter or InterSiteSpec()
    for link in inter.links:
        for name in link.sites:
            if name not in index:
                raise SiteError(f"link between {' and '.join(link.sites)}: unknown site {name}; "
                                f"expected one of {', '.join(names)}")
        a, b = index[link.sites[0]], index[link.sites[1]]
        if a == b:
            raise SiteError(f"link from site {link.sites[0]} to itself")
        if bandwidth[a, b] > 0:
            raise SiteError(f"two links between {link.sites[0]} and {link.sites[1]}")
        bw = link.bandwidth_bytes_per_s
        if bw is None:
            assert link.oversubscription is not None
            bw = min(counts[a], counts[b]) * efa_bytes_per_s / link.oversubscription
        bandwidth[a, b] = bandwidth[b, a] = bw
        latency[a, b] = latency[b, a] = link.latency_s
    backbone = inter.backbone
    if backbone is None and n > 1:
        for a, b in itertools.combinations(range(n), 2):
            if bandwidth[a, b] <= 0:
                raise SiteError(f"sites {names[a]} and {names[b]} are not joined: give a link "
                                "between them or a backbone")
    return SiteNetwork(
        names=tuple(names), instances=tuple(counts), spares=tuple(s.spares for s in sites),
        pair_bandwidth_bytes_per_s=bandwidth, pair_latency_s=latency,
        backbone_bandwidth_bytes_per_s=backbone.bandwidth_bytes_per_s if backbone else 0.0,
        backbone_latency_s=backbone.latency_s if backbone else 0.0,
    )
