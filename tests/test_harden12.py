"""Session 12's hardening: what a demanding user found on the mixture presets, serving
stacks, traces and the command line's newer surfaces. One test (or a few) per defect."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import SMALL, invoke, refused, write

from clustersim.collectives import Group
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.scenario.loader import scenario_from_dict
from clustersim.training.memory import expert_params_per_rank
from clustersim.training.ranks import dp_rank_offsets, rank_chips
from clustersim.training.step import StepModel

ROOT = Path(__file__).resolve().parent.parent

# 1. ZeRO-3 with expert parallelism gathers each rank's experts over their holders --------


def _zero3_moe(order: str):
    """Qwen3-30B-A3B on 4 Trn2 instances: tp 4 (a chip's ranks), ep 16, dp 64, ZeRO-3."""
    raw = {"name": "z3", "hardware": "trn2", "cluster": {"instances": 4},
           "jobs": [{"name": "j", "model": "qwen3-30b-a3b", "global_batch": 64,
                     "seq_len": 4096,
                     "parallelism": {"tp": 4, "dp": 64, "ep": 16, "zero": 3,
                                     "order": order}}]}
    job = scenario_from_dict(raw).jobs[0]
    hw = catalog_entry("trn2")
    return job, hw, StepModel(build_topology(hw, 4))


@pytest.mark.parametrize("order", ["tp-cp-pp-dp", "tp-cp-ep-pp-dp"])
def test_zero3_gathers_experts_over_the_ranks_holding_them(order: str):
    """Each rank's routed experts (a 1/(tp x ep) share of a layer's) are sharded over the 4
    data-parallel ranks holding the same experts, one per instance (as memory counts them).
    Every rank of an instance gathers its own experts, so a layer's gather is at least one
    such group's all-gather of its chip's 4 ranks' expert bytes (and at least 3/4 of them
    over the chip's EFA line rate). Priced over the whole shard group, as if every rank of
    an instance wanted the same bytes, it came out about 5 times faster than that."""
    job, hw, step = _zero3_moe(order)
    par = job.parallelism
    experts_bytes = expert_params_per_rank(job, 1.0) * 2  # bf16
    holders = dp_rank_offsets(par, np.arange(0, par.dp, par.ep))  # rank 0's expert shard
    group = Group.from_rank_chips(rank_chips(hw, holders, np.arange(4)).tolist())
    assert len(set((group.chips // hw.chips_per_instance).tolist())) == 4
    one_group_s = step.collectives.cost("all-gather", group,
                                        experts_bytes * hw.chip.ranks).time_s
    assert one_group_s >= hw.chip.ranks * 3 / 4 * experts_bytes / hw.efa_per_chip_bytes_per_s
    gather_s, scatter_s, _, _ = step.zero3_traffic_s(job)
    assert gather_s >= one_group_s
    assert scatter_s >= one_group_s * 0.99
    # The planner's bound stays below the step (sharing links only slows collectives).
    assert step.lower_bound(job) <= step.profile(job).step_time_s


def test_zero3_step_exposes_more_than_zero2_with_experts_sharded():
    """ZeRO-1 and 2 gather no parameters in the passes; ZeRO-3 gathers every layer in every
    pass, so its exposed data-parallel time exceeds ZeRO-2's on the same layout."""
    job, _, step = _zero3_moe("tp-cp-ep-pp-dp")
    zero2 = job.model_copy(update={"parallelism": job.parallelism.model_copy(
        update={"zero": 2})})
    z3 = step.profile(job).exposed_comm_s["dp"]
    z2 = step.profile(zero2).exposed_comm_s["dp"]
    assert z3 > z2
    assert np.isfinite(z3)


# 2. step_breakdown's keys with context parallelism are documented --------------------------


def test_every_step_breakdown_key_of_a_context_parallel_mixture_is_documented(tmp_path):
    """A cp > 1 job's breakdown has `cp_comm_s`; docs/outputs.md listed tp, pp, dp and ep
    only and called exposed_comm_s 'the sum of the next four'."""
    raw = {"name": "cp", "hardware": "trn2", "cluster": {"instances": 2},
           "jobs": [{"name": "j", "model": "qwen3-30b-a3b", "global_batch": 32,
                     "seq_len": 8192, "recompute": "full",
                     "parallelism": {"tp": 4, "cp": 2, "dp": 16, "ep": 8, "zero": 1}}]}
    result = invoke("step", write(tmp_path, raw), "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    breakdown = json.loads(result.stdout)["jobs"][0]["step_breakdown"]
    assert {"cp_comm_s", "ep_comm_s"} <= set(breakdown)
    comm = [value for key, value in breakdown.items() if key.endswith("_comm_s")
            and key != "exposed_comm_s"]
    assert breakdown["exposed_comm_s"] == pytest.approx(sum(comm))
    page = (ROOT / "docs/outputs.md").read_text(encoding="utf-8")
    for key in breakdown:
        assert f"`step_breakdown.{key}`" in page, key


# 3. The serving planner compares hardware each with its own stack --------------------------

SERVE_ON_OPTIMUM = {
    "name": "sp", "duration": "2min", "hardware": "trn2", "cluster": {"instances": 1},
    "serve": [{"name": "chat", "model": "llama3.2-1b", "stack": "optimum-neuron@0.4",
               "parallelism": {"tp": 4}, "replicas": 1,
               "workload": {"rate": "1/s", "input_tokens": 256, "output_tokens": 64},
               "slo": {"ttft": "2s", "tpot": "100ms"}}]}


def test_a_stack_of_another_hardware_is_not_carried_to_the_compared_one(tmp_path: Path):
    """`plan --hardware p5en` on a deployment written for optimum-neuron on Trn2: every P5en
    candidate kept the stack, failed validation, and the plan said no configuration holds
    1 request/s. P5en runs its own default stack, and the plan says so."""
    from clustersim.planning.serving_space import _raw_variant, foreign_stack

    deployment = SERVE_ON_OPTIMUM["serve"][0]
    assert foreign_stack(deployment, "trn2") is None
    assert "tensorrt-llm" in foreign_stack(deployment, "p5en")
    assert "stack" not in _raw_variant(SERVE_ON_OPTIMUM, deployment, "p5en", 1, 1, 1, 16,
                                       1)["serve"][0]
    assert _raw_variant(SERVE_ON_OPTIMUM, deployment, "trn2u", 4, 1, 1, 16,
                        1)["serve"][0]["stack"] == "optimum-neuron@0.4"


@pytest.mark.slow
def test_the_plan_on_another_hardware_runs_its_default_stack(tmp_path: Path):
    """The whole plan (about 10 s: the capacity search of the best)."""
    result = invoke("plan", write(tmp_path, SERVE_ON_OPTIMUM), "--hardware", "p5en",
                    "-o", tmp_path / "plan", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    found = json.loads(result.stdout)
    assert found["best"]["hardware"] == "p5en"
    assert any("planned with tensorrt-llm" in note for note in found["notes"])


# 4. A refused elastic key shows the value written ------------------------------------------


def test_an_elastic_job_beside_a_workload_is_refused_with_its_mapping(tmp_path: Path):
    """The refusal named `jobs.0.elastic = 16`: the value of min_dp under the key of the
    mapping, a value the file does not hold there."""
    raw = {"name": "el", "duration": "1h", "hardware": "trn2", "cluster": {"instances": 4},
           "workload": {"arrivals": {"rate": "2/h", "count": 2},
                        "templates": [{"name": "t", "instances": {"min": 1, "max": 1},
                                       "run_for": {"median": "1h", "sigma": 0.5},
                                       "job": {"model": "llama3-8b",
                                               "parallelism": {"tp": 8}}}]},
           "jobs": [{"name": "train", "model": "llama3-8b", "global_batch": 16,
                     "parallelism": {"tp": 8, "dp": 16, "zero": 1},
                     "elastic": {"min_dp": 8}}],
           "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
                      "workload": {"load": {"sinusoid": {"peak": "10/s", "trough": "2/s",
                                                         "peak_at": "1h"}},
                                   "input_tokens": 256, "output_tokens": 64},
                      "slo": {"ttft": "1s", "tpot": "50ms"},
                      "autoscale": {"min": 1, "max": 4, "priority": 100}}]}
    refused(invoke("validate", write(tmp_path, raw)), "scenario.yaml",
            "jobs.0.elastic = {min_dp: 8}", "expected no elastic key")


# 5. A deployment whose weights do not fit is offered a smaller format than its own --------


@pytest.mark.parametrize(("precision", "offered"), [("bf16", "fp8 weights, "),
                                                    ("fp8", "mxfp4 weights, "),
                                                    ("mxfp4", "more tp or pp, or a smaller")])
def test_weights_that_do_not_fit_are_offered_a_smaller_format(tmp_path: Path, precision: str,
                                                               offered: str):
    """DeepSeek-V3 in fp8 on 4 Trn3 chips was told to use fp8 weights."""
    raw = {"name": "w", "hardware": "trn3-gen2", "cluster": {"instances": 36},
           "serve": [{"name": "chat", "model": "deepseek-v3", "precision": precision,
                      "parallelism": {"tp": 4}, "replicas": 1,
                      "workload": {"rate": "1/s", "input_tokens": 256, "output_tokens": 64},
                      "slo": {"ttft": "2s", "tpot": "100ms"}}]}
    result = invoke("validate", write(tmp_path, raw))
    refused(result, "serve.0.parallelism", "the weights do not fit", offered)
    if precision != "bf16":
        assert "fp8 weights" not in result.stderr


# 6. An uneven group on a NeuronSwitch UltraServer names the UltraServer ---------------------


def test_an_asymmetric_group_names_the_switch_ultraserver_as_its_node():
    """One chip on each of three Trn3 instances, two in one UltraServer and one in the
    next: every instance holds one chip, yet the refusal said 'every instance must hold
    the same number of its chips' (the node of a switch UltraServer is the UltraServer)."""
    from clustersim.collectives.groups import AsymmetricGroupError
    from clustersim.collectives.model import CollectiveModel

    hw = catalog_entry("trn3-gen2")
    per_instance, per_server = hw.chips_per_instance, hw.chips_per_instance * 36
    model = CollectiveModel(build_topology(hw, 72))
    chips = np.array([0, per_instance, per_server])
    with pytest.raises(AsymmetricGroupError, match=r"every UltraServer \(NeuronSwitch "
                       r"domain\) must hold the same number of its chips \(\[1, 2\] here"):
        model.cost("all-gather", Group(chips, 1), 1e6)
    trn2 = catalog_entry("trn2")
    with pytest.raises(AsymmetricGroupError, match="every instance must hold"):
        CollectiveModel(build_topology(trn2, 2)).cost("all-gather", Group(np.array([0, 1, 16]),
                                                                           1), 1e6)


# 7. run's closing `plan` hint is a command that plans -------------------------------------


def test_the_plan_hint_carries_the_overrides_and_is_left_out_for_trace_jobs(tmp_path: Path):
    """After a run the hint named `clustersim plan FILE` without the run's --set (a file
    valid only with them made the hint fail) and after trace-philly.yaml named a Philly job
    of 16 chips, which `plan` refuses on trn2u (less than one UltraServer)."""
    path = write(tmp_path, SMALL)
    done = invoke("run", path, "-o", tmp_path / "out", "--set", "duration=30min")
    assert done.exit_code == 0, done.stdout + done.stderr
    assert f"clustersim plan {path} --set duration=30min" in " ".join(done.stdout.split())
    trace = invoke("run", ROOT / "scenarios/trace-philly.yaml", "-o", tmp_path / "trace")
    assert trace.exit_code == 0, trace.stdout + trace.stderr
    assert "clustersim plan" not in trace.stdout
    refused(invoke("plan", ROOT / "scenarios/trace-philly.yaml", "-o", tmp_path / "plan"),
            "no hardware and size to plan on")


def _context_parallel_expert_job(zero: int):
    """Qwen3-30B-A3B at tp 4, cp 2, dp = ep = 8 on two trn2 instances under ZeRO `zero`: the
    job, its step model and the chip pair holding a rank's experts (its two context ranks)."""
    from clustersim.training.memory import _expert_shard

    raw = {"name": f"z{zero}", "hardware": "trn2", "cluster": {"instances": 2},
           "jobs": [{"name": "j", "model": "qwen3-30b-a3b", "global_batch": 64,
                     "seq_len": 4096,
                     "parallelism": {"tp": 4, "cp": 2, "dp": 8, "ep": 8, "zero": zero}}]}
    job = scenario_from_dict(raw).jobs[0]
    hw = catalog_entry("trn2")
    par = job.parallelism
    assert _expert_shard(par) == 2  # memory holds half of each rank's experts
    pair = Group.from_rank_chips(rank_chips(hw, np.array([0, par.tp]), np.arange(2)).tolist())
    return job, StepModel(build_topology(hw, 2)), pair


def test_zero3_gathers_experts_over_their_context_parallel_holders_too():
    """Context parallelism replicates the weights, so with dp = ep and cp 2 each rank's
    experts are sharded over its two context ranks (memory: dp x cp / ep holders) and
    ZeRO-3 gathers them every layer: the layer's gather is at least the dense part's plus
    one such pair's all-gather of the rank's experts. It was the dense part alone (the
    holders were looked for among the dp ranks only, one per context rank: none to
    gather from)."""
    from clustersim.training.memory import layer_params_per_rank

    job, step, pair = _context_parallel_expert_job(3)
    placed = np.arange(2)
    experts = expert_params_per_rank(job, 1.0)
    pair_s = step.collectives.cost("all-gather", pair, experts * 2).time_s  # bf16
    dense_s, _ = step.reduction.zero3_layer_times(job, placed,
                                                  layer_params_per_rank(job) - experts, 4, 2)
    gather_s, scatter_s, _, _ = step.zero3_traffic_s(job)
    assert pair_s > 0 and gather_s >= dense_s + pair_s


def test_zero1_reduces_experts_over_their_context_parallel_holders_too():
    """The same holders under ZeRO-1: with dp = ep and cp 2 a rank's experts' gradients are
    reduce-scattered over its two context ranks (the optimizer keeps half of them each), the
    chip's 4 TP ranks' pairs on the same two chips at once, so the step's reduction is at
    least that pair's reduce-scatter of the 4 ranks' expert gradients. It reduced the dense
    weights alone (the experts' holders were looked for among the dp ranks only)."""
    job, step, pair = _context_parallel_expert_job(1)
    par, placed = job.parallelism, np.arange(2)
    experts_bytes = expert_params_per_rank(job) * 2 * par.tp  # bf16, the chip's TP ranks
    pair_s = step.collectives.cost("reduce-scatter", pair, experts_bytes).time_s
    (times,) = step.reduction.per_pipeline_rank(job, placed, 2, 2).values()
    assert pair_s > 0 and times.reduce_s >= pair_s
