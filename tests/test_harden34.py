"""Issue 34 part A: the newer surfaces lose no user data, read published traces within their
bounds and exactly as written, and name files, rows and columns in their refusals. One test
(or a few) per defect of the issue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_helpers import SMALL, invoke, refused, write

ROOT = Path(__file__).resolve().parent.parent


# 2. Data loss -----------------------------------------------------------------------------

@pytest.mark.slow  # three drawings: over 5 s
def test_topology_draw_keeps_an_existing_file_without_force(tmp_path: Path):
    scenario = write(tmp_path, SMALL)
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"my picture")
    refused(invoke("topology", scenario, "--draw", mine), "--draw", "--force")
    assert mine.read_bytes() == b"my picture"
    link = tmp_path / "link.png"
    link.symlink_to(mine)
    refused(invoke("topology", scenario, "--draw", link), "--force")
    assert mine.read_bytes() == b"my picture" and link.is_symlink()
    result = invoke("topology", scenario, "--draw", mine, "--force")
    assert result.exit_code == 0, result.output
    assert mine.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.png", "mine.png",
                                                          "scenario.yaml"]


def test_schema_keeps_an_existing_file_without_force(tmp_path: Path):
    mine = tmp_path / "schema.json"
    mine.write_text("mine", encoding="utf-8")
    refused(invoke("schema", "-o", mine), "-o", "--force")
    assert mine.read_text(encoding="utf-8") == "mine"
    assert invoke("schema", "-o", mine, "--force").exit_code == 0
    assert json.loads(mine.read_text(encoding="utf-8"))["title"]
    fresh = tmp_path / "new.json"
    assert invoke("schema", "-o", fresh).exit_code == 0 and fresh.is_file()


def test_run_refuses_an_output_folder_holding_its_scenario_even_with_force(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    scenario = write(work, SMALL)
    (work / "notes.txt").write_text("mine", encoding="utf-8")
    for out in (work, tmp_path):
        refused(invoke("run", scenario, "-o", out, "--force"), "holds", "input")
        assert scenario.is_file() and (work / "notes.txt").is_file()


def test_run_refuses_an_output_folder_holding_its_trace(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    trace = data / "philly.json"
    trace.write_text((ROOT / "scenarios/traces/philly-sample.json").read_text("utf-8"),
                     encoding="utf-8")
    raw = yaml.safe_load((ROOT / "scenarios/trace-philly.yaml").read_text("utf-8"))
    raw["workload"]["trace"] = str(trace)
    scenario = write(tmp_path, raw)
    refused(invoke("run", scenario, "-o", data, "--force"), "holds", "philly.json")
    assert trace.is_file()


# 3. Memory and size -----------------------------------------------------------------------

def _trace_scenario(folder: Path, fmt: str, trace: Path, **workload) -> Path:
    raw = yaml.safe_load((ROOT / f"scenarios/trace-{fmt}.yaml").read_text("utf-8"))
    raw["workload"]["trace"] = str(trace)
    raw["workload"].update(workload)
    raw["trace"] = {"enabled": False}
    return write(folder, raw)


def test_a_trace_linked_to_a_proc_file_is_read_within_the_bound(tmp_path: Path, monkeypatch):
    # /proc files say 0 bytes: the size check passed and the reader grew past 4.5 GB.
    monkeypatch.setattr("clustersim.hardware.limits.MAX_TRACE_FILE_BYTES", 100)
    for fmt in ("helios", "philly", "native"):
        link = tmp_path / f"{fmt}.trace"
        link.symlink_to("/proc/self/status")  # about 1.4 kB, said to be 0
        refused(invoke("validate", _trace_scenario(tmp_path, fmt, link)),
                str(link), "more than 100 bytes")


def test_a_trace_linked_to_an_endless_proc_file_is_refused(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("clustersim.hardware.limits.MAX_TRACE_FILE_BYTES", 2**20)
    link = tmp_path / "pagemap.json"
    link.symlink_to("/proc/self/pagemap")  # terabytes if read whole
    refused(invoke("validate", _trace_scenario(tmp_path, "philly", link)),
            "more than 1,048,576 bytes")


def test_the_pai_task_table_is_held_to_the_trace_size_limit(tmp_path: Path, monkeypatch):
    for name in ("pai_job_table.csv", "pai_task_table.csv"):
        (tmp_path / name).write_bytes((ROOT / "scenarios/traces" / name).read_bytes())
    tasks = tmp_path / "pai_task_table.csv"
    row = tasks.read_text("utf-8").splitlines()[0]
    tasks.write_text("\n".join([row.replace("4b3f04b66a525d2df903eb16", f"j{i}")
                                for i in range(40)]) + "\n", encoding="utf-8")
    monkeypatch.setattr("clustersim.hardware.limits.MAX_TRACE_FILE_BYTES", 1000)
    assert (tmp_path / "pai_job_table.csv").stat().st_size < 1000 < tasks.stat().st_size
    result = invoke("validate", _trace_scenario(tmp_path, "pai",
                                                tmp_path / "pai_job_table.csv"))
    refused(result, "pai_task_table.csv", "at most 1,000")
    assert "pai_job_table.csv:" not in result.stderr


# 4. Trace parsing --------------------------------------------------------------------------

PHILLY = json.loads((ROOT / "scenarios/traces/philly-sample.json").read_text("utf-8"))
HELIOS = (ROOT / "scenarios/traces/helios-sample.csv").read_text("utf-8").splitlines()


def _philly(tmp_path: Path, jobs) -> Path:
    trace = tmp_path / "philly.json"
    trace.write_text(jobs if isinstance(jobs, str) else json.dumps(jobs), encoding="utf-8")
    return _trace_scenario(tmp_path, "philly", trace)


def _helios(tmp_path: Path, lines: list[str], **workload) -> Path:
    trace = tmp_path / "helios.csv"
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return _trace_scenario(tmp_path, "helios", trace, **workload)


def test_philly_gpus_given_as_text_are_refused_not_counted_by_character(tmp_path: Path):
    jobs = json.loads(json.dumps(PHILLY))
    jobs[0]["attempts"][-1]["detail"][0]["gpus"] = "gpu0,gpu1"
    refused(invoke("validate", _philly(tmp_path, jobs)), "philly.json", "job 1",
            "attempts.detail.gpus", "expected a list")


def test_a_boolean_submit_time_is_not_one_second(tmp_path: Path):
    jobs = json.loads(json.dumps(PHILLY))
    jobs[0]["submitted_time"] = True
    refused(invoke("validate", _philly(tmp_path, jobs)), "job 1", "submitted_time",
            "True is not a time")


def test_digits_of_other_scripts_are_not_numbers(tmp_path: Path):
    lines = [HELIOS[0], HELIOS[1].replace(",8,16,", ",\u0668,16,", 1), *HELIOS[2:]]
    refused(invoke("validate", _helios(tmp_path, lines)), "helios.csv", "row 1",
            "gpu_num", "is not a number")


def test_native_job_names_are_kept_as_written(tmp_path: Path):
    from clustersim.scenario.loader import load_scenario

    trace = tmp_path / "native.csv"
    trace.write_text("name,submit,instances,template,run_for\n007,0,1,research,1h\n"
                     "1e3,10,1,research,1h\n", encoding="utf-8")
    scenario = load_scenario(_trace_scenario(tmp_path, "native", trace))
    assert [job.name for job in scenario.jobs] == ["007", "1e3"]


def test_trace_times_beyond_the_calendar_range_are_refused(tmp_path: Path):
    first = HELIOS[1].replace("2020-06-09 18:41:01,2020-06-09", "0001-01-01 00:00:00,2020-06-09",
                              1)
    refused(invoke("validate", _helios(tmp_path, [HELIOS[0], first, *HELIOS[2:]])),
            "row 1", "submit_time", "year 1;")
    last = HELIOS[-1].replace("2020-06-11 02:20:00", "9999-12-31 23:59:59")
    refused(invoke("validate", _helios(tmp_path, [*HELIOS[:-1], last])), "row 5",
            "end_time", "year 9999")


def test_a_philly_file_nested_too_deep_is_refused(tmp_path: Path):
    refused(invoke("validate", _philly(tmp_path, "[" * 100_000 + "]" * 100_000)),
            "philly.json", "nested too deeply")
    # a file that is not JSON names the key, as a missing one does
    refused(invoke("validate", _philly(tmp_path, "[{]")), "workload.trace", "philly.json",
            "cannot read it as JSON")


def test_a_huge_gpu_count_is_refused_with_a_short_message(tmp_path: Path):
    lines = [HELIOS[0], HELIOS[1].replace(",8,16,", ",1e300,16,", 1), *HELIOS[2:]]
    result = invoke("validate", _helios(tmp_path, lines))
    refused(result, "row 1", "gpu_num", "1e+300 GPUs; expected at most")
    assert len(result.stderr) < 400, result.stderr


def test_trace_row_errors_name_the_file_row_and_column(tmp_path: Path):
    trace = tmp_path / "native.csv"
    trace.write_text("name,submit,instances,template,run_for\na,0,1,research,1h\n"
                     "b,2h,1,research,1h\n", encoding="utf-8")
    scenario = _trace_scenario(tmp_path, "native", trace, templates=yaml.safe_load(
        (ROOT / "scenarios/trace-native.yaml").read_text("utf-8"))["workload"]["templates"])
    raw = yaml.safe_load(scenario.read_text("utf-8"))
    raw["duration"] = "1h"
    result = invoke("validate", write(tmp_path, raw))
    refused(result, "native.csv, row 2, column submit", "end of the scenario")
    assert "jobs." not in result.stderr


def test_template_errors_name_the_template_key(tmp_path: Path):
    raw = yaml.safe_load((ROOT / "scenarios/trace-helios.yaml").read_text("utf-8"))
    raw["workload"]["trace"] = str(ROOT / "scenarios/traces/helios-sample.csv")
    raw["workload"]["templates"][0]["job"]["recompute"] = "bogus"
    result = invoke("validate", write(tmp_path, raw))
    refused(result, "workload.templates.0.job.recompute", "bogus")
    assert "jobs." not in result.stderr


def test_a_trace_that_is_a_folder_is_not_called_a_yaml_file(tmp_path: Path):
    folder = tmp_path / "helios"
    folder.mkdir()
    result = invoke("validate", _trace_scenario(tmp_path, "helios", folder))
    refused(result, "is a directory")
    assert "YAML" not in result.stderr


# 5. Traces as published (issue 33, item 4) ----------------------------------------------

def _philly_as_published(tmp_path: Path) -> Path:
    """The sample with what the real cluster_job_log has: attempts whose times are "None",
    a CPU-only job and a job without attempts (the sample's job 3)."""
    jobs = json.loads(json.dumps(PHILLY))
    jobs[0]["attempts"].append({"start_time": "None", "end_time": "None", "detail": []})
    jobs[1]["attempts"][-1]["end_time"] = "None"
    jobs.append({"status": "Killed", "vc": "b436b2", "jobid": "never", "user": "x",
                 "submitted_time": "2017-10-08 01:00:00",
                 "attempts": [{"start_time": "None", "end_time": "None", "detail": []}]})
    jobs.append({"status": "Pass", "vc": "b436b2", "jobid": "cpu", "user": "x",
                 "submitted_time": "2017-10-08 02:00:00",
                 "attempts": [{"start_time": "2017-10-08 02:00:00",
                               "end_time": "2017-10-08 03:00:00",
                               "detail": [{"ip": "m1", "gpus": []}]}]})
    trace = tmp_path / "cluster_job_log"
    trace.write_text(json.dumps(jobs), encoding="utf-8")
    return trace


def test_philly_as_published_replays_without_a_template_and_counts_what_it_left_out(
        tmp_path: Path):
    trace = _philly_as_published(tmp_path)
    scenario = write(tmp_path, {"name": "philly", "hardware": "trn2u", "duration": "4d",
                                "cluster": {"ultraservers": 16}, "trace": {"enabled": False},
                                "workload": {"trace": trace.name, "format": "philly"}})
    result = invoke("run", scenario, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out/summary.json").read_text("utf-8"))
    assert summary["trace_rows"] == {
        "format": "philly", "rows": 6, "replayed": 3, "ended_at_trace_end": 1,
        "left_out": {"no_attempts": 1, "never_started": 1, "no_gpus": 1, "zero_length": 0,
                     "after_end": 0}}
    assert "3 of 6 rows replayed" in result.stdout
    assert "left out: 1 no" in result.stdout
    jobs = summary["jobs"]
    assert len(jobs) == 3 and all(j["model"] == "llama3-8b" for j in jobs.values())
    # job 2's only attempt has no end: it runs from its start (02:00:00 on the 7th) to the
    # trace's latest time (job 1's end, 06:53:12 on the 9th): 52 h 53 min 12 s
    second = jobs["philly-application_1506638472019_14200"]
    assert second["end_s"] - second["start_s"] == 52 * 3600 + 53 * 60 + 12


def test_pai_given_as_its_folder_replays(tmp_path: Path):
    folder = tmp_path / "pai"
    folder.mkdir()
    for name in ("pai_job_table.csv", "pai_task_table.csv"):
        (folder / name).write_bytes((ROOT / "scenarios/traces" / name).read_bytes())
    from clustersim.scenario.loader import load_scenario

    scenario = load_scenario(_trace_scenario(tmp_path, "pai", folder))
    assert len(scenario.jobs) == 3
    assert scenario.trace_rows["replayed"] == 3


# 7. .gitignore keeps the goldens only --------------------------------------------------

def test_gitignore_tracks_the_goldens_and_no_other_run(tmp_path: Path):
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    # The goldens: the tracked results/<name>/summary.json; a run of any other name is not.
    goldens = subprocess.run(["git", "ls-files", "results/*/summary.json"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    assert len(goldens) >= 20
    others = ["results/quickstart/summary.json", "results/my-run/summary.json"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *goldens, *others],
                             cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert ignored == others


# 6. Messages and outputs ----------------------------------------------------------------

def test_a_duplicate_site_name_is_reported_under_the_sites_key(tmp_path: Path):
    raw = yaml.safe_load((ROOT / "scenarios/sites-spread.yaml").read_text("utf-8"))
    raw["cluster"]["sites"][1]["name"] = raw["cluster"]["sites"][0]["name"]
    result = invoke("validate", write(tmp_path, raw))
    refused(result, "cluster.sites.1.name", "named twice")
    assert "inter_site" not in result.stderr


FAILING = {
    "name": "failing", "hardware": "trn2", "duration": "2d", "seed": 1,
    "cluster": {"instances": 4, "spares": 1},
    "jobs": [{"name": f"j{i}", "model": "llama3-8b", "global_batch": 16, "instances": 1,
              "parallelism": {"tp": 8, "dp": 8, "zero": 1},
              "checkpoint": {"interval": "1h", "write": "30s"}} for i in range(3)],
    "failures": {"preset": "llama3", "scale": 200},
    "trace": {"enabled": True, "levels": ["cluster", "job"]},
}


@pytest.mark.slow  # a run with failures and its report: over 5 s
def test_report_on_a_run_whose_summary_lists_only_some_jobs(tmp_path: Path):
    # Past 2,000 jobs summary.json lists the 100 largest; the plot around the first failure
    # looked every job up there (KeyError 'l1', exit 1).
    out = tmp_path / "run"
    assert invoke("run", write(tmp_path, FAILING), "-o", out).exit_code == 0
    summary = json.loads((out / "summary.json").read_text("utf-8"))
    assert sum(summary["cluster"]["failures"].values()) > 0
    summary["jobs"] = {"j0": summary["jobs"]["j0"]}
    summary["jobs_listed"] = "the 1 largest of 3 jobs"
    (out / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    result = invoke("report", out)
    assert result.exit_code == 0, result.output
    assert (out / "report/first_failure.png").is_file()


def test_the_api_reads_job_summary_and_jobs_has_the_team(tmp_path: Path):
    from clustersim.analysis.runs import load_run

    raw = json.loads(json.dumps(FAILING))
    raw["jobs"][0]["team"] = "vision"
    raw["failures"] = {"preset": "llama3"}
    out = tmp_path / "run"
    assert invoke("run", write(tmp_path, raw), "-o", out).exit_code == 0
    run = load_run(out)
    summary = run.table("job_summary")
    assert list(summary["name"]) == ["j0", "j1", "j2"]
    assert run.job_summary is not None and len(run.job_summary) == 3
    assert list(run.jobs["team"]) == ["vision", "-", "-"]


def test_money_on_an_axis_has_no_exponent():
    from clustersim.planning.outputs import usd_formatter

    usd = usd_formatter()
    assert usd(1e9, 0) == "$1B" and usd(999_999, 0) == "$1M" and usd(2.5e6, 0) == "$2.5M"
    assert usd(123_456, 0) == "$123k" and usd(42, 0) == "$42"
    for exponent in range(-2, 16):
        for mantissa in (1, 2.5, 9.99, 9.999):
            assert "e" not in usd(mantissa * 10.0**exponent, 0)


def _day_figure(tmp_path: Path, monkeypatch, replicas: list[int]):
    import numpy as np
    import pandas as pd

    from clustersim.analysis import fleetday as day_report

    hours = np.arange(len(replicas)) * 3600.0
    pd.DataFrame({"deployment": "chat", "time_s": hours, "load_per_s": 10.0,
                  "replicas": replicas, "slo_attainment": 1.0}).to_parquet(
        tmp_path / "day.parquet")
    pd.DataFrame({"time_s": hours, **{f"{s}_chips": 16.0 for s in day_report._STATES}}
                 ).to_parquet(tmp_path / "fleet.parquet")
    kept = []
    monkeypatch.setattr(day_report.plt, "close", kept.append)
    day_report.plot_day(tmp_path, "day", tmp_path / "day.png")
    return kept[0].axes[1]


def test_the_day_plots_replica_axis_has_ticks(tmp_path: Path, monkeypatch):
    axis = _day_figure(tmp_path, monkeypatch, [1, 2, 4, 8, 6, 3])
    low, high = axis.get_ylim()
    ticks = [t for t in axis.get_yticks() if low <= t <= high]
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), ticks


def _sixteen_sites() -> dict:
    names = [f"s{i:02d}" for i in range(16)]
    return {"name": "sixteen", "hardware": "trn2u", "duration": "1d",
            "cluster": {"fabric": {"instances_per_leaf": 4},
                        "sites": [{"name": n, "ultraservers": 1} for n in names],
                        "inter_site": {"backbone": {"bandwidth": "100Gbps", "latency": "8ms"},
                                       "links": [
                            {"sites": [names[i], names[(i + 1) % 16]], "bandwidth": "400Gbps",
                             "latency": "5ms"} for i in range(16)]}},
            "jobs": [{"name": "train", "model": "llama3-8b", "global_batch": 64,
                      "instances": 4, "parallelism": {"tp": 8, "dp": 32, "zero": 1}}],
            "trace": {"enabled": False}}


@pytest.mark.slow  # a 16-site topology drawn: over 5 s
def test_the_sites_drawing_keeps_sixteen_discs_apart_and_every_link_visible(
        tmp_path: Path, monkeypatch):
    import math

    from clustersim.analysis import sites as drawing

    kept = []
    monkeypatch.setattr(drawing.plt, "close", kept.append)
    result = invoke("topology", write(tmp_path, _sixteen_sites()), "--draw",
                    tmp_path / "sites.png")
    assert result.exit_code == 0, result.output
    (fig,) = kept
    ax = fig.axes[0]
    fig.canvas.draw()
    scale = 72 / fig.dpi  # display pixels to points
    discs = []  # (centre in points, radius in points)
    for collection in ax.collections:
        (size,) = collection.get_sizes()
        (centre,) = ax.transData.transform(collection.get_offsets())
        if collection.get_facecolor()[0][1] > 0.45:  # the green site discs, not the hub
            discs.append((centre * scale, math.sqrt(size) / 2))
    assert len(discs) == 16
    for i in range(16):
        (a, ra), (b, rb) = discs[i], discs[(i + 1) % 16]
        gap = math.dist(a, b) - ra - rb
        assert gap > 5, (i, gap)  # apart, and the link between them shows over the gap
    # each link's label (a white box) beside its link, not over it
    labels = [t.xy for t in ax.texts if "Gbps" in t.get_text() and "backbone" not in
              t.get_text()]
    assert len(labels) == 16
    centres = [ax.transData.inverted().transform(c / scale) for c, _ in discs]
    for i in range(16):
        middle = (centres[i] + centres[(i + 1) % 16]) / 2
        assert min(math.dist(middle, xy) for xy in labels) > 0.1, i


@pytest.mark.filterwarnings("error::UserWarning")  # nor a warning on stderr
def test_a_long_bar_note_is_not_clipped(tmp_path: Path):
    import matplotlib.image

    from clustersim.analysis import report

    note = "ETTR 50.0% (too small to see: " + ", ".join(
        f"cause {i} 0.001 h" for i in range(25)) + ")"
    rows = [("a-job-with-a-long-name", [(5.0, "useful", "#2e7d32"), (1.0, "down", "#c62828")],
             note)]
    kept = []
    original = report._stacked_bars.__globals__["_save"]

    def keep(fig, path, tight=True):
        fig.canvas.draw()
        kept.append(max(t.get_window_extent().x1 for t in fig.axes[0].texts))
        return original(fig, path, tight)

    report._stacked_bars.__globals__["_save"] = keep
    try:
        path = report._stacked_bars(rows, "hours", "where the hours went", tmp_path / "h.png")
    finally:
        report._stacked_bars.__globals__["_save"] = original
    width_px = matplotlib.image.imread(path).shape[1]
    assert width_px >= kept[0] * 110 / 100, (width_px, kept[0])  # 100 dpi drawn, 110 saved


def test_plan_refuses_an_output_folder_holding_its_scenario_even_with_force(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    scenario = write(work, SMALL)
    refused(invoke("plan", scenario, "-o", work, "--force"), "holds", "input")
    assert scenario.is_file()


def test_a_template_with_tp_0_is_refused_under_its_key(tmp_path: Path):
    # The fuzz (3,000 cases): a trace's template with `tp: 0` divided by zero (exit 1).
    raw = yaml.safe_load((ROOT / "scenarios/trace-helios.yaml").read_text("utf-8"))
    raw["workload"]["trace"] = str(ROOT / "scenarios/traces/helios-sample.csv")
    for key, value in (("tp", 0), ("pp", 0), ("tp", "x")):
        raw["workload"]["templates"][0]["job"]["parallelism"][key] = value
        refused(invoke("validate", write(tmp_path, raw)),
                f"workload.templates.0.job.parallelism.{key}")
        raw["workload"]["templates"][0]["job"]["parallelism"][key] = 1
