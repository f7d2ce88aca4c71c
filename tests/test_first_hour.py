"""A new user's first hour: output folders, `step` and memory, one vocabulary."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from clustersim.analysis.trace import JOB_STATES, UTILISATION_STATES
from clustersim.cli.app import app
from clustersim.runner.outputs import OutputDirError, RunSettings, check_output_dir

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["--set", "duration=2d", "--set", "cluster.ultraservers=2", "--set", "cluster.spares=0",
         "--set", "jobs.0.parallelism.dp=128"]


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
    # (other settings need --force: tests/test_harden18_g2.py)
    result = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "-o", quick_run, *QUICK,
                    "--set", "seed=5", "--force")
    assert result.exit_code == 0, result.output
    assert json.loads((quick_run / "summary.json").read_text())["seed"] == 5 != before["seed"]
    # the same settings again: replaced, with its report too (the report folder is part of a
    # run's outputs)
    assert invoke("report", quick_run).exit_code == 0
    again = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "-o", quick_run, *QUICK,
                   "--set", "seed=5")
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
    same = RunSettings("quickstart", (quick_run / "scenario.yaml").read_text(),
                       json.loads((quick_run / "summary.json").read_text())["seed"])
    check_output_dir(quick_run, force=False, replaces=same)
    with pytest.raises(OutputDirError):
        check_output_dir(quick_run, force=False, replaces=replace(same, name="another-scenario"))
    golden = tmp_path / "golden"
    golden.mkdir()
    shutil.copy(quick_run / "summary.json", golden / "summary.json")
    with pytest.raises(OutputDirError):
        check_output_dir(golden, force=False, replaces=same)


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
    assert set(summary["lost_time_s"]) == (states - {"running"}) | {"lost_work", "requeued"}
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


# ---------------------------------------------------------------------------------------------
# Defaults that cannot silently mislead: checkpoints, reasons, cost both ways

SEVENTY_B = {
    "name": "seventy", "duration": "30d", "hardware": "trn2",
    "cluster": {"instances": 64, "spares": 2},
    "jobs": [{"name": "pretrain", "model": "llama3.1-70b", "seq_len": 8192, "global_batch": 1024,
              "parallelism": {"tp": 32, "pp": 8, "dp": 16, "zero": 1, "sequence_parallel": True},
              "recompute": "selective"}],
    "failures": {"preset": "llama3"},
}


def _simulate(raw: dict, replications: int = 1) -> dict:
    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import scenario_from_dict

    return simulate(scenario_from_dict(raw), replications=replications, workers=1).summary


def test_a_month_with_failures_and_no_checkpoint_block_checkpoints_by_default():
    """The issue's case: a 70B month with failures and no `checkpoint:` ran to ETTR 1.9%.
    Now it gets Daly's interval with a write time from its checkpoint's size over the
    catalog's storage bandwidth (FSx for Lustre, 100 Gbps per instance)."""
    from clustersim.cluster.rates import (
        checkpoint_bytes,
        daly_interval,
        storage_bandwidth_per_instance,
    )
    from clustersim.scenario.loader import scenario_from_dict

    job = _simulate(SEVENTY_B)["jobs"]["pretrain"]
    assert job["checkpoint_default"] is True
    spec = scenario_from_dict(SEVENTY_B).jobs[0]
    assert storage_bandwidth_per_instance() == pytest.approx(100e9 / 8)
    assert checkpoint_bytes(spec) == pytest.approx(spec.model.parameter_count() * 14)
    write = checkpoint_bytes(spec) / (64 * 100e9 / 8)
    assert job["checkpoint_write_s"] == pytest.approx(write)
    assert job["checkpoint_interval_s"] == pytest.approx(daly_interval(write, job["job_mtbf_s"]))
    assert job["interruptions"] > 5 and job["checkpoints_completed"] > 100
    assert job["ettr"] > 0.9
    # a job given a block keeps it; a job on hardware that never fails gets none
    given = dict(SEVENTY_B, jobs=[dict(SEVENTY_B["jobs"][0],
                                       checkpoint={"interval": "1h", "write": "60s"})])
    assert _simulate(given)["jobs"]["pretrain"]["checkpoint_default"] is False
    calm = dict(SEVENTY_B, failures={"preset": "none"})
    assert _simulate(calm)["jobs"]["pretrain"]["checkpoint_interval_s"] is None


def test_the_reason_names_the_real_cause_of_a_low_ettr():
    never = dict(SEVENTY_B, jobs=[dict(SEVENTY_B["jobs"][0], checkpoint={"interval": "never"})])
    job = _simulate(never)["jobs"]["pretrain"]
    assert job["ettr"] < 0.2 and job["checkpoint_default"] is False
    assert job["reason"].startswith("no checkpoints")
    assert f"{job['interruptions']:,}" in job["reason"]
    # failures faster than the job recovers: the reason says so, with both times
    storm = dict(SEVENTY_B, cluster={"instances": 64, "spares": 64},
                 failures={"preset": "llama3", "scale": 300, "restart": "30min", "repair": "1min"})
    job = _simulate(storm)["jobs"]["pretrain"]
    assert job["job_mtbf_s"] < 1800 + 120
    assert "mean time between failures" in job["reason"] and "recovery" in job["reason"]


def test_cost_and_energy_per_token_both_ways():
    """Ideal: one step's chip-time over its tokens. Effective: the chip-hours held over the
    tokens trained, about the ideal over the ETTR."""
    never = dict(SEVENTY_B, jobs=[dict(SEVENTY_B["jobs"][0], checkpoint={"interval": "never"})])
    for raw in (SEVENTY_B, never):
        job = _simulate(raw)["jobs"]["pretrain"]
        price_chip_h = 35.76 / 16
        assert job["effective_cost_per_million_tokens_usd"] == pytest.approx(
            job["held_chip_s"] / 3600 * price_chip_h / job["tokens_trained"] * 1e6)
        assert job["effective_cost_per_million_tokens_usd"] == pytest.approx(
            job["cost_per_million_tokens_usd"] / job["ettr"], rel=0.02)
        assert job["effective_energy_per_token_j"] == pytest.approx(
            job["energy_per_token_j"] / job["ettr"], rel=0.02)
    assert job["effective_cost_per_million_tokens_usd"] > 5 * job["cost_per_million_tokens_usd"]


def test_replications_print_the_interval_of_every_figure(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one line per row, to find each figure's interval
    result = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "--replications", "3",
                    "--workers", "1", "-o", tmp_path / "r3", *QUICK, "--set", "duration=7d")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "mean ± 95% interval over 3 replications" in text
    for figure in ("steps, ETTR", "held by jobs", "over the run"):
        line = next(line for line in text.splitlines() if figure in line)
        assert "±" in line, line
    assert "1,024.0" not in text  # integers that are the same in every replication stay so


def test_tables_fold_or_wrap_at_80_columns(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = invoke("hardware").output
    assert "…" not in text and "trn2u.48xlarge" in text and "$35.76/h" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    sweep = invoke("sweep", ROOT / "scenarios" / "sweeps" / "trn2-vs-p5en.yaml", "-o",
                   tmp_path / "sw", "--workers", "1")
    assert sweep.exit_code == 0, sweep.output
    assert "…" not in sweep.output


# ---------------------------------------------------------------------------------------------
# Plots that tell the truth at any scale


@pytest.fixture(scope="module")
def month_run(tmp_path_factory) -> Path:
    """A month of checkpoint-study with traces, two replications."""
    out = tmp_path_factory.mktemp("month") / "cs"
    result = invoke("run", ROOT / "scenarios" / "checkpoint-study.yaml", "-o", out,
                    "--replications", "2", "--workers", "1", "--set", "trace.enabled=true")
    assert result.exit_code == 0, result.output
    return out


def _captured_figures(monkeypatch) -> dict[str, Any]:
    import importlib
    import pkgutil

    import clustersim.analysis
    from clustersim.analysis import plotting

    figures: dict[str, Any] = {}
    original = plotting._save

    def keep(fig, path, tight=True):
        ax = fig.axes[0]
        legend = ax.get_legend()
        figures[Path(path).name] = {
            "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
            "title": ax.get_title(),
            "texts": [t.get_text() for t in ax.texts],
        }
        return original(fig, path, tight)

    # every analysis module that draws imports plotting's _save by name: patch each one (by
    # name, not identity: a test that reloads plotting leaves the others holding the old one)
    for info in pkgutil.iter_modules(clustersim.analysis.__path__):
        module = importlib.import_module(f"clustersim.analysis.{info.name}")
        if callable(getattr(module, "_save", None)):
            monkeypatch.setattr(module, "_save", keep)
    return figures


def test_month_scale_timelines_mark_every_interruption_and_checkpoint(month_run, monkeypatch):
    from clustersim.analysis.report import write_report
    from clustersim.analysis.runs import load_run

    figures = _captured_figures(monkeypatch)
    report = write_report(month_run).read_text()
    run = load_run(month_run)
    job = run.intervals[run.intervals["entity"] == "job"]
    downs = int((job["state"] == "down").sum())
    checkpoints = int((job["state"] == "checkpointing").sum())
    assert downs > 10 and checkpoints > 300
    legend = figures["jobs.png"]["legend"]
    assert f"checkpoint: {checkpoints:,} too short to draw, marked |" in legend
    assert any(label.startswith(f"interruption (down, then restart, restore): {downs:,}")
               for label in legend)
    # states that cannot be seen at a month's scale are not in the legend as bars
    assert "restoring" not in legend and "down" not in legend and "running" in legend
    # the replicated run says which replication its plots show, and that the text is means
    assert "replication 1 of 2" in figures["jobs.png"]["title"]
    assert "replication 1 of 2" in figures["utilisation.png"]["title"]
    assert "means over 2 replications" in figures["hours.png"]["title"]
    assert "plots show replication 1" in report
    assert "ideal / effective" in report


def test_the_ultraserver_drawing_labels_its_instances(tmp_path: Path, monkeypatch):
    figures = _captured_figures(monkeypatch)
    result = invoke("topology", ROOT / "scenarios" / "quickstart.yaml", "--draw",
                    tmp_path / "us.png")
    assert result.exit_code == 0, result.output
    (drawing,) = figures.values()  # drawn to a temporary beside us.png, then moved there
    assert all(f"instance {i}" in drawing["texts"] for i in range(4))
    assert any("Z rings" in label for label in drawing["legend"])


def test_a_finished_job_without_checkpoints_says_why_it_took_so_long():
    never = dict(SEVENTY_B, jobs=[dict(SEVENTY_B["jobs"][0], steps=2000,
                                       checkpoint={"interval": "never"})],
                 failures={"preset": "llama3", "scale": 10})
    job = _simulate(never)["jobs"]["pretrain"]
    assert job["status"] == "done" and job["interruptions"] > 0
    assert job["reason"].startswith("reached its step target; no checkpoints")


def test_a_serving_run_replaces_its_earlier_run(tmp_path: Path):
    """Every table a run writes (serving's requests and replicas too) belongs to a run."""
    out = tmp_path / "serve"
    args = ["run", ROOT / "scenarios" / "serving-llama-trn2.yaml", "-o", out,
            "--set", "duration=10min"]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert (out / "replicas.parquet").exists() or (out / "requests.parquet").exists()
    again = invoke(*args)
    assert again.exit_code == 0, again.output
