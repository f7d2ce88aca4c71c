"""Where a job's hours went adds up: wall time minus useful time is the sum of the lost-time
entries after `queued` (the wait before the first start, outside the wall time), and useful
time plus every entry is the time since submission; a preempted job's wait in the queue again
is `lost_time_s.requeued`. Checked on the issue's case and, for every job, on generated runs
with preemption, failures and checkpoints (hypothesis)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from clustersim.cluster.jobrun import JobRun
from clustersim.cluster.timeline import Timeline
from clustersim.runner.api import simulate, step_profiles, topology_for
from clustersim.scenario.loader import scenario_from_dict
from clustersim.training.step import StepModel

SMALL_JOB = {"model": "llama3-8b", "seq_len": 2048, "micro_batch": 1, "recompute": "selective",
             "parallelism": {"tp": 8, "pp": 1, "zero": 1, "sequence_parallel": True}}


def _job(name: str, instances: int, **timing) -> dict:
    body = dict(SMALL_JOB, name=name, instances=instances, global_batch=instances * 8 * 4,
                **timing)
    body["parallelism"] = dict(SMALL_JOB["parallelism"], dp=instances * 8)
    return body


def _raw(jobs: list[dict], instances: int, failures: dict | None = None, duration: str = "3d",
         seed: int = 0) -> dict:
    return {"name": "lost", "hardware": "trn2", "duration": duration, "seed": seed,
            "cluster": {"instances": instances, "fabric": {"instances_per_leaf": 4}},
            "scheduler": {"policy": "priority", "preemption": True}, "jobs": jobs,
            "failures": failures or {"preset": "none"}, "trace": {"bin": "1h"}}


def assert_hours_add_up(name: str, job: dict, submit_s: float, horizon_s: float) -> None:
    lost = job["lost_time_s"]
    assert all(v >= -1e-6 for v in lost.values()), (name, lost)
    after_start = sum(v for k, v in lost.items() if k != "queued")
    assert job["wall_s"] - job["useful_s"] == pytest.approx(after_start, rel=1e-9, abs=1e-6), (
        name, job["wall_s"], job["useful_s"], lost)
    end = job["end_s"] if job["end_s"] is not None else horizon_s
    assert job["useful_s"] + sum(lost.values()) == pytest.approx(
        end - submit_s, rel=1e-9, abs=1e-6), (name, lost)
    start = job["start_s"] if job["start_s"] is not None else end
    assert lost["queued"] == pytest.approx(start - submit_s, rel=1e-9, abs=1e-6), (name, lost)
    # every wait in the queue is the first one or a wait after a preemption
    assert lost["queued"] + lost["requeued"] == pytest.approx(
        job["time_by_state_s"]["queued"], rel=1e-9, abs=1e-6)
    if not job["preemptions"]:
        assert lost["requeued"] == 0


def test_a_preempted_jobs_wait_in_the_queue_again_is_lost_time():
    """The issue's case: a job preempted at 3 h waits 4 h in the queue again while the job
    that preempted it runs; that wait was in no entry (wall minus useful exceeded the sum of
    the entries by it)."""
    jobs = [_job("low", 12, run_for="2d", checkpoint={"interval": "1h", "write": "1min"}),
            _job("high", 8, submit="3h", run_for="4h", priority=5)]
    scenario = scenario_from_dict(_raw(jobs, 16))
    figures = simulate(scenario, seed=0).summary["jobs"]
    low = figures["low"]
    assert low["preemptions"] == 1
    assert low["lost_time_s"]["requeued"] == pytest.approx(4 * 3600)  # while `high` ran
    assert low["lost_time_s"]["queued"] == 0  # started at once
    assert figures["high"]["lost_time_s"]["requeued"] == 0
    for spec in scenario.jobs:
        assert_hours_add_up(spec.name, figures[spec.name], spec.submit_s, scenario.duration_s)


# Tensor parallelism across a Trn2 UltraServer's four instances: the job holds whole
# UltraServers (and loses a whole one to an instance's failure).
WIDE_JOB = {"model": "llama3.1-405b", "seq_len": 2048, "micro_batch": 1, "global_batch": 4,
            "recompute": "selective", "instances": 4,
            "parallelism": {"tp": 128, "pp": 2, "dp": 1, "zero": 1, "sequence_parallel": True}}


@st.composite
def preempting_runs(draw):
    """A few jobs of mixed priorities and teams on a small cluster (of UltraServers or not):
    preemption on under every policy, failures from none to frequent, checkpoints (blocking
    or asynchronous) or none, deadlines."""
    ultraservers = draw(st.booleans())
    if ultraservers:
        us = draw(st.integers(1, 3))
        instances, hardware = 4 * us, "trn2u"
        cluster = {"ultraservers": us, "spares": 4 * draw(st.integers(0, 1))}
    else:
        instances, hardware = draw(st.integers(2, 12)), "trn2"
        cluster = {"instances": instances, "spares": draw(st.integers(0, 2))}
    teams = draw(st.sampled_from([[], [{"name": "a", "quota": max(1, instances // 2)},
                                       {"name": "b", "share": 2}]]))
    jobs = []
    for k in range(draw(st.integers(2, 6))):
        timing = {"submit": f"{draw(st.integers(0, 24 * 60))}min",
                  "priority": draw(st.integers(0, 3)),
                  "run_for": f"{draw(st.integers(30, 40 * 60))}min"}
        if draw(st.booleans()):
            timing["deadline"] = f"{draw(st.integers(1, 60))}h"
        if teams and draw(st.booleans()):
            timing["team"] = draw(st.sampled_from(["a", "b"]))
        if ultraservers and draw(st.booleans()):
            body = dict(WIDE_JOB, name=f"j{k}", **timing)
        else:
            body = _job(f"j{k}", draw(st.integers(1, instances)), **timing)
        if draw(st.booleans()):
            body["checkpoint"] = {"interval": f"{draw(st.integers(10, 180))}min",
                                  "write": f"{draw(st.integers(0, 5))}min",
                                  "restore": f"{draw(st.integers(0, 10))}min",
                                  "async": draw(st.booleans())}
        jobs.append(body)
    failures = {"preset": "llama3", "scale": draw(st.sampled_from([0, 30, 300, 3000])),
                "repair": draw(st.sampled_from(["30min", "6h", "never"])),
                "detect": f"{draw(st.integers(0, 30))}min",
                "restart": f"{draw(st.integers(0, 20))}min"}
    raw = _raw(jobs, instances, failures, duration="2d", seed=draw(st.integers(0, 99)))
    raw["hardware"], raw["cluster"] = hardware, dict(cluster, fabric={"instances_per_leaf": 4})
    raw["scheduler"] = {"policy": draw(st.sampled_from(["fifo", "priority", "backfill",
                                                        "fairshare"])),
                        "preemption": True, "borrowing": draw(st.booleans())}
    if teams:
        raw["teams"] = teams
    return scenario_from_dict(raw)


def _run_watching_evictions(scenario, seed, per_checkpoint=False):
    """The run, and (time, job name) of every eviction."""
    evictions = []
    evict = JobRun.evict

    def watched(run):
        evictions.append((run.t.env.now, run.job.name))
        evict(run)

    with mock.patch.object(JobRun, "evict", watched):
        timeline = Timeline(scenario, step_profiles(scenario), np.random.SeedSequence(seed),
                            step_model=StepModel(topology_for(scenario)),
                            checkpoint_events=per_checkpoint)
        return timeline.run(), evictions


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=preempting_runs(), seed=st.integers(0, 2**32 - 1),
       per_checkpoint=st.booleans())
@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_every_jobs_hours_add_up(scenario, seed, per_checkpoint):
    """For every job of a generated run: the identity, and the first wait is start minus
    submission. Both timelines: periodic checkpoints in closed form and one event each.
    No job is evicted at the instant its run time or deadline ends (it would lose the work
    it has just finished for instances that come back then anyway)."""
    result, evictions = _run_watching_evictions(scenario, seed, per_checkpoint)
    preempted = sum(o.preemptions for o in result.jobs.values())
    event(f"preemptions: {'some' if preempted else 'none'}")
    event(f"failures: {'some' if sum(result.failures.values()) else 'none'}")
    assert len(evictions) == preempted
    specs = {spec.name: spec for spec in scenario.jobs}
    for spec in scenario.jobs:
        figures = result.jobs[spec.name].figures(scenario.duration_s)
        assert_hours_add_up(spec.name, figures, spec.submit_s, scenario.duration_s)
    for t, name in evictions:
        spec, start = specs[name], result.jobs[name].start_s
        if spec.run_for_s is not None:
            assert t < start + spec.run_for_s - 1e-6, (name, t)
        if spec.deadline_s is not None:
            assert t < spec.submit_s + spec.deadline_s - 1e-6, (name, t)


def _same_size_jobs(priorities: list[int]) -> list[dict]:
    return [_job(f"j{k}", 1, run_for="30min", priority=p) for k, p in enumerate(priorities)]


def test_no_job_is_evicted_as_its_run_time_ends():
    """Found by the property above: on two instances under FIFO, j0 and j1 run 30 min; at
    30 min j0 ends, j2 takes its instance and j3 (priority 1) evicted j1, whose 30 min were
    ending at that instant: j1 lost all its work (useful 0 s) and ended anyway. Now j3 takes
    j1's instance when j1 ends."""
    raw = _raw(_same_size_jobs([0, 0, 0, 1]), 2, duration="1d")
    raw["scheduler"]["policy"] = "fifo"
    result, evictions = _run_watching_evictions(scenario_from_dict(raw), 0)
    assert evictions == []
    j1, j3 = result.jobs["j1"], result.jobs["j3"]
    assert j1.preemptions == 0 and j1.useful_s > 0.99 * 1800
    assert j3.start_s == pytest.approx(1800)


def test_a_preemption_waits_for_jobs_granted_in_the_same_instant():
    """Found by the property above: under priority, j3 (priority 1) comes at 0 s when j0
    and j1 (priority 0) were granted both instances at that instant but had not taken them
    up: nobody held anything to evict, and j3 waited 30 min behind lower-priority jobs. The
    preemption is now tried again once they hold their instances, in the same instant."""
    raw = _raw(_same_size_jobs([0, 0, 0, 1]), 2, duration="1d")
    raw["scheduler"]["policy"] = "priority"
    result, evictions = _run_watching_evictions(scenario_from_dict(raw), 0)
    assert result.jobs["j3"].start_s == 0
    assert len(evictions) == 1 and evictions[0][0] == 0
    victim = result.jobs[evictions[0][1]]
    assert victim.preemptions == 1 and victim.lost_work_s == 0  # evicted before any work
