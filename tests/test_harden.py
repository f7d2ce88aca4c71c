"""Issue 26: the serving, plan, report, check and sweep surfaces lose no data, never hang and
never answer wrongly in silence. One test (or a few) per numbered defect of the issue."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

TINY_PLAN = {
    "name": "plan-tiny", "hardware": "trn1", "cluster": {"instances": 1},
    "jobs": [{"name": "train", "model": {"name": "tiny", "layers": 2, "hidden": 512, "heads": 4,
                                         "vocab": 1000, "seq_len": 512},
              "seq_len": 512, "global_batch": 4}],
    "failures": {"preset": "llama3"},
}

TRACED = {
    "name": "small", "hardware": "trn2", "duration": "1d",
    "cluster": {"instances": 4, "spares": 1},
    "jobs": [{"name": "train", "model": "llama3-8b", "global_batch": 64,
              "recompute": "selective",
              "parallelism": {"tp": 8, "dp": 32, "zero": 1, "sequence_parallel": True},
              "checkpoint": {"interval": "auto", "write": "30s"}}],
    "failures": {"preset": "llama3"},
    "trace": {"enabled": True, "levels": ["cluster", "job"]},
}


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def write(tmp_path: Path, mapping, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(mapping if isinstance(mapping, str) else yaml.safe_dump(mapping),
                    encoding="utf-8")
    return path


def refused(result, *words: str) -> None:
    output = result.stdout + result.stderr
    assert result.exit_code == 2, output
    assert "Traceback" not in output and "internal error" not in output, output
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("traced")
    out = folder / "run"
    result = invoke("run", write(folder, TRACED), "-o", out)
    assert result.exit_code == 0, result.output
    return out


def copy_run(run: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


# ---------------------------------------------------------------------------------------------
# 1-3: data lost


def test_1_report_keeps_a_users_file_in_the_report_folder(traced_run: Path, tmp_path: Path):
    run = copy_run(traced_run, tmp_path)
    (run / "report").mkdir(exist_ok=True)
    notes = run / "report" / "notes.txt"
    notes.write_text("mine")
    refused(invoke("report", run), "--force")
    assert notes.read_text() == "mine"
    notes.unlink()
    assert invoke("report", run).exit_code == 0  # an earlier report alone is replaced
    assert invoke("report", run).exit_code == 0
    notes.write_text("mine")
    assert invoke("report", run, "--force").exit_code == 0
    assert not notes.exists() and (run / "report" / "report.md").is_file()
    assert leftovers(run) == []


def test_2_a_scenario_written_meanwhile_is_not_replaced(tmp_path: Path, monkeypatch):
    """Two plans into the same --write-scenario: the second refuses at once (the lock), and
    a file that appears during the search is never overwritten without --force."""
    import clustersim.planning as planning

    scenario = write(tmp_path, TINY_PLAN)
    best = tmp_path / "best.yaml"
    real = planning.plan

    def slow_plan(*args, **kwargs):
        best.write_text("the other plan")  # another plan finished first
        return real(*args, **kwargs)

    monkeypatch.setattr(planning, "plan", slow_plan)
    result = invoke("plan", scenario, "-o", tmp_path / "p", "--write-scenario", best)
    refused(result, "best.yaml", "--force")
    assert best.read_text() == "the other plan"
    assert not (tmp_path / "p").exists() and leftovers(tmp_path) == []


def test_2_a_second_plan_into_the_same_file_is_refused_while_the_first_runs(tmp_path: Path):
    import subprocess
    import sys

    from clustersim.runner.outputs import atomic_output_file

    scenario = write(tmp_path, TINY_PLAN)
    best = tmp_path / "best.yaml"
    with atomic_output_file(best, force=False):  # the first plan, still searching
        done = subprocess.run(
            [sys.executable, "-m", "clustersim", "plan", str(scenario), "-o",
             str(tmp_path / "p"), "--write-scenario", str(best)],
            capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert "another clustersim run" in done.stderr
    assert not best.exists() and not (tmp_path / "p").exists()


@pytest.mark.parametrize("target", ["folder", "no-parent", "same-as-out", "inside-out", "fifo"])
def test_3_a_bad_write_scenario_target_is_refused_before_the_search(tmp_path: Path, target,
                                                                      monkeypatch):
    import clustersim.planning as planning

    monkeypatch.setattr(planning, "plan", lambda *a, **k: pytest.fail("searched"))
    scenario = write(tmp_path, TINY_PLAN)
    out = tmp_path / "p"
    path = {"folder": tmp_path, "no-parent": tmp_path / "nowhere" / "best.yaml",
            "same-as-out": out, "inside-out": out / "best.yaml", "fifo": tmp_path / "fifo"
            }[target]
    if target == "fifo":
        os.mkfifo(path)
    if target == "inside-out":
        out.mkdir()
    result = invoke("plan", scenario, "-o", out, "--write-scenario", path, "--force")
    refused(result, "--write-scenario" if "out" in target else str(path))
    assert not out.exists() or not any(out.iterdir())


def test_3_a_failed_scenario_write_leaves_no_plan_folder(tmp_path: Path, monkeypatch):
    import clustersim.planning.outputs as outputs

    def full_disk(result, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "write_scenario", full_disk)
    scenario = write(tmp_path, TINY_PLAN)
    result = invoke("plan", scenario, "-o", tmp_path / "p", "--write-scenario",
                    tmp_path / "best.yaml")
    assert result.exit_code != 0
    assert not (tmp_path / "p").exists() and not (tmp_path / "best.yaml").exists()
    assert leftovers(tmp_path) == []


def test_3_plan_writes_both_outputs(tmp_path: Path):
    scenario = write(tmp_path, TINY_PLAN)
    result = invoke("plan", scenario, "-o", tmp_path / "p", "--write-scenario",
                    tmp_path / "best.yaml")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / "plan.parquet").is_file()
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["name"] == "plan-tiny-planned"
    assert leftovers(tmp_path) == [] and not list(tmp_path.glob(".*.lock"))
