"""A cluster of several sites on the timeline: placement that keeps a job in one site when it
fits, and site-wide events (power, cooling, network partition).

- Placement (`SitePlacer`): a job goes to the site that holds it most tightly (fewest free
  instances among those that fit), placed there as on one site (few leaves, whole
  UltraServers); a job larger than any site's free pool spreads over the fewest sites, most
  free first, leaving out sites cut off by a partition.
- Power and cooling events (`SiteEvents`): at a per-site rate, a share of a site's
  instances (a contiguous block of whole UltraServers, as a power or cooling domain is a row
  of racks) goes down for the event's duration. Jobs on them lose them as on a failure and
  recover with replacements, or wait for the site to come back. Instances already down
  stay with their own repair; instances the deployments of `serve` hold are left out.
- Network partitions: the site is cut off from the others for the duration. No hardware goes
  down; a job holding instances in the site and in another stops (interrupted as by a
  fault, it waits for the partition to end before it restarts), and no job is spread over a
  cut-off site meanwhile. Jobs inside one site go on.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from clustersim.cluster.owners import FREE
from clustersim.cluster.placement import Placer, pack_runs, whole_units
from clustersim.hardware.sites import SiteEventSpec, SiteNetwork
from clustersim.training.shape import spread_shape
from clustersim.training.sites import cross_site_step

if TYPE_CHECKING:
    from clustersim.cluster.ports import SiteJob, SitesTimeline, UplinksTimeline
    from clustersim.training.step import StepModel

__all__ = ["SitePlacer", "SiteEvents", "cut_off", "cross_site_seconds", "max_min_speeds",
           "share_site_links"]


class SitePlacer(Placer):
    """Placement on a multi-site cluster: one site when the job fits, else the fewest.
    Sites are contiguous blocks of instances, so each is a slice of the free mask."""

    def __init__(self, ipu: int, n_us: int, per_leaf: int, instance_leaf: np.ndarray,
                 ring: bool, first_instance: np.ndarray, partitioned: np.ndarray):
        super().__init__(ipu, n_us, per_leaf, instance_leaf, ring)
        self.bounds = first_instance  # site s: instances bounds[s] .. bounds[s + 1] - 1
        self.n_sites = len(first_instance) - 1
        self.partitioned = partitioned  # the timeline's: above zero while a site is cut off
        self._bounds = first_instance.tolist()
        # Sites of whole leaves (and so of whole UltraServers), leaves and UltraServers runs
        # of consecutive ids: a job placed in one site is placed on that site's slice of the
        # mask (`_in_site`), not on a copy of the whole mask with only that site kept.
        self._slices = bool(ipu and n_us and self.instance_run == per_leaf and self.unit_run
                            and per_leaf % ipu == 0
                            and all(b % per_leaf == 0 for b in self._bounds))

    def per_site(self, mask: np.ndarray) -> np.ndarray:
        """True entries of a mask over instances, per site."""
        b = self._bounds
        return np.array([np.count_nonzero(mask[b[s]: b[s + 1]]) for s in range(self.n_sites)])

    def _in_site(self, count: int, whole_ultraservers: bool, free: np.ndarray, site: int
                 ) -> np.ndarray | None:
        """`Placer.place` on the free instances of one site alone: on the site's slice of
        the mask (the same instances: the leaves and UltraServers outside hold none free,
        and those inside keep their order), or on a copy keeping only that site."""
        if not self._slices:
            return super().place(count, whole_ultraservers, self._within(free, [site]))
        first = self._bounds[site]
        part = free[first: self._bounds[site + 1]]
        if whole_ultraservers or (count % self.ipu == 0 and self.ring):
            # (a job the size of whole UltraServers takes whole ones when it can)
            ipu = self.ipu
            units = pack_runs(whole_units(part, len(part) // ipu, ipu), self.unit_run,
                              math.ceil(count / ipu))
            if units is not None:
                return (units[:, None] * ipu + np.arange(ipu)[None, :]).ravel()[:count] + first
            if whole_ultraservers:
                return None
        chosen = pack_runs(part, self.instance_run, count)
        return None if chosen is None else chosen + first

    def _within(self, free: np.ndarray, sites: list[int]) -> np.ndarray:
        kept = np.zeros_like(free)
        for site in sites:
            a, b = self.bounds[site], self.bounds[site + 1]
            kept[a:b] = free[a:b]
        return kept

    def place(self, count: int, whole_ultraservers: bool, free: np.ndarray,
              held: np.ndarray | None = None) -> np.ndarray | None:
        """`count` free instances (see Placer.place); `held`, the instances a recovering job
        still holds: its replacements come from its own sites first."""
        per_site = self.per_site(free)
        if held is not None:
            own = np.flatnonzero(self.per_site(held)).tolist()
            if own and int(per_site[own].sum()) >= count:
                chosen = (self._in_site(count, whole_ultraservers, free, own[0])
                          if len(own) == 1 else
                          super().place(count, whole_ultraservers, self._within(free, own)))
                if chosen is not None:
                    return chosen
        # The site that fits it most tightly first (keeps big holes for big jobs).
        for site in np.argsort(per_site, kind="stable").tolist():
            if per_site[site] < count:
                continue
            chosen = self._in_site(count, whole_ultraservers, free, site)
            if chosen is not None:
                return chosen
        # Spread: the fewest sites not cut off, most free first.
        usable = [s for s in np.argsort(-per_site, kind="stable").tolist()
                  if not self.partitioned[s]]
        got = 0
        for n, site in enumerate(usable):
            got += int(per_site[site])
            if got >= count:
                return super().place(count, whole_ultraservers,
                                     self._within(free, usable[: n + 1]))
        return None


def cut_off(t: SitesTimeline, run: SiteJob) -> bool:
    """A job holding instances on both sides of a partition: it cannot train."""
    if not t.partitioned.any() or not run.held_count:
        return False
    b = t.site_first_instance.tolist()
    sites = [s for s in range(len(b) - 1) if run.held_mask[b[s]: b[s + 1]].any()]
    return len(sites) > 1 and bool(t.partitioned[sites].any())


class SiteEvents:
    """Every site event process of the scenario, superposed (one stream, as failures)."""

    def __init__(self, timeline: SitesTimeline, network: SiteNetwork, events: list[SiteEventSpec]):
        self.t = timeline
        self.network = network
        self.rng = np.random.default_rng(timeline.site_seed)
        names = list(network.names)
        # (event spec, site) per process: an event without a site is one process per site.
        self.processes = [(e, names.index(e.site) if e.site is not None else s)
                          for e in events for s in ([0] if e.site is not None
                                                    else range(network.count))]
        self.rates = np.array([e.rate_per_s for e, _ in self.processes])
        self.total = float(self.rates.sum())
        self.count: dict[str, int] = {}
        self.down_s = 0.0  # instance-seconds downed by power and cooling
        self.partition_s = 0.0  # site-seconds cut off

    def run(self):
        env = self.t.env
        cumulative = np.cumsum(self.rates) / self.total
        while True:
            yield env.timeout(self.rng.exponential(1.0 / self.total))
            index = int(np.searchsorted(cumulative, self.rng.random(), side="right"))
            event, site = self.processes[min(index, len(self.processes) - 1)]
            self.count[event.kind] = self.count.get(event.kind, 0) + 1
            if event.kind == "partition":
                env.process(self._partition(event, site))
            else:
                env.process(self._outage(event, site))

    def _outage(self, event: SiteEventSpec, site: int):
        """Power or cooling: a block of whole UltraServers of the site down for a while."""
        t = self.t
        first = int(self.network.first_instance[site])
        size = self.network.instances[site]
        ipu = t.ipu
        units = size // ipu
        hit = max(1, min(units, math.ceil(event.share * units)))
        start = int(self.rng.integers(units - hit + 1))
        block = np.arange(first + start * ipu, first + (start + hit) * ipu)
        downed = block[t.healthy[block] & (t.owner[block] >= FREE)]  # not serving, not down
        now = t.env.now
        t.set_healthy(downed, False)
        t.instance_down_since[downed] = now
        component = f"site-{event.kind}"
        faults = t.faults
        faults.failures[component] += 1
        faults.failures_by_cause[component] += 1
        owners = t.owner[downed]
        if t.recorder is not None and len(block):
            t.recorder.event(now, "failure", component, int(block[0]) * t.cpi, int(block[0]),
                             int(owners.max()) if len(owners) and owners.max() >= 0 else -1)
        for job in np.unique(owners[owners >= 0]).tolist():
            t.jobs[job].interrupt(component, downed[owners == job].tolist())
        if len(downed):
            t.scheduler.record_state()
        yield t.env.timeout(event.duration_s)
        t.set_healthy(downed, True)
        self.down_s += len(downed) * event.duration_s
        if t.recorder is not None:
            for inst in downed.tolist():
                faults.record_down(inst, t.env.now)
        lost = downed[t.owner[downed] < 0]  # back to the pool; any still owned stay
        t.set_owner(lost, FREE)
        t.release(lost.tolist())

    def _partition(self, event: SiteEventSpec, site: int):
        """The site cut off from the others: jobs spanning it stop until it is back."""
        t = self.t
        t.partitioned[site] += 1
        component = "site-partition"
        t.faults.failures[component] += 1
        t.faults.failures_by_cause[component] += 1
        if t.recorder is not None:
            t.recorder.event(t.env.now, "failure", component, -1, -1, -1)
        for run in t.jobs:  # (None: not arrived yet)
            if run is not None and run.state in ("running", "checkpointing", "restarting",
                                                 "restoring") and (
                    cut_off(t, run)):
                run.interrupt(component, [])
        yield t.env.timeout(event.duration_s)
        self.partition_s += event.duration_s
        t.partitioned[site] -= 1
        t.wake_waiting()
        t.scheduler.schedule()


def cross_site_seconds(model: StepModel, job: Any, held: np.ndarray) -> float:
    """What the cross-site reduction adds to the job's mean step on these instances (0 in
    one site): (sync step - local step) / steps per cross-site average."""
    if spread_shape(model.topology, held) is None:
        return 0.0
    step = cross_site_step(model, job, job.name, held)
    if step is None:
        return 0.0
    return max(0.0, step.sync_step_s - step.local_step_s) / step.every


def max_min_speeds(uses: list[set]) -> list[float]:
    """Max-min fair speeds (0..1) of flows each using a set of unit-capacity links at full
    rate alone: progressive filling, as `collectives.contention.simultaneous` shares links."""
    frozen = [not u for u in uses]
    speed = [1.0 if f else 0.0 for f in frozen]
    links = set().union(*uses) if uses else set()
    while not all(frozen):
        active = [i for i, f in enumerate(frozen) if not f]
        step = min(1.0 - speed[i] for i in active)
        for link in links:
            growth = sum(1 for i in active if link in uses[i])
            if growth:
                load = sum(speed[i] for i in range(len(uses)) if link in uses[i])
                step = min(step, max(0.0, 1.0 - load) / growth)
        for i in active:
            speed[i] += step
        full = {link for link in links
                if sum(speed[i] for i in range(len(uses)) if link in uses[i]) >= 1 - 1e-9}
        for i in active:
            if speed[i] >= 1 - 1e-12 or uses[i] & full:
                frozen[i] = True
    return speed


def share_site_links(t: UplinksTimeline) -> None:
    """Jobs spread over sites share the inter-site links their rings over the sites use,
    max-min fairly: each one's cross-site reduction is slowed by 1 / its share (the
    link-limited case; a job alone on its links is not slowed). Shared again only once
    `t.site_changed` says a spread job was placed, added or removed instances, or ended
    (most calls, after a pass that placed jobs in one site, find nothing to do)."""
    network = getattr(t, "site_network", None)
    if network is None or not t.site_changed:
        return  # (nothing it reads changed since the last share: the same speeds)
    t.site_changed = False
    bounds = t.site_first_instance.tolist()
    # (the candidates are the jobs whose placement crossed sites, in job order: the same
    # list as a scan of every job, without the scan; a done one never comes back)
    spread = []
    for index in sorted(t.site_spread):
        r = t.jobs[index]
        if r.state == "done" or getattr(r, "site_cross_s", 0.0) <= 0:
            t.site_spread.discard(index)
        elif r.held_count:
            spread.append(r)
    uses = []
    for run in spread:
        if run.site_links is None:  # (kept until its instances change)
            run.site_links = _site_links(network, bounds, run.held_mask)
        uses.append(run.site_links)
    # The same jobs on the same links as at the last call (most placements are of jobs in
    # one site): the same speeds.
    key = (tuple(run.index for run in spread), tuple(uses))
    last = t.site_speeds
    if last is not None and last[0] == key:
        speeds = last[1]
    else:
        # The speeds depend on the links alone: the few sets of links a month's spread jobs
        # use come back again and again (a replacement redraws a job's links, the same ones).
        speeds = _SPEEDS_KEPT.get(key[1])
        if speeds is None:
            speeds = max_min_speeds([set(u) for u in uses])
            if len(_SPEEDS_KEPT) >= _SPEEDS_KEEP:
                del _SPEEDS_KEPT[next(iter(_SPEEDS_KEPT))]
            _SPEEDS_KEPT[key[1]] = speeds
        t.site_speeds = (key, speeds)
    for run, speed in zip(spread, speeds, strict=True):
        run.set_site_slowdown(1.0 / speed if speed > 0 else 1.0)


# `max_min_speeds` by the jobs' links (frozensets, in job order), the oldest dropped past the
# bound: a pure function of them, kept across shares.
_SPEEDS_KEPT: dict[tuple, list[float]] = {}
_SPEEDS_KEEP = 4096


def _site_links(network: Any, bounds: list[int], held_mask: np.ndarray) -> frozenset:
    """The inter-site links a ring over the sites holding these instances uses."""
    sites = [s for s in range(network.count) if held_mask[bounds[s]: bounds[s + 1]].any()]
    links: set = set()
    for i, a in enumerate(sites):
        b = sites[(i + 1) % len(sites)]
        if a == b:
            continue
        if network.direct(a, b):
            links.add((a, b))
        else:  # a's access link out, b's access link in
            links |= {("out", a), ("in", b)}
    return frozenset(links)
