"""The runner's side of a fleet-day run (docs/fleet-day.md): the fluid fleet model in place
of the timeline and the request-level simulator, its summary and its Parquet tables; and the
comparison of the two levels for deployments small enough for both (`fidelity: auto`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clustersim.scenario.models import FailuresSpec, Scenario
from clustersim.serving.fleetday import simulate_fleet_day
from clustersim.serving.fleetday_figures import day_table, fleet_day_figures, fleet_table
from clustersim.serving.fleetday_state import FleetDayResult
from clustersim.serving.simulate import ServingResult
from clustersim.training.profile import StepProfile

__all__ = ["run_fleet_day", "compare_levels"]


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
        f, r = fluid[d.name], requests[d.name]
        out[d.name] = {"fluid": {k: f[k] for k in (
            "requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
            "slo_goodput")}}
        out[d.name]["relative_difference"] = {
            k: _relative(f[k], r.get(k)) for k in out[d.name]["fluid"]}
    return out
