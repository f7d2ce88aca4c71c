"""A job its team's quota can never admit: warned before the run, the right reason after,
and its censored wait kept out of the queue-wait means and percentiles (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.runner.api import simulate
from clustersim.scenario.loader import scenario_from_dict
from tests.test_fleet import fleet, small_job

TEAMS = [{"name": "a", "quota": 4}, {"name": "b", "quota": 8}]


def _jobs() -> list[dict]:
    return [small_job("fits", 4, team="a", run_for="1h", submit="2h"),
            small_job("late", 4, team="a", run_for="1h", submit="2h"),
            small_job("huge", 14, team="a", run_for="1h")]


@pytest.mark.parametrize("borrowing", [False, True])
def test_a_job_over_its_quota_and_the_cohorts_is_warned_and_says_why(tmp_path: Path,
                                                                     borrowing: bool):
    raw = fleet(_jobs(), teams=TEAMS, scheduler={"policy": "fifo", "borrowing": borrowing},
                trace={"enabled": False})
    path = tmp_path / "quota.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "warning:" in result.stderr and "jobs.2 (huge)" in result.stderr
    assert "never start" in result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    huge = summary["jobs"]["huge"]
    assert huge["status"] == "queued at horizon"
    assert "was at its quota" not in huge["reason"]
    assert "quota of 4" in huge["reason"] and "can never start" in huge["reason"]
    if borrowing:
        assert "cohort's of 12" in huge["reason"]


def test_a_job_the_cohort_can_admit_by_borrowing_is_not_warned(tmp_path: Path):
    raw = fleet([small_job("borrower", 10, team="a", run_for="1h")], teams=TEAMS,
                scheduler={"policy": "fifo", "borrowing": True}, trace={"enabled": False})
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0 and "warning" not in result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["jobs"]["borrower"]["status"] == "done"


def test_censored_waits_stay_out_of_the_means_and_the_cluster_has_a_p95():
    raw = fleet(_jobs(), teams=TEAMS, scheduler={"policy": "fifo"}, trace={"enabled": False})
    summary = simulate(scenario_from_dict(raw)).summary
    cluster, team = summary["cluster"], summary["teams"]["a"]
    started = [j["queue_wait_s"] for j in summary["jobs"].values() if j["start_s"] is not None]
    assert sorted(started) == pytest.approx([0.0, 3600.0])  # late waits for fits' quota
    assert cluster["mean_queue_wait_s"] == pytest.approx(1800.0)
    assert cluster["p95_queue_wait_s"] == pytest.approx(0.95 * 3600.0)
    assert cluster["jobs_never_started"] == 1
    assert cluster["mean_censored_queue_wait_s"] == pytest.approx(3 * 86400)
    assert team["mean_queue_wait_s"] == pytest.approx(1800.0)
    assert team["p95_queue_wait_s"] == pytest.approx(0.95 * 3600.0)
    assert team["jobs_never_started"] == 1
