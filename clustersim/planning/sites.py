"""`plan` on a cluster of several sites: for a job larger than any one site, its best
configuration spread over the sites (synchronous, and with a cross-site average every H
steps) beside the same configuration cut down to the largest single site.

The plan searches parallelism on one EFA fabric (as for one site); this adds the step of the
best candidate on the scenario's sites (`clustersim.training.sites`), and of its largest
data-parallel cut that fits in one site (the same batch per replica, so fewer tokens per
step). Figures are per step (time, tokens/s, cost per million tokens at the catalog's
price); failures are the plan's own.
"""

from __future__ import annotations

from typing import Any

from clustersim.hardware.build import build_topology
from clustersim.scenario.loader import Scenario
from clustersim.training.sites import CrossSiteSyncSpec, cross_site_step
from clustersim.training.step import StepModel
from clustersim.training.workload import ParallelismSpec

__all__ = ["site_options", "DEFAULT_SYNC_EVERY"]

DEFAULT_SYNC_EVERY = 16  # the less frequent option when the job gives none


def _job_of(base: Any, row: dict[str, Any], dp: int, global_batch: int, instances: int,
            sync: CrossSiteSyncSpec | None) -> Any:
    par = ParallelismSpec(tp=row["tp"], pp=row["pp"], dp=dp, ep=row["ep"],
                          interleave=row["interleave"], zero=int(row["zero"]), cp=int(row["cp"]),
                          sequence_parallel=bool(row["sequence_parallel"]),
                          order=row.get("order", "tp-cp-pp-dp"))
    return base.model_copy(update={"parallelism": par, "micro_batch": row["micro_batch"],
                                   "recompute": row["recompute"], "global_batch": global_batch,
                                   "instances": instances, "cross_site_sync": sync})


def _figures(option: str, job: Any, instances: int, step_s: float, price: float | None,
             chips_per_instance: int, **more: Any) -> dict[str, Any]:
    tokens = job.global_batch * job.sequence_length
    cost = None if price is None else price * instances * step_s / 3600 / tokens * 1e6
    return {"option": option, "chips": instances * chips_per_instance,
            "dp": job.parallelism.dp, "step_time_s": step_s, "tokens_per_s": tokens / step_s,
            "cost_per_million_tokens_usd": cost, **more}


def site_options(scenario: Scenario, best: dict[str, Any]) -> dict[str, Any] | None:
    """The spread and one-site options of the plan's best candidate (on the scenario's
    hardware); None for a single-site cluster."""
    net = scenario.site_network
    if net is None or best.get("hardware") != scenario.hardware.name:
        return None
    hw = scenario.hardware
    rpi = hw.ranks_per_instance
    ipu = hw.instances_per_ultraserver
    base = scenario.jobs[0]
    instances = best["chips"] // hw.chips_per_instance
    working = [n - s for n, s in zip(net.instances, net.spares, strict=True)]
    largest = max(working)
    site = working.index(largest)
    price = hw.instance.price_per_hour_usd
    out: dict[str, Any] = {"sites": net.count, "job_chips": best["chips"],
                           "largest_site_chips": largest * hw.chips_per_instance,
                           "fits_one_site": instances <= largest, "options": []}
    if instances <= largest:
        return out
    topology = build_topology(hw, scenario.total_instances, scenario.cluster.fabric, net)
    model = StepModel(topology)
    per_replica = base.global_batch // best["dp"]
    every = (base.cross_site_sync.every if base.cross_site_sync is not None
             and base.cross_site_sync.every > 1 else DEFAULT_SYNC_EVERY)
    factor = base.cross_site_sync.convergence_factor if base.cross_site_sync else 1.0
    # Spread from the cluster's first instance, as `run` places it.
    spread = _job_of(base, best, best["dp"], base.global_batch, instances,
                     CrossSiteSyncSpec(every=every, convergence_factor=factor))
    crossing = cross_site_step(model, spread, "plan")
    if crossing is None:  # within a site after all (spares counted): nothing to compare
        return out
    out["options"].append(_figures("spread, synchronous", spread, instances,
                                   crossing.sync_step_s, price, hw.chips_per_instance,
                                   sites=crossing.sites))
    out["options"].append(_figures(
        f"spread, cross-site average every {every} steps", spread, instances,
        crossing.mean_step_s, price, hw.chips_per_instance, sites=crossing.sites,
        convergence_factor=factor,
        tokens_per_s_at_equal_loss=crossing.tokens_per_step / crossing.mean_step_s / factor))
    # The largest data-parallel cut of it that one site holds (whole UltraServers when
    # its tensor parallelism needs them).
    group = best["tp"] * best["pp"] * max(1, best["ep"])
    replica = best["tp"] * best["cp"] * best["pp"]  # ranks of one data-parallel replica
    dp = min(best["dp"], largest * rpi // replica)
    while dp > 0:
        ranks = replica * dp
        fits = ranks % rpi == 0 and dp % max(1, best["ep"]) == 0
        count = ranks // rpi if fits else 0
        if fits and (not hw.whole_ultraservers(best["tp"]) or count % ipu == 0):
            break
        dp -= 1
    if dp > 0 and group:
        count = replica * dp // rpi
        one = _job_of(base, best, dp, per_replica * dp, count, None)
        first = int(net.first_instance[site])
        profile = model.profile(one, "plan", instances=list(range(first, first + count)))
        out["options"].insert(0, _figures("largest single site", one, count,
                                          profile.step_time_s, price, hw.chips_per_instance,
                                          sites=1))
    return out
