"""Jobs made when they arrive and kept only as `Retired` once done (what lets a year of a
million jobs fit in memory) change nothing: the same run as every job made at the start and
kept whole, row for row and figure for figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from clustersim.analysis.trace import MemoryRecorder
from clustersim.cluster.timeline import Retired, Timeline, _delay_to, event_at
from clustersim.runner.api import step_profiles, topology_for
from clustersim.scenario.loader import load_scenario
from clustersim.training.step import StepModel

ROOT = Path(__file__).resolve().parent.parent

times = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)


@given(times, times)
def test_an_arrival_lands_on_its_submission_exactly(a, b):
    """Made at `now` for `at`, it happens at `at` exactly (a timeout of at - now may round
    off it: 1.52 + (536870914.5069362 - 1.52) does), as a timeout set at 0 would."""
    now, at = min(a, b), max(a, b)
    delay = _delay_to(now, at)
    assert delay >= 0 and now + delay <= at
    env = simpy.Environment(initial_time=now)
    seen = []

    def arrive():
        yield event_at(env, at)
        seen.append(env.now)

    env.process(arrive())
    env.run()
    assert seen == [at]


def _run(scenario, lazy: bool, monkeypatch) -> tuple[Timeline, object, MemoryRecorder]:
    monkeypatch.setattr(Timeline, "lazy_jobs", lazy)
    recorder = MemoryRecorder()
    profiles = step_profiles(scenario)
    timeline = Timeline(scenario, profiles, np.random.SeedSequence(3), recorder=recorder,
                        step_model=StepModel(topology_for(scenario)))
    return timeline, timeline.run(), recorder


def _same(scenario, monkeypatch) -> list:
    lazy_timeline, lazy, lazy_rows = _run(scenario, True, monkeypatch)
    _, eager, eager_rows = _run(scenario, False, monkeypatch)
    for table in ("events", "intervals", "allocations", "states"):
        assert getattr(lazy_rows, table) == getattr(eager_rows, table), table
    horizon = scenario.duration_s
    assert list(lazy.jobs) == list(eager.jobs)
    for name, outcome in lazy.jobs.items():
        figures, expected = outcome.figures(horizon), eager.jobs[name].figures(horizon)
        assert figures.keys() == expected.keys()
        for key, value in figures.items():  # (NaN compared as NaN)
            assert value == expected[key] or (value != value and expected[key] != expected[key]), (
                name, key)
    assert lazy.cluster_figures() == eager.cluster_figures()
    return lazy_timeline.jobs


def test_a_week_of_120_jobs_with_failures_is_the_same(monkeypatch):
    scenario = load_scenario(ROOT / "scenarios" / "mix-128-trn2.yaml")
    jobs = _same(scenario, monkeypatch)
    retired = sum(isinstance(run, Retired) for run in jobs)
    assert retired > 0, "no job retired: the test would not test it"
    assert all(run is not None for run in jobs)  # every job made by the end


@pytest.mark.slow  # two runs of a day of 2,700 jobs on a million chips (about 20 s)
def test_a_day_of_the_rainier_year_is_the_same(monkeypatch):
    """Four sites, site events, teams with quotas, preemption, borrowing."""
    scenario = load_scenario(ROOT / "scenarios" / "rainier-year.yaml",
                             ["duration=1d", "workload.arrivals.until=1d"])
    jobs = _same(scenario, monkeypatch)
    assert sum(isinstance(run, Retired) for run in jobs) > 1000
    assert math.isfinite(scenario.duration_s)
