"""Invariants of the timeline and its traces on generated scenarios (hypothesis): chip-time
is conserved, no instance is held twice or while it is down, every time is monotone and
inside the horizon, useful work never exceeds held work, recovering jobs are served before
queued ones, and a seed gives the same run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from clustersim.analysis.trace import JOB_STATES, UTILISATION_STATES, MemoryRecorder, _rows_to_table
from clustersim.analysis.utilisation import utilisation_rows
from clustersim.cluster.timeline import Timeline
from clustersim.runner.api import step_profiles, topology_for
from clustersim.scenario.loader import scenario_from_dict
from clustersim.training.step import StepModel

SMALL_JOB = {"model": "llama3-8b", "seq_len": 2048, "micro_batch": 1, "recompute": "selective",
             "parallelism": {"tp": 8, "pp": 1, "zero": 1, "sequence_parallel": True}}
HELD_STATES = [s for s in JOB_STATES if s != "done"]


# Tensor parallelism across the four instances of a Trn2 UltraServer: the job holds whole
# UltraServers and loses (and replaces) a whole one when an instance fails.
WIDE_JOB = {"model": "llama3.1-405b", "seq_len": 2048, "micro_batch": 1, "global_batch": 4,
            "recompute": "selective", "instances": 4,
            "parallelism": {"tp": 128, "pp": 2, "dp": 1, "zero": 1, "sequence_parallel": True}}


@st.composite
def scenarios(draw):
    ultraservers = draw(st.booleans())
    if ultraservers:
        us = draw(st.integers(2, 4))
        instances, hardware = 4 * us, "trn2u"
        cluster = {"ultraservers": us, "spares": 4 * draw(st.integers(0, 1))}
    else:
        instances, hardware = draw(st.integers(4, 16)), "trn2"
        cluster = {"instances": instances, "spares": draw(st.integers(0, 2))}
    jobs = []
    for k in range(draw(st.integers(1, 5))):
        size = draw(st.integers(1, instances))
        timing = {"submit": f"{draw(st.integers(0, 36))}h", "priority": draw(st.integers(0, 2)),
                  "run_for": f"{draw(st.integers(1, 30))}h"}
        if ultraservers and draw(st.booleans()):
            jobs.append(dict(WIDE_JOB, name=f"j{k}", **timing))
            continue
        body = dict(SMALL_JOB, name=f"j{k}", instances=size, global_batch=size * 8 * 4, **timing)
        body["parallelism"] = dict(SMALL_JOB["parallelism"], dp=size * 8)
        if draw(st.booleans()):
            body["checkpoint"] = {"interval": f"{draw(st.integers(10, 180))}min",
                                  "write": "1min", "restore": "3min",
                                  "async": draw(st.booleans())}
        jobs.append(body)
    policy = draw(st.sampled_from(["fifo", "priority", "backfill"]))
    repair = draw(st.sampled_from(["30min", "6h", "2d", "never"]))
    return scenario_from_dict({
        "name": "prop", "hardware": hardware, "duration": "3d",
        "seed": draw(st.integers(0, 99)), "cluster": dict(cluster, fabric={"instances_per_leaf": 4}),
        "scheduler": {"policy": policy, "preemption": policy == "priority" and draw(
            st.booleans())},
        "jobs": jobs,
        "failures": {"preset": "llama3", "scale": draw(st.sampled_from([0, 30, 300, 3000])),
                     "repair": repair, "detect": f"{draw(st.integers(0, 30))}min"},
        "trace": {"bin": "1h", "levels": ["cluster", "instance", "job"]},
    })


def run_recorded(scenario, seed):
    recorder = MemoryRecorder()
    model = StepModel(topology_for(scenario))
    result = Timeline(scenario, step_profiles(scenario), np.random.SeedSequence(seed),
                      recorder=recorder, step_model=model).run()
    return result, recorder


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), seed=st.integers(0, 2**32 - 1))
def test_timeline_invariants(scenario, seed):
    result, rec = run_recorded(scenario, seed)
    event(f"failures: {'some' if sum(result.failures.values()) else 'none'}")
    event(f"repairs: {'some' if result.repairs_completed else 'none'}")
    wide = any(j.parallelism.tp == 128 for j in scenario.jobs)
    event(f"whole-UltraServer jobs: {'some' if wide else 'none'}")
    horizon = scenario.duration_s
    cpi = scenario.hardware.chips_per_instance
    n_instances = scenario.total_instances
    chips = n_instances * cpi
    eps = 1e-6

    # Times monotone and inside the horizon.
    event_times = [e[0] for e in rec.events]
    assert event_times == sorted(event_times)
    assert all(0 <= t <= horizon + eps for t in event_times)
    for _, _, _, start, end in rec.intervals:
        assert 0 <= start <= end <= horizon + eps
    state_times = [s[0] for s in rec.states]
    assert state_times == sorted(state_times)

    # Each job's states tile its life from submission to the horizon.
    for job_id, job in enumerate(scenario.jobs):
        spans = sorted((s, e, st_) for ent, i, st_, s, e in rec.intervals
                       if ent == "job" and i == job_id)
        assert spans and spans[0][0] == pytest.approx(job.submit_s)
        assert spans[-1][1] == pytest.approx(horizon)
        assert all(st_ in JOB_STATES for _, _, st_ in spans)
        assert all(b[0] == pytest.approx(a[1]) for a, b in zip(spans, spans[1:], strict=False))

    # A job waiting for replacement hardware comes before queued jobs of the same or lower
    # priority: under FIFO and priority, none of them starts while it waits (backfill may
    # start short jobs around it).
    if scenario.scheduler.policy in ("fifo", "priority"):
        waits = [(i, s, e) for ent, i, st_, s, e in rec.intervals
                 if ent == "job" and st_ == "waiting_for_hardware"]
        # A start is a queued interval followed by anything but `done` (a job can also end
        # while queued, its run time or deadline spent).
        after = {(i, s): st_ for ent, i, st_, s, _ in rec.intervals if ent == "job"}
        starts = [(i, e) for ent, i, st_, _, e in rec.intervals
                  if ent == "job" and st_ == "queued" and e < horizon - eps
                  and after.get((i, e)) != "done"]
        for started, t in starts:
            for waiting, s, e in waits:
                if s < t - eps and e > t + eps and waiting != started:
                    assert scenario.scheduler.policy == "priority" and (
                        scenario.jobs[started].priority > scenario.jobs[waiting].priority)

    # Down chips are `failed` until detection, then `repairing`; without repairs, failed.
    detect_s = scenario.failures.detect_s
    for ent, _, st_, start, end in rec.intervals:
        if ent != "chip":
            continue
        if scenario.failures.repair_s == "never":
            assert st_ == "failed" and end == pytest.approx(horizon)
        elif st_ == "failed":
            assert end - start <= detect_s + eps

    # An instance is held by at most one job at a time, and never while it is down.
    busy: dict[int, list[tuple[float, float]]] = {}
    for _, inst, start, end in rec.allocations:
        busy.setdefault(inst, []).append((start, end))
    down = {}
    for ent, chip, _, start, end in rec.intervals:
        if ent == "chip":
            down.setdefault(chip // cpi, set()).add((start, end))
    for inst, spans in down.items():
        busy.setdefault(inst, []).extend(spans)
    for spans in busy.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - eps

    # Chip-time is conserved: every bin's states add up to the chips, the held chip-time
    # is the timeline's, the down chip-time is the chip intervals', useful <= held.
    table = utilisation_rows(
        horizon_s=horizon, bin_s=scenario.trace.bin_s, levels=["cluster", "instance", "job"],
        n_instances=n_instances, chips_per_instance=cpi,
        instances_per_ultraserver=scenario.hardware.instances_per_ultraserver,
        job_ids=list(range(len(scenario.jobs))), job_names=[j.name for j in scenario.jobs],
        intervals=_rows_to_table("intervals", rec.intervals),
        allocations=_rows_to_table("allocations", rec.allocations)).to_pandas()
    fractions = table[list(UTILISATION_STATES)]
    assert np.allclose(fractions.sum(axis=1), 1.0)
    assert (fractions >= -1e-9).all().all()
    cluster = table[table["level"] == "cluster"]
    weight = chips * cluster["bin_s"]
    held = (cluster[HELD_STATES].sum(axis=1) * weight).sum()
    assert held == pytest.approx(result.allocated_chip_s, rel=1e-9, abs=1e-3)
    down_s = sum(e - s for ent, _, _, s, e in rec.intervals if ent == "chip")
    assert ((cluster["failed"] + cluster["repairing"]) * weight).sum() == pytest.approx(
        down_s, rel=1e-9, abs=1e-3)
    per_instance = table[table["level"] == "instance"]
    assert (per_instance[HELD_STATES].sum(axis=1) * cpi * per_instance["bin_s"]).sum() == (
        pytest.approx(held, rel=1e-9, abs=1e-3))
    assert result.useful_chip_s <= result.allocated_chip_s + 1e-6
    for outcome in result.jobs.values():
        assert 0 <= outcome.useful_s <= horizon + eps


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), seed=st.integers(0, 2**32 - 1))
def test_a_seed_gives_the_same_run(scenario, seed):
    first, rec1 = run_recorded(scenario, seed)
    second, rec2 = run_recorded(scenario, seed)
    assert rec1.events == rec2.events
    assert rec1.intervals == rec2.intervals
    assert rec1.allocations == rec2.allocations
    assert first.allocated_chip_s == second.allocated_chip_s
    assert {k: v.steps_completed for k, v in first.jobs.items()} == {
        k: v.steps_completed for k, v in second.jobs.items()}
