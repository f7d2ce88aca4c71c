"""The command line: exit codes, messages on stderr, atomic output directories, JSON output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import clustersim
from clustersim.cli.app import app
from clustersim.runner.outputs import atomic_output_dir

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
runner = CliRunner()

SMALL = """\
name: small
hardware: trn2
cluster: {instances: 4, spares: 1}
jobs:
  - {name: train, model: llama3-8b, global_batch: 64, recompute: selective,
     parallelism: {tp: 8, dp: 32, zero: 1, sequence_parallel: true}}
"""


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert clustersim.__version__ in result.stdout


def test_python_dash_m_is_the_same_program():
    done = subprocess.run([sys.executable, "-m", "clustersim", "--version"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0
    assert done.stdout.strip() == f"clustersim {clustersim.__version__}"


def test_run_writes_summary(small: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = invoke("run", small, "-o", out)
    assert result.exit_code == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"] == "small"
    assert summary["chips"] == 5 * 16
    assert summary["seed"] == 0
    assert summary["cluster"]["spare_instances"] == 1
    job = summary["jobs"]["train"]
    assert (job["ranks"], job["instances"], job["chips"]) == (256, 4, 64)
    assert (out / "scenario.yaml").exists()
    assert leftovers(tmp_path) == []


def test_run_quickstart_default_output_dir(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", QUICKSTART, "--seed", "7")
    assert result.exit_code == 0, result.stderr
    summary = json.loads((tmp_path / "results" / "quickstart" / "summary.json").read_text())
    assert summary["seed"] == 7
    assert summary["cluster"]["ultraservers"] == 9


def test_run_refuses_non_empty_output_without_force(small: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = invoke("run", small, "-o", out)
    assert result.exit_code == 2
    assert "--force" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    result = invoke("run", small, "-o", out, "--force")
    assert result.exit_code == 0, result.stderr
    assert not (out / "keep.txt").exists()
    assert (out / "summary.json").exists()
    assert leftovers(tmp_path) == []


def test_run_refuses_a_file_as_output(small: Path, tmp_path: Path):
    target = tmp_path / "file"
    target.write_text("x")
    result = invoke("run", small, "-o", target, "--force")
    assert result.exit_code == 2
    assert "not a directory" in result.stderr


def test_run_refuses_an_output_it_cannot_create(small: Path, tmp_path: Path):
    (tmp_path / "file").write_text("x")
    result = invoke("run", small, "-o", tmp_path / "file" / "out")
    assert result.exit_code == 2
    assert "is not a directory" in result.stderr and "Traceback" not in result.stderr
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        result = invoke("run", small, "-o", locked / "out")
        if os.geteuid() != 0:  # root may write anywhere
            assert result.exit_code == 2
            assert "permission denied" in result.stderr
    finally:
        locked.chmod(0o700)
    assert leftovers(tmp_path) == []


def test_an_oversized_trace_is_refused_naming_the_file(small: Path, tmp_path: Path):
    result = invoke("run", small, "--set", "trace.bin=1s", "--set", "duration=1y",
                    "--set", "trace.levels=[instance]",
                    "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert f"{small}: trace.levels" in result.stderr and "rows" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("out", [".", "..", "sub/.."])
def test_run_refuses_the_current_directory_as_output(small: Path, tmp_path: Path,
                                                     monkeypatch, out: str):
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    result = invoke("run", small, "-o", out, "--force")
    assert result.exit_code == 2 and "current directory" in result.stderr
    assert (work / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


def test_run_creates_missing_parent_folders(small: Path, tmp_path: Path):
    result = invoke("run", small, "-o", tmp_path / "a" / "b" / "out")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "a" / "b" / "out" / "summary.json").exists()


def test_bad_scenario_exits_2_and_writes_nothing(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SMALL.replace("tp: 8", "tp: 7"))
    out = tmp_path / "out"
    result = invoke("run", bad, "-o", out)
    assert result.exit_code == 2
    assert str(bad) in result.stderr
    assert "jobs.0.parallelism" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_set_overrides_on_run(small: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = invoke("run", small, "-o", out, "--set", "cluster.spares=3",
                    "--set", "jobs.0.global_batch=128")
    assert result.exit_code == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cluster"]["spare_instances"] == 3
    assert summary["jobs"]["train"]["global_batch"] == 128
    bad = invoke("run", small, "-o", tmp_path / "o2", "--set", "cluster.spares")
    assert bad.exit_code == 2
    assert "PATH=VALUE" in bad.stderr


def test_bad_arguments_exit_2(small: Path):
    assert invoke("run", small, "--replications", "0").exit_code == 2
    assert invoke("run").exit_code == 2
    assert invoke("no-such-command").exit_code == 2


def test_validate_reports_each_file(small: Path, tmp_path: Path):
    assert invoke("validate", small, QUICKSTART).exit_code == 0
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nhardware: trn2\ncluster: {instances: -1}\n")
    missing = tmp_path / "missing.yaml"
    result = invoke("validate", small, broken, missing)
    assert result.exit_code == 2
    assert "ok: " in result.stdout
    assert "cluster.instances" in result.stderr
    assert "no such file" in result.stderr


def test_topology_json(small: Path):
    result = invoke("topology", small, "--json")
    assert result.exit_code == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["chips"] == 80
    assert figures["instances"] == 5
    assert figures["ultraservers"] == 0
    assert figures["links"] == {"torus": 160, "efa": 80}
    assert figures["per_chip_bandwidth_gbyte_per_s"]["torus"] == pytest.approx(1024)


def test_topology_table(small: Path):
    result = invoke("topology", small)
    assert result.exit_code == 0
    assert "torus" in result.stdout and "bisection" in result.stdout


def test_hardware_list_and_entry():
    listing = invoke("hardware")
    assert listing.exit_code == 0
    for name in clustersim.catalog_names():
        assert name in listing.stdout
    entry = invoke("hardware", "trn2")
    assert entry.exit_code == 0
    assert "667" in entry.stdout and "Trainium2" in entry.stdout
    as_json = json.loads(invoke("hardware", "trn2u", "--json").stdout)
    assert as_json["ultraserver"]["instances"] == 4
    unknown = invoke("hardware", "trn9")
    assert unknown.exit_code == 2
    assert "trn2" in unknown.stderr


def test_models_list_and_entry():
    """`models` lists every preset with its parameter counts (the same the step model and
    the presets' published-figures test use), and prints one with its source."""
    from clustersim.training.transformer import TransformerShape, model_preset_names

    listing = json.loads(invoke("models", "--json").stdout)["models"]
    assert [row["name"] for row in listing] == model_preset_names()
    by_name = {row["name"]: row for row in listing}
    v3 = TransformerShape.model_validate({  # the row is the shape and its counts
        k: v for k, v in by_name["deepseek-v3"].items()
        if k not in ("parameters", "active_parameters", "source")})
    assert by_name["deepseek-v3"]["parameters"] == v3.parameter_count()
    assert round(by_name["deepseek-v3"]["parameters"] / 1e9) == 671
    assert by_name["qwen3-30b-a3b"]["active_parameters"] < 0.15 * by_name[
        "qwen3-30b-a3b"]["parameters"]
    table = invoke("models")
    assert table.exit_code == 0
    text = " ".join(table.stdout.replace("│", " ").split())
    assert "deepseek-v3" in text and "256 top 8 +1" in text and "128 sliding" in text
    entry = invoke("models", "gpt-oss-20b")
    assert entry.exit_code == 0
    assert "window_kind" in entry.stdout and "source:" in entry.stdout
    unknown = invoke("models", "gpt-5")
    assert unknown.exit_code == 2
    assert "gpt-oss-20b" in unknown.stderr


def test_schema_is_json(tmp_path: Path):
    result = invoke("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert "trn2u" in json.dumps(schema["properties"]["hardware"])
    out = tmp_path / "schema.json"
    assert invoke("schema", "-o", out).exit_code == 0
    assert json.loads(out.read_text()) == schema


def test_interrupted_write_leaves_nothing(tmp_path: Path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_output_dir(out) as staging:
        (staging / "summary.json").write_text("{}")
        raise RuntimeError("interrupted")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_internal_errors_exit_1_without_traceback(small: Path, tmp_path: Path, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr("clustersim.runner.api.run_to", broken)
    monkeypatch.delenv("CLUSTERSIM_DEBUG", raising=False)
    result = invoke("run", small, "-o", tmp_path / "out")
    assert result.exit_code == 1
    assert "internal error" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


MALFORMED = {
    "yaml syntax": "name: x\nhardware: trn2\ncluster: {instances: 4\n",
    "not a mapping": "- just\n- a list\n",
    "unknown key": SMALL + "clustr: {}\n",
    "wrong type": SMALL.replace("instances: 4", "instances: four"),
    "negative size": SMALL.replace("instances: 4", "instances: -4"),
    "bad unit": SMALL + "duration: 30dayz\n",
    "zero duration": SMALL + "duration: 0s\n",
    "unknown hardware": SMALL.replace("hardware: trn2", "hardware: trn7"),
    "unknown model": SMALL.replace("llama3-8b", "llama9-8b"),
    "ranks mismatch": SMALL.replace("dp: 32", "dp: 31"),
    "layers vs pp": SMALL.replace("tp: 8, dp: 32", "tp: 4, pp: 64, dp: 1"),
    "too big a job": SMALL.replace("instances: 4,", "instances: 2,"),
    "batch split": SMALL.replace("global_batch: 64", "global_batch: 48"),
    "missing name": SMALL.replace("name: small\n", ""),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_scenarios_exit_2_and_write_nothing(kind: str, tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text(MALFORMED[kind])
    out = tmp_path / "out"
    for command in (["run", path, "-o", out], ["validate", path], ["topology", path]):
        result = invoke(*command)
        assert result.exit_code == 2, (kind, command, result.stdout)
        assert str(path) in result.stderr
        assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_messages_are_not_read_as_markup(tmp_path: Path):
    path = tmp_path / "list.yaml"
    path.write_text("- [a, b]\n")
    result = invoke("validate", path)
    assert result.exit_code == 2
    assert "[[a, b]]" in result.stderr


def test_collective_json_rows():
    result = invoke("collective", "--hardware", "trn1", "--op", "allr", "--ranks", "64",
                    "--instances", "2", "--sizes", "8:1GiB:8", "--json")
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    rows = shown["rows"]
    assert [r["bytes"] for r in rows] == [8 * 8**i for i in range(10)]
    for row in rows:
        assert set(row) >= {"bytes", "algorithm", "time_us", "algbw_gbyte_per_s", "busbw_gbyte_per_s"}
        assert row["busbw_gbyte_per_s"] == pytest.approx(row["algbw_gbyte_per_s"] * 2 * 63 / 64, rel=1e-3)
    assert rows[-1]["algorithm"].startswith("hierarchical(")
    assert shown["ranks_per_chip"] == 2


def test_collective_table_and_forced_algorithm():
    result = invoke("collective", "--hardware", "trn2", "--op", "all-gather", "--ranks", "64",
                    "--sizes", "64MB", "--algorithm", "ring")
    assert result.exit_code == 0, result.stderr
    assert "ring" in result.stdout and "busbw" in result.stdout


@pytest.mark.parametrize("args, word", [
    (["--hardware", "trn9", "--op", "allr", "--ranks", "4"], "trn2"),
    (["--hardware", "trn2", "--op", "allsum", "--ranks", "4"], "all-reduce"),
    (["--hardware", "trn2", "--op", "allr", "--ranks", "64", "--algorithm", "fast"], "kangaring"),
    (["--hardware", "trn2", "--op", "allr", "--ranks", "64", "--sizes", "1GB:1MB"], "MIN"),
    (["--hardware", "trn2", "--op", "allr", "--ranks", "65", "--instances", "2"], "evenly"),
    (["--hardware", "trn2", "--op", "allr", "--ranks", "48", "--algorithm", "rdh"], "rdh"),
])
def test_collective_bad_arguments_exit_2(args, word):
    result = invoke("collective", *args)
    assert result.exit_code == 2
    assert word in result.stderr
    assert "Traceback" not in result.stderr


def test_step_json_has_the_contract_fields(small: Path):
    result = invoke("step", small, "--json")
    assert result.exit_code == 0, result.stderr
    jobs = json.loads(result.stdout)["jobs"]
    assert len(jobs) == 1
    job = jobs[0]
    for key in ("name", "step_time_s", "tokens_per_s", "sequences_per_s", "mfu",
                "memory_per_chip_gib", "fits_memory", "step_breakdown"):
        assert key in job
    for key in ("compute_s", "exposed_comm_s", "bubble_s"):
        assert key in job["step_breakdown"]
    assert job["name"] == "train"
    assert job["fits_memory"] is True
    # without ZeRO-1, sequence parallelism and recompute it does not fit in 96 GiB
    plain = json.loads(invoke("step", small, "--json", "--set", "jobs.0.recompute=none",
                              "--set", "jobs.0.parallelism.zero=0",
                              "--set", "jobs.0.parallelism.sequence_parallel=false"
                              ).stdout)["jobs"][0]
    assert plain["fits_memory"] is False


def test_step_table_and_no_jobs(small: Path, tmp_path: Path):
    result = invoke("step", small)
    assert result.exit_code == 0, result.stderr
    assert "step time" in result.stdout and "MFU" in result.stdout
    empty = tmp_path / "empty.yaml"
    empty.write_text("name: e\nhardware: trn2\ncluster: {instances: 1}\n")
    refused = invoke("step", empty)
    assert refused.exit_code == 2
    assert "no jobs" in refused.stderr


def test_run_summary_carries_the_step_figures(small: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert invoke("run", small, "-o", out).exit_code == 0
    job = json.loads((out / "summary.json").read_text())["jobs"]["train"]
    assert job["step_time_s"] > 0
    assert 0 < job["mfu"] < 1
    assert job["tokens_per_s"] == pytest.approx(64 * 8192 / job["step_time_s"])


def test_collective_cli_with_one_rank_prints_no_nan():
    """One rank moves nothing in no time: the table shows '-' for its bandwidths, not nan."""
    result = invoke("collective", "--hardware", "trn2", "--op", "all-reduce", "--ranks", "1",
                    "--sizes", "1MiB")
    assert result.exit_code == 0, result.stderr
    assert "nan" not in result.stdout and "inf" not in result.stdout
    assert "one rank moves nothing" in result.stdout


@pytest.mark.parametrize("ranks, instances, size, busbw_gib_s, within", [
    ("2", "1", "1GiB", 52.8, 0.35), ("64", "2", "1GiB", 47.1, 0.35)])
def test_collective_cli_on_the_calibration_cases(ranks, instances, size, busbw_gib_s, within):
    """Each fitted published large-message bus bandwidth, through the command itself: within
    35%. The 16-rank example is Trn2's (docs/calibration.md; tests/test_calibration_trn2.py)."""
    result = invoke("collective", "--hardware", "trn1", "--op", "allr", "--ranks", ranks,
                    "--instances", instances, "--sizes", size, "--json")
    assert result.exit_code == 0, result.stderr
    busbw = json.loads(result.stdout)["rows"][0]["busbw_gbyte_per_s"] * 1e9 / 2**30
    assert busbw == pytest.approx(busbw_gib_s, rel=within)


@pytest.mark.parametrize("args, words", [
    (["collective", "--hardware", "trn2", "--op", "all-reduce", "--ranks", "64",
      "--instances", "100000000"], "do not split evenly"),
    (["collective", "--hardware", "trn2", "--op", "all-reduce", "--ranks", "64",
      "--sizes", "0.1"], "1 byte <= MIN"),
    (["collective", "--hardware", "trn2", "--op", "all-reduce", "--ranks", "64",
      "--sizes", "1:2:nan"], "finite FACTOR"),
    (["collective", "--hardware", "trn2", "--op", "all-reduce", "--ranks", "64",
      "--sizes", "1:1e30:1.01"], "more than 200 sizes"),
    (["schema", "-o", "{tmp}/missing/x.json"], "no folder"),
    (["topology", str(QUICKSTART), "--draw", "{tmp}/missing/x.png"], "existing folder"),
    (["sweep", "{tmp}"], "is a directory"),
])
def test_bad_command_arguments_exit_2(tmp_path: Path, args: list[str], words: str):
    result = invoke(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.exit_code == 2, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("seeds, words", [("[]", "at least 1"), ("[-1]", "seeds.0")])
def test_bad_sweep_seeds_exit_2(tmp_path: Path, seeds: str, words: str):
    (tmp_path / "s.yaml").write_text(QUICKSTART.read_text())
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"scenario: s.yaml\ngrid: {{failures.scale: [1]}}\nseeds: {seeds}\n")
    result = invoke("sweep", sweep, "-o", tmp_path / "out")
    assert result.exit_code == 2 and words in result.stderr


def test_a_job_that_does_not_fit_is_told_only_remedies_it_lacks(tmp_path: Path):
    """A ZeRO-3 job with full recompute and sequence parallelism was told to use "ZeRO-1,
    sequence parallelism or recompute"; it is told what it does not use yet."""
    sets = ["--set", "jobs.0.model=llama3.1-405b", "--set", "jobs.0.parallelism.zero=3",
            "--set", "jobs.0.recompute=full"]
    for command in (["run", "scenarios/single-trn2.yaml", "-o", str(tmp_path / "o")],
                    ["step", "scenarios/single-trn2.yaml"]):
        result = invoke(*command, *sets)
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert "more tensor or pipeline parallelism" in text, text
        for done in ("ZeRO", "sequence parallelism", "recompute"):
            assert done not in text.split("does not fit", 1)[1], (done, text)
    # a job using none of them is told all of them
    result = invoke("step", "scenarios/single-trn2.yaml", "--set", "jobs.0.model=llama3.1-405b",
                    "--set", "jobs.0.parallelism.zero=0", "--set", "jobs.0.recompute=none",
                    "--set", "jobs.0.parallelism.sequence_parallel=false")
    text = " ".join(result.output.split())
    for remedy in ("ZeRO-1", "sequence parallelism", "recompute"):
        assert remedy in text, (remedy, text)


def test_trn3_servers_are_counted_in_the_plural(tmp_path: Path):
    """Trn3's instance is a "trn3-gen2 server": step said "(36 trn3-gen2 server)"."""
    result = invoke("step", "scenarios/single-trn2.yaml", "--set", "hardware=trn3-gen2",
                    "--set", "cluster.instances=36", "--set", "jobs.0.parallelism.dp=72",
                    "--set", "jobs.0.global_batch=72")
    assert result.exit_code == 0, result.output
    assert "(36 trn3-gen2 servers)" in " ".join(result.output.split())
    result = invoke("collective", "--hardware", "trn3-gen2", "--op", "all-reduce", "--ranks",
                    "32", "--instances", "2")
    assert result.exit_code == 0, result.output
    assert "on 2 trn3-gen2 servers" in result.output
