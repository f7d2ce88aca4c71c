"""Fluid deployments held in the event-driven fleet beside generated jobs (serving.fluid_plan,
cluster.fluid_holding, serving.fluid_fleet; docs/fleet-day.md "In the event-driven fleet"):
the vectorised autoscaler against the fleet-day level's rule step by step, closed forms of
constant and sinusoidal loads, the fluid queue against its recursion, chip-time conserved,
preemption of lower-priority jobs, refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_helpers import refused
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.runner.api import simulate
from clustersim.scenario.loader import load_scenario
from clustersim.serving.fluid_fleet import fluid_queue, held_per_step
from clustersim.serving.fluid_plan import (
    HOLD_LEVELS,
    autoscaled_counts,
    change_points,
    fluid_plans,
    holding_blocks,
    running,
)

BASE = {
    "name": "fluid-beside-jobs",
    "hardware": "trn2u",
    "duration": "1d",
    "seed": 3,
    "cluster": {"ultraservers": 8, "fabric": {"oversubscription": 1.0, "latency": "15us"}},
    "scheduler": {"policy": "backfill", "preemption": True},
    "fluid": {"interval": "1min", "curve_requests": 500},
    "serve": [{
        "name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
        "router": "least_outstanding",
        "workload": {
            "load": {"sinusoid": {"peak": "800/s", "trough": "100/s", "peak_at": "14h"},
                     "noise": 0.05},
            "input_tokens": {"distribution": "lognormal", "median": 512, "sigma": 0.8,
                             "max": 4096},
            "output_tokens": {"distribution": "lognormal", "median": 200, "sigma": 0.8,
                              "max": 1024}},
        "slo": {"ttft": "1s", "tpot": "50ms"},
        "autoscale": {"min": 2, "max": 400, "target": 0.7, "warmup": "2min", "priority": 5},
    }],
    "workload": {
        "arrivals": {"rate": "40/d", "count": 30},
        "templates": [{
            "name": "small", "weight": 1, "instances": {"min": 1, "max": 4},
            "run_for": {"median": "3h", "sigma": 1.0},
            "job": {"model": "llama3-8b", "seq_len": 4096,
                    "parallelism": {"tp": 8, "pp": 1, "zero": 1, "sequence_parallel": True},
                    "recompute": "selective",
                    "checkpoint": {"interval": "auto", "write": "30s", "restore": "2min"}}}],
    },
    "trace": {"bin": "10min", "levels": ["cluster"]},
}


def _scenario(tmp_path: Path, data: dict, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path, load_scenario(path)


def _fleet_day_counts(rates, per, lo, hi, every, keep_s, step):
    """The fleet-day level's decision rule (serving.fleetday), step by step: a need per
    decision on the last step's rate, scale up at once, down to the highest need of the
    last `keep_s`."""
    count, needs, out = None, [], []
    for k in range(len(rates)):
        if k % every == 0:
            now = k * step
            observed = rates[k - 1] if k else rates[0]
            need = min(hi, max(lo, math.ceil(observed / per - 1e-9)))
            needs.append((now, need))
            while needs and needs[0][0] < now - keep_s:
                needs.pop(0)
            keep = max(n for _, n in needs)
            if count is None or need > count:
                count = need
            elif keep < count:
                count = keep
        out.append(count)
    return np.array(out)


@settings(max_examples=60, deadline=None)
@given(rates=st.lists(st.floats(0, 500), min_size=1, max_size=200),
       per=st.floats(0.5, 50), lo=st.integers(0, 5), extra=st.integers(0, 50),
       every=st.integers(1, 5), keep=st.integers(0, 6))
def test_vectorised_autoscaler_is_the_fleet_day_rule(rates, per, lo, extra, every, keep):
    rates = np.array(rates)
    step = 60.0
    keep_s = keep * every * step
    vectorised = autoscaled_counts(rates, per, lo, lo + extra, every, keep)
    assert np.array_equal(vectorised, _fleet_day_counts(rates, per, lo, lo + extra, every,
                                                        keep_s, step))


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_constant_load_gives_the_closed_form_count(tmp_path: Path):
    data = json.loads(json.dumps(BASE))
    data["serve"][0]["workload"]["load"] = {"hourly": [300] * 24}
    _, scenario = _scenario(tmp_path, data)
    (plan,) = fluid_plans(scenario, 3)
    dep = plan.dep
    expected = math.ceil(300 / (0.7 * dep.curve.capacity_per_s))
    assert np.all(plan.up == expected) and np.all(plan.held == expected)
    # one change: the holding at the start, in whole UltraServers
    assert len(plan.change_s) == 1 and plan.change_s[0] == 0.0
    # (Trn2 UltraServers: 16 chips an instance, 4 instances; a block is one UltraServer here)
    assert plan.block == 4
    assert plan.instances[0] == math.ceil(expected * dep.chips / 16 / 4) * 4


def test_a_sinusoids_count_rises_and_falls_by_its_closed_form():
    """Over a day from trough to trough, a noiseless sinusoid's count (no hysteresis) rises
    by ceil(peak / per) - ceil(trough / per) and falls by as much."""
    step = 60.0
    t = np.arange(1440) * step
    peak, trough, per = 800.0, 100.0, 7.0
    rates = trough + (peak - trough) * (1 - np.cos(2 * np.pi * (t + step / 2) / 86400)) / 2
    counts = autoscaled_counts(rates, per, 0, 10_000, 1, 0)
    changes = np.diff(counts)
    top = math.ceil(rates.max() / per - 1e-9)
    assert counts.max() == top
    assert changes[changes > 0].sum() == top - counts[0]
    assert -changes[changes < 0].sum() == top - counts[-1]
    # change points: exactly where the count changes, and its first value
    at, values = change_points(t, counts)
    assert len(at) == np.count_nonzero(changes) + 1
    assert np.array_equal(values[1:], counts[1:][changes != 0])


def test_holding_moves_in_whole_ultraserver_blocks():
    held = np.array([0, 1, 17, 170, 1700, 900, 3])
    instances, block = holding_blocks(held, chips=1, cpi=16, ipu=4)
    peak = math.ceil(1700 / 16)
    assert block % 4 == 0 and block == 4 * max(1, math.ceil(peak / (HOLD_LEVELS * 4)))
    assert np.all(instances % block == 0)
    assert np.all(instances * 16 >= held) and np.all((instances - block) * 16 < held)


@settings(max_examples=60, deadline=None)
@given(arrived=st.lists(st.floats(0, 1000), min_size=1, max_size=100),
       capacity=st.floats(0, 800))
def test_fluid_queue_is_its_recursion(arrived, capacity):
    arrived = np.array(arrived)
    cap = np.full(len(arrived), capacity)
    served, backlog = fluid_queue(arrived, cap)
    b = 0.0
    for k in range(len(arrived)):
        s = min(b + arrived[k], cap[k])
        b = b + arrived[k] - s
        assert served[k] == pytest.approx(s, rel=1e-9, abs=1e-6)
        assert backlog[k] == pytest.approx(b, rel=1e-9, abs=1e-6)


def test_running_window_and_step_function():
    v = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    assert list(running(v, 3, "max")) == [3, 3, 4, 4, 5, 9, 9, 9]
    assert list(running(v, 2, "min")) == [3, 1, 1, 1, 1, 5, 2, 2]
    assert list(held_per_step(np.array([0.0, 120.0]), np.array([4, 8]),
                              np.arange(4) * 60.0)) == [4, 4, 8, 8]


def test_a_constant_deployment_holds_its_closed_form_chip_time(tmp_path: Path):
    """No failures, a constant load: the holding is its blocks for the whole horizon, and
    chip-time adds up: jobs + serving + idle/down = the cluster's."""
    data = json.loads(json.dumps(BASE))
    data["serve"][0]["workload"]["load"] = {"hourly": [300] * 24}
    _, scenario = _scenario(tmp_path, data)
    result = simulate(scenario)
    d = result.summary["deployments"]["chat"]
    expected = math.ceil(300 / (0.7 * d["capacity_per_replica_per_s"]))
    instances = math.ceil(expected * d["chips_per_replica"] / 16 / 4) * 4
    assert d["chip_hours"] == pytest.approx(instances * 16 * 24)
    assert d["replicas_min"] == d["replicas_max"] == expected
    assert d["replica_shortfall_hours"] == 0
    c = result.summary["cluster"]
    assert c["serving_utilisation"] == pytest.approx(instances / 32)
    assert c["utilisation"] + c["serving_utilisation"] + c["idle_or_down_share"] == \
        pytest.approx(1.0)
    assert c["idle_or_down_share"] >= -1e-12
    assert d["slo_goodput"] == pytest.approx(1.0)


def test_chip_time_is_conserved_under_failures(tmp_path: Path):
    """With failures at 200x the Llama 3 rates, the holding's books and the instance owners
    agree: what the holding held, jobs held, and the rest add up to the cluster's chip-time,
    each part within it."""
    data = json.loads(json.dumps(BASE))
    data["failures"] = {"preset": "llama3", "scale": 200, "repair": "2h"}
    _, scenario = _scenario(tmp_path, data)
    result = simulate(scenario)
    timeline = result.timelines[0]
    book = timeline.holdings
    assert sum(book.failures) > 0  # failures did hit serving instances
    horizon = timeline.horizon_s
    serving = book.chip_s(horizon)
    jobs = timeline.allocated_chip_s
    total = timeline.total_chips * horizon
    assert 0 < serving and 0 < jobs and serving + jobs <= total * (1 + 1e-12)
    times, held = book.counts(0)
    assert np.all(np.diff(times) > 0) and np.all(held >= 0) and np.all(held <= 32)
    d = result.summary["deployments"]["chat"]
    assert d["replica_failures"] == book.failures[0] + len(book.software_s[0])
    assert book.software_s[0]  # software failures restarted replicas too
    assert d["chip_hours"] * 3600 == pytest.approx(serving)


def test_serving_preempts_lower_priority_jobs_and_records_a_shortfall(tmp_path: Path):
    """Jobs fill the cluster at first; at hour 6 the load jumps: the deployment evicts the
    jobs below its priority (they lose work and queue again) and, where jobs above it hold
    the rest, serves short of its plan."""
    data = json.loads(json.dumps(BASE))
    serve = data["serve"][0]
    serve["workload"]["load"] = {"hourly": [20] * 6 + [3000] * 18, "between": "step"}
    serve["autoscale"].update(max=2000, priority=5)
    # jobs do not preempt each other: every preemption is serving's (it preempts either way)
    data["scheduler"] = {"policy": "backfill", "preemption": False}
    data["workload"] = {
        "arrivals": {"rate": "1000/d", "count": 8},
        "templates": [
            {"name": "low", "weight": 3, "instances": [4], "run_for": {"median": "2d",
                                                                       "sigma": 0.1},
             "job": {**BASE["workload"]["templates"][0]["job"], "priority": 1}},
            {"name": "high", "weight": 1, "instances": [4], "run_for": {"median": "2d",
                                                                        "sigma": 0.1},
             "job": {**BASE["workload"]["templates"][0]["job"], "priority": 9}}]}
    _, scenario = _scenario(tmp_path, data)
    result = simulate(scenario)
    d = result.summary["deployments"]["chat"]
    jobs = result.summary["jobs"]
    priority = {job.name: job.priority for job in scenario.jobs}
    low = [j for name, j in jobs.items() if priority[name] == 1]
    high = [j for name, j in jobs.items() if priority[name] == 9]
    assert d["jobs_preempted"] == sum(j["preemptions"] for j in low) > 0
    assert all(j["preemptions"] == 0 for j in high) and high
    assert d["replica_shortfall_hours"] > 0 and d["holding_changes_short"] > 0
    assert d["slo_goodput"] < 1.0


def test_runs_with_replications(tmp_path: Path):
    data = json.loads(json.dumps(BASE))
    data["duration"] = "6h"
    data["workload"]["arrivals"]["count"] = 5
    path, _ = _scenario(tmp_path, data)
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out"), "--replications",
                      "2"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["deployments"]["chat"]["level"].startswith("fluid, held")


def test_elastic_jobs_beside_a_workload_are_refused(tmp_path: Path):
    data = json.loads(json.dumps(BASE))
    data["workload"]["templates"][0]["job"]["elastic"] = {"min_dp": 1}
    scenario = tmp_path / "elastic.yaml"
    scenario.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "out")])
    refused(result, "workload.templates.0.job.elastic", "no elastic key")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, path", [
    ({"autoscale": {"min": 600, "max": 700}}, "serve.0.autoscale.min"),
    ({"workload": {"load": {"hourly": [10] * 6, "repeat": "none"}}},
     "serve.0.workload.load.hourly"),
])
def test_bad_input_is_refused_with_its_key(tmp_path: Path, change, path):
    data = json.loads(json.dumps(BASE))
    for key, value in change.items():
        if key == "workload":
            data["serve"][0]["workload"].update(value)
        else:
            data["serve"][0][key] = value
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "out")])
    refused(result, path)
    assert not (tmp_path / "out").exists()


def test_the_rainier_year_serves_what_its_docs_say(tmp_path: Path):
    """docs/sites.md's year: four autoscaled deployments on day curves, held in the
    event-driven fleet beside its generated jobs, preempting the tiny and small jobs
    (priorities 0 and 1) but not the large and frontier ones."""
    from clustersim.scenario.fleetday import in_event_fleet

    root = Path(__file__).resolve().parents[1]
    raw = yaml.safe_load((root / "scenarios" / "rainier-year.yaml").read_text())
    serve = raw["serve"]
    words = {4: "four"}
    assert f"{words[len(serve)]} serving deployments whose replicas follow daily traffic" in \
        " ".join((root / "docs" / "sites.md").read_text().split())
    priorities = {t["name"]: t["job"].get("priority", 0) for t in raw["workload"]["templates"]}
    for d in serve:
        assert d["workload"]["load"] and d["autoscale"]
        p = d["autoscale"]["priority"]
        assert priorities["tiny"] < p and priorities["small"] < p
        assert p <= priorities["large"] and p <= priorities["frontier"]
    # its first day, loaded: the deployments held in the timeline, not a fleet-day run
    raw["duration"] = "1d"
    raw["workload"]["arrivals"] = {"rate": "2760/d", "until": "1d"}
    _, scenario = _scenario(tmp_path, raw, "year.yaml")
    assert in_event_fleet(scenario)


def test_software_restarts_take_replicas_out_for_whole_steps():
    from clustersim.serving.fluid_fleet import restarting_per_step

    times = np.arange(6) * 60.0
    # 100 s each: at 30 s (steps 0 to 2), at 250 s (steps 4 and 5), at 100 s (1 to 3)
    out = restarting_per_step(times, np.array([30.0, 250.0, 100.0]), 100.0)
    assert list(out) == [1, 2, 2, 1, 1, 1]
    assert list(restarting_per_step(times, np.array([]), 100.0)) == [0] * 6


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 1000), peak=st.sampled_from([200, 800, 3000]),
       scale=st.sampled_from([1, 100, 400]), priority=st.integers(-1, 2))
def test_chip_time_adds_up_whatever_the_load_and_failures(tmp_path_factory, seed, peak,
                                                          scale, priority):
    """Serving's books agree with the instance owners at the end (HoldingBook.books checks),
    serving and jobs hold within the cluster's chip-time, and the planned replicas are
    served but for what the holding lacked."""
    data = json.loads(json.dumps(BASE))
    data["seed"] = seed
    data["duration"] = "6h"
    data["workload"]["arrivals"] = {"rate": "200/d", "count": 30}
    data["failures"] = {"preset": "llama3", "scale": scale, "repair": "1h"}
    serve = data["serve"][0]
    serve["workload"]["load"]["sinusoid"]["peak"] = f"{peak}/s"
    serve["autoscale"]["priority"] = priority
    _, scenario = _scenario(tmp_path_factory.mktemp("h"), data)
    result = simulate(scenario)
    timeline = result.timelines[0]
    serving = timeline.holdings.chip_s(timeline.horizon_s)
    total = timeline.total_chips * timeline.horizon_s
    assert serving >= 0 and serving + timeline.allocated_chip_s <= total * (1 + 1e-9)
    d = result.summary["deployments"]["chat"]
    assert 0 <= d["replica_hours"] <= d["replica_hours_planned"] + 1e-9
    assert d["replica_hours_planned"] - d["replica_hours"] == pytest.approx(
        d["replica_shortfall_hours"], abs=1e-6)
    c = result.summary["cluster"]
    assert c["idle_or_down_share"] >= -1e-9


def test_a_later_start_holds_nothing_before_it(tmp_path: Path):
    data = json.loads(json.dumps(BASE))
    data["serve"][0]["start"] = "6h"
    _, scenario = _scenario(tmp_path, data)
    (plan,) = fluid_plans(scenario, 3)
    before = plan.times_s < 6 * 3600
    assert not plan.held[before].any() and not plan.up[before].any()
    # from its start, loaded (as at the horizon's start): up at once, at least its minimum
    assert plan.up[~before][0] == plan.held[~before][0] >= 2
    assert plan.change_s[0] == 0.0 and plan.instances[0] == 0
    assert plan.change_s[1] == 6 * 3600 and plan.instances[1] > 0
