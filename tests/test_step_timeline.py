"""`clustersim step --timeline`: one step as a Chrome trace event file, checked against the step
table (`step --json`): per category the slices of the critical stage add up to the table's
figure, and the step spans 0 to the step time."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from cli_helpers import refused
from typer.testing import CliRunner

import clustersim
from clustersim.analysis.step_timeline import CATEGORIES
from clustersim.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def timeline_and_table(tmp_path: Path, scenario: Path, *sets: str) -> tuple[dict, dict]:
    options = [x for s in sets for x in ("--set", s)]
    path = tmp_path / "step.json"
    result = invoke("step", scenario, *options, "--timeline", path)
    assert result.exit_code == 0, result.stdout + result.stderr
    table = invoke("step", scenario, *options, "--json")
    assert table.exit_code == 0, table.stdout
    return json.loads(path.read_text()), {j["name"]: j for j in json.loads(table.stdout)["jobs"]}


def check_against_table(trace: dict, table: dict) -> None:
    events = trace["traceEvents"]
    for about in trace["otherData"]["jobs"]:
        job = table[about["name"]]
        mine = [e for e in events if e["pid"] == about["pid"]]
        slices = [e for e in mine if e["ph"] == "X"]
        assert all(e["dur"] > 0 and e["ts"] >= 0 for e in slices)
        # The step spans 0 to the step time of the table.
        start = min(e["ts"] for e in slices) / 1e6
        end = max(e["ts"] + e["dur"] for e in slices) / 1e6
        assert start == pytest.approx(0.0, abs=1e-9)
        assert end == pytest.approx(job["step_time_s"], rel=1e-6)
        # Per category, the critical stage's slices add up to the table's figure (1%).
        sums: dict[str, float] = defaultdict(float)
        for e in slices:
            if e["tid"] == about["critical_tid"]:
                sums[e["cat"]] += e["dur"] / 1e6
        breakdown = job["step_breakdown"]
        for cat, key in CATEGORIES.items():
            expected = breakdown.get(key, 0.0)
            assert sums.get(cat, 0.0) == pytest.approx(expected, rel=0.01,
                                                       abs=1e-6 * job["step_time_s"]), cat
        # The categories cover the critical stage's whole step.
        assert sum(sums[c] for c in CATEGORIES) == pytest.approx(job["step_time_s"], rel=1e-6)
        # Slices nest (viewers nest by time): a pass's parts lie within it, to the
        # nanosecond, and the slices of a track do not otherwise overlap.
        for tid in {e["tid"] for e in slices}:
            track = sorted((round(e["ts"] * 1e3), -round(e["dur"] * 1e3), e["cat"])
                           for e in slices if e["tid"] == tid)
            parent_end = -1
            previous_end = 0
            for start_ns, minus_dur, cat in track:
                end_ns = start_ns - minus_dur
                if cat == "pass":
                    assert start_ns >= previous_end
                    parent_end = previous_end = end_ns
                elif start_ns < parent_end:
                    assert end_ns <= parent_end, (tid, cat, start_ns, end_ns, parent_end)
                else:
                    assert start_ns >= previous_end
                    previous_end = end_ns
        # Every flow starts at a send and ends at a receive, each id once each.
        starts = Counter(e["id"] for e in mine if e["ph"] == "s")
        ends = Counter(e["id"] for e in mine if e["ph"] == "f")
        assert starts == ends and set(starts.values()) <= {1}
        receives = [e for e in slices if e["cat"] == "pp"]
        assert len(starts) >= len(receives)


def test_quickstart_timeline_matches_step_table(tmp_path: Path):
    trace, table = timeline_and_table(tmp_path, QUICKSTART)
    check_against_table(trace, table)
    assert trace["displayTimeUnit"] == "ms"
    names = [e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"]
    # One representative rank per stage, saying so: 2,048 ranks (tp 4 x dp 512).
    assert any("one representative of its 2,048 ranks" in n for n in names), names
    passes = [e for e in trace["traceEvents"] if e.get("cat") == "pass"]
    assert len(passes) == 2 * table["pretrain"]["microbatches"]  # one stage, F and B each
    tp = [e for e in trace["traceEvents"] if e.get("cat") == "tp"]
    assert tp and all(e["args"]["collectives"] for e in tp)  # sizes and algorithms


def test_interleaved_pipeline_with_context_parallelism(tmp_path: Path):
    sets = ("jobs.0.parallelism.pp=4", "jobs.0.parallelism.dp=64", "jobs.0.parallelism.cp=2",
            "jobs.0.parallelism.interleave=2", "jobs.0.parallelism.cp_comm=all-to-all")
    trace, table = timeline_and_table(tmp_path, QUICKSTART, *sets)
    check_against_table(trace, table)
    job = table["pretrain"]
    assert job["step_breakdown"]["cp_comm_s"] > 0 and job["step_breakdown"]["bubble_s"] > 0
    flows = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    # Each micro-batch crosses 2 x 4 - 1 chunk boundaries forward and as many backward.
    assert len(flows) == 2 * (2 * 4 - 1) * job["microbatches"]
    tids = {e["tid"] for e in trace["traceEvents"] if e.get("cat") == "pass"}
    assert len(tids) == 4


def test_mixture_of_experts_timeline(tmp_path: Path):
    trace, table = timeline_and_table(tmp_path, ROOT / "scenarios" / "mixtral-trn2.yaml")
    check_against_table(trace, table)
    assert any(e.get("cat") == "ep" for e in trace["traceEvents"])


def test_half_a_million_chips_show_one_rank_per_stage(tmp_path: Path):
    trace, table = timeline_and_table(tmp_path, ROOT / "scenarios" / "trn2-512k-month.yaml")
    check_against_table(trace, table)
    names = [e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"]
    assert sum("one representative of its 128,000 ranks" in n for n in names) == 16


def test_python_api_gives_the_same_trace(tmp_path: Path):
    scenario = clustersim.load_scenario(QUICKSTART)
    trace = clustersim.step_timeline(scenario)
    path = clustersim.write_step_timeline(scenario, tmp_path / "t.json")
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))
    with pytest.raises(clustersim.runner.outputs.OutputDirError, match="exists"):
        clustersim.write_step_timeline(scenario, path)


def test_refusals_write_nothing(tmp_path: Path):
    mine = tmp_path / "mine.json"
    mine.write_text("my own file")
    refused(invoke("step", QUICKSTART, "--timeline", mine), "exists", "--force")
    assert mine.read_text() == "my own file"
    refused(invoke("step", QUICKSTART, "--timeline", tmp_path / "no" / "t.json"), "no folder")
    refused(invoke("step", QUICKSTART, "--timeline", tmp_path), "not a regular file")
    refused(invoke("step", tmp_path / "missing.yaml", "--timeline", tmp_path / "t.json"))
    # A job that does not fit in memory: exit 2, and no timeline.
    big = invoke("step", QUICKSTART, "--set", "jobs.0.model=llama3-70b",
                 "--timeline", tmp_path / "t.json")
    assert big.exit_code == 2 and not (tmp_path / "t.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json"]
    forced = invoke("step", QUICKSTART, "--timeline", mine, "--force")
    assert forced.exit_code == 0 and json.loads(mine.read_text())["traceEvents"]
