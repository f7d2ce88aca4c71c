"""SLO attainment read from quantile functions is continuous (issue 33: the fluid level's
attainment was capped at 99.5% and quantised at 1/201)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.serving.attainment import share_within
from clustersim.serving.curves import LEVELS


def test_share_within_is_the_distribution_function():
    q = np.quantile(np.random.default_rng(0).exponential(1.0, 200_000), LEVELS)[None, :]
    for bound in (0.1, 0.5, 1.0, 3.0):
        assert share_within(q, LEVELS, bound)[0] == pytest.approx(1 - np.exp(-bound),
                                                                   abs=2e-3)
    assert share_within(q, LEVELS, q[0, -1] + 1)[0] == 1.0  # all within: 1, not 200/201
    assert share_within(q, LEVELS, -1.0)[0] == 0.0


def test_share_within_is_not_quantised():
    q = np.linspace(0.0, 2.0, len(LEVELS))[None, :]  # uniform on [0, 2]
    shares = share_within(np.repeat(q, 5, axis=0), LEVELS, np.array([0.3, 0.301, 0.302,
                                                                      1.999, 2.0]))
    assert shares[0] < shares[1] < shares[2]
    assert shares[1] == pytest.approx(0.1505)
    assert shares[3] == pytest.approx(0.9995) and shares[4] == 1.0


def test_requests_missing_the_tpot_bound_are_never_within():
    q = np.concatenate([np.linspace(0, 1, 150), np.full(len(LEVELS) - 150, np.inf)])[None, :]
    assert share_within(q, LEVELS, 100.0)[0] == pytest.approx(LEVELS[149])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=2, max_size=40), st.floats(-1, 120))
def test_share_within_is_monotone_and_bounded(values, bound):
    q = np.quantile(np.array(values), LEVELS)[None, :]
    a = share_within(q, LEVELS, bound)[0]
    b = share_within(q, LEVELS, bound + 0.5)[0]
    assert 0.0 <= a <= b <= 1.0


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_the_fluid_level_attainment_is_not_in_steps_of_1_201():
    """At 93% of capacity some requests miss the 1 s TTFT bound: the fluid level's share is
    read between quantile levels, not counted in steps of 1/201 (195/201 before)."""
    from clustersim.serving.curves import replica_curve
    from clustersim.serving.fleetday import simulate_fleet_day
    from tests.test_fleet_day import LENGTHS, build, deployment, raw

    base = build(raw([deployment(fidelity="fluid", replicas=2)], duration="10min"))
    rate = 0.93 * 2 * replica_curve(base, base.serve[0]).capacity_per_s
    s = build(raw([deployment(fidelity="fluid", replicas=2,
                              workload={"rate": f"{rate}/s", **LENGTHS})], duration="10min"))
    attained = simulate_fleet_day(s, 0, {}).series["chat"]["slo_attainment"]
    steps = attained * len(LEVELS)  # the old count of levels within
    assert 0.9 < attained[0] < 1.0
    assert not np.allclose(steps, np.round(steps))


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_a_run_says_which_fidelity_it_chose_and_why(tmp_path):
    """`fidelity: auto` at the request level, and an autoscaled one at the fluid level: each
    deployment's summary says its level and the reason."""
    from clustersim.runner.api import simulate
    from tests.test_fleet_day import build, deployment, raw

    auto = simulate(build(raw([deployment(replicas=2, fidelity="auto")],
                              duration="5min"))).summary["deployments"]["chat"]
    assert auto["fidelity"] == "requests"
    assert "3,000 requests expected, within the 2,000,000" in auto["fidelity_reason"]
    fluid = simulate(build(raw([deployment(fidelity="auto", autoscale={"min": 1, "max": 4})],
                               duration="10min"))).summary["deployments"]["chat"]
    assert fluid["fidelity"] == "fluid" and "autoscale" in fluid["fidelity_reason"]
