"""Outputs under stress: paths resolved before checks, one writer per OUT, stale
temporaries removed, SIGINT and SIGTERM cleaned up, sweeps stopped promptly with their
finished rows kept, workers capped, goldens that cannot be read or written refused."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from sweep_helpers import sweep_base
from sweep_helpers import write_sweep as write_thirty_day_sweep
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.runner import api
from clustersim.runner.figures import capped_workers
from clustersim.runner.outputs import (
    OutputDirError,
    atomic_output_dir,
    check_output_dir,
    output_lock,
)
from clustersim.runner.sweep import SweepInterrupted, run_sweep
from clustersim.scenario.loader import load_scenario
from clustersim.training.profile import JobDoesNotFit

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
runner = CliRunner()

SMALL = """\
name: small
hardware: trn2
duration: 5d
cluster: {instances: 4, spares: 1}
jobs:
  - {name: train, model: llama3-8b, global_batch: 64, recompute: selective,
     parallelism: {tp: 8, dp: 32, zero: 1, sequence_parallel: true}}
trace: {enabled: false}
"""
# A run of ~20 s (a year of a 512-chip cluster failing 300 times as often as Llama 3's):
# long enough to be interrupted while it simulates.
SLOW = ["--set", "failures.scale=300", "--set", "duration=365d", "--set", "trace.bin=1h"]


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()
                  if ".tmp-" in p.name or ".old-" in p.name or p.name.endswith(".lock"))


def cli(*args: object, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "clustersim", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


# ---------------------------------------------------------------------------------------------
# 1. Paths are resolved before every check


def test_an_output_path_through_dotdot_is_checked_as_the_folder_it_names(small: Path,
                                                                          tmp_path: Path):
    precious = tmp_path / "precious"
    precious.mkdir(mode=0o700)
    (precious / "thesis.tex").write_text("years of work")
    result = invoke("run", small, "-o", f"{precious}/typo/..")
    assert result.exit_code == 2, result.output
    assert "--force" in result.stderr
    assert (precious / "thesis.tex").read_text() == "years of work"
    assert not (precious / "typo").exists()
    with pytest.raises(OutputDirError, match="not empty"):
        check_output_dir(precious / "a" / "b" / ".." / "..", force=False)


def test_a_folder_name_too_long_for_the_file_system_exits_2(small: Path, tmp_path: Path):
    result = invoke("run", small, "-o", tmp_path / ("x" * 300))
    assert result.exit_code == 2, result.output
    assert "at most 200" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.yaml"]


# ---------------------------------------------------------------------------------------------
# 2. One writer per OUT


def _hold_lock(out: str, ready, release) -> None:
    with output_lock(out):
        ready.set()
        release.wait(60)


@pytest.mark.slow  # signals and processes: more than 5 s
def test_a_locked_output_is_refused_with_the_holders_pid(small: Path, tmp_path: Path):
    out = tmp_path / "out"
    context = multiprocessing.get_context("spawn")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=_hold_lock, args=(str(out), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        result = invoke("run", small, "-o", out)
        assert result.exit_code == 2, result.output
        assert "another clustersim run" in result.stderr
        assert f"process {holder.pid}" in result.stderr
        assert not out.exists()
    finally:
        release.set()
        holder.join(60)
    assert invoke("run", small, "-o", out).exit_code == 0
    assert leftovers(tmp_path) == []


@pytest.mark.slow  # signals and processes: more than 5 s
def test_two_runs_into_one_output_at_once_give_one_winner(tmp_path: Path):
    out = tmp_path / "out"
    # Two scenarios (a run may replace an earlier run of its own scenario once it is done):
    # whichever comes second is refused, by the lock or, if the first is already done, as a
    # folder holding another scenario's run.
    first = cli("run", QUICKSTART, "-o", out, "--set", "duration=90d")
    second = cli("run", QUICKSTART, "-o", out, "--set", "duration=90d", "--set", "name=other")
    codes = sorted(p.wait(120) for p in (first, second))
    messages = first.stderr.read() + second.stderr.read()
    assert codes == [0, 2], messages
    assert "another clustersim run" in messages or "holds more than" in messages
    assert leftovers(tmp_path) == []


def test_the_lock_is_reentrant_in_one_process(tmp_path: Path):
    out = tmp_path / "out"
    with output_lock(out), atomic_output_dir(out) as staging:
        (staging / "a").write_text("1")
    assert (out / "a").exists()
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# 7. Leftovers and signals


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporaries_of_a_dead_run_are_removed_live_ones_kept(tmp_path: Path):
    out = tmp_path / "out"
    dead = tmp_path / f".out.tmp-{_dead_pid()}-abcd1234"
    dead.mkdir()
    (dead / "events.parquet").write_text("half")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = tmp_path / f".out.tmp-{sleeper.pid}-abcd1234"
        alive.mkdir()
        other = tmp_path / f".other.tmp-{_dead_pid()}-abcd1234"  # not this OUT's
        other.mkdir()
        with atomic_output_dir(out) as staging:
            (staging / "summary.json").write_text("{}")
        assert not dead.exists()
        assert alive.exists() and other.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.slow  # signals and processes: more than 5 s
def test_a_run_killed_with_sigkill_is_cleaned_by_the_next(tmp_path: Path):
    out = tmp_path / "out"
    victim = cli("run", QUICKSTART, "-o", out, *SLOW)
    wait_for(lambda: any(".out.tmp-" in p.name for p in tmp_path.iterdir()))
    victim.kill()
    victim.wait(60)
    assert any(".out.tmp-" in name for name in leftovers(tmp_path))
    result = invoke("run", QUICKSTART, "-o", out, "--set", "duration=7d")
    assert result.exit_code == 0, result.output
    assert leftovers(tmp_path) == []


@pytest.mark.slow  # signals and processes: more than 5 s
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signalled_run_says_nothing_was_written_and_leaves_nothing(tmp_path: Path,
                                                                    signum: int, status: int):
    out = tmp_path / "out"
    victim = cli("run", QUICKSTART, "-o", out, *SLOW)
    wait_for(lambda: any(".out.tmp-" in p.name for p in tmp_path.iterdir()))
    time.sleep(0.5)
    victim.send_signal(signum)
    code = victim.wait(60)
    stderr = victim.stderr.read()
    assert code == status, stderr
    assert "interrupted, nothing written" in stderr
    assert "Traceback" not in stderr
    assert not out.exists()
    assert leftovers(tmp_path) == []


def write_sweep(tmp_path: Path, **sweep) -> Path:
    return write_thirty_day_sweep(tmp_path, base=sweep_base("30d"), **sweep)


def test_an_interrupted_sweep_keeps_its_finished_rows_and_stops_its_workers(tmp_path: Path):
    path = write_sweep(tmp_path, grid={"failures.scale": [1, 2, 3, 4, 5, 6, 7, 8]}, seeds=[0])

    def stop(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(SweepInterrupted) as caught:
        run_sweep(path, workers=2, progress=stop)
    assert len(caught.value.rows) == 2 and caught.value.total == 8
    assert set(caught.value.rows["status"]) == {"ok"}
    assert len(caught.value.summary) == 2
    assert multiprocessing.active_children() == []


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.slow  # signals and processes: more than 5 s
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for the workers")
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signalled_sweep_stops_promptly_and_writes_a_partial_table(tmp_path: Path,
                                                                    signum: int, status: int):
    # Two fast runs (a week: about 2 s each) finish first; the year-long ones are still
    # running, or queued, when it comes. A year at this failure scale takes 2-5 s of CPU
    # since checkpoints are worked out in closed form (it was about 9 s), so there are
    # eighteen of them: the sweep cannot end in the 8 s before the signal. (Each value once:
    # a sweep refuses a grid value given twice.)
    grid = {"duration": ["7d", "6d"] + [f"{365 - i}d" for i in range(18)]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "scenario": str(QUICKSTART), "grid": grid, "seeds": [0],
        "variants": [{"name": "busy", "set": {"failures.scale": 1500, "trace.enabled": False}}]}))
    out = tmp_path / "out"
    sweep = cli("sweep", path, "-o", out, "--workers", "2")
    wait_for(lambda: len(_children(sweep.pid)) >= 2)
    workers = _children(sweep.pid)
    time.sleep(8)  # the week-long runs are done by then, even on a loaded machine
    sent = time.monotonic()
    sweep.send_signal(signum)
    code = sweep.wait(60)
    stopped_s = time.monotonic() - sent
    stderr = sweep.stderr.read()
    assert code == status, stderr
    assert "Traceback" not in stderr
    assert stopped_s < 30, stopped_s  # not the minutes the queued runs would take
    wait_for(lambda: all(_gone(pid) for pid in workers), 10)
    assert leftovers(tmp_path) == []
    rows = pd.read_parquet(out / "sweep.parquet")
    assert 1 <= len(rows) < 20 and set(rows["status"]) == {"ok"}
    assert b"clustersim.partial" in pq.read_schema(out / "sweep.parquet").metadata
    assert "partial" in (out / "PARTIAL.txt").read_text()
    assert "partial" in stderr


# A signal sent to the process itself the moment it imports `module`: while the command
# line loads (clustersim.cli.app), or inside typer before the command's own handling
# (clustersim.runner.interrupts, imported by the command's wrapper).
_SIGNAL_ON_IMPORT = """
import builtins, os, signal, sys
real, sent, module, signum = builtins.__import__, [], sys.argv[1], int(sys.argv[2])
def hooked(name, *args, **kwargs):
    if name == module and not sent:
        sent.append(1)
        os.kill(os.getpid(), signum)
    return real(name, *args, **kwargs)
builtins.__import__ = hooked
sys.argv = ["clustersim", *sys.argv[3:]]
from clustersim.cli import main
main()
"""


@pytest.mark.parametrize("module", ["clustersim.cli.app", "clustersim.runner.interrupts"])
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_command_line_loads_exits_128_n_without_a_traceback(
        tmp_path: Path, module, signum, status):
    # The sweep parent's window outside interruptible(): a Ctrl-C while the command line
    # loaded escaped as a KeyboardInterrupt (a traceback, exit 1 or -2), and SIGTERM killed
    # it (-15); the entry point handles both from its first line.
    path = write_sweep(tmp_path, grid={"failures.scale": [1, 2]}, seeds=[0])
    result = subprocess.run(
        [sys.executable, "-c", _SIGNAL_ON_IMPORT, module, str(int(signum)), "sweep", str(path),
         "-o", str(tmp_path / "out")], env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr and "interrupted" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_workers_are_capped_at_the_work_and_the_cores():
    cores = os.cpu_count() or 1
    assert capped_workers(40, 2) == min(2, cores)
    assert capped_workers(None, 1000) == cores
    assert capped_workers(3, 1) == 1


def test_a_sweep_with_40_workers_for_2_runs_starts_at_most_2(tmp_path: Path, monkeypatch):
    started = []
    real = api.worker_pool

    def counting(workers: int):
        started.append(workers)
        return real(workers)

    monkeypatch.setattr("clustersim.runner.sweep.worker_pool", counting)
    path = write_sweep(tmp_path, grid={"failures.scale": [1, 2]}, seeds=[0])
    rows, _ = run_sweep(path, workers=40)
    assert len(rows) == 2
    assert all(n <= min(2, os.cpu_count() or 1) for n in started)


# ---------------------------------------------------------------------------------------------
# 8. Messages: goldens, jobs that do not fit


def _golden_project(tmp_path: Path) -> Path:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "small.yaml").write_text(SMALL)
    (tmp_path / "results" / "small").mkdir(parents=True)
    return tmp_path / "results" / "small" / "summary.json"


@pytest.mark.parametrize("content", ["{not json", "", '{"jobs": Infinity}', "[1, 2]"])
def test_check_exits_2_for_a_corrupt_golden(tmp_path: Path, monkeypatch, content: str):
    golden = _golden_project(tmp_path)
    golden.write_text(content)
    monkeypatch.chdir(tmp_path)
    result = invoke("check", "scenarios/small.yaml")
    assert result.exit_code == 2, result.output
    assert "summary.json" in result.stderr and "golden" in result.stderr


def test_check_exits_2_for_an_unwritable_golden(tmp_path: Path, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    golden = _golden_project(tmp_path)
    golden.parent.chmod(0o500)
    monkeypatch.chdir(tmp_path)
    try:
        result = invoke("check", "scenarios/small.yaml", "--update")
    finally:
        golden.parent.chmod(0o700)
    assert result.exit_code == 2, result.output
    assert "cannot write the golden" in result.stderr


def test_an_unwritable_golden_is_an_output_error(tmp_path: Path, monkeypatch):
    from clustersim.runner import check

    golden = _golden_project(tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_text", refuse)
    with pytest.raises(OutputDirError, match="cannot write the golden"):
        check.write_golden(golden, {"a": 1})
    assert not golden.exists()


def test_check_still_exits_1_when_a_figure_differs(tmp_path: Path, monkeypatch):
    golden = _golden_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert invoke("check", "scenarios/small.yaml", "--update").exit_code == 0
    data = json.loads(golden.read_text())
    data["chips"] += 1
    golden.write_text(json.dumps(data))
    assert invoke("check", "scenarios/small.yaml").exit_code == 1


def test_does_not_fit_names_the_file_and_the_job_key(tmp_path: Path):
    path = tmp_path / "big.yaml"
    path.write_text(SMALL.replace("recompute: selective,", "")
                    .replace("zero: 1, sequence_parallel: true", "zero: 0"))
    scenario = load_scenario(path)
    with pytest.raises(JobDoesNotFit) as caught:
        api.simulate(scenario)
    assert str(path) in str(caught.value)
    assert "jobs.0" in str(caught.value)


def test_a_signal_whose_exception_was_swallowed_still_stops_the_run(tmp_path: Path):
    """A SIGTERM landing where Python ignores exceptions (an import lock's callback prints
    "Exception ignored") must not let the run commit its output (seen once under load)."""
    from clustersim.runner import interrupts
    from clustersim.runner.outputs import atomic_output_dir

    out = tmp_path / "out"
    with pytest.raises(interrupts.Interrupted), interrupts.interruptible():
        with atomic_output_dir(out) as staging:
            (staging / "summary.json").write_text("{}")
            interrupts._received.append(signal.SIGTERM)  # as the handler does before raising
    assert not out.exists()
    assert leftovers(tmp_path) == []
    # The signal is forgotten once it has stopped the run: a later run in the same process
    # (the Python API, the next test) is not stopped by it.
    interrupts.raise_if_interrupted()
    with atomic_output_dir(tmp_path / "later") as staging:
        (staging / "summary.json").write_text("{}")
    assert (tmp_path / "later" / "summary.json").exists()


def test_every_table_a_run_writes_counts_as_an_earlier_run():
    """A run folder holding a table the list of run files lacks (job_summary.parquet, a
    fleet day's day/fleet tables) was refused on a re-run as holding 'more than an earlier
    run'."""
    from clustersim.analysis.trace import SERVING_TABLES, TABLES
    from clustersim.runner.outputs import RUN_FILES

    written = {f"{t}.parquet" for t in (*TABLES, *SERVING_TABLES, "job_summary")}
    assert written <= RUN_FILES, sorted(written - RUN_FILES)
