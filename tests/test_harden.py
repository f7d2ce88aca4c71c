"""Issue 26: the serving, plan, report, check and sweep surfaces lose no data, never hang and
never answer wrongly in silence. One test (or a few) per numbered defect of the issue."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_helpers import invoke, refused, write
from ray_helpers import import_ray
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

TINY_PLAN = {
    "name": "plan-tiny", "hardware": "trn1", "cluster": {"instances": 1},
    "jobs": [{"name": "train", "model": {"name": "tiny", "layers": 2, "hidden": 512, "heads": 4,
                                         "vocab": 1000, "seq_len": 512},
              "seq_len": 512, "global_batch": 4}],
    "failures": {"preset": "llama3"},
}

TRACED = {
    "name": "small", "hardware": "trn2", "duration": "1d",
    "cluster": {"instances": 4, "spares": 1},
    "jobs": [{"name": "train", "model": "llama3-8b", "global_batch": 64,
              "recompute": "selective",
              "parallelism": {"tp": 8, "dp": 32, "zero": 1, "sequence_parallel": True},
              "checkpoint": {"interval": "auto", "write": "30s"}}],
    "failures": {"preset": "llama3"},
    "trace": {"enabled": True, "levels": ["cluster", "job"]},
}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def run_once(tmp_path_factory, label: str, mapping) -> Path:
    """The run folder of `mapping` (a scenario), run once for a module's tests."""
    folder = tmp_path_factory.mktemp(label)
    out = folder / "run"
    result = invoke("run", write(folder, mapping), "-o", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory) -> Path:
    return run_once(tmp_path_factory, "traced", TRACED)


def copy_run(run: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


# ---------------------------------------------------------------------------------------------
# 1-3: data lost


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_1_report_keeps_a_users_file_in_the_report_folder(traced_run: Path, tmp_path: Path):
    run = copy_run(traced_run, tmp_path)
    (run / "report").mkdir(exist_ok=True)
    notes = run / "report" / "notes.txt"
    notes.write_text("mine")
    result = invoke("report", run)
    refused(result, "--force")
    assert "-o elsewhere" not in result.output  # report has no -o: the hint was run's
    assert notes.read_text() == "mine"
    notes.unlink()
    assert invoke("report", run).exit_code == 0  # an earlier report alone is replaced
    assert invoke("report", run).exit_code == 0
    notes.write_text("mine")
    assert invoke("report", run, "--force").exit_code == 0
    assert not notes.exists() and (run / "report" / "report.md").is_file()
    assert leftovers(run) == []


def test_2_a_scenario_written_meanwhile_is_not_replaced(tmp_path: Path, monkeypatch):
    """Two plans into the same --write-scenario: the second refuses at once (the lock), and
    a file that appears during the search is never overwritten without --force."""
    import clustersim.planning as planning

    scenario = write(tmp_path, TINY_PLAN)
    best = tmp_path / "best.yaml"
    real = planning.plan

    def slow_plan(*args, **kwargs):
        best.write_text("the other plan")  # another plan finished first
        return real(*args, **kwargs)

    monkeypatch.setattr(planning, "plan", slow_plan)
    result = invoke("plan", scenario, "-o", tmp_path / "p", "--write-scenario", best)
    refused(result, "best.yaml", "--force")
    assert best.read_text() == "the other plan"
    assert not (tmp_path / "p").exists() and leftovers(tmp_path) == []


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_2_a_second_plan_into_the_same_file_is_refused_while_the_first_runs(tmp_path: Path):
    import subprocess
    import sys

    from clustersim.runner.outputs import atomic_output_file

    scenario = write(tmp_path, TINY_PLAN)
    best = tmp_path / "best.yaml"
    with atomic_output_file(best, force=False):  # the first plan, still searching
        done = subprocess.run(
            [sys.executable, "-m", "clustersim", "plan", str(scenario), "-o",
             str(tmp_path / "p"), "--write-scenario", str(best)],
            capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert "another clustersim run" in done.stderr
    assert not best.exists() and not (tmp_path / "p").exists()


@pytest.mark.parametrize("target", ["folder", "no-parent", "same-as-out", "inside-out", "fifo"])
def test_3_a_bad_write_scenario_target_is_refused_before_the_search(tmp_path: Path, target,
                                                                      monkeypatch):
    import clustersim.planning as planning

    monkeypatch.setattr(planning, "plan", lambda *a, **k: pytest.fail("searched"))
    scenario = write(tmp_path, TINY_PLAN)
    out = tmp_path / "p"
    path = {"folder": tmp_path, "no-parent": tmp_path / "nowhere" / "best.yaml",
            "same-as-out": out, "inside-out": out / "best.yaml", "fifo": tmp_path / "fifo"
            }[target]
    if target == "fifo":
        os.mkfifo(path)
    if target == "inside-out":
        out.mkdir()
    result = invoke("plan", scenario, "-o", out, "--write-scenario", path, "--force")
    refused(result, "--write-scenario" if "out" in target else str(path))
    assert not out.exists() or not any(out.iterdir())


def test_3_a_failed_scenario_write_leaves_no_plan_folder(tmp_path: Path, monkeypatch):
    import clustersim.planning.outputs as outputs

    def full_disk(result, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "write_scenario", full_disk)
    scenario = write(tmp_path, TINY_PLAN)
    result = invoke("plan", scenario, "-o", tmp_path / "p", "--write-scenario",
                    tmp_path / "best.yaml")
    assert result.exit_code != 0
    assert not (tmp_path / "p").exists() and not (tmp_path / "best.yaml").exists()
    assert leftovers(tmp_path) == []


def test_3_plan_writes_both_outputs(tmp_path: Path):
    scenario = write(tmp_path, TINY_PLAN)
    result = invoke("plan", scenario, "-o", tmp_path / "p", "--write-scenario",
                    tmp_path / "best.yaml")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / "plan.parquet").is_file()
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["name"] == "plan-tiny-planned"
    assert leftovers(tmp_path) == [] and not list(tmp_path.glob(".*.lock"))


# ---------------------------------------------------------------------------------------------
# 4-8: hangs and out-of-memory


@pytest.mark.parametrize("chips, words", [
    ("16:4194304", ["4,194,304 chips", "2,097,152"]),
    ("64:2097152:64", ["32,768 sizes", "docs/limits.md"]),
    ("1:100000000000000000000", ["expected at most 2,097,152"]),
    ("1:100000000000:1", ["expected at most 2,097,152"]),
    ("16,32,4194304", ["4,194,304 chips"]),
])
def test_4_chip_sizes_beyond_the_limits_are_refused_before_the_search(tmp_path: Path, chips,
                                                                      words, monkeypatch):
    import clustersim.planning as planning

    monkeypatch.setattr(planning, "plan", lambda *a, **k: pytest.fail("searched"))
    result = invoke("plan", write(tmp_path, TINY_PLAN), "-o", tmp_path / "p", "--chips", chips)
    refused(result, "--chips", *words)
    assert not (tmp_path / "p").exists()


def test_5_schedules_beyond_the_pipeline_limit_are_pruned_not_built():
    from clustersim.hardware import limits
    from clustersim.planning.space import Candidate, prune_reason
    from clustersim.scenario.loader import scenario_from_dict

    raw = json.loads(json.dumps(TINY_PLAN))
    raw["jobs"][0]["global_batch"] = limits.MAX_GLOBAL_BATCH
    raw["jobs"][0]["model"]["layers"] = 8
    s = scenario_from_dict(raw, planning=True)
    c = Candidate("trn1", 16, 1, 4, 8, 1, 1, 1, "none", False, False)
    assert prune_reason(c, s.hardware, s.jobs[0]).startswith("limit: 8,388,608 pipeline")
    many = Candidate("trn1", 16, 1, 1, 32, 1, 100, 1, "none", False, False)
    raw["jobs"][0]["model"]["layers"] = 1000
    s = scenario_from_dict(raw, planning=True)
    assert prune_reason(many, s.hardware, s.jobs[0]).startswith("limit: interleave")


def test_5_the_search_size_is_bounded_before_it_is_listed(monkeypatch):
    from clustersim.hardware import limits
    from clustersim.planning import PlanError, PlanOptions, plan
    from clustersim.planning.space import enumerate_space, space_size
    from clustersim.scenario.loader import scenario_from_dict

    raw = json.loads(json.dumps(TINY_PLAN))
    for batch in (4, 720720, 16777216):
        raw["jobs"][0]["global_batch"] = batch
        s = scenario_from_dict(raw, planning=True)
        # Counted as listed for a dense model (an upper bound for mixtures of experts).
        listed = len(enumerate_space("trn1", s.hardware, 16, s.jobs[0]))
        assert space_size(s.hardware, 16, s.jobs[0]) == listed
    monkeypatch.setattr(limits, "MAX_PLAN_CANDIDATES", 1000)
    with pytest.raises(PlanError, match="1,000"):
        plan(s, PlanOptions())


def _serving(**workload) -> dict:
    return {
        "name": "srv", "hardware": "trn2", "duration": "1min", "cluster": {"instances": 1},
        "failures": {"preset": "none"},
        "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
                   "replicas": 1, "slo": {"ttft": "1h", "tpot": "1h"},
                   "workload": {"arrival": "poisson", "rate": "1/s", "input_tokens": 16,
                                "output_tokens": 4, **workload}}],
    }


def test_6_find_rate_stops_at_its_ceiling_and_says_so(monkeypatch):
    from clustersim.hardware import limits
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving.capacity import find_rate

    capped = scenario_from_dict(_serving(requests=50))
    search = find_rate(capped, goodput=0.5)
    assert search.at_ceiling and search.rate_per_s == limits.MAX_REQUEST_RATE_PER_S
    assert max(r for r, _ in search.tried) <= limits.MAX_REQUEST_RATE_PER_S
    monkeypatch.setattr(limits, "MAX_RATE_SEARCH_REQUESTS", 600)
    search = find_rate(scenario_from_dict(_serving()), goodput=0.01)
    assert max(r for r, _ in search.tried) <= 600 / 60 + 1e-9
    assert search.at_ceiling and search.rate_per_s == pytest.approx(10.0)


def test_7_requests_beyond_memory_are_refused_before_any_work(tmp_path: Path):
    raw = _serving()
    raw["duration"] = "10min"
    raw["serve"][0]["workload"]["rate"] = "100000/s"
    refused(invoke("validate", write(tmp_path, raw)), "serve.0.workload", "10,000,000",
            "docs/limits.md")


def test_7_a_request_trace_beyond_its_row_limit_is_refused_before_any_work(tmp_path: Path,
                                                                            monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from clustersim.hardware import limits

    monkeypatch.setattr(limits, "MAX_REQUEST_TRACE_ROWS", 10)
    pq.write_table(pa.table({"arrival_s": [float(i) for i in range(20)],
                             "input_tokens": [16] * 20, "output_tokens": [4] * 20}),
                   tmp_path / "t.parquet")
    raw = _serving()
    raw["serve"][0]["workload"] = {"arrival": "trace", "trace": "t.parquet",
                                   "input_tokens": "trace", "output_tokens": "trace"}
    refused(invoke("run", write(tmp_path, raw), "-o", tmp_path / "out"), "20 rows",
            "at most 10")
    assert not (tmp_path / "out").exists()


def test_8_check_refuses_a_golden_that_is_a_named_pipe(tmp_path: Path):
    import threading

    from clustersim.runner.check import read_golden
    from clustersim.scenario.errors import ScenarioError

    fifo = tmp_path / "summary.json"
    os.mkfifo(fifo)
    outcome: list = []

    def read():
        try:
            read_golden(fifo)
        except ScenarioError as error:
            outcome.append(str(error))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # release the blocked reader
        with open(fifo, "w"):
            pass
        pytest.fail("read_golden blocked on a named pipe")
    assert outcome and "not a regular file" in outcome[0]


# ---------------------------------------------------------------------------------------------
# 9-13: silent wrong results


def test_9_weights_that_do_not_fit_are_refused_with_the_breakdown(tmp_path: Path):
    raw = _serving()
    raw["serve"][0].update(model="llama3.1-405b", parallelism={"tp": 16})
    refused(invoke("run", write(tmp_path, raw), "-o", tmp_path / "out"), "serve.0.parallelism",
            "the weights do not fit", "on its busiest chip")
    assert not (tmp_path / "out").exists()
    refused(invoke("run", write(tmp_path, raw), "--find-rate"), "the weights do not fit")
    raw = _serving()
    raw["serve"][0]["speculative"] = {"draft": "llama3.1-70b", "tokens": 4, "acceptance": 0.7}
    refused(invoke("validate", write(tmp_path, raw)), "serve.0.speculative.draft",
            "expected a smaller draft")


def test_10_replicas_sharing_a_chip_share_its_hbm():
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving.iteration import kv_bytes_per_token
    from clustersim.serving.simulate import replica_models

    raw = _serving()
    raw["serve"][0].update(parallelism={"tp": 1}, replicas=4)  # four replicas on one chip
    s = scenario_from_dict(raw)
    d = s.serve[0]
    _, capacity, _ = replica_models(s, d)
    hbm = s.hardware.chip.hbm_bytes
    weights = d.model.parameter_count() * 2
    assert capacity > 0
    assert capacity * kv_bytes_per_token(d.model, "bf16") + weights <= hbm / 4 * (
        1 - d.server.kv_reserve) + 1


def test_11_a_chip_failure_downs_every_replica_on_its_instance():
    import numpy as np

    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving.simulate import simulate_serving

    raw = _serving()
    raw["duration"] = "1h"
    s = scenario_from_dict(raw)  # one tp-4 replica: one chip of a 16-chip instance
    result = simulate_serving(s, np.random.SeedSequence(0),
                              outages=[(100.0, 0, 5, 600.0), (2000.0, 0, 9, 600.0)])
    assert result.fleets["chat"].failures == 2  # chips 5 and 9 hold none of its ranks


@pytest.mark.parametrize("where, value, path", [
    ("output_tokens", 3_000_000_000, "output_tokens"),
    ("output_tokens", {"distribution": "lognormal", "median": 1e300, "sigma": 1},
     "output_tokens.median"),
    ("input_tokens", {"distribution": "fixed", "value": 16, "max": 2**63 - 1}, "input_tokens.max"),
])
def test_12_token_counts_beyond_a_sequence_are_refused(tmp_path: Path, where, value, path):
    raw = _serving(**{where: value})
    refused(invoke("validate", write(tmp_path, raw)), f"serve.0.workload.{path}")


def test_12_trace_counts_beyond_a_sequence_are_refused(tmp_path: Path):
    (tmp_path / "t.csv").write_text("arrival_s,input_tokens,output_tokens\n0,16,1e300\n")
    raw = _serving()
    raw["serve"][0]["workload"] = {"arrival": "trace", "trace": "t.csv",
                                   "input_tokens": "trace", "output_tokens": "trace"}
    refused(invoke("run", write(tmp_path, raw), "-o", tmp_path / "out"), "output_tokens",
            "at most 4,194,304")


@pytest.mark.parametrize("name", ["train", "cluster"])
def test_13_a_deployment_named_as_a_job_or_the_cluster_is_refused(tmp_path: Path, name):
    raw = _serving()
    raw["cluster"] = {"instances": 2}
    raw["jobs"] = [{"name": "train", "model": "llama3.1-8b", "global_batch": 32,
                    "parallelism": {"tp": 8, "dp": 8}}]
    raw["serve"][0]["name"] = name
    refused(invoke("validate", write(tmp_path, raw)), "serve.0.name")


def test_13_a_sweep_row_with_figures_named_alike_is_an_error_not_an_overwrite(tmp_path: Path):
    from clustersim.runner.sweep import Task, run_task

    raw = json.loads(json.dumps(TRACED))
    raw["jobs"][0]["name"] = "cluster"
    raw["duration"] = "1h"
    raw["trace"] = {"enabled": False}
    path = write(tmp_path, raw)
    row = run_task(Task(0, str(path), "base", (), (), 0))
    assert row["status"] == "error" and "named alike" in row["error"]


# ---------------------------------------------------------------------------------------------
# 14-17: exit 1 that should be 2


def test_14_a_deployment_starting_at_the_horizon_is_refused(tmp_path: Path):
    raw = _serving()
    raw["serve"][0]["start"] = 60
    refused(invoke("validate", write(tmp_path, raw)), "serve.0.start")
    raw["serve"][0]["start"] = "1min"  # a duration, as every other
    refused(invoke("validate", write(tmp_path, raw)), "serve.0.start", "at or after the end")
    refused(invoke("run", write(tmp_path, raw), "--find-rate"), "serve.0.start")


@pytest.mark.parametrize("text, words", [
    ("arrival_s,input_tokens,output_tokens,output_tokens\n0,16,4,4\n", ["more than once"]),
    ("arrival_s,input_tokens,output_tokens\n0,true,4\n", ["input_tokens is bool"]),
    ("arrival_s,input_tokens,output_tokens\n2024-01-01T00:00:00,16,4\n",
     ["arrival_s is timestamp"]),
    ("arrival_s,input_tokens,output_tokens\n0,16.5,4\n", ["not whole"]),
])
def test_14_17_a_malformed_request_trace_is_refused(tmp_path: Path, text, words):
    (tmp_path / "t.csv").write_text(text)
    raw = _serving()
    raw["serve"][0]["workload"] = {"arrival": "trace", "trace": "t.csv",
                                   "input_tokens": "trace", "output_tokens": "trace"}
    refused(invoke("run", write(tmp_path, raw), "-o", tmp_path / "out"), "t.csv", *words)


def test_14_plan_takes_a_checkpoint_interval_of_never(tmp_path: Path):
    raw = json.loads(json.dumps(TINY_PLAN))
    raw["jobs"][0]["checkpoint"] = {"interval": "never"}
    result = invoke("plan", write(tmp_path, raw), "-o", tmp_path / "p", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["best"]["checkpoint_interval_s"] is None


@pytest.mark.parametrize("damage", [
    "summary-list", "deployment-empty", "jobs-null", "no-cluster", "simulated-1e308",
    "deep-nesting", "nan-goodput", "events-is-jobs", "utilisation-is-events", "jobs-is-chips",
    "requests-is-jobs", "replicas-is-intervals", "string-columns", "scenario-garbage",
    "summary-fifo", "chips-text", "figure-1e400", "deployment-no-ttft",
    "job_summary-is-cluster_state", "job_summary-is-jobs",  # found by the long fuzz
])
def test_15_report_on_a_damaged_run_folder_exits_2_and_writes_nothing(traced_run: Path,
                                                                      tmp_path: Path, damage):
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = copy_run(traced_run, tmp_path)
    summary_path = run / "summary.json"
    summary = json.loads(summary_path.read_text())
    text = None
    if damage == "summary-list":
        text = "[1, 2]"
    elif damage == "deployment-empty":
        summary["deployments"] = {"chat": {}}
    elif damage == "jobs-null":
        summary["jobs"] = None
    elif damage == "no-cluster":
        del summary["cluster"]
    elif damage == "simulated-1e308":
        summary["simulated_s"] = 1e308
    elif damage == "deep-nesting":
        text = "[" * 100_000 + "]" * 100_000
    elif damage == "deployment-no-ttft":  # found by the fuzz: KeyError in the report's row
        summary["deployments"] = {"chat": {"requests_per_s": 1, "output_tokens_per_s": 1,
                                           "slo_goodput": 1.0}}
    elif damage == "nan-goodput":
        summary["deployments"] = {"chat": {"requests_per_s": 1, "output_tokens_per_s": 1,
                                           "slo_goodput": float("nan")}}
    elif damage == "chips-text":
        summary["cluster"]["chips"] = "many"
    elif damage == "figure-1e400":
        text = json.dumps(summary).replace('"simulated_s": ', '"simulated_s": 1e400, "x": ')
    elif damage == "scenario-garbage":
        (run / "scenario.yaml").write_text("{{{{ not: yaml: [")
    elif damage == "summary-fifo":
        summary_path.unlink()
        os.mkfifo(summary_path)
    elif damage == "string-columns":
        table = pq.read_table(run / "events.parquet")
        pq.write_table(pa.table({n: pa.array([str(v) for v in table.column(n).to_pylist()])
                                 for n in table.column_names}), run / "events.parquet")
    else:
        target, source = damage.split("-is-")
        (run / f"{target}.parquet").write_bytes((run / f"{source}.parquet").read_bytes())
    if damage != "summary-fifo":
        summary_path.write_text(text if text is not None else json.dumps(summary))
    result = invoke("report", run)
    refused(result)
    assert not (run / "report").exists() and leftovers(run) == []


@pytest.mark.parametrize("damage", ["1e400", "deep", "large"])
def test_15_check_on_a_damaged_golden_exits_2(tmp_path: Path, damage, monkeypatch):
    from clustersim.hardware import limits
    from clustersim.runner.check import read_golden
    from clustersim.scenario.errors import ScenarioError

    path = tmp_path / "summary.json"
    path.write_text({"1e400": '{"jobs": {"a": {"mfu": 1e400}}}',
                     "deep": "[" * 100_000 + "]" * 100_000,
                     "large": '{"a": "' + "x" * 5000 + '"}'}[damage])
    monkeypatch.setattr(limits, "MAX_SUMMARY_BYTES", 4096)
    with pytest.raises(ScenarioError):
        read_golden(path)


@pytest.mark.parametrize("grid, words", [
    ({"failures.scale": [1, "1e9", 5]}, ["mixed kinds", "1.0e9"]),
    ({"seed": [1, 2]}, ["seeds:"]),
])
def test_16_a_sweep_grid_that_cannot_be_written_is_refused_before_the_runs(tmp_path: Path,
                                                                          grid, words):
    write(tmp_path, TRACED, "base.yaml")
    sweep = write(tmp_path, {"scenario": "base.yaml", "grid": grid}, "sweep.yaml")
    refused(invoke("sweep", sweep, "-o", tmp_path / "out"), "grid", *words)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("cell, what", [
    ("instances=2.7", "instances 2.7"), ("instances=true", "boolean"),
    ("steps=2.5", "steps 2.5"), ("instances=-2", "instances -2"),
])
def test_17_job_trace_counts_are_not_coerced(tmp_path: Path, cell, what):
    key, value = cell.split("=")
    row = {"submit": "0s", "instances": "1", "template": "small", "steps": "10"}
    row[key] = value
    (tmp_path / "jobs.csv").write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    raw = {"name": "mix", "hardware": "trn2", "duration": "1d", "cluster": {"instances": 4},
           "workload": {"templates": [{"name": "small", "instances": [1], "job": {
               "model": "llama3-8b", "seq_len": 2048, "parallelism": {"tp": 8}}}],
                        "file": "jobs.csv"}}
    refused(invoke("validate", write(tmp_path, raw)), "jobs.csv", "row 1", what)


# ---------------------------------------------------------------------------------------------
# 18-19


def _handler(_: int) -> bool:
    import signal

    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_18_plan_workers_leave_ctrl_c_to_the_parent():
    from clustersim.planning.engine import Engine

    with Engine("local", workers=2) as engine:
        assert engine.map(_handler, [0, 1, 2]) == [True, True, True]


def _pid(_: int) -> int:
    import os

    return os.getpid()


def test_plan_workers_are_capped_at_the_cores(monkeypatch):
    """`plan --workers 100000` forked a process per worker asked for (the fuzz saw 1,500)."""
    import os

    from clustersim.planning.engine import Engine

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with Engine("local", workers=100_000) as engine:
        pids = engine.map(_pid, list(range(40)))
        assert len(engine._pool._processes) <= 2
    assert len(set(pids)) <= 2


def test_19_names_stay_in_their_table_cell():
    from clustersim.analysis.serving_report import cell

    assert cell("a\nb|c") == "a b\\|c"


def test_19_address_with_the_local_engine_and_tiny_budgets(tmp_path: Path):
    from clustersim.planning.figures import usd

    refused(invoke("plan", write(tmp_path, TINY_PLAN), "--address", "ray://x:1"), "--address")
    assert usd(0.000001) == "1e-06" and usd(1234.5) == "1,234"


# ---------------------------------------------------------------------------------------------
# Found by the long fuzz (scripts/fuzz.py --surfaces all): report, sweep, validate, signals

SERVED = dict(json.loads(json.dumps(TRACED)), duration="10min",
              cluster={"instances": 5, "spares": 1}, serve=[{
    "name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4}, "replicas": 2,
    "workload": {"arrival": "poisson", "rate": "2/s", "requests": 100, "input_tokens": 64,
                 "output_tokens": 16},
    "slo": {"ttft": "1s", "tpot": "100ms"}}])


@pytest.fixture(scope="module")
def served_run(tmp_path_factory) -> Path:
    return run_once(tmp_path_factory, "served", SERVED)


def _report_figures() -> list[tuple[str, str, str]]:
    from clustersim.analysis.run_checks import _RUN_FIGURES

    return [(section, key, kind) for section, figures in _RUN_FIGURES.items()
            for key, (kind, _) in figures.items()]


@pytest.mark.parametrize("section, key, kind", _report_figures())
def test_report_refuses_a_wrongly_typed_figure_by_its_key_path(served_run: Path,
                                                               tmp_path: Path, section, key,
                                                               kind):
    # The fuzz's 13 internal errors: `ETTR {job['ettr']:.1%}` on a figure of text, exit 1.
    run = copy_run(served_run, tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    where = {"": summary, "cluster": summary["cluster"], "jobs.*": summary["jobs"]["train"],
             "deployments.*": summary["deployments"]["chat"]}[section]
    where[key] = {"a": "x"} if kind == "an object of numbers" else (
        5 if kind == "text" else "x")
    (run / "summary.json").write_text(json.dumps(summary))
    path = {"": "", "cluster": "cluster.", "jobs.*": "jobs.train.",
            "deployments.*": "deployments.chat."}[section] + key
    refused(invoke("report", run), "summary.json", f"{path}: expected {kind}")
    assert not (run / "report").exists()


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_report_reads_no_figure_it_does_not_check(served_run: Path, tmp_path: Path):
    # Every figure of a job, the cluster and a deployment that the check does not type is
    # made text: the report still draws (so whatever it formats as a number is checked).
    from clustersim.analysis.run_checks import _RUN_FIGURES

    run = copy_run(served_run, tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    kept = {"chips", "instances", "chips_per_instance", "instances_per_ultraserver"}
    for section, entry in [("cluster", summary["cluster"]), ("jobs.*", summary["jobs"]["train"]),
                           ("deployments.*", summary["deployments"]["chat"])]:
        for key in entry:
            if key not in _RUN_FIGURES[section] and key not in kept:
                entry[key] = "text"
    (run / "summary.json").write_text(json.dumps(summary))
    result = invoke("report", run)
    assert result.exit_code == 0, result.output


FLEET_DAY = {"name": "day", "duration": "1h", "hardware": "trn2", "cluster": {"instances": 2},
             "fluid": {"curve_requests": 500},
             "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
                        "fidelity": "fluid", "slo": {"ttft": "1s", "tpot": "50ms"},
                        "workload": {"rate": "5/s", "input_tokens": 256,
                                     "output_tokens": 64}}]}


@pytest.mark.parametrize("damage", [None, ("fleet_day", "chip_hours_total", "x"),
                                    ("fleet_day", "chip_hours", {"serving": "x"}),
                                    ("deployments.chat", "replicas_max", None)])
def test_report_of_a_fleet_day_run_checks_the_figures_it_reads(tmp_path: Path, damage):
    out = tmp_path / "run"
    assert invoke("run", write(tmp_path, FLEET_DAY), "-o", out).exit_code == 0
    if damage is not None:
        summary = json.loads((out / "summary.json").read_text())
        section, key, value = damage
        node = summary
        for part in section.split("."):
            node = node[part]
        node[key] = value
        (out / "summary.json").write_text(json.dumps(summary))
        refused(invoke("report", out), f"{section}.{key}: expected")
    else:
        result = invoke("report", out)
        assert result.exit_code == 0, result.output


def _tiny_sweep(tmp_path: Path, **extra) -> Path:
    scenario = write(tmp_path, dict(json.loads(json.dumps(TRACED)), duration="6h",
                                    trace={"enabled": False}))
    return write(tmp_path, {"scenario": str(scenario), "grid": {"failures.scale": [1, 2]},
                            "seeds": [0], **extra}, "sweep.yaml")


@pytest.mark.parametrize("address, words", [
    ("localhost:1", "no Ray cluster answers there"), ("x", "expected HOST:PORT"),
    ("auto", "cannot join a Ray cluster there")])
def test_ray_engine_without_a_ray_cluster_is_refused(tmp_path: Path, monkeypatch, address,
                                                    words):
    # The fuzz: `sweep --engine ray --address auto` with no Ray cluster was exit 1
    # (ConnectionError); `localhost:1` waited on Ray's GCS for minutes.
    ray = import_ray()

    def no_cluster(**options):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "init", no_cluster)  # `auto` finds none, whatever runs here
    sweep = _tiny_sweep(tmp_path)
    refused(invoke("sweep", sweep, "--engine", "ray", "--address", address, "-o",
                   tmp_path / "s"), words)
    refused(invoke("plan", write(tmp_path, TINY_PLAN, "plan.yaml"), "--engine", "ray",
                   "--address", address, "-o", tmp_path / "p"), words)
    assert not (tmp_path / "s").exists() and not (tmp_path / "p").exists()


def test_validate_runs_the_weights_fit_check_run_makes(tmp_path: Path):
    raw = _serving()
    raw["serve"][0].update(model="llama3.1-405b", parallelism={"tp": 16})
    path = write(tmp_path, raw)
    for args in (["validate", path], ["run", path, "-o", tmp_path / "out"]):
        refused(invoke(*args), "serve.0.parallelism", "the weights do not fit", "on its busiest chip")
    assert invoke("validate", write(tmp_path, _serving())).exit_code == 0


def test_one_weights_fit_check_for_both_serving_levels():
    # Simulated directly (no runner before it), the request and fluid levels refuse a
    # deployment that does not fit with the same issue `run` and `validate` give.
    from clustersim.scenario.errors import ScenarioError
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving.fleetday import simulate_fleet_day
    from clustersim.serving.simulate import simulate_serving

    raw = _serving()
    raw["serve"][0].update(model="llama3.1-405b", parallelism={"tp": 16})
    scenario = scenario_from_dict(raw)
    for call in (lambda: simulate_serving(scenario, np.random.SeedSequence(0)),
                 lambda: simulate_fleet_day(scenario, 0, {})):
        with pytest.raises(ScenarioError, match="the weights do not fit") as error:
            call()
        assert "serve.0.parallelism" in str(error.value)


@pytest.mark.parametrize("autoscale", [None, {"min": 1, "max": 4}])
def test_a_fleet_day_deployment_holds_its_chips_from_its_start(autoscale):
    # It held its replicas (and their chip-hours) from t = 0 though it serves from `start`.
    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import scenario_from_dict

    def run(start: str):
        raw = json.loads(json.dumps(FLEET_DAY))
        raw["serve"][0].update(start=start, replicas=2)
        if autoscale:
            raw["serve"][0]["autoscale"] = autoscale
        return simulate(scenario_from_dict(raw)).summary

    whole, late = run("0s"), run("30min")
    hours = whole["deployments"]["chat"]["chip_hours"]
    assert late["deployments"]["chat"]["chip_hours"] == pytest.approx(hours / 2, rel=0.05)
    assert late["fleet_day"]["chip_hours"]["serving"] == pytest.approx(
        whole["fleet_day"]["chip_hours"]["serving"] / 2, rel=0.05)
    # Its replicas are counted over its own span: as many as when it started at 0.
    for key in ("replicas_min", "replicas_max"):
        assert late["deployments"]["chat"][key] == whole["deployments"]["chat"][key]
    assert late["deployments"]["chat"]["requests_per_s"] == pytest.approx(
        whole["deployments"]["chat"]["requests_per_s"], rel=0.1)


@pytest.mark.parametrize("job, grid, words", [
    ("cluster", {"failures.scale": [1, 2]}, "figures named alike"),
    ("j", {"failures.scale": [-1, -2]}, "ScenarioError"),
])
def test_a_sweep_whose_every_variant_is_refused_exits_2_with_the_first_error(
        tmp_path: Path, job, grid, words):
    # The fuzz: every run failed on figures named alike (a job named `cluster`): exit 1.
    raw = dict(json.loads(json.dumps(TRACED)), duration="6h", trace={"enabled": False})
    raw["jobs"][0]["name"] = job
    scenario = write(tmp_path, raw)
    sweep = write(tmp_path, {"scenario": str(scenario), "grid": grid, "seeds": [0]},
                  "sweep.yaml")
    result = invoke("sweep", sweep, "-o", tmp_path / "out", "--workers", "1")
    refused(result, "error: no run succeeded", "the first, variant base, seed 0", words)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("scale", [None, 2000])
def test_a_serving_only_report_draws_failures_only_when_there_were_some(tmp_path: Path,
                                                                        scale):
    # It drew failures.png saying "no failures" for a run with no training job and none.
    raw = dict(_serving(), duration="1h", trace={"enabled": True})
    raw["cluster"] = {"instances": 2}
    if scale:
        raw["failures"] = {"preset": "llama3", "scale": scale}
    out = tmp_path / "run"
    assert invoke("run", write(tmp_path, raw), "-o", out).exit_code == 0
    failed = json.loads((out / "summary.json").read_text())["cluster"]["failures"]
    assert bool(failed) == bool(scale)
    assert invoke("report", out).exit_code == 0
    assert (out / "report" / "failures.png").exists() == bool(scale)
    assert ("## Failures" in (out / "report" / "report.md").read_text()) == bool(scale)
