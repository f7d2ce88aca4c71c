"""The runner's side of a fleet-day run (docs/fleet-day.md): the fluid fleet model in place
of the timeline and the request-level simulator, its summary and its Parquet tables; and the
comparison of the two levels for deployments small enough for both (`fidelity: auto`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clustersim.cluster.fluid_holding import Holding
from clustersim.cluster.outcomes import TimelineResult
from clustersim.scenario.fleetday import fidelity_choice
from clustersim.scenario.models import FailuresSpec, Scenario
from clustersim.serving.fleetday import simulate_fleet_day
from clustersim.serving.fleetday_figures import day_table, fleet_day_figures, fleet_table
from clustersim.serving.fleetday_state import FleetDayResult
from clustersim.serving.fluid_fleet import fluid_fleet_figures
from clustersim.serving.fluid_plan import FluidPlan
from clustersim.serving.simulate import ServingResult
from clustersim.training.profile import StepProfile

__all__ = ["run_fleet_day", "compare_levels", "holdings_of", "add_fluid_figures"]


def run_fleet_day(scenario: Scenario, seed: int, steps: dict[str, StepProfile],
                  trace_dir: Path | None, metadata: dict[str, Any]
                  ) -> tuple[FleetDayResult, dict[str, Any]]:
    """Simulate the fleet; with `trace_dir`, write day.parquet and fleet.parquet there."""
    from clustersim.runner.outputs import write_serving_table

    result = simulate_fleet_day(scenario, seed, steps)
    figures = fleet_day_figures(scenario, result)
    if trace_dir is not None and scenario.trace.enabled:
        write_serving_table(Path(trace_dir), "day", day_table(result), metadata)
        write_serving_table(Path(trace_dir), "fleet", fleet_table(result), metadata)
    return result, figures


def _relative(fluid: float | None, requests: float | None) -> float | None:
    if fluid is None or requests is None or requests == 0:
        return None
    return fluid / requests - 1.0


def compare_levels(scenario: Scenario, seed: int, requests: dict[str, dict[str, Any]],
                   serving: ServingResult) -> dict[str, dict[str, Any]]:
    """For each `fidelity: auto` deployment the request-level simulator ran, the fluid
    model's figures for the same deployment (same curve and noise, no failures, no jobs) and
    their relative differences (fluid / requests - 1). A deployment replaying a trace has no
    rate for the fluid level: not compared."""
    auto = [d for d in scenario.serve if d.fidelity == "auto" and d.workload.arrival != "trace"]
    if not auto:
        return {}
    alone = scenario.model_copy(update={"jobs": [], "failures": FailuresSpec()})
    alone._source = scenario.source
    # The auto deployments alone (the others' curves are not needed, and a trace's cannot
    # be measured), each at its index in the scenario (its load curve's noise stream).
    result = simulate_fleet_day(alone, seed, {}, only={d.name for d in auto})
    fluid = fleet_day_figures(alone, result)["deployments"]
    out = {}
    for d in auto:
        # which level ran it, and why (the fluid one is beside it, for comparison)
        requests[d.name]["fidelity"], requests[d.name]["fidelity_reason"] = fidelity_choice(
            d, scenario.duration_s)
        f, r = fluid[d.name], requests[d.name]
        out[d.name] = {"fluid": {k: f[k] for k in (
            "requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
            "slo_goodput", "cost_per_million_output_tokens_usd")}}
        out[d.name]["relative_difference"] = {
            k: _relative(f[k], r.get(k)) for k in out[d.name]["fluid"]}
    return out


def holdings_of(scenario: Scenario, plans: list[FluidPlan] | None) -> list[Holding] | None:
    """What the timeline needs of fluid deployments' plans (cluster.fluid_holding)."""
    if not plans:
        return None
    hw = scenario.hardware
    return [Holding(p.name, p.dep.priority, hw.whole_ultraservers(p.dep.spec.tp),
                    p.change_s, p.instances) for p in plans]


def add_fluid_figures(scenario: Scenario, plans: list[FluidPlan],
                      timelines: list[TimelineResult], summary: dict[str, Any]) -> None:
    """summary.json of a run whose timeline held fluid deployments: `deployments`, `serving`
    (the fleet's serving chip-hours, tokens and cost: the first replication's, said by
    `serving_replication` when there are several) and, in `cluster`, the chip-time held by
    serving (the mean over the replications) beside the jobs' `utilisation` (the rest idle
    or down)."""
    from clustersim.runner.figures import combine_replications

    timeline = timelines[0]
    deployments, serving = fluid_fleet_figures(scenario, plans, timeline.holdings)
    summary["deployments"] = deployments
    summary["serving"] = serving
    if len(timelines) > 1:
        summary["serving_replication"] = 0
    cluster = summary["cluster"]
    cluster["serving_instances"] = None  # they vary: deployments.<name>
    cluster.update(combine_replications([{"serving_utilisation": (
        t.holdings.chip_s(t.horizon_s) / (t.total_chips * t.horizon_s)
        if t.total_chips * t.horizon_s else 0.0)} for t in timelines]))
    cluster["idle_or_down_share"] = 1.0 - cluster["serving_utilisation"] - cluster["utilisation"]
