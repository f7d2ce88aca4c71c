"""Head padding: a tensor-parallel degree that does not divide the attention heads pads them
as NxD does (heads up to a multiple of tp, KV heads replicated or converted), with the padded
work and weights costed in training and serving, and `step` saying so."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.runner.api import step_profiles
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.iteration import IterationModel, ReplicaShape, kv_bytes_per_token
from clustersim.serving.simulate import replica_models
from clustersim.training.memory import params_per_rank
from clustersim.training.transformer import TransformerShape, model_preset_values, sharded_heads
from clustersim.training.workload import stage_work


def _model(name: str) -> TransformerShape:
    return TransformerShape(**model_preset_values(name))


@pytest.mark.parametrize("name,tp,expected", [
    ("llama2-13b", 32, (64, 64, 2, 2)),  # multi-head: both padded to 64
    ("llama2-13b", 8, (40, 40, 5, 5)),  # divides: unchanged
    ("llama2-70b", 32, (64, 32, 2, 1)),  # 8 KV heads replicated to one per rank
    ("llama2-70b", 24, (72, 24, 3, 1)),  # 64 heads padded to 72, KV replicated
    ("llama3.1-405b", 64, (128, 64, 2, 1)),
])
def test_nxd_layout(name: str, tp: int, expected: tuple) -> None:
    layout = sharded_heads(_model(name), tp)
    assert (layout.heads, layout.kv_heads, layout.per_rank, layout.kv_per_rank) == expected


@given(heads=st.sampled_from([8, 12, 20, 24, 32, 40, 48, 56, 64, 96, 128]),
       groups=st.sampled_from([1, 2, 4, 8]), tp=st.integers(1, 128))
def test_layout_properties(heads: int, groups: int, tp: int) -> None:
    kv = max(1, heads // groups) if heads % groups == 0 else heads
    model = TransformerShape(layers=2, hidden=heads * 64, heads=heads, kv_heads=kv, vocab=100)
    layout = sharded_heads(model, tp)
    assert layout.heads >= heads and layout.heads % tp == 0 and layout.heads - heads < tp
    assert layout.per_rank * tp == layout.heads and layout.kv_per_rank * tp == layout.kv_heads
    assert layout.kv_per_rank >= 1 and layout.per_rank % layout.kv_per_rank == 0
    if heads % tp == 0 and (kv % tp == 0 or tp % kv == 0):
        assert layout.heads == heads
        assert layout.kv_per_rank == max(1, kv // tp)
    assert layout.extra_attention_parameters_per_rank(model, tp) >= 0


def _training(tp: int) -> object:
    return scenario_from_dict({
        "name": "t", "hardware": "trn1", "cluster": {"instances": 1},
        "jobs": [{"name": "train", "model": "llama2-13b", "global_batch": 32, "micro_batch": 1,
                  "seq_len": 4096, "recompute": "selective",
                  "parallelism": {"tp": tp, "pp": 1, "dp": 32 // tp}}]})


def test_training_pads_costs_and_says_so() -> None:
    padded, plain = _training(32), _training(8)  # both accepted; tp 32 used to be refused
    job = padded.jobs[0]
    work = {op.name: op for op in stage_work(job, 1, first=False, last=False).forward}
    d = job.model.head_dim
    assert work["qkv"].n == (2 + 2 * 2) * d  # 2 query and 2 KV heads per rank
    assert work["projection"].k == 2 * d
    # The weights a rank holds: its share plus the padded heads' attention weights.
    h = job.model.hidden
    share = params_per_rank(plain.jobs[0], False, False) * 8 / 32
    padded_layer = h * d * (2 * 2 + 2 * 2) - h * d * (2 * 40 + 2 * 40) / 32
    assert params_per_rank(job, False, False) == pytest.approx(
        share + job.model.layers * padded_layer)
    profile = step_profiles(padded)["train"]
    assert any("padded from 40 to 64 for tp 32" in note for note in profile.notes)
    assert not any("padded" in note for note in step_profiles(plain)["train"].notes)


def test_serving_pads_the_heads_and_their_kv_cache() -> None:
    s = scenario_from_dict({
        "name": "s", "hardware": "trn1", "cluster": {"instances": 1}, "duration": "10min",
        "serve": [{"name": "chat", "model": "llama2-13b", "parallelism": {"tp": 32},
                   "workload": {"rate": 1.0}}]})
    cost, capacity, _ = replica_models(s, s.serve[0])
    target = cost.target
    m = target.shape.model
    # Two KV heads per rank (the padded 64 over 32 ranks), two ranks per trn1 chip.
    per_rank = 2 * m.layers * 2 * m.head_dim * 2
    assert target.kv_bytes_per_token_per_chip() == pytest.approx(2 * per_rank)
    assert target.kv_bytes_per_token_per_chip() > kv_bytes_per_token(m, "bf16") / 16
    assert capacity > 0
    unpadded = IterationModel(ReplicaShape(m, "bf16", 8, 1), build_topology(
        catalog_entry("trn1"), 1))
    # Padding costs: 64 heads' attention on 32 ranks reads more weights per rank than
    # a quarter of 40 heads' on 8.
    assert target.weight_bytes_per_chip() > unpadded.weight_bytes_per_chip() / 4
