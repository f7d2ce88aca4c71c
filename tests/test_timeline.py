"""The cluster timeline against theory: Poisson failure counts, job MTTF, renewal-theory ETTR,
Daly's optimum; and its bookkeeping: every lost hour attributed, determinism, blast radius."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clustersim.cluster.timeline import Timeline, daly_interval, job_failure_rate, young_interval
from clustersim.runner.api import simulate, step_profiles
from clustersim.scenario.loader import scenario_from_dict
from clustersim.training.profile import JobDoesNotFit

JOB = {"name": "train", "model": "llama2-7b", "seq_len": 2048, "global_batch": 64,
       "parallelism": {"tp": 8, "pp": 1, "dp": 8}, "recompute": "selective"}


def make(jobs=None, instances=2, spares=0, duration="30d", failures=None, hardware="trn2",
         stragglers=None, seed=0, ultraservers=None):
    cluster = {"spares": spares}
    if ultraservers is not None:
        cluster["ultraservers"] = ultraservers
    else:
        cluster["instances"] = instances
    raw = {"name": "t", "hardware": hardware, "seed": seed, "duration": duration,
           "cluster": cluster, "jobs": jobs if jobs is not None else [],
           "failures": failures or {"preset": "none"}}
    if stragglers is not None:
        raw["stragglers"] = stragglers
    return scenario_from_dict(raw)


def timeline(scenario, seed=0):
    return Timeline(scenario, step_profiles(scenario), np.random.SeedSequence(seed)).run()


def job_with(**changes):
    job = dict(JOB)
    job.update(changes)
    return job


# ---------------------------------------------------------------------------------------------
# Theory


def test_failure_counts_are_poisson():
    """Per-instance exponential failures over a fixed window: the count over seeds has the
    mean and the variance of a Poisson variable with rate x instances x window."""
    rate_per_day, instances, days = 0.05, 64, 20
    s = make(instances=instances, duration=f"{days}d", failures={
        "rates": [{"component": "host", "per": "instance", "rate": f"{rate_per_day}/d"}],
        "repair": "1s"})
    counts = np.array([sum(timeline(s, seed).failures.values()) for seed in range(300)])
    expected = rate_per_day * instances * days  # 64
    standard_error = math.sqrt(expected / len(counts))
    assert abs(counts.mean() - expected) < 4 * standard_error
    # the variance of a Poisson count equals its mean (within sampling error of a variance)
    assert counts.var(ddof=1) == pytest.approx(expected, rel=0.25)


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_job_mttf_is_one_over_n_times_rate():
    rate_per_day = 0.02  # per chip
    s = make(jobs=[job_with()], instances=1, spares=4, duration="200d", failures={
        "rates": [{"component": "chip", "per": "chip", "rate": f"{rate_per_day}/d"}],
        "repair": "1s", "detect": 0, "restart": 0})
    chips = 16
    assert 1 / job_failure_rate(s, s.jobs[0]) == pytest.approx(86400 / (chips * rate_per_day))
    counts = [timeline(s, seed).jobs["train"].interruptions["chip"] for seed in range(40)]
    expected = chips * rate_per_day * 200
    assert np.mean(counts) == pytest.approx(expected, rel=4 / math.sqrt(expected * 40))
    figures = simulate(s).summary["jobs"]["train"]
    assert figures["job_mtbf_s"] == pytest.approx(86400 / (chips * rate_per_day))


def test_per_ultraserver_rates_do_not_hit_hardware_without_ultraservers():
    """trn2 has no UltraServers: a per-UltraServer rate has nothing to hit, in the job's
    failure rate (MTBF, Daly) as in the timeline."""
    s = make(jobs=[job_with()], instances=1, duration="30d", failures={
        "rates": [{"component": "switch", "per": "ultraserver", "rate": "1/d"},
                  {"component": "chip", "per": "chip", "rate": "0.01/d"}]})
    assert job_failure_rate(s, s.jobs[0]) == pytest.approx(16 * 0.01 / 86400)
    assert timeline(s, 0).jobs["train"].interruptions["switch"] == 0


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_ettr_with_asynchronous_checkpoints_matches_renewal_theory():
    """Derivation. Failures come at rate lambda (exponential), each followed by a fixed
    recovery R (detect + restart + restore; no hardware is lost, so nothing is waited for).
    After a recovery the job trains; it snapshots every tau of training and a snapshot counts
    once written, w later (asynchronous: training does not pause). A cycle is a stretch of
    training X ~ Exp(lambda) plus R. The work kept is the last written snapshot: k tau with
    k = max{k : k tau + w <= X}, so E[kept] = tau sum_{k>=1} P(X >= w + k tau)
    = tau e^{-lambda w} e^{-lambda tau} / (1 - e^{-lambda tau}). By the renewal-reward
    theorem ETTR = E[kept] / E[X + R] = E[kept] / (1/lambda + R)."""
    lam = 1 / 3600
    tau, w = 600.0, 120.0
    detect, restart, restore = 60.0, 180.0, 60.0
    recovery = detect + restart + restore
    s = make(jobs=[job_with(checkpoint={"interval": tau, "write": w, "restore": restore,
                                        "async": True})],
             instances=1, duration="400d",
             failures={"rates": [{"component": "software", "per": "job", "mtbf": 3600}],
                       "detect": detect, "restart": restart})
    kept = tau * math.exp(-lam * w) * math.exp(-lam * tau) / (1 - math.exp(-lam * tau))
    expected = kept / (1 / lam + recovery)
    measured = np.mean([timeline(s, seed).jobs["train"].figures(s.duration_s)["ettr"]
                        for seed in range(3)])
    assert measured == pytest.approx(expected, rel=0.02)


@pytest.mark.slow  # over 5 s of CPU
def test_the_best_checkpoint_interval_is_near_daly():
    """Exponential failures, blocking checkpoints of fixed cost: sweeping the interval, the
    goodput-best one is Daly's (within the sweep's factor-of-two grid), and Daly's interval is
    within 1% of the best ETTR found."""
    mtbf, write = 36000.0, 300.0
    daly = daly_interval(write, mtbf)
    results = {}
    for factor in (0.25, 0.5, 1.0, 2.0, 4.0):
        s = make(jobs=[job_with(checkpoint={"interval": daly * factor, "write": write,
                                            "restore": 0})],
                 instances=1, duration="1500d",
                 failures={"rates": [{"component": "software", "per": "job", "mtbf": mtbf}],
                           "detect": 0, "restart": 0})
        results[factor] = np.mean([timeline(s, seed).jobs["train"].figures(s.duration_s)["ettr"]
                                   for seed in range(2)])
    best = max(results, key=results.get)
    assert best in (0.5, 1.0, 2.0)
    assert results[1.0] >= results[best] - 0.01
    assert results[0.25] < results[1.0] and results[4.0] < results[1.0]


def test_young_and_daly_formulas():
    assert young_interval(60, 86400) == pytest.approx(math.sqrt(2 * 60 * 86400))
    delta, m = 60.0, 86400.0
    expected = math.sqrt(2 * delta * m) * (1 + math.sqrt(delta / (2 * m)) / 3
                                           + delta / (2 * m) / 9) - delta
    assert daly_interval(delta, m) == pytest.approx(expected)
    assert daly_interval(100, 40) == 40  # delta >= 2M: tau = M


# ---------------------------------------------------------------------------------------------
# Bookkeeping


LLAMA3 = {"preset": "llama3", "scale": 200, "detect": "2min", "repair": "4h", "restart": "10min"}


def test_every_lost_hour_is_attributed():
    s = make(jobs=[job_with(checkpoint={"interval": "auto", "write": "60s", "restore": "5min"},
                            submit="1h")],
             instances=8, spares=2, duration="20d", failures=LLAMA3)
    result = simulate(s, seed=3)
    job = result.summary["jobs"]["train"]
    assert job["interruptions"] > 10
    lost = sum(job["lost_time_s"].values())
    assert job["useful_s"] + lost - job["lost_time_s"]["queued"] == pytest.approx(job["wall_s"])
    assert sum(job["time_by_state_s"].values()) == pytest.approx(s.duration_s - 3600)
    assert job["ettr"] == pytest.approx(job["useful_s"] / job["wall_s"])
    assert sum(job["interruptions_by_cause"].values()) == job["interruptions"]
    assert job["checkpoint_interval_s"] == pytest.approx(job["daly_interval_s"])


def test_identical_seeds_give_identical_results():
    s = make(jobs=[job_with(checkpoint={"interval": "1h", "write": "60s"})], instances=8,
             spares=2, duration="10d", failures=LLAMA3,
             stragglers={"jitter": 0.05, "transient": {"rate": "1/d", "duration": "1h",
                                                       "slowdown": 1.5}})
    first = simulate(s, seed=7).summary
    second = simulate(s, seed=7).summary
    third = simulate(s, seed=8).summary
    for summary in (first, second, third):
        summary.pop("wall_s")
    assert first == second
    assert first["jobs"] != third["jobs"]


def test_a_job_reaches_its_step_target():
    s = make(jobs=[job_with(steps=1000, checkpoint={"interval": "1h", "write": "60s"})],
             instances=1, duration="30d")
    result = simulate(s)
    job = result.summary["jobs"]["train"]
    step = result.steps["train"].step_time_s
    assert job["status"] == "done"
    assert job["steps_completed"] == 1000
    checkpoints = math.floor(1000 * step / 3600)
    assert job["end_s"] == pytest.approx(1000 * step + checkpoints * 60, rel=1e-6)
    assert job["tokens_trained"] == 1000 * 64 * 2048


def test_no_spares_and_no_repairs_ends_waiting_with_a_reason():
    s = make(jobs=[job_with()], instances=1, duration="30d", failures={
        "rates": [{"component": "chip", "per": "chip", "mtbf": "100d"}], "repair": "never"})
    job = simulate(s).summary["jobs"]["train"]
    assert job["status"] == "waiting_for_hardware at horizon"
    assert "repairs are disabled" in job["reason"]
    assert job["lost_time_s"]["waiting_for_hardware"] > 0


def test_failures_faster_than_recovery_are_reported():
    s = make(jobs=[job_with(checkpoint={"interval": "auto", "write": "60s", "restore": "5min"})],
             instances=1, spares=16, duration="5d", failures={
                 "rates": [{"component": "software", "per": "job", "mtbf": "5min"}],
                 "restart": "10min"})
    job = simulate(s).summary["jobs"]["train"]
    assert job["ettr"] < 0.2
    assert "shorter than its recovery" in job["reason"]


def test_a_job_that_does_not_fit_is_refused():
    s = make(jobs=[job_with(model="gpt3-175b", parallelism={"tp": 1, "pp": 1, "dp": 64},
                            recompute="none")], instances=1)
    with pytest.raises(JobDoesNotFit, match="does not fit"):
        simulate(s)


def test_ultraserver_jobs_lose_and_replace_whole_ultraservers():
    """TP 128 spans two trn2u instances over the Z rings: a fault on one instance takes its
    whole UltraServer out of the job, and only a whole healthy UltraServer replaces it."""
    model = {"layers": 8, "hidden": 8192, "heads": 128, "vocab": 32000, "seq_len": 2048}
    job = job_with(model=model, parallelism={"tp": 128, "pp": 1, "dp": 2}, global_batch=16)
    s = make(jobs=[job], hardware="trn2u", ultraservers=1, spares=4, duration="60d",
             failures={"rates": [{"component": "chip", "per": "chip", "mtbf": "300d"}],
                       "repair": "1h"})
    result = timeline(s)
    outcome = result.jobs["train"]
    assert outcome.interruptions["chip"] > 0
    assert outcome.ultraservers_lost >= 1
    assert outcome.replacements % 4 == 0


def test_a_leaf_switch_failure_downs_every_instance_below_it():
    s = make(jobs=[job_with(parallelism={"tp": 8, "pp": 1, "dp": 16})], instances=4, spares=4,
             duration="30d", failures={
                 "rates": [{"component": "switch", "per": "leaf", "mtbf": "5d"}],
                 "repair": "1h"})
    result = timeline(s)
    repairs = result.repairs_completed
    switch_failures = result.failures["switch"]
    assert switch_failures > 0
    assert repairs >= 8 * (switch_failures - 1)  # 8 instances under the one leaf each time


def test_weibull_failures_keep_their_mean_rate():
    s = make(instances=200, duration="400d", failures={
        "rates": [{"component": "host", "per": "instance", "rate": "0.01/d",
                   "distribution": "weibull", "shape": 0.8}], "repair": "1s"})
    counts = [sum(timeline(s, seed).failures.values()) for seed in range(3)]
    assert np.mean(counts) == pytest.approx(0.01 * 200 * 400, rel=0.1)


def test_stragglers_slow_the_job():
    base = make(jobs=[job_with()], instances=2, duration="2d")
    slow = make(jobs=[job_with()], instances=2, duration="2d",
                stragglers={"fraction": 1.0, "slowdown": 2.0})
    transient = make(jobs=[job_with()], instances=2, duration="2d",
                     stragglers={"transient": {"rate": "4/d", "duration": "3h",
                                               "slowdown": 3.0}})
    steps = {name: timeline(s).jobs["train"].steps_completed
             for name, s in (("base", base), ("slow", slow), ("transient", transient))}
    assert steps["slow"] == pytest.approx(steps["base"] / 2, rel=0.01)
    assert steps["transient"] < steps["base"]


def test_jitter_keeps_the_mean_step_time():
    plain = make(jobs=[job_with()], instances=1, duration="20d")
    jittery = make(jobs=[job_with()], instances=1, duration="20d", stragglers={"jitter": 0.2})
    a = timeline(plain).jobs["train"].steps_completed
    b = np.mean([timeline(jittery, seed).jobs["train"].steps_completed for seed in range(3)])
    assert b == pytest.approx(a, rel=0.01)


def test_replications_report_means_and_intervals():
    s = make(jobs=[job_with(checkpoint={"interval": "1h", "write": "60s"})], instances=8,
             spares=2, duration="10d", failures=LLAMA3)
    result = simulate(s, replications=4, workers=2)
    job = result.summary["jobs"]["train"]
    assert result.summary["replications"] == 4
    assert "ettr_ci95" in job and job["ettr_ci95"] >= 0
    assert "interruptions_ci95" in job
    # the interval is the t-interval of the replications' values
    values = [r.jobs["train"].figures(s.duration_s)["ettr"] for r in result.timelines]
    assert job["ettr"] == pytest.approx(np.mean(values))
    assert job["ettr_ci95"] == pytest.approx(3.182 * np.std(values, ddof=1) / 2)
