"""Session 18 (fix18g2): output folders that hold the user's data are never replaced without
--force (a PNG of theirs in report/, an earlier run of other settings, a sweep into the
traces' folder); `check` reports the reference scenarios it cannot run; the seed a run used
is the one its outputs record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import SMALL, invoke, refused, write

from clustersim.analysis.report_names import REPORT_FILES

ROOT = Path(__file__).resolve().parent.parent


def _traced(tmp_path: Path, **changes) -> Path:
    """A one-instance training scenario with traces (report reads them)."""
    return write(tmp_path, {**SMALL, "trace": {"enabled": True}, **changes})


@pytest.fixture
def reported(tmp_path: Path) -> tuple[Path, Path]:
    """(scenario, OUT): a run with its report (HTML too)."""
    scenario, out = _traced(tmp_path), tmp_path / "out"
    assert invoke("run", scenario, "-o", out).exit_code == 0
    result = invoke("report", out, "--html")
    assert result.exit_code == 0, result.output
    return scenario, out


def test_the_report_writes_only_files_named_as_its_own(reported: tuple[Path, Path]) -> None:
    _, out = reported
    written = {p.name for p in (out / "report").iterdir()}
    assert written and written <= REPORT_FILES


@pytest.mark.parametrize("command", ["run", "report"])
def test_a_png_of_yours_in_report_is_kept_without_force(reported: tuple[Path, Path],
                                                         command: str) -> None:
    """Any *.png in OUT/report/ counted as the report's: `run` and `report` deleted a
    figure of the user's there without --force. Only the names the report writes count."""
    scenario, out = reported
    mine = out / "report" / "my-own-figure.png"
    mine.write_bytes(b"my figure")
    args = ("run", scenario, "-o", out) if command == "run" else ("report", out)
    refused(invoke(*args), "--force")
    assert mine.read_bytes() == b"my figure"
    assert invoke(*args, "--force").exit_code == 0


# ---------------------------------------------------------------------------------------------
# #7: an earlier run is replaced without --force only when its settings are this run's


@pytest.mark.parametrize(("args", "named"), [
    (("--set", "duration=2h"), "duration"),
    (("--seed", "9"), "seed 0"),
    (("--replications", "2"), "replications 1"),
])
def test_an_earlier_run_of_other_settings_is_kept_without_force(
        tmp_path: Path, args: tuple[str, ...], named: str) -> None:
    """An OUT counted as an earlier run of the same scenario by its name alone: a run of
    other --set values, seed or replications replaced it (a 50-replication month, a golden
    run into with --force) without --force. Refused now, saying what differs."""
    scenario, out = write(tmp_path, SMALL), tmp_path / "out"
    assert invoke("run", scenario, "-o", out).exit_code == 0
    before = (out / "summary.json").read_text()
    result = invoke("run", scenario, "-o", out, *args)
    refused(result, "other settings", named, "--force")
    assert (out / "summary.json").read_text() == before
    assert invoke("run", scenario, "-o", out, *args, "--force").exit_code == 0
    # the same settings again: the same outputs by determinism, replaced without --force
    again = invoke("run", scenario, "-o", out, *args)
    assert again.exit_code == 0, again.output
    assert "replaced the earlier run" in again.output


def test_a_golden_in_a_run_folder_is_kept_without_force(tmp_path: Path) -> None:
    """`check --update` writes the golden summary into a folder that may also hold a run's
    traces (after `run --force` into it): a run of the same settings replaced the golden
    (with a summary that is not one: volatile fields, unrounded floats) without --force."""
    scenario, out = write(tmp_path, SMALL), tmp_path / "out"
    assert invoke("run", scenario, "-o", out).exit_code == 0
    summary = json.loads((out / "summary.json").read_text())
    del summary["wall_s"], summary["clustersim_version"]  # as check --update writes it
    (out / "summary.json").write_text(json.dumps(summary))
    refused(invoke("run", scenario, "-o", out), "a golden summary", "--force")
    assert "wall_s" not in json.loads((out / "summary.json").read_text())


# ---------------------------------------------------------------------------------------------
# #8: a sweep into the folder of a trace its scenario reads is refused even with --force


def _philly(tmp_path: Path) -> Path:
    """trace-philly and its trace, copied: scenario in tmp_path, trace in tmp_path/traces."""
    import shutil

    (tmp_path / "traces").mkdir()
    for name in ("philly-sample.json", "helios-sample.csv"):
        shutil.copy(ROOT / "scenarios" / "traces" / name, tmp_path / "traces" / name)
    shutil.copy(ROOT / "scenarios" / "trace-philly.yaml", tmp_path / "trace-philly.yaml")
    return tmp_path / "trace-philly.yaml"


@pytest.mark.parametrize("variants", [None, "other"])
def test_a_sweep_into_its_traces_folder_is_refused_even_with_force(
        tmp_path: Path, variants: str | None) -> None:
    """`sweep -o scenarios/traces --force` deleted the traces the swept scenario reads (only
    the sweep file and the scenario were protected), where `run` refuses such a folder even
    with --force. The same files are protected now, a variant's trace too."""
    _philly(tmp_path)
    sweep: dict = {"scenario": "trace-philly.yaml", "seeds": [0]}
    held = tmp_path / "traces"
    if variants:  # a variant replays another trace, in a folder of its own
        held = tmp_path / "other"
        held.mkdir()
        (held / "philly.json").write_bytes((tmp_path / "traces" / "philly-sample.json")
                                           .read_bytes())
        sweep["variants"] = [{"name": "other", "set": {"workload.trace": "other/philly.json"}}]
    before = {p.name: p.read_bytes() for p in held.iterdir()}
    result = invoke("sweep", write(tmp_path, sweep, "sweep.yaml"), "-o", held, "--force")
    refused(result, "an input of this command", "even with --force")
    assert {p.name: p.read_bytes() for p in held.iterdir()} == before


# ---------------------------------------------------------------------------------------------
# #3: `check` with no arguments reports the reference scenarios it cannot check


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder: single-trn2 and one-ultraserver with their goldens, a plan input."""
    import shutil

    for name in ("single-trn2", "one-ultraserver"):
        (tmp_path / "results" / name).mkdir(parents=True)
        shutil.copy(ROOT / "results" / name / "summary.json",
                    tmp_path / "results" / name / "summary.json")
    (tmp_path / "scenarios").mkdir()
    for name in ("single-trn2", "one-ultraserver", "plan-llama3-405b"):
        shutil.copy(ROOT / "scenarios" / f"{name}.yaml", tmp_path / "scenarios" / f"{name}.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_check_reports_a_reference_scenario_that_no_longer_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference scenario the schema now refuses was skipped in silence ("an invalid file
    is reported when it is checked by name") and the check passed: exit 0."""
    project = _project(tmp_path, monkeypatch)
    broken = project / "scenarios" / "one-ultraserver.yaml"
    broken.write_text(broken.read_text() + "bogus_key: 1\n")
    result = invoke("check")
    refused(result, "one-ultraserver.yaml", "bogus_key")
    assert "ok single-trn2" in result.stdout  # the others are still checked
    assert "plan-llama3-405b" not in result.stdout + result.stderr  # a plan input: no golden


@pytest.mark.parametrize("how", ["renamed", "deleted"])
def test_check_reports_a_golden_no_scenario_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A reference scenario renamed or deleted left its golden unchecked, never mentioned."""
    project = _project(tmp_path, monkeypatch)
    scenario = project / "scenarios" / "one-ultraserver.yaml"
    if how == "renamed":
        scenario.write_text(scenario.read_text().replace("name: one-ultraserver",
                                                         "name: one-ultraserver-renamed"))
    else:
        scenario.unlink()
    result = invoke("check")
    refused(result, str(Path("results") / "one-ultraserver"), "no scenarios/*.yaml names")
    assert "ok single-trn2" in result.stdout


# ---------------------------------------------------------------------------------------------
# #9: the seed a run used is the one its effective scenario records


def _summary(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    del summary["wall_s"]
    return summary


@pytest.mark.parametrize("source", ["small", "mix-128-trn2"])
def test_the_effective_scenario_of_a_seeded_run_gives_the_same_run(
        tmp_path: Path, source: str) -> None:
    """`--seed` was in summary.json only: OUT/scenario.yaml and the traces' scenario said the
    file's seed, so running OUT/scenario.yaml again gave another answer. A workload's job
    mix is drawn with the file's seed (`--seed` varies failures, not the mix): the effective
    scenario keeps it as workload.seed."""
    import yaml

    if source == "small":
        scenario, shorter = _traced(tmp_path), ["--set", "duration=1d"]
    else:
        scenario = ROOT / "scenarios" / "mix-128-trn2.yaml"
        shorter = ["--set", "duration=1d", "--set", "workload.arrivals.count=15"]
    out, again = tmp_path / "out", tmp_path / "again"
    first = invoke("run", scenario, *shorter, "--seed", "3", "-o", out)
    assert first.exit_code == 0, first.output
    effective = yaml.safe_load((out / "scenario.yaml").read_text())
    assert effective["seed"] == 3
    import pyarrow.parquet as pq

    metadata = pq.read_schema(out / "job_summary.parquet").metadata
    assert yaml.safe_load(metadata[b"clustersim.scenario"])["seed"] == 3
    rerun = tmp_path / "rerun.yaml"
    rerun.write_text((out / "scenario.yaml").read_text())
    result = invoke("run", rerun, "-o", again)
    assert result.exit_code == 0, result.output
    assert _summary(again) == _summary(out)


def test_two_different_seeds_are_refused(tmp_path: Path) -> None:
    scenario = write(tmp_path, SMALL)
    refused(invoke("run", scenario, "--seed", "1", "--set", "seed=2", "-o", tmp_path / "out"),
            "--seed 1", "seed=2", "two different seeds")
    assert not (tmp_path / "out").exists()
    result = invoke("run", scenario, "--seed", "2", "--set", "seed=2", "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------------------------------------
# #4: goodput() and compare() cover every job of a run whose summary lists only the largest


def test_goodput_and_compare_cover_every_job_of_a_large_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past 2,000 jobs summary.json lists the 100 largest: goodput() and compare() iterated
    it and returned 100 rows of 2,500 jobs (fleet totals undercounted, nothing said). The
    limits are lowered here (10 jobs, the 5 largest) so that 15 jobs are past them."""
    import pandas as pd

    import clustersim.runner.api as api
    from clustersim.analysis import compare, load_run
    from clustersim.scenario.loader import load_scenario

    monkeypatch.setattr(api, "SUMMARY_JOBS", 10)
    monkeypatch.setattr(api, "LARGEST_JOBS", 5)
    scenario = load_scenario(ROOT / "scenarios" / "mix-128-trn2.yaml",
                             ["duration=1d", "workload.arrivals.count=15",
                              "trace.enabled=false"])
    api.run_to(scenario, tmp_path / "out")
    run = load_run(tmp_path / "out")
    assert "jobs_listed" in run.summary
    every = pd.read_parquet(tmp_path / "out" / "job_summary.parquet")
    assert len(run.summary["jobs"]) < len(every)
    goodput = run.goodput()
    assert list(goodput["job"]) == list(every["name"])
    assert goodput["useful_h"].sum() == pytest.approx(every["useful_s"].sum() / 3600)
    assert goodput["lost_work_h"].sum() == pytest.approx(
        every["lost_time_s.lost_work"].sum() / 3600)
    table = compare([run])
    assert len(table) == len(every)
    assert table["steps_completed"].sum() == every["steps_completed"].sum()
