"""Fleets: teams, quotas and fair share; published traces read in each format (small files
written here, never a downloaded trace) and refused when malformed; the outputs that scale
(job_summary.parquet, per-team figures, the largest jobs); and properties of generated fleets
with teams and quotas (hypothesis)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from clustersim.analysis.trace import MemoryRecorder
from clustersim.cli.app import app
from clustersim.cluster.fleet import team_figures
from clustersim.cluster.timeline import Timeline
from clustersim.runner.api import simulate, step_profiles, topology_for
from clustersim.scenario.loader import ScenarioError, load_scenario, scenario_from_dict
from clustersim.training.step import StepModel

runner = CliRunner()

SMALL = {"model": "llama3-8b", "seq_len": 2048, "recompute": "selective",
         "parallelism": {"tp": 8, "pp": 1, "zero": 1, "sequence_parallel": True}}


def small_job(name: str, instances: int, **more) -> dict:
    body = dict(SMALL, name=name, instances=instances, global_batch=instances * 8 * 4, **more)
    body["parallelism"] = dict(SMALL["parallelism"], dp=instances * 8)
    return body


def fleet(jobs: list[dict], instances: int = 16, **more) -> dict:
    return {"name": "fleet", "hardware": "trn2", "duration": "3d",
            "cluster": {"instances": instances, "fabric": {"instances_per_leaf": 4}},
            "jobs": jobs, **more}


# ---------------------------------------------------------------------------------------------
# Teams, quotas, fair share


def run(raw: dict, record: bool = False):
    scenario = scenario_from_dict(raw)
    recorder = MemoryRecorder()
    timeline = Timeline(scenario, step_profiles(scenario), np.random.SeedSequence(0),
                        recorder=recorder, step_model=StepModel(topology_for(scenario)))
    timeline.teams.admissions = []
    timeline.scheduler.reservations = []
    return scenario, timeline, timeline.run(), recorder


def test_a_team_at_its_quota_waits_while_another_team_starts():
    jobs = [small_job("a1", 4, team="a", run_for="10h"),
            small_job("a2", 4, team="a", run_for="10h", submit="1h"),
            small_job("b1", 4, team="b", run_for="10h", submit="2h")]
    raw = fleet(jobs, scheduler={"policy": "fifo"},
                teams=[{"name": "a", "quota": 4}, {"name": "b", "quota": 8}])
    _, _, result, _ = run(raw)
    assert result.jobs["a1"].start_s == 0
    assert result.jobs["b1"].start_s == pytest.approx(2 * 3600)  # not held back by a2
    assert result.jobs["a2"].start_s == pytest.approx(10 * 3600)  # when a1 gave back quota


def test_borrowing_lets_a_team_past_its_quota_while_the_cohort_has_room():
    jobs = [small_job("a1", 4, team="a", run_for="10h"),
            small_job("a2", 4, team="a", run_for="10h", submit="1h")]
    teams = [{"name": "a", "quota": 4}, {"name": "b", "quota": 8}]
    _, _, strict, _ = run(fleet(jobs, teams=teams))
    _, timeline, borrowed, _ = run(fleet(jobs, teams=teams,
                                         scheduler={"policy": "fifo", "borrowing": True}))
    assert strict.jobs["a2"].start_s == pytest.approx(10 * 3600)
    assert borrowed.jobs["a2"].start_s == pytest.approx(3600)
    over = [a for a in timeline.teams.admissions if a[3] is not None and a[2] > a[3]]
    assert over and all(cohort <= cohort_quota for *_, cohort, cohort_quota in over)


def test_a_job_larger_than_its_teams_quota_never_starts_and_says_why():
    raw = fleet([small_job("big", 8, team="a", run_for="1h")],
                teams=[{"name": "a", "quota": 4}])
    result = simulate(scenario_from_dict(raw))
    job = result.summary["jobs"]["big"]
    assert job["status"] == "queued at horizon"
    assert "quota of 4" in job["reason"]


def test_fair_share_starts_the_team_furthest_below_its_share_first():
    """Team a holds 8 of 16 instances; when 8 come free, b's job (submitted after a's
    second one) goes first: b holds nothing."""
    jobs = [small_job("a-run", 8, team="a", run_for="2d"),
            small_job("c-run", 8, team="c", run_for="5h"),
            small_job("a-next", 8, team="a", run_for="5h", submit="1h"),
            small_job("b-next", 8, team="b", run_for="5h", submit="2h")]
    _, _, fair, _ = run(fleet(jobs, scheduler={"policy": "fairshare"}))
    _, _, fifo, _ = run(fleet(jobs, scheduler={"policy": "fifo"}))
    assert fair.jobs["b-next"].start_s == pytest.approx(5 * 3600)
    assert fifo.jobs["a-next"].start_s == pytest.approx(5 * 3600)
    assert fair.jobs["a-next"].start_s > fair.jobs["b-next"].start_s


def test_an_undeclared_team_is_refused_naming_the_job():
    raw = fleet([small_job("j", 4, team="typo")], teams=[{"name": "a", "quota": 4}])
    with pytest.raises(ScenarioError, match=r"jobs\.0\.team"):
        scenario_from_dict(raw)


def test_team_figures_attribute_every_chip_hour(tmp_path: Path):
    jobs = [small_job(f"j{i}", 2 + 2 * (i % 3), team="ab"[i % 2], run_for=f"{3 + i}h",
                      submit=f"{i}h") for i in range(8)]
    raw = fleet(jobs, scheduler={"policy": "fairshare"},
                teams=[{"name": "a", "quota": 8, "share": 2}, {"name": "b", "quota": 8}],
                failures={"preset": "llama3", "scale": 300})
    result = simulate(scenario_from_dict(raw))
    teams = result.summary["teams"]
    assert set(teams) == {"a", "b"}
    assert sum(t["chip_time_share"] for t in teams.values()) == pytest.approx(1.0)
    held = sum(t["held_chip_s"] for t in teams.values())
    assert held == pytest.approx(result.timelines[0].allocated_chip_s, rel=1e-9)
    assert teams["a"]["share_weight"] == 2 and teams["b"]["quota_instances"] == 8


# ---------------------------------------------------------------------------------------------
# Outputs that scale


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_job_summary_parquet_has_every_per_job_figure(tmp_path: Path):
    path = tmp_path / "s.yaml"
    jobs = [small_job(f"j{i}", 2, team="ab"[i % 2], run_for="5h", submit=f"{i}h")
            for i in range(3)]
    path.write_text(yaml.safe_dump(fleet(jobs, teams=[{"name": "a"}, {"name": "b"}])))
    out = tmp_path / "out"
    assert runner.invoke(app, ["run", str(path), "-o", str(out)]).exit_code == 0
    summary = json.loads((out / "summary.json").read_text())
    table = pd.read_parquet(out / "job_summary.parquet")
    assert list(table["name"]) == ["j0", "j1", "j2"]
    assert list(table["team"]) == ["a", "b", "a"]
    job = summary["jobs"]["j1"]
    for key, value in job.items():
        if isinstance(value, dict):
            for inner in value:
                assert f"{key}.{inner}" in table.columns
        elif isinstance(value, list):
            assert f"{key}.0" in table.columns
        else:
            assert key in table.columns
            if isinstance(value, float):
                assert table.loc[1, key] == pytest.approx(value)
    assert table["time_by_state_s.queued"].tolist() == [
        summary["jobs"][n]["time_by_state_s"]["queued"] for n in ("j0", "j1", "j2")]
    # The report draws waits, slowdowns and chip-time by size and by team from it.
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    assert (out / "report" / "fleet.png").stat().st_size > 10_000
    assert "fleet.png" in (out / "report" / "report.md").read_text()


@pytest.mark.parametrize("replications", [1, 2])
def test_past_the_limit_summary_json_keeps_the_largest_jobs(monkeypatch, replications):
    import clustersim.runner.api as api

    monkeypatch.setattr(api, "SUMMARY_JOBS", 3)
    monkeypatch.setattr(api, "LARGEST_JOBS", 2)
    jobs = [small_job(f"j{i}", 1 + i, run_for="2h", submit=f"{i}h") for i in range(5)]
    result = simulate(scenario_from_dict(fleet(jobs)), replications=replications, workers=1)
    assert list(result.summary["jobs"]) == ["j3", "j4"]
    assert "every job is in job_summary.parquet" in result.summary["jobs_listed"]
    assert len(result.jobs) == 5


def test_streamed_job_figures_are_those_of_the_dicts(monkeypatch):
    """Past SUMMARY_JOBS, one replication: every job's figures made one at a time into
    job_summary's columns (JobFigures), with the teams' figures and the largest jobs read
    from the columns: the same as the per-job dicts of the general path."""
    import clustersim.runner.api as api
    import clustersim.runner.job_columns as job_columns
    from clustersim.cluster.fleet import flat_job_columns
    from clustersim.training.step import StepModel

    monkeypatch.setattr(api, "SUMMARY_JOBS", 3)
    monkeypatch.setattr(job_columns, "ROWS_PER_BLOCK", 3)  # blocks of 3, 3 and 2 jobs
    monkeypatch.setattr(api, "LARGEST_JOBS", 2)
    jobs = [small_job(f"j{i}", 1 + i % 3, run_for=f"{1 + i}h", submit=f"{i}h") for i in range(8)]
    for i, job in enumerate(jobs):
        job["team"] = "a" if i % 2 else "b"
    scenario = scenario_from_dict(fleet(jobs))
    result = simulate(scenario)
    general = api._job_summaries(scenario, result.steps, StepModel(result.topology),
                                 result.topology, result.timelines, True)
    assert dict(result.jobs.items()) == general["jobs"]
    assert result.summary["teams"] == general["teams"]
    largest = api.largest_jobs(general["jobs"], 2)
    assert result.summary["jobs"] == largest
    flat = flat_job_columns(
        general["jobs"], {name: o.team for name, o in result.timelines[0].jobs.items()})
    assert list(result.job_columns) == list(flat)
    for column, values in flat.items():
        assert result.job_columns[column].to_pylist() == values, column


# ---------------------------------------------------------------------------------------------
# Traces in

TEMPLATE = {"name": "research", "instances": [1],
            "job": {"model": "llama3-8b", "seq_len": 2048, "recompute": "selective",
                    "parallelism": {"tp": 8, "pp": 1, "zero": 1}}}

HELIOS = (
    "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,"
    "duration,queue\n"
    "10,ua,vca,8,8,1,COMPLETED,2020-06-09 18:00:00,2020-06-09 18:00:00,"
    "2020-06-09 20:00:00,7200,0\n"
    "11,ub,vcb,16,8,2,FAILED,2020-06-09 18:30:00,2020-06-09 18:40:00,"
    "2020-06-09 19:40:00,3600,600\n"
    "12,ub,vcb,0,4,1,COMPLETED,2020-06-09 19:00:00,2020-06-09 19:00:00,"
    "2020-06-09 19:10:00,600,0\n"
)

ACME = (
    "job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,"
    "fail_time,duration,queue,gpu_time\n"
    "a1,u1,1,8,64,Pretrain,FAILED,2023-05-17 11:00:00+00:00,"
    "2023-05-17 11:00:10+00:00,2023-05-17 15:00:10+00:00,2023-05-17 13:00:10+00:00,"
    "14400,10,0\n"
    "a2,u2,4,32,64,SFT,COMPLETED,2023-05-17 20:00:00+08:00,2023-05-17 20:00:00+08:00,"
    "2023-05-17 22:00:00+08:00,,7200,0,0\n"
)

PAI_JOBS = (
    "j1,i1,ua,Terminated,1000.0,5000.0\n"
    "j2,i2,ub,Failed,2000.0,3000.0\n"
)
PAI_TASKS = (
    "j1,worker,4.0,Terminated,1100.0,4100.0,600.0,10.0,100.0,V100\n"
    "j1,ps,1.0,Terminated,1100.0,4100.0,600.0,10.0,0.0,MISC\n"
    "j2,worker,2.0,Failed,2050.0,2950.0,400.0,10.0,50.0,T4\n"
)

PHILLY = [
    {"status": "Pass", "vc": "v1", "jobid": "app_1", "user": "u1",
     "submitted_time": "2017-10-07 01:00:00",
     "attempts": [{"start_time": "2017-10-07 01:00:30", "end_time": "2017-10-07 01:30:00",
                   "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1"]}]},
                  {"start_time": "2017-10-07 01:31:00", "end_time": "2017-10-07 03:00:30",
                   "detail": [{"ip": "m2", "gpus": [f"gpu{i}" for i in range(8)]},
                              {"ip": "m3", "gpus": [f"gpu{i}" for i in range(8)]}]}]},
    {"status": "Failed", "vc": "v2", "jobid": "app_2", "user": "u2",
     "submitted_time": "2017-10-07 02:00:00", "attempts": []},
]


def trace_scenario(tmp_path: Path, name: str, fmt: str, mapping: dict | None = None,
                   instances: int = 32) -> Path:
    raw = {"name": f"t-{fmt}", "hardware": "trn2", "duration": "2d",
           "cluster": {"instances": instances, "fabric": {"instances_per_leaf": 8}},
           "workload": {"trace": name, "format": fmt, "mapping": mapping or {},
                        "templates": [TEMPLATE]}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def jobs_of(path: Path) -> dict:
    return {j.name: j for j in load_scenario(path).jobs}


def test_helios_by_compute_keeps_submit_sizes_run_times_outcomes_and_teams(tmp_path: Path):
    (tmp_path / "cluster_log.csv").write_text(HELIOS)
    jobs = jobs_of(trace_scenario(tmp_path, "cluster_log.csv", "helios",
                                  {"rule": "compute", "gpu": "p4de"}))
    assert list(jobs) == ["helios-10", "helios-11"]  # the CPU job is left out
    first, second = jobs["helios-10"], jobs["helios-11"]
    assert (first.submit_s, second.submit_s) == (0.0, 1800.0)
    assert (first.run_for_s, second.run_for_s) == (7200.0, 3600.0)
    # 8 A100 (312 TF/s) = 3.7 Trainium2 (667): 4 chips, one trn2 (16 chips); 16 -> 8 -> 1
    assert (first.instances, second.instances) == (1, 1)
    assert (first.team, second.team) == ("vca", "vcb")
    assert (first.trace_outcome, second.trace_outcome) == ("COMPLETED", "FAILED")


def test_acme_uses_the_failure_time_and_time_zones(tmp_path: Path):
    (tmp_path / "trace_kalos.csv").write_text(ACME)
    jobs = jobs_of(trace_scenario(tmp_path, "trace_kalos.csv", "acme",
                                  {"rule": "instances", "gpus_per_instance": 8}))
    a1, a2 = jobs["acme-a1"], jobs["acme-a2"]
    assert a1.run_for_s == pytest.approx(2 * 3600)  # failed at 13:00:10, not 15:00:10
    assert a2.submit_s == pytest.approx(3600)  # 20:00+08:00 is 12:00 UTC
    assert (a1.instances, a2.instances) == (1, 4)
    assert (a1.team, a2.team) == ("u1", "u2")


def test_acme_rows_out_of_submission_order_are_refused_when_zones_say_so(tmp_path: Path):
    # 12:00+08:00 is 04:00 UTC, before the first row's 11:00 UTC.
    (tmp_path / "trace_kalos.csv").write_text(ACME.replace("2023-05-17 20:00:00+08:00,2023",
                                                           "2023-05-17 12:00:00+08:00,2023"))
    result = runner.invoke(app, ["validate", str(trace_scenario(tmp_path, "trace_kalos.csv",
                                                                "acme"))])
    assert result.exit_code == 2 and "row 2, column submit" in result.stderr


def test_pai_joins_the_task_table_beside_it(tmp_path: Path):
    (tmp_path / "pai_job_table.csv").write_text(PAI_JOBS)
    (tmp_path / "pai_task_table.csv").write_text(PAI_TASKS)
    jobs = jobs_of(trace_scenario(tmp_path, "pai_job_table.csv", "pai",
                                  {"rule": "instances", "gpus_per_instance": 2}))
    j1, j2 = jobs["pai-i1"], jobs["pai-i2"]
    assert (j1.submit_s, j2.submit_s) == (0.0, 1000.0)
    assert (j1.run_for_s, j2.run_for_s) == (3000.0, 900.0)
    assert (j1.instances, j2.instances) == (2, 1)  # 4 x 100% GPUs; 2 x 50%
    assert (j1.trace_outcome, j2.trace_outcome) == ("Terminated", "Failed")


def test_philly_spans_its_attempts_and_skips_jobs_that_never_ran(tmp_path: Path):
    (tmp_path / "cluster_job_log").write_text(json.dumps(PHILLY))
    jobs = jobs_of(trace_scenario(tmp_path, "cluster_job_log", "philly"))
    assert list(jobs) == ["philly-app_1"]
    job = jobs["philly-app_1"]
    assert job.run_for_s == pytest.approx(2 * 3600)  # first start to last end
    assert job.instances == 2  # its last attempt: 16 GPUs on two 8-GPU servers
    assert job.team == "v1" and job.trace_outcome == "Pass"


def test_a_native_trace_carries_teams(tmp_path: Path):
    (tmp_path / "jobs.csv").write_text("name,submit,instances,template,run_for,team\n"
                                       "x,0,2,research,1h,alpha\ny,1h,4,research,2h,beta\n")
    jobs = jobs_of(trace_scenario(tmp_path, "jobs.csv", "native"))
    assert (jobs["x"].team, jobs["y"].instances, jobs["y"].submit_s) == ("alpha", 4, 3600.0)


@pytest.mark.parametrize(("fmt", "name", "text", "expected"), [
    ("helios", "log.csv", HELIOS.replace("gpu_num,", "gpus,"), "column gpu_num missing"),
    ("helios", "log.csv", HELIOS.replace("2020-06-09 19:40:00", "2020-06-09 18:20:00"),
     "row 2, column end_time"),
    ("helios", "log.csv", HELIOS.replace("ub,vcb,16", "ub,vcb,many"), "row 2, column gpu_num"),
    ("helios", "log.csv", HELIOS.replace("ub,vcb,16", "ub,vcb,4096"), "row 2, column gpu_num"),
    ("helios", "log.csv", HELIOS.replace("\n11,", "\n10,"), "row 2, column id"),
    ("helios", "log.csv", HELIOS.replace("2020-06-09 18:30:00,2020-06-09 18:40",
                                         "2020-06-09 17:30:00,2020-06-09 18:40"),
     "row 2, column submit"),
    ("native", "jobs.csv", "name,submit,instances,template\nx,0,two,research\n",
     "row 1: column instances"),
    ("native", "jobs.csv", "name,submit,instances,template\nx,1h,1,research\ny,0,1,research\n",
     "row 2, column submit"),
    ("native", "jobs.csv", "name,submit,instances,template\nx,0,1,research\nx,1,1,research\n",
     "row 2, column name"),
    ("native", "jobs.csv", "name,submit,instances,template\nx,0,64,research\n",
     "row 1, column instances"),
])
def test_a_malformed_trace_exits_2_naming_file_row_and_column(tmp_path: Path, fmt, name, text,
                                                               expected):
    (tmp_path / name).write_text(text)
    path = trace_scenario(tmp_path, name, fmt)
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(path), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and name in result.stderr
    assert "Traceback" not in result.output and not out.exists()


def test_the_library_trace_examples_load():
    root = Path(__file__).resolve().parent.parent / "scenarios"
    for fmt in ("philly", "helios", "pai", "acme", "native"):
        scenario = load_scenario(root / f"trace-{fmt}.yaml")
        assert len(scenario.jobs) >= 3 and scenario.scheduler.policy == "fairshare"


# ---------------------------------------------------------------------------------------------
# Properties of generated fleets with teams and quotas


@st.composite
def fleets(draw, policy: str | None = None, failures: int | None = None,
           preemption: bool | None = None):
    instances = draw(st.integers(6, 16))
    teams = [{"name": f"t{k}", "quota": draw(st.one_of(st.none(), st.integers(2, instances))),
              "share": draw(st.sampled_from([1, 2, 3]))} for k in range(draw(st.integers(1, 3)))]
    jobs = []
    for k in range(draw(st.integers(2, 9))):
        jobs.append(small_job(
            f"j{k}", draw(st.integers(1, instances)), team=f"t{draw(st.integers(0, len(teams) - 1))}",
            submit=f"{draw(st.integers(0, 30))}h", run_for=f"{draw(st.integers(1, 20))}h",
            priority=0 if policy == "backfill" else draw(st.integers(0, 2))))
    policy = policy or draw(st.sampled_from(["fifo", "priority", "backfill", "fairshare"]))
    failures = draw(st.sampled_from([0, 300, 3000])) if failures is None else failures
    preemption = draw(st.booleans()) if preemption is None else preemption
    return scenario_from_dict(fleet(
        jobs, instances=instances, teams=teams,
        scheduler={"policy": policy, "preemption": preemption,
                   "borrowing": draw(st.booleans())},
        failures={"preset": "llama3", "scale": failures, "repair": "6h"},
        trace={"bin": "1h", "levels": ["cluster"]}))


def _quota_backfill_case():
    """Found by the property: team t0 (quota 7) has a 7-instance head waiting; a 1-instance
    t0 job that fits in the head's spare instance was backfilled, took the quota the head
    needed, and held the head back 14 hours."""
    jobs = [small_job("j0", 1, team="t0", submit="0h", run_for="1h", priority=0),
            small_job("j1", 1, team="t0", submit="0h", run_for="1h", priority=0),
            small_job("j2", 2, team="t1", submit="0h", run_for="5h", priority=0),
            small_job("j3", 7, team="t0", submit="2h", run_for="1h", priority=0),
            small_job("j4", 1, team="t0", submit="5h", run_for="14h", priority=0)]
    teams = [{"name": "t0", "quota": 7, "share": 1}, {"name": "t1", "quota": None, "share": 1},
             {"name": "t2", "quota": None, "share": 1}]
    return scenario_from_dict(fleet(
        jobs, instances=8, teams=teams,
        scheduler={"policy": "backfill", "preemption": False, "borrowing": False},
        failures={"preset": "llama3", "scale": 0, "repair": "6h"},
        trace={"bin": "1h", "levels": ["cluster"]}))


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=st.one_of(fleets(), fleets("backfill", 0, False)),
       seed=st.integers(0, 2**32 - 1))
@example(scenario=_quota_backfill_case(), seed=0)
def test_fleet_invariants(scenario, seed):
    recorder = MemoryRecorder()
    timeline = Timeline(scenario, step_profiles(scenario), np.random.SeedSequence(seed),
                        recorder=recorder, step_model=StepModel(topology_for(scenario)))
    timeline.teams.admissions = []
    timeline.scheduler.reservations = []
    result = timeline.run()
    eps = 1e-6

    # No double booking: an instance is held by one job at a time.
    busy: dict[int, list[tuple[float, float]]] = {}
    for _, inst, start, end in recorder.allocations:
        busy.setdefault(inst, []).append((start, end))
    for spans in busy.values():
        spans.sort()
        assert all(b[0] >= a[1] - eps for a, b in zip(spans, spans[1:], strict=False))

    # A quota is never exceeded, but by borrowing while the cohort stays within its quotas.
    borrowing = scenario.scheduler.borrowing
    for _, _, usage, quota, cohort, cohort_quota in timeline.teams.admissions:
        assert quota is None or usage <= quota or (borrowing and cohort <= cohort_quota)

    # Every chip-hour is attributed: to a job, so to its team, and the teams' add up.
    jobs = {name: {**o.figures(result.horizon_s), "team": o.team, "chips": o.chips}
            for name, o in result.jobs.items()}
    teams = team_figures(jobs, timeline.teams.quota, timeline.teams.weight)
    held = sum(t["held_chip_s"] for t in teams.values())
    assert held == pytest.approx(result.allocated_chip_s, rel=1e-9, abs=1e-3)
    allocated = sum((end - start) * scenario.hardware.chips_per_instance
                    for _, _, start, end in recorder.allocations)
    assert allocated == pytest.approx(result.allocated_chip_s, rel=1e-9, abs=1e-3)

    # Backfill never delays the head: without failures or preemption, with exact run times,
    # a head starts by its reservation's shadow time unless a job ahead of it in the queue
    # started in between (it is no longer the head then).
    if (scenario.scheduler.policy == "backfill" and not sum(result.failures.values())
            and not scenario.scheduler.preemption
            and len({j.priority for j in scenario.jobs}) == 1):
        starts = {i: result.jobs[j.name].start_s for i, j in enumerate(scenario.jobs)}
        first: dict[int, tuple[float, float]] = {}
        for now, head, shadow in timeline.scheduler.reservations:
            first.setdefault(head, (now, shadow))
        quotas = {t.name: t.quota for t in scenario.teams}
        for head, (now, shadow) in first.items():
            began = starts[head]
            if not np.isfinite(shadow) or (began is not None and began <= shadow + eps):
                continue
            quota = quotas.get(scenario.jobs[head].team)
            if quota is not None and scenario.job_instances(scenario.jobs[head]) > quota:
                continue  # over its own quota: it starts by borrowing, not by the free pool
            ahead = [i for i, j in enumerate(scenario.jobs)
                     if (j.submit_s, i) < (scenario.jobs[head].submit_s, head)
                     and starts[i] is not None and now - eps <= starts[i]
                     and (began is None or starts[i] <= began + eps)]
            assert ahead, (head, now, shadow, began)


# ---------------------------------------------------------------------------------------------
# The scheduler's structures


class _Run:
    def __init__(self, index: int, priority: int, queued_at: float, instances: int,
                 team: str = "-"):
        from types import SimpleNamespace

        self.index, self.queued_at, self.instances_needed = index, queued_at, instances
        self.team = team
        self.job = SimpleNamespace(priority=priority)


def test_the_queue_walk_survives_starting_the_job_it_gave():
    from clustersim.cluster.policies import queue_key
    from clustersim.cluster.queues import JobQueue

    queue = JobQueue(lambda run: queue_key("priority", run))
    runs = [_Run(i, priority=i % 3, queued_at=float(10 - i), instances=1 + i) for i in range(9)]
    for run in runs:
        queue.append(run)
    expected = sorted(runs, key=lambda r: (-r.job.priority, r.queued_at, r.index))
    seen = []
    for run in queue.ordered():
        seen.append(run)
        if run.index % 2 == 0:
            queue.remove(run)  # started: the walk goes on with the next one
    assert seen == expected
    assert [r.index for r in queue] == [r.index for r in expected if r.index % 2]
    assert queue.smallest() == min(r.instances_needed for r in runs if r.index % 2)


def test_the_fair_share_walk_picks_the_team_furthest_below_its_share_each_time():
    from types import SimpleNamespace

    from clustersim.cluster.policies import queue_key
    from clustersim.cluster.queues import FairShareQueue
    from clustersim.cluster.quotas import TeamBook

    scenario = SimpleNamespace(teams=[SimpleNamespace(name="a", quota=None, share=1.0),
                                      SimpleNamespace(name="b", quota=None, share=3.0)],
                               scheduler=SimpleNamespace(borrowing=False))
    book = TeamBook(scenario)
    book.usage.update({"a": 2, "b": 3})  # shares: a 2, b 1
    queue = FairShareQueue(lambda run: queue_key("fairshare", run), book)
    runs = [_Run(i, 0, float(i), 2, team="ab"[i % 2]) for i in range(6)]
    for run in runs:
        queue.append(run)
    order = []
    for run in queue.ordered():
        order.append(run.index)
        run.admitted = False
        book.admit(run, 0.0)  # started: its team's share rises
        queue.remove(run)
    # b (share 1.0) first: 5 instances (1.67 < a's 2.0), b again: 7 (2.33); a (2.0): 4
    # (4.0); b (2.33): 9; b has no more jobs, a's two go.
    assert order == [1, 3, 0, 5, 2, 4]
    assert len(queue) == 0


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=30), data=st.data())
def test_the_walk_by_size_is_the_queue_in_order_without_the_jobs_too_large(sizes, data):
    """JobQueue.after visits, in queue order, the jobs after a given one needing at most the
    bound (which falls as the walker starts jobs), as a walk of the whole queue skipping the
    others would."""
    from clustersim.cluster.policies import queue_key
    from clustersim.cluster.queues import JobQueue

    queue, brute = JobQueue(lambda run: queue_key("priority", run)), []
    runs = [_Run(i, priority=i % 2, queued_at=float(i % 5), instances=n)
            for i, n in enumerate(sizes)]
    for run in runs:
        queue.append(run)
    ordered = list(queue)
    after = data.draw(st.sampled_from([None, *ordered]))
    bound = [data.draw(st.integers(0, 7))]
    first_bound = bound[0]
    starts = set(data.draw(st.lists(st.sampled_from(runs), max_size=10)))
    seen = []
    for run in queue.after(after, lambda: bound[0]):
        seen.append(run)
        if run in starts:
            queue.remove(run)
            bound[0] -= run.instances_needed
    # The same walk over the whole queue, skipping the jobs too large one by one.
    position = 0 if after is None else ordered.index(after) + 1
    for run in ordered[position:]:
        if run.instances_needed <= first_bound:
            brute.append(run)
            if run in starts:
                first_bound -= run.instances_needed
    assert seen == brute


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(st.tuples(st.integers(1, 6), st.sampled_from("abc")), min_size=1,
                     max_size=30), data=st.data())
def test_the_walk_by_team_is_the_queue_in_order_without_the_jobs_over_quota(jobs, data):
    """JobQueue.after with a quota room visits, in queue order, the jobs a walk of the whole
    queue would not skip: those needing at most the size bound and their team's room, both
    asked when the walk reaches them (each start lowers the bound, its team's room, and
    with a shared cohort every team's)."""
    from clustersim.cluster.policies import queue_key
    from clustersim.cluster.queues import JobQueue

    runs = [_Run(i, priority=i % 2, queued_at=float(i % 5), instances=n, team=team)
            for i, (n, team) in enumerate(jobs)]
    queue = JobQueue(lambda run: queue_key("priority", run))
    for run in runs:
        queue.append(run)
    ordered = list(queue)
    after = data.draw(st.sampled_from([None, *ordered]))
    starts = set(data.draw(st.lists(st.sampled_from(runs), max_size=10)))
    first = {"bound": data.draw(st.integers(0, 12)), "cohort": data.draw(st.integers(0, 12)),
             **{team: data.draw(st.integers(0, 7)) for team in "abc"}}

    def walk(visit):
        state = dict(first)

        def room(team):
            return max(state[team], state["cohort"])

        def started(run):
            for name in ("bound", "cohort", run.team):
                state[name] -= run.instances_needed

        return visit(lambda: state["bound"], room, started)

    def by_index(limit, room, started):
        seen = []
        for run in queue.after(after, limit, room):
            seen.append(run)
            if run in starts:
                queue.remove(run)
                started(run)
        return seen

    def brute(limit, room, started):
        seen = []
        position = 0 if after is None else ordered.index(after) + 1
        for run in ordered[position:]:
            if run.instances_needed <= min(limit(), room(run.team)):
                seen.append(run)
                if run in starts:
                    started(run)
        return seen

    expected = walk(brute)
    assert walk(by_index) == expected
    assert len(queue) == len(runs) - len(starts & set(expected))


@settings(max_examples=150, deadline=None)
@given(jobs=st.lists(st.tuples(st.integers(1, 3), st.sampled_from("ab"), st.integers(1, 9)),
                     min_size=1, max_size=30), data=st.data())
@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_the_backfill_walk_finds_the_jobs_a_whole_queue_walk_would_start(jobs, data):
    """JobQueue.after with `viable` (as backfill asks it: a size within what the reservation
    leaves over, or some job of that team and size short enough to end before it) finds
    the same jobs, in the same order, that a walk of the whole queue checking each job
    (within the bound, its team's room, and within the extra or ending before the shadow
    time) would; each start lowers the bound, the team's room and, when it runs past the
    shadow time, the extra."""
    from clustersim.cluster.policies import queue_key
    from clustersim.cluster.queues import JobQueue

    runs = [_Run(i, priority=i % 2, queued_at=float(i % 5), instances=n, team=team)
            for i, (n, team, _) in enumerate(jobs)]
    runtime = {run.index: float(hours) for run, (_, _, hours) in zip(runs, jobs, strict=True)}
    queue = JobQueue(lambda run: queue_key("priority", run), lambda run: runtime[run.index])
    for run in runs:
        queue.append(run)
    ordered = list(queue)
    after = data.draw(st.sampled_from([None, *ordered]))
    starts = set(data.draw(st.lists(st.sampled_from(runs), max_size=10)))
    shadow = data.draw(st.integers(0, 10))
    first = {"bound": data.draw(st.integers(0, 12)), "extra": data.draw(st.integers(0, 4)),
             **{team: data.draw(st.integers(0, 9)) for team in "ab"}}

    def walk(by_index):
        state = dict(first)
        found = []
        if by_index:
            candidates = queue.after(
                after, lambda: state["bound"], lambda team: state[team],
                lambda size, shortest: size <= state["extra"] or shortest <= shadow)
        else:
            candidates = ordered[0 if after is None else ordered.index(after) + 1:]
        for run in candidates:
            need, ends_before = run.instances_needed, runtime[run.index] <= shadow
            if need > min(state["bound"], state[run.team]) or not (
                    ends_before or need <= state["extra"]):
                continue  # the walker's own checks
            found.append(run)
            if run in starts:
                if by_index:
                    queue.remove(run)
                for name in ("bound", run.team) if ends_before else ("bound", run.team,
                                                                      "extra"):
                    state[name] -= need
        return found

    expected = walk(by_index=False)
    assert walk(by_index=True) == expected


def test_the_backfill_walk_keeps_a_size_while_one_of_its_jobs_is_short_enough():
    """A team's jobs of a size too large for the extra are skipped only when none ends
    before the shadow time: the short one behind a long one is still found."""
    from clustersim.cluster.policies import queue_key
    from clustersim.cluster.queues import JobQueue

    runtime = {0: 9.0, 1: 1.0, 2: 8.0}
    runs = [_Run(0, 0, 0.0, 3, "a"), _Run(1, 0, 1.0, 3, "a"), _Run(2, 0, 2.0, 2, "a")]
    queue = JobQueue(lambda run: queue_key("priority", run), lambda run: runtime[run.index])
    for run in runs:
        queue.append(run)

    def walk(shadow):
        return [run.index for run in queue.after(None, lambda: 10, lambda team: 10,
                                                 lambda size, shortest: shortest <= shadow)]

    assert walk(5.0) == [0, 1]  # size 3 has a short job: both visited; size 2 has none
    assert walk(0.5) == []
    queue.remove(runs[1])
    assert walk(5.0) == []  # the short one started: nothing of size 3 may


class _Active:
    """A running job as ActiveJobs sees it."""

    def __init__(self, index, priority, start, run_for, held, steps=None):
        from types import SimpleNamespace

        self.index, self.held_count, self.state, self.granted = index, held, "running", None
        self.instances_needed = held
        self.job = SimpleNamespace(priority=priority, steps=steps, run_for_s=run_for)
        self.outcome = SimpleNamespace(start_s=start)
        self.end_at = None

    def fixed_expected_end(self):
        if self.job.steps is not None or self.outcome.start_s is None:
            return None
        return self.outcome.start_s + self.job.run_for_s

    def backfill_count(self):
        return self.held_count

    def expected_end(self):
        return 1e9 + self.index  # (a job with a step target: asked each time)


@settings(max_examples=40, deadline=None)
@given(jobs=st.lists(st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 5)),
                               st.integers(1, 3), st.integers(1, 4), st.booleans()),
                     min_size=1, max_size=25), data=st.data())
def test_running_jobs_by_end_and_by_preemption_order_are_the_sorts(jobs, data):
    """ActiveJobs keeps the ends and the preemption order as jobs come, start and go: the
    same sequences as sorting every running job at each use."""
    from clustersim.cluster.queues import ActiveJobs

    active, runs = ActiveJobs(), []
    for index, (priority, start, run_for, held, stepped) in enumerate(jobs):
        run = _Active(index, priority, None if start is None else float(start),
                      float(run_for), held, steps=100 if stepped else None)
        runs.append(run)
        active.add(run)
    for _ in range(3):
        gone = data.draw(st.lists(st.sampled_from(runs), max_size=3))
        for run in gone:
            active.discard(run)
        for run in runs:  # some start meanwhile
            if run.outcome.start_s is None and data.draw(st.booleans()):
                run.outcome.start_s = 9.0
        present = [r for r in runs if r in active]
        head = data.draw(st.sampled_from(present)) if present else None
        expected = sorted((r.expected_end() if r.fixed_expected_end() is None
                           else r.fixed_expected_end(), r.backfill_count())
                          for r in present if r is not head)
        assert list(active.expected_ends(head)) == expected
        below = data.draw(st.integers(0, 3))
        victims = sorted((r for r in present if r.job.priority < below),
                         key=lambda r: (r.job.priority, -(r.outcome.start_s or 0.0), r.index))
        assert list(active.by_preemption_order(below)) == victims
        for run in gone:
            active.add(run)


@settings(max_examples=60, deadline=None)
@given(per_leaf=st.sampled_from([8, 16, 5]), leaves=st.integers(1, 6), partial=st.booleans(),
       serving=st.sampled_from([0, 0, 3, 10]), data=st.data())
def test_fragmentation_is_the_share_of_free_instances_outside_wholly_free_leaves(
        per_leaf, leaves, partial, serving, data):
    """Scheduler.record_state (from the free pool's counts per leaf, with or without
    serving instances) gives the definition: 1 - (free instances in leaves whose
    instances, serving ones aside, are all free) / free."""
    from types import SimpleNamespace

    from clustersim.cluster.scheduler import Scheduler

    n = leaves * per_leaf - (per_leaf // 2 if partial and leaves > 1 else 0)
    serving = min(serving, n)
    leaf = np.arange(n) // per_leaf
    free = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    # (some leaves wholly free: random instances seldom make one)
    free |= np.repeat(data.draw(st.lists(st.booleans(), min_size=leaves, max_size=leaves)),
                      per_leaf)[:n]
    free[:serving] = False
    t = SimpleNamespace(instance_leaf=leaf, n_leaves=leaves, n_instances=n, per_leaf=per_leaf,
                        teams=None, env=SimpleNamespace(now=1.0),
                        free_pool=SimpleNamespace(count=int(free.sum()), per_leaf=np.bincount(
                            leaf[free], minlength=leaves), version=0),
                        serving_instances=serving, min_free=n, recorder=None,
                        serving_per_leaf=np.bincount(leaf[:serving], minlength=leaves))
    scheduler = Scheduler(t, "fifo", False)
    scheduler.record_state()
    in_whole = sum(int(free[leaf == k].sum()) for k in range(leaves)
                   if free[(leaf == k) & (np.arange(n) >= serving)].all())
    count = int(free.sum())
    expected = 1.0 - in_whole / count if count else 0.0
    assert scheduler._last == (1.0, expected)
    # Kept until the pool's version moves (a pass that changed nothing), recomputed then.
    t.free_pool.per_leaf = np.zeros(leaves, dtype=np.int64)
    t.env.now = 2.0
    scheduler.record_state()
    assert scheduler._last == (2.0, expected)
    t.free_pool.version += 1
    scheduler.record_state()
    assert scheduler._last == (2.0, 1.0 if count else 0.0)


def test_job_columns_made_in_blocks_are_those_made_whole():
    """job_summary's Arrow columns made a block of jobs at a time are the table the whole
    lists made: figures first met in a later block (None, or 0 for a cause, before), a
    column of integers and floats (floats), of None only (null), NaN and infinity (null)."""
    import math

    import pyarrow as pa

    from clustersim.cluster.fleet import finite_or_none_column, flat_job_columns
    from clustersim.runner.job_columns import ArrowRows, arrow_job_columns

    jobs = {}
    for i in range(11):
        figures = {"chips": 16 * (i + 1), "held_chip_s": 3.5 * i if i % 3 else i,
                   "slowdown": None, "ettr": math.nan if i == 4 else 0.5,
                   "status": "done" if i % 2 else "queued", "alone": i == 7,
                   "interruptions_by_cause": {"hbm": i} if i >= 5 else {}}
        if i >= 6:
            figures["cross_site"] = {"step_s": math.inf if i == 9 else 1.25 * i, "sites": 2}
        jobs[f"j{i}"] = figures
    teams = {name: "a" if k % 2 else "b" for k, name in enumerate(jobs)}
    lists = flat_job_columns(jobs, teams)
    whole = pa.table({name: finite_or_none_column(list(values))
                      for name, values in lists.items()})
    assert whole.schema.field("held_chip_s").type == pa.float64()
    assert whole.schema.field("slowdown").type == pa.null()
    for rows in (1, 2, 3, 5, 11, 64):
        made = pa.table(arrow_job_columns(jobs, teams, rows_per_block=rows))
        assert made.equals(whole), rows
    assert whole["interruptions_by_cause.hbm"].to_pylist()[:5] == [0] * 5
    assert whole["cross_site.step_s"].to_pylist()[9] is None
    rows = ArrowRows(arrow_job_columns(jobs, teams, rows_per_block=4))
    assert len(rows) == 11 and list(rows)[:2] == ["j0", "j1"]
    assert rows["j5"]["held_chip_s"] == 17.5 and rows["j5"]["team"] == "a"
    with pytest.raises(ValueError, match="rows_per_block"):
        arrow_job_columns(jobs, teams, rows_per_block=0)


def test_job_columns_made_a_column_at_a_time_are_those_made_row_by_row():
    """`block_columns` (the values under a key gathered for every job at once, a mapping
    shared by several jobs flattened once) gives `flat_job_columns`' columns in its order:
    figures first met late go after the others, a key a leaf in one job and nested in
    another, a figure `team` over the teams given, tuples by index."""
    from clustersim.cluster.fleet import flat_job_columns
    from clustersim.runner.job_columns import block_columns

    shared = {"a": 1, "b": {"c": 2.0, "d": [1, 2]}}
    jobs = {}
    for i in range(60):
        figures = {"chips": i, "shape": shared if i % 3 else {"a": 5, "b": {"c": 1.0}},
                   "x": None}
        if i > 20:
            figures["interruptions_by_cause"] = {"hbm": i} if i % 2 else {"gpu": 1, "hbm": 2}
        if i == 30:
            figures["late"] = {"z": [1, {"q": 2}]}
        if i == 40:
            figures["shape"] = 7
        if i == 50:
            figures["team"] = "own"
        if i % 7 == 0:
            figures["band"] = (1.0, 2.0)
        jobs[f"j{i}"] = figures
    for teams in (None, {f"j{i}": "t" for i in range(0, 60, 3)}):
        made, walked = block_columns(jobs, teams), flat_job_columns(jobs, teams)
        assert list(made) == list(walked)
        assert made == walked
    assert list(made)[-3:] == ["late.z.0", "late.z.1.q", "shape"]
    assert made["interruptions_by_cause.gpu"][:24] == [0] * 22 + [1, 0]


def test_job_columns_of_a_nan_beside_other_values_are_those_of_the_lists():
    """A figure's column in Arrow is the column of its values with a NaN or an infinity as
    None, also where that changes its type (integers beside a NaN; strings beside one)."""
    import math

    import pyarrow as pa

    from clustersim.cluster.fleet import finite_or_none_column
    from clustersim.runner.job_columns import _finite_array

    for values in (["a", math.nan, None], [1, math.nan], [1.5, -math.inf], [None, None],
                   [1, 2.5], [True, False]):
        made, expected = _finite_array(list(values)), pa.array(finite_or_none_column(
            list(values)))
        assert made.type == expected.type and made.equals(expected), values
