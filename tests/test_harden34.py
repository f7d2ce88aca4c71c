"""Issue 34 part A: the newer surfaces lose no user data, read published traces within their
bounds and exactly as written, and name files, rows and columns in their refusals. One test
(or a few) per defect of the issue."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from cli_helpers import refused
from typer.testing import CliRunner

from clustersim.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

SMALL = {
    "name": "small", "hardware": "trn2", "duration": "1h", "cluster": {"instances": 1},
    "jobs": [{"name": "train", "model": "llama3-8b", "global_batch": 16,
              "parallelism": {"tp": 8, "dp": 8, "zero": 1}}],
    "trace": {"enabled": False},
}


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def write(folder: Path, mapping, name: str = "scenario.yaml") -> Path:
    path = folder / name
    path.write_text(mapping if isinstance(mapping, str) else yaml.safe_dump(mapping),
                    encoding="utf-8")
    return path


# 2. Data loss -----------------------------------------------------------------------------

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
