"""Fuzzing in the suite: scenario mutations and command lines, each case in a
forked process with a time (30 s) and memory (4 GiB) budget. Every case must exit 0 or 2
(never 1 or a traceback for the input's faults; `check` exits 1 when a figure moved), answer
in time, leave no temporary, print and write only strict JSON, and write consistent summaries
(useful time within the wall time and from completed steps). The newer surfaces (serve keys,
request traces, plan flags, damaged run folders and goldens, sweep grids; sites, job traces
in the five formats, serving days and the serving planner; 2025's models with the serving
stacks) run a few to 25 cases each, marked slow. scripts/fuzz.py runs the same generators
for thousands of cases."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import fuzz  # noqa: E402

pytestmark = [pytest.mark.skipif(not hasattr(os, "fork"), reason="cases run in forked processes"),
              pytest.mark.slow]  # a minute each: run by .ci/run (pytest -m "slow or not slow")
FUZZ = settings(max_examples=75, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module", autouse=True)
def warm() -> None:
    fuzz.warm_up()


def check(case: dict, timeout_s: float = 30.0) -> None:
    outcome = fuzz.run_case(case, timeout_s=timeout_s)
    assert outcome.kind in fuzz.PASSES, (
        f"{outcome.kind}: clustersim {' '.join(outcome.args)}\n{outcome.detail}")


@FUZZ
@given(fuzz.scenario_case())
def test_scenario_mutations_exit_0_or_2_with_strict_consistent_outputs(case: dict) -> None:
    check(case)


@FUZZ
@given(fuzz.cli_case())
def test_command_lines_exit_0_or_2_with_strict_outputs_and_no_leftovers(case: dict) -> None:
    check(case)


NEWER = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


@pytest.mark.slow
@NEWER
@given(fuzz.serve_case())
def test_serve_key_mutations_exit_0_or_2(case: dict) -> None:
    check(case)


@pytest.mark.slow
@NEWER
@given(fuzz.trace_case())
def test_request_traces_exit_0_or_2(case: dict) -> None:
    check(case)


@pytest.mark.slow
@NEWER
@given(fuzz.plan_case())
def test_plan_flags_exit_0_or_2_with_no_leftovers(case: dict) -> None:
    check(case)


@pytest.mark.slow
@NEWER
@given(fuzz.report_case())
def test_damaged_run_folders_exit_0_or_2_under_report(case: dict) -> None:
    check(case)


@pytest.mark.slow
@NEWER
@given(fuzz.golden_case())
def test_damaged_goldens_exit_0_2_or_differ_under_check(case: dict) -> None:
    check(case)


@pytest.mark.slow
@NEWER
@given(fuzz.sweep_case())
def test_sweep_grids_exit_0_or_2(case: dict) -> None:
    check(case)


FLEET = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


@pytest.mark.slow
@FLEET
@given(fuzz.SURFACES["sites"]())
def test_sites_and_site_events_exit_0_or_2(case: dict) -> None:
    check(case, 180.0)  # `plan` searches: about 20 s of CPU, minutes on a loaded machine


@pytest.mark.slow
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(fuzz.SURFACES["fleettrace"]())
def test_job_traces_in_the_five_formats_exit_0_or_2(case: dict) -> None:
    check(case)


@pytest.mark.slow
@FLEET
@given(fuzz.SURFACES["serveday"]())
def test_serving_days_exit_0_or_2(case: dict) -> None:
    check(case)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(fuzz.SURFACES["serveplan"]())
def test_the_serving_planner_exits_0_or_2(case: dict) -> None:
    check(case, 180.0)  # a search with a simulation per candidate left


@pytest.mark.slow
@NEWER
@given(fuzz.SURFACES["models"]())
def test_2025_models_stacks_and_buckets_exit_0_or_2(case: dict) -> None:
    check(case)


def test_the_classifier_catches_what_it_must(tmp_path: Path) -> None:
    """The fuzz harness itself: a bare NaN, a leftover temporary, useful time without a step
    and a timeout are failures, not passes."""
    assert "useful_s" in fuzz.inconsistency(
        {"jobs": {"j": {"useful_s": 5.0, "wall_s": 10.0, "ettr": 0.5, "steps_completed": 0}}})
    assert "outside" in fuzz.inconsistency(
        {"jobs": {"j": {"useful_s": 11.0, "wall_s": 10.0, "ettr": 1.1}}})
    assert fuzz.inconsistency(
        {"jobs": {"j": {"useful_s": 5.0, "wall_s": 10.0, "ettr": 0.5}}}) == ""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text('{"x": NaN}')
    payload = {"exit_code": 0, "stdout": "", "stderr": "", "escaped": ""}
    assert fuzz.classify(payload, tmp_path, ["run"]).kind == "bad-json"
    (tmp_path / "out" / "summary.json").write_text("{}")
    (tmp_path / ".out.tmp-1-x").mkdir()
    assert fuzz.classify(payload, tmp_path, ["run"]).kind == "leftover"
    assert fuzz.classify({**payload, "exit_code": 1}, tmp_path, ["run"]).kind == (
        "internal-error")
    slow = {"files": {"s.py": ""}, "args": ["--version"]}
    assert fuzz.run_case(slow, timeout_s=30).kind == "ok"
