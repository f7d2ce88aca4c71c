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
from clustersim.cluster.instants import _delay_to, event_at
from clustersim.cluster.jobrun import JobRun
from clustersim.cluster.timeline import Retired, Timeline
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


def _run(scenario, lazy: bool, monkeypatch, toggle=(Timeline, "lazy_jobs")
         ) -> tuple[Timeline, object, MemoryRecorder]:
    monkeypatch.setattr(*toggle, lazy)
    recorder = MemoryRecorder()
    profiles = step_profiles(scenario)
    timeline = Timeline(scenario, profiles, np.random.SeedSequence(3), recorder=recorder,
                        step_model=StepModel(topology_for(scenario)))
    return timeline, timeline.run(), recorder


def _same(scenario, monkeypatch, toggle=(Timeline, "lazy_jobs")) -> list:
    lazy_timeline, lazy, lazy_rows = _run(scenario, True, monkeypatch, toggle)
    _, eager, eager_rows = _run(scenario, False, monkeypatch, toggle)
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


def _events_processed(scenario, lazy: bool, monkeypatch) -> int:
    monkeypatch.setattr(JobRun, "lazy_end_watch", lazy)
    timeline = Timeline(scenario, step_profiles(scenario), np.random.SeedSequence(3),
                        step_model=StepModel(topology_for(scenario)))
    count = 0
    step = timeline.env.step

    def counted():
        nonlocal count
        count += 1
        step()

    monkeypatch.setattr(timeline.env, "step", counted)
    timeline.run()
    return count


def test_the_end_of_a_run_time_watched_only_after_an_interruption_is_the_same(monkeypatch):
    """A closed-form segment ends at the end of the job's run time itself; the watch that
    interrupts the job then is set only at its first interruption (failure, preemption,
    pace): the same run, bit for bit, with fewer events."""
    scenario = load_scenario(ROOT / "scenarios" / "mix-128-trn2.yaml")
    assert any(job.run_for_s is not None for job in scenario.jobs)
    jobs = _same(scenario, monkeypatch, (JobRun, "lazy_end_watch"))
    ran_for = [run for run in jobs if run.outcome.reason.startswith("ran for its run_for")]
    assert ran_for, "no job ended at its run time: the test would not test it"
    watched = _events_processed(scenario, False, monkeypatch)
    lazy = _events_processed(scenario, True, monkeypatch)
    assert lazy < watched - len(ran_for) // 2, (lazy, watched, len(ran_for))


@pytest.mark.slow  # two runs of a day of 2,700 jobs on a million chips (about 20 s)
def test_a_day_of_the_rainier_year_with_its_run_times_watched_lazily_is_the_same(monkeypatch):
    scenario = load_scenario(ROOT / "scenarios" / "rainier-year.yaml",
                             ["duration=1d", "workload.arrivals.until=1d"])
    _same(scenario, monkeypatch, (JobRun, "lazy_end_watch"))
