"""Site events on a fleet-day run (issue 34: they were ignored, the output identical to the
run without them)."""

from __future__ import annotations

import copy

from clustersim.runner.api import simulate
from clustersim.scenario.loader import scenario_from_dict
from tests.test_fleet_day_outputs import fleet_day_example


def _on_sites(events: list[dict], sizes: tuple[int, ...] = (4, 4)) -> dict:
    """The fleet-day example's 8 instances as sites of these sizes (leaves of 2)."""
    raw = copy.deepcopy(fleet_day_example())
    del raw["cluster"]["instances"]
    raw["cluster"]["fabric"] = {"instances_per_leaf": 2}
    raw["cluster"]["sites"] = [{"name": f"s{i}", "instances": k} for i, k in enumerate(sizes)]
    raw["cluster"]["inter_site"] = {"backbone": {"bandwidth": "400Gbps", "latency": "5ms"}}
    raw["failures"] = {"preset": "none", "site_events": events}
    return raw


def _summary(raw: dict) -> dict:
    return simulate(scenario_from_dict(raw)).summary


def test_power_events_down_training_for_their_duration():
    quiet = _summary(_on_sites([]))
    stormy = _summary(_on_sites([{"kind": "power", "rate": "1/1h", "share": 1.0,
                                  "duration": "30min"}]))
    failures = stormy["fleet_day"]["failures"]
    assert failures.get("site-power", 0) >= 4
    job, before = stormy["jobs"]["train"], quiet["jobs"]["train"]
    assert job["interruptions"] > 0 and before["interruptions"] == 0
    assert job["tokens_trained"] < before["tokens_trained"]
    assert job["time_by_state_s"].get("waiting_for_hardware", 0) > 0
    # what the deployment serves is left alone, as on the timeline
    assert stormy["deployments"]["chat"]["replica_failures"] == 0


def test_a_partition_stops_only_a_job_spread_over_sites():
    partition = [{"kind": "partition", "rate": "1/1h", "duration": "20min"}]
    inside = _summary(_on_sites(partition))  # the 4-instance job fits a site of 4
    assert inside["fleet_day"]["failures"].get("site-partition", 0) >= 2
    assert inside["jobs"]["train"]["interruptions"] == 0
    spread = _summary(_on_sites(partition, sizes=(2, 2, 2, 2)))  # no site holds it
    job = spread["jobs"]["train"]
    assert job["interruptions"] >= 2
    assert job["tokens_trained"] < inside["jobs"]["train"]["tokens_trained"]


def test_fleet_day_site_events_are_deterministic():
    raw = _on_sites([{"kind": "cooling", "rate": "1/2h", "share": 0.5, "duration": "1h"}])
    assert _summary(raw)["jobs"] == _summary(raw)["jobs"]
