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


@pytest.mark.slow  # a plan of two hardware entries: a few seconds of CPU
def test_hardware_without_a_price_is_ranked_by_chips_and_not_labelled_in_dollars(tmp_path):
    """trn3-gen1 has no price in the catalog: its candidates rank by chips, which the table
    says (a chips column; $/h is "-"), and never above or among a priced hardware's dollars."""
    scenario = tmp_path / "serve-8b.yaml"
    scenario.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    result = invoke("plan", scenario, "--hardware", "trn2,trn3-gen1", "-o", tmp_path / "plan",
                    "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    unpriced = plan["best_per_hardware"]["trn3-gen1"]
    assert unpriced["usd_per_h"] is None and unpriced["chips"] >= 16
    priced = plan["best_per_hardware"]["trn2"]
    assert priced["usd_per_h"] == pytest.approx(35.76 * priced["instances"])
    assert plan["best"]["hardware"] == "trn2"  # dollars are not compared with chips
    table = invoke("plan", scenario, "--hardware", "trn3-gen1", "-o", tmp_path / "plan2")
    assert table.exit_code == 0, table.output
    line = next(x for x in table.stdout.splitlines() if x.startswith("trn3-gen1 at its best"))
    assert "chips, no price" in line and "$" not in line


def _live_shapes(hardware: str) -> list[Any]:
    """Every replica shape of SMALL on `hardware` the planner bounds, with its one-replica
    scenario."""
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.planning import serving_space as sp
    from clustersim.scenario import ScenarioError, scenario_from_dict

    scenario = scenario_from_dict(SMALL, "small")
    load, mean_in, mean_out, longest, kth_in = sp._load(scenario, 0, None, 0.99)
    spec = catalog_entry(hardware)
    out = []
    for shape in sp._shapes(hardware, hardware, spec, sp.BATCHES, scenario.serve[0]):
        if shape.pp != 1 or shape.tp > 4 or shape.max_batch != max(sp.BATCHES):
            continue  # where 24 sampled batches went wrong: the largest limit, small replicas
        mapping = sp._raw_variant(SMALL, SMALL["serve"][0], hardware, shape.tp, shape.pp, 1,
                                  shape.max_batch, sp._instances_for(shape.tp * shape.pp, 1, spec))
        try:
            one = scenario_from_dict(mapping, "one")
        except ScenarioError:
            continue
        sp._bound(shape, one, load, mean_in, mean_out, longest, kth_in, 0.99)
        if not shape.why:
            out.append((shape, one, mean_in, mean_out))
    return out


def test_the_rate_bound_is_above_every_batch_that_meets_the_tpot_bound():
    """The pruning bound must not undercount what a replica serves: its rate is at least
    what any batch whose decode iteration meets the TPOT bound would give (every batch
    costed, not a sample of them), so no shape whose true best beats the best found is
    pruned by it."""
    from clustersim.serving.simulate import replica_models

    shapes = _live_shapes("trn2")
    assert len(shapes) >= 3
    for shape, one, mean_in, mean_out in shapes:
        d = one.serve[0]
        cost, capacity, _ = replica_models(one, d)
        tpi = cost.tokens_per_iteration
        most = max(1, min(shape.max_batch, int(capacity // mean_in)))
        per_token = min(cost.run_s(b, b * mean_in, 1) / (b * tpi) for b in range(1, most + 1)
                        if cost.run_s(b, b * mean_in, 1) / tpi <= d.slo.tpot_s)
        prefill = cost.target.prefill_s(int(mean_in)) - cost.target.prefill_s(1)
        rate = 1.0 / (0.5 * prefill + (mean_out - 1) * per_token)
        assert shape.rate_bound_per_s >= rate * (1 - 1e-9), (shape.tp, shape.pp, shape.max_batch)


def test_a_deployment_with_a_load_curve_is_refused_with_exit_2(tmp_path):
    """A load curve (fleet-day scenarios) divided by a zero rate: an internal error, exit 1.
    The planner plans one constant rate, and says so."""
    raw = yaml.safe_load(yaml.safe_dump(SMALL))
    workload = raw["serve"][0]["workload"]
    del workload["rate"]
    workload["load"] = {"sinusoid": {"peak": "4/s", "trough": "1/s", "peak_at": "1min"}}
    scenario = tmp_path / "curve.yaml"
    scenario.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert invoke("validate", scenario).exit_code == 0
    result = invoke("plan", scenario, "-o", tmp_path / "p")
    assert result.exit_code == 2, result.output
    assert "load curve" in result.output and not (tmp_path / "p").exists()


def test_pareto_plot_shows_each_slo_line_inside_its_axes(tmp_path, monkeypatch):
    """With the slowest candidate near the bound (TTFT p99 1.81 s against 2 s) the SLO line
    sat on the axes' frame; each bound must be inside the axes, with room above it."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from clustersim.planning import serving_plan as sp
    from clustersim.planning.serving_outputs import plot_serving_pareto
    from clustersim.scenario import scenario_from_dict

    scenario = scenario_from_dict(SMALL, "small")  # SLO: TTFT 1 s, TPOT 50 ms
    ranked = [{"hardware": "trn2", "tp": tp, "pp": 1, "replicas": 1,
               "cost_per_million_output_tokens_usd": cost, "ttft_p99_s": ttft,
               "tpot_p99_s": tpot} for tp, cost, ttft, tpot in ((8, 10.0, 0.95, 0.049),
                                                                 (16, 14.0, 0.5, 0.03))]
    result = sp.ServingPlanResult(scenario, "chat", sp.ServingPlanOptions(), 3.0, 128.0,
                                  pd.DataFrame({"status": ["simulated"] * 2}), ranked, {})
    tops: list[tuple[float, float]] = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: tops.extend(
        (ax.get_ylim()[1], max(line.get_ydata()[0] for line in ax.get_lines()
                               if line.get_label().startswith("SLO"))) for ax in fig.axes))
    plot_serving_pareto(result, tmp_path / "p.png")
    assert len(tops) == 2
    for top, bound in tops:
        assert top >= 1.05 * bound, (top, bound)


def test_the_cost_bound_is_below_the_cost_charged_on_ultraserver_hardware():
    """On trn2u the bound counted whole UltraServers (4 instances for one TP 8 replica) while
    the cost figure charges the instances the replicas take (1): a bound 4 times the true
    cost pruned shapes cheaper than the best found."""
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.planning import serving_space as sp
    from clustersim.scenario import scenario_from_dict
    from clustersim.scenario.serving import deployment_instances

    spec = catalog_entry("trn2u")
    scenario = scenario_from_dict(SMALL, "small")
    load, mean_in, mean_out, longest, kth_in = sp._load(scenario, 0, None, 0.99)
    shape = sp._Shape("trn2u", "trn2u", spec, 8, 1, 64)
    mapping = sp._raw_variant(SMALL, SMALL["serve"][0], "trn2u", 8, 1, 1, 64,
                              sp._instances_for(8, 1, spec))
    one = scenario_from_dict(mapping, "one")
    sp._bound(shape, one, load, mean_in, mean_out, longest, kth_in, 0.99)
    assert not shape.why and shape.replicas_bound == 1
    charged = deployment_instances(one.serve[0], one.hardware)
    assert shape.usd_per_h_bound <= charged * spec.instance.price_per_hour_usd + 1e-9
