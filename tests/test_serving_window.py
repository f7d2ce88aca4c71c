"""A serving cost counts only what happened inside the window it is divided by: the output
tokens generated in it, those of requests still decoding at the horizon included (issue 34:
the plan's cost at 10 requests/s, $3.11 per million output tokens, was below its own
capacity figure, $3.37, which left most of the tokens in flight at the horizon out)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from clustersim.runner.api import simulate
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.simulate import _tokens_by
from tests.test_serving_plan import SMALL


def test_tokens_by_the_horizon_of_requests_in_flight():
    first = np.array([10.0, 10.0, 30.0, 5.0])
    finish = np.array([20.0, 40.0, 50.0, 5.0])
    outputs = np.array([11.0, 31.0, 5.0, 1.0])
    # by t = 20: all 11 of the first, 1 + 30 x 10/30 of the second, none of the third
    # (its first token comes later), the one token of the fourth
    assert _tokens_by(20.0, first, finish, outputs) == pytest.approx(11 + 11 + 0 + 1)


def _rate(duration: str) -> tuple[float, dict]:
    raw = yaml.safe_load(yaml.safe_dump(SMALL))
    raw["duration"] = duration
    workload = raw["serve"][0]["workload"]
    workload["rate"] = "6/s"
    # long answers: about half a minute of decoding each, so a short window ends with many
    # in flight
    workload["output_tokens"] = {"distribution": "lognormal", "median": 1024, "sigma": 0.3,
                                 "max": 4096}
    figures = simulate(scenario_from_dict(raw)).summary["deployments"]["chat"]
    return figures["output_tokens_per_s"], figures


def test_the_token_rate_does_not_depend_on_where_the_window_ends():
    # One replica at its capacity: the token rate is what it sustains, whatever the window
    # (it was 13% lower over 90 s than over 6 min, the tokens in flight at the end left out).
    short, figures = _rate("90s")
    long, _ = _rate("6min")
    assert figures["requests_outstanding_at_end"] > 100
    assert short == pytest.approx(long, rel=0.06)
