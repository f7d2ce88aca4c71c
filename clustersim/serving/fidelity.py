"""Which level a fluid deployment's figures come from, and whether the fluid level was checked
there: `fidelity: auto` uses the fluid level only inside the range its queueing model was
checked on against the request level (queueing.CHECKED: peak utilisation and prompt spread).

`fidelity_choice` (clustersim.scenario.fleetday) picks by scale: auto is fluid only where the
request level cannot run the deployment (autoscaling, or more requests than AUTO_REQUESTS),
else the request level. Where it picked fluid, this module checks the deployment's expected
peak utilisation (its load's peak over the run, over the replicas it holds then, at a
replica's saturated capacity) and prompt sigma against CHECKED; outside, the run says so
(the reason, `fidelity_checked: false` in summary.json and a warning row in the run
table)."""

from __future__ import annotations

import math
from typing import Any

from clustersim.scenario.fleetday import fidelity_choice
from clustersim.scenario.serving import DeploymentSpec
from clustersim.serving.fleetday_state import DeploymentState
from clustersim.serving.queueing import CHECKED, checked

__all__ = ["prompt_sigma", "expected_peak_utilisation", "fluid_fidelity"]


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
    return " or ".join(f"prompt sigma up to {sigma:g} to {top:.0%}" for sigma, top in CHECKED)


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
