"""The serving planner: the cheapest configuration holding a deployment's load within its SLO
(issue 25, item 7). Its figures are the serving simulation's own, so the scenario it writes
serves at the cost it said."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli.app import app

ROOT = Path(__file__).resolve().parent.parent

# Llama 3.1 8B at 3 requests/s for two minutes: the whole search in seconds.
SMALL = {
    "name": "serve-8b", "seed": 0, "duration": "2min", "hardware": "trn2",
    "cluster": {"instances": 1},
    "serve": [{
        "name": "chat", "model": "llama3.1-8b", "precision": "bf16",
        "parallelism": {"tp": 64}, "replicas": 1, "router": "least_outstanding",
        "server": {"max_batch": 64, "max_tokens_per_iteration": 4096, "chunked_prefill": True},
        "workload": {"arrival": "poisson", "rate": "3/s",
                     "input_tokens": {"distribution": "lognormal", "median": 512,
                                      "sigma": 0.6, "max": 4096},
                     "output_tokens": {"distribution": "lognormal", "median": 128,
                                       "sigma": 0.6, "max": 1024}},
        "slo": {"ttft": "1s", "tpot": "50ms"},
    }],
}


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> tuple[Path, dict[str, Any], Path]:
    folder = tmp_path_factory.mktemp("splan")
    scenario = folder / "serve-8b.yaml"
    scenario.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    written = folder / "best.yaml"
    result = invoke("plan", scenario, "--hardware", "trn2,p5en", "-o", folder / "plan",
                    "--write-scenario", written, "--json")
    assert result.exit_code == 0, result.output
    return folder / "plan", json.loads(result.stdout), written


@pytest.mark.slow  # a plan of two hardware entries: about 5 s of CPU
def test_the_written_scenario_serves_at_the_cost_the_plan_said(planned, tmp_path):
    _, plan, written = planned
    best = plan["best"]
    result = invoke("run", written, "-o", tmp_path / "run")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    figures = summary["deployments"]["chat"]
    assert figures["slo_goodput"] >= 0.99 and not figures["saturated"]
    assert figures["cost_per_million_output_tokens_usd"] == pytest.approx(
        best["cost_per_million_output_tokens_usd"], rel=0.05)
    assert figures["replicas"] == best["replicas"] and figures["tp"] == best["tp"]


@pytest.mark.slow  # a plan of two hardware entries: about 5 s of CPU
def test_one_best_per_hardware_each_holding_the_load_and_cheapest_first(planned):
    _, plan, _ = planned
    per = plan["best_per_hardware"]
    assert set(per) == {"trn2", "p5en"}
    for row in per.values():
        assert row["meets_slo"] and row["slo_goodput"] >= 0.99
        assert row["ttft_p99_s"] is not None
    costs = [c["usd_per_h"] for c in plan["candidates"]]
    assert costs == sorted(costs)
    assert plan["best"]["usd_per_h"] == min(r["usd_per_h"] for r in per.values())


@pytest.mark.slow  # a plan of two hardware entries: about 5 s of CPU
def test_every_candidate_considered_is_in_plan_parquet_with_why_pruned(planned):
    import pandas as pd

    folder, plan, _ = planned
    rows = pd.read_parquet(folder / "plan.parquet")
    assert len(rows) == plan["considered"] and (folder / "pareto.png").stat().st_size > 0
    pruned = rows[rows["status"] == "pruned"]
    assert len(pruned) == plan["pruned"] and pruned["why"].str.len().gt(0).all()
    kinds = set(pruned["why"].str.split(":").str[0])
    assert kinds <= {"validation", "memory", "slo", "bound"} and "bound" in kinds
    # the bound is a lower bound: no simulated configuration needed fewer replicas, and no
    # replica held more than the rate the bound allows
    simulated = rows[rows["status"] == "simulated"]
    assert len(simulated) == plan["simulated"] > 0
    bound_replicas = (3.0 / simulated["rate_bound_per_s"]).apply(lambda x: max(1, -(-x // 1)))
    assert (simulated["replicas"] >= bound_replicas - 1e-9).all()
    held = simulated[simulated["capacity_rate_per_s"].notna()]
    assert len(held) and (held["capacity_rate_per_s"] <= held["rate_bound_per_s"]).all()


def test_training_options_are_refused_for_a_serving_plan(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    result = invoke("plan", scenario, "--tokens", "1T", "-o", tmp_path / "p")
    assert result.exit_code == 2 and "training options" in result.output
    missing = invoke("plan", scenario, "--serve", "nope", "-o", tmp_path / "p")
    assert missing.exit_code == 2 and "no such deployment" in missing.output
    assert not (tmp_path / "p").exists()


@pytest.mark.slow  # a rate search: about 5 s of CPU
def test_find_rate_reports_the_cost_at_the_rate_it_finds(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    result = invoke("run", scenario, "--find-rate")
    assert result.exit_code == 0, result.output
    assert "per million output tokens at that rate" in result.output
