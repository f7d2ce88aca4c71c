"""Sweeps (local and Ray engines) and the regression check against golden summaries."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import yaml
from sweep_helpers import sweep_base, write_sweep
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.runner.check import NOT_REFERENCE, differences, normalise
from clustersim.runner.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

GRID = {"jobs.0.checkpoint.interval": ["30min", "2h"], "failures.scale": [20, 80]}


def test_a_2x2_grid_with_2_seeds_gives_8_rows(tmp_path: Path):
    path = write_sweep(tmp_path, grid=GRID, seeds=[0, 1])
    rows, summary = run_sweep(path, workers=2)
    assert len(rows) == 8
    assert set(rows["status"]) == {"ok"}
    assert {"jobs.0.checkpoint.interval", "failures.scale", "seed", "train.ettr",
            "train.tokens_per_s", "cluster.utilisation"} <= set(rows.columns)
    assert len(summary) == 4
    assert (summary["runs"] == 2).all()
    assert "train.ettr_ci95" in summary.columns
    # more failures, less useful time
    mean = summary.groupby("failures.scale")["train.ettr"].mean()
    assert mean[80] < mean[20]


def test_the_same_rows_whatever_the_workers(tmp_path: Path):
    path = write_sweep(tmp_path, grid=GRID, seeds=[3])
    one, _ = run_sweep(path, workers=1)
    two, _ = run_sweep(path, workers=2)
    pd.testing.assert_frame_equal(one, two)


def test_a_failed_variant_is_reported_and_the_rest_finish(tmp_path: Path):
    path = write_sweep(tmp_path, variants=[
        {"name": "fine", "set": {}},
        {"name": "too-big", "set": {"jobs.0.parallelism.zero": 0,
                                    "jobs.0.parallelism.sequence_parallel": False,
                                    "jobs.0.recompute": "none", "jobs.0.seq_len": 8192}},
        {"name": "invalid", "set": {"jobs.0.parallelism.tp": 7}},
    ], seeds=[0])
    rows, summary = run_sweep(path, workers=1)
    status = dict(zip(rows["variant"], rows["status"], strict=True))
    assert status == {"fine": "ok", "too-big": "error", "invalid": "error"}
    errors = dict(zip(rows["variant"], rows["error"], strict=True))
    assert "does not fit" in errors["too-big"]
    assert "tp" in errors["invalid"]
    assert summary.set_index("variant").loc["too-big", "failed"] == 1


def test_sweep_cli_writes_both_tables(tmp_path: Path):
    path = write_sweep(tmp_path, grid={"failures.scale": [10, 40]}, replications=2)
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(path), "-o", str(out), "--workers", "1"])
    assert result.exit_code == 0, result.stderr
    rows = pd.read_parquet(out / "sweep.parquet")
    summary = pd.read_parquet(out / "sweep_summary.parquet")
    assert len(rows) == 4 and len(summary) == 2
    assert (out / "sweep.yaml").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("scenario: nowhere.yaml\n")
    refused = runner.invoke(app, ["sweep", str(bad), "-o", str(tmp_path / "o2")])
    assert refused.exit_code == 2 and "no such file" in refused.stderr
    wrong = runner.invoke(app, ["sweep", str(path), "--engine", "slurm"])
    assert wrong.exit_code == 2


def test_a_sweep_where_no_run_succeeds_writes_nothing_and_exits_2(tmp_path: Path):
    path = write_sweep(tmp_path, grid={"failures.scael": [1, 2]}, seeds=[0])
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(path), "-o", str(out), "--workers", "1"])
    assert result.exit_code == 2
    assert "no run succeeded" in result.stderr and "scael" in result.stderr
    assert "nothing written" in result.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml", "sweep.yaml"]


# ---------------------------------------------------------------------------------------------
# Regression check

FAST_REFERENCES = ["single-trn2", "one-ultraserver", "compare-1024-chips", "checkpoint-study",
                   "llama3-16k-month", "mix-128-trn2", "mixtral-trn2"]


def test_the_fast_reference_scenarios_match_their_goldens(monkeypatch):
    monkeypatch.chdir(ROOT)
    paths = [f"scenarios/{name}.yaml" for name in FAST_REFERENCES]
    result = runner.invoke(app, ["check", *paths])
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.count("ok ") == len(paths)


def test_every_library_scenario_has_a_golden_but_quickstart():
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["name"]
        golden = ROOT / "results" / name / "summary.json"
        # quickstart's folder is the README command's output, fleet-100k-month is a
        # benchmark (NOT_REFERENCE); a plan-* scenario leaves its job's parallelism to
        # `clustersim plan` and is not run.
        if name not in NOT_REFERENCE and not name.startswith("plan-"):
            assert golden.exists(), name
        assert path.read_text().startswith("# "), f"{path.name} needs its comment header"


def test_check_fails_on_a_changed_scenario(tmp_path: Path, monkeypatch):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "results" / "single-trn2").mkdir(parents=True)
    shutil.copy(ROOT / "results" / "single-trn2" / "summary.json",
                tmp_path / "results" / "single-trn2" / "summary.json")
    text = (ROOT / "scenarios" / "single-trn2.yaml").read_text()
    (tmp_path / "scenarios" / "single-trn2.yaml").write_text(
        text.replace("global_batch: 64", "global_batch: 128"))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["check"])
    assert result.exit_code == 1
    assert "differs" in result.stdout
    assert "jobs.finetune.step_time_s" in result.stdout
    assert "--update" in result.stderr
    updated = runner.invoke(app, ["check", "--update"])
    assert updated.exit_code == 0
    assert runner.invoke(app, ["check"]).exit_code == 0
    golden = json.loads((tmp_path / "results" / "single-trn2" / "summary.json").read_text())
    assert golden["jobs"]["finetune"]["global_batch"] == 128


def test_check_after_a_run_into_the_golden_folder(tmp_path: Path, monkeypatch):
    """`clustersim run X --force` writes the full summary (wall time, version) where the
    golden lives; check still compares what a golden holds."""
    (tmp_path / "scenarios").mkdir()
    shutil.copy(ROOT / "scenarios" / "single-trn2.yaml", tmp_path / "scenarios")
    monkeypatch.chdir(tmp_path)
    ran = runner.invoke(app, ["run", "scenarios/single-trn2.yaml"])
    assert ran.exit_code == 0, ran.stderr
    assert "wall_s" in json.loads((tmp_path / "results/single-trn2/summary.json").read_text())
    result = runner.invoke(app, ["check", "scenarios/single-trn2.yaml"])
    assert result.exit_code == 0, result.stdout


def test_check_without_a_golden_says_how_to_make_one(tmp_path: Path, monkeypatch):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(dict(sweep_base(), name="nogolden")))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["check", "s.yaml"])
    assert result.exit_code == 2
    assert "check --update" in result.stderr


def test_normalise_and_differences():
    summary = {"wall_s": 3.2, "clustersim_version": "x", "a": 1.23456789, "b": {"c": 0.1 + 0.2}}
    golden = normalise(summary)
    assert "wall_s" not in golden and golden["a"] == 1.23457
    assert differences(golden, normalise(dict(summary, wall_s=9))) == []
    moved = normalise(dict(summary, a=1.2346))
    assert differences(golden, moved) == [("a", 1.23457, 1.2346)]
    assert differences({"x": 1}, {"y": 1}) == [("x", 1, "(absent)"), ("y", "(absent)", 1)]


def test_runs_and_sweeps_share_one_t_quantile():
    from clustersim.runner import sweep
    from clustersim.runner.figures import t_quantile

    assert sweep.t_quantile is t_quantile
    assert t_quantile(1) == 12.706 and t_quantile(30) == 2.042
    assert math.isnan(t_quantile(0))
    assert 1.96 < t_quantile(31) < t_quantile(30)  # no drop to the normal quantile at 31
