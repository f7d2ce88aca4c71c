"""`fidelity: auto` and the range the fluid level was checked on (queueing.CHECKED,
docs/fleet-day.md "Which level, and why"): inside it the fluid level runs and says so;
outside it the run never uses fluid silently (a reason naming the range, a flag in
summary.json, a warning in the run table); the run table names the level and the reason."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.runner.api import simulate
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.queueing import checked


def _lengths(sigma: float) -> dict:
    prompts = ({"distribution": "lognormal", "median": 512, "sigma": sigma, "max": 4096}
               if sigma > 0 else {"distribution": "fixed", "value": 512})
    return {"input_tokens": prompts, "output_tokens": {"distribution": "lognormal",
                                                       "median": 200, "sigma": 0.8,
                                                       "max": 1024}}


def _raw(sigma: float, autoscale: dict, peak: str = "40/s") -> dict:
    d = {"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4}, "fidelity": "auto",
         "slo": {"ttft": "1s", "tpot": "50ms"}, "autoscale": autoscale,
         "workload": {"rate": peak, **_lengths(sigma)}}
    return {"name": "auto-range", "duration": "1h", "hardware": "trn2",
            "cluster": {"instances": 4}, "serve": [d], "fluid": {"curve_requests": 400}}


def _chat(raw: dict) -> dict:
    return simulate(scenario_from_dict(raw)).summary["deployments"]["chat"]


def test_auto_inside_the_checked_range_picks_fluid_and_says_so():
    # prompt sigma 0.4 and a target utilisation of 25%: inside (0.4, 30%)
    d = _chat(_raw(0.4, {"min": 1, "max": 30, "target": 0.25}))
    assert d["fidelity"] == "fluid"
    assert d["fidelity_checked"] is True
    assert 0 < d["peak_utilisation"] <= 0.25 + 1e-9 and d["prompt_sigma"] == 0.4
    assert checked(d["peak_utilisation"], d["prompt_sigma"])
    assert "inside the fluid level's checked range" in d["fidelity_reason"]


@pytest.mark.parametrize("sigma, autoscale, why", [
    # prompts spread beyond every checked sigma (1.2 is checked only to 10%)
    (1.2, {"min": 1, "max": 30, "target": 0.5}, "prompt sigma 1.2"),
    # fixed prompts, but the peak is held on at most 2 replicas: far past 30% utilisation
    (0.0, {"min": 1, "max": 2, "target": 0.9}, "peak utilisation"),
])
def test_auto_outside_the_checked_range_is_never_silent(sigma, autoscale, why):
    d = _chat(_raw(sigma, autoscale, peak="60/s"))
    # autoscaling: the request level is refused, so the fluid figures come flagged
    assert d["fidelity_checked"] is False
    assert not checked(d["peak_utilisation"], d["prompt_sigma"])
    assert "OUTSIDE the range the fluid level is checked on" in d["fidelity_reason"]
    assert why in d["fidelity_reason"]


def test_the_run_table_names_the_level_and_why(tmp_path):
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(_raw(1.2, {"min": 1, "max": 30, "target": 0.5})))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    text = result.stdout + (result.stderr or "")
    assert result.exit_code == 0, text
    flat = " ".join(text.replace("│", " ").split())  # the table wraps long rows
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["deployments"]["chat"]["fidelity_checked"] is False
    assert "fluid level: auto with autoscale" in flat
    assert "OUTSIDE the range" in flat
    assert "warning: the fluid level's latency and SLO figures are outside" in flat


def test_the_run_table_names_the_request_level_of_auto(tmp_path):
    """auto within the request level's scale: request by request, and the table says why."""
    d = {"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4}, "replicas": 1,
         "fidelity": "auto", "slo": {"ttft": "1s", "tpot": "50ms"},
         "workload": {"rate": "2/s", **_lengths(0.4)}}
    raw = {"name": "auto-small", "duration": "1min", "hardware": "trn2",
           "cluster": {"instances": 1}, "serve": [d], "fluid": {"curve_requests": 200}}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    text = result.stdout + (result.stderr or "")
    assert result.exit_code == 0, text
    flat = " ".join(text.replace("│", " ").split())
    assert "requests level: auto: about 120 requests expected" in flat
