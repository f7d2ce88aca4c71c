"""The fleet-day model (issue 24, docs/fleet-day.md): load curves, autoscaling, training on
what serving leaves, the fluid level against the request-level one, and the chip-hour books."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.runner.api import simulate
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.curves import replica_curve
from clustersim.serving.fleetday import simulate_fleet_day
from clustersim.serving.fleetday_figures import fleet_day_figures
from clustersim.serving.load import load_rates, load_seed, rescale_arrivals
from clustersim.serving.simulate import simulate_serving

LENGTHS = {"input_tokens": {"distribution": "lognormal", "median": 512, "sigma": 0.8,
                            "max": 4096},
           "output_tokens": {"distribution": "lognormal", "median": 200, "sigma": 0.8,
                             "max": 1024}}


def deployment(**extra) -> dict:
    d = {"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
         "router": "least_outstanding", "slo": {"ttft": "1s", "tpot": "50ms"},
         "workload": {"rate": "10/s", **LENGTHS}}
    d.update(extra)
    return d


def raw(serve: list[dict], duration: str = "1h", instances: int = 4, **extra) -> dict:
    r = {"name": "day-test", "duration": duration, "hardware": "trn2",
         "cluster": {"instances": instances}, "serve": serve,
         "fluid": {"curve_requests": 1000}}
    r.update(extra)
    return r


def build(r: dict):
    return scenario_from_dict(r)


# ----------------------------------------------------------------------------- load curves


def test_sinusoid_and_hourly_curves_closed_form():
    s = build(raw([deployment(fidelity="fluid", workload={
        "load": {"sinusoid": {"peak": "30/s", "trough": "10/s", "peak_at": "14h"}},
        **LENGTHS})], duration="1d"))
    rates = load_rates(s.serve[0].workload.load, 0.0, 86400.0, 3600.0, load_seed(0, 0))
    assert len(rates) == 24
    # the middle of hour 13 and of hour 14 straddle the peak; the trough is 12 h away
    assert rates[13] == pytest.approx(10 + 20 * (1 + math.cos(math.pi * -0.5 / 12)) / 2)
    assert rates.max() < 30 and rates.min() > 10
    assert rates.mean() == pytest.approx(20.0, rel=1e-9)
    hourly = build(raw([deployment(fidelity="fluid", workload={
        "load": {"hourly": [1, 2, 4, 8], "repeat": "none", "between": "step"}, **LENGTHS})],
        duration="4h")).serve[0].workload.load
    assert load_rates(hourly, 0.0, 4 * 3600.0, 1800.0, load_seed(0, 0)).tolist() == [
        1, 1, 2, 2, 4, 4, 8, 8]


def test_time_rescaled_arrivals_follow_the_curve():
    rates = np.array([0.0, 10.0, 0.0, 30.0])
    unit = np.cumsum(np.random.default_rng(1).exponential(1.0, 100_000))
    times = rescale_arrivals(unit, rates, 100.0)
    counts = np.histogram(times, bins=[0, 100, 200, 300, 400])[0]
    assert counts[0] == 0 and counts[2] == 0
    assert counts[1] == pytest.approx(1000, rel=0.1)
    assert counts[3] == pytest.approx(3000, rel=0.06)


# ----------------------------------------------------------------------------- two levels


@pytest.mark.slow
def test_constant_load_fluid_matches_requests_and_littles_law():
    """No autoscaling, a constant rate at about half the replicas' capacity: the fluid
    level's throughput is the request level's, and the requests it holds in the system
    (rate x mean time in it, Little's law) are the request level's time average."""
    s = build(raw([deployment(replicas=2, fidelity="requests",
                              workload={"rate": "10/s", **LENGTHS})], duration="10min"))
    curve = replica_curve(s, s.serve[0])
    assert 0.3 < 10 / (2 * curve.capacity_per_s) < 0.7
    requests = simulate_serving(s, np.random.SeedSequence(3, spawn_key=(16,))).fleets["chat"]
    done = requests.status == 1
    horizon = s.duration_s
    throughput = float(done.sum()) / horizon
    in_system = float(np.sum(np.minimum(requests.finish_s[done], horizon)
                             - requests.arrival_s[done])) / horizon
    fluid_s = s.model_copy(update={"serve": [s.serve[0].model_copy(update={
        "fidelity": "fluid"})]})
    result = simulate_fleet_day(fluid_s, 3, {})
    series = result.series["chat"]
    fluid_throughput = float(series["served"].sum()) / horizon
    assert fluid_throughput == pytest.approx(10.0, rel=1e-9)
    assert fluid_throughput == pytest.approx(throughput, rel=0.03)
    assert float(series["in_system"].mean()) == pytest.approx(in_system, rel=0.08)
    # Little's law inside the fluid level: in the system = rate x mean time in it
    e2e = curve.at(np.array([10 / (2 * curve.capacity_per_s)]))[2][0]
    assert float(series["in_system"][0]) == pytest.approx(10 * e2e, rel=1e-9)


def test_auto_fidelity_reports_the_difference_between_levels():
    s = build(raw([deployment(replicas=2, fidelity="auto")], duration="10min"))
    summary = simulate(s).summary
    check = summary["deployments"]["chat"]["fluid_check"]
    diff = check["relative_difference"]
    # The fluid level serves the offered mean; the request level a Poisson draw of it, and
    # only the requests finished inside the window: 4 standard deviations of the count.
    offered = 10 * 600
    assert abs(diff["requests_per_s"]) < 4 / offered**0.5
    assert abs(diff["ttft_p50_s"]) < 0.15 and abs(diff["tpot_p50_s"]) < 0.15


# ----------------------------------------------------------------------------- autoscaling


def step_scenario(warmup: str):
    return build(raw([deployment(fidelity="fluid", replicas=2, workload={
        "load": {"hourly": [8, 8, 60, 60], "repeat": "none", "between": "step"}, **LENGTHS},
        autoscale={"min": 2, "max": 40, "target": 0.7, "interval": "60s",
                   "warmup": warmup, "scale_down_after": "1h"})], duration="4h",
        instances=4))


@pytest.mark.parametrize("warmup_s", [0.0, 600.0])
def test_load_step_scales_up_after_the_delay_and_counts_misses(warmup_s: float):
    s = step_scenario(f"{warmup_s:g}s")
    result = simulate_fleet_day(s, 0, {})
    dep = result.deployments[0]
    series = result.series["chat"]
    times = result.times_s
    step_at = 2 * 3600.0
    # The load steps at 2 h; the autoscaler sees it at its next decision (one step later),
    # and the new replicas serve after their weights load and the warm-up.
    load_s = dep.curve.weight_bytes / (100e9 / 8 * dep.chips / 16)
    assert dep.start_s == pytest.approx(load_s + warmup_s)
    ready = step_at + 60.0 + load_s + warmup_s
    before = series["replicas"][(times >= step_at) & (times < ready - 1e-6)]
    after = series["replicas"][times >= math.ceil(ready / 60) * 60]
    assert before.max() == before.min() == series["replicas"][times < step_at][-1]
    assert after.min() > before.max()
    # the new rate at the target utilisation, plus what clears the backlog built meanwhile
    assert after[0] >= math.ceil(60 / dep.per_replica_rate)
    assert series["replicas"][-1] == math.ceil(60 / dep.per_replica_rate)
    # SLO misses during the delay are counted, and only then (and while the backlog drains)
    missed = (1 - series["slo_attainment"]) * series["arrived"]
    assert missed[(times >= step_at) & (times < ready)].sum() > 0
    assert missed[times < step_at].sum() == pytest.approx(0, abs=1e-6)
    figures = fleet_day_figures(s, result)["deployments"]["chat"]
    assert figures["slo_missed_requests"] == pytest.approx(missed.sum())


def test_longer_warmup_misses_more():
    misses = [fleet_day_figures(s, simulate_fleet_day(s, 0, {}))["deployments"]["chat"][
        "slo_missed_requests"] for s in (step_scenario("0s"), step_scenario("600s"))]
    assert misses[1] > misses[0] > 0


# ----------------------------------------------------------------------------- training


JOB = {"name": "train", "model": "llama3.1-70b", "global_batch": 32, "seq_len": 4096,
       "parallelism": {"tp": 64, "dp": 2}, "recompute": "full", "priority": 1,
       "checkpoint": {"interval": "30min", "write": "30s", "restore": "60s"}}


@pytest.mark.slow
def test_serving_preempts_training_and_it_restarts_from_its_checkpoint():
    s = build(raw([deployment(fidelity="fluid", replicas=4, workload={
        "load": {"hourly": [8, 8, 300, 300, 8, 8], "repeat": "none", "between": "step"},
        **LENGTHS}, autoscale={"min": 4, "max": 64, "interval": "60s", "warmup": "0s",
                               "scale_down_after": "5min", "drain": "0s"})],
        duration="6h", instances=4, jobs=[JOB]))
    summary = simulate(s).summary
    job = summary["jobs"]["train"]
    assert job["preemptions"] >= 1
    assert job["lost_work_s"] > 0  # the work since its last checkpoint
    assert job["lost_work_s"] <= 30 * 60 * job["preemptions"] + 1
    assert job["time_by_state_s"]["restarting"] >= 600 + 60 - 1  # restart + restore
    assert job["tokens_trained"] > 0
    assert summary["deployments"]["chat"]["jobs_preempted"] == job["preemptions"]


# ----------------------------------------------------------------------------- chip-hours


@pytest.mark.slow
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(instances=st.integers(2, 12), minimum=st.integers(0, 8), hours=st.integers(1, 30),
       peak=st.floats(1.0, 400.0), scale=st.sampled_from([0.0, 1.0, 500.0]),
       jobs=st.integers(0, 2), interval=st.sampled_from(["60s", "7min"]))
def test_chip_hours_add_up_to_the_cluster(instances, minimum, hours, peak, scale, jobs,
                                          interval):
    minimum = min(minimum, (instances - 1) * 16)  # leaves each job its instance
    serve = [deployment(fidelity="fluid", workload={
        "load": {"sinusoid": {"peak": f"{peak}/s", "trough": "0/s"}, "noise": 0.3}, **LENGTHS},
        autoscale={"min": minimum, "max": 200, "interval": interval, "warmup": "3min",
                   "drain": "2min", "scale_down_after": "10min"})]
    job_list = [dict(JOB, name=f"j{i}", priority=i,
                     parallelism={"tp": 64, "dp": 1}) for i in range(jobs)]
    r = raw(serve, duration=f"{hours}h + 17min".replace(" + ", ""), instances=instances,
            jobs=job_list, failures={"preset": "llama3", "scale": scale, "repair": "2h"},
            fluid={"curve_requests": 1000, "interval": interval})
    r["duration"] = hours * 3600 + 1020
    s = build(r)
    result = simulate_fleet_day(s, 1, {j.name: _profile(s, j) for j in s.jobs})
    figures = fleet_day_figures(s, result)
    day = figures["fleet_day"]
    # a job that is not elastic is never resized (a failure while it waits for hardware
    # does not start it on part of its instances)
    assert all(j["shrinks"] == j["grows"] == 0 for j in figures["jobs"].values())
    hours_by_state = day["chip_hours"]
    assert all(v >= -1e-9 for v in hours_by_state.values())
    assert sum(hours_by_state.values()) == pytest.approx(day["cluster_chip_hours"], rel=1e-12)
    assert day["cluster_chip_hours"] == pytest.approx(instances * 16 * s.duration_s / 3600)


_PROFILES: dict = {}


def _profile(s, job):
    if job.name not in _PROFILES:
        from clustersim.runner.api import step_profiles
        _PROFILES.update(step_profiles(s))
    return _PROFILES[job.name]


# ----------------------------------------------------------------------------- bad input


def refused(tmp_path: Path, r: dict, *words: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(r))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out)])
    text = result.stdout + (result.stderr or "")
    assert result.exit_code == 2, text
    for word in words:
        assert word in text, (word, text)
    assert "Traceback" not in text
    assert not out.exists()


def test_negative_rate_is_refused(tmp_path):
    refused(tmp_path, raw([deployment(fidelity="fluid", workload={
        "load": {"hourly": [5] * 10 + [-3] + [5] * 13}, **LENGTHS})]),
        "serve.0.workload.load.hourly", "point 10", "negative")


def test_curve_short_of_the_horizon_is_refused(tmp_path):
    refused(tmp_path, raw([deployment(fidelity="fluid", workload={
        "load": {"hourly": [5, 6, 7], "repeat": "none"}, **LENGTHS})], duration="1d"),
        "serve.0.workload.load.hourly", "3h", "1d")


def test_min_above_max_is_refused(tmp_path):
    refused(tmp_path, raw([deployment(fidelity="fluid", autoscale={"min": 9, "max": 3})]),
            "serve.0.autoscale", "min replicas 9 is above max 3")


def test_a_minimum_that_does_not_fit_is_refused(tmp_path):
    refused(tmp_path, raw([deployment(fidelity="fluid", autoscale={"min": 70, "max": 80})],
                          instances=4), "serve.0.autoscale.min", "need 5 instances",
            "has 4")


def test_autoscale_with_request_fidelity_is_refused(tmp_path):
    refused(tmp_path, raw([deployment(fidelity="requests", autoscale={"min": 1, "max": 3})]),
            "serve.0.fidelity", "fixed replica count")


def _peak_scenario(job: dict):
    return build(raw([deployment(fidelity="fluid", replicas=4, workload={
        "load": {"hourly": [8, 8, 300, 300, 8, 8], "repeat": "none", "between": "step"},
        **LENGTHS}, autoscale={"min": 4, "max": 40, "interval": "60s", "warmup": "0s",
                               "scale_down_after": "5min", "drain": "0s"})],
        duration="6h", instances=4, jobs=[job]))  # at most 40 one-chip replicas: 3 instances


@pytest.mark.slow
def test_an_elastic_job_shrinks_for_serving_and_grows_back():
    """The peak leaves the job one of its two instances: elastic, it runs on one data-
    parallel group through the peak (half the tokens per second) and grows back after;
    not elastic, it stops."""
    from clustersim.runner.api import step_profiles

    elastic = _peak_scenario(dict(JOB, elastic={"min_dp": 1}))
    stiff = _peak_scenario(JOB)
    profiles = step_profiles(stiff)
    out = {}
    for name, s in (("elastic", elastic), ("stiff", stiff)):
        result = simulate_fleet_day(s, 0, profiles)
        out[name] = (fleet_day_figures(s, result)["jobs"]["train"], result)
    job, result = out["elastic"]
    assert job["shrinks"] >= 1 and job["grows"] >= 1 and job["preemptions"] == 0
    chips = result.fleet["job:train"]
    assert set(np.unique(chips)) <= {0, 16, 32} and 16 in chips  # one DP group, then two
    assert job["tokens_trained"] > out["stiff"][0]["tokens_trained"]
    assert out["stiff"][0]["preemptions"] >= 1


def test_elastic_minimum_above_dp_is_refused(tmp_path):
    refused(tmp_path, raw([deployment(fidelity="fluid", autoscale={"min": 1, "max": 3})],
                          jobs=[dict(JOB, elastic={"min_dp": 3})]),
            "jobs.0.elastic.min_dp", "above the job's dp 2")


def test_replications_of_a_fleet_day_run_are_refused(tmp_path):
    path = tmp_path / "day.yaml"
    path.write_text(yaml.safe_dump(raw([deployment(fidelity="fluid")])))
    result = CliRunner().invoke(app, ["run", str(path), "--replications", "2", "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 2 and "runs once" in result.stdout + (result.stderr or "")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_outputs_of_a_fleet_day_run_and_its_report(tmp_path):
    """day.parquet (per deployment per step) and fleet.parquet (chips by state, adding up to
    the cluster's at every step), and the report drawing the day."""
    import pyarrow.parquet as pq

    from clustersim.analysis.report import write_report
    from clustersim.runner.api import run_to

    s = build(raw([deployment(fidelity="fluid", workload={
        "load": {"sinusoid": {"peak": "60/s", "trough": "5/s"}}, **LENGTHS},
        autoscale={"min": 1, "max": 30})], duration="3h", instances=2))
    run_to(s, tmp_path / "run")
    day = pq.read_table(tmp_path / "run" / "day.parquet")
    fleet = pq.read_table(tmp_path / "run" / "fleet.parquet").to_pandas()
    assert day.num_rows == 180 and fleet.shape[0] == 180
    meta = day.schema.metadata
    assert meta[b"clustersim.seed"] == b"0"
    states = fleet[[f"{k}_chips" for k in ("serving", "scaling", "training", "down", "idle")]]
    assert (states.sum(axis=1) == 32).all()
    columns = set(day.column_names)
    assert {"replicas", "load_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
            "slo_attainment", "output_tokens"} <= columns
    report = write_report(tmp_path / "run")
    assert (report.parent / "day.png").stat().st_size > 10_000
    assert "Chip-hours" in report.read_text()


def test_auto_beside_a_trace_deployment_compares_only_the_auto_one(tmp_path):
    """The fluid level beside the request level simulates the `auto` deployments alone: a
    deployment replaying a trace (no rate to follow) is neither measured nor compared."""
    import json

    arrivals = np.sort(np.random.default_rng(0).uniform(0, 60, 50))
    (tmp_path / "trace.csv").write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{t},256,64\n" for t in arrivals))
    lengths = {"input_tokens": 256, "output_tokens": 64}
    r = raw([deployment(replicas=2, fidelity="auto", workload={"rate": "5/s", **lengths}),
             deployment(name="replay", replicas=1, workload={"arrival": "trace",
                                                             "trace": "trace.csv"})],
            duration="1min", instances=2, fluid={"curve_requests": 200})
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(r))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.stdout + (result.stderr or "")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert "fluid_check" in summary["deployments"]["chat"]
    assert "fluid_check" not in summary["deployments"]["replay"]


def test_a_replica_that_serves_nothing_is_refused(tmp_path):
    """A Llama 3.1 70B draft beside an 8B target on one Trn2 chip leaves no HBM for the KV
    cache: the replica curve would have nothing to measure, and the run says so (exit 2)."""
    refused(tmp_path, raw([deployment(fidelity="fluid", model="llama3.1-70b",
                                      parallelism={"tp": 4})]), "serve.0", "do not fit")


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_software_faults_on_idle_chips_interrupt_nothing():
    """A software fault rate per chip, over a cluster mostly idle: the job holding a quarter
    of the chips is interrupted at a quarter of the cluster's rate (as in the timeline), not
    by every fault of the cluster."""
    r = raw([deployment(fidelity="fluid", replicas=1)], duration="10h", instances=8,
            jobs=[JOB], failures={"rates": [{"component": "software", "per": "chip",
                                             "mtbf": "8h"}],
                                  "detect": "1s", "restart": "1s"})
    s = build(r)
    result = simulate_fleet_day(s, 0, {j.name: _profile(s, j) for j in s.jobs})
    job = fleet_day_figures(s, result)["jobs"]["train"]
    expected = 32 * 10 / 8  # the job's 32 chips over 10 h at one fault per 8 h each
    assert expected / 2 < job["interruptions"] < 1.5 * expected  # all 128 chips': 160
    assert result.failures["software"] == pytest.approx(expected, rel=0.5)


def test_ettr_of_a_job_that_ends_early_is_over_its_own_time():
    """A job that runs 1 h of a 3 h horizon, no failures: its ETTR is its useful time over
    that hour (the checkpoint writes' share off), as the timeline's, not over the horizon;
    goodput counts from its submission (here its start)."""
    job = dict(JOB, run_for="1h", submit="30min")
    s = build(raw([deployment(fidelity="fluid", replicas=1)], duration="3h", instances=4,
                  jobs=[job]))
    result = simulate_fleet_day(s, 0, {j.name: _profile(s, j) for j in s.jobs})
    figures = fleet_day_figures(s, result)["jobs"]["train"]
    assert figures["status"] == "done" and figures["start_s"] == 1800
    writes = 30 / (30 * 60 + 30)  # 30 s written every 30 min, blocking
    assert figures["ettr"] == pytest.approx(1 - writes, rel=1e-6)
    assert figures["goodput"] == pytest.approx(figures["useful_s"] / 3600, rel=1e-9)


def test_a_load_curve_beside_a_trace_is_refused(tmp_path):
    """arrival: trace replays the trace's times: a load curve beside it was silently
    ignored."""
    (tmp_path / "trace.csv").write_text("arrival_s,input_tokens,output_tokens\n1.0,256,64\n")
    refused(tmp_path, raw([deployment(workload={
        "arrival": "trace", "trace": "trace.csv",
        "load": {"sinusoid": {"peak": "30/s", "trough": "10/s"}}})]),
        "serve.0.workload", "load curve would be ignored")


def test_a_request_count_at_the_fluid_level_is_refused(tmp_path):
    """The fluid level runs to the horizon: `workload.requests` was silently ignored."""
    refused(tmp_path, raw([deployment(fidelity="fluid", workload={
        "rate": "10/s", "requests": 500, **LENGTHS})]),
        "serve.0.workload.requests", "would be ignored")


def test_job_status_at_the_horizon_in_the_timeline_s_words():
    """A job still training reads `running at horizon`, one still waiting for instances
    `queued at horizon`, as the timeline says (a job waiting for hardware read as running)."""
    jobs = [dict(JOB, name="first"), dict(JOB, name="second", submit="1min")]
    s = build(raw([deployment(fidelity="fluid", replicas=1)], duration="1h", instances=4,
                  jobs=jobs))
    result = simulate_fleet_day(s, 0, {j.name: _profile(s, j) for j in s.jobs})
    figures = fleet_day_figures(s, result)["jobs"]
    assert figures["first"]["status"] == "running at horizon"
    assert figures["second"]["status"] == "queued at horizon"
