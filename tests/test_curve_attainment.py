"""SLO attainment on the fluid level's replica curve (clustersim.serving.curves.slo_share): the
share meeting both bounds is the share meeting the TPOT bound times the part of their TTFT
within the TTFT bound, read continuously, against the request-level samples it was measured
on; and never capped at the last finite quantile level when a sample misses the TPOT bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fleet_day import build, deployment, raw

from clustersim.serving.curves import LEVELS, RHO_GRID, _run, group_size, replica_curve


@pytest.fixture(scope="module")
def tight():
    """A TPOT bound that the busiest grid points' slowest requests miss."""
    s = build(raw([deployment(fidelity="fluid", slo={"ttft": "1s", "tpot": "33ms"})]))
    d = s.serve[0]
    return s, d, replica_curve(s, d)


def _samples(s, d, curve, index):
    """The request-level run behind grid point `index` (the curve's own seed and rate)."""
    group = group_size(s, d)
    fleet = _run(s, d, float(RHO_GRID[index] * curve.capacity_per_s * group),
                 s.fluid.curve_requests, index + 1)
    keep = (fleet.status == 1) & (np.arange(len(fleet.status)) >= s.fluid.curve_requests // 10)
    t = fleet.first_token_s[keep] - fleet.arrival_s[keep]
    out = fleet.output_tokens[keep]
    per_token = np.where(out > 1, (fleet.finish_s[keep] - fleet.first_token_s[keep])
                         / np.maximum(out - 1, 1), 0.0)
    return t, per_token


def test_the_share_at_grid_points_is_the_requests(tight):
    s, d, curve = tight
    assert 0 < curve.tpot_met.min() < 1  # some grid points have requests missing the bound
    for index in (2, len(RHO_GRID) - 1):
        t, per_token = _samples(s, d, curve, index)
        meets_tpot = per_token <= d.slo.tpot_s
        assert curve.tpot_met[index] == pytest.approx(meets_tpot.mean(), abs=1e-12)
        for bound in np.quantile(t, [0.3, 0.6, 0.9, 0.99]).tolist() + [10.0]:
            actual = float(np.mean(meets_tpot & (t <= bound)))
            share = float(curve.slo_share(np.array([RHO_GRID[index]]), bound)[0])
            # read between two of 201 quantile levels of the meeting requests' TTFT
            assert share == pytest.approx(actual, abs=curve.tpot_met[index] / 200 + 1e-9)


def test_no_cap_below_the_requests_meeting_the_tpot_bound(tight):
    """Between two grid points whose requests all meet the TTFT bound, the share is the
    interpolated share meeting the TPOT bound, not the last finite level (0.995) because one
    sample of either point missed it."""
    _, _, curve = tight
    k = int(np.flatnonzero(curve.tpot_met < 1)[0])
    assert k > 0
    rho = np.linspace(RHO_GRID[k - 1], RHO_GRID[k], 5)
    share = curve.slo_share(rho, 1e3)
    w = (rho - RHO_GRID[k - 1]) / (RHO_GRID[k] - RHO_GRID[k - 1])
    expected = curve.tpot_met[k - 1] * (1 - w) + curve.tpot_met[k] * w
    np.testing.assert_allclose(share, expected, rtol=1e-12)
    assert np.all(np.diff(share) <= 1e-15)  # more load, never a larger share here
    # counted on the quantile levels with the misses infinite, it was capped at LEVELS[-2]
    assert np.all(share[1:] > LEVELS[-2])


def test_the_slo_rate_reads_the_continuous_share(tight):
    """The autoscaler's rate per replica (policy slo) is where the share meeting the SLO,
    as the fleet reads it, falls to the goodput: linear between the grid points around it,
    not on 201 quantile levels with the TPOT misses counted as an infinite TTFT."""
    _, _, curve = tight
    k = int(np.flatnonzero(curve.tpot_met < 1)[0])
    a, b = curve.tpot_met[k - 1], curve.tpot_met[k]
    goodput = (a + b) / 2  # between the two points' shares (TTFT bound 1000 s: all meet it)
    rho = RHO_GRID[k - 1] + (RHO_GRID[k] - RHO_GRID[k - 1]) * (a - goodput) / (a - b)
    assert curve.slo_rate_per_s(1e3, goodput) == pytest.approx(rho * curve.capacity_per_s,
                                                                rel=1e-12)


def test_the_share_is_monotone_in_the_bound(tight):
    _, _, curve = tight
    bounds = np.linspace(0.0, 2.0, 401)
    for rho in (0.1, 0.5, 0.9):
        shares = np.array([curve.slo_share(np.array([rho]), b)[0] for b in bounds])
        assert np.all(np.diff(shares) >= -1e-15) and 0.0 <= shares[0] <= shares[-1] <= 1.0


def test_the_monotone_fit_pools_crossing_neighbours():
    from clustersim.serving.curves import monotone_over_load

    np.testing.assert_allclose(monotone_over_load(np.array([1.0, 3.0, 2.0, 4.0])),
                               [1.0, 2.5, 2.5, 4.0])
    np.testing.assert_allclose(monotone_over_load(np.array([3.0, 1.0, 2.0])), [2.0, 2.0, 2.0])
    np.testing.assert_allclose(monotone_over_load(np.array([1.0, 0.9, 0.95, 0.5]),
                                                  increasing=False), [1.0, 0.925, 0.925, 0.5])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 10.0), min_size=3, max_size=3), min_size=1,
                max_size=9))
def test_the_monotone_fit_is_monotone_keeps_sums_and_rows_sorted(rows):
    from clustersim.serving.curves import monotone_over_load

    table = np.sort(np.array(rows), axis=1)  # each row a quantile function
    fitted = monotone_over_load(table)
    assert np.all(np.diff(fitted, axis=0) >= -1e-9)  # every level non-decreasing in load
    assert np.all(np.diff(fitted, axis=1) >= 0)  # every row still sorted
    np.testing.assert_allclose(fitted.sum(), table.sum(), rtol=1e-9, atol=1e-9)
    if np.all(np.diff(table, axis=0) >= 0):  # already monotone: as measured
        np.testing.assert_allclose(fitted, table)


def test_the_curve_s_latencies_never_fall_with_load(tight):
    _, _, curve = tight
    for table in (curve.ttft_q, curve.tpot_q, curve.met_ttft_q):
        assert np.all(np.diff(table, axis=0) >= -1e-12)
    assert np.all(np.diff(curve.e2e_mean_s) >= 0) and np.all(np.diff(curve.tpot_met) <= 0)
