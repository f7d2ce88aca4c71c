"""A new user's first hour (issue 14): output folders, `step` and memory, one vocabulary."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from clustersim.analysis.trace import JOB_STATES, UTILISATION_STATES
from clustersim.cli.app import app
from clustersim.runner.outputs import OutputDirError, check_output_dir

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["--set", "duration=2d", "--set", "cluster.ultraservers=2", "--set", "cluster.spares=0",
         "--set", "jobs.0.parallelism.dp=16"]


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "quick"
    result = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "-o", out, *QUICK)
    assert result.exit_code == 0, result.output
    return out


# ---------------------------------------------------------------------------------------------
# Output folders


def test_run_replaces_an_earlier_run_of_the_same_scenario(quick_run: Path):
    before = json.loads((quick_run / "summary.json").read_text())
    result = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "-o", quick_run, *QUICK,
                    "--set", "seed=5")
    assert result.exit_code == 0, result.output
    assert json.loads((quick_run / "summary.json").read_text())["seed"] == 5 != before["seed"]
    # ... with its report too (the report folder is part of a run's outputs)
    assert invoke("report", quick_run).exit_code == 0
    again = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "-o", quick_run, *QUICK)
    assert again.exit_code == 0, again.output


def test_run_never_replaces_a_folder_with_anything_else(quick_run: Path, tmp_path: Path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(quick_run, other)
    (other / "notes.txt").write_text("mine")
    result = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "-o", other, *QUICK)
    assert result.exit_code == 2 and "--force" in result.output
    assert (other / "notes.txt").read_text() == "mine"
    # another scenario's run, or a golden (summary.json alone), is not replaced either
    with pytest.raises(OutputDirError):
        check_output_dir(quick_run, force=False, replaces="another-scenario")
    golden = tmp_path / "golden"
    golden.mkdir()
    shutil.copy(quick_run / "summary.json", golden / "summary.json")
    with pytest.raises(OutputDirError):
        check_output_dir(golden, force=False, replaces="quickstart")


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_output_folders_honour_the_umask(tmp_path: Path, mask: int):
    old = os.umask(mask)
    try:
        out = tmp_path / "made" / "run"
        result = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "-o", out, *QUICK,
                        "--set", "trace.enabled=false")
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    for folder in (out, out.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~mask, folder


# ---------------------------------------------------------------------------------------------
# `step` and memory

TOO_BIG = ["--set", "jobs.0.parallelism.tp=4", "--set", "jobs.0.parallelism.dp=512",
           "--set", "jobs.0.parallelism.zero=0"]


def test_step_refuses_a_job_that_does_not_fit_after_showing_its_memory():
    result = invoke("step", ROOT / "scenarios" / "quickstart.yaml", *TOO_BIG)
    assert result.exit_code == 2
    text = result.output
    assert "DOES NOT FIT" in text and "does not fit in memory" in text
    assert text.index("activations") < text.index("DOES NOT FIT")  # the breakdown first
    assert "MFU" not in text and "per million tokens" not in text  # no misleading figures
    shown = invoke("step", ROOT / "scenarios" / "quickstart.yaml", *TOO_BIG, "--ignore-memory")
    assert shown.exit_code == 0 and "MFU" in shown.output and "DOES NOT FIT" in shown.output
    as_json = invoke("step", ROOT / "scenarios" / "quickstart.yaml", *TOO_BIG, "--json")
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout)["jobs"][0]["fits_memory"] is False


@pytest.mark.parametrize("overrides", [
    [], TOO_BIG, ["--set", "jobs.0.parallelism.tp=8", "--set", "jobs.0.parallelism.pp=4",
                  "--set", "jobs.0.parallelism.dp=64", "--set", "jobs.0.recompute=full"],
])
def test_memory_breakdowns_add_up_to_their_total(overrides):
    result = invoke("step", ROOT / "scenarios" / "quickstart.yaml", *overrides, "--json",
                    "--ignore-memory")
    assert result.exit_code == 0, result.output
    for job in json.loads(result.stdout)["jobs"]:
        memory = job["memory_gib"]
        parts = ("weights", "gradients", "optimizer", "activations", "logits")
        assert sum(memory[p] for p in parts) == pytest.approx(memory["total"], rel=1e-9)
        assert memory["total"] == pytest.approx(job["memory_per_chip_gib"], rel=1e-9)


def test_run_names_every_part_when_a_job_does_not_fit(tmp_path: Path):
    result = invoke("run", ROOT / "scenarios" / "quickstart.yaml", *TOO_BIG, "-o", tmp_path / "x")
    assert result.exit_code == 2
    for part in ("weights", "gradients", "optimizer", "activations", "logits"):
        assert part in result.output


# ---------------------------------------------------------------------------------------------
# One vocabulary


def _keys(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [k for key, value in node.items()
                for k in [f"{prefix}{key}", *_keys(value, f"{prefix}{key}.")]]
    if isinstance(node, list):
        return [k for item in node for k in _keys(item, prefix)]
    return []


# Keys that do hold gigabits per second may end in _gbps; there are none today.
GIGABIT_KEYS: set[str] = set()


def test_no_json_key_ends_in_gbps_unless_it_holds_gigabits(quick_run: Path):
    outputs = {"summary.json": json.loads((quick_run / "summary.json").read_text())}
    for args in (["step", ROOT / "scenarios" / "quickstart.yaml", "--json"],
                 ["topology", ROOT / "scenarios" / "quickstart.yaml", "--json"],
                 ["collective", "--hardware", "trn2", "--op", "all-reduce", "--ranks", "64",
                  "--sizes", "1MiB", "--json"],
                 ["hardware", "--json"], ["hardware", "trn2u", "--json"]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        outputs[" ".join(map(str, args[:1]))] = json.loads(result.stdout)
    for golden in ROOT.glob("results/*/summary.json"):
        outputs[str(golden)] = json.loads(golden.read_text())
    for where, data in outputs.items():
        for key in _keys(data):
            leaf = key.rsplit(".", 1)[-1]
            if leaf.lower().endswith(("_gbps", "_tbps")):
                assert leaf in GIGABIT_KEYS, f"{where}: {key} reads as bits"


def test_one_name_per_job_state(quick_run: Path):
    from clustersim.analysis.runs import load_run

    run = load_run(quick_run)
    summary = run.summary["jobs"]["pretrain"]
    states = set(JOB_STATES) - {"done"}
    assert set(summary["time_by_state_s"]) == states
    assert set(summary["lost_time_s"]) == (states - {"running"}) | {"lost_work"}
    assert set(run.intervals.loc[run.intervals["entity"] == "job", "state"]) <= set(JOB_STATES)
    assert states <= set(UTILISATION_STATES)
    columns = set(run.goodput().columns)
    assert "lost_work_h" in columns and "lost_down_h" in columns
    assert not any(c.startswith("lost_lost") for c in columns)


def test_step_json_and_summary_use_the_same_names(quick_run: Path):
    summary = json.loads((quick_run / "summary.json").read_text())["jobs"]["pretrain"]
    result = invoke("step", ROOT / "scenarios" / "quickstart.yaml", *QUICK, "--json")
    step = json.loads(result.stdout)["jobs"][0]
    shared = {"step_time_s", "tokens_per_s", "sequences_per_s", "mfu", "hfu",
              "memory_per_chip_gib", "fits_memory", "step_breakdown", "tokens_per_step",
              "cost_per_million_tokens_usd", "energy_per_token_j"}
    assert shared <= set(step) and shared <= set(summary)
    assert "breakdown" not in step
    assert set(step["step_breakdown"]) == set(summary["step_breakdown"])


def test_floats_are_rounded_for_display_only():
    """The fabric's 15 us split over two EFA hops is 7.5 us, in the table and in --json."""
    result = invoke("topology", ROOT / "scenarios" / "quickstart.yaml")
    assert result.exit_code == 0
    assert "7.499999" not in result.output and "7.5us" in result.output
    figures = json.loads(invoke("topology", ROOT / "scenarios" / "quickstart.yaml",
                                "--json").stdout)
    assert figures["link_latency_us"]["efa"] == 7.5
