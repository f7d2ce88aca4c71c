"""Site events (power, cooling, partition) count as failures where a run plans ahead: the
checkpoint rule (`interval: auto`) and the event budget that refuses a run too long."""

from __future__ import annotations

import pytest
from clustersim.cluster.rates import job_failure_rate
from clustersim.scenario.loader import scenario_from_dict
from tests.test_sites import small_sites

def test_job_rate_counts_the_site_events_that_can_reach_it():
    raw = small_sites(site_events=[{"kind": "partition", "rate": "1/10h", "duration": "1h"}])
    s = scenario_from_dict(raw)
    spread, local = s.jobs
    # A partition of either site stops the job spanning both; a job inside one site goes on.
    assert job_failure_rate(s, spread) == pytest.approx(2 / 36000)
    assert job_failure_rate(s, local) == 0
    # A power event downing the whole site reaches every job in it: the local job sees its
    # own site's events only.
    raw = small_sites(site_events=[{"kind": "power", "rate": "1/10h", "duration": "1h"}])
    s = scenario_from_dict(raw)
    assert job_failure_rate(s, s.jobs[0]) == pytest.approx(2 / 36000)
    assert job_failure_rate(s, s.jobs[1]) == pytest.approx(1 / 36000)
    # A quarter of a site (one of its two UltraServers at most) misses a one-UltraServer job
    # in some of its places: (1 + 1 - 1) of the 2 places the block may take.
    raw = small_sites(site_events=[{"kind": "power", "rate": "1/10h", "share": 0.25,
                                    "duration": "1h"}])
    s = scenario_from_dict(raw)
    assert job_failure_rate(s, s.jobs[1]) == pytest.approx(0.5 / 36000)


def test_power_events_alone_make_auto_checkpoints():
    from clustersim.runner.api import simulate

    raw = small_sites(site_events=[{"kind": "power", "rate": "1/12h", "duration": "1h"}])
    raw["duration"] = "7d"
    for job in raw["jobs"]:
        job["checkpoint"] = {"interval": "auto", "write": "60s", "restore": "60s"}
    jobs = simulate(scenario_from_dict(raw)).summary["jobs"]
    for name in ("spread", "local"):
        job = jobs[name]
        assert job["interruptions_by_cause"]["site-power"] > 0
        assert job["checkpoint_interval_s"] is not None, name
        assert job["checkpoints_completed"] > 0, name
        assert job["ettr"] > 0.6, (name, job["ettr"])
