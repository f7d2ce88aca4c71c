"""Session 13's hardening of the fleet surfaces: what a demanding user found replaying
traces, drawing job mixes and writing a fleet run's outputs. One test (or a few) per defect."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_helpers import invoke, refused, write

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "scenarios" / "traces"


def _trace_scenario(folder: Path, trace: str, fmt: str) -> Path:
    return write(folder, {
        "name": "t", "hardware": "trn2u", "duration": "4d", "seed": 3,
        "cluster": {"ultraservers": 4, "fabric": {"instances_per_leaf": 16}},
        "workload": {"trace": trace, "format": fmt},
        "trace": {"bin": "1h", "levels": ["cluster"]}})


# 1. A PAI trace given as its folder: -o that folder --force deleted the trace ------------


def test_an_output_folder_that_is_a_trace_folder_is_refused_even_with_force(tmp_path: Path):
    """`workload.trace` may name PAI's folder of tables; `-o` that folder with `--force`
    replaced it (the job and task tables deleted: "replaced the earlier run"), where an
    output folder holding an input is refused even with --force."""
    data = tmp_path / "pai"
    data.mkdir()
    for name in ("pai_job_table.csv", "pai_task_table.csv"):
        shutil.copy(TRACES / name, data / name)
    (tmp_path / "s").mkdir()
    scenario = _trace_scenario(tmp_path / "s", str(data), "pai")
    result = invoke("run", scenario, "-o", data, "--force")
    refused(result, "an input of this command")
    assert sorted(p.name for p in data.iterdir()) == ["pai_job_table.csv", "pai_task_table.csv"]


def test_pai_task_table_linked_from_elsewhere_is_an_input(tmp_path: Path):
    """The job table and the task table beside it may be links to other folders: the task
    table's folder was not an input, and `-o` there with --force deleted it."""
    real, tasks, links = (tmp_path / name for name in ("real", "tasks", "links"))
    for folder in (real, tasks, links):
        folder.mkdir()
    shutil.copy(TRACES / "pai_job_table.csv", real / "pai_job_table.csv")
    shutil.copy(TRACES / "pai_task_table.csv", tasks / "pai_task_table.csv")
    (links / "pai_job_table.csv").symlink_to(real / "pai_job_table.csv")
    (links / "pai_task_table.csv").symlink_to(tasks / "pai_task_table.csv")
    (tmp_path / "s").mkdir()
    scenario = _trace_scenario(tmp_path / "s", str(links / "pai_job_table.csv"), "pai")
    refused(invoke("run", scenario, "-o", tasks, "--force"), "an input of this command")
    assert [p.name for p in tasks.iterdir()] == ["pai_task_table.csv"]


# 2. A trace's missing submission time was 1970; "now" was the clock's time -------------

HELIOS_HEADER = ("job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,"
                 "end_time,duration,queue")


def _helios(tmp_path: Path, *rows: str) -> Path:
    (tmp_path / "h.csv").write_text("\n".join((HELIOS_HEADER, *rows)) + "\n")
    return _trace_scenario(tmp_path, "h.csv", "helios")


def test_a_missing_submission_time_is_refused_naming_its_row(tmp_path: Path):
    """An empty submit_time was read as 0 s, i.e. 1970: it became the trace's first
    submission, every other job 50 years later, and the run was refused for row 2's
    submission (`'1.842e+04d': at or after the end of the scenario`), not row 1's."""
    scenario = _helios(
        tmp_path,
        "1,u,v,8,1,1,COMPLETED,,2020-06-09 18:41:01,2020-06-10 04:55:09,1,0",
        "2,u,v,8,1,1,COMPLETED,2020-06-09 18:42:01,2020-06-09 18:43:01,2020-06-10 04:55:09,1,0")
    refused(invoke("validate", scenario), "row 1, column submit_time", "submission time")


def test_a_missing_pai_submission_does_not_shift_the_others(tmp_path: Path):
    """PAI's job start_time (its submission) empty on row 1: it was 0 s, so row 2's job was
    submitted 150 s into the run rather than 50 s after row 1's (shifted by the 100 s of
    the first submission)."""
    from clustersim.scenario.errors import WorkloadError
    from clustersim.scenario.traces import TraceMapping, TraceTarget, read_trace

    (tmp_path / "pai_job_table.csv").write_text(
        "j1,i1,u,Terminated,,200.0\nj2,i2,u,Terminated,150.0,300.0\n")
    (tmp_path / "pai_task_table.csv").write_text(
        "j1,worker,8.0,Terminated,110.0,200.0,600,29,100,V100\n"
        "j2,worker,2.0,Terminated,160.0,300.0,600,29,50,V100\n")
    try:
        read_trace(tmp_path / "pai_job_table.csv", "pai", TraceMapping(),
                   TraceTarget(64, 667.0, 64))
    except WorkloadError as error:
        assert "row 1, column start_time" in str(error)
    else:
        raise AssertionError("a PAI job without its submission time was replayed")


def test_now_is_not_a_time_of_a_trace(tmp_path: Path):
    """pandas reads "now" as the clock's time: an end_time of "now" replayed a 2020 job for
    six years of run time (and a different one every day)."""
    scenario = _helios(
        tmp_path, "1,u,v,8,1,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,now,1,0")
    refused(invoke("validate", scenario), "row 1, column end_time", "'now' is not a time")


def test_a_400_digit_philly_time_is_refused_not_an_overflow(tmp_path: Path):
    """A JSON integer too large for a float: OverflowError, exit 1 (internal error)."""
    (tmp_path / "p.json").write_text(
        '[{"status": "Pass", "vc": "v", "user": "u", "jobid": "a", "submitted_time": '
        + "9" * 400 + ', "attempts": []}]')
    result = invoke("validate", _trace_scenario(tmp_path, "p.json", "philly"))
    refused(result, "job 1 (jobid a), column submitted_time", "not a finite time")
    assert "9" * 100 not in result.stderr  # shown shortened


# 3. A template's run-time sigma of 1e6 overflowed exp -----------------------------------

MIX = {
    "name": "mix", "duration": "2d", "hardware": "trn2", "seed": 1,
    "cluster": {"instances": 16, "spares": 1},
    "scheduler": {"policy": "fairshare", "preemption": True},
    "teams": [{"name": "a", "quota": 8}, {"name": "b", "quota": 8, "share": 2}],
    "workload": {
        "arrivals": {"rate": "20/d", "count": 12},
        "templates": [{
            "name": "small", "weight": 3, "teams": {"a": 1, "b": 1},
            "instances": {"min": 1, "max": 4}, "run_for": {"median": "6h", "sigma": 1},
            "job": {"model": "llama3-8b", "seq_len": 4096, "recompute": "selective",
                    "parallelism": {"tp": 8, "pp": 1, "zero": 1,
                                    "sequence_parallel": True}}}]},
    "trace": {"bin": "10min"},
}


def test_a_huge_run_time_sigma_is_refused_with_its_limit(tmp_path: Path):
    """`--set workload.templates.0.run_for.sigma=1e6`: OverflowError: math range error (an
    internal error, exit 1); now refused at MAX_RUN_TIME_SIGMA."""
    scenario = write(tmp_path, MIX)
    refused(invoke("validate", scenario, "--set", "workload.templates.0.run_for.sigma=1e6"),
            "workload.templates.0.run_for.sigma", "10", "docs/limits.md")


# 4. Template (and team) weights whose sum overflows drew the first one every time -------


def test_weights_whose_sum_overflows_still_draw_in_proportion(tmp_path: Path):
    """Two templates of weight 1e308 (each valid: > 0, finite): their sum was inf, every
    share NaN, and every job came from the first template (12 of 12, and a RuntimeWarning);
    the same for a template's team weights. Equal weights now draw both."""
    import copy

    from clustersim.scenario.loader import scenario_from_dict

    raw = copy.deepcopy(MIX)
    small = raw["workload"]["templates"][0]
    small["weight"] = 1e308
    small["teams"] = {"a": 1e308, "b": 1e308}
    raw["workload"]["templates"].append(dict(small, name="big"))
    raw["workload"]["arrivals"] = {"rate": "1/h", "count": 40}
    raw["duration"] = "3d"
    jobs = scenario_from_dict(raw).jobs
    templates = {job.name.split("-")[0] for job in jobs}
    teams = {job.team for job in jobs}
    assert templates == {"small", "big"} and teams == {"a", "b"}


# 5. format: pai on a file not named *job_table*: the message named that file as the task table


def test_pai_on_a_file_without_job_table_in_its_name_says_so(tmp_path: Path):
    """`no task table beside it (h.csv)` named the job table given as the missing task
    table; it now says the name has no job_table to find the task table by."""
    shutil.copy(TRACES / "helios-sample.csv", tmp_path / "h.csv")
    result = invoke("validate", _trace_scenario(tmp_path, "h.csv", "pai"))
    refused(result, "h.csv: its name has no job_table", "pai_task_table.csv")
    assert "beside it (h.csv)" not in result.stderr


# 6. A bad seed beside a workload was refused as `workload` (or crashed) ----------------


def test_a_bad_seed_beside_a_workload_is_refused_as_the_seed(tmp_path: Path):
    """With a workload, `seed: nan` was "workload: invalid literal for int() with base 10:
    'nan'", `seed: -1` "workload: expected non-negative integer" and `seed: [1]` a
    TypeError (exit 1): the mix was drawn with int(seed) before the seed was validated."""
    scenario = write(tmp_path, MIX)
    for value, words in (("nan", "expected a whole number"), ("-1", "greater than or equal"),
                         ("[1]", "expected a whole number")):
        result = invoke("validate", scenario, "--set", f"seed={value}")
        refused(result, "seed = ", words)
        assert "workload" not in result.stderr


def test_a_bad_cluster_size_beside_a_trace_is_refused_as_the_size(tmp_path: Path):
    """The trace's size bound read cluster.ultraservers with int(): `nan` was "workload:
    invalid literal for int()", `[1]` a TypeError (exit 1), `-2` "expected at most -8,192
    GPUs" against row 1 and `1.5` a trace row "more than the cluster's 4" instances."""
    shutil.copy(TRACES / "helios-sample.csv", tmp_path / "h.csv")
    scenario = _trace_scenario(tmp_path, "h.csv", "helios")
    for value in ("nan", "[1]", "-2", "1.5"):
        result = invoke("validate", scenario, "--set", f"cluster.ultraservers={value}")
        refused(result, "cluster.ultraservers = ")
        assert "workload" not in result.stderr, result.stderr


# 7. An Acme fail_time before the start was reported as end_time ------------------------

ACME_HEADER = ("job_id,user,node_num,gpu_num,cpu_num,mem_per_pod_GB,shared_mem_per_pod,type,"
               "state,submit_time,start_time,end_time,fail_time,stop_time,duration,queue,"
               "gpu_time")


def test_an_acme_fail_time_before_the_start_names_fail_time(tmp_path: Path):
    """The end_time was after the start; the fail_time (taken as the end, being earlier)
    was before it, and the message named `column end_time`, which was fine (and Philly's
    `attempts.end_time` is now named as such)."""
    (tmp_path / "a.csv").write_text(
        ACME_HEADER + "\nj1,u,8,64,1,1,1,Pretrain,FAILED,2023-05-17 11:00:58+00:00,"
        "2023-05-17 11:01:08+00:00,2023-05-17 19:01:16+00:00,2023-05-17 10:01:16+00:00,,1,1,1\n")
    result = invoke("validate", _trace_scenario(tmp_path, "a.csv", "acme"))
    refused(result, "row 1, column fail_time", "before it starts")


# 8. A count of arrivals reaching past the horizon was drawn whole, then refused job by job


def test_arrivals_past_the_horizon_are_refused_as_soon_as_one_is_drawn(tmp_path: Path):
    """count 1,000,000 at 1/d over 2 days: a million jobs were drawn and validated (40 s
    of CPU, 81 s wall) to be refused as `workload.templates.0.job.submit ... (and 999997
    more jobs the workload generated)`; the third arrival is now refused as arrivals."""
    import time

    scenario = write(tmp_path, MIX)
    started = time.process_time()
    result = invoke("validate", scenario, "--set", "workload.arrivals.count=1000000",
                    "--set", "workload.arrivals.rate=1/d")
    refused(result, "workload.arrivals", "job 3 of count 1,000,000",
            "at or after the end of the scenario (2d)")
    assert time.process_time() - started < 10


# 9. PAI's header row behind a byte-order mark (or quoted) was read as a job -------------


def test_a_pai_header_row_behind_a_byte_order_mark_is_a_header(tmp_path: Path):
    """A header row is accepted (the published tables have none), but one saved with a
    UTF-8 byte-order mark or quoted names was read as a job: "row 1, column start_time:
    'start_time' is not a time"."""
    from clustersim.scenario.traces import TraceMapping, TraceTarget, read_trace

    jobs = (TRACES / "pai_job_table.csv").read_bytes()
    shutil.copy(TRACES / "pai_task_table.csv", tmp_path / "pai_task_table.csv")
    for header in (b"\xef\xbb\xbfjob_name,inst_id,user,status,start_time,end_time\n",
                   b'"job_name","inst_id","user","status","start_time","end_time"\n'):
        (tmp_path / "pai_job_table.csv").write_bytes(header + jobs)
        replayed, stats = read_trace(tmp_path / "pai_job_table.csv", "pai", TraceMapping(),
                                     TraceTarget(64, 667.0, 64))
        assert stats["rows"] == jobs.count(b"\n")


def test_a_philly_log_behind_a_byte_order_mark_is_read(tmp_path: Path):
    """`cannot read it as JSON (Unexpected UTF-8 BOM ...)`, exit 2 on a well-formed log."""
    (tmp_path / "p.json").write_bytes(b"\xef\xbb\xbf" + (TRACES / "philly-sample.json")
                                      .read_bytes())
    result = invoke("validate", _trace_scenario(tmp_path, "p.json", "philly"))
    assert result.exit_code == 0, result.stderr


# 10. elastic without a fluid deployment was accepted and did nothing ---------------------


def test_an_elastic_job_without_fluid_serving_is_refused(tmp_path: Path):
    """`jobs.0.elastic: {min_dp: 2}` on a run without fluid deployments validated and ran
    with the job at its size (0 shrinks, no word of it), where beside a workload with fluid
    deployments the same key is refused: elastic jobs shrink for serving at the fleet-day
    level only."""
    refused(invoke("validate", ROOT / "scenarios" / "quickstart.yaml", "--set",
                   "jobs.0.elastic={min_dp: 2}"),
            "jobs.0.elastic = {min_dp: 2}", "expected no elastic key")


# 11. A job larger than a cluster of sites counted 0 spares --------------------------------


def test_a_job_larger_than_the_sites_counts_their_spares(tmp_path: Path):
    """Over sites the spares are given per site (cluster.spares is 0): the message said
    "the cluster has 44 (plus 0 spares)" with 4 spares in west."""
    raw = {"name": "s", "hardware": "trn2u", "duration": "1d",
           "cluster": {"fabric": {"spines": 4, "instances_per_leaf": 16},
                       "sites": [{"name": "east", "ultraservers": 8},
                                 {"name": "west", "ultraservers": 3, "spares": 4}],
                       "inter_site": {"links": [{"sites": ["east", "west"],
                                                 "bandwidth": "800Gbps", "latency": "5ms"}]}},
           "jobs": [{"name": "big", "model": "llama3-8b", "global_batch": 1024,
                     "instances": 64, "recompute": "selective",
                     "parallelism": {"tp": 64, "dp": 64, "zero": 1}}],
           "trace": {"enabled": False}}
    refused(invoke("validate", write(tmp_path, raw)), "the cluster has 44 (plus 4 spares)")


# 12. The trace-size refusal advised dropping levels the trace did not have ----------------


def test_the_trace_size_refusal_names_the_levels_written(tmp_path: Path):
    """Ten years of [cluster, job] at 10 min: "drop the instance/ultraserver levels", which
    it did not write; the job level is what to drop."""
    import copy

    raw = copy.deepcopy(MIX)
    raw["duration"] = "10y"
    raw["workload"]["arrivals"]["count"] = 80  # 81 keys x 525,600 bins: 42.6 M rows
    raw["trace"] = {"bin": "10min", "levels": ["cluster", "job"]}
    result = invoke("run", write(tmp_path, raw), "-o", tmp_path / "out")
    refused(result, "rows", "drop the job level")
    assert "instance/ultraserver" not in result.stderr


# 13. Serving without the timeline's outages ignored the sites' hot spares -----------------


def test_serving_trials_over_sites_take_the_sites_hot_spares():
    """Replica failures drawn from the rates (`run --find-rate`'s and the serving planner's
    trials, which run no timeline) are down for detection and restart when a hot spare
    takes the instance's place, else for the repair too. Over sites the spares are the
    sites' own (cluster.spares is 0), and a replica waited for the 2-day repair: 1,926 of
    14,303 requests completed, against 14,301 on one site with the same spares."""
    import copy

    import numpy as np

    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving.simulate import deployment_figures, simulate_serving

    base = {"name": "sv", "hardware": "trn2", "duration": "2h", "seed": 1,
            "failures": {"preset": "llama3", "scale": 10000, "detect": "1min",
                         "restart": "2min", "repair": "2d"},
            "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
                       "replicas": 1, "slo": {"ttft": "2s", "tpot": "100ms"},
                       "workload": {"rate": "2/s", "input_tokens": 512, "output_tokens": 64}}],
            "trace": {"enabled": False}}
    one, sites = copy.deepcopy(base), copy.deepcopy(base)
    one["cluster"] = {"instances": 6, "spares": 2}
    sites["cluster"] = {
        "fabric": {"instances_per_leaf": 4},
        "sites": [{"name": "e", "instances": 2, "spares": 2}, {"name": "w", "instances": 4}],
        "inter_site": {"links": [{"sites": ["e", "w"], "bandwidth": "800Gbps",
                                  "latency": "5ms"}]}}
    completed = []
    for raw in (one, sites):
        scenario = scenario_from_dict(raw)
        result = simulate_serving(scenario, np.random.SeedSequence(1, spawn_key=(16,)))
        completed.append(deployment_figures(scenario, result)["chat"]["requests_completed"])
    assert completed[1] == completed[0]


# 14. A partition's share was accepted and did nothing ------------------------------------


def test_a_share_on_a_partition_is_refused():
    """`{kind: partition, share: 0.5}` validated and cut the whole site off (the share is
    for power and cooling events, which down that part of the site)."""
    import pytest

    from clustersim.hardware.sites import SiteEventSpec

    assert SiteEventSpec.model_validate({"kind": "power", "rate": "1/d", "share": 0.5,
                                         "duration": "1h"}).share == 0.5
    with pytest.raises(ValueError, match="partition cuts the whole site off"):
        SiteEventSpec.model_validate({"kind": "partition", "rate": "1/d", "share": 0.5,
                                      "duration": "1h"})


# 15. report drew another run's job_summary.parquet beside this run's summary -------------


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_report_refuses_another_runs_job_summary(tmp_path: Path):
    """A job_summary.parquet of 30 jobs copied into a run of 80 was drawn (the fleet plot of
    the other run, under this run's summary); its count is now checked against the summary's
    `cluster.jobs`."""
    import copy

    small, large = copy.deepcopy(MIX), copy.deepcopy(MIX)
    small["workload"]["arrivals"]["count"] = 3
    for raw, out in ((small, "a"), (large, "b")):
        raw["name"] = out
        assert invoke("run", write(tmp_path, raw, f"{out}.yaml"), "-o",
                      tmp_path / out).exit_code == 0
    shutil.copy(tmp_path / "a" / "job_summary.parquet", tmp_path / "b" / "job_summary.parquet")
    refused(invoke("report", tmp_path / "b"), "job_summary.parquet",
            "3 jobs where summary.json counts 12")
    assert invoke("report", tmp_path / "a").exit_code == 0


# 17. a mapping key its rule never reads was accepted and did nothing ---------------------


def test_a_mapping_key_its_rule_does_not_read_is_refused(tmp_path: Path):
    """`gpu` under rule instances and `gpus_per_instance` under rule compute were accepted and
    read by nothing; the rule that reads each still takes it."""
    for rule, key, value in (("instances", "gpu", "p5en"), ("compute", "gpus_per_instance", 4)):
        path = _trace_scenario(tmp_path, str(TRACES / "philly-sample.json"), "philly")
        result = invoke("validate", path, "--set", f"workload.mapping.rule={rule}",
                        "--set", f"workload.mapping.{key}={value}")
        refused(result, "workload.mapping", key, f"rule is {rule}")
    for rule, key, value in (("compute", "gpu", "p5en"), ("instances", "gpus_per_instance", 4)):
        result = invoke("validate", path, "--set", f"workload.mapping.rule={rule}",
                        "--set", f"workload.mapping.{key}={value}")
        assert result.exit_code == 0, result.stderr


# 18. the run table of a run past 2,000 jobs counted the jobs listed, not the jobs -------


def test_the_run_table_counts_every_job_and_says_whose_means_it_shows():
    """Past 2,000 jobs summary.json lists the 100 largest; the run table printed 'jobs 100:
    999,983 done, ...' for the Rainier year's million, and its ETTR mean and slowdowns (over
    the listed jobs only) as if they were every job's."""
    from cli_helpers import run_table_text as shown

    job = {"start_s": 0.0, "ettr": 0.5, "slowdown": 2.0}
    listed = {"jobs": {"a": job, "b": job},
              "cluster": {"jobs": 3000, "jobs_by_status": {"done": 3000}},
              "jobs_listed": "the 2 largest of 3,000 jobs; every job is in job_summary.parquet"}
    text = shown(listed)
    assert "jobs 3,000: 3,000 done" in text, text
    assert "over started jobs of the 2 largest" in text and "alone of the 2 largest" in text
    every = {"jobs": {"a": job, "b": job},
             "cluster": {"jobs": 2, "jobs_by_status": {"done": 2}}}
    text = shown(every)
    assert "jobs 2: 2 done" in text and "largest" not in text, text


# 19. a run shorter than a minute was refused for a trace bin the user never wrote ---------


def test_a_run_shorter_than_the_default_bin_runs_in_one_bin(tmp_path: Path):
    """`duration: 30s` was refused as "trace.bin = '1min': longer than the scenario's
    duration": the default bin now shrinks to the duration; a bin written longer is refused."""
    import pandas as pd

    raw = {"name": "short", "duration": "30s", "hardware": "trn2", "cluster": {"instances": 1},
           "jobs": [{"name": "a", "model": "llama3-8b", "global_batch": 16, "instances": 1,
                     "parallelism": {"tp": 8, "dp": 8, "zero": 1}}]}
    path = write(tmp_path, raw)
    result = invoke("run", path, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    bins = pd.read_parquet(tmp_path / "out" / "utilisation.parquet")["bin_s"]
    assert set(bins) == {30.0}
    refused(invoke("run", path, "--set", "trace.bin=1min", "-o", tmp_path / "again"),
            "trace.bin", "longer than the scenario's duration")
