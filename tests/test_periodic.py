"""Periodic checkpoints in closed form (cluster.periodic, cluster.job_periodic) against the
per-checkpoint reference (one discrete event per checkpoint): the cycle arithmetic against
a step-by-step walk, and whole runs (goodput, ETTR, checkpoints, time by state, traces)
agreeing within 0.1%."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from clustersim import load_scenario
from clustersim.analysis.trace import MemoryRecorder
from clustersim.cluster.periodic import (
    async_snapshots,
    blocking_span,
    blocking_wall_for,
    blocking_writes,
)
from clustersim.cluster.timeline import Timeline
from clustersim.runner.api import step_profiles

# ---------------------------------------------------------------------------------------------
# The cycle arithmetic


def _walk_blocking(u0, wall, interval, write, dt):
    """Blocking checkpoints by small steps: (training, writes completed, writing at the end)."""
    u, trained, completed, t = u0, 0.0, 0, 0.0
    slack = 1e-9  # the sum of many small steps drifts from the wall by more than 1e-12
    while t < wall - slack:
        d = min(dt, wall - t)
        if u < interval:
            d = min(d, interval - u)
            trained += d
        else:
            d = min(d, interval + write - u)
        u += d
        t += d
        if u >= interval + write - slack:
            u, completed = 0.0, completed + 1
    return trained, completed, u > interval


@settings(max_examples=60, deadline=None)
@given(st.floats(0.5, 50), st.floats(0.1, 20), st.floats(0, 1), st.floats(0, 400))
# the 250th write ends exactly at the wall: the walk's 1,600 steps drifted past 1e-12 of it
@example(1.1, 0.5, 0.0, 400.0)
def test_blocking_cycle_matches_a_step_by_step_walk(interval, write, phase, wall):
    u0 = phase * (interval + write) * 0.999
    span = blocking_span(u0, wall, interval, write)
    trained, completed, writing = _walk_blocking(u0, wall, interval, write, 0.25)
    assert span.training_s == pytest.approx(trained, abs=1e-6)
    assert span.completed == completed
    starts, ends = blocking_writes(u0, wall, interval, write)
    assert float((ends - starts).sum()) == pytest.approx(wall - trained, abs=1e-6)
    if trained > 1e-6:  # the wall time for that training, back again
        back = blocking_wall_for(u0, trained, interval, write)
        assert blocking_span(u0, back, interval, write).training_s == pytest.approx(trained)
        assert back <= wall + 1e-6


@settings(max_examples=60, deadline=None)
@given(st.floats(0.5, 50), st.floats(0.1, 60), st.floats(0, 1), st.floats(0, 400))
def test_async_snapshots_match_a_listing(interval, write, phase, wall):
    x0 = phase * interval * 0.999
    taken = [interval - x0 + k * interval for k in range(int(wall / interval) + 3)]
    taken = [t for t in taken if t <= wall]
    done = [t for t in taken if t + write <= wall]
    completed, last, pending = async_snapshots(x0, wall, interval, write)
    assert completed == len(done)
    assert (last is None) == (not done)
    if done:
        assert last == pytest.approx(done[-1])
    assert len(pending) == len(taken) - len(done)


# ---------------------------------------------------------------------------------------------
# Whole runs: closed form against one event per checkpoint


def _run(scenario, events: bool, seed: int = 0):
    recorder = MemoryRecorder()
    result = Timeline(scenario, step_profiles(scenario), np.random.SeedSequence(seed),
                      recorder=recorder, checkpoint_events=events).run()
    return result, recorder


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(a) if a else abs(b)


def _agree(path: str, overrides: list[str], tolerance: float = 1e-3) -> dict:
    scenario = load_scenario(path, overrides)
    per_event, trace_a = _run(scenario, True)
    closed, trace_b = _run(scenario, False)
    worst = {"useful_chip_s": _rel(per_event.useful_chip_s, closed.useful_chip_s)}
    for name, a in per_event.jobs.items():
        b = closed.jobs[name]
        fa, fb = a.figures(scenario.duration_s), b.figures(scenario.duration_s)
        for key in ("ettr", "goodput", "useful_s", "lost_work_s"):
            worst[key] = max(worst.get(key, 0.0), _rel(fa[key], fb[key]) if fa[key] > 1 or key
                             in ("ettr", "goodput") else 0.0)
        assert a.checkpoints_completed == b.checkpoints_completed, name
        for state, seconds in a.time_in_state.items():
            assert b.time_in_state[state] == pytest.approx(seconds, rel=tolerance, abs=1e-3)
    # Traces: the same job intervals (state by state), and every checkpoint counted.
    for trace in (trace_a, trace_b):
        trace.by_state = defaultdict(float)
        for entity, job, state, start, end in trace.intervals:
            if entity == "job":
                trace.by_state[(job, state)] += end - start
    for key, seconds in trace_a.by_state.items():
        assert trace_b.by_state[key] == pytest.approx(seconds, rel=tolerance, abs=1e-3), key
    counted = [sum(e[6] for e in t.events if e[1] == "checkpoint") for t in (trace_a, trace_b)]
    assert counted[0] == counted[1] == sum(j.checkpoints_completed
                                           for j in closed.jobs.values())
    rows = sum(1 for e in trace_b.events if e[1] == "checkpoint")
    for trace in (trace_a, trace_b):  # rows in time order, each run's first within it
        times = [e[0] for e in trace.events]
        assert times == sorted(times)
        assert all(e[8] <= e[0] + 1e-9 for e in trace.events)
    assert closed.event_count == per_event.event_count - counted[0]
    worst = {k: v for k, v in worst.items()}
    print(f"{path} {overrides}: worst relative gap {max(worst.values()):.2e} {worst}; "
          f"events {per_event.event_count:,} -> {closed.event_count:,}; "
          f"checkpoint rows {counted[0]:,} -> {rows:,}")
    assert max(worst.values()) < tolerance
    return worst


def test_closed_form_agrees_with_per_checkpoint_events_fast():
    """A week of blocking and of asynchronous checkpoints on 4,096 chips with llama3
    failures x2: the same figures (to rounding: the failure stream is the same)."""
    _agree("scenarios/checkpoint-study.yaml", ["duration=7d"])
    _agree("scenarios/checkpoint-study.yaml", ["duration=7d", "jobs.0.checkpoint.async=true",
                                               "jobs.0.checkpoint.write=10s"])


@pytest.mark.slow
@pytest.mark.parametrize("path, overrides", [
    ("scenarios/llama3-16k-month.yaml", []),  # blocking, UltraServers, spares
    ("scenarios/checkpoint-study.yaml", ["jobs.0.checkpoint.async=true",
                                         "jobs.0.checkpoint.write=10s"]),  # 256,509 writes
    ("scenarios/checkpoint-study.yaml", ["stragglers.transient.rate=1/d",
                                         "stragglers.transient.duration=30min",
                                         "stragglers.transient.slowdown=1.5"]),
    ("scenarios/mix-128-trn2.yaml", ["duration=30d"]),  # 120 jobs, queueing, preemption
    ("scenarios/trn2-512k-month.yaml", []),  # 512,000 chips
])
def test_closed_form_agrees_with_per_checkpoint_events_on_months(path, overrides):
    _agree(path, overrides)


def test_closed_form_with_step_jitter_agrees_over_seeds():
    """With step-time jitter the two draw their Gamma sums differently (one per checkpoint
    interval or one per segment), so single runs differ by about 0.1%; over seeds the mean
    useful time agrees within 0.1%."""
    scenario = load_scenario("scenarios/checkpoint-study.yaml",
                             ["stragglers.jitter=0.05", "duration=14d"])
    useful = np.array([[_run(scenario, events, seed)[0].jobs["train"].useful_s
                        for events in (True, False)] for seed in range(8)])
    gap = useful[:, 1].mean() / useful[:, 0].mean() - 1
    print(f"jitter: mean useful gap {gap:+.2e} over 8 seeds")
    assert abs(gap) < 1e-3


def test_a_year_of_async_checkpoints_is_not_an_event_each():
    """Back-to-back 10 s asynchronous checkpoints on the 512,000-chip job: 3 M of them in a
    year, none of them an event."""
    scenario = load_scenario("scenarios/checkpoint-study.yaml", [
        "duration=365d", "jobs.0.checkpoint.async=true", "jobs.0.checkpoint.write=10s"])
    result, trace = _run(scenario, False)
    job = result.jobs["train"]
    assert job.checkpoints_completed > 0.9 * 365 * 86400 / 10 * job.figures(
        scenario.duration_s)["ettr"]
    assert result.event_count == sum(result.failures.values()) + result.repairs_completed
    assert sum(1 for e in trace.events if e[1] == "checkpoint") < 2 * sum(
        job.interruptions.values()) + 2
    assert math.isfinite(job.lost_work_s)


def test_the_event_budget_no_longer_counts_checkpoints():
    """The issue's year: one 524,288-chip job with auto 10 s asynchronous checkpoints was
    refused at about 6.8 M events, 6.3 M of them checkpoints; now it is within MAX_EVENTS.
    Blocking checkpoints still count their two trace rows each when traced."""
    from clustersim.hardware import limits
    from clustersim.runner.budget import check_run_budget, estimate_events

    year = load_scenario("scenarios/trn2-512k-year.yaml")
    estimate = check_run_budget(year)
    assert estimate.checkpoints == 0 and estimate.total < limits.MAX_EVENTS
    month = load_scenario("scenarios/trn2-512k-month.yaml")
    traced, quiet = estimate_events(month), estimate_events(
        load_scenario("scenarios/trn2-512k-month.yaml", ["trace.enabled=false"]))
    assert traced.checkpoints > 0 and quiet.checkpoints == 0
