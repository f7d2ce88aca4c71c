"""Session 17: what a user running serving on hardware no stack is fitted on is told, and
(beside, in tests/test_harden16.py) fair share's walk of the jobs its teams' rooms admit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_helpers import invoke, write


def _serving(tmp_path: Path, hardware: str, cluster: dict) -> Path:
    return write(tmp_path, {
        "name": f"h17-{hardware}", "seed": 1, "duration": "2min", "hardware": hardware,
        "cluster": cluster,
        "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
                   "workload": {"rate": "1/s",
                                "input_tokens": {"distribution": "fixed", "value": 512},
                                "output_tokens": {"distribution": "fixed", "value": 64}},
                   "slo": {"ttft": "2s", "tpot": "100ms"}}]})


@pytest.mark.parametrize(("hardware", "cluster", "stack"), [
    ("trn3-gen2", {"ultraservers": 1}, None),
    ("p4d", {"instances": 1}, None),
    ("trn2", {"instances": 1}, "nxd-inference"),
    ("p5en", {"instances": 1}, "tensorrt-llm"),
])
def test_serving_on_hardware_without_a_stack_says_its_constants_are_assumed(
        tmp_path: Path, hardware: str, cluster: dict, stack: str | None) -> None:
    """Trn3's serving constants are an early Trn1 fit's (no host time per iteration) and the
    A100's the H100's: the run said nothing of it, while a Trn2 or H200 run names the stack
    its constants were fitted on. The run table warns where summary.json's stack is null."""
    out = tmp_path / "out"
    result = invoke("run", _serving(tmp_path, hardware, cluster), "-o", out)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["deployments"]["chat"]["stack"] == stack
    text = " ".join(result.output.split())
    warned = "no serving stack is fitted on this hardware" in text
    assert warned == (stack is None), result.output
    if stack is not None:
        assert f"llama3.1-8b on {stack}" in text


# -- output folders (helper harden17b)

def _small_fleet(tmp_path: Path) -> Path:
    return write(tmp_path, {
        "name": "h17f", "seed": 1, "duration": "6h", "hardware": "trn2",
        "cluster": {"instances": 4},
        "jobs": [{"name": "a", "model": "llama3-8b", "seq_len": 4096, "global_batch": 64,
                  "parallelism": {"tp": 8, "dp": 8}, "run_for": "2h"}]})


@pytest.mark.parametrize("yours", ["my_notes.md", "analysis/nb.ipynb"])
def test_a_run_again_keeps_a_file_of_yours_in_the_earlier_runs_report(
        tmp_path: Path, yours: str) -> None:
    """An earlier run's folder was replaced, report/ and all, when a run of the same scenario
    wrote into it again without --force: notes and a notebook kept in report/ were deleted.
    A report/ holding anything `clustersim report` does not write makes the folder the
    user's; a report as written is still replaced."""
    scenario, out = _small_fleet(tmp_path), tmp_path / "out"
    assert invoke("run", scenario, "-o", out).exit_code == 0
    assert invoke("report", out).exit_code == 0
    assert invoke("run", scenario, "-o", out).exit_code == 0  # the report as written: replaced
    assert not (out / "report").exists()
    assert invoke("report", out).exit_code == 0
    mine = out / "report" / yours
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text("mine\n")
    result = invoke("run", scenario, "-o", out)
    assert result.exit_code == 2, result.output
    assert "holds more than an earlier run" in result.output
    assert mine.read_text() == "mine\n"
    assert invoke("run", scenario, "-o", out, "--force").exit_code == 0


# -- the fleet-day level (helper harden17b)

def _fleet_day(tmp_path: Path, step: str, **job: object) -> Path:
    return write(tmp_path, {
        "name": "h17d", "duration": "6h", "hardware": "trn2", "cluster": {"instances": 8},
        "fluid": {"interval": step, "curve_requests": 1000},
        "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
                   "workload": {"load": {"sinusoid": {"peak": "100/s", "trough": "20/s",
                                                      "peak_at": "14h"}},
                                "input_tokens": {"distribution": "fixed", "value": 512},
                                "output_tokens": {"distribution": "fixed", "value": 128}},
                   "slo": {"ttft": "1s", "tpot": "50ms"},
                   "autoscale": {"min": 2, "max": 8, "interval": step, "priority": 100}}],
        "jobs": [{"name": "train", "model": "llama3.1-70b", "seq_len": 4096,
                  "global_batch": 32, "recompute": "full", "parallelism": {"tp": 64, "dp": 4},
                  "priority": 1, "checkpoint": {"interval": "30min", "write": "30s",
                                                "restore": "1min"}, **job}]})


@pytest.mark.parametrize("step", ["1min", "1h"])
def test_a_fleet_day_job_stops_at_its_target_inside_a_step(tmp_path: Path, step: str) -> None:
    """At the fleet-day level a job trained whole steps: 50 steps at a 1 h step reported
    2.81e7 tokens against 50 x 131,072 = 6.55e6, and a 10-minute run_for trained an hour.
    It now stops inside the step: the target's tokens exactly, at any step."""
    out = tmp_path / "out"
    result = invoke("run", _fleet_day(tmp_path, step, steps=50), "-o", out)
    assert result.exit_code == 0, result.output
    job = json.loads((out / "summary.json").read_text())["jobs"]["train"]
    assert job["status"] == "done"
    assert job["tokens_trained"] == pytest.approx(50 * job["tokens_per_step"], rel=1e-9)


def test_a_fleet_day_run_for_ends_inside_a_step(tmp_path: Path) -> None:
    tokens = {}
    for step in ("1min", "1h"):
        out = tmp_path / step
        result = invoke("run", _fleet_day(tmp_path, step, run_for="10min"), "-o", out)
        assert result.exit_code == 0, result.output
        job = json.loads((out / "summary.json").read_text())["jobs"]["train"]
        states = job["time_by_state_s"]
        assert sum(states.values()) == pytest.approx(600.0, rel=1e-9)  # its 10 minutes
        tokens[step] = job["tokens_trained"]
    # ten minutes at the job's rate, less the blocking writes' share, at either step
    assert tokens["1h"] == pytest.approx(tokens["1min"], rel=1e-9)


# -- fair share's ties (helper harden17b)

def _three_teams(tmp_path: Path, third: str) -> Path:
    job = {"model": "llama3-8b", "seq_len": 4096, "parallelism": {"tp": 8, "pp": 1, "zero": 1},
           "recompute": "selective",
           "checkpoint": {"interval": "auto", "write": "30s", "restore": "2min"}}
    return write(tmp_path / third, yaml.safe_dump({  # (in this order: the draws follow it)
        "name": "q", "seed": 5, "duration": "3d", "hardware": "trn2",
        "cluster": {"instances": 16},
        "scheduler": {"policy": "fairshare", "preemption": True, "borrowing": False},
        "teams": [{"name": "a", "quota": 10, "share": 1}, {"name": "b", "quota": 10, "share": 3},
                  {"name": third, "quota": 4}],
        "workload": {"arrivals": {"rate": "60/d", "count": 120}, "templates": [
            {"name": "small", "weight": 3, "instances": {"min": 1, "max": 4},
             "teams": {"a": 1, "b": 1, third: 1}, "run_for": {"median": "2h", "sigma": 1.0},
             "job": job},
            {"name": "big", "weight": 1, "instances": [8], "teams": {"a": 1, "b": 1},
             "run_for": {"median": "6h", "sigma": 0.5}, "job": {**job, "priority": 2}}]},
        "failures": {"preset": "llama3"}}, sort_keys=False))


def test_a_teams_name_does_not_decide_its_fair_share(tmp_path: Path) -> None:
    """Teams as far below their share (two holding nothing) took turns by name: a third
    team named 'aaa' finished 17 jobs, named 'c' or 'zzz' 4 (1.1% of the chip-time), and
    team b 28 against 12. The tie goes to the team whose first waiting job came first."""
    figures = {}
    for third in ("aaa", "c", "zzz"):
        (tmp_path / third).mkdir()
        out = tmp_path / third / "out"
        result = invoke("run", _three_teams(tmp_path, third), "-o", out)
        assert result.exit_code == 0, result.output
        teams = json.loads((out / "summary.json").read_text())["teams"]
        figures[third] = [(teams[name]["jobs_by_status"], teams[name]["held_chip_s"])
                          for name in ("a", "b", third)]
    assert figures["aaa"] == figures["c"] == figures["zzz"]


# -- generated job sizes (helper harden17b)

def _sized(tmp_path: Path, instances: object) -> Path:
    return write(tmp_path, {
        "name": "sz", "duration": "1d", "hardware": "trn2", "cluster": {"instances": 16},
        "workload": {"arrivals": {"rate": "10/d", "count": 5}, "templates": [
            {"name": "t", "instances": instances, "run_for": {"median": "1h"},
             "job": {"model": "llama3-8b", "seq_len": 4096, "parallelism": {"tp": 8}}}]}})


def test_a_size_range_without_a_power_of_two_is_refused(tmp_path: Path) -> None:
    """`instances: {min: 5, max: 7}` drew only 5 and 7 (a power of two clipped to the
    bounds), never 6, silently; the draw is now documented and such a range refused."""
    from cli_helpers import refused
    result = invoke("validate", _sized(tmp_path, {"min": 5, "max": 7}))
    refused(result, "workload.templates.0.instances", "min 5 to max 7 holds no power of two",
            "[5, 6, 7]")
    for fine in ({"min": 3, "max": 5}, {"min": 6, "max": 6}, [5, 6, 7]):
        assert invoke("validate", _sized(tmp_path, fine)).exit_code == 0, fine


def test_a_size_range_draws_its_documented_shares() -> None:
    """{min: 1, max: 4}: 1, 2 and 4 a quarter, a half and a quarter of the time."""
    import numpy as np

    from clustersim.scenario.jobmix import JobTemplate, _size
    template = JobTemplate.model_validate({"name": "t", "instances": {"min": 1, "max": 4},
                                           "job": {}})
    rng = np.random.default_rng(0)
    draws = np.array([_size(template, rng) for _ in range(40_000)])
    shares = [float(np.mean(draws == size)) for size in (1, 2, 4)]
    assert shares == pytest.approx([0.25, 0.5, 0.25], abs=0.01)


# -- a sweep file given to run, a scenario given to sweep (helper harden17b)

def test_a_sweep_file_given_to_run_says_to_sweep_it(tmp_path: Path) -> None:
    """Six lines of 'required key missing / unknown key' and no hint, either way round."""
    from cli_helpers import refused
    scenario = _small_fleet(tmp_path)
    sweep = write(tmp_path, {"scenario": scenario.name, "seeds": [1, 2]}, "sweep.yaml")
    for command in ("run", "validate", "step"):
        refused(invoke(command, sweep), "a sweep file", "clustersim sweep FILE")
    refused(invoke("sweep", scenario, "-o", tmp_path / "out"), "a scenario, not a sweep file",
            "clustersim run FILE")
    assert invoke("sweep", sweep, "-o", tmp_path / "out").exit_code == 0


def test_a_report_of_replications_prints_mean_failures_and_counts_from_zero(
        tmp_path: Path) -> None:
    """report.md printed a mean of 0.33 switch failures as 'switch 0', and named the first
    replication 1, as the plots' titles do ('1 of 2'), where the command line counts from 0:
    it says both."""
    scenario = yaml.safe_load(_small_fleet(tmp_path).read_text())
    scenario["failures"] = {"preset": "llama3", "scale": 300}
    path = write(tmp_path, scenario)
    out = tmp_path / "out"
    assert invoke("run", path, "-o", out, "--replications", "3").exit_code == 0
    assert invoke("report", out).exit_code == 0
    text = (out / "report" / "report.md").read_text()
    assert "replication 1 of them (replication 0 as the command line counts" in text
    failures = json.loads((out / "summary.json").read_text())["cluster"]["failures"]
    means = {k: v for k, v in failures.items() if not k.endswith("_ci95")}
    assert any(not float(v).is_integer() for v in means.values()), means  # (a mean)
    for kind, value in means.items():
        shown = f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"
        assert f"{kind} {shown}" in text


def test_find_rate_on_an_event_driven_fleet_says_what_it_is(tmp_path: Path) -> None:
    """It said 'a fleet-day run' of a fleet whose jobs run in the event-driven timeline."""
    from cli_helpers import refused
    scenario = yaml.safe_load(_fleet_day(tmp_path, "5min").read_text())
    scenario.pop("jobs")
    scenario["workload"] = {"arrivals": {"rate": "100/d", "count": 3}, "templates": [
        {"name": "t", "instances": [1], "run_for": {"median": "1h"},
         "job": {"model": "llama3-8b", "seq_len": 4096, "parallelism": {"tp": 8}}}]}
    result = invoke("run", write(tmp_path, scenario), "--find-rate")
    refused(result, "--find-rate: an event-driven fleet holding fluid deployments")


FLEET_DAY_EXAMPLE = """\
name: fleet-day-example
duration: 6h
hardware: trn2
cluster: {instances: 8}
failures: {preset: llama3, scale: 200}
fluid: {interval: 1min, curve_requests: 500}
serve:
  - name: chat
    model: llama3.1-8b
    parallelism: {tp: 4}
    router: least_outstanding
    workload:
      load:
        sinusoid: {peak: 300/s, trough: 60/s, peak_at: 14h}
        noise: 0.05
      input_tokens: {distribution: lognormal, median: 512, sigma: 0.8, max: 4096}
      output_tokens: {distribution: lognormal, median: 200, sigma: 0.8, max: 1024}
    slo: {ttft: 1s, tpot: 50ms}
    autoscale: {min: 4, max: 100, policy: utilisation, target: 0.7, interval: 1min,
                warmup: 2min, drain: 1min, scale_down_after: 10min, priority: 100}
jobs:
  - name: train
    model: llama3.1-70b
    seq_len: 4096
    global_batch: 32
    recompute: full
    parallelism: {tp: 64, dp: 4}
    priority: 1
    elastic: {min_dp: 2}
    checkpoint: {interval: 30min, write: 30s, restore: 1min}
"""


def test_a_fleet_day_elastic_job_goes_on_smaller_after_a_hardware_failure(
        tmp_path: Path) -> None:
    """A hardware failure left an elastic job waiting for its lost instances (5,220 s of
    this day, ETTR 58%) while it held the rest idle, counted as training chip-hours; with
    whole groups left at or above its minimum it now restarts on them (ETTR 75%)."""
    out = tmp_path / "out"
    result = invoke("run", write(tmp_path, FLEET_DAY_EXAMPLE), "-o", out)
    assert result.exit_code == 0, result.output
    job = json.loads((out / "summary.json").read_text())["jobs"]["train"]
    assert job["interruptions"] >= 1  # (a failure hits it at this scale and seed)
    assert job["time_by_state_s"].get("waiting_for_hardware", 0.0) == 0.0
    assert job["shrinks"] >= 1
