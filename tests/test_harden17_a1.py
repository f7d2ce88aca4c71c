"""Session 17 fixes (helper fix17a1): `--find-rate` judges no trial on too few requests and
says when the target is out of reach; `saturated` counts requests left unfinished; the
report keeps rejected and unfinished requests; requests that can never fit the KV cache and
a token budget below the prompt without chunked prefill are refused up front."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import invoke, write


def _deployment(**workload: object) -> dict:
    return {"name": "d", "model": "llama3.1-8b", "parallelism": {"tp": 4},
            "slo": {"ttft": "2s", "tpot": "100ms"},
            "workload": {"rate": "1/s", "input_tokens": 512, "output_tokens": 32, **workload}}


def _scenario(tmp_path: Path, duration: str = "2min", **deployment: object) -> Path:
    return write(tmp_path, {"name": "h17a1", "seed": 1, "duration": duration,
                            "hardware": "trn2", "cluster": {"instances": 1},
                            "serve": [{**_deployment(), **deployment}]})


# -- --find-rate (finding 1)

def test_find_rate_says_a_target_out_of_reach_at_any_rate(tmp_path: Path) -> None:
    """Llama 70B's prompts past about 8,000 tokens take over the 0.5 s TTFT bound to
    prefill alone: 99% is out of reach. The halving accepted 0.0215/s on 3 requests."""
    path = write(tmp_path, {
        "name": "dfr4", "duration": "2min", "hardware": "trn2", "cluster": {"instances": 1},
        "serve": [{"name": "d", "model": "llama3.1-70b", "parallelism": {"tp": 64},
                   "slo": {"ttft": "0.5s", "tpot": "100ms"},
                   "workload": {"rate": "1/s", "output_tokens": 100, "input_tokens": {
                       "distribution": "lognormal", "median": 2000, "sigma": 1,
                       "max": 60000}}}]})
    result = invoke("run", path, "--find-rate")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "requests/s within the SLO" not in text, text
    assert "99% of requests within the SLO (ttft 0.5 s, tpot 0.1 s) not met at any rate" in text
    assert "best goodput" in text and "even on an idle replica only about" in text, text


def test_find_rate_trials_hold_enough_requests_to_judge_the_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over a 20 s horizon a 1/s trial draws about 20 requests, where one miss is 5%: every
    trial is lengthened to 1 / (1 - goodput) expected requests (100 at 99%)."""
    from clustersim.scenario.loader import load_scenario
    from clustersim.serving import capacity

    counts = []
    simulate = capacity.simulate_serving

    def counting(scenario, *args, **kwargs):
        result = simulate(scenario, *args, **kwargs)
        counts.append((scenario.serve[0].workload.rate_per_s,
                       len(result.fleets["d"].arrival_s)))
        return result

    monkeypatch.setattr(capacity, "simulate_serving", counting)
    scenario = load_scenario(_scenario(tmp_path, "20s"))
    search = capacity.find_rate(scenario, "d", 0.99, bisections=2)
    assert search.rate_per_s is not None and len(counts) >= 3
    # Poisson counts about 100 expected: none below 100 - 4 sqrt(100)
    assert all(n >= 60 for _, n in counts), counts
    assert capacity.min_trial_requests(0.99) == 100
    assert capacity.min_trial_requests(0.9) == 10
    assert capacity.min_trial_requests(1.0) == capacity.MAX_MIN_TRIAL_REQUESTS


# -- clustersim report (finding 3)

def test_the_report_keeps_rejected_and_unfinished_requests() -> None:
    """The run table names requests still running when the drain stopped and requests
    rejected; report.md's serving table dropped both (13 arrived, none completed, and the
    report said nothing of them)."""
    from clustersim.analysis.serving_report import serving_lines

    figures = {"requests_per_s": 0.0, "output_tokens_per_s": 0.0, "ttft_p50_s": None,
               "ttft_p99_s": None, "tpot_p50_s": None, "tpot_p99_s": None,
               "slo_goodput": 0.0, "cost_per_million_output_tokens_usd": None,
               "saturated": True, "requests_drained": 0, "drain_s": 0.0,
               "requests_unfinished": 13, "requests_rejected": 2,
               "kv_capacity_tokens_per_replica": 180_840}
    text = "\n".join(serving_lines({"deployments": {"d": figures}}))
    assert "- d: 13 still running when the drain stopped" in text, text
    assert "2 rejected (prompt and output larger than a replica's KV cache, 180,840 tokens)" \
        in text, text
    quiet = "\n".join(serving_lines({"deployments": {"d": {
        **figures, "requests_unfinished": 0, "requests_rejected": 0}}}))
    assert "- d:" not in quiet


# -- saturated (finding 2)

def test_requests_unfinished_after_the_drain_mean_saturated() -> None:
    """132 arrived over a minute, 36 completed in it and 32 never finished, yet the second
    half's 61 arrivals against 36 finishes stayed inside the noise allowance (26.5): the run
    said `saturated: false`. Requests still unfinished after the drain are saturated."""
    import numpy as np

    from clustersim.serving.simulate import saturated

    arrival = np.concatenate([np.linspace(0.0, 29.9, 71), np.linspace(30.1, 60.0, 61)])
    finish = np.full(132, np.inf)
    finish[:36] = np.linspace(31.0, 59.0, 36)  # all 36 finished in the second half
    settled = np.ones(132, dtype=bool)
    assert not saturated(arrival, finish, settled, 0.0, 60.0)  # the allowance alone
    assert saturated(arrival, finish, settled, 0.0, 60.0, unfinished=32)


def test_a_run_leaving_requests_unfinished_reports_saturated(tmp_path: Path) -> None:
    """13 requests of a million tokens each over two minutes: none completed, all
    unfinished after the drain, and the run table said nothing of saturation."""
    import json

    path = write(tmp_path, {
        "name": "dlong2", "duration": "2min", "hardware": "trn2", "cluster": {"instances": 1},
        "serve": [{"name": "d", "model": "gpt-oss-120b", "precision": "mxfp4",
                   "parallelism": {"tp": 64},
                   "workload": {"rate": "0.05/s", "input_tokens": 1000000,
                                "output_tokens": 1000}}]})
    out = tmp_path / "out"
    result = invoke("run", path, "-o", out)
    assert result.exit_code == 0, result.output
    d = json.loads((out / "summary.json").read_text())["deployments"]["d"]
    assert d["requests_unfinished"] == d["requests"] > 0 and d["saturated"] is True, d


# -- requests that can never be served (findings 4 and 5)

def test_requests_that_never_fit_the_kv_cache_are_refused(tmp_path: Path) -> None:
    """Fixed 4,000,000-token prompts against DeepSeek-V3's 180,840-token KV cache: validate
    said ok and the run rejected every request. Refused up front, naming the key, the value
    and the capacity; a distribution whose max alone passes the cache still runs."""
    from cli_helpers import refused

    deployment = {"name": "d", "model": "deepseek-v3", "precision": "fp8",
                  "parallelism": {"tp": 64},
                  "workload": {"rate": "0.01/s", "input_tokens": 4000000, "output_tokens": 10}}
    scenario = {"name": "dlong1", "duration": "2min", "hardware": "trn2",
                "cluster": {"instances": 1}, "serve": [deployment]}
    path = write(tmp_path, scenario)
    for command in (("validate", path), ("run", path, "-o", tmp_path / "out")):
        refused(invoke(*command), "serve.0.workload.input_tokens = 4000000",
                "holds 180,840 tokens")
    deployment["workload"]["input_tokens"] = {"distribution": "lognormal", "median": 300000,
                                              "sigma": 1, "min": 200000, "max": 400000}
    refused(invoke("validate", write(tmp_path, scenario)), "serve.0.workload.input_tokens = 200000")
    deployment["workload"]["input_tokens"] = {"distribution": "lognormal", "median": 2000,
                                              "sigma": 1, "max": 400000}
    assert invoke("validate", write(tmp_path, scenario)).exit_code == 0
    deployment["workload"].update(input_tokens=1000, output_tokens=180000)
    refused(invoke("validate", write(tmp_path, scenario)),
            "serve.0.workload.output_tokens = 180000")


@pytest.mark.parametrize(("prompt", "longest", "key"), [
    (3000, 3000, "serve.0.workload.input_tokens"),
    ({"distribution": "lognormal", "median": 500, "sigma": 1, "max": 3000}, 3000,
     "serve.0.workload.input_tokens.max"),
])
def test_a_token_budget_below_the_prompt_needs_chunked_prefill(
        tmp_path: Path, prompt: object, longest: int, key: str) -> None:
    """max_tokens_per_iteration 1 with 3,000-token prompts and chunked_prefill false ran
    each prompt whole, the budget ignored. Refused (vLLM refuses a budget below the longest
    prompt without chunked prefill); with chunked prefill the budget splits the prompts."""
    from cli_helpers import refused

    server = {"max_batch": 1, "max_tokens_per_iteration": 1, "chunked_prefill": False}
    path = _scenario(tmp_path, server=server, workload={
        "rate": "1/s", "input_tokens": prompt, "output_tokens": 10})
    for command in (("validate", path), ("run", path, "-o", tmp_path / "out")):
        refused(invoke(*command), "serve.0.server.max_tokens_per_iteration = 1",
                f"the longest prompt, {longest:,} tokens ({key})", "chunked_prefill")
    server.update(max_tokens_per_iteration=longest)
    assert invoke("validate", _scenario(tmp_path, server=server)).exit_code == 0
    server.update(max_tokens_per_iteration=512, chunked_prefill=True)
    assert invoke("validate", _scenario(tmp_path, server=server)).exit_code == 0


def test_find_rate_stops_halving_near_idle(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A target the idle bound does not rule out but no rate meets: the halving stops once
    the offered load is under IDLE_LOAD of the replicas' work (it halved 30 times, each
    trial now lengthened to 100 requests), and says at which rate."""
    from clustersim.scenario.loader import load_scenario
    from clustersim.serving import capacity
    from clustersim.serving.idle_bound import IdleBound

    # an idle bound that lets every request through, each 0.1 s of work alone
    monkeypatch.setattr(capacity, "idle_bound", lambda *args: IdleBound(
        1.0, 0.1, 100, 0, 0, 0, None, None))
    scenario = load_scenario(_scenario(tmp_path, slo={"ttft": "1ms", "tpot": "100ms"}))
    search = capacity.find_rate(scenario, "d", 0.99)
    assert search.rate_per_s is None
    # 1/s x 0.1 s is 10% of one replica's work: halved until 1% or less, 0.0625/s
    assert search.near_idle_per_s == 0.0625
    assert [rate for rate, _ in search.tried] == [1.0, 0.5, 0.25, 0.125, 0.0625]
