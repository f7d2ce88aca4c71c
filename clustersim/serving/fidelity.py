"""Which level a fluid deployment's figures come from, and whether the fluid level was checked
there: `fidelity: auto` uses the fluid level only inside the range its queueing model was
checked on against the request level (queueing.CHECKED: peak utilisation and prompt spread).

`fidelity_choice` (clustersim.scenario.fleetday) picks by scale: auto is fluid only where the
request level cannot run the deployment (autoscaling, or more requests than AUTO_REQUESTS),
else the request level. Before a run, `settle_auto` sends a deployment past AUTO_REQUESTS
without autoscaling back to the request level when its load is outside the checked range
and the request level can run the scenario. Where fluid remains, this module checks the deployment's expected
peak utilisation (its load's peak over the run, over the replicas it holds then, at a
replica's saturated capacity) and prompt sigma against CHECKED; outside, the run says so
(the reason, `fidelity_checked: false` in summary.json and a warning row in the run
table)."""

from __future__ import annotations

import math
from typing import Any

from clustersim.hardware import limits
from clustersim.scenario.fleetday import fidelity_choice, is_fleet_day
from clustersim.scenario.models import Scenario
from clustersim.scenario.serving import DeploymentSpec, expected_requests
from clustersim.serving.curves import replica_curve
from clustersim.serving.fleetday_state import DeploymentState
from clustersim.serving.queueing import checked, checked_text

__all__ = ["prompt_sigma", "expected_peak_utilisation", "fluid_fidelity", "settle_auto"]


def prompt_sigma(d: DeploymentSpec) -> float:
    """The prompt lengths' lognormal sigma (0 for fixed lengths)."""
    spec = d.workload.input_tokens
    return float(spec.sigma) if spec.distribution == "lognormal" else 0.0


def expected_peak_utilisation(dep: DeploymentState) -> float:
    """Load over capacity at the load's peak over the run (its curve with its noise, or its
    rate), on the replicas the deployment holds then: its fixed count, or what the
    autoscaler provisions for the peak (within its minimum and maximum)."""
    peak = float(dep.rates.max()) if len(dep.rates) else 0.0
    replicas = math.ceil(peak / dep.per_replica_rate - 1e-9)
    replicas = max(dep.minimum, min(dep.maximum, replicas), 1)
    capacity = dep.curve.capacity_per_s
    return peak / (replicas * capacity) if capacity > 0 else math.inf


def _range() -> str:
    return checked_text()


def fluid_fidelity(dep: DeploymentState, duration_s: float) -> dict[str, Any]:
    """summary.json `fidelity` and `fidelity_reason` of a deployment the fluid level ran; for
    `fidelity: auto`, also `fidelity_checked`, `peak_utilisation` and `prompt_sigma`."""
    level, why = fidelity_choice(dep.spec, duration_s)
    out: dict[str, Any] = {"fidelity": "fluid", "fidelity_reason": why}
    if dep.spec.fidelity != "auto" or level != "fluid":
        return out
    utilisation, sigma = expected_peak_utilisation(dep), prompt_sigma(dep.spec)
    inside = checked(utilisation, sigma)
    where = f"peak utilisation {utilisation:.0%}, prompt sigma {sigma:g}"
    if inside:
        out["fidelity_reason"] = f"{why}; {where}, inside the fluid level's checked range"
    else:
        # the request level is refused here (autoscaling or scale): fluid, said loudly
        out["fidelity_reason"] = (f"{why}; {where} is OUTSIDE the range the fluid level is "
                                  f"checked on ({_range()}): its latency figures are unchecked")
    out.update(fidelity_checked=inside, peak_utilisation=utilisation, prompt_sigma=sigma)
    return out


def settle_auto(scenario: Scenario) -> Scenario:
    """The scenario with each `auto` deployment that the scale sends to the fluid level
    without autoscaling, and whose peak utilisation (its curve's peak before noise on its
    replicas) or prompt sigma is outside CHECKED, at the request level instead, when the
    request level can run the scenario: no other deployment fluid (a run has one level) and
    at most limits.MAX_SERVED_REQUESTS requests. Otherwise the scenario unchanged (the fluid
    figures then come flagged: `fluid_fidelity`)."""
    duration_s = scenario.duration_s
    outside = {}
    for d in scenario.serve:
        if (d.fidelity != "auto" or d.autoscale is not None
                or fidelity_choice(d, duration_s)[0] != "fluid"):
            continue
        try:
            capacity = replica_curve(scenario, d).capacity_per_s
        except ValueError:  # a replica that serves nothing: the fleet day says so
            return scenario
        w = d.workload
        peak = w.load.peak_per_s() if w.load is not None else float(w.rate_per_s or 0.0)
        utilisation, sigma = peak / (d.replicas * capacity), prompt_sigma(d)
        if not checked(utilisation, sigma):
            outside[d.name] = (f"peak utilisation {utilisation:.0%}, prompt sigma {sigma:g} "
                               f"is outside the range the fluid level is checked on "
                               f"({_range()})")
    if not outside:
        return scenario
    serve = []
    for d in scenario.serve:
        if d.name in outside:
            d = d.model_copy()
            d._fluid_unchecked = outside[d.name]
        serve.append(d)
    settled = scenario.model_copy(update={"serve": serve})
    if is_fleet_day(settled) or sum(expected_requests(d, duration_s) for d in serve) > (
            limits.MAX_SERVED_REQUESTS):
        return scenario
    return settled
