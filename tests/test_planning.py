"""The planner: its search space, pruning, bound, ranking, outputs and command line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from clustersim.calibration.step import STEP_MEASUREMENTS, step_scenario
from clustersim.cli.app import app
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.planning import Engine, PlanError, PlanOptions, plan
from clustersim.planning.outputs import best_scenario, pareto_front
from clustersim.planning.simulate import op_model, quick_bound, step_lower_bound
from clustersim.planning.space import (
    MemoryScreen,
    divisors,
    enumerate_space,
    job_for,
    memory_of,
    prune_reason,
    screen_job,
    space_size,
)
from clustersim.scenario.loader import ScenarioError, scenario_from_dict
from clustersim.training.step import StepModel

runner = CliRunner()
SMALL = {"name": "small", "layers": 8, "hidden": 2048, "heads": 16, "vocab": 32000,
         "seq_len": 2048}


def _raw(**job) -> dict:
    base = {"name": "plan-small", "hardware": "trn1", "cluster": {"instances": 2, "spares": 1},
            "jobs": [{"name": "train", "model": SMALL, "seq_len": 2048, "global_batch": 32,
                      **job}],
            "failures": {"preset": "llama3"}}
    return base


def _scenario(**job):
    return scenario_from_dict(_raw(**job), planning=True)


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]


def test_space_counts_follow_the_divisors():
    """tp x cp x pp x dp = ranks for every candidate, and every (tp, cp, pp) is listed with
    pp up to the layers (uneven stages) and cp keeping 1,024 positions per rank."""
    scenario = _scenario()
    job, hw = scenario.jobs[0], scenario.hardware
    space = enumerate_space("trn1", hw, 32, job)
    ranks = 32 * hw.chip.ranks
    assert all(c.tp * c.cp * c.pp * c.dp == ranks for c in space)
    triples = {(c.tp, c.cp, c.pp) for c in space}
    assert len(triples) == sum(
        len([pp for pp in divisors(ranks // (tp * cp)) if pp <= SMALL["layers"]])
        for tp in divisors(ranks) for cp in (1, 2) if (ranks // tp) % cp == 0)
    assert len(set(c.key() for c in space)) == len(space)
    assert not any(c.sequence_parallel and c.tp == 1 for c in space)
    assert not any(c.zero and c.dp * c.cp == 1 for c in space)
    assert space_size(hw, 32, job) == len(space)  # counted as listed for a dense model


def test_space_size_bounds_a_mixture_of_experts():
    """With experts, the count is an upper bound (ep that does not divide the experts, ZeRO-3
    with ep > 1 are listed once or not at all but counted in full)."""
    moe = {**SMALL, "experts": 6, "top_k": 2}
    job = scenario_from_dict(_raw(model=moe), planning=True).jobs[0]
    hw = catalog_entry("trn1")
    for chips in (16, 32):
        assert space_size(hw, chips, job) >= len(enumerate_space("trn1", hw, chips, job))


def test_prune_reasons_follow_the_loader_rules():
    """A candidate that passes divisibility and placement is a valid scenario job."""
    scenario = _scenario()
    job, hw = scenario.jobs[0], scenario.hardware
    seen = set()
    for c in enumerate_space("trn1", hw, 32, job)[::37]:
        reason = prune_reason(c, hw, job)
        raw = _raw(parallelism={"tp": c.tp, "pp": c.pp, "dp": c.dp, "interleave": c.interleave,
                                "sequence_parallel": c.sequence_parallel,
                                "zero": c.zero, "cp": c.cp},
                   micro_batch=c.micro_batch, recompute=c.recompute)
        if reason is None or reason.startswith("divisibility"):
            try:
                scenario_from_dict(raw)
                valid = True
            except ScenarioError:
                valid = False
            assert valid == (reason is None), (c, reason)
        seen.add(reason.split(":")[0] if reason else None)
    assert {None, "divisibility"} <= seen
    p5en = catalog_entry("p5en")  # 8 GPUs on NVSwitch: tp 16 would cross EFA
    placements = [prune_reason(c, p5en, job) for c in enumerate_space("p5en", p5en, 32, job)
                  if c.tp == 16]
    assert placements and all(r.startswith(("placement", "divisibility")) for r in placements)
    assert any(r.startswith("placement: tp 16 leaves an instance") for r in placements)


def test_memory_is_the_step_models():
    scenario = _scenario()
    job, hw = scenario.jobs[0], scenario.hardware
    model = StepModel(build_topology(hw, 2))
    for c in enumerate_space("trn1", hw, 32, job)[::211]:
        if prune_reason(c, hw, job) is None:
            candidate = job_for(job, c)
            assert memory_of(candidate, hw).per_chip == pytest.approx(
                model.memory(candidate).per_chip)


@pytest.mark.parametrize("hardware", ["trn1", "p4de"])
def test_screening_memory_is_memory_of_exactly(hardware):
    """The screening's memory table gives memory_of's figure to the bit, for every candidate
    of a space with uneven stages (10 layers), interleaving, context parallelism, ZeRO 0-3,
    flash (trn1) and unfused (p4de) attention."""
    model = {**SMALL, "layers": 10}
    job = scenario_from_dict(_raw(model=model, global_batch=64), planning=True).jobs[0]
    hw = catalog_entry(hardware)
    screen = MemoryScreen(job, hw)
    checked = 0
    for c in enumerate_space(hardware, hw, 32, job):
        if prune_reason(c, hw, job) is None:
            light = screen_job(job, c)
            assert screen.per_chip(light) == memory_of(light, hw).per_chip, c
            checked += 1
    assert checked > 1000


def test_bound_is_below_the_simulated_step():
    scenario = _scenario()
    job, hw = scenario.jobs[0], scenario.hardware
    model = StepModel(build_topology(hw, 2))
    ops = op_model(hw.model_dump_json(by_alias=True))
    checked = 0
    for c in enumerate_space("trn1", hw, 32, job)[::13]:
        if prune_reason(c, hw, job) is not None:
            continue
        candidate = job_for(job, c)
        bound = step_lower_bound(ops, candidate)
        simulated = model.profile(candidate).step_time_s
        assert 0 < bound <= simulated * (1 + 1e-9), c
        tighter = quick_bound(model, candidate, bound)
        assert bound <= tighter <= simulated * (1 + 1e-9), c
        checked += 1
    assert checked >= 10


@pytest.mark.slow  # a plan search: more than 5 s
def test_plan_finds_the_fastest_and_records_every_candidate():
    scenario = _scenario(parallelism={"tp": 8, "pp": 1, "dp": 8, "sequence_parallel": True},
                         recompute="selective")
    result = plan(scenario, PlanOptions(top=5))
    rows = result.rows
    assert len(rows) == result.considered
    assert result.pruned == (rows["status"] == "pruned").sum()
    assert set(rows["status"]) <= {"pruned", "simulated"}
    assert (rows.loc[rows["status"] == "pruned", "why"] != "").all()
    simulated = rows[rows["step_time_s"].notna()]
    assert result.best["step_time_s"] == simulated["step_time_s"].min()
    # The bound prunes only what cannot beat the best simulated.
    bounded = rows[rows["why"].str.startswith("bound")]
    assert (bounded["bound_s"] >= result.best["step_time_s"]).all()
    # The scenario's own configuration is there, with its modelled time.
    reference = rows[rows["reference"]]
    assert len(reference) == 1 and reference["step_time_s"].notna().all()
    assert result.best["step_time_s"] <= reference["step_time_s"].iloc[0]
    document = result.as_json()
    assert set(document) == {"best", "candidates", "considered", "pruned", "simulated",
                             "meets_constraints"}
    for key in ("hardware", "chips", "tp", "pp", "dp", "ep", "interleave", "micro_batch",
                "recompute", "sequence_parallel", "zero", "step_time_s", "mfu",
                "memory_per_chip_gib", "ettr", "time_to_train_s", "cost_usd", "energy_j"):
        assert key in document["best"]


@pytest.mark.slow  # a plan search: more than 5 s
def test_same_answer_on_a_process_pool():
    scenario = _scenario()
    serial = plan(scenario, PlanOptions(top=3))
    with Engine("local", workers=2) as pool:
        parallel = plan(scenario, PlanOptions(top=3), pool)
    assert parallel.as_json() == serial.as_json()
    pd.testing.assert_frame_equal(parallel.rows, serial.rows)


@pytest.mark.slow  # a plan search: more than 5 s
def test_more_chips_and_hardware_are_compared_on_failure_aware_figures():
    scenario = _scenario()
    result = plan(scenario, PlanOptions(chips=(16, 32, 64), tokens=1e11,
                                        objective="time-to-train"))
    chips = {r["chips"] for r in result.ranked}
    assert chips == {16, 32, 64}
    times = [r["time_to_train_s"] for r in result.ranked]
    assert times == sorted(times)
    for r in result.ranked:
        assert r["time_to_train_s"] == pytest.approx(1e11 / (r["tokens_per_s"] * r["ettr"]))


def test_pareto_front():
    points = [(1, 5), (2, 3), (3, 4), (4, 1), (2, 6)]
    assert pareto_front(points) == [0, 1, 3]


@pytest.mark.slow  # a plan search: more than 5 s
def test_impossible_constraints_say_what_would_help():
    scenario = _scenario()
    late = plan(scenario, PlanOptions(tokens=1e15, deadline_s=86400))  # closest shown
    assert not late.met and "--deadline" in late.notes[0] and late.ranked
    with pytest.raises(PlanError, match="runs nowhere.*fits on"):
        plan(scenario_from_dict(_raw(model="llama3.1-405b"), planning=True), PlanOptions())
    with pytest.raises(PlanError, match="unknown hardware"):
        plan(scenario, PlanOptions(hardware=("trn9",)))


@pytest.mark.parametrize("measurement", [m for m in STEP_MEASUREMENTS if m.hardware == "trn1"],
                         ids=lambda m: m.name)
@pytest.mark.slow  # a plan search: more than 5 s
def test_trn1_calibration_rows(measurement):
    """Each Trn1 row of the calibration: the plan's best is at least as fast in the model as
    the published configuration, which it simulates as the reference."""
    scenario = step_scenario(measurement)
    result = plan(scenario.model_copy(), PlanOptions(top=3))
    rows = result.rows
    reference = rows[rows["reference"]]
    assert len(reference) == 1
    assert result.best["step_time_s"] <= reference["step_time_s"].iloc[0] * (1 + 1e-9)


def test_written_scenario_runs_at_the_planned_step_time(tmp_path):
    scenario = _scenario(checkpoint={"interval": "1h", "write": "30s"})
    result = plan(scenario, PlanOptions(top=3, tokens=1e9))
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump(best_scenario(result)))
    out = tmp_path / "run"
    run = runner.invoke(app, ["run", str(path), "-o", str(out)])
    assert run.exit_code == 0, run.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"]["train"]["step_time_s"] == pytest.approx(result.best["step_time_s"],
                                                                     rel=1e-9)


def _write(tmp_path, raw) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_cli_plan_writes_outputs_and_json(tmp_path):
    scenario = _write(tmp_path, _raw())
    out = tmp_path / "plan"
    written = tmp_path / "best.yaml"
    result = runner.invoke(app, ["plan", scenario, "-o", str(out), "--json", "--top", "3",
                                 "--write-scenario", str(written)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document) == {"best", "candidates", "considered", "pruned", "simulated",
                             "meets_constraints"}
    assert len(document["candidates"]) <= 3
    frame = pd.read_parquet(out / "plan.parquet")
    assert len(frame) == document["considered"]
    assert (out / "pareto.png").stat().st_size > 0
    again = runner.invoke(app, ["plan", scenario, "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    ran = runner.invoke(app, ["run", str(written), "-o", str(tmp_path / "run")])
    assert ran.exit_code == 0, ran.output
    step = json.loads((tmp_path / "run" / "summary.json").read_text())["jobs"]["train"]
    assert step["step_time_s"] == pytest.approx(document["best"]["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("args, message", [
    (["--hardware", "trn9"], "unknown hardware"),
    (["--model", "llama3.1-405b"], "fits on"),
    (["--deadline", "1d"], "need --tokens"),
    (["--chips", "7"], "less than one of its instances"),  # sizes round down to whole instances
    (["--tokens", "lots"], "--tokens"),
    (["--objective", "speed"], "objective"),
    (["--global-batch", "3K"], "whole number of sequences"),
    (["--chips", "16:8"], "--chips"),
])
def test_cli_plan_bad_input_exits_2(tmp_path, args, message):
    scenario = _write(tmp_path, _raw())
    result = runner.invoke(app, ["plan", scenario, "-o", str(tmp_path / "out"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_run_needs_the_parallelism_plan_may_omit(tmp_path):
    scenario = _write(tmp_path, _raw())
    result = runner.invoke(app, ["run", scenario, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "jobs.0.parallelism" in result.output and "clustersim plan" in result.output


def test_global_batch_in_tokens(tmp_path):
    scenario = _write(tmp_path, _raw())
    result = runner.invoke(app, ["plan", scenario, "-o", str(tmp_path / "out"), "--json",
                                 "--global-batch", "32K", "--top", "1"])
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(tmp_path / "out" / "plan.parquet")
    # 32 Ki tokens = 16 sequences of 2,048: no data parallelism above 16 survives.
    assert frame.loc[frame["status"] == "simulated", "dp"].max() <= 16
    assert frame.loc[frame["dp"] == 32, "why"].str.startswith("divisibility").all()


def test_written_scenario_describes_the_planned_layout_not_the_old_one():
    """The written scenario's description was the planned-from scenario's with a note
    appended, so `quickstart-planned` said "with TP 4, DP 512" of a TP 1, DP 1,024 job."""
    raw = _raw(parallelism={"tp": 32, "dp": 2})
    raw["description"] = "a small job with TP 32, DP 2"
    result = plan(scenario_from_dict(raw, planning=True), PlanOptions(top=3))
    best = result.best
    text = best_scenario(result)["description"]
    assert "TP 32, DP 2" not in text
    assert f"TP {best['tp']}, CP {best['cp']}, PP {best['pp']}, DP {best['dp']:,}" in text
    assert f"step {best['step_time_s']:.4g} s" in text and "plan-small" in text
