"""The rules for a multi-site cluster (docs/sites.md): links name known sites and join every
pair, each site has hardware in whole UltraServers and whole leaves, site events name known
sites, a partition needs a second site."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from clustersim.hardware.sites import SiteError, site_network
from clustersim.scenario.errors import Issue

if TYPE_CHECKING:
    from clustersim.scenario.models import Scenario

__all__ = ["site_checks"]


def site_checks(s: Scenario) -> Iterable[Issue]:
    """Every problem of the scenario's sites; none for a single-site cluster."""
    sites = s.cluster.sites
    hw = s.hardware
    if not sites:
        for i, event in enumerate(s.failures.site_events):
            yield Issue(f"failures.site_events.{i}", "site events need cluster.sites",
                        event.kind, True)
        return
    seen: dict[str, int] = {}
    for i, site in enumerate(sites):  # before the network: its error names no key
        if site.name in seen:
            yield Issue(f"cluster.sites.{i}.name", f"site {site.name} is named twice (also "
                        f"cluster.sites.{seen[site.name]}); expected each site once",
                        site.name, True)
            return
        seen[site.name] = i
    try:
        net = site_network(sites, s.cluster.inter_site, hw.instances_per_ultraserver,
                           hw.instance.efa_bytes_per_s)
    except SiteError as error:
        yield Issue("cluster.inter_site" if s.cluster.inter_site else "cluster.sites",
                    str(error))
        return
    ipu = hw.instances_per_ultraserver
    per_leaf = s.cluster.fabric.leaf_size(ipu)
    for i, (site, count) in enumerate(zip(sites, net.instances, strict=True)):
        at = f"cluster.sites.{i}"
        if site.ultraservers is not None and hw.ultraserver is None:
            yield Issue(f"{at}.ultraservers", f"hardware {hw.name} has no UltraServer; give "
                        "instances", site.ultraservers, True)
            continue
        if count % ipu or site.spares % ipu:
            yield Issue(at, f"site {site.name}: {hw.name} instances and spares come in "
                        f"UltraServers of {ipu}", count, True)
        elif len(sites) > 1 and count % per_leaf:
            yield Issue(at, f"site {site.name}: {count} instances with spares; expected a "
                        f"multiple of the {per_leaf} instances of a leaf switch (each site "
                        "has its own leaves)", count, True)
    names = set(net.names)
    for i, event in enumerate(s.failures.site_events):
        at = f"failures.site_events.{i}"
        if event.site is not None and event.site not in names:
            yield Issue(f"{at}.site", f"unknown site; expected one of {', '.join(net.names)}",
                        event.site, True)
        if event.kind == "partition" and len(sites) < 2:
            yield Issue(f"{at}.kind", "a partition needs a second site", event.kind, True)
