"""Session 18 fixes (helper fix18f2), from a new user's review of planning and serving: the
plan engine shuts its workers down before an error exits; a plan counts whole steps; sequence
parallelism needs a sequence length the TP ranks can split; a deadline needs a unit; the CLI
page says what the tool does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import invoke, refused, write

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "scenarios" / "plan-trn2-vs-p5en.yaml"


def _square(x: int) -> int:
    return x * x


# -- finding 3: `OSError: Bad file descriptor` after a serving plan's refusal

def test_an_engine_left_by_an_error_has_stopped_its_pool_thread() -> None:
    """On an error the engine terminated its workers and returned at once; the pool's manager
    thread then closed its wake-up pipe while the interpreter's exit hook wrote to it, which
    printed a traceback after the CLI's error in about 1 plan in 6."""
    from clustersim.planning.engine import Engine

    with pytest.raises(RuntimeError), Engine("local", workers=2) as engine:
        assert engine.map(_square, [1, 2, 3]) == [1, 4, 9]
        thread = engine._pool._executor_manager_thread
        raise RuntimeError("no configuration holds")
    assert not thread.is_alive()


SERVE = {
    "name": "sv", "seed": 0, "duration": "10min", "hardware": "trn2",
    "cluster": {"instances": 2},
    "serve": [{
        "name": "chat", "model": "llama3.1-70b", "precision": "bf16",
        "parallelism": {"tp": 64}, "replicas": 1,
        "server": {"max_batch": 64, "max_tokens_per_iteration": 4096, "chunked_prefill": True},
        "workload": {
            "arrival": "poisson", "rate": "2/s",
            "input_tokens": {"distribution": "lognormal", "median": 1024, "sigma": 0.8,
                             "max": 8192},
            "output_tokens": {"distribution": "lognormal", "median": 256, "sigma": 0.8,
                              "max": 2048}},
        "slo": {"ttft": "2s", "tpot": "1ms"}}]}


@pytest.mark.slow
def test_a_serving_plan_nothing_holds_exits_without_a_traceback(tmp_path: Path) -> None:
    """The reviewer's command, in fresh interpreters (the race was at interpreter exit)."""
    path = write(tmp_path, SERVE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for attempt in range(6):
        done = subprocess.run(
            [sys.executable, "-m", "clustersim", "plan", str(path), "--workers", "2",
             "-o", str(tmp_path / "out"), "--force"],
            capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 2, done.stderr
        assert "no configuration of 'chat'" in done.stderr
        assert "Traceback" not in done.stderr and "Bad file" not in done.stderr, (
            attempt, done.stderr)


# -- finding 8: a token budget under one step cost nothing

TINY = {"name": "plan-tiny", "hardware": "trn1", "cluster": {"instances": 1},
        "jobs": [{"name": "train", "model": {"name": "tiny", "layers": 2, "hidden": 512,
                                             "heads": 4, "vocab": 1000, "seq_len": 512},
                  "seq_len": 512, "global_batch": 4}],
        "failures": {"preset": "llama3"}}


@pytest.mark.parametrize("steps", [0.001, 1.5])
def test_a_token_budget_is_trained_in_whole_steps(steps: float) -> None:
    """`plan --tokens 1K` printed 0.0 d and $0.00 while the scenario it wrote ran one whole
    step: the time, cost and energy now count the steps that scenario runs."""
    from clustersim.planning import PlanOptions, plan
    from clustersim.scenario.loader import scenario_from_dict

    tokens_per_step = 4 * 512
    scenario = scenario_from_dict(TINY, planning=True)
    result = plan(scenario, PlanOptions(tokens=steps * tokens_per_step, top=3))
    best = result.best
    whole = -(-steps // 1)
    assert best["time_to_train_s"] == pytest.approx(
        whole * best["step_time_s"] / best["ettr"], rel=1e-12)
    price = scenario.hardware.instance.price_per_hour_usd
    assert best["cost_usd"] == pytest.approx(price * best["time_to_train_s"] / 3600, rel=1e-12)
    # Per million tokens: the rate of the tokens trained, as without a budget.
    assert best["cost_per_million_tokens_usd"] == pytest.approx(
        best["cost_usd"] * 1e6 / (whole * tokens_per_step), rel=1e-12)


def test_a_plan_of_seconds_prints_them_not_0_0_days(tmp_path: Path) -> None:
    result = invoke("plan", write(tmp_path, TINY), "--tokens", "1K", "-o", tmp_path / "p")
    assert result.exit_code == 0, result.output
    assert "0.0 d" not in result.stdout and "time to train " in result.stdout


# -- finding 10: sequence parallelism over a sequence the tp ranks cannot split

def _sp(seq_len: int, tp: int, cp: int) -> dict:
    return {"name": "sp", "hardware": "trn2", "cluster": {"instances": 1},
            "jobs": [{"name": "train", "model": "llama3-8b", "seq_len": seq_len,
                      "global_batch": 64 // (tp * cp),
                      "parallelism": {"tp": tp, "cp": cp, "dp": 64 // (tp * cp),
                                      "sequence_parallel": True}}]}


@pytest.mark.parametrize(("seq_len", "tp", "cp", "words"), [
    (3, 64, 1, "seq_len 3 over tp 64"),
    (8190, 64, 1, "divisible by tp = 64"),
    (8200, 16, 4, "a cp rank's 2050 positions (seq_len 8200 over cp 4)"),
])
def test_sequence_parallelism_needs_tp_to_divide_the_sequence(
        tmp_path: Path, seq_len: int, tp: int, cp: int, words: str) -> None:
    """Megatron and NxD scatter the sequence over the tp ranks (`_split_along_first_dim`
    asserts tp divides it); `step` ran seq_len 3 and 8190 over tp 64."""
    result = invoke("validate", write(tmp_path, _sp(seq_len, tp, cp)))
    refused(result, "jobs.0.parallelism.sequence_parallel = true", words,
            "sequence_parallel: false")


def test_sequence_parallelism_over_a_sequence_tp_divides_is_accepted(tmp_path: Path) -> None:
    assert invoke("validate", write(tmp_path, _sp(8192, 16, 4))).exit_code == 0


def test_the_planner_prunes_sequence_parallelism_tp_cannot_split() -> None:
    """`plan --seq-len 3` proposed tp 64 with sequence parallelism."""
    from clustersim.planning import PlanOptions, plan
    from clustersim.scenario.loader import scenario_from_dict

    # tp 2 divides 510, tp 4 does not
    raw = {**TINY, "jobs": [{**TINY["jobs"][0], "seq_len": 510, "global_batch": 16}]}
    result = plan(scenario_from_dict(raw, planning=True), PlanOptions(top=50))
    rows = result.rows
    bad = rows[rows["sequence_parallel"] & ((510 // rows["cp"]) % rows["tp"] != 0)]
    assert len(bad) and (bad["status"] == "pruned").all()
    assert bad["why"].str.contains("per cp rank over tp").all()
    assert rows[rows["sequence_parallel"] & (rows["tp"] == 2)]["status"].ne("pruned").any()
    assert not any(r["sequence_parallel"] and 510 % r["tp"] for r in result.ranked)


# -- finding 9: `--deadline 40` was 40 seconds

@pytest.mark.parametrize("bare", ["40", "1e3", "0.5"])
def test_a_deadline_without_a_unit_is_refused(tmp_path: Path, bare: str) -> None:
    result = invoke("plan", write(tmp_path, TINY), "--tokens", "1M", "--deadline", bare,
                    "-o", tmp_path / "p")
    refused(result, f"--deadline '{bare}'", "without a unit", f"{bare}d")
    assert not (tmp_path / "p").exists()


def test_a_deadline_with_its_unit_is_taken(tmp_path: Path) -> None:
    result = invoke("plan", write(tmp_path, TINY), "--tokens", "1M", "--deadline", "40d",
                    "-o", tmp_path / "p", "--json")
    assert result.exit_code == 0, result.output


# -- findings 5 and 13: docs/cli.md against what `plan` does

def _plain(text: str) -> str:
    return " ".join(text.split())


def test_cli_md_gives_the_exit_status_of_a_deadline_nothing_meets(tmp_path: Path) -> None:
    """The page said both 2 and 0; the tool exits 0 with the closest candidates."""
    result = invoke("plan", write(tmp_path, TINY), "--tokens", "1T", "--deadline", "1s",
                    "-o", tmp_path / "p")
    assert result.exit_code == 0, result.output
    assert "nothing meets the constraints: --deadline" in _plain(result.stdout)
    page = _plain((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert "a deadline or budget nothing meets (the message gives" not in page
    assert ("A deadline or budget nothing meets is an answer, not an error" in page
            and "the exit status is 0 (`meets_constraints: false` in `--json`)" in page)


def test_chips_not_whole_instances_are_rounded_down_as_cli_md_says(tmp_path: Path) -> None:
    """`--chips 17` on 16-chip instances: "planned at 16 (1 instances)"; cli.md said the
    counts must be whole."""
    result = invoke("plan", write(tmp_path, TINY), "--chips", "17", "-o", tmp_path / "p")
    assert result.exit_code == 0, result.output
    assert "planned at 16 (1 instance)" in _plain(result.output)
    page = _plain((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert "counts must be whole instances" not in page
    assert "is planned at the whole ones that fit in it, with a note" in page


# -- finding 14: small output problems

def test_a_hardware_whose_candidates_all_miss_the_deadline_says_so(tmp_path: Path) -> None:
    """trn1 misses a 1-day deadline p5 meets: it said "trn1: no feasible candidate"."""
    result = invoke("plan", write(tmp_path, TINY), "--hardware", "trn1,p5", "--tokens", "10B",
                    "--deadline", "1d", "-o", tmp_path / "p")
    assert result.exit_code == 0, result.output
    text = _plain(result.stdout)
    assert "trn1: no feasible candidate" not in text
    assert "trn1: none of its" in text and "simulated candidates meets the constraints (the " \
        "fastest trains in" in text and "d at 16 chips)" in text


def test_a_token_budget_past_max_steps_is_refused(tmp_path: Path) -> None:
    """`--tokens 1e30` planned 2e22 days."""
    result = invoke("plan", write(tmp_path, TINY), "--tokens", "1e30", "-o", tmp_path / "p")
    refused(result, "--tokens 1e+30", "steps of the job's 2,048-token batch",
            "expected at most 1e+12 steps", "MAX_STEPS")
    assert not (tmp_path / "p").exists()


def test_huge_plan_figures_keep_the_table_readable() -> None:
    from clustersim.cli.plan_tables import _fmt

    assert _fmt(1.4e13, "days") == "1.62e+08 d" and _fmt(9.3e12, "usd") == "$9.3e+12"
    assert _fmt(3.56e6, "days") == "41.2 d" and _fmt(2_335_534.4, "usd") == "$2,335,534"


def test_hardware_prints_catalog_floats_without_binary_noise() -> None:
    """`clustersim hardware trn3-gen2` printed pass_overhead 0.011090000000000001."""
    result = invoke("hardware", "trn3-gen2")
    assert result.exit_code == 0, result.output
    assert "0.01109 " in result.stdout and "0.011090000000000001" not in result.stdout
    assert "671.0" in result.stdout  # whole figures as before
