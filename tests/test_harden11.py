"""Session 11's hardening: flags take only a YAML true or false, a workload's unreadable file
is reported under its own key, and what a demanding user found on the newest surfaces. One
test (or a few) per defect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_helpers import SMALL, invoke, refused, set_key, write
from pydantic import ValidationError

import clustersim.cli.app  # noqa: F401 (imports every spec)
from clustersim.hardware.spec import Spec

ROOT = Path(__file__).resolve().parent.parent


# 1. Flags: a YAML true or false, nothing pydantic's lax mode reads as one ------------------

FLAG_KEYS = ["jobs.0.parallelism.sequence_parallel", "jobs.0.checkpoint.async",
             "scheduler.preemption", "scheduler.borrowing", "trace.enabled"]


@pytest.mark.parametrize("key", FLAG_KEYS)
@pytest.mark.parametrize("value", ["yes", "on", "1", "true", 1, 0])
def test_a_flag_refuses_text_and_numbers(tmp_path: Path, key: str, value):
    raw = json.loads(json.dumps(SMALL))
    raw["jobs"][0]["checkpoint"] = {"interval": "1h", "write": "30s"}
    raw["scheduler"] = {}
    set_key(raw, key, value)
    refused(invoke("validate", write(tmp_path, raw)), "scenario.yaml", key, repr(value),
            "expected true or false")


def test_bare_yaml_yes_and_no_are_flags(tmp_path: Path):
    # PyYAML reads YAML 1.1: bare yes/no/on/off are booleans (docs/scenario.md says so)
    from clustersim.scenario.loader import load_scenario

    text = yaml.safe_dump(SMALL).replace("enabled: false", "enabled: yes")
    scenario = load_scenario(write(tmp_path, text.replace("zero: 1", "zero: 1\n    "
                                                          "sequence_parallel: on")))
    assert scenario.trace.enabled is True
    assert scenario.jobs[0].parallelism.sequence_parallel is True


def _specs(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_specs(sub)]
    return found


def test_every_flag_of_every_spec_refuses_a_string():
    # one check for every boolean field, present and future: none is left to the lax mode
    flags = [(spec, name) for spec in _specs(Spec) for name, field in spec.model_fields.items()
             if field.annotation is bool]
    assert len(flags) >= 10, flags
    for spec, name in flags:
        field = spec.model_fields[name]
        with pytest.raises(ValidationError) as caught:
            spec.model_validate({field.alias or name: "yes"})
        errors = [e for e in caught.value.errors() if e["loc"] == (field.alias or name,)]
        assert errors and errors[0]["type"] == "bool_type", (spec, name, errors)


def test_a_flag_set_on_the_command_line_is_checked_too(tmp_path: Path):
    scenario = write(tmp_path, SMALL)
    refused(invoke("validate", scenario, "--set", "trace.enabled='no'"), "trace.enabled",
            "'no'", "expected true or false")
    assert invoke("validate", scenario, "--set", "trace.enabled=no").exit_code == 0


# 2. A workload's file that cannot be read: under its own key -------------------------------

def _trace_scenario(folder: Path, fmt: str, trace: Path, **workload) -> Path:
    raw = yaml.safe_load((ROOT / f"scenarios/trace-{fmt}.yaml").read_text("utf-8"))
    raw["workload"]["trace"] = str(trace)
    raw["workload"].update(workload)
    raw["trace"] = {"enabled": False}
    return write(folder, raw)


@pytest.mark.parametrize(("fmt", "name", "text", "kind"), [
    ("philly", "bad.json", "[{]", "JSON"),
    ("helios", "bad.csv", 'job_id,user\n"x\n', "CSV"),
])
def test_an_unreadable_trace_is_reported_under_workload_trace(tmp_path: Path, fmt, name,
                                                               text, kind):
    trace = tmp_path / name
    trace.write_text(text, encoding="utf-8")
    result = invoke("validate", _trace_scenario(tmp_path, fmt, trace))
    refused(result, f"scenario.yaml: workload.trace: {trace}: cannot read it as {kind}")
    assert "workload: " not in result.stderr


def test_a_native_trace_is_not_called_a_workload_file(tmp_path: Path):
    trace = tmp_path / "native.csv"
    trace.write_text("submit,instances\n0,1\n", encoding="utf-8")
    result = invoke("validate", _trace_scenario(tmp_path, "native", trace))
    refused(result, "scenario.yaml: workload.trace: ", "missing columns template")
    assert "workload.file" not in result.stderr


def test_a_trace_mapping_problem_is_reported_under_its_key(tmp_path: Path):
    trace = ROOT / "scenarios/traces/helios-sample.csv"
    result = invoke("validate", _trace_scenario(tmp_path, "helios", trace,
                                                mapping={"rule": "compute", "gpu": "zz"}))
    refused(result, "scenario.yaml: workload.mapping.gpu: 'zz' is not a catalog hardware")


# 3. A demanding user's findings on the newest surfaces -------------------------------------

def _serving(folder: Path, rows: str) -> Path:
    (folder / "requests.csv").write_text(rows, encoding="utf-8")
    return write(folder, {
        "name": "replay", "hardware": "trn2", "duration": "2min", "cluster": {"instances": 1},
        "serve": [{"name": "chat", "model": "llama3-8b", "parallelism": {"tp": 16},
                   "workload": {"arrival": "trace", "trace": "requests.csv",
                                "input_tokens": "trace", "output_tokens": "trace"},
                   "slo": {"ttft": "2s", "tpot": "100ms"}}]})


@pytest.mark.parametrize(("rows", "words"), [
    ("arrival_s,input_tokens,output_tokens\n", ["has no requests"]),
    ("arrival_s,input_tokens,output_tokens\n-1,100,10\n", ["column arrival_s has -1"]),
    ("arrival_s,input_tokens,output_tokens\n0,1e30,10\n", ["column input_tokens"]),
    ("arrival_s,input_tokens\n0,100\n", ["lacks column(s) output_tokens"]),
    ("arrival_s,input_tokens,output_tokens\n500,100,10\n", ["none of the trace's 1 arrivals"]),
])
def test_validate_reads_a_request_trace_as_run_does(tmp_path: Path, rows: str, words):
    # validate said ok and run then refused the trace
    scenario = _serving(tmp_path, rows)
    refused(invoke("validate", scenario), "serve.0.workload.trace", "'requests.csv'", *words)
    refused(invoke("run", scenario, "-o", tmp_path / "out"), "serve.0.workload.trace", *words)
    assert not (tmp_path / "out").exists()


def test_validate_counts_a_serving_scenarios_deployments(tmp_path: Path):
    # it said "(replay: 16 Trainium2 chips, 0 jobs)"
    result = invoke("validate", _serving(tmp_path, "arrival_s,input_tokens,output_tokens\n"
                                                   "0,100,10\n1,200,20\n"))
    assert result.exit_code == 0, result.output
    assert "16 Trainium2 chips, 0 jobs, 1 deployment)" in result.stdout


def test_step_of_a_serving_scenario_says_what_it_needs(tmp_path: Path):
    scenario = _serving(tmp_path, "arrival_s,input_tokens,output_tokens\n0,100,10\n")
    refused(invoke("step", scenario), "no jobs", "`jobs:`", "simulated by `run`")


def test_step_title_counts_context_parallelism(tmp_path: Path):
    # "tp 4 x pp 1 x dp 8" for a job of tp 4 x cp 2 x pp 1 x dp 8 = 64 ranks
    raw = json.loads(json.dumps(SMALL))
    raw["jobs"][0].update(model="qwen3-30b-a3b", seq_len=8192,
                          parallelism={"tp": 4, "cp": 2, "dp": 8, "ep": 8, "zero": 1})
    result = invoke("step", write(tmp_path, raw), "--ignore-memory")
    assert result.exit_code == 0, result.output
    assert "tp 4 x cp 2 x pp 1 x dp 8 (ep 8)" in " ".join(result.stdout.split())


def test_a_plans_best_names_every_degree():
    from clustersim.cli.plan_tables import _layout

    row = {"tp": 1, "cp": 2, "pp": 4, "dp": 8, "ep": 4, "interleave": 2,
           "order": "tp-cp-ep-pp-dp"}
    assert _layout(row) == "tp 1 cp 2 pp 4 v 2 dp 8 ep 4i"
    assert _layout({**row, "cp": 1, "ep": 1, "interleave": 1}) == "tp 1 pp 4 dp 8"


@pytest.mark.slow  # two hardware entries planned: about 10 s
def test_plan_prints_each_hardwares_best_with_its_cp_and_ep(tmp_path: Path):
    # "trn2 at its best: 16 chips, tp 1 pp 1 dp 32": 32 of its 64 ranks
    raw = {"name": "moe", "hardware": "trn2", "duration": "30d", "cluster": {"instances": 1},
           "jobs": [{"name": "moe", "model": "qwen3-30b-a3b", "seq_len": 4096,
                     "global_batch": 64}], "trace": {"enabled": False}}
    result = invoke("plan", write(tmp_path, raw), "--hardware", "trn2,p5en", "--chips", "16",
                    "-o", tmp_path / "plan", "--top", "1")
    assert result.exit_code == 0, result.output
    ranks = {"trn2": 64, "p5en": 16}
    for line in result.stdout.splitlines():
        name, _, rest = line.partition(" at its best: ")
        if rest:
            degrees = rest.split(", ")[1].split()
            product = 1
            for key, value in zip(degrees[::2], degrees[1::2], strict=True):
                product *= int(value.rstrip("i")) if key != "v" and key != "ep" else 1
            assert product == ranks.pop(name), line
    assert not ranks, result.stdout


def test_a_closed_stdout_is_no_internal_error():
    # `clustersim models NAME --json | head` printed "internal error: BrokenPipeError"
    import os
    import subprocess
    import sys

    read, write_end = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "clustersim", "models", "deepseek-v3", "--json"],
                              stdout=write_end, stderr=subprocess.PIPE, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 1 and done.stderr == b"", done.stderr


def test_a_layout_whose_groups_cannot_be_formed_is_refused_not_an_internal_error(
        tmp_path: Path):
    # 72 Trn3 Gen2 instances over 2 UltraServers of 36: an expert's 9 data-parallel
    # replicas (dp 72 / ep 8, 8 instances apart) are 5 in one UltraServer and 4 in the other:
    # "internal error: AsymmetricGroupError"
    raw = {"name": "t3", "hardware": "trn3-gen2", "duration": "1d",
           "cluster": {"ultraservers": 2}, "trace": {"enabled": False},
           "jobs": [{"name": "moe", "model": "qwen3-30b-a3b", "seq_len": 4096,
                     "global_batch": 288,
                     "parallelism": {"tp": 4, "pp": 4, "dp": 72, "ep": 8, "zero": 1}}]}
    scenario = write(tmp_path, raw)
    words = ["jobs.0.parallelism = {tp: 4, pp: 4, dp: 72, zero: 1, ep: 8}", "job moe",
             "cannot be formed on trn3-gen2", "clustersim plan"]
    refused(invoke("step", scenario), *words)
    refused(invoke("run", scenario, "-o", tmp_path / "out"), *words)
    assert not (tmp_path / "out").exists()


def _deployment(tmp_path: Path, **changes) -> Path:
    deployment = {"name": "g", "model": "gpt-oss-120b", "parallelism": {"tp": 8, "ep": 8},
                  "replicas": 2, "slo": {"ttft": "2s", "tpot": "100ms"},
                  "workload": {"arrival": "poisson", "rate": "1/s", "input_tokens": 1024,
                               "output_tokens": 128}}
    deployment.update(changes)
    return write(tmp_path, {"name": "sp", "hardware": "p5en", "duration": "2min",
                            "cluster": {"instances": 2}, "serve": [deployment]})


@pytest.mark.parametrize(("changes", "line"), [
    ({"parallelism": {"tp": 8, "ep": 3}},
     "serve.0.parallelism.ep = 3: ep must divide both tp (8) and the model's 128 experts"),
    ({"parallelism": {"tp": 8, "pp": 7}},
     "serve.0.parallelism.pp = 7: the model's 36 layers do not split into 7 stages"),
    ({"model": "llama3-8b"}, "serve.0.parallelism.ep = 8: ep needs a mixture of experts"),
    ({"disaggregated": {"prefill_replicas": 1, "decode_replicas": 2}},
     "serve.0.disaggregated = {prefill_replicas: 1, decode_replicas: 2}: its pools (3 "
     "replicas) must add up to replicas (2)"),
])
def test_a_deployments_own_checks_name_their_key_and_value(tmp_path: Path, changes, line):
    # they said "serve.0: parallelism.ep 3 must divide tp 8 and the 128 experts"
    refused(invoke("validate", _deployment(tmp_path, **changes)), f"scenario.yaml: {line}")


def test_too_many_replicas_show_no_value_that_is_not_in_the_file(tmp_path: Path):
    # "serve = 4: the deployments' replicas need 4 instances": no key holds 4
    result = invoke("validate", _deployment(tmp_path, parallelism={"tp": 8, "pp": 2, "ep": 8}))
    refused(result, "scenario.yaml: serve: the deployments' replicas need 4 instances")
    assert "serve = " not in result.stderr


@pytest.mark.parametrize(("change", "line"), [
    ({"top_k": 300}, "jobs.0.model.top_k = 300: more than the model's 32 experts"),
    ({"kv_heads": 7}, "jobs.0.model.kv_heads = 7: expected a divisor of heads (64)"),
    ({"dense_layers": 24}, "jobs.0.model.dense_layers = 24: with moe_every 1, leaves none of "
                           "the 24 layers a MoE layer"),
    ({"attention": "mla"}, "jobs.0.model.attention = 'mla': needs kv_lora_rank"),
    ({"q_lora_rank": 16}, "jobs.0.model.q_lora_rank = 16: only with attention: mla"),
    ({"window": None, "global_every": 2}, "jobs.0.model.global_every = 2: needs a window"),
    ({"heads": 7, "head_dim": None}, "jobs.0.model.heads = 7: does not divide hidden (2880)"),
])
def test_a_models_own_checks_name_their_key_and_value(tmp_path: Path, change, line):
    # they said "jobs.0.model: top_k 300 is more than the 32 experts"
    raw = json.loads(json.dumps(SMALL))
    raw["cluster"]["instances"] = 4
    raw["jobs"][0].update(model={"base": "gpt-oss-20b", **change}, global_batch=64,
                          parallelism={"tp": 8, "dp": 32, "ep": 8 if "top_k" not in change
                                       else 1, "zero": 1})
    refused(invoke("validate", write(tmp_path, raw)), f"scenario.yaml: {line}")


@pytest.mark.parametrize(("lengths", "line"), [
    ({"distribution": "lognormal", "median": 1000, "sigma": 1, "max": 200},
     "serve.0.workload.input_tokens.median = 1000.0: outside [min 1, max 200]"),
    ({"distribution": "lognormal", "median": 10, "sigma": 1, "min": 20},
     "serve.0.workload.input_tokens.median = 10.0: outside [min 20, max 131072]"),
    ({"distribution": "fixed", "value": 10, "min": 20, "max": 10},
     "serve.0.workload.input_tokens.min = 20: above max 10"),
])
def test_request_lengths_whose_median_the_clipping_hides_are_refused(tmp_path: Path, lengths,
                                                                      line):
    # a median of 1,000 clipped to max 200 ran every prompt at 200 tokens, silently
    workload = {"arrival": "poisson", "rate": "1/s", "input_tokens": lengths,
                "output_tokens": 128}
    refused(invoke("validate", _deployment(tmp_path, workload=workload)), line)


def test_set_into_a_list_the_file_does_not_have_says_so(tmp_path: Path):
    # it made a mapping {"0": ...} and said "failures.rates: expected a list"
    scenario = write(tmp_path, SMALL)
    refused(invoke("validate", scenario, "--set", "failures.rates.0.rate=1/d"),
            "failures.rates: --set 'failures.rates.0.rate=1/d': no list item '0': the file "
            "has no list here; expected the whole list, e.g. --set 'failures.rates=[...]'")
    whole = "failures.rates=[{component: host, per: instance, rate: 1/d}]"
    assert invoke("validate", scenario, "--set", whole).exit_code == 0


@pytest.mark.parametrize("name", ["   ", "x\ny", "a\tb", "\u202eabc"])
def test_a_job_or_deployment_name_must_print_on_one_line(tmp_path: Path, name: str):
    # '   ' and 'x\ny' were accepted and printed as a blank or a broken line
    raw = json.loads(json.dumps(SMALL))
    raw["jobs"][0]["name"] = name
    refused(invoke("validate", write(tmp_path, raw)), "jobs.0.name = ", "expected a name")
    refused(invoke("validate", _deployment(tmp_path, name=name)), "serve.0.name = ",
            "expected a name")
