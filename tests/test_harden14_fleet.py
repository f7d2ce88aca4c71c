"""The fleet-day (fluid) level charges a deployment the instances it holds, as the request
level does: four TP 4 replicas (one chip each) on one 16-chip trn2 instance cost the
instance at both levels, where the fluid level charged 4 chips of 16 ($0.89 against $3.57
per million output tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import invoke, write

SUB_INSTANCE = {
    "name": "sub-instance", "seed": 0, "duration": "20min", "hardware": "trn2",
    "cluster": {"instances": 2}, "trace": {"enabled": False},
    "serve": [{
        "name": "small", "model": "llama3.1-8b", "precision": "bf16",
        "parallelism": {"tp": 4}, "replicas": 4,
        "server": {"max_batch": 64, "max_tokens_per_iteration": 4096,
                   "chunked_prefill": True},
        "workload": {"arrival": "poisson", "rate": "8/s",
                     "input_tokens": {"distribution": "lognormal", "median": 1024,
                                      "sigma": 0.8, "max": 8192},
                     "output_tokens": {"distribution": "lognormal", "median": 256,
                                       "sigma": 0.8, "max": 2048}},
        "slo": {"ttft": "2s", "tpot": "100ms"}}]}


def _deployment(tmp_path: Path, fidelity: str) -> dict:
    scenario = write(tmp_path, SUB_INSTANCE, name=f"{fidelity}.yaml")
    out = tmp_path / fidelity
    result = invoke("run", scenario, "--set", f"serve.0.fidelity={fidelity}", "-o", out)
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text("utf-8"))


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_sub_instance_replicas_cost_their_instance_at_both_levels(tmp_path: Path):
    fluid = _deployment(tmp_path, "fluid")
    requests = _deployment(tmp_path, "requests")
    held_h = 16 * 20 / 60  # one instance's 16 chips for 20 minutes
    assert fluid["deployments"]["small"]["chip_hours"] == pytest.approx(held_h)
    # the chip-time split still puts the 12 unused chips of that instance with the idle
    assert fluid["fleet_day"]["chip_hours"]["serving"] == pytest.approx(4 * 20 / 60)
    by_fluid = fluid["deployments"]["small"]["cost_per_million_output_tokens_usd"]
    by_requests = requests["deployments"]["small"]["cost_per_million_output_tokens_usd"]
    assert by_fluid == pytest.approx(by_requests, rel=0.03)
    assert fluid["fleet_day"]["serving_cost_per_million_output_tokens_usd"] == \
        pytest.approx(by_fluid)


def test_fluid_check_compares_the_cost_too(tmp_path: Path):
    auto = _deployment(tmp_path, "auto")["deployments"]["small"]
    check = auto["fluid_check"]
    assert check["fluid"]["cost_per_million_output_tokens_usd"] > 0
    assert abs(check["relative_difference"]["cost_per_million_output_tokens_usd"]) < 0.03


def test_a_deployment_without_requests_has_no_slo_goodput(tmp_path: Path):
    """No request arrived (1 a day for a minute): the share meeting the SLO is undefined,
    where the request level said 0.0 (none met it). (The fluid level's expected arrivals
    are positive: it has a share.)"""
    for fidelity in ("requests",):
        scenario = write(tmp_path, SUB_INSTANCE, name=f"{fidelity}.yaml")
        out = tmp_path / fidelity
        result = invoke("run", scenario, "--set", f"serve.0.fidelity={fidelity}", "--set",
                        "serve.0.workload.rate=1/d", "--set", "duration=1min", "-o", out)
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text("utf-8"))
        assert summary["deployments"]["small"]["slo_goodput"] is None
        assert "goodput 0.0%" not in " ".join(result.stdout.split())


def test_find_rate_stops_descending_once_no_request_arrives(tmp_path: Path):
    """An SLO nothing meets: the search halved the rate 30 times (down to 3.7e-9/s), each
    step listed as 0.0%, long after no request arrived; it stops at the first trial without
    requests, listed as '-'. Since session 17 every trial holds about 100 requests and the
    search stops at once: no request could meet a 10 ms TTFT even on an idle replica."""
    scenario = write(tmp_path, {
        "name": "fr", "duration": "30s", "hardware": "trn2", "cluster": {"instances": 1},
        "serve": [{"name": "chat", "model": "qwen3-30b-a3b", "parallelism": {"tp": 8, "ep": 8},
                   "workload": {"arrival": "poisson", "rate": "2/s", "input_tokens": 1024,
                                "output_tokens": 128},
                   "slo": {"ttft": "10ms", "tpot": "1ms"}}]})
    result = invoke("run", scenario, "--find-rate")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "not met at any rate tried" in text and "even on an idle replica" in text
    tried = text.split("(tried ")[1].split(")")[0].split(", ")
    assert tried == ["2/s: 0.0%"], tried
