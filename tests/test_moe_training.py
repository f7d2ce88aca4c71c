"""Training the 2025 models: MLA's FLOPs and activations, windowed attention, mixed dense and
MoE layers, routing's load, ZeRO-3 with expert parallelism, and the experts' all-to-all on
each level of the topology, against hand counts."""

from __future__ import annotations

import numpy as np
import pytest

from clustersim.collectives import CollectiveModel, Group
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.hardware.precision import BYTES_PER_ELEMENT
from clustersim.scenario.models import JobSpec
from clustersim.training.attention import attention_flops_per_token
from clustersim.training.experts import dispatch_bytes, expert_load
from clustersim.training.memory import activation_bytes_per_layer, busiest_memory
from clustersim.training.transformer import TransformerShape, model_preset_values
from clustersim.training.workload import layer_forward_ops, model_flops_per_step, stage_work


def shape(name: str) -> TransformerShape:
    return TransformerShape(**model_preset_values(name))


def job(model: str, **parallelism) -> JobSpec:
    extra = {k: parallelism.pop(k) for k in ("routing_imbalance", "capacity_factor",
                                             "recompute", "micro_batch") if k in parallelism}
    return JobSpec(name="j", model=shape(model), global_batch=1024, seq_len=4096,
                   parallelism=parallelism or {}, **extra)


def test_mla_forward_flops_by_hand() -> None:
    """One DeepSeek-V3 layer at tp 1: MLA's five projections and its core (192-wide
    queries and keys, 128-wide values), counted by hand."""
    m = shape("deepseek-v3")
    b, s, h, H = 1, 4096, 7168, 128
    t = b * s
    ops: dict[str, float] = {}
    for op in layer_forward_ops(m, b, s, 1, False, "bf16"):
        ops[op.name] = ops.get(op.name, 0.0) + op.flops
    assert ops["q_down"] == 2.0 * t * h * 1536
    assert ops["q_up"] == 2.0 * t * 1536 * H * 192
    assert ops["kv_down"] == 2.0 * t * h * 576
    assert ops["kv_up"] == 2.0 * t * 512 * H * 256
    assert ops["projection"] == 2.0 * t * H * 128 * h
    assert ops["attention"] == pytest.approx(2.0 * b * H * s * s * (192 + 128))
    # The mean layer: 58 of 61 layers route 8 of 256 experts and one shared; 3 are dense.
    routed = 2.0 * t * 8 * h * 2048 * 2 * 58 / 61
    assert ops["mlp_in"] == pytest.approx(routed + 2.0 * t * h * 18432 * 2 * 3 / 61)


def test_model_flops_are_six_active_weights_per_token_plus_attention() -> None:
    j = job("deepseek-v3")
    m = j.model
    tokens = 1024 * 4096
    weights = m.parameter_count(active=True, input_embedding=False) - 61 * 2 * 7168 - 7168
    attention = 61 * 2 * 4096 * (128 * 192 + 128 * 128)
    assert attention_flops_per_token(m, 4096) == attention
    assert model_flops_per_step(j) == pytest.approx(6.0 * weights * tokens
                                                    + 3.0 * attention * tokens)
    # ... about 6 x 37B active parameters per token, and 28% more for MLA's attention at 4K.
    assert model_flops_per_step(j) / (6 * 37e9 * tokens) == pytest.approx(1.26, abs=0.02)


def test_sliding_window_bounds_attention() -> None:
    """GPT-OSS: half its layers attend to 128 tokens, the others to the whole sequence."""
    m = shape("gpt-oss-120b")
    width = 2 * 64 * 64
    assert attention_flops_per_token(m, 4096) == 18 * 2 * 4096 * width + 18 * 2 * 128 * width
    ops = layer_forward_ops(m, 1, 4096, 1, False, "bf16")
    core = sum(op.flops for op in ops if op.name == "attention")
    assert core == pytest.approx(2.0 * 64 * 4096 * (4096 + 128) / 2 * width / 64)


def test_mla_activations_exceed_their_gqa_equivalent() -> None:
    """MLA keeps 192-wide queries and keys per head and its latents: more per layer than
    a GQA layer of the same hidden size would (closed form at tp 1, no recompute)."""
    j = job("deepseek-v3")
    e = BYTES_PER_ELEMENT["bf16"]
    sbh = 4096 * 7168
    attention = (2 * 128 * 192 + 2 * 128 * 128) / 7168
    latents = (1536 + 512 + 64) / 7168
    ffn = 3 * 2048 / 7168 * (8 + 1) * 58 / 61 + 3 * 18432 / 7168 * 3 / 61
    expected = e * sbh * (4 + latents) + e * sbh * (attention + ffn)
    assert activation_bytes_per_layer(j, "flash") == pytest.approx(expected)


def test_routing_load_scales_the_experts_work_and_the_all_to_all() -> None:
    base = job("qwen3-30b-a3b", tp=1, dp=8, ep=8)
    skewed = job("qwen3-30b-a3b", tp=1, dp=8, ep=8, routing_imbalance=1.5)
    capped = job("qwen3-30b-a3b", tp=1, dp=8, ep=8, routing_imbalance=1.5, capacity_factor=1.25)
    assert (expert_load(base), expert_load(skewed), expert_load(capped)) == (1.0, 1.5, 1.25)
    assert expert_load(job("qwen3-30b-a3b", tp=1, dp=8, ep=1, routing_imbalance=1.5)) == 1.0
    act = 4096 * 2048 * 2.0
    assert dispatch_bytes(skewed, act) == act * 8 * 1.5
    w0, w1 = stage_work(base, 48, True, True), stage_work(skewed, 48, True, True)
    assert len(w0.ep_collectives_forward) == 2 * 48  # dispatch and combine per MoE layer
    assert w1.ep_collectives_forward[0][1] == 1.5 * w0.ep_collectives_forward[0][1]
    f0 = sum(op.flops for op in w0.forward if op.name == "mlp_in")
    f1 = sum(op.flops for op in w1.forward if op.name == "mlp_in")
    assert f1 == pytest.approx(1.5 * f0, rel=1e-4)


def test_alternating_layers_all_to_all_once_per_moe_layer() -> None:
    """Llama 4 Maverick: 24 of its 48 layers have experts; a 12-layer chunk exchanges 6 x 2
    times, each the routed tokens' bytes."""
    j = job("llama4-maverick", tp=4, dp=4, ep=4)
    work = stage_work(j, 12, False, False)
    assert len(work.ep_collectives_forward) == 2 * 6
    act = 4096 * 5120 * 2.0
    assert work.ep_collectives_forward[0][1] == pytest.approx(act * 1 / 4)


def test_zero3_with_expert_parallelism_shards_experts_over_their_replicas() -> None:
    """ZeRO-3 with ep: expert weights over dp / ep ranks, the rest over dp (it used to be
    refused)."""
    j1 = job("qwen3-30b-a3b", tp=1, dp=16, ep=8, zero=3)
    j0 = job("qwen3-30b-a3b", tp=1, dp=16, ep=8, zero=1)
    m3 = busiest_memory(j1, 1, 96 * 2**30, 1)
    m1 = busiest_memory(j0, 1, 96 * 2**30, 1)
    assert m3.weights < m1.weights
    experts = 48 * 128 * 3 * 2048 * 768 / 8  # per rank before sharding
    dense = m1.weights / 2 - experts
    layer = (m1.weights / 2) / 48  # two layers' whole weights in flight
    assert m3.weights == pytest.approx(2 * (dense / 16 + experts / 2) + 2 * 2 * layer,
                                       rel=0.02)


@pytest.fixture(scope="module")
def trn2u() -> CollectiveModel:
    return CollectiveModel(build_topology(catalog_entry("trn2u"), 8))


def test_all_to_all_bytes_per_level(trn2u: CollectiveModel) -> None:
    """An expert group of one chip per instance: inside one UltraServer the pieces for the
    other 3 instances go over the Z rings (3/4 of the buffer); over two UltraServers half
    goes over EFA, a quarter over Z, and the slowest level sets the time."""
    size = 64e6
    one = trn2u.cost("all-to-all", Group(np.array([0, 16, 32, 48]), 1), size)
    levels = {s.level: s.bytes_per_rank for s in one.stages}
    assert levels["ultraserver"] == pytest.approx(size * 3 / 4)
    two = trn2u.cost("all-to-all", Group(np.arange(0, 128, 16), 1), size)
    levels = {s.level: s.bytes_per_rank for s in two.stages}
    assert levels["ultraserver"] == pytest.approx(size * 3 / 8)
    assert levels["fabric"] == pytest.approx(size * 4 / 8)
    inside = trn2u.cost("all-to-all", Group(np.arange(8), 1), size)  # one instance's torus
    assert [s.level for s in inside.stages] == ["instance"]
    assert inside.time_s < one.time_s < two.time_s


def test_trn3_switch_all_to_all_is_one_level() -> None:
    model = CollectiveModel(build_topology(catalog_entry("trn3-gen2"), 72))
    cost = model.cost("all-to-all", Group(np.arange(0, 144, 4), 1), 64e6)
    assert [s.level for s in cost.stages] == ["instance"]  # the NeuronSwitch domain


PRESETS = ("deepseek-v3", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b",
           "llama4-scout", "llama4-maverick", "gpt-oss-20b", "gpt-oss-120b",
           "trinity-nano", "trinity-mini", "trinity-large")
HARDWARE = {"trn2": ({"instances": 2}, 128), "trn2u": ({"ultraservers": 1}, 256),
            "trn3-gen2": ({"ultraservers": 1}, 576), "p5en": ({"instances": 2}, 16)}


def _step_of(hardware: str, name: str) -> float:
    from clustersim.runner.api import step_profiles
    from clustersim.scenario.loader import scenario_from_dict

    cluster, ranks = HARDWARE[hardware]
    dp = ranks // 8
    moe = shape(name).moe
    scenario = scenario_from_dict({
        "name": "x", "duration": "1d", "hardware": hardware, "cluster": cluster,
        "jobs": [{"name": "j", "model": name, "seq_len": 4096, "global_batch": dp,
                  "parallelism": {"tp": 8, "dp": dp, "ep": min(8, dp) if moe else 1,
                                  "zero": 1}}]}, "x")
    return step_profiles(scenario)["j"].step_time_s


@pytest.mark.slow
@pytest.mark.parametrize("hardware", sorted(HARDWARE))
def test_every_preset_steps_on_every_hardware(hardware: str) -> None:
    for name in PRESETS:
        assert 0 < _step_of(hardware, name) < float("inf")


def test_deepseek_v3_steps_on_trn2_and_trn3() -> None:
    assert _step_of("trn3-gen2", "deepseek-v3") < _step_of("trn2", "deepseek-v3")


def test_a_run_records_and_prints_the_expert_parallel_layout(tmp_path) -> None:
    """summary.json has each job's cp, ep and ZeRO stage and each deployment's ep beside tp
    and pp (job_summary.parquet the same columns), and the run table prints ep where it is
    above 1: a MoE layout was written nowhere in a run's outputs."""
    import json

    import pyarrow.parquet as pq
    import yaml
    from typer.testing import CliRunner

    from clustersim.cli.app import app

    scenario = {
        "name": "ep-layout", "hardware": "trn2", "duration": "1h", "cluster": {"instances": 3},
        "jobs": [{"name": "moe", "model": "mixtral-8x7b", "global_batch": 64, "seq_len": 2048,
                  "recompute": "full",
                  "parallelism": {"tp": 8, "dp": 16, "ep": 8, "zero": 1,
                                  "sequence_parallel": True}},
                 {"name": "dense", "model": "llama3-8b", "global_batch": 32, "instances": 1,
                  "parallelism": {"tp": 8, "dp": 8, "zero": 3}}],
        "serve": [{"name": "chat", "model": "qwen3-30b-a3b", "parallelism": {"tp": 16, "ep": 4},
                   "replicas": 1,
                   "workload": {"arrival": "poisson", "rate": "2/s", "requests": 40,
                                "input_tokens": 128, "output_tokens": 8}}],
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")],
                                terminal_width=200)
    assert result.exit_code == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    moe, dense = summary["jobs"]["moe"], summary["jobs"]["dense"]
    assert (moe["tp"], moe["cp"], moe["pp"], moe["dp"], moe["ep"], moe["zero"]) == (
        8, 1, 1, 16, 8, 1)
    assert (dense["ep"], dense["zero"]) == (1, 3)
    assert summary["deployments"]["chat"]["ep"] == 4
    rows = pq.read_table(tmp_path / "out" / "job_summary.parquet",
                         columns=["name", "ep", "zero"]).to_pylist()
    assert {r["name"]: (r["ep"], r["zero"]) for r in rows} == {"moe": (8, 1), "dense": (1, 3)}
    table = " ".join(result.stdout.replace("│", " ").split())  # (the table's cells wrap)
    assert "x dp 16 (ep 8)" in table and "x pp 1 (ep 4)" in table
    assert "x dp 8 (ep" not in table and "x dp 8," in table
