"""Elastic training grows back partly as serving releases chips (issue 33): the rule, and a
serving day whose load falls in steps."""

from __future__ import annotations

import numpy as np
import pytest

from clustersim.runner.api import step_profiles
from clustersim.serving.elastic_growth import grow_by
from clustersim.serving.fleetday import simulate_fleet_day
from clustersim.serving.fleetday_figures import fleet_day_figures
from tests.test_fleet_day import JOB, LENGTHS, build, deployment, raw


def test_grow_by_takes_whole_groups_when_the_restart_pays_within_the_hour():
    assert grow_by(16, 16, 1, 10, 600.0) == 0  # whole: nothing to take
    assert grow_by(16, 10, 1, 6, 1e9) == 6  # all it misses is free: at any cost
    assert grow_by(16, 10, 1, 4, 600.0) == 4  # 10 x 600 s repaid by 4 in 1,500 s
    assert grow_by(16, 10, 1, 1, 600.0) == 0  # by 1 in 6,000 s: over the hour
    assert grow_by(16, 8, 4, 7, 600.0) == 4  # whole groups only
    assert grow_by(16, 8, 4, 3, 0.0) == 0
    assert grow_by(100, 50, 1, 9, 3600.0) == 0 and grow_by(100, 50, 1, 50, 3600.0) == 50
    assert grow_by(100, 50, 1, 49, 3600.0) == 0 and grow_by(100, 50, 1, 49, 3000.0) == 49
    assert grow_by(16, 10, 1, 4, 600.0, since_shrink_s=1800.0) == 0  # shrunk lately: wait
    assert grow_by(16, 10, 1, 6, 600.0, since_shrink_s=60.0) == 6  # the whole rest: at once


def test_training_grows_back_partly_as_the_serving_load_falls():
    """Serving peaks at 1,200 requests/s then falls in steps: the 16-instance elastic job
    shrinks to 10 instances, takes 4 back when the load falls to 900/s (before: it waited
    for all 6), then the rest; every chip-hour is counted once."""
    job = dict(JOB, parallelism={"tp": 64, "dp": 16}, elastic={"min_dp": 2})
    s = build(raw([deployment(fidelity="fluid", replicas=4, workload={
        "load": {"hourly": [8, 1200, 1200, 900, 600, 300, 8, 8], "repeat": "none",
                 "between": "step"}, **LENGTHS},
        autoscale={"min": 4, "max": 200, "interval": "60s", "warmup": "0s",
                   "scale_down_after": "5min", "drain": "0s"})],
        duration="8h", instances=24, jobs=[job]))
    result = simulate_fleet_day(s, 0, step_profiles(s))
    figures = fleet_day_figures(s, result)
    chips = result.fleet["job:train"]
    levels = [int(chips[0])] + [int(c) for a, c in zip(chips[:-1], chips[1:], strict=True) if c != a]
    print("job chips over the day:", levels)
    lowest = levels.index(min(levels))
    after = levels[lowest + 1:]
    assert after and after[0] < 256 and after[-1] == 256  # a partial step, then whole
    assert figures["jobs"]["train"]["grows"] >= 2
    # Chip-time conserved: the five states add up to the cluster, the job's to its column.
    day = figures["fleet_day"]
    assert sum(day["chip_hours"].values()) == pytest.approx(day["cluster_chip_hours"],
                                                            rel=1e-12)
    held = float(np.sum(chips * result.dt_s))
    assert result.jobs[0].held_chip_s == pytest.approx(held, rel=1e-12)
