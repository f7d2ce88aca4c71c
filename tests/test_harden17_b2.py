"""Session 17's hardening fixes (helper fix17b2): the run table of replications gives the
±95% interval of every figure that varies between them; the sweep's table keeps teams',
fleet-day and serving sections; the report's fleet plots keep censored waits apart; the
fluid level's capacity per replica does not depend on fluid.curve_requests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from cli_helpers import invoke, write

# A two-site fleet of 20 jobs whose replications differ (harden17b's st.yaml, smaller).
FLEET = {
    "name": "st", "seed": 4, "duration": "2d", "hardware": "trn2",
    "cluster": {"fabric": {"instances_per_leaf": 8},
                "sites": [{"name": "east", "instances": 8},
                          {"name": "west", "instances": 8, "spares": 0}],
                "inter_site": {"links": [{"sites": ["east", "west"], "bandwidth": "800Gbps",
                                          "latency": "5ms"}]}},
    "scheduler": {"policy": "backfill", "preemption": True},
    "workload": {"arrivals": {"rate": "20/d", "count": 20}, "templates": [{
        "name": "small", "instances": {"min": 2, "max": 12},
        "run_for": {"median": "4h", "sigma": 1.0},
        "job": {"model": "llama3-8b", "seq_len": 4096,
                "parallelism": {"tp": 8, "pp": 1, "zero": 1}, "recompute": "selective",
                "checkpoint": {"interval": "auto", "write": "30s", "restore": "2min"}}}]},
    "failures": {"preset": "llama3", "site_events": [
        {"kind": "power", "rate": "1/1d", "share": 0.5, "duration": "3h"},
        {"kind": "partition", "rate": "1/12h", "duration": "1h"}]},
}


def _flat(text: str) -> str:
    """The run table's text as one line: box borders and wrapping removed."""
    return re.sub(r"\s+", " ", re.sub(r"[│┌┐└┘├┤┬┴┼─]", " ", text))


def test_the_run_table_of_replications_gives_the_interval_of_figures_that_vary(tmp_path):
    """4 replications: 15.25 ± 0.80 jobs done, queue wait ± 640 s, fragmentation ± 0.075 in
    summary.json were printed "15 done; queue wait mean 3.9 h; fragmentation 47%" under a
    caption saying a figure without ± is the same in every replication."""
    out = tmp_path / "out"
    result = invoke("run", write(tmp_path, FLEET), "-o", out, "--replications", "4")
    assert result.exit_code == 0, result.output
    text = _flat(result.output)
    cluster = json.loads((out / "summary.json").read_text())["cluster"]
    statuses = cluster["jobs_by_status"]
    for status, count in statuses.items():
        if status.endswith("_ci95") or not statuses.get(f"{status}_ci95"):
            continue
        ci = statuses[f"{status}_ci95"]
        assert f"{count:,.2f}".rstrip("0").rstrip(".") + " ± " + \
            f"{ci:,.2f}".rstrip("0").rstrip(".") + f" {status}" in text, (status, text)
    wait, wait_ci = cluster["mean_queue_wait_s"], cluster["mean_queue_wait_s_ci95"]
    assert wait_ci > 0 and f"queue wait mean {wait / 3600:,.1f} ± {wait_ci / 3600:,.1f} h" in text
    frag, frag_ci = cluster["fragmentation"], cluster["fragmentation_ci95"]
    assert frag_ci > 0 and f"fragmentation {frag:.0%} ± {frag_ci:.0%}" in text
    assert "(each job's mean over replications)" in text


TEAMS = {
    "name": "f1", "seed": 1, "duration": "1d", "hardware": "trn2", "cluster": {"instances": 16},
    "scheduler": {"policy": "fairshare", "preemption": True, "borrowing": True},
    "teams": [{"name": "a", "quota": 8, "share": 1}, {"name": "b", "quota": 8, "share": 2}],
    "workload": {"arrivals": {"rate": "40/d", "count": 12}, "templates": [{
        "name": "small", "instances": {"min": 1, "max": 8}, "teams": {"a": 1, "b": 1},
        "run_for": {"median": "3h", "sigma": 1.0},
        "job": {"model": "llama3-8b", "seq_len": 4096,
                "parallelism": {"tp": 8, "pp": 1, "zero": 1}}}]},
    "trace": {"enabled": False},
}

# A fluid fleet day of one autoscaled deployment beside a training job (docs/fleet-day.md's
# example, an hour of it).
FLEET_DAY = {
    "name": "fd", "duration": "1h", "hardware": "trn2", "cluster": {"instances": 8},
    "fluid": {"interval": "1min", "curve_requests": 500},
    "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
               "router": "least_outstanding",
               "workload": {"load": {"sinusoid": {"peak": "300/s", "trough": "60/s",
                                                  "peak_at": "14h"}},
                            "input_tokens": {"distribution": "lognormal", "median": 512,
                                             "sigma": 0.8, "max": 4096},
                            "output_tokens": {"distribution": "lognormal", "median": 200,
                                              "sigma": 0.8, "max": 1024}},
               "slo": {"ttft": "1s", "tpot": "50ms"},
               "autoscale": {"min": 4, "max": 100, "policy": "utilisation", "target": 0.7,
                             "interval": "1min", "warmup": "2min", "drain": "1min",
                             "scale_down_after": "10min", "priority": 100}}],
    "jobs": [{"name": "train", "model": "llama3.1-70b", "seq_len": 4096, "global_batch": 32,
              "recompute": "full", "parallelism": {"tp": 64, "dp": 4}, "priority": 1,
              "elastic": {"min_dp": 2}}],
}


def _sweep_rows(tmp_path: Path, base: dict, grid: dict):
    import pandas as pd

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = write(tmp_path, {"scenario": "base.yaml", "grid": grid, "seeds": [0]}, "sweep.yaml")
    out = tmp_path / "out"
    result = invoke("sweep", sweep, "-o", out, "--workers", "1")
    assert result.exit_code == 0, result.output
    return pd.read_parquet(out / "sweep.parquet")


def _summary(tmp_path: Path, base: dict, path: str, value: object) -> dict:
    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import load_scenario

    scenario = load_scenario(tmp_path / "base.yaml", [f"{path}={value}"])
    return simulate(scenario, seed=0).summary


def test_a_sweep_keeps_the_teams_figures(tmp_path):
    """A grid over teams.0.quota wrote no team's figure: sweep.parquet held the jobs', the
    deployments' and the cluster's only."""
    rows = _sweep_rows(tmp_path, TEAMS, {"teams.0.quota": [4, 8]})
    for _, row in rows.iterrows():
        teams = _summary(tmp_path, TEAMS, "teams.0.quota", row["teams.0.quota"])["teams"]
        for team, figures in teams.items():
            for figure in ("mean_queue_wait_s", "chip_time_share", "quota_instances"):
                assert row[f"teams.{team}.{figure}"] == float(figures[figure]), (team, figure)
            assert row[f"teams.{team}.jobs_by_status.done"] == figures["jobs_by_status"]["done"]
    assert list(rows["teams.a.quota_instances"]) == [4.0, 8.0]


def test_a_sweep_keeps_the_fleet_day_figures(tmp_path):
    """A grid over a fluid fleet day's autoscaling target wrote neither its chip-hours by
    state nor its fleet cost per million output tokens."""
    rows = _sweep_rows(tmp_path, FLEET_DAY, {"serve.0.autoscale.target": [0.7]})
    day = _summary(tmp_path, FLEET_DAY, "serve.0.autoscale.target", 0.7)["fleet_day"]
    row = rows.iloc[0]
    assert row["fleet_day.fleet_cost_per_million_output_tokens_usd"] == \
        day["fleet_cost_per_million_output_tokens_usd"]
    for state, hours in day["chip_hours"].items():
        assert row[f"fleet_day.chip_hours.{state}"] == hours


# A crowded fleet: 24 jobs of 2 to 8 instances for a day on 8 instances, most never start.
CROWDED = {
    "name": "crowded", "seed": 2, "duration": "1d", "hardware": "trn2",
    "cluster": {"instances": 8, "spares": 0},
    "workload": {"arrivals": {"rate": "48/d", "count": 24}, "templates": [{
        "name": "big", "instances": {"min": 2, "max": 8}, "run_for": {"median": "12h", "sigma": 0.3},
        "job": {"model": "llama3-8b", "seq_len": 4096,
                "parallelism": {"tp": 8, "pp": 1, "zero": 1}}}]},
}


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_the_report_s_fleet_waits_are_over_started_jobs(tmp_path):
    """fleet.png and the HTML fleet figure took the median and 95th percentile of every
    job's queue_wait_s, the horizon less its submission for the jobs never started (15 h
    bars where summary.json's p50 over started jobs was 0); now they are summary.json's,
    over the jobs that started, and each bin's label counts the jobs never started."""
    from clustersim.analysis.html_figures import fleet_figure
    from clustersim.analysis.runs import load_run

    out = tmp_path / "out"
    result = invoke("run", write(tmp_path, CROWDED), "-o", out)
    assert result.exit_code == 0, result.output
    run = load_run(out)
    cluster = run.summary["cluster"]
    assert cluster["jobs_never_started"] > cluster["jobs"] / 2  # the case: medians would move
    figure = fleet_figure(run)
    team = [t for t in figure.data if t.xaxis == "x3"]  # queue wait by team (one team, "-")
    median, p95 = (t for t in team if t.name in ("median", "95th percentile"))
    assert median.y[0] * 3600 == pytest.approx(cluster["p50_queue_wait_s"], abs=1e-6)
    assert p95.y[0] * 3600 == pytest.approx(cluster["p95_queue_wait_s"], rel=1e-9)
    assert median.x[0] == f"-<br>({cluster['jobs_never_started']:,} never started)"
    sizes = [t for t in figure.data if t.xaxis == "x" and t.name == "median"][0]
    never = sum(int(re.search(r"\((\d+) never started\)", x).group(1)) for x in sizes.x
                if "never started" in x)
    assert never == cluster["jobs_never_started"]
    assert invoke("report", out).exit_code == 0
    assert (out / "report" / "fleet.png").exists()


# harden17b's fl.yaml: a chat deployment of 4 one-chip replicas (max_batch 64) at the fluid level.
FLUID = {
    "name": "fl", "duration": "10min", "hardware": "trn2", "cluster": {"instances": 1},
    "fluid": {"interval": "1min"},
    "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4}, "replicas": 4,
               "fidelity": "fluid", "router": "least_outstanding",
               "workload": {"rate": "40/s",
                            "input_tokens": {"distribution": "lognormal", "median": 512,
                                             "sigma": 0.8, "max": 4096},
                            "output_tokens": {"distribution": "lognormal", "median": 200,
                                              "sigma": 0.8, "max": 1024}},
               "slo": {"ttft": "1s", "tpot": "50ms"}}],
}


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_the_fluid_capacity_does_not_depend_on_curve_requests(tmp_path):
    """A replica's saturated capacity was measured on curve_requests requests at once: 200
    on 4 replicas of batch 64 never filled a batch (3.32 requests/s a replica), 500 spent
    its window draining (6.91), 1000 to 3000 still held the first batch's fast start (8.13,
    8.09), against 8.04 on 30,000. The saturated run now holds 40 full batches a replica
    whatever curve_requests is, and its window ends at the first replica's last admission."""
    from clustersim.scenario.loader import load_scenario
    from clustersim.serving.curves import (
        _run,
        group_size,
        replica_curve,
        saturated_rate_per_s,
        saturated_requests,
    )
    from clustersim.serving.requests import length_mean

    path = write(tmp_path, FLUID)
    capacities = []
    for requests in (200, 1000):
        scenario = load_scenario(path, [f"fluid.curve_requests={requests}"])
        d = scenario.serve[0]
        assert saturated_requests(scenario, d) == 40 * d.server.max_batch * 4
        capacities.append(replica_curve(scenario, d).capacity_per_s)
    # the reference: three times the run, its start a third of the share
    long = _run(scenario, d, 1e5, 3 * saturated_requests(scenario, d), 0, stratified=True)
    reference = saturated_rate_per_s(long, length_mean(d.workload.output_tokens)) \
        / group_size(scenario, d)
    for capacity in capacities:
        assert capacity == pytest.approx(reference, rel=2e-3)
