"""The planner's renewal-reward ETTR against closed forms and against the timeline."""

from __future__ import annotations

import math

import pytest

from clustersim.planning.ettr import Recovery, renewal_ettr, stops_paying_chips
from clustersim.planning.planner import recovery_for
from clustersim.runner.api import simulate
from clustersim.scenario.loader import scenario_from_dict


def _recovery(rate: float, interval: float | None = None, **changes) -> Recovery:
    base = dict(failure_rate_per_s=rate, hardware_rate_per_s=rate, detect_s=120.0,
                restart_s=600.0, restore_s=300.0, write_s=60.0, interval_s=interval,
                repair_s=3600.0, spare_units=4)
    base.update(changes)
    return Recovery(**base)


def test_no_failures_costs_only_the_writes():
    r = _recovery(0.0, interval=3600.0)
    assert renewal_ettr(r) == pytest.approx(3600.0 / 3660.0)
    assert renewal_ettr(_recovery(0.0, interval=3600.0, async_write=True)) == 1.0


def test_first_order_limit():
    """Rare failures: ETTR ~ 1 - w/tau - lam (R + tau/2 + w) (the RSC papers' approximation)."""
    lam, tau = 1 / (400 * 86400.0), 3600.0
    r = _recovery(lam, interval=tau, spare_units=100)
    first_order = (1 - lam * (r.recovery_s + tau / 2 + r.write_s)) / (1 + r.write_s / tau)
    assert renewal_ettr(r) == pytest.approx(first_order, rel=1e-4)


def test_daly_interval_is_near_the_best():
    lam = 1 / 7200.0
    best = renewal_ettr(_recovery(lam))
    daly = _recovery(lam).checkpoint_interval_s
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert renewal_ettr(_recovery(lam, interval=daly * factor)) <= best + 1e-4


def test_ettr_falls_to_nothing_when_mtbf_reaches_recovery():
    values = [renewal_ettr(_recovery(1 / mtbf)) for mtbf in (1e6, 1e5, 1e4, 2e3, 1e3, 300)]
    assert values == sorted(values, reverse=True)
    assert values[-1] < 0.05


def test_without_spares_a_hardware_fault_waits_for_the_repair():
    r = _recovery(1 / 86400.0, spare_units=0)
    assert r.wait_s == pytest.approx(3600.0)
    assert _recovery(1 / 86400.0, spare_units=0, repair_s=math.inf).wait_s == math.inf
    assert renewal_ettr(_recovery(1 / 86400.0, spare_units=0, repair_s=math.inf)) == 0.0


def test_stops_paying():
    assert stops_paying_chips([1024, 2048, 4096], [30.0, 20.0, 25.0]) == 2048
    assert stops_paying_chips([1024, 2048, 4096], [30.0, 20.0, 15.0]) is None


def _timeline_scenario(mtbf: str, interval: str) -> dict:
    return {
        "name": "ettr-check", "seed": 0, "duration": "80d", "hardware": "trn1",
        "cluster": {"instances": 4, "spares": 4},
        "jobs": [{"name": "train", "model": "llama2-7b", "seq_len": 4096, "global_batch": 64,
                  "parallelism": {"tp": 8, "pp": 1, "dp": 16, "zero": 1,
                                  "sequence_parallel": True},
                  "recompute": "selective",
                  "checkpoint": {"interval": interval, "write": "60s", "restore": "5min"}}],
        "failures": {"preset": "none", "detect": "2min", "repair": "10min", "restart": "10min",
                     "rates": [{"component": "host", "per": "instance", "mtbf": mtbf}]},
        "trace": {"enabled": False},
    }


@pytest.mark.parametrize("mtbf, interval", [("8h", "auto"), ("4h", "30min"), ("2h", "auto")])
def test_renewal_ettr_matches_the_timeline_within_two_percent(mtbf, interval):
    """Four instances, one host failure per `mtbf` each: the timeline's mean ETTR over seeds
    against the formula (job MTBF 2 h, 1 h and 30 min next to a 15-minute recovery)."""
    scenario = scenario_from_dict(_timeline_scenario(mtbf, interval))
    job = scenario.jobs[0]
    predicted = renewal_ettr(recovery_for(scenario, scenario.hardware, job, 4, False))
    seeds = range(3)
    measured = sum(simulate(scenario, seed=s).summary["jobs"]["train"]["ettr"]
                   for s in seeds) / len(seeds)
    assert measured == pytest.approx(predicted, rel=0.02), (measured, predicted)


def test_waiting_for_spares_with_hundreds_of_them():
    """P(faults under repair >= spares) for a Poisson count, with 820 spares (5% of 16,384
    instances), where k! and mu**k overflow a float: no error, and the tail as it should be
    (none left when far fewer faults are under repair, all waiting when far more)."""
    from clustersim.planning.ettr import hardware_wait_s

    few = _recovery(1e-4, spare_units=820)  # mu = 0.36 faults under repair
    assert hardware_wait_s(few) == 0.0
    many = _recovery(1.0, spare_units=820)  # mu = 3,600
    assert hardware_wait_s(many) == pytest.approx(3600.0)
    # Small counts: the sum of the Poisson terms as written.
    r = _recovery(5e-4, spare_units=3)
    mu = 5e-4 * 3600.0
    tail = 1 - sum(math.exp(-mu) * mu**k / math.factorial(k) for k in range(3))
    assert hardware_wait_s(r) == pytest.approx(3600.0 * tail, rel=1e-12)
    assert renewal_ettr(many) < renewal_ettr(few)
