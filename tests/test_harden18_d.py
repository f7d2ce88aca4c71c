"""Session 18, helper d: replicated K/V projection weights when tp exceeds the KV heads,
trace workloads that leave out every row, and what `models --json` says of MLA models."""

from __future__ import annotations

import pytest

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.serving.layers import busiest_stage_parameters_per_rank, layer_kinds
from clustersim.training.transformer import TransformerShape, model_preset_values


def _model(name: str) -> TransformerShape:
    return TransformerShape(**model_preset_values(name))


def _replica(name: str, hardware: str, tp: int) -> IterationModel:
    spec = catalog_entry(hardware)
    shape = ReplicaShape(_model(name), "bf16", tp, 1)
    return IterationModel(shape, build_topology(spec, 2 * spec.instances_per_ultraserver))


@pytest.mark.parametrize("name", ["llama3.1-70b", "qwen3-32b"])
def test_serving_weights_hold_the_replicated_kv_heads(name: str) -> None:
    """8 KV heads at tp 64: NxD replicates each to 8 ranks, so every rank holds one whole
    KV head's K and V projections (hidden x head_dim each), not an eighth of the model's 8.
    The weights per chip counted 8/64 of a head (Llama 3.1 70B on Trn2: 8.21 GiB a chip,
    now 9.31), while the iteration's qkv matmul already read a whole head's."""
    it = _replica(name, "trn2", 64)
    m = it.shape.model
    h, d, tp = m.hidden, m.head_dim, 64
    assert (it.heads.kv_per_rank, m.n_kv_heads) == (1, 8)
    share = busiest_stage_parameters_per_rank(m, tp, 1, 0.0)  # 1/tp of every layer's
    replicated = m.layers * 2 * h * d * (1 - m.n_kv_heads / tp)  # K, V: 1 head, not 1/8
    ranks = it.hardware.chip.ranks
    assert it.weight_bytes_per_chip() == pytest.approx(
        (share + replicated) * it.element_bytes * ranks, rel=1e-12)
    # The memory holds what the time model reads: the qkv matmul's weight operand.
    (_, ops, _), = layer_kinds(it, 1, True)
    qkv = next(op for op in ops if op.name == "qkv")
    assert qkv.k * qkv.n == h * d * (it.heads.per_rank + 2 * it.heads.kv_per_rank)


def test_serving_weights_unchanged_when_tp_divides_the_kv_heads() -> None:
    it = _replica("llama3.1-70b", "trn2", 8)
    m = it.shape.model
    assert it.heads.extra_attention_parameters_per_rank(m, 8) == 0.0


def test_training_weights_hold_the_replicated_kv_heads() -> None:
    """Training's weights per rank (memory, optimizer state, gradient reduction) had the
    same fault: Llama 2 70B at tp 32 holds one KV head per rank, not a quarter of one."""
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.training.memory import params_per_rank

    def job(tp: int):
        return scenario_from_dict({
            "name": "t", "hardware": "trn1", "cluster": {"instances": 4},
            "jobs": [{"name": "train", "model": "llama2-70b", "global_batch": 32,
                      "micro_batch": 1, "seq_len": 4096, "recompute": "selective",
                      "parallelism": {"tp": tp, "pp": 4, "dp": 128 // (4 * tp)}}]}).jobs[0]

    wide, narrow = job(32), job(8)  # 8 KV heads: replicated 4 times at tp 32, split at 8
    m = wide.model
    share = params_per_rank(narrow, False, False) * 8 / 32
    replicated = m.layers / 4 * 2 * m.hidden * m.head_dim * (1 - 8 / 32)
    assert params_per_rank(wide, False, False) == pytest.approx(share + replicated)


def test_disaggregated_transfer_sends_one_copy_of_each_kv_head() -> None:
    """A disaggregated prefill sends one copy of the sequence's KV cache, spread over the
    replica's chips: the replicated heads are not sent once per replica."""
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving.attention import sequence_kv_bytes
    from clustersim.serving.simulate import replica_models

    s = scenario_from_dict({
        "name": "s", "hardware": "trn2", "cluster": {"instances": 4}, "duration": "10min",
        "serve": [{"name": "chat", "model": "llama3.1-70b", "parallelism": {"tp": 64},
                   "replicas": 2,
                   "disaggregated": {"prefill_replicas": 1, "decode_replicas": 1},
                   "workload": {"rate": 1.0}}]})
    cost, _, transfer_s = replica_models(s, s.serve[0])
    target = cost.target
    from clustersim.collectives.model import Group

    one_copy = sequence_kv_bytes(target.shape.model, 2, 1000) / target.chips
    assert target.kv_bytes_per_token_per_chip() * 1000 > one_copy  # what a chip holds
    import numpy as np

    hw = s.hardware
    peer = int(hw.chips_per_instance)
    expected = target.collectives.cost("send-recv", Group(np.array([0]), 1), one_copy,
                                       peer=peer).time_s
    assert transfer_s(1000) == pytest.approx(expected)


# ------------------------------------------------------------ traces that replay nothing
_HELIOS_HEADER = ("job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,"
                  "end_time,duration,queue\n")
_HELIOS_LEFT_OUT = (  # CPU-only, ended as it started, never started
    "1,u1,vc1,0,16,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,"
    "2020-06-10 04:55:09,36848,0\n"
    "2,u2,vc2,16,32,2,FAILED,2020-06-09 18:41:27,2020-06-09 18:41:27,"
    "2020-06-09 18:41:27,0,0\n"
    "3,u3,vc3,1,1,1,CANCELLED,2020-06-09 18:41:28,,,0,0\n")
_HELIOS_RUN = ("4,u4,vc4,8,16,1,COMPLETED,2020-06-09 19:00:00,2020-06-09 19:00:00,"
               "2020-06-09 20:00:00,3600,0\n")


def _helios(folder, rows: str):
    from cli_helpers import write

    (folder / "cluster_log.csv").write_text(_HELIOS_HEADER + rows, encoding="utf-8")
    return write(folder, {
        "name": "empty-trace", "hardware": "trn2", "duration": "1d",
        "cluster": {"instances": 4}, "trace": {"enabled": False},
        "workload": {"trace": "cluster_log.csv", "format": "helios",
                     "mapping": {"rule": "instances", "gpus_per_instance": 8}}})


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_trace_whose_every_row_is_left_out_is_refused(tmp_path, command: str) -> None:
    """Every row left out (CPU-only, zero-length, never started) ran an empty fleet for the
    whole duration and exited 0; now exit 2 naming the file and the counts by reason."""
    from cli_helpers import invoke, refused

    scenario = _helios(tmp_path, _HELIOS_LEFT_OUT)
    extra = ["-o", tmp_path / "out"] if command == "run" else []
    result = invoke(command, scenario, *extra)
    refused(result, "workload.trace", "cluster_log.csv", "none of its 3 rows",
            "1 never started", "1 no GPUs (CPU-only)", "1 ended as it started")
    assert not (tmp_path / "out" / "summary.json").exists()


def test_one_replayable_row_is_enough(tmp_path) -> None:
    """The same rows beside one GPU job run, and trace_rows counts what the refusal names."""
    import json

    from cli_helpers import invoke

    scenario = _helios(tmp_path, _HELIOS_LEFT_OUT + _HELIOS_RUN)
    result = invoke("run", scenario, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "out" / "summary.json").read_text("utf-8"))["trace_rows"]
    assert rows["replayed"] == 1
    assert {k: v for k, v in rows["left_out"].items() if v} == {
        "never_started": 1, "no_gpus": 1, "zero_length": 1}


# ------------------------------------------------------------ models --json of MLA models
def test_models_json_gives_an_mla_model_no_kv_heads_or_head_dim() -> None:
    """DeepSeek-V3's JSON row said kv_heads 128 (its query heads) and head_dim 56 (hidden /
    heads), neither of which the model uses: every head reads one 576-value latent. They
    are null now; the ranks are the config's, and the row still gives the same shape."""
    import json

    from cli_helpers import invoke

    from clustersim.serving.attention import kv_values_per_token_layer

    listing = {row["name"]: row for row in json.loads(invoke("models", "--json").stdout)[
        "models"]}
    v3 = listing["deepseek-v3"]
    assert v3["kv_heads"] is None and v3["head_dim"] is None
    assert {k: v3[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                               "qk_rope_head_dim", "v_head_dim")} == {
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128}
    shape = TransformerShape.model_validate(
        {k: v for k, v in v3.items() if k not in ("parameters", "active_parameters", "source")})
    preset = _model("deepseek-v3")  # (its catalog entry gives kv_heads: heads, the default)
    assert shape.model_dump(exclude={"kv_heads"}) == preset.model_dump(exclude={"kv_heads"})
    assert shape.n_kv_heads == preset.n_kv_heads
    assert shape.parameter_count() == v3["parameters"]
    assert kv_values_per_token_layer(shape) == v3["kv_lora_rank"] + v3["qk_rope_head_dim"]
    assert listing["llama3.1-70b"]["kv_heads"] == 8 and listing["llama3.1-70b"]["head_dim"] == 128
    one = json.loads(invoke("models", "deepseek-v3", "--json").stdout)
    assert one["kv_heads"] is None and one["head_dim"] is None
    table = " ".join(invoke("models").stdout.replace("│", " ").split())
    assert "128/latent" in table and "64/8" in table
