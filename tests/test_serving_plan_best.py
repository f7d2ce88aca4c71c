"""The serving planner writes the configuration it reports as best, and says what it is doing
while it searches (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli.app import app

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # Llama 3.1 70B at 40 requests/s on p5en: a search of about a minute
def test_the_written_scenario_is_the_reported_best_when_costs_per_hour_tie(tmp_path: Path):
    """At 40 requests/s several p5en shapes need the same four instances; the tie is broken
    by the cost per token for the report, and the scenario written must be that one (it was
    the first found at the cheapest $/h: TP 2 x 14 replicas written, TP 4 x 8 reported)."""
    written = tmp_path / "best.yaml"
    result = CliRunner().invoke(app, [
        "plan", str(ROOT / "scenarios" / "serving-llama-trn2.yaml"), "--hardware", "p5en",
        "--set", "serve.0.workload.rate=40/s", "-o", str(tmp_path / "plan"),
        "--write-scenario", str(written), "--json"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.stdout)["best"]
    serve = yaml.safe_load(written.read_text())["serve"][0]
    assert (serve["parallelism"]["tp"], serve["parallelism"]["pp"], serve["replicas"],
            serve["server"]["max_batch"]) == (best["tp"], best["pp"], best["replicas"],
                                              best["max_batch"])


def test_the_serving_planner_reports_progress():
    from clustersim.planning.serving_plan import ServingPlanOptions, plan_serving
    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import scenario_from_dict
    from tests.test_serving_plan import SMALL

    heard: list[tuple] = []
    plan_serving(scenario_from_dict(SMALL), ServingPlanOptions(capacity=False), None,
                 simulate=simulate, progress=lambda done, total, what: heard.append(
                     (done, total, what)))
    assert heard and all("trn2: tp" in what for _, _, what in heard)
    assert heard[0][0] == 0 and all(done < total for done, total, _ in heard)
