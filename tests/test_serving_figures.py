"""Serving figures that never overstate: throughput over the window from the requests
completed inside it, drained requests apart, and `saturated` when the queue grows."""

from __future__ import annotations

import numpy as np
import pytest

from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving import deployment_figures, simulate_serving
from clustersim.serving.simulate import saturated

BATCH, INPUT, OUTPUT = 16, 64, 256


def _scenario(rate: float, duration: str = "120s") -> dict:
    return {
        "name": "serve", "duration": duration, "hardware": "trn2",
        "cluster": {"instances": 1},
        "serve": [{
            "name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 8}, "replicas": 1,
            "server": {"max_batch": BATCH},
            "workload": {"arrival": "poisson", "rate": rate, "input_tokens": INPUT,
                         "output_tokens": OUTPUT},
        }],
    }


def _figures(rate: float, duration: str = "120s") -> tuple[dict, object]:
    s = scenario_from_dict(_scenario(rate, duration))
    result = simulate_serving(s, np.random.SeedSequence(0))
    return deployment_figures(s, result)["chat"], result


def _capacity_tokens_per_s(cost) -> float:
    """A full batch in steady state emits one token per sequence per iteration; one
    iteration in OUTPUT / BATCH also prefills a newcomer's prompt beside BATCH - 1 decodes.
    The context held averages the prompt plus half the output per sequence."""
    context = BATCH * (INPUT + OUTPUT / 2)
    decode = cost.run_s(BATCH, context, 1)
    mixed = cost.prefill_s([(INPUT, 0)], BATCH - 1, context * (BATCH - 1) / BATCH, 1)
    share = BATCH / OUTPUT
    return BATCH / ((1 - share) * decode + share * mixed)


def test_twice_the_capacity_reports_the_capacity_and_saturated() -> None:
    probe, result = _figures(1.0, "60s")
    capacity = _capacity_tokens_per_s(result.models["chat"][0])
    rate = 2 * capacity / OUTPUT  # requests per second offering twice the capacity
    figures, _ = _figures(rate)
    assert figures["saturated"] is True
    assert figures["output_tokens_per_s"] == pytest.approx(capacity, rel=0.05)
    # tokens generated inside the window: the completed requests' and, in part, those of the
    # requests still decoding at the horizon (at most one batch of them)
    completed_tokens_per_s = figures["requests_per_s"] * OUTPUT
    assert completed_tokens_per_s <= figures["output_tokens_per_s"]
    assert figures["output_tokens_per_s"] <= completed_tokens_per_s + BATCH * OUTPUT / 120.0
    # Half the capacity is held: no growing queue, and throughput is what was offered
    # (over 10 minutes, so the Poisson count's spread is under 3%).
    held, _ = _figures(0.5 * capacity / OUTPUT, "600s")
    assert held["saturated"] is False
    assert held["output_tokens_per_s"] == pytest.approx(0.5 * capacity, rel=0.1)
    assert not probe["saturated"]


def test_drained_requests_are_reported_apart() -> None:
    capacity = _capacity_tokens_per_s(_figures(1.0, "60s")[1].models["chat"][0])
    figures, result = _figures(2 * capacity / OUTPUT)
    fleet = result.fleets["chat"]
    end = figures["window_end_s"]
    finish = fleet.finish_s[fleet.status == 1]
    assert figures["window_start_s"] == 0.0 and end == 120.0
    assert figures["requests_completed"] == int((finish <= end).sum())
    assert figures["requests_drained"] == int((finish > end).sum()) > 0
    assert figures["drain_s"] == pytest.approx(finish.max() - end)
    assert 0 < figures["drain_s"] <= end
    assert (figures["requests_completed"] + figures["requests_drained"]
            + figures["requests_unfinished"] + figures["requests_rejected"]
            == figures["requests"])
    # output tokens inside the window: every completed request's, and part of those still
    # decoding at the horizon (serving_window tests the exact share)
    assert (figures["requests_completed"] * OUTPUT / end < figures["output_tokens_per_s"]
            <= (figures["requests_completed"] + figures["requests_drained"]) * OUTPUT / end)
    # Cost per token is over the same tokens.
    assert figures["instances"] == 1
    s = scenario_from_dict(_scenario(1.0))
    price = s.hardware.instance.price_per_hour_usd
    assert figures["cost_per_million_output_tokens_usd"] == pytest.approx(
        price * end / 3600 / (figures["output_tokens_per_s"] * end) * 1e6)
    # A light load drains (almost) nothing.
    light, _ = _figures(0.2 * capacity / OUTPUT)
    assert light["requests_drained"] <= BATCH and light["requests_unfinished"] == 0


def test_saturated_closed_forms() -> None:
    rng = np.random.default_rng(1)
    arrivals = np.sort(rng.uniform(0, 100, 2000))
    settled = np.ones(len(arrivals), dtype=bool)
    # Every request served in 0.5 s: held.
    assert not saturated(arrivals, arrivals + 0.5, settled, 0.0, 100.0)
    # Served at half the arrival rate (a growing queue).
    finish = np.arange(1, len(arrivals) + 1) / 10.0
    assert saturated(arrivals, finish, settled, 0.0, 100.0)
    # Rejected requests leave at once: no queue.
    none = np.full(len(arrivals), np.inf)
    assert saturated(arrivals, none, settled, 0.0, 100.0)
    assert not saturated(arrivals, none, ~settled, 0.0, 100.0)


def test_a_deployment_whose_weights_fill_the_hbm_is_refused(tmp_path) -> None:
    """Llama 3.1 70B at tp 4 on one Trn2 chip, or an 8B target with a 70B draft: no HBM left
    for a single KV token, so every request would be rejected. Refused (exit 2), naming the
    deployment and the sizes, nothing written."""
    import yaml
    from typer.testing import CliRunner

    from clustersim.cli.app import app

    for name, extra in (("big", {"model": "llama3.1-70b", "parallelism": {"tp": 4}}),
                        ("draft", {"parallelism": {"tp": 4},
                                   "speculative": {"draft": "llama3.1-70b"}})):
        raw = _scenario(1.0, "2min")
        raw["serve"][0].update(extra)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        out = tmp_path / name
        result = CliRunner().invoke(app, ["run", str(path), "--out", str(out)])
        text = result.stdout + (result.stderr or "")
        assert result.exit_code == 2, text
        # Refused by the weights-fit check before any work (serving's check_serving_fit),
        # or, for a draft no smaller than its target, when the scenario loads.
        assert "serve.0" in text and any(m in text for m in (
            "the weights do not fit", "expected a smaller draft"))
        assert ("draft" in text) == (name == "draft")
        assert "Traceback" not in text and not out.exists()


def test_the_run_table_prints_latencies_when_nothing_drained(tmp_path) -> None:
    """`clustersim run` prints TTFT and TPOT under every deployment with completed requests;
    they were printed only when some requests finished while draining."""
    import json

    import yaml
    from typer.testing import CliRunner

    from clustersim.cli.app import app

    raw = _scenario(0.5, "1min")
    raw["serve"][0]["workload"]["output_tokens"] = 4
    path = tmp_path / "light.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.stdout
    d = json.loads((tmp_path / "out" / "summary.json").read_text())["deployments"]["chat"]
    assert d["requests_drained"] == 0 and d["requests_completed"] > 0
    assert "TTFT p50" in result.stdout and "TPOT p50" in result.stdout
