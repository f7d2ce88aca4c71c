"""Training across sites: what the cross-site gradient reduction costs a step, and the
option of synchronising across sites less often (local steps, then a cross-site average, as
DiLoCo-style methods do).

A job placed over several sites has data-parallel groups spanning them; the step model
prices their reduction with the collectives' site level (reduce inside each site, exchange
over the inter-site links, gather back). With `cross_site_sync: {every: H}` the job
reduces across sites once every H steps; the other steps reduce only inside each site.
Their time is the same step with the site level taken out of the topology (the
data-parallel groups then end at the EFA fabric), so

    mean step = (step with the cross-site reduction + (H - 1) x local step) / H

and the cross-site traffic falls H-fold. What the less frequent averaging does to the
loss is not modelled: `convergence_factor` (the tokens needed for the same loss, relative
to synchronous training; 1 by default) is the user's, and the figures report tokens/s both
as trained and divided by it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from clustersim.hardware.spec import Spec
from clustersim.training.memory import weight_bytes_per_param
from clustersim.training.shape import spread_shape

if TYPE_CHECKING:
    from clustersim.hardware.topology import Topology
    from clustersim.training.profile import StepProfile
    from clustersim.training.step import StepModel

__all__ = ["CrossSiteSyncSpec", "CrossSiteStep", "site_local", "cross_site_step",
           "site_profile"]


class CrossSiteSyncSpec(Spec):
    """Synchronise across sites once every `every` steps (local steps in between)."""

    every: int = Field(default=1, ge=1, le=1_000_000,
                       description="steps between cross-site averages; 1 is synchronous")
    convergence_factor: float = Field(
        default=1.0, ge=1.0, le=100.0,
        description="tokens needed for the same loss relative to synchronous training "
        "(your estimate; not modelled)")


@dataclass(frozen=True)
class CrossSiteStep:
    """A job's step over several sites, synchronous and with local steps."""

    sites: int
    sync_step_s: float  # with a cross-site reduction
    local_step_s: float  # reduction inside each site only
    every: int
    convergence_factor: float
    cross_site_bytes_per_sync: float  # leaving each site, per synchronisation
    tokens_per_step: int

    @property
    def mean_step_s(self) -> float:
        return (self.sync_step_s + (self.every - 1) * self.local_step_s) / self.every

    def figures(self) -> dict[str, Any]:
        mean = self.mean_step_s
        return {
            "sites": self.sites,
            "sync_every_steps": self.every,
            "step_time_sync_s": self.sync_step_s,
            "step_time_local_s": self.local_step_s,
            "step_time_mean_s": mean,
            "cross_site_cost_per_sync_s": self.sync_step_s - self.local_step_s,
            "cross_site_bytes_per_site_per_step": self.cross_site_bytes_per_sync / self.every,
            "cross_site_bytes_saved_fraction": 1 - 1 / self.every,
            "step_time_saved_s": self.sync_step_s - mean,
            "convergence_factor": self.convergence_factor,
            "tokens_per_s": self.tokens_per_step / mean,
            "tokens_per_s_at_equal_loss": self.tokens_per_step / mean / self.convergence_factor,
        }


def site_local(topology: Topology) -> Topology:
    """The same topology with its site level taken out: collectives over several sites end
    at the EFA fabric (each site's reduction alone, costed as if one Clos held them)."""
    return dataclasses.replace(topology, sites=None, chip_site=None, first_site=-1,
                               spines_per_site=-1, _graph=None, _graph_factory=None,
                               _path_cache={}, _ring_cache={})


def _local_model(model: StepModel) -> StepModel:
    """A step model on the site-local twin of the model's topology (kept on the model)."""
    from clustersim.training.step import StepModel

    found = getattr(model, "_site_local_model", None)
    if found is None:
        found = StepModel(site_local(model.topology))
        model._site_local_model = found  # type: ignore[attr-defined]
    return found


def cross_site_step(model: StepModel, job: Any, name: str = "job",
                    instances: Any = None) -> CrossSiteStep | None:
    """The job's step on its instances (default: from instance 0) with and without the
    cross-site reduction; None when they are all in one site."""
    placed = model._placement(job, 0, instances)
    spread = spread_shape(model.topology, placed)
    if spread is None:
        return None
    split, canonical = spread
    sites = len(split)
    # Cached by job and split: the timeline asks at every placement of a spread job.
    cache = model.__dict__.setdefault("_cross_site_cache", {})
    key = (id(job), name, split)
    if key in cache and cache[key][0] is job:
        return cache[key][1]
    sync = model.profile(job, name, instances=canonical)
    # The twin sees no sites: the split's canonical placement (as the step model caches it).
    local = _local_model(model).profile(job, name, instances=canonical)
    spec = getattr(job, "cross_site_sync", None) or CrossSiteSyncSpec()
    # A site sends 2 (S - 1) / S of the gradients in a ring all-reduce over S sites (or the
    # parameter deltas, as large, when averaging after local steps).
    _, grad_bytes, _ = weight_bytes_per_param(job.precision,
                                              model.hardware.chip.framework.gradients)
    exchanged = 2 * (sites - 1) / sites * job.model.parameter_count() * grad_bytes
    step = CrossSiteStep(sites=sites, sync_step_s=sync.step_time_s,
                         local_step_s=min(local.step_time_s, sync.step_time_s),
                         every=spec.every, convergence_factor=spec.convergence_factor,
                         cross_site_bytes_per_sync=exchanged,
                         tokens_per_step=sync.tokens_per_step)
    cache[key] = (job, step)
    return step


def site_profile(model: StepModel, job: Any, name: str | None = "job",
                 instances: Any = None) -> StepProfile:
    """The job's step profile on its instances; with `cross_site_sync` and a placement over
    several sites, at the mean step time of its local and synchronising steps. (`name`
    None: any name, as `StepModel.profile`.)"""
    profile = model.profile(job, name, instances=instances)
    spec = getattr(job, "cross_site_sync", None)
    if spec is None or spec.every == 1:
        return profile
    step = cross_site_step(model, job, name, instances)
    if step is None:
        return profile
    mean = step.mean_step_s
    notes = (*profile.notes, f"cross-site average every {step.every} steps: mean step "
             f"{mean:.3f} s (synchronising {step.sync_step_s:.3f} s, local "
             f"{step.local_step_s:.3f} s); convergence factor {step.convergence_factor:g} "
             "(set, not modelled)")
    scale = mean / profile.step_time_s
    return dataclasses.replace(
        profile, step_time_s=mean, notes=notes,
        energy_per_token_j=None if profile.energy_per_token_j is None else
        profile.energy_per_token_j * scale,
        cost_per_million_tokens_usd=None if profile.cost_per_million_tokens_usd is None else
        profile.cost_per_million_tokens_usd * scale)
