"""The Ray engine gives what the local one gives: a sweep's rows and a plan, on a local Ray
instance these tests start once and stop at the end. Without the `ray` extra they skip;
under CI (which installs it, CI=true) a missing Ray fails them instead (tests/ray_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from ray_helpers import import_ray
from sweep_helpers import write_sweep
from test_planning import _scenario

from clustersim.planning import PlanOptions, plan
from clustersim.planning.engine import Engine
from clustersim.runner.sweep import run_sweep

ray = import_ray()

pytestmark = pytest.mark.slow  # starting Ray takes seconds


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance for the module (two CPUs: the machine has two), stopped after.
    The engines' own ray.init finds it running and joins it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             ignore_reinit_error=True)
    yield
    ray.shutdown()


def test_a_sweep_on_ray_gives_the_local_rows(tmp_path: Path):
    grid = {"jobs.0.checkpoint.interval": ["30min", "2h"], "failures.scale": [20, 80]}
    path = write_sweep(tmp_path, grid=grid, seeds=[0, 1])
    local, _ = run_sweep(path, workers=1)
    remote, _ = run_sweep(path, engine="ray")
    assert ray.is_initialized()
    pd.testing.assert_frame_equal(local, remote)


def test_a_plan_on_ray_gives_the_local_answer():
    scenario = _scenario()
    serial = plan(scenario, PlanOptions(top=3))
    with Engine("ray", workers=2) as engine:
        remote = plan(scenario, PlanOptions(top=3), engine)
    assert remote.as_json() == serial.as_json()
    pd.testing.assert_frame_equal(remote.rows, serial.rows)


def test_a_serving_plan_on_ray_gives_the_serial_answer():
    """The serving planner maps its candidates' searches, then their capacity searches, on
    one engine: the Ray engine kept the first function and ran it for both (a failure)."""
    from test_serving_trials import seventy_b_at_20

    from clustersim.planning.serving_plan import ServingPlanOptions, plan_serving
    from clustersim.runner.api import simulate

    scenario = seventy_b_at_20()
    options = ServingPlanOptions(hardware=("trn2",), top=2)
    serial = plan_serving(scenario, options, None, simulate=simulate)
    with Engine("ray", workers=2) as engine:
        remote = plan_serving(scenario, options, None, simulate=simulate, engine=engine)
    assert remote.as_json() == serial.as_json()
    pd.testing.assert_frame_equal(remote.rows, serial.rows)


def test_the_year_slice_replications_on_ray_give_the_local_summary():
    """`run --replications --engine ray` (the Rainier year's Monte Carlo replications, on a
    slice of it): the replications after the first run as Ray tasks, with the same seeds, so
    the summary is the local engine's."""
    from year_helpers import year_slice

    from clustersim.runner.api import simulate

    scenario = year_slice("duration=12h", "workload.arrivals.until=12h")
    local = simulate(scenario, replications=3, workers=1).summary
    remote = simulate(scenario, replications=3, engine="ray").summary
    assert ray.is_initialized()
    local.pop("wall_s"), remote.pop("wall_s")
    assert remote == local
    assert local["replications"] == 3
