"""Session 17, helper fix17b1: keys and trace inputs that were accepted and changed nothing
(teams, scheduler and stragglers at the fleet-day level; native trace columns and mapping
keys; autoscale intervals between fluid steps), rows misread or replayed from nothing."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from cli_helpers import invoke, refused, write

# docs/fleet-day.md's example, shortened: one autoscaled deployment beside one job.
FLEET_DAY = {
    "name": "h17b1-fd", "duration": "1h", "hardware": "trn2", "cluster": {"instances": 8},
    "fluid": {"interval": "5min", "curve_requests": 500},
    "serve": [{
        "name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
        "router": "least_outstanding",
        "workload": {"load": {"sinusoid": {"peak": "300/s", "trough": "60/s"}},
                     "input_tokens": {"distribution": "lognormal", "median": 512,
                                      "sigma": 0.8, "max": 4096},
                     "output_tokens": {"distribution": "lognormal", "median": 200,
                                       "sigma": 0.8, "max": 1024}},
        "slo": {"ttft": "1s", "tpot": "50ms"},
        "autoscale": {"min": 4, "max": 100, "interval": "5min", "priority": 100}}],
    "jobs": [{"name": "train", "model": "llama3.1-70b", "seq_len": 4096, "global_batch": 32,
              "recompute": "full", "parallelism": {"tp": 64, "dp": 4}, "priority": 1,
              "team": "t", "checkpoint": {"interval": "30min", "write": "30s",
                                          "restore": "1min"}}],
}


# -- 1. the fleet-day level refuses what only the event-driven timeline reads

@pytest.mark.parametrize(("key", "value", "path"), [
    ("teams", [{"name": "t", "quota": 1}], "teams"),
    ("stragglers", {"fraction": 0.5, "slowdown": 2}, "stragglers"),
    ("scheduler", {"policy": "fairshare"}, "scheduler.policy"),
    ("scheduler", {"policy": "fifo"}, "scheduler.policy"),
    ("scheduler", {"preemption": True}, "scheduler.preemption"),
    ("scheduler", {"policy": "priority", "borrowing": True}, "scheduler.borrowing"),
])
def test_fleet_day_refuses_keys_only_the_event_driven_fleet_reads(
        tmp_path: Path, key: str, value: object, path: str) -> None:
    """A team quota of 1 under a 4-instance job warned "it can never start" and the job then
    ran the whole horizon (summary.teams missing); stragglers of half the fleet at twice the
    step time changed no figure: the fleet-day level reads neither."""
    raw = copy.deepcopy(FLEET_DAY)
    raw[key] = value
    out = tmp_path / "out"
    result = invoke("run", write(tmp_path, raw), "-o", out)
    refused(result, "scenario.yaml", path, "workload: {}", "event-driven fleet")
    assert not out.exists()


def test_fleet_day_keeps_the_priority_policy_and_the_event_fleet_reads_teams(
        tmp_path: Path) -> None:
    """`scheduler: {policy: priority}` is the fleet-day level's own order (the worked case,
    scenarios/rainier-serving-day.yaml, gives it); with `workload: {}` the same quota is the
    event-driven fleet's, and the job never starts."""
    raw = copy.deepcopy(FLEET_DAY)
    raw["scheduler"] = {"policy": "priority"}
    result = invoke("validate", write(tmp_path, raw))
    assert result.exit_code == 0, result.output
    raw["teams"] = [{"name": "t", "quota": 1}]
    raw["workload"] = {}
    raw["scheduler"] = {"policy": "fairshare"}
    out = tmp_path / "out"
    result = invoke("run", write(tmp_path, raw), "-o", out)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["teams"]["t"]["jobs_never_started"] == 1


# -- 2. the native format: unknown columns and mapping keys

NATIVE = {
    "name": "h17b1-native", "seed": 3, "duration": "1d", "hardware": "trn2",
    "cluster": {"instances": 4},
    "workload": {"trace": "jobs.csv", "format": "native",
                 "templates": [{"name": "research", "instances": [1], "job": {
                     "model": "llama3-8b", "seq_len": 4096,
                     "parallelism": {"tp": 8, "pp": 1}}}]},
    "trace": {"enabled": False},
}


def _native(tmp_path: Path, csv_text: str, **workload: object) -> Path:
    (tmp_path / "jobs.csv").write_text(csv_text, encoding="utf-8")
    raw = copy.deepcopy(NATIVE)
    raw["workload"].update(workload)
    return write(tmp_path, raw)


@pytest.mark.parametrize("column", ["runfor", "Priority", "extra"])
def test_native_trace_refuses_a_column_it_does_not_read(tmp_path: Path, column: str) -> None:
    """`runfor` for `run_for` was read by nothing: the 1 h job ran to the horizon."""
    scenario = _native(tmp_path, f"name,submit,instances,template,{column}\na,0,1,research,1h\n")
    out = tmp_path / "out"
    result = invoke("run", scenario, "-o", out)
    refused(result, "jobs.csv", "workload.trace", f"unknown column {column!r}", "run_for")
    assert not out.exists()


def test_native_trace_with_its_columns_runs(tmp_path: Path) -> None:
    """The eight columns are read (the 1 h job ends after 1 h, not at the horizon)."""
    scenario = _native(tmp_path, "name,submit,instances,template,run_for,steps,priority,team\n"
                       "a,0,1,research,1h,,0,vision\n")
    out = tmp_path / "out"
    result = invoke("run", scenario, "-o", out)
    assert result.exit_code == 0, result.output
    job = json.loads((out / "summary.json").read_text())["jobs"]["a"]
    assert (job["status"], job["wall_s"], job["team"]) == ("done", 3600.0, "vision"), job


@pytest.mark.parametrize(("key", "value"), [
    ("team", "none"), ("gpus_per_instance", 4), ("rule", "compute"), ("template", "research")])
def test_native_trace_refuses_mapping_keys(tmp_path: Path, key: str, value: object) -> None:
    """The native format reads no mapping: `team: none`, `gpus_per_instance: 4` and
    `rule: compute` were accepted and changed nothing."""
    scenario = _native(tmp_path, "name,submit,instances,template,run_for\na,0,1,research,1h\n",
                       mapping={key: value})
    refused(invoke("run", scenario, "-o", tmp_path / "out"), f"workload.mapping.{key}",
            "native format reads no mapping")


# -- 3. a native row of the wrong field count

@pytest.mark.parametrize(("rows", "row", "line", "fields"), [
    ("a,0,1,research,1h,extra\n", 1, 2, 6),
    ("a,0,1,research,1h\n\nb,0,1,research\n", 2, 4, 4),
])
def test_native_trace_refuses_a_row_of_the_wrong_field_count(
        tmp_path: Path, rows: str, row: int, line: int, fields: int) -> None:
    """With a field more than the header, pandas took the first column as the index and read
    every cell one column over ("row 1: unknown template '1h'"); with one fewer, the last
    column was empty. The row, its line and the count expected are named."""
    scenario = _native(tmp_path, "name,submit,instances,template,run_for\n" + rows)
    result = invoke("run", scenario, "-o", tmp_path / "out")
    refused(result, "jobs.csv", f"row {row} (line {line}): {fields} fields; expected 5")
    assert "unknown template" not in result.stderr


# -- 5. an autoscale interval between the fluid level's steps

@pytest.mark.parametrize(("interval", "near"), [("1s", "such as 5min (or"),
                                                ("7min", "such as 5min or 10min")])
def test_fluid_autoscale_interval_must_be_whole_steps(
        tmp_path: Path, interval: str, near: str) -> None:
    """At a 5-minute fluid step, intervals of 1s and 7min gave exactly the 5-minute results
    (fluid_plan rounded interval / step to whole steps)."""
    raw = copy.deepcopy(FLEET_DAY)
    raw["jobs"][0].pop("team")
    raw["serve"][0]["autoscale"]["interval"] = interval
    result = invoke("validate", write(tmp_path, raw))
    refused(result, "scenario.yaml", "serve.0.autoscale.interval", repr(interval),
            "fluid.interval 5min", near)


@pytest.mark.parametrize("interval", ["5min", "10min", None])
def test_fluid_autoscale_interval_of_whole_steps_or_unset_is_kept(
        tmp_path: Path, interval: str | None) -> None:
    """Whole steps, and the default (60 s, unset: every step at a 5-minute step), stand."""
    raw = copy.deepcopy(FLEET_DAY)
    raw["jobs"][0].pop("team")
    if interval is None:
        raw["serve"][0]["autoscale"].pop("interval")
    else:
        raw["serve"][0]["autoscale"]["interval"] = interval
    result = invoke("validate", write(tmp_path, raw))
    assert result.exit_code == 0, result.output


# -- 4. empty tables, run times of nothing

SAMPLES = Path(__file__).resolve().parents[1] / "scenarios" / "traces"
PAI_JOB_HEADER = "job_name,inst_id,user,status,start_time,end_time\n"
PAI_TASK_HEADER = ("job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,"
                   "plan_gpu,gpu_type\n")


def _published(tmp_path: Path, fmt: str, trace: str) -> Path:
    return write(tmp_path, {"name": f"h17b1-{fmt}", "hardware": "trn2", "duration": "30d",
                            "cluster": {"instances": 4}, "trace": {"enabled": False},
                            "workload": {"trace": trace, "format": fmt}})


@pytest.mark.parametrize(("table", "text", "words"), [
    ("pai_task_table.csv", "", "empty (no header, no rows)"),
    ("pai_job_table.csv", "", "empty (no header, no rows)"),
    ("pai_task_table.csv", PAI_TASK_HEADER, "a header and no rows"),
    ("pai_job_table.csv", PAI_JOB_HEADER, "a header and no rows"),
])
def test_an_empty_pai_table_is_refused(tmp_path: Path, table: str, text: str,
                                       words: str) -> None:
    """A 0-byte task table gave "0 of 3 rows replayed" and a 0-byte job table "0 of 0 rows",
    both exit 0: no job can come of either."""
    folder = tmp_path / "pai"
    folder.mkdir()
    for name in ("pai_job_table.csv", "pai_task_table.csv"):
        (folder / name).write_bytes((SAMPLES / name).read_bytes())
    (folder / table).write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    result = invoke("run", _published(tmp_path, "pai", "pai"), "-o", out)
    refused(result, "workload.trace", table, words, "no job can come of it")
    assert not out.exists()


@pytest.mark.parametrize(("fmt", "name", "text", "words"), [
    ("helios", "cluster_log.csv", "", "empty (no header, no rows)"),
    ("helios", "cluster_log.csv",
     "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time\n",
     "a header and no rows"),
    ("philly", "cluster_job_log", "", "empty (0 bytes)"),
    ("philly", "cluster_job_log", "[]", "an empty list"),
])
def test_an_empty_published_trace_is_refused(tmp_path: Path, fmt: str, name: str, text: str,
                                             words: str) -> None:
    (tmp_path / name).write_text(text, encoding="utf-8")
    refused(invoke("run", _published(tmp_path, fmt, name), "-o", tmp_path / "out"),
            "workload.trace", name, words)


@pytest.mark.parametrize(("text", "words"), [
    ("", "empty (no header, no rows)"),
    ("name,submit,instances,template,run_for\n", "a header and no rows"),
])
def test_an_empty_native_table_is_refused(tmp_path: Path, text: str, words: str) -> None:
    """A header and no rows ran a scenario of no job, exit 0."""
    refused(invoke("run", _native(tmp_path, text), "-o", tmp_path / "out"), "jobs.csv", words,
            "no job can come of it")


@pytest.mark.parametrize("run_for", ["1e-9s", "0s", "0.5", "-1h"])
def test_a_native_run_time_under_a_second_is_refused(tmp_path: Path, run_for: str) -> None:
    """`run_for: 1e-9s` was accepted and gave a job done with 0 steps while 0s was refused."""
    scenario = _native(tmp_path, f"name,submit,instances,template,run_for\n"
                       f"a,0,1,research,{run_for}\n")
    refused(invoke("run", scenario, "-o", tmp_path / "out"), "jobs.csv, row 1",
            "column run_for", run_for, "expected at least 1 s")


def test_a_philly_attempt_of_no_time_is_left_out(tmp_path: Path) -> None:
    """An attempt ending the second it started was replayed as a 1 s job of ETTR 0; it is
    left out and counted (trace_rows.left_out.zero_length), as rows with no run are."""
    attempt = {"start_time": "2017-10-07 01:12:09", "detail": [{"ip": "m1", "gpus": ["g0"]}]}
    jobs = [{"status": "Pass", "vc": "v", "jobid": jobid, "user": "u",
             "submitted_time": "2017-10-07 01:11:39",
             "attempts": [{**attempt, "end_time": end}]}
            for jobid, end in (("zero", "2017-10-07 01:12:09"), ("hour", "2017-10-07 02:12:09"))]
    (tmp_path / "log.json").write_text(json.dumps(jobs), encoding="utf-8")
    out = tmp_path / "out"
    result = invoke("run", _published(tmp_path, "philly", "log.json"), "-o", out)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["trace_rows"]
    assert (rows["rows"], rows["replayed"], rows["left_out"]["zero_length"]) == (2, 1, 1)
    assert list(summary["jobs"]) == ["philly-hour"]
    assert "1 ended as it started" in " ".join(result.stdout.split())
