"""Sharing leaf uplinks: jobs spread over several leaves slow one another's crossing traffic
on an oversubscribed fabric."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from clustersim.cluster.sites import cross_site_seconds, share_site_links
from clustersim.collectives.groups import AsymmetricGroupError
from clustersim.training.shape import spread_shape
from clustersim.training.sites import site_profile

if TYPE_CHECKING:
    from clustersim.cluster.ports import UplinkJob, UplinksTimeline
    from clustersim.training.profile import StepProfile
    from clustersim.training.step import StepModel

__all__ = ["share_uplinks", "UplinkBook", "UplinkPacing", "REPLACED_SHARE"]

# Replacements a job's step may run on its last exact solve, as a share of its instances:
# past it the placement is solved again (the error is measured in tests/test_rainier_year.py:
# none at twice this share). Without the UltraServer-fill condition (`ultraserver_class`) a
# 64-instance job's step moved 11% when one instance was replaced (an UltraServer's ring
# broken), and rainier-1m-4-sites-mix's research-0020 (256 instances) 0.6%.
REPLACED_SHARE = 1 / 32


class UplinkBook:
    """Leaf uplink demand, kept incrementally: each job spread over several leaves puts its
    instances' EFA bandwidth on every leaf it spans. A job's share is looked at again only
    when the demand on one of its leaves changed (not every spread job at every pass)."""

    def __init__(self, t: UplinksTimeline):
        self.t = t
        fabric = t.scenario.cluster.fabric
        # A leaf's uplinks carry all its instances' EFA on a non-blocking fabric: never
        # oversubscribed, nothing to keep.
        self.enabled = t.n_leaves > 1 and fabric.oversubscription > 1.0
        self.efa = t.scenario.hardware.instance.efa_bytes_per_s
        self.capacity = t.per_leaf * self.efa / fabric.oversubscription
        self.demand = np.zeros(t.n_leaves, dtype=np.int64)  # instances of spread jobs
        self.on_leaf: dict[int, set[int]] = {}  # leaf -> spread jobs on it
        self.counts: dict[int, dict[int, int]] = {}  # job -> {leaf: its instances there}
        self.dirty: set[int] = set()  # leaves whose demand changed since the last share

    def update(self, run: UplinkJob) -> None:
        """A job's holding, state or spread changed: move its demand."""
        if not self.enabled:
            return
        new: dict[int, int] = {}
        if run.held_count and run.state != "done" and run.spans_leaves:
            leaves, counts = np.unique(self.t.instance_leaf[run.held], return_counts=True)
            new = dict(zip(leaves.tolist(), counts.tolist(), strict=True))
        old = self.counts.get(run.index, {})
        if new == old:
            return
        for leaf, count in old.items():
            self.demand[leaf] -= count
            self.on_leaf[leaf].discard(run.index)
            self.dirty.add(leaf)
        for leaf, count in new.items():
            self.demand[leaf] += count
            self.on_leaf.setdefault(leaf, set()).add(run.index)
            self.dirty.add(leaf)
        if new:
            self.counts[run.index] = new
        else:
            self.counts.pop(run.index, None)

    def share(self) -> None:
        """Each spread job on a leaf whose demand changed: its slowdown, in job order."""
        if not self.dirty:
            return
        touched: set[int] = set()
        for leaf in self.dirty:
            touched |= self.on_leaf.get(leaf, set())
        self.dirty.clear()
        for index in sorted(touched):
            worst = 1.0
            for leaf, count in self.counts[index].items():
                together = max(1.0, float(self.demand[leaf]) * self.efa / self.capacity)
                alone = max(1.0, count * self.efa / self.capacity)
                worst = max(worst, together / alone)
            self.t.jobs[index].set_uplink_slowdown(worst)


def share_uplinks(t: UplinksTimeline) -> None:
    """Jobs spread over several leaves send their data-parallel traffic through the leaf
    uplinks. Each such job puts its instances' EFA bandwidth on every leaf it spans; where
    that demand exceeds a leaf's uplink capacity (its instances' EFA over the
    oversubscription) the crossing traffic is slowed by demand / capacity. A job's own
    demand is already in its step profile (its collectives were costed on the uplinks),
    so what sharing adds is the slowdown with everyone over the slowdown alone, at its
    worst leaf. On a non-blocking fabric demand never exceeds capacity. (The demand is kept
    by `UplinkBook` as jobs come and go.)"""
    share_site_links(t)  # and the inter-site links (clustersim.cluster.sites)
    t.uplinks.share()


class UplinkPacing:
    """A job's step time on its placement, and its share of the leaf uplinks it spans.

    A part of JobRun (`clustersim.cluster.jobrun`), which holds the state these methods keep.
    """

    def _placed(self, replaced: int = 0) -> None:
        """The step time of the current placement (a job spread wider pays on the fabric).
        After `replaced` instances replaced failed ones, in one site, a placement whose shape
        was never simulated keeps the step of the last one solved exactly, until more than
        REPLACED_SHARE of its instances were replaced since (`replacement_profile`)."""
        model = self.t.step_model
        if model is None or self.held_count != self.instances_needed:
            return
        profile = self.replacement_profile(model, replaced)
        if profile is None:
            try:
                # (its figures only: the profile as cached, whatever its name)
                profile = site_profile(model, self.job, None, instances=self.held)
            except AsymmetricGroupError:
                # Replacements from another NeuronSwitch UltraServer left a group held
                # unevenly by two (the step model's hierarchical collectives need every
                # UltraServer to hold the same chips of it): it keeps the step of its last
                # placement solved, as a replacement of a shape not simulated does.
                if (not replaced or self.solved_profile is None
                        or not model.hardware.switch_spans_ultraserver):
                    raise
                profile = self.solved_profile
                self.replaced_since_solved += replaced
            else:
                self.solved_profile, self.replaced_since_solved = profile, 0
                self.solved_class, self.solved_held = None, self.held  # (read-only: kept)
        self.placed_step_time = profile.step_time_s
        leaves = self.t.instance_leaf[self.held]
        # (over several leaves or not: the lowest and highest leaf, no sort of its leaves)
        self.spans_leaves = len(leaves) > 1 and bool(leaves.min() != leaves.max())
        # What crosses leaf uplinks: the exposed data-, pipeline- and expert-parallel
        # communication of a job spread over several leaves (tensor parallelism stays inside
        # instances).
        exposed = profile.exposed_comm_s
        self.fabric_exposed_s = (exposed.get("dp", 0.0) + exposed.get("pp", 0.0)
                                 + exposed.get("ep", 0.0)) if self.spans_leaves else 0.0
        if self.t.site_network is not None:  # what its cross-site reduction adds, alone
            self.site_cross_s = cross_site_seconds(model, self.job, self.held)
            if self.site_cross_s > 0 or self.index in self.t.site_spread:
                self.t.site_spread.add(self.index)  # (dropped at the next share if 0)
                self.t.site_changed = True
        self.step_time = self.placed_step_time * self.fabric_factor_step()
        if self.outcome.placement_step_time_s is None:
            self.outcome.placement_step_time_s = profile.step_time_s
        self.t.uplinks.update(self)
        share_uplinks(self.t)  # its traffic now loads the leaves it spans

    def replacement_profile(self, model: StepModel, replaced: int) -> StepProfile | None:
        """The last exactly solved profile, for a placement `replaced` instances away from
        the last one: in one site before and after, when the new shape is not cached (a
        cached one is exact at no cost) and at most REPLACED_SHARE of the job's instances
        were replaced since the exact solve. A replacement moves a few of thousands of
        instances to other UltraServers; the step differs from the solved one by what those
        few change in the slowest data-parallel group (tests/test_rainier_year.py measures
        it against the exact re-solve). None: solve exactly."""
        solved = self.solved_profile
        if not replaced or solved is None:
            return None
        since = self.replaced_since_solved + replaced
        if (since > REPLACED_SHARE * self.instances_needed
                or getattr(self, "site_cross_s", 0.0) > 0
                or spread_shape(model.topology, self.held) is not None
                or self.ultraserver_class(model) != self._solved_class(model)
                or model.has_profile(self.job, self.held)):
            return None
        self.replaced_since_solved = since
        return solved

    def ultraserver_class(self, model: StepModel, held: np.ndarray | None = None) -> tuple:
        """How the job's instances (or `held`) fill UltraServers: how many UltraServers hold
        1, 2, ... of them. A replacement that keeps it (a whole UltraServer for a whole one,
        a lone instance for a lone one) keeps the kinds of groups its reduction runs."""
        ipu = model.hardware.instances_per_ultraserver
        held = self.held if held is None else held
        counts = np.bincount(np.unique(held // ipu, return_counts=True)[1], minlength=ipu + 1)
        return tuple(counts.tolist())

    def _solved_class(self, model: StepModel) -> tuple:
        """`ultraserver_class` of the placement last solved exactly (found once, when asked)."""
        if self.solved_class is None:
            self.solved_class = self.ultraserver_class(model, self.solved_held)
            self.solved_held = None
        return self.solved_class

    def fabric_factor_step(self) -> float:
        """Step time multiplier from sharing leaf uplinks with other jobs (1 when alone)."""
        # Over several sites, its cross-site reduction slowed by other spread jobs.
        site_extra = getattr(self, "site_cross_s", 0.0) * (
            getattr(self, "site_slowdown", 1.0) - 1.0)
        if (self.fabric_exposed_s <= 0 and site_extra <= 0) or self.placed_step_time <= 0:
            return 1.0
        extra = self.fabric_exposed_s * (self.uplink_slowdown - 1.0) + site_extra
        return (self.placed_step_time + extra) / self.placed_step_time

    def set_site_slowdown(self, slowdown: float) -> None:
        """Its share of the inter-site links (clustersim.cluster.sites.share_site_links)."""
        if abs(slowdown - getattr(self, "site_slowdown", 1.0)) < 1e-9:
            return
        self.site_slowdown = slowdown
        self.outcome.contention_slowdown = max(self.outcome.contention_slowdown, slowdown)
        if self.placed_step_time > 0:
            self.step_time = self.placed_step_time * self.fabric_factor_step()
            self.pace_changed(self.t.env.now)

    def set_uplink_slowdown(self, slowdown: float) -> None:
        """The scheduler's verdict on this job's share of its leaves' uplinks."""
        if abs(slowdown - self.uplink_slowdown) < 1e-9:
            return
        self.uplink_slowdown = slowdown
        self.outcome.contention_slowdown = max(self.outcome.contention_slowdown, slowdown)
        if self.placed_step_time > 0:
            self.step_time = self.placed_step_time * self.fabric_factor_step()
            self.pace_changed(self.t.env.now)  # re-plan the running segment at the new pace
