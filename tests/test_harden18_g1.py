"""Harden 18 (g1): means over runs and replications count what did not occur as 0, say how
many replications define a figure, and say which population each answer is of."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sweep_helpers import sweep_base, write_sweep

from clustersim.runner.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent


def _rare_failures() -> dict:
    """One day of the sweep's base job with failures rare enough that some seeds have none."""
    base = sweep_base("1d")
    base["failures"]["scale"] = 20
    return base


def test_a_sweep_counts_a_cause_that_did_not_occur_as_zero(tmp_path):
    path = write_sweep(tmp_path, _rare_failures(), seeds=[0, 1, 2, 3],
                       variants=[{"name": "train", "set": {}},
                                 {"name": "renamed", "set": {"jobs.0.name": "other"}}])
    rows, summary = run_sweep(path, workers=1)
    mine = rows[rows["variant"] == "train"]
    causes = [c for c in rows if c.startswith("train.interruptions_by_cause.")]
    components = [c for c in rows if c.startswith("cluster.failures.")]
    assert causes and components
    # some seed had no interruption: its causes are 0 in the rows, not missing
    assert (mine["train.interruptions"] == 0).any()
    assert not mine[causes + components].isna().any().any()
    assert (mine[causes].sum(axis=1) == mine["train.interruptions"]).all()
    # the other variant has no job `train`: its figures stay missing, counts included
    assert rows.loc[rows["variant"] == "renamed", causes].isna().all().all()
    assert not rows.loc[rows["variant"] == "renamed", components].isna().any().any()
    # the mean of the causes over all four runs adds up to the mean of the interruptions
    row = summary[summary["variant"] == "train"].iloc[0]
    assert math.isclose(sum(row[c] for c in causes), row["train.interruptions"])
    for column in causes + components:
        assert math.isclose(row[column], mine[column].mean())
        assert math.isclose(row[f"{column}_ci95"],
                            3.182 * mine[column].std(ddof=1) / 2) or mine[column].nunique() == 1


def _job(status, start_s, end_s, steps):
    return {"status": status, "start_s": start_s, "end_s": end_s, "steps_completed": steps,
            "interruptions_by_cause": {"chip": 1} if steps else {}}


def test_replications_average_a_figure_over_the_replications_that_define_it():
    from clustersim.cluster.fleet import flat_job_columns
    from clustersim.runner.figures import combine_replications

    # a job done in two replications and running at the horizon in the third; one that
    # never started in the last
    runs = [{"a": _job("done", 100.0, 900.0, 10), "b": _job("running at horizon", 50.0, None, 8)},
            {"a": _job("done", 100.0, 700.0, 12), "b": _job("running at horizon", 70.0, None, 6)},
            {"a": _job("running at horizon", 400.0, None, 9),
             "b": _job("queued at horizon", None, None, 0)}]
    jobs = combine_replications([{"jobs": r} for r in runs])["jobs"]
    a, b = jobs["a"], jobs["b"]
    assert a["start_s"] == 200.0 and "start_s_n" not in a  # defined in all three
    assert a["end_s"] == 800.0 and a["end_s_n"] == 2  # not replication 0's 900
    assert math.isclose(a["end_s_ci95"], 12.706 * math.sqrt(2 * 100.0**2) / math.sqrt(2))
    assert b["start_s"] == 60.0 and b["start_s_n"] == 2  # not replication 0's 50
    assert b["end_s"] is None and "end_s_n" not in b  # defined in none
    assert a["status"] == "done"  # replication 0's, and how many ended how:
    assert a["status_by_replication"] == {"done": 2, "running at horizon": 1}
    assert b["status_by_replication"] == {"queued at horizon": 1, "running at horizon": 2}
    assert math.isclose(b["interruptions_by_cause"]["chip"], 2 / 3)
    # job_summary.parquet's columns: a status a job never ended in counts 0 replications
    columns = flat_job_columns(jobs)
    assert columns["status_by_replication.queued at horizon"] == [0, 1]
    assert columns["end_s_n"] == [2, None]


def test_the_run_table_says_how_the_replications_of_a_job_ended():
    from clustersim.cli.run import _status, _when

    job = {"status": "done", "status_by_replication": {"done": 2, "running at horizon": 1},
           "start_s": 100.0, "end_s": 800.0, "end_s_n": 2}
    assert _status(job) == "done in 2, running at horizon in 1 of 3 replications"
    assert _when(job).endswith("(means; ended in 2 replications)")
    assert _status({"status": "done", "status_by_replication": {"done": 3}}) == "done"


@pytest.fixture(scope="module")
def replicated(tmp_path_factory) -> Path:
    """Three days of the quickstart, three replications: replication 0 meets no failure."""
    from clustersim.runner.api import run_to
    from clustersim.scenario.loader import load_scenario

    out = tmp_path_factory.mktemp("replicated") / "out"
    scenario = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["duration=3d"])
    run_to(scenario, out, replications=3, workers=1)
    return out


def test_a_replicated_run_says_which_replication_each_answer_is_of(replicated):
    from clustersim.analysis import load_run

    run = load_run(replicated)
    assert run.replications == 3
    means = {k: v for k, v in run.summary["cluster"]["failures"].items()
             if not k.endswith("_ci95")}
    assert means  # some replication met a failure
    stats = run.failure_stats().set_index("component")
    assert (stats["replication"] == 0).all()
    # `count` is the events trace's (replication 0's), `mean_count` the summary's mean
    events = run.events
    from_trace = events[events["kind"] == "failure"].groupby("component").size()
    assert stats["count"].to_dict() == {c: int(from_trace.get(c, 0)) for c in stats.index}
    assert set(stats.index) == set(means) | set(from_trace.index)
    assert stats["mean_count"].to_dict() == pytest.approx({c: means.get(c, 0.0)
                                                           for c in stats.index})
    assert (run.goodput()["replications"] == 3).all()


def test_the_report_of_a_replicated_run_shows_a_mean_count_of_interruptions(replicated):
    import json

    from clustersim.analysis.html_report import html_report
    from clustersim.analysis.report import write_report

    mean = json.loads((replicated / "summary.json").read_text())["jobs"]["pretrain"][
        "interruptions"]
    assert not float(mean).is_integer()  # 4 interruptions over 3 replications
    report = write_report(replicated).read_text()
    row = next(line for line in report.splitlines() if line.startswith("| pretrain "))
    assert f"| {mean:,.2f} |" in row  # was 1
    page = html_report(replicated)
    assert f"<td>{mean:,.2f}</td>" in page
    from clustersim.analysis.runs import job_status

    assert job_status({"status": "done", "status_by_replication": {
        "done": 2, "running at horizon": 1}}) == "done 2, running at horizon 1 replications"


@pytest.mark.parametrize(("sweep", "where"), [
    ({"seeds": [1, 1, 1]}, "seeds.1: 1, the seed of seeds.0 again"),
    ({"grid": {"failures.scale": [1, 2, 1]}}, "grid.failures.scale.2: 1, the value of "
                                              "grid.failures.scale.0 (1) again"),
    ({"grid": {"failures.scale": [1.0, 1]}}, "grid.failures.scale.1"),
    ({"grid": {"jobs.0.checkpoint.interval": ["20min", "1h", "20min"]}},
     "grid.jobs.0.checkpoint.interval.2"),
])
def test_a_sweep_refuses_a_seed_or_grid_value_given_twice(tmp_path, sweep, where):
    from clustersim.runner.sweep import load_sweep
    from clustersim.scenario.errors import ScenarioError

    with pytest.raises(ScenarioError, match=r"again; expected each") as error:
        load_sweep(write_sweep(tmp_path, **sweep))
    assert where in str(error.value)


def test_a_figure_the_same_in_every_run_has_an_interval_of_zero():
    import pandas as pd

    from clustersim.runner.sweep import summarise

    rows = pd.DataFrame({"variant": "base", "seed": range(30), "status": "ok", "error": "",
                         "train.step_time_s": 3.176, "train.mfu": 1 / 3,
                         "train.steps_completed": [float(i % 2) for i in range(30)]})
    assert rows["train.step_time_s"].std(ddof=1) > 0  # rounding noise, as numpy gives it
    summary = summarise(rows, []).iloc[0]
    assert summary["train.step_time_s_ci95"] == 0.0 and summary["train.mfu_ci95"] == 0.0
    assert summary["train.steps_completed_ci95"] > 0.1
