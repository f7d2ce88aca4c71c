"""Multi-job clusters: scheduling order, backfill, preemption, placement, job mixes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clustersim.analysis.trace import MemoryRecorder
from clustersim.cluster.placement import pack, pack_runs, runs_of
from clustersim.runner.api import run_to, simulate
from clustersim.scenario.loader import ScenarioError, load_scenario, scenario_from_dict

SMALL_JOB = {"model": "llama3-8b", "seq_len": 2048, "micro_batch": 1, "recompute": "selective",
             "parallelism": {"tp": 8, "pp": 1, "zero": 1, "sequence_parallel": True}}


def job(name, instances, submit="0s", run_for="6h", priority=0, **extra):
    body = dict(SMALL_JOB, name=name, instances=instances, submit=submit, priority=priority,
                global_batch=instances * 8 * 4, run_for=run_for)
    body["parallelism"] = dict(SMALL_JOB["parallelism"], dp=instances * 8)
    body.update(extra)
    return body


def scenario(jobs, instances=16, policy="fifo", preemption=False, failures=None,
             duration="3d", per_leaf=4, **extra):
    raw = {"name": "sched", "hardware": "trn2", "duration": duration,
           "cluster": {"instances": instances, "fabric": {"instances_per_leaf": per_leaf}},
           "scheduler": {"policy": policy, "preemption": preemption}, "jobs": jobs,
           "failures": failures or {"preset": "none"}, "trace": {"bin": "10min"}}
    raw.update(extra)
    return scenario_from_dict(raw)


def outcomes(s, seed=0):
    return simulate(s, seed=seed).summary["jobs"]


MIX = {
    "arrivals": {"rate": "30/d", "count": 60},
    "templates": [
        {"name": "small", "weight": 3, "instances": {"min": 1, "max": 8},
         "run_for": {"median": "4h", "sigma": 0.8}, "job": dict(SMALL_JOB, priority=0)},
        {"name": "big", "weight": 1, "instances": [16, 32],
         "run_for": {"median": "12h", "sigma": 0.3}, "job": dict(SMALL_JOB, priority=1)},
    ],
}


@pytest.fixture(scope="module", params=["fifo", "priority", "backfill"])
def mixed_run(request, tmp_path_factory):
    s = scenario([], instances=64, policy=request.param, preemption=request.param == "priority",
                 failures={"preset": "llama3", "scale": 30}, duration="5d", per_leaf=16,
                 workload=MIX)
    out = tmp_path_factory.mktemp(request.param) / "run"
    result = run_to(s, out, seed=1)
    return request.param, s, result, out


def test_no_instance_is_held_by_two_jobs(mixed_run):
    _, _, result, out = mixed_run
    import pandas as pd

    allocations = pd.read_parquet(out / "allocations.parquet").sort_values(
        ["instance_id", "start_s"])
    for _, group in allocations.groupby("instance_id"):
        assert np.all(group["start_s"].to_numpy()[1:] >= group["end_s"].to_numpy()[:-1] - 1e-9)


def test_no_job_starts_before_submission(mixed_run):
    _, s, result, _ = mixed_run
    for spec in s.jobs:
        figures = result.summary["jobs"][spec.name]
        if figures["start_s"] is not None:
            assert figures["start_s"] >= spec.submit_s - 1e-9


def test_utilisation_never_exceeds_one_and_hours_are_attributed(mixed_run):
    _, s, result, out = mixed_run
    import pandas as pd

    utilisation = pd.read_parquet(out / "utilisation.parquet")
    held = utilisation[["queued", "running", "checkpointing", "down", "waiting_for_hardware", "restarting",
                        "restoring"]].sum(axis=1)
    assert (held <= 1 + 1e-9).all()
    for spec in s.jobs:
        figures = result.summary["jobs"][spec.name]
        since_submit = (figures["end_s"] if figures["end_s"] is not None else s.duration_s) - (
            spec.submit_s)
        accounted = figures["useful_s"] + sum(figures["lost_time_s"].values())
        assert accounted == pytest.approx(since_submit, abs=1e-6)


def test_fifo_starts_jobs_in_submission_order(mixed_run):
    policy, s, result, _ = mixed_run
    if policy != "fifo":
        pytest.skip("order under FIFO only")
    starts = [result.summary["jobs"][j.name]["start_s"] for j in sorted(
        s.jobs, key=lambda j: j.submit_s)]
    started = [t for t in starts if t is not None]
    assert started == sorted(started)
    # once one job never starts, no later job does either
    if None in starts:
        assert all(t is None for t in starts[starts.index(None):])


def test_backfill_never_delays_the_head_job():
    """A 16-instance job waits behind a running one; short jobs behind it fill the gap
    under backfill but its start is the same as under FIFO."""
    jobs = [job("first", 8, run_for="10h"), job("head", 16, submit="1h", run_for="5h"),
            job("filler-a", 4, submit="2h", run_for="3h"),
            job("filler-b", 4, submit="2h", run_for="20h")]
    fifo = outcomes(scenario(jobs, policy="fifo"))
    backfill = outcomes(scenario(jobs, policy="backfill"))
    assert backfill["head"]["start_s"] == pytest.approx(fifo["head"]["start_s"])
    assert backfill["head"]["start_s"] == pytest.approx(10 * 3600)
    assert backfill["filler-a"]["start_s"] == pytest.approx(2 * 3600)  # backfilled
    assert fifo["filler-a"]["start_s"] > fifo["head"]["start_s"]
    # filler-b would run past the head's reservation with instances it needs: it waits
    assert backfill["filler-b"]["start_s"] >= backfill["head"]["start_s"]


def test_priority_and_preemption():
    jobs = [job("low", 12, run_for="2d", checkpoint={"interval": "1h", "write": "1min"}),
            job("high", 8, submit="3h", run_for="4h", priority=5)]
    waiting = outcomes(scenario(jobs, policy="priority", preemption=False))
    assert waiting["high"]["start_s"] > 2 * 86400 - 1  # waits for the low job to end
    preempting = outcomes(scenario(jobs, policy="priority", preemption=True))
    assert preempting["high"]["start_s"] == pytest.approx(3 * 3600)
    low = preempting["low"]
    assert low["preemptions"] == 1
    # Preempted at 3 h of wall time = 2 h 58 min of training (two 1-minute blocking writes):
    # back to the checkpoint taken at 2 h of training, 58 minutes lost.
    assert low["lost_work_s"] == pytest.approx(3 * 3600 - 2 * 60 - 2 * 3600)
    assert low["queue_wait_s"] == pytest.approx(4 * 3600, rel=0.01)  # queued while high ran


def test_recovering_jobs_get_repaired_instances_before_queued_jobs():
    """A job that holds the whole cluster and loses an instance gets it back when it is
    repaired; the queued job behind it never starts (FIFO), and no wait for hardware is
    longer than a repair."""
    jobs = [job("whole", 4, run_for="10d"), job("behind", 1, submit="1h", run_for="1d")]
    s = scenario(jobs, instances=4, failures={"preset": "llama3", "scale": 300,
                                              "repair": "2h", "detect": "2min"})
    whole, behind = (outcomes(s, seed=4)[name] for name in ("whole", "behind"))
    failures = whole["interruptions"]
    assert failures >= 3
    assert behind["start_s"] is None  # every repaired instance went back to `whole`
    waits = whole["lost_time_s"]["waiting_for_hardware"]
    assert 0 < waits <= failures * (2 * 3600 - 120) + 1e-6


def test_a_preempted_job_is_credited_its_work_once():
    """Every hour of a preempted job since its submission is useful or lost, once: its
    running time is its time in the running state, its useful time no more."""
    jobs = [job("low", 12, run_for="2d", checkpoint={"interval": "1h", "write": "1min"}),
            job("high", 8, submit="3h", run_for="4h", priority=5)]
    low = outcomes(scenario(jobs, policy="priority", preemption=True))["low"]
    assert low["preemptions"] == 1
    # lost_time_s.lost_work: the work lost to the preemption plus the step unfinished at
    # the end (running time that completed no step is not useful).
    assert low["useful_s"] + low["lost_time_s"]["lost_work"] == pytest.approx(
        low["time_by_state_s"]["running"])
    assert low["lost_work_s"] <= low["lost_time_s"]["lost_work"]
    lost = sum(low["lost_time_s"].values())
    assert low["useful_s"] + lost == pytest.approx(low["end_s"] - 0.0)


def test_deadlines_stop_jobs():
    jobs = [job("late", 4, run_for=None, deadline="5h", submit="1h")]
    figures = outcomes(scenario(jobs))["late"]
    assert figures["status"] == "stopped at deadline"
    assert figures["end_s"] == pytest.approx(6 * 3600)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8, 16, 24])
def test_packing_from_counts_per_leaf_chooses_as_packing_id_by_id(size):
    """Leaves as runs of consecutive ids: `pack_runs` picks exactly the ids `pack` picks
    from the list of free ids, for sparse and dense masks, every count up to and past what
    is free."""
    rng = np.random.default_rng(size)
    leaves = 12
    leaf_of = np.arange(leaves * size) // size
    assert runs_of(leaf_of) == size
    for density in (0.05, 0.3, 0.7, 1.0):
        for _ in range(20):
            mask = rng.random(leaves * size) < density
            for count in range(int(mask.sum()) + 2):
                want = pack(np.flatnonzero(mask), leaf_of, count)
                got = pack_runs(mask, size, count)
                if want is None:
                    assert got is None
                else:
                    assert got is not None and got.tolist() == want.tolist()


def test_leaves_not_in_runs_are_not_packed_by_counts():
    assert runs_of(np.array([0, 0, 1, 1, 1])) == 0  # a leaf of 2, one of 3
    assert runs_of(np.array([0, 1, 0, 1])) == 0  # interleaved
    assert runs_of(np.array([5, 5, 6, 6])) == 2


def test_placement_packs_under_few_leaves():
    free = np.arange(32)
    leaf = free // 8
    tight = pack(np.array([1, 2, 3, 9, 10, 11, 12, 13, 14, 15, 16]), leaf, 3)
    assert tight.tolist() == [1, 2, 3]  # the leaf that fits most tightly
    spread = pack(free[[0, 1, 8, 9, 10, 16, 17, 18, 19]], leaf, 7)
    assert sorted(set((spread // 8).tolist())) == [1, 2]  # the emptiest leaves first
    assert pack(free[:3], leaf, 4) is None


def test_ultraserver_jobs_get_whole_ultraservers():
    wide = dict(SMALL_JOB, model="llama3.1-405b", parallelism={"tp": 128, "pp": 2, "dp": 1,
                                                               "zero": 1,
                                                               "sequence_parallel": True})
    jobs = [dict(wide, name="a", instances=4, global_batch=4, run_for="1h"),
            dict(job("b", 2), run_for="1h"),
            dict(wide, name="c", instances=4, global_batch=4, run_for="1h", submit="10min")]
    s = scenario_from_dict({"name": "us", "hardware": "trn2u", "duration": "1d",
                            "cluster": {"ultraservers": 3}, "jobs": jobs})
    recorder = MemoryRecorder()
    from clustersim.cluster.timeline import Timeline
    from clustersim.runner.api import step_profiles

    Timeline(s, step_profiles(s), np.random.SeedSequence(0), recorder=recorder).run()
    held = {}
    for job_id, instance, _, _ in recorder.allocations:
        held.setdefault(job_id, set()).add(instance)
    for job_id in (0, 2):
        ultraservers = {i // 4 for i in held[job_id]}
        assert len(ultraservers) == 1 and len(held[job_id]) == 4


def test_job_mixes_are_drawn_from_the_seed():
    s1 = scenario([], instances=64, per_leaf=16, workload=MIX)
    s2 = scenario([], instances=64, per_leaf=16, workload=MIX)
    assert len(s1.jobs) == 60
    assert [j.name for j in s1.jobs] == [j.name for j in s2.jobs]
    assert [j.submit_s for j in s1.jobs] == [j.submit_s for j in s2.jobs]
    sizes = {s1.job_instances(j) for j in s1.jobs}
    assert sizes <= {1, 2, 4, 8, 16, 32}
    for j in s1.jobs:
        assert j.parallelism.dp == s1.job_instances(j) * 64 // 8


def test_jobs_from_a_trace_file(tmp_path: Path):
    (tmp_path / "jobs.csv").write_text("submit,instances,template,run_for,priority\n"
                                       "0,4,small,2h,0\n1h,8,small,,1\n")
    workload = {"templates": MIX["templates"], "file": "jobs.csv"}
    scenario_file = tmp_path / "s.yaml"
    import yaml

    scenario_file.write_text(yaml.safe_dump({
        "name": "tr", "hardware": "trn2", "duration": "1d", "cluster": {"instances": 16},
        "workload": workload}))
    s = load_scenario(scenario_file)
    assert [s.job_instances(j) for j in s.jobs] == [4, 8]
    assert s.jobs[1].submit_s == 3600 and s.jobs[1].priority == 1
    assert s.jobs[0].run_for_s == 7200
    (tmp_path / "bad.csv").write_text("submit,instances\n0,4\n")
    scenario_file.write_text(yaml.safe_dump({
        "name": "tr", "hardware": "trn2", "cluster": {"instances": 16},
        "workload": {"templates": MIX["templates"], "file": "bad.csv"}}))
    with pytest.raises(ScenarioError, match="missing columns template"):
        load_scenario(scenario_file)


def test_jobs_that_can_never_fit_are_rejected():
    too_big = dict(MIX, templates=[dict(MIX["templates"][1], instances=[128])])
    with pytest.raises(ScenarioError, match="cluster has 64"):
        scenario([], instances=64, per_leaf=16, workload=too_big)


def test_placement_changes_the_step_time():
    """Two blockers leave 2 free instances under one leaf and 1 under the other: a 3-instance
    job is spread over both leaves, and on a heavily oversubscribed fabric its data-parallel
    traffic over the uplinks makes each step slower than packed under one leaf."""
    jobs = [job("blocker-a", 2, run_for="30d"), job("blocker-b", 3, run_for="30d"),
            job("wide", 3, submit="1min", run_for="1h")]

    def slowdown(oversubscription: float) -> float:
        s = scenario(jobs, instances=8, cluster={"instances": 8, "fabric": {
            "instances_per_leaf": 4, "oversubscription": oversubscription}})
        return outcomes(s)["wide"]["placement_slowdown"]

    assert slowdown(1.0) == pytest.approx(1.0)
    assert slowdown(64.0) > 1.5


def test_template_errors_are_reported_once():
    bad = dict(MIX, templates=[dict(MIX["templates"][0], job=dict(
        SMALL_JOB, parallelism={"tp": 8, "pp": 1, "ep": 2}, model="llama2-13b"))])
    with pytest.raises(ScenarioError) as info:
        scenario([], instances=64, per_leaf=16, workload=bad)
    text = str(info.value)
    assert text.count("mixture-of-experts") == 1
    assert "more jobs the workload generated" in text


@pytest.mark.parametrize("change", [
    {},  # valid: the same jobs
    {"model": {"base": "llama3-8b", "heads": 7}},  # hidden not divisible by heads
    {"model": "no-such-model"},
    {"model": {"base": "no-such-model"}},
    {"parallelism": {"tp": True}},
    {"parallelism": {"tp": 3}},  # dp not a whole number at some sizes
    {"parallelism": {"tp": 8, "pp": 1, "ep": 2}, "model": "llama2-13b"},
    {"checkpoint": {"interval": "auto", "write": 0}},
    {"checkpoint": {"write": True}},
    {"recompute": "sometimes", "seq_len": True},
    {"parallelism": {1: {"a": 1}, "1": {"b": 2}}},  # keys that sort into comparing dicts
])
def test_template_parts_validated_once_give_the_jobs_and_errors_of_each_job_validated(
        monkeypatch, change):
    """The generated jobs share their template's model, checkpoint and parallelism,
    validated once (loader._share_template_specs): the scenario, or its error, is the same
    as when every generated job is validated on its own."""
    import clustersim.scenario.loader as loader

    mix = dict(MIX, templates=[dict(MIX["templates"][0], job=dict(SMALL_JOB, **change)),
                               MIX["templates"][1]])

    def load():
        try:
            return scenario([], instances=64, per_leaf=16, workload=mix).jobs
        except ScenarioError as error:
            return str(error)

    shared = load()
    monkeypatch.setattr(loader, "_validated", lambda spec, values: None)  # each job alone
    alone = load()
    assert shared == alone
    assert isinstance(shared, str) == bool(change)
    if not change:
        small = [job for job in shared if job.name.startswith("small")]
        assert small[0].model is small[-1].model  # validated once, shared
        assert small[0].model is not alone[0].model


def test_jobs_sharing_leaf_uplinks_slow_each_other():
    """Three jobs spread over leaves of 4 instances (A: leaves 0-1, B: 2-3, C: 1 and 3). With
    uplinks at half the leaves' EFA, leaf 1 carries A's and C's crossing traffic, twice its
    capacity: their uplink traffic runs at half speed. On a non-blocking fabric nothing."""
    jobs = [job("a", 6, run_for="2d"), job("b", 6, run_for="2d"), job("c", 4, run_for="2d")]

    def run(oversubscription: float) -> dict:
        s = scenario(jobs, instances=16, cluster={"instances": 16, "fabric": {
            "instances_per_leaf": 4, "oversubscription": oversubscription}})
        return outcomes(s)

    shared = run(2.0)
    assert shared["a"]["uplink_contention"] == pytest.approx(2.0)
    assert shared["c"]["uplink_contention"] == pytest.approx(2.0)
    open_fabric = run(1.0)
    assert all(j["uplink_contention"] == 1.0 for j in open_fabric.values())
    assert shared["a"]["steps_completed"] < open_fabric["a"]["steps_completed"]


def test_a_blocked_recovery_does_not_hold_back_the_next_recovery():
    """FIFO: the first recovering job needs more than is free; the second, which fits, still
    gets its replacement, and the queued job waits behind both."""
    from clustersim.cluster.jobrun import JobRun
    from clustersim.cluster.timeline import Timeline
    from clustersim.runner.api import step_profiles

    jobs = [job("big", 4), job("small", 1), job("queued", 1)]
    s = scenario(jobs, instances=8)
    profiles = step_profiles(s)
    t = Timeline(s, profiles, np.random.SeedSequence(0))
    t.jobs = [JobRun(t, i, j, profiles[j.name]) for i, j in enumerate(s.jobs)]
    big, small, queued = t.jobs
    t.set_owner(np.arange(2, 8), 2)  # two free instances
    for run in (big, small):
        run.set_state("waiting_for_hardware")
    t.scheduler.queue.append(queued)
    t.scheduler._pass()
    assert big.held_count == 0
    assert small.held_count == 1 and int(t.owner[small.held[0]]) == small.index
    assert queued.state != "running" and queued in t.scheduler.queue


def test_a_recovering_job_is_not_preempted_from_inside_its_own_process():
    """Found by the timeline properties: a whole-UltraServer job recovering (its own process
    running the scheduler as it releases instances) was picked as the victim of its own pass,
    and simpy refuses a process interrupting itself."""
    from clustersim.cluster.timeline import Timeline
    from clustersim.runner.api import step_profiles

    wide = {"model": "llama3.1-405b", "seq_len": 2048, "global_batch": 4, "instances": 4,
            "recompute": "selective",
            "parallelism": {"tp": 128, "pp": 2, "dp": 1, "zero": 1, "sequence_parallel": True}}
    small = dict(job("j0", 4, submit="23h", run_for="1h", priority=1), global_batch=128)
    s = scenario_from_dict({
        "name": "p", "hardware": "trn2u", "duration": "3d",
        "cluster": {"ultraservers": 2, "fabric": {"instances_per_leaf": 4}},
        "scheduler": {"policy": "priority", "preemption": True},
        "jobs": [small, dict(wide, name="j1", run_for="1d")],
        "failures": {"preset": "llama3", "scale": 3000, "repair": "30min", "detect": "12min"}})
    result = Timeline(s, step_profiles(s), np.random.SeedSequence(27188)).run()
    assert sum(result.failures.values()) > 0


def test_cluster_state_counts_jobs_as_they_start_and_free_instances_as_they_fail():
    from clustersim.cluster.timeline import Timeline
    from clustersim.runner.api import step_profiles

    s = scenario([job("a", 2), job("b", 2, submit="2h")], instances=8)
    recorder = MemoryRecorder()
    Timeline(s, step_profiles(s), np.random.SeedSequence(0), recorder=recorder).run()
    running = {time: count for time, _, _, count, _ in recorder.states}
    assert running[0.0] == 1 and running[7200.0] == 2
    # A free instance failing shrinks the free pool at once (min_free_instances sees it).
    s = scenario([job("a", 2)], instances=8, failures={
        "rates": [{"component": "host", "per": "instance", "rate": "20/d"}],
        "repair": "never"}, duration="1d")
    recorder = MemoryRecorder()
    result = Timeline(s, step_profiles(s), np.random.SeedSequence(0), recorder=recorder).run()
    free = [f for _, f, _, _, _ in recorder.states]
    assert free == sorted(free, reverse=True) and free[-1] < 6
    assert result.min_free_instances == free[-1]
