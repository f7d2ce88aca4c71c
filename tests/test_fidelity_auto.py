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
    # prompt sigma 0.4 and a target utilisation of 25%: inside (1.2, 95%)
    d = _chat(_raw(0.4, {"min": 1, "max": 30, "target": 0.25}))
    assert d["fidelity"] == "fluid"
    assert d["fidelity_checked"] is True
    assert 0 < d["peak_utilisation"] <= 0.25 + 1e-9 and d["prompt_sigma"] == 0.4
    assert checked(d["peak_utilisation"], d["prompt_sigma"])
    assert "inside the fluid level's checked range" in d["fidelity_reason"]


@pytest.mark.parametrize("sigma, autoscale, why", [
    # prompts spread beyond every checked sigma (1.2 is the widest checked)
    (1.4, {"min": 1, "max": 30, "target": 0.65}, "prompt sigma 1.4"),
    # fixed prompts, but the peak is held on at most 2 replicas: far past every checked load
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
    path.write_text(yaml.safe_dump(_raw(1.4, {"min": 1, "max": 30, "target": 0.65})))
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


def _big(replicas: int, sigma: float, rate: str = "20/s") -> dict:
    """auto without autoscaling, past the request level's 2,000,000 requests (2 days)."""
    d = {"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
         "replicas": replicas, "fidelity": "auto", "slo": {"ttft": "1s", "tpot": "50ms"},
         "workload": {"rate": rate, **_lengths(sigma)}}
    return {"name": "auto-big", "duration": "2d", "hardware": "trn2",
            "cluster": {"instances": 3}, "serve": [d], "fluid": {"curve_requests": 400}}


def _settled(raw: dict) -> tuple[str, str]:
    from clustersim.scenario.fleetday import fidelity_choice
    from clustersim.serving.fidelity import settle_auto

    s = settle_auto(scenario_from_dict(raw))
    return fidelity_choice(s.serve[0], s.duration_s)


def test_auto_past_the_request_scale_inside_the_range_stays_fluid():
    # 20/s on 10 replicas of about 7/s each: under 30%, fixed prompts
    level, why = _settled(_big(10, 0.0))
    assert level == "fluid", why


@pytest.mark.parametrize("replicas, sigma, rate", [(3, 0.0, "25/s"), (5, 1.4, "24/s")])
def test_auto_past_the_request_scale_outside_the_range_runs_requests(replicas, sigma, rate):
    # 25/s on 3 replicas of about 7.6/s each: 110% utilisation, past every checked load; sigma
    # 1.4 on 5 replicas: prompts spread past the widest checked sigma, 1.2
    level, why = _settled(_big(replicas, sigma, rate))
    assert level == "requests", why
    assert "outside the range the fluid level is checked on" in why


def test_auto_outside_the_range_past_the_request_level_limit_stays_fluid_flagged():
    """200/s over 2 days: 34.6 M requests, past limits.MAX_SERVED_REQUESTS: the request
    level is refused, so fluid, flagged (fluid_fidelity) rather than refused."""
    level, _ = _settled(_big(4, 0.0, rate="200/s"))
    assert level == "fluid"


def test_the_run_uses_the_request_level_outside_the_range(monkeypatch, tmp_path):
    """End to end, with the request level's scale lowered to 100 requests: 300 expected
    requests would go fluid, but prompt sigma 1.4 is outside the checked range (sigma up
    to 1.2), so the run
    is request by request, its summary and table say why, the fluid figures beside it."""
    from clustersim.scenario import fleetday

    monkeypatch.setattr(fleetday, "AUTO_REQUESTS", 100)
    d = {"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4}, "replicas": 1,
         "fidelity": "auto", "slo": {"ttft": "1s", "tpot": "50ms"},
         "workload": {"rate": "5/s", **_lengths(1.4)}}
    raw = {"name": "auto-outside", "duration": "1min", "hardware": "trn2",
           "cluster": {"instances": 1}, "serve": [d], "fluid": {"curve_requests": 200}}
    path = tmp_path / "outside.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    text = result.stdout + (result.stderr or "")
    assert result.exit_code == 0, text
    chat = json.loads((tmp_path / "out" / "summary.json").read_text())["deployments"]["chat"]
    assert chat["fidelity"] == "requests"
    assert "outside the range the fluid level is checked on" in chat["fidelity_reason"]
    assert "fluid_check" in chat
    flat = " ".join(text.replace("│", " ").split())
    assert "requests level: auto: about 300 requests expected, over the 100" in flat


def test_the_docs_state_the_rule_with_the_code_s_figures():
    """docs/fleet-day.md quotes the checked range and the scale limits: they are the code's."""
    from pathlib import Path

    from clustersim.hardware import limits
    from clustersim.scenario.fleetday import AUTO_REQUESTS
    from clustersim.serving.queueing import CHECKED, checked_text

    text = " ".join((Path(__file__).parents[1] / "docs" / "fleet-day.md").read_text().split())
    assert f"(`queueing.CHECKED`: {checked_text()}; see below)" in text
    assert len(CHECKED) >= 1
    assert f"beyond {AUTO_REQUESTS:,} expected requests without autoscaling" in text
    assert f"more than {limits.MAX_SERVED_REQUESTS:,} requests in all" in text
