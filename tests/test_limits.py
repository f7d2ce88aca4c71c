"""Bad input within bounds: every quantity bounded to what is physical and what the
machine can hold, refused before any work with the bound in the message (exit 2); no hang,
no traceback, no exit 1 for the input's faults; outputs strict JSON and consistent."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import yaml
from cli_helpers import refused
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.hardware import limits
from clustersim.runner.api import simulate
from clustersim.scenario.loader import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

SMALL = {
    "name": "small", "hardware": "trn2", "duration": "5d",
    "cluster": {"instances": 4, "spares": 1},
    "jobs": [{"name": "train", "model": "llama3-8b", "global_batch": 64,
              "recompute": "selective",
              "parallelism": {"tp": 8, "dp": 32, "zero": 1, "sequence_parallel": True},
              "checkpoint": {"interval": "auto", "write": "30s"}}],
    "failures": {"preset": "llama3"},
    "trace": {"enabled": False},
}


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def strict_json(text: str):
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def write(tmp_path: Path, text_or_mapping, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    text = text_or_mapping if isinstance(text_or_mapping, str) else yaml.safe_dump(
        text_or_mapping)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# 3 and 4: values that hung, grew without bound or crashed are refused, quoting the limit

# (--set overrides on SMALL, words the message must hold)
REFUSED = {
    "failures.scale .inf": (["failures.scale=.inf"], ["failures.scale", "finite"]),
    "failures.scale 'inf'": (["failures.scale='inf'"], ["failures.scale", "finite"]),
    "failures.scale 1e9": (["failures.scale=1.0e9"], ["failures.scale", "10000"]),
    "rate 1e30": (["failures.rates=[{component: chip, rate: 1.0e+30}]"], ["rate", "at most 1/s"]),
    "mtbf 1e-9": (["failures.rates=[{component: chip, mtbf: 1.0e-9}]"], ["mtbf", "at least 1s"]),
    "checkpoint write 1ns": (["jobs.0.checkpoint={interval: auto, write: 1ns}"],
                             ["jobs.0.checkpoint", "at least 1ms"]),
    "checkpoint write 1us": (["jobs.0.checkpoint={interval: auto, write: 1us}"],
                             ["jobs.0.checkpoint", "at least 1ms"]),
    "spines 1e9": (["cluster.fabric.spines=1000000000"], ["cluster.fabric.spines", "4096"]),
    "duration 100y": (["duration=100y"], ["duration", "at most 10y"]),
    "global_batch 160M": (["jobs.0.global_batch=160000000"], ["jobs.0.global_batch", "16777216"]),
    "layers 1e8": (["jobs.0.model={base: llama3-8b, layers: 100000000}"],
                   ["jobs.0.model.layers", "1024"]),
    "a million instances": (["cluster.instances=1000000"], ["cluster.instances", "131072"]),
    "instances 2**70": ([f"cluster.instances={2**70}"], ["cluster.instances", "131072"]),
    "duration of 400 digits": ([f"duration={10**400}"], ["duration", "too large"]),
    "tflops nan": (["hardware={base: trn2, chip: {tflops: {bf16: .nan}}}"],
                   ["hardware.chip.tflops", "finite"]),
    "tflops inf": (["hardware={base: trn2, chip: {tflops: {bf16: .inf}}}"],
                   ["hardware.chip.tflops", "finite"]),
    "price inf": (["hardware={base: trn2, instance: {price_per_hour: .inf}}"],
                  ["price_per_hour", "finite"]),
    "oversubscription inf": (["cluster.fabric.oversubscription=.inf"],
                             ["oversubscription", "finite"]),
    "weibull shape 0.001": (["failures.rates=[{component: chip, rate: 1/y, distribution: weibull, "
                             "shape: 0.001}]"], ["shape", "0.1"]),
    "efa 1e-30": (["hardware={base: trn2, instance: {efa: 1.0e-30}}"], ["efa", "at least 1MB/s"]),
    "link efficiency 1e-300": (["hardware={base: trn2, collectives: {link_efficiency: 1.0e-300}}"],
                               ["link_efficiency", "0.01"]),
    "straggler slowdown inf": (["stragglers={fraction: 1, slowdown: .inf}"],
                               ["stragglers.slowdown", "finite"]),
    "straggler slowdown 1e6": (["stragglers={fraction: 1, slowdown: 1000000}"],
                               ["stragglers.slowdown", "100"]),
    "too many events": (["failures.rates=[{component: chip, mtbf: 10s}]"],
                        ["failures", "discrete events", "16,000,000"]),
    "dp true": (["jobs.0.parallelism.dp=true"], ["jobs.0.parallelism.dp", "not true or false"]),
    "zero true": (["jobs.0.parallelism.zero=true"], ["jobs.0.parallelism.zero"]),
    "Arabic-Indic digits": (["jobs.0.checkpoint.write='١٢'"], ["jobs.0.checkpoint.write"]),
    "Arabic-Indic rate": (["failures.rates=[{component: chip, rate: '١/d'}]"], ["rate"]),
    "alias bomb in --set": (["description=[&a [x,x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,"
                             "*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,"
                             "*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], [*e,*e,*e,*e,*e,"
                             "*e,*e,*e,*e,*e,*e]]"], ["description", "1,000,000 values"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_out_of_bounds_values_are_refused_with_the_limit(case: str, tmp_path: Path):
    overrides, words = REFUSED[case]
    path = write(tmp_path, SMALL, "small.yaml")
    args = [a for o in overrides for a in ("--set", o)]
    result = invoke("run", path, *args, "-o", tmp_path / "out")
    refused(result, str(path), *words)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # over 5 s of CPU
def test_in_bounds_extremes_still_run(tmp_path: Path):
    """The bounds leave every library scenario and these edges valid."""
    path = write(tmp_path, SMALL, "small.yaml")
    for overrides in (["failures.scale=100", "duration=1y"],
                      ["jobs.0.checkpoint={interval: auto, write: 1ms}", "duration=1d"],
                      ["stragglers={fraction: 1, slowdown: 100}"]):
        args = [a for o in overrides for a in ("--set", o)]
        assert invoke("validate", path, *args).exit_code == 0, overrides
    for scenario in sorted((ROOT / "scenarios").glob("*.yaml")):
        if scenario.name == "rainier-year.yaml":  # a million jobs: a minute (a slow test,
            continue                              # tests/test_rainier_year.py)
        assert invoke("validate", scenario).exit_code == 0, scenario


@pytest.mark.parametrize("content, words", [
    ("name: x\nfoo: " + "[" * 20_000 + "]" * 20_000 + "\n", ["64 levels"]),
    ("name: x\nfoo: " + "[" * 80 + "]" * 80 + "\n", ["64 levels"]),
    ("name: x\nseed: " + "9" * 5000 + "\n", ["cannot be read"]),
    ("hardware:\n  base: trn2\n  description: &a [x, x, x, x, x, x, x, x, x, x]\n"
     + "".join(f"  name{i}: &a{i} [{', '.join(['*a' if i == 0 else f'*a{i - 1}'] * 10)}]\n"
               for i in range(7)), ["1,000,000 values"]),
])
@pytest.mark.slow  # more than 5 s
def test_yaml_that_would_exhaust_memory_or_stack_is_refused(tmp_path: Path, content: str,
                                                             words: list[str]):
    path = write(tmp_path, content)
    refused(invoke("validate", path), str(path), *words)


def test_a_named_pipe_and_a_device_are_refused_without_reading(tmp_path: Path):
    fifo = tmp_path / "scenario.yaml"
    os.mkfifo(fifo)
    refused(invoke("validate", fifo), "not a regular file")
    refused(invoke("run", fifo, "-o", tmp_path / "out"), "not a regular file")
    if Path("/dev/zero").exists():
        refused(invoke("validate", "/dev/zero"), "not a regular file")
    sweep = write(tmp_path, {"scenario": "scenario.yaml", "seeds": [0]}, "sweep.yaml")
    refused(invoke("sweep", sweep, "-o", tmp_path / "out"), "not a regular file")


def test_a_huge_file_is_refused_before_it_is_read(tmp_path: Path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as handle:
        handle.truncate(limits.MAX_YAML_BYTES + 1)
    refused(invoke("validate", path), "bytes", "docs/limits.md")


def test_a_sweep_of_a_hundred_million_points_is_refused(tmp_path: Path):
    write(tmp_path, SMALL, "small.yaml")
    grid = {"jobs.0.priority": list(range(100)), "failures.scale": list(range(1, 101)),
            "jobs.0.name": [f"j{i}" for i in range(100)], "jobs.0.steps": list(range(1, 101))}
    sweep = write(tmp_path, {"scenario": "small.yaml", "grid": grid, "seeds": [0]}, "s.yaml")
    refused(invoke("sweep", sweep, "-o", tmp_path / "out"), "100,000,000 runs", "10,000")


def test_replications_and_seed_are_bounded(tmp_path: Path):
    path = write(tmp_path, SMALL, "small.yaml")
    refused(invoke("run", path, "--replications", 1_000_000_000, "-o", tmp_path / "o"),
            "--replications", "1,000")
    refused(invoke("run", path, "--seed", 2**70, "-o", tmp_path / "o"), "--seed")
    assert not (tmp_path / "o").exists()


def test_topology_and_step_and_collective_refuse_sizes_beyond_the_machine(tmp_path: Path):
    path = write(tmp_path, SMALL, "small.yaml")
    refused(invoke("topology", path, "--set", "cluster.instances=1000000"), "131072")
    refused(invoke("step", path, "--set", "jobs.0.model={base: llama3-8b, layers: 100000000}"),
            "1024")
    refused(invoke("collective", "--hardware", "trn2", "--op", "all-reduce",
                   "--ranks", 10_000_000), "2,097,152")


@pytest.mark.slow  # more than 5 s
def test_a_workload_that_would_generate_jobs_without_end_is_refused(tmp_path: Path):
    scenario = dict(SMALL, jobs=[], workload={
        "arrivals": {"rate": 1.0, "until": "10y"},
        "templates": [{"name": "t", "instances": [1], "steps": 10,
                       "job": {"model": "llama3-8b", "parallelism": {"tp": 8}}}]})
    scenario["duration"] = "10y"
    path = write(tmp_path, scenario)
    refused(invoke("validate", path), f"{limits.MAX_JOBS:,} jobs")  # ten years at 1/s: 315 M


@pytest.mark.parametrize("content", ["", "not,a,trace\n1,2\n", "\x00\x01garbage"])
def test_a_damaged_workload_trace_file_exits_2(tmp_path: Path, content: str):
    (tmp_path / "jobs.csv").write_text(content)
    scenario = dict(SMALL, jobs=[], workload={
        "file": "jobs.csv",
        "templates": [{"name": "t", "instances": [1], "steps": 10,
                       "job": {"model": "llama3-8b", "parallelism": {"tp": 8}}}]})
    path = write(tmp_path, scenario)
    refused(invoke("validate", path), "workload")


# ---------------------------------------------------------------------------------------------
# 5: strict JSON, useful time from completed work


def test_summary_and_json_outputs_parse_strictly(tmp_path: Path):
    path = write(tmp_path, SMALL, "small.yaml")
    out = tmp_path / "out"
    assert invoke("run", path, "-o", out).exit_code == 0
    strict_json((out / "summary.json").read_text())
    for args in (["topology", path, "--json"], ["step", path, "--json"], ["hardware", "--json"],
                 ["collective", "--hardware", "trn2", "--op", "all-reduce", "--ranks", 64,
                  "--json"],
                 # found by scripts/fuzz.py: one rank moves nothing in no time (bandwidth null)
                 ["collective", "--hardware", "trn2", "--op", "alltoall", "--ranks", 1,
                  "--json"]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        strict_json(result.stdout)


def test_no_completed_step_means_no_useful_time(tmp_path: Path):
    """A step slower than the horizon (the slowest links the bounds allow): zero steps, so
    zero useful time and ETTR, not ETTR 0.997 and days of useful time."""
    raw = dict(SMALL, duration="1h", failures={"preset": "none"})
    raw["hardware"] = {"base": "trn2", "instance": {"efa": "1MB/s"},
                       "collectives": {"link_efficiency": 0.01, "efa_efficiency": 0.01}}
    raw["jobs"] = [dict(SMALL["jobs"][0], parallelism={"tp": 8, "dp": 32, "zero": 1,
                                                       "sequence_parallel": True})]
    scenario = scenario_from_dict(raw)
    summary = simulate(scenario).summary
    job = summary["jobs"]["train"]
    assert job["step_time_s"] > 3600
    assert job["steps_completed"] == 0
    assert job["useful_s"] == 0 and job["ettr"] == 0 and job["goodput"] == 0
    assert summary["cluster"]["useful_utilisation"] == 0
    strict_json(json.dumps(summary, allow_nan=False))


def test_useful_time_is_within_wall_time_and_follows_completed_steps():
    scenario = load_scenario(ROOT / "scenarios" / "single-trn2.yaml")
    job = simulate(scenario).summary["jobs"]["finetune"]
    assert 0 < job["useful_s"] <= job["wall_s"]
    assert job["useful_s"] >= job["steps_completed"] * job["step_time_s"] * (1 - 1e-9)
    assert math.isclose(job["ettr"], job["useful_s"] / job["wall_s"])


# ---------------------------------------------------------------------------------------------
# 4 and 8: report, topology --draw, messages


@pytest.fixture
def traced_run(tmp_path: Path) -> Path:
    path = write(tmp_path, dict(SMALL, trace={"enabled": True}), "small.yaml")
    out = tmp_path / "run"
    assert invoke("run", path, "-o", out).exit_code == 0
    return out


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_report_on_a_damaged_table_exits_2_and_leaves_no_report(traced_run: Path, damage: str):
    table = traced_run / "intervals.parquet"
    data = table.read_bytes()
    table.write_bytes({"truncated": data[: len(data) // 2], "empty": b"",
                       "garbage": b"PAR1 this is not parquet"}[damage])
    result = invoke("report", traced_run)
    refused(result, "intervals.parquet", "Parquet")
    assert not (traced_run / "report").exists()
    assert not [p for p in traced_run.iterdir() if p.name.startswith(".report")]


def test_report_with_a_deleted_table_says_it_is_missing(traced_run: Path):
    (traced_run / "events.parquet").unlink()
    result = invoke("report", traced_run)
    refused(result, "events.parquet missing", "run the scenario again")
    assert "trace.enabled" not in result.stderr


def test_topology_draw_into_a_folder_it_cannot_write_exits_2(tmp_path: Path, monkeypatch):
    path = write(tmp_path, SMALL, "small.yaml")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("clustersim.analysis.topology.draw_topology", refuse)
    refused(invoke("topology", path, "--draw", tmp_path / "t.png"), "cannot write")
    if os.geteuid() != 0:
        monkeypatch.undo()
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        refused(invoke("topology", path, "--draw", locked / "t.png"), "cannot write")


def test_unknown_sweep_keys_list_the_sweep_keys(tmp_path: Path):
    write(tmp_path, SMALL, "small.yaml")
    sweep = write(tmp_path, {"scenario": "small.yaml", "seed": 3}, "s.yaml")
    result = invoke("sweep", sweep)
    refused(result, "seed", "unknown key", "scenario, grid, variants, seeds, replications")
    assert "hardware" not in result.stderr


def test_does_not_fit_names_the_file_and_the_job(tmp_path: Path):
    job = dict(SMALL["jobs"][0], recompute="none",
               parallelism={"tp": 8, "dp": 32, "zero": 0})
    path = write(tmp_path, dict(SMALL, jobs=[job]), "big.yaml")
    refused(invoke("run", path, "-o", tmp_path / "o"), str(path), "jobs.0", "does not fit")


def test_run_help_shows_the_output_default():
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    line = next(x for x in result.stdout.splitlines() if "--out" in x)
    assert "results/NAME/" in line


# ---------------------------------------------------------------------------------------------
# docs/limits.md states the limits the code enforces


def test_docs_state_every_limit():
    page = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    for name in limits.__all__:
        if name == "YEAR_S":
            continue
        assert f"`{name}`" in page, f"docs/limits.md does not state {name}"
    for code in ("0", "1", "2", "130", "143"):
        assert re.search(rf"\|\s*{code}\s*\|", page), f"exit code {code} missing"
