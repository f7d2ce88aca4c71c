"""Site events (power, cooling, partition) count as failures where a run plans ahead: the
checkpoint rule (`interval: auto`) and the event budget that refuses a run too long."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.cluster.rates import job_failure_rate
from clustersim.scenario.loader import scenario_from_dict
from tests.cli_helpers import refused
from tests.test_sites import small_sites

runner = CliRunner()


def test_a_partition_every_second_for_a_year_is_refused_up_front(tmp_path: Path):
    raw = small_sites(site_events=[{"kind": "partition", "rate": "1/1s", "duration": "1s"}])
    raw["duration"] = "365d"
    path = tmp_path / "storm.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    refused(result, "failures.site_events", "site events", "docs/limits.md")
    assert not (tmp_path / "out").exists()


def test_site_events_in_the_budget_are_their_rate_times_the_horizon():
    from clustersim.runner.budget import EVENTS_PER_FAILURE, estimate_events

    raw = small_sites(site_events=[{"kind": "power", "rate": "1/1h", "duration": "1h"},
                                   {"kind": "partition", "site": "east", "rate": "1/2h",
                                    "duration": "1h"}])
    estimate = estimate_events(scenario_from_dict(raw))
    per_s = 2 / 3600 + 1 / 7200  # power at every one of the two sites, partition at one
    assert estimate.site_events == pytest.approx(per_s * 3 * 86400 * EVENTS_PER_FAILURE)


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
