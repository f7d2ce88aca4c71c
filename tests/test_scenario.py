"""Scenario files: loading, derived figures, `--set` overrides, errors and the JSON Schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from clustersim.hardware.catalog import catalog_entry, catalog_names
from clustersim.scenario.loader import (
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_from_dict,
    scenario_json_schema,
)
from clustersim.training.transformer import model_preset_names

GiB = 2**30
DAY = 86400.0

# The complete example scenario of the interface contract (docs/scenario.md has it too), verbatim.
CONTRACT_EXAMPLE = """\
name: llama3-70b-trn2            # required; output folder name
description: free text
seed: 0
duration: 30d                    # simulated horizon
hardware: trn2                   # catalog name, or a mapping (below)
cluster:
  instances: 64                  # or `ultraservers: 16`; exactly one of them
  spares: 2                      # hot-spare instances
  fabric: {topology: clos, oversubscription: 1.0, instances_per_leaf: 16, latency: 15us}
jobs:
  - name: pretrain
    model: llama3.1-70b          # preset name, or a mapping (below)
    seq_len: 8192
    global_batch: 1024           # sequences per step
    micro_batch: 1
    parallelism: {tp: 32, pp: 8, dp: 16, zero: 1, sequence_parallel: true, interleave: 1}
    precision: bf16
    recompute: selective         # none | selective | full
    instances: 64                # optional: defaults to tp*pp*dp / ranks per instance
    submit: 0s
    steps: 100000                # optional: default runs to the horizon
    checkpoint: {interval: 1h, write: 60s, restore: 5min, async: false}   # interval may be `auto`
failures:
  preset: llama3                 # none | llama3 | meta-rsc1 | meta-rsc2 ...
  scale: 1.0                     # multiplies every rate
  rates:                         # added to / overriding the preset, per component
    - {component: chip, per: chip, mtbf: 40000h, distribution: exponential}
    - {component: host, per: instance, rate: 0.0065/d, distribution: weibull, shape: 0.8}
  detect: 2min                   # time to notice a failure
  repair: 4h                     # time to repair or replace a failed instance
  restart: 10min                 # job restart once hardware is available again
trace:
  bin: 1min                      # utilisation time bins
  levels: [cluster, job, instance]
"""

# A small valid scenario: 4 trn2 instances (256 ranks), one Llama 3 8B job over all of them.
SMALL: dict[str, Any] = {
    "name": "small",
    "hardware": "trn2",
    "cluster": {"instances": 4},
    "jobs": [
        {
            "name": "train",
            "model": "llama3-8b",
            "global_batch": 64,
            "parallelism": {"tp": 4, "pp": 4, "dp": 16},
        }
    ],
    "failures": {
        "preset": "none",
        "rates": [{"component": "chip", "mtbf": "40000h"}],
    },
}

DELETE = object()


def write(tmp_path: Path, content: str | dict[str, Any], name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    text = content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def changed(changes: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of `base` (SMALL) with dotted paths set (or removed with DELETE)."""
    raw = copy.deepcopy(SMALL if base is None else base)
    for path, value in changes.items():
        parts = path.split(".")
        node: Any = raw
        for part in parts[:-1]:
            key: Any = int(part) if isinstance(node, list) else part
            if not isinstance(node, list) and key not in node:
                node[key] = {}
            node = node[key]
        last: Any = int(parts[-1]) if isinstance(node, list) else parts[-1]
        if value is DELETE:
            del node[last]
        elif isinstance(node, list) and last == len(node):
            node.append(value)
        else:
            node[last] = value
    return raw


# ---------------------------------------------------------------------------------------------
# Valid scenarios


def test_contract_example_loads(tmp_path: Path) -> None:
    path = write(tmp_path, CONTRACT_EXAMPLE)
    scenario = load_scenario(path)
    assert isinstance(scenario, Scenario)
    assert scenario.name == "llama3-70b-trn2"
    assert scenario.duration_s == 30 * DAY
    assert scenario.hardware == catalog_entry("trn2")
    assert scenario.working_instances == 64
    assert scenario.total_instances == 66
    assert scenario.total_chips == 66 * 16
    assert scenario.cluster.fabric.latency_s == pytest.approx(15e-6)
    (job,) = scenario.jobs
    assert job.ranks == 32 * 8 * 16 == 64 * 64
    assert scenario.job_instances(job) == 64
    assert job.sequence_length == 8192
    assert job.checkpoint is not None
    assert job.checkpoint.interval_s == 3600.0
    assert job.checkpoint.restore_s == 300.0
    assert job.checkpoint.async_write is False
    # The preset is resolved into the model's shape.
    assert job.model.name == "llama3.1-70b"
    assert (job.model.layers, job.model.hidden, job.model.heads) == (80, 8192, 64)
    assert (job.model.n_kv_heads, job.model.ffn, job.model.vocab) == (8, 28672, 128256)
    assert job.model.gated
    failures = scenario.failures
    assert failures.preset == "llama3"
    assert failures.rates[0].events_per_s == pytest.approx(1 / (40000 * 3600.0))
    assert failures.rates[1].events_per_s == pytest.approx(0.0065 / DAY)
    assert failures.rates[1].shape == 0.8
    assert (failures.detect_s, failures.repair_s, failures.restart_s) == (120.0, 4 * 3600.0, 600.0)
    assert scenario.trace.bin_s == 60.0
    assert scenario.trace.levels == ["cluster", "job", "instance"]


def test_small_scenario_derived_figures(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, SMALL))
    (job,) = scenario.jobs
    assert scenario.total_chips == 64
    assert scenario.job_instances(job) == 4  # 256 ranks / 64 ranks per trn2 instance
    assert job.instances is None
    # No seq_len: the model preset's default training sequence length.
    assert job.seq_len is None
    assert job.sequence_length == 8192
    assert job.model.name == "llama3-8b"
    # Defaults.
    assert scenario.seed == 0
    assert scenario.duration_s == 30 * DAY
    assert scenario.cluster.spares == 0
    assert job.micro_batch == 1
    assert job.precision == "bf16"
    assert job.checkpoint is None
    assert scenario.trace.levels == ["cluster", "job"]


def test_sequence_length_default_follows_the_preset(tmp_path: Path) -> None:
    raw = changed({"jobs.0.model": "megatron-1.7b", "jobs.0.parallelism": {"tp": 4, "pp": 4,
                                                                          "dp": 16}})
    scenario = load_scenario(write(tmp_path, raw))
    assert scenario.jobs[0].sequence_length == 2048
    raw = changed({"jobs.0.seq_len": 4096})
    assert load_scenario(write(tmp_path, raw)).jobs[0].sequence_length == 4096


def test_model_mapping(tmp_path: Path) -> None:
    model = {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1000}
    raw = changed({"jobs.0.model": model, "jobs.0.parallelism": {"tp": 8, "pp": 2, "dp": 16}})
    job = load_scenario(write(tmp_path, raw)).jobs[0]
    assert job.model.n_kv_heads == 8
    assert job.model.ffn == 4 * 512
    assert job.sequence_length == 2048
    raw = changed({"jobs.0.model": {"base": "llama3-8b", "layers": 16}})
    job = load_scenario(write(tmp_path, raw)).jobs[0]
    assert job.model.layers == 16
    assert job.model.hidden == 4096


def test_ultraservers(tmp_path: Path) -> None:
    raw = changed({"hardware": "trn2u", "cluster": {"ultraservers": 2, "spares": 4}})
    scenario = load_scenario(write(tmp_path, raw))
    assert scenario.working_instances == 8
    assert scenario.total_instances == 12
    assert scenario.total_chips == 12 * 16
    assert scenario.job_instances(scenario.jobs[0]) == 4


@pytest.mark.parametrize("name", catalog_names())
def test_every_catalog_entry_makes_a_scenario(tmp_path: Path, name: str) -> None:
    spec = catalog_entry(name)
    cluster = {"ultraservers": 1} if spec.ultraserver else {"instances": 2}
    scenario = load_scenario(write(tmp_path, {"name": "x", "hardware": name, "cluster": cluster}))
    assert scenario.hardware == spec
    assert scenario.total_chips == (
        spec.chips_per_ultraserver if spec.ultraserver else 2 * spec.chips_per_instance
    )


def test_no_jobs_is_valid(tmp_path: Path) -> None:
    raw = changed({"jobs": DELETE})
    assert load_scenario(write(tmp_path, raw)).jobs == []
    raw = changed({"jobs": []})
    assert load_scenario(write(tmp_path, raw)).jobs == []
    minimal = {"name": "m", "hardware": "trn1", "cluster": {"instances": 1}}
    scenario = load_scenario(write(tmp_path, minimal))
    assert scenario.total_chips == 16
    assert scenario.failures.preset == "none"


def test_hardware_mapping_in_a_scenario(tmp_path: Path) -> None:
    raw = changed({"hardware": {"base": "trn2", "chip": {"hbm": "64GiB"}}})
    scenario = load_scenario(write(tmp_path, raw))
    assert scenario.hardware.chip.hbm_bytes == 64 * GiB
    assert scenario.hardware.chip.tflops == catalog_entry("trn2").chip.tflops
    assert "scenario" in scenario.hardware.sources["chip.hbm"]


def test_scenario_from_dict_leaves_its_input_alone() -> None:
    raw = changed({})
    before = copy.deepcopy(raw)
    scenario = scenario_from_dict(raw, overrides=["cluster.instances=8"])
    assert raw == before
    assert scenario.working_instances == 8


def test_scenario_is_frozen(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, SMALL))
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        scenario.seed = 3  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# --set overrides


def test_set_numbers(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL)
    scenario = load_scenario(
        path, overrides=["cluster.instances=8", "failures.scale=2", "seed=7",
                         "cluster.fabric.oversubscription=1.5"]
    )
    assert scenario.working_instances == 8
    assert scenario.total_chips == 128
    assert scenario.failures.scale == 2.0
    assert scenario.seed == 7
    assert scenario.cluster.fabric.oversubscription == 1.5
    # The file is not changed.
    assert yaml.safe_load(path.read_text()) == SMALL


def test_set_durations(tmp_path: Path) -> None:
    scenario = load_scenario(
        write(tmp_path, SMALL),
        overrides=["duration=7d", "jobs.0.checkpoint.interval=30min", "failures.repair=1h",
                   "trace.bin=15min", "jobs.0.submit=2h"],
    )
    assert scenario.duration_s == 7 * DAY
    job = scenario.jobs[0]
    assert job.checkpoint is not None  # created on the way
    assert job.checkpoint.interval_s == 1800.0
    assert job.checkpoint.write_s == 60.0
    assert job.submit_s == 7200.0
    assert scenario.failures.repair_s == 3600.0
    assert scenario.trace.bin_s == 900.0


def test_set_list_indices(tmp_path: Path) -> None:
    raw = changed({"jobs.1": {**copy.deepcopy(SMALL["jobs"][0]), "name": "second"}})
    scenario = load_scenario(
        write(tmp_path, raw),
        overrides=["cluster.instances=8", "jobs.1.parallelism.dp=32", "jobs.1.global_batch=128",
                   "failures.rates.0.mtbf=1000h", "trace.levels=[cluster, instance]"],
    )
    first, second = scenario.jobs
    assert scenario.job_instances(first) == 4
    assert scenario.job_instances(second) == 8
    assert second.global_batch == 128
    assert scenario.failures.rates[0].mtbf_s == 1000 * 3600.0
    assert scenario.trace.levels == ["cluster", "instance"]


def test_set_whole_mappings_and_null(tmp_path: Path) -> None:
    raw = changed({"jobs.0.steps": 100})
    scenario = load_scenario(
        write(tmp_path, raw),
        overrides=["jobs.0.steps=null",
                   "jobs.0.checkpoint={interval: auto, write: 30s}",
                   "jobs.0.parallelism={tp: 8, pp: 2, dp: 16}"],
    )
    job = scenario.jobs[0]
    assert job.steps is None
    assert job.checkpoint is not None
    assert job.checkpoint.interval_s == "auto"
    assert job.checkpoint.write_s == 30.0
    assert (job.parallelism.tp, job.parallelism.pp, job.parallelism.dp) == (8, 2, 16)


def test_later_overrides_win(tmp_path: Path) -> None:
    scenario = load_scenario(
        write(tmp_path, SMALL), overrides=["cluster.instances=8", "cluster.instances=6"]
    )
    assert scenario.working_instances == 6


def test_set_hardware_figure_on_a_catalog_name(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, SMALL), overrides=["hardware.chip.hbm=64GiB"])
    hw = scenario.hardware
    trn2 = catalog_entry("trn2")
    assert hw.chip.hbm_bytes == 64 * GiB
    assert hw.name != "trn2"  # a derived mapping, not the catalog entry
    assert hw.chip.tflops == trn2.chip.tflops
    assert hw.chip.hbm_bandwidth_bytes_per_s == trn2.chip.hbm_bandwidth_bytes_per_s
    assert hw.instance == trn2.instance
    assert "scenario" in hw.sources["chip.hbm"]
    assert hw.sources["chip.tflops.bf16"] == trn2.sources["chip.tflops.bf16"]
    # The effective scenario records the override.
    effective = yaml.safe_load(scenario.source_yaml)
    assert effective["hardware"] == {"base": "trn2", "chip": {"hbm": "64GiB"}}


def test_set_ultraserver_hardware(tmp_path: Path) -> None:
    scenario = load_scenario(
        write(tmp_path, SMALL),
        overrides=["hardware=trn2u", "cluster.instances=null", "cluster.ultraservers=1"],
    )
    assert scenario.hardware.name == "trn2u"
    assert scenario.working_instances == 4


def test_set_model_figure_on_a_preset_name(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, SMALL), overrides=["jobs.0.model.layers=40"])
    model = scenario.jobs[0].model
    preset = scenario_from_dict(SMALL).jobs[0].model
    assert model.layers == 40
    assert model.model_dump(exclude={"layers", "name"}) == preset.model_dump(
        exclude={"layers", "name"}
    )
    assert model.name != "custom"
    assert "llama3-8b" in model.name


def test_set_value_is_yaml(tmp_path: Path) -> None:
    scenario = load_scenario(
        write(tmp_path, SMALL),
        overrides=["jobs.0.parallelism.sequence_parallel=true", "description=a b = c"],
    )
    assert scenario.jobs[0].parallelism.sequence_parallel is True
    assert scenario.description == "a b = c"


# ---------------------------------------------------------------------------------------------
# Malformed scenarios
#
# Each case: what the file holds (a change of SMALL, or raw text), `--set` overrides, the key
# path the error must name (None: the whole file) and a word of what was expected.

MALFORMED = [
    pytest.param("key: [1, 2\nname: x\n", [], None, "syntax", id="yaml-syntax"),
    pytest.param("- name: x\n- hardware: trn2\n", [], None, "mapping", id="top-level-list"),
    pytest.param("", [], None, "mapping", id="empty-file"),
    pytest.param({"name": DELETE}, [], "name", "missing", id="missing-name"),
    pytest.param({"hardware": DELETE}, [], "hardware", "missing", id="missing-hardware"),
    pytest.param({"cluster": DELETE}, [], "cluster", "missing", id="missing-cluster"),
    pytest.param({"cluster": DELETE, "clustr": {"instances": 4}}, [], "clustr", "unknown",
                 id="misspelt-cluster"),
    pytest.param({"jobs.0.parallelism.tensor": 4}, [], "jobs.0.parallelism.tensor", "unknown",
                 id="unknown-nested-key"),
    pytest.param({"cluster.instances": "four"}, [], "cluster.instances", "whole number",
                 id="string-for-instances"),
    pytest.param({}, ["jobs.0.checkpoint={interval: auto, write: 0}"], "jobs.0.checkpoint",
                 "write time above zero", id="auto-interval-with-a-free-write"),
    pytest.param({"cluster.instances": -4}, [], "cluster.instances", "greater than",
                 id="negative-instances"),
    pytest.param({"cluster.instances": 1e30}, [], "cluster.instances", "too large",
                 id="instances-beyond-any-integer"),  # not pydantic's "Unable to parse"
    pytest.param({"duration": "0s"}, [], "duration", "greater than zero", id="zero-duration"),
    # a duration's bound in its unit ("at least 1s, got 1ms"), not "greater than or equal to 1"
    pytest.param({"fluid": {"interval": "1ms"}}, [], "fluid.interval", "at least 1s",
                 id="fluid-interval-below-a-second"),
    pytest.param({"fluid": {"interval": "2h"}}, [], "fluid.interval", "at most 1h",
                 id="fluid-interval-above-an-hour"),
    pytest.param({"duration": "30dys"}, [], "duration", "unit", id="duration-unit"),
    pytest.param({"hardware": {"base": "trn2", "chip": {"hbm": "96GiBs"}}}, [],
                 "hardware.chip.hbm", "GiB", id="hbm-unit-GiBs"),
    pytest.param({"hardware": "trn9"}, [], "hardware", "trn2", id="unknown-hardware"),
    pytest.param({"hardware": {"base": "trn9", "chip": {"hbm": "64GiB"}}}, [], "hardware.base",
                 "trn2", id="unknown-hardware-base"),
    pytest.param({"hardware": {"base": "trn2", "instance": {"chips": 8}}}, [],
                 "hardware.instance", "16 chips", id="hardware-torus-shape"),
    pytest.param({"jobs.0.model": "llama9-8b"}, [], "jobs.0.model", "llama3-8b",
                 id="unknown-model-preset"),
    pytest.param({"jobs.0.model": {"base": "llama9-8b"}}, [], "jobs.0.model.base", "preset",
                 id="unknown-model-base"),
    pytest.param({"jobs.0.model": {"layers": 4, "hidden": 100, "heads": 3, "vocab": 10}}, [],
                 "jobs.0.model.heads", "does not divide hidden", id="hidden-not-divisible-by-heads"),
    pytest.param({"jobs.0.instances": 4, "jobs.0.parallelism.dp": 8}, [], "jobs.0.parallelism",
                 "256", id="ranks-not-job-instances"),
    pytest.param({"jobs.0.parallelism.dp": 1}, [], "jobs.0.parallelism", "multiple of 64",
                 id="ranks-not-whole-instances"),
    pytest.param({"jobs.0.instances": 8, "jobs.0.parallelism.dp": 32}, [], "jobs.0.instances",
                 "cluster has 4", id="more-job-instances-than-cluster"),
    pytest.param({"jobs.0.parallelism.dp": 32}, [], "jobs.0.parallelism", "cluster has 4",
                 id="more-job-ranks-than-cluster"),
    pytest.param({"jobs.0.global_batch": 60}, [], "jobs.0.global_batch", "divisible",
                 id="global-batch-not-divisible"),
    # Uneven stages are fine (training.stages); a stage with no layer is not.
    pytest.param({"jobs.0.parallelism.interleave": 64}, [], "jobs.0.parallelism", "layers",
                 id="fewer-layers-than-stages"),
    pytest.param({"jobs.0.parallelism": {"tp": 4, "pp": 1, "dp": 64, "interleave": 2}}, [],
                 "jobs.0.parallelism.interleave", "pp", id="interleave-with-pp-1"),
    pytest.param({"cluster": {"ultraservers": 4}}, [], "cluster.ultraservers", "UltraServer",
                 id="ultraservers-without-ultraserver"),
    pytest.param({"hardware": "trn2u", "cluster.instances": 6}, [], "cluster.instances",
                 "multiple of 4", id="trn2u-instances-not-multiple-of-4"),
    pytest.param({"hardware": "trn2u", "cluster.spares": 2}, [], "cluster.spares",
                 "multiple of 4", id="trn2u-spares-not-multiple-of-4"),
    pytest.param({"hardware": "trn2u", "cluster.ultraservers": 1}, [], "cluster",
                 "exactly one", id="instances-and-ultraservers"),
    pytest.param({"failures.rates.0.rate": "1/d"}, [], "failures.rates.0", "exactly one",
                 id="rate-and-mtbf"),
    pytest.param({"failures.rates.0": {"component": "host", "per": "instance", "rate": "2/y",
                                       "distribution": "weibull"}}, [], "failures.rates.0",
                 "shape", id="weibull-without-shape"),
    pytest.param({"failures.rates.0.rate": "1/", "failures.rates.0.mtbf": DELETE}, [],
                 "failures.rates.0.rate", "0.0065/d", id="bad-rate"),
    pytest.param({"failures.rates.0.component": "gpu"}, [], "failures.rates.0.component",
                 "chip", id="unknown-failure-component"),
    pytest.param({"failures.preset": "llama4"}, [], "failures.preset", "llama3",
                 id="unknown-failure-preset"),
    pytest.param({"jobs.1": copy.deepcopy(SMALL["jobs"][0])}, [], "jobs.1.name", "unique",
                 id="duplicate-job-names"),
    pytest.param({"duration": "1h", "trace.bin": "2h"}, [], "trace.bin", "longer",
                 id="trace-bin-longer-than-duration"),
    pytest.param({"trace.levels": ["cluster", "chip"]}, [], "trace.levels.1", "instance",
                 id="unknown-trace-level"),
    pytest.param({"hardware": "p4d", "jobs.0.parallelism": {"tp": 8, "pp": 4, "dp": 1},
                  "jobs.0.precision": "fp8"}, [], "jobs.0.precision", "bf16",
                 id="fp8-on-p4d"),
    pytest.param({"jobs.0.checkpoint": {"interval": "-1h"}}, [], "jobs.0.checkpoint.interval",
                 "greater than zero", id="negative-checkpoint-interval"),
    pytest.param({"jobs.0.submit": "30d"}, [], "jobs.0.submit", "end", id="submit-after-end"),
    pytest.param({"name": "my scenario"}, [], "name", "letters", id="name-with-space"),
    pytest.param({"seed": -1}, [], "seed", "greater than", id="negative-seed"),
    pytest.param({"jobs.0.recompute": "some"}, [], "jobs.0.recompute", "selective",
                 id="unknown-recompute"),
    pytest.param({}, ["cluster.instances=-1"], "cluster.instances", "greater than",
                 id="bad-value-from-set"),
    pytest.param({}, ["cluster.instances"], "cluster.instances", "PATH=VALUE",
                 id="set-without-equals"),
    pytest.param({}, ["jobs.3.name=x"], "jobs.3", "list", id="set-index-out-of-range"),
]


@pytest.mark.parametrize(("content", "overrides", "key", "word"), MALFORMED)
def test_malformed_scenario(
    tmp_path: Path, content: str | dict[str, Any], overrides: list[str], key: str | None,
    word: str,
) -> None:
    path = write(tmp_path, content if isinstance(content, str) else changed(content))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, overrides=overrides)
    error = info.value
    text = str(error)
    assert text == error.render()
    assert str(path) in text
    if key is not None:
        assert any(issue.path == key for issue in error.issues), (key, error.issues)
        assert key in text
    assert word.lower() in text.lower()
    assert "Traceback" not in text


def test_there_are_enough_malformed_cases() -> None:
    assert len(MALFORMED) >= 20


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    text = "name: x\nhardware: trn2\ncluster:\n  instances: [4\n"
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (issue,) = info.value.issues
    assert issue.line is not None
    assert 4 <= issue.line <= 5
    assert f"{path}:{issue.line}" in str(info.value)

    path = write(tmp_path, "name: x\nhardware: trn2\n  cluster: 3\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert info.value.issues[0].line == 3
    assert f"{path}:3" in str(info.value)


def test_nonexistent_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(path) in str(info.value)
    assert "no such file" in str(info.value)
    with pytest.raises(ScenarioError, match="directory"):
        load_scenario(tmp_path)


@pytest.mark.parametrize(
    ("overrides", "key", "word"),
    [
        (["cluster.instances"], None, "PATH=VALUE"),
        (["=4"], None, "PATH=VALUE"),
        (["jobs.3.name=x"], "jobs.3", "the list has 1"),
        (["jobs.first.name=x"], "jobs.first", "list"),
        (["name.first=x"], "name", "not a mapping"),
        (["cluster.instances=[1"], "cluster.instances", "cannot read"),
    ],
)
def test_bad_set_syntax(tmp_path: Path, overrides: list[str], key: str | None, word: str) -> None:
    path = write(tmp_path, SMALL)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, overrides=overrides)
    text = str(info.value)
    assert "--set" in text
    if key is not None:
        assert key in text
    assert word in text


def test_offending_values_are_shown(tmp_path: Path) -> None:
    cases = [
        ({"cluster.instances": -4}, "-4"),
        ({"hardware": {"base": "trn2", "chip": {"hbm": "96GiBs"}}}, "'96GiBs'"),
        ({"hardware": "trn9"}, "'trn9'"),
        ({"jobs.0.global_batch": 60}, "60"),
        ({"failures.preset": "llama4"}, "'llama4'"),
    ]
    for change, shown in cases:
        path = write(tmp_path, changed(change))
        with pytest.raises(ScenarioError) as info:
            load_scenario(path)
        assert shown in str(info.value), change


def test_several_errors_are_all_reported(tmp_path: Path) -> None:
    raw = changed({
        "clustr": 3,
        "cluster.instances": -4,
        "jobs.0.model": "llama9",
        "trace.levels": ["chip"],
        "failures.preset": "llama4",
    })
    path = write(tmp_path, raw)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    paths = {issue.path for issue in info.value.issues}
    expected = {"clustr", "cluster.instances", "jobs.0.model", "trace.levels.0",
                "failures.preset"}
    assert expected <= paths
    lines = str(info.value).splitlines()
    assert len(lines) == len(info.value.issues) >= 5
    assert all(line.startswith(str(path)) for line in lines)


def test_several_cross_field_errors_are_all_reported(tmp_path: Path) -> None:
    raw = changed({
        "hardware": "trn2u",
        "cluster.instances": 6,
        "jobs.0.global_batch": 60,
        "jobs.0.parallelism.interleave": 64,  # more stages than layers
        "jobs.1": copy.deepcopy(SMALL["jobs"][0]),
    })
    with pytest.raises(ScenarioError) as info:
        load_scenario(write(tmp_path, raw))
    paths = {issue.path for issue in info.value.issues}
    assert {"cluster.instances", "jobs.0.global_batch", "jobs.0.parallelism",
            "jobs.1.name"} <= paths


def test_scenario_error_of_a_dict_names_its_source() -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(["not", "a", "mapping"], source="inline")
    assert str(info.value).startswith("inline")


# ---------------------------------------------------------------------------------------------
# JSON Schema


def test_json_schema_shape() -> None:
    schema = scenario_json_schema()
    assert isinstance(schema, dict)
    assert json.loads(json.dumps(schema)) == schema
    properties = schema["properties"]
    assert {"name", "hardware", "cluster", "jobs", "failures", "trace"} <= set(properties)
    assert {"name", "hardware", "cluster"} <= set(schema.get("required", []))
    hardware = properties["hardware"]
    enums = [option["enum"] for option in hardware["anyOf"] if "enum" in option]
    assert enums == [catalog_names()]
    assert "trn2" in enums[0]
    job = schema["$defs"]["JobSpec"]["properties"]
    model_enums = [option["enum"] for option in job["model"]["anyOf"] if "enum" in option]
    assert model_enums == [model_preset_names()]


def test_json_schema_validates_scenarios(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = scenario_json_schema()
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    example = yaml.safe_load(CONTRACT_EXAMPLE)
    assert list(validator.iter_errors(example)) == []
    assert list(validator.iter_errors(SMALL)) == []
    derived = changed({"hardware": {"base": "trn2", "chip": {"hbm": "64GiB"}},
                       "jobs.0.model": {"base": "llama3-8b", "layers": 16}})
    assert list(validator.iter_errors(derived)) == []
    assert list(validator.iter_errors(changed({"clustr": 1})))
    assert list(validator.iter_errors(changed({"hardware": "trn9"})))
    assert list(validator.iter_errors(changed({"name": DELETE})))
