"""The serving iteration model's precisions per tensor and speculative decoding as it runs:
closed forms on the model's own pieces (weight bytes, KV bytes, all-reduce sizes, draft
steps), and the scenario keys that express them."""

from __future__ import annotations

import pytest

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.scenario.loader import ScenarioError, scenario_from_dict
from clustersim.scenario.serving import PrecisionSpec
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.serving.replica import DecodeCost
from clustersim.serving.simulate import replica_models
from clustersim.training.transformer import TransformerShape, model_preset_values


def _model(name: str) -> TransformerShape:
    return TransformerShape(**model_preset_values(name))


def _iteration(weights: str = "bf16", activations: str | None = None, kv: str = "bf16",
               tp: int = 8, name: str = "llama3.1-8b", hardware: str = "trn2"
               ) -> IterationModel:
    topology = build_topology(catalog_entry(hardware), 2)
    return IterationModel(ReplicaShape(_model(name), weights, tp, 1, kv, activations), topology)


def _all_reduce_sizes(model: IterationModel, tokens: int) -> list[float]:
    sizes: list[float] = []
    original = model.tp_all_reduce_s

    def record(size_bytes: float) -> float:
        sizes.append(size_bytes)
        return original(size_bytes)

    model.tp_all_reduce_s = record  # type: ignore[method-assign]
    model._body_s(tokens)
    return sizes


def test_fp8_keeps_bf16_all_reduces_and_halves_weight_streaming() -> None:
    bf16, w8a16, w8a8 = _iteration(), _iteration("fp8"), _iteration("fp8", "fp8")
    hidden = bf16.shape.model.hidden
    # fp8 activations are the GEMMs' quantised inputs; the hidden state the all-reduce
    # carries stays 16-bit (TensorRT-LLM's W8A8), with weight-only fp8 too.
    assert _all_reduce_sizes(bf16, 4) == _all_reduce_sizes(w8a16, 4) \
        == _all_reduce_sizes(w8a8, 4) == [4 * hidden * 2]
    assert w8a16.weight_bytes_per_chip() == pytest.approx(bf16.weight_bytes_per_chip() / 2)
    # Each weight operand streams at one byte, the token operands at two.
    from clustersim.serving.iteration import _with_weight_bytes
    from clustersim.training.workload import layer_forward_ops
    ops = {op.name: op for op in _with_weight_bytes(
        layer_forward_ops(bf16.shape.model, 1, 4, 8, False, "bf16"), 1, 2)}
    mlp = ops["mlp_in"]
    assert mlp.bytes == 2 * (mlp.m * mlp.k + mlp.m * mlp.n) + mlp.k * mlp.n
    assert ops["norm_mlp"].bytes == 2 * 2 * 4 * bf16.shape.model.hidden  # activations: bf16
    assert w8a16.decode_base_s(1) < bf16.decode_base_s(1)
    assert w8a8.decode_base_s(1) <= w8a16.decode_base_s(1)
    assert w8a16.compute_precision == "bf16" and w8a8.compute_precision == "fp8"


def test_decode_reads_the_kv_cache_at_its_own_precision() -> None:
    bf16, fp8_kv = _iteration(), _iteration(kv="fp8")
    # The keys and values stream at one byte instead of two; the scores' matmuls (a few
    # query heads per KV head, padded to the tile) bound part of it on the roofline.
    assert fp8_kv.kv_coefficient_s < 0.9 * bf16.kv_coefficient_s
    seen = []
    original = fp8_kv._op_s
    fp8_kv._op_s = lambda ops: seen.extend(ops) or original(ops)  # type: ignore[method-assign]
    fp8_kv._kv_seconds_per_token()
    m = fp8_kv.shape.model
    context = seen[0].n
    keys = [op.bytes - (op.m * op.k + op.m * op.n) * op.count for op in seen[:1]]
    assert keys[0] == pytest.approx(m.head_dim * context * 1 * seen[0].count)
    # fp8 weights leave the KV reads alone.
    assert _iteration("fp8", "fp8").kv_coefficient_s == pytest.approx(bf16.kv_coefficient_s)
    assert fp8_kv.kv_capacity_tokens() == pytest.approx(2 * bf16.kv_capacity_tokens(), rel=1e-3)


def _deployment(**extra: object) -> dict:
    serve = {"name": "chat", "model": "llama3.1-70b", "parallelism": {"tp": 64},
             "workload": {"rate": 1.0, "input_tokens": 256, "output_tokens": 64}}
    serve.update(extra)
    return {"name": "s", "duration": "10min", "hardware": "trn2", "cluster": {"instances": 1},
            "serve": [serve]}


def test_precision_keys() -> None:
    s = scenario_from_dict(_deployment(precision={"weights": "fp8", "activations": "bf16",
                                                  "kv_cache": "fp8"}))
    p = s.serve[0].precisions
    assert (p.weights, p.activations, p.kv_cache) == ("fp8", "bf16", "fp8")
    # fp8 weights alone are weight-only quantisation: bf16 activations.
    p = scenario_from_dict(_deployment(precision="fp8")).serve[0].precisions
    assert (p.weights, p.activations, p.kv_cache) == ("fp8", "bf16", "bf16")
    p = scenario_from_dict(_deployment(precision={"weights": "fp8", "activations": "fp8"},
                                       server={"kv_precision": "fp8"})).serve[0].precisions
    assert (p.weights, p.activations, p.kv_cache) == ("fp8", "fp8", "fp8")
    from clustersim.scenario.serving import resolve_precision
    assert resolve_precision("fp16", "bf16") == resolve_precision(
        PrecisionSpec(weights="fp16"), "bf16")
    assert resolve_precision("fp16", "bf16").activations == "fp16"
    with pytest.raises(ScenarioError, match="no fp16 peak") as info:
        scenario_from_dict(_deployment(precision="fp16"))
    assert "speculative" not in str(info.value)
    with pytest.raises(ScenarioError, match="disagree"):
        scenario_from_dict(_deployment(precision={"kv_cache": "fp8"},
                                       server={"kv_precision": "bf16"}))
    with pytest.raises(ScenarioError, match="speculative.tp"):
        scenario_from_dict(_deployment(speculative={"draft": "llama3.2-1b", "tp": 48}))


def test_the_draft_runs_on_its_own_shapes() -> None:
    s = scenario_from_dict(_deployment(speculative={"draft": "llama3.2-1b", "tokens": 7}))
    d = s.serve[0]
    assert d.speculative.acceptance == 0.8  # the documented default
    cost, capacity, _ = replica_models(s, d)
    draft = cost.draft
    assert draft.shape.tp == 64 and draft.shape.model.layers == 16  # the target's group
    assert draft.shape.precision == "bf16"
    # Fused: one verify pass of the target over 8 tokens per sequence, and 7 draft steps
    # of the 1B model on its own shapes, without a host overhead of their own.
    target = cost.target
    assert cost.base_s(2) == pytest.approx(target.iteration_s([], 16, 0.0)
                                           + 7 * (draft.decode_base_s(2) - draft.overhead_s))
    # its work (without the fixed host overhead both pay) is a fraction of the target's
    assert (draft.decode_base_s(2) - draft.overhead_s
            < 0.5 * (target.decode_base_s(2) - target.overhead_s))
    # Each proposal's KV is read by the draft, the context once more by the target.
    assert cost.kv_s == pytest.approx(target.kv_coefficient_s + 7 * draft.kv_coefficient_s)
    plain = scenario_from_dict(_deployment())
    plain_capacity = replica_models(plain, plain.serve[0])[1]
    assert capacity < plain_capacity
    # Its own precision and a smaller group: fp8 weights on the first 16 ranks.
    s = scenario_from_dict(_deployment(speculative={"draft": "llama3.2-1b", "tokens": 7,
                                                    "precision": "fp8", "tp": 16}))
    small = replica_models(s, s.serve[0])[0].draft
    assert (small.shape.tp, small.shape.precision) == (16, "fp8")
    assert small.weight_bytes_per_chip() < draft.weight_bytes_per_chip() * 4 / 2 * 1.01


def test_unfused_draft_steps_pay_the_host_overhead() -> None:
    hw = catalog_entry("trn2")
    hw = hw.model_copy(update={"serving": hw.serving.model_copy(
        update={"iteration_overhead_s": 1e-3})})
    topology = build_topology(hw, 2)
    target = IterationModel(ReplicaShape(_model("llama3.1-70b"), "bf16", 64, 1), topology)
    draft = IterationModel(ReplicaShape(_model("llama3.2-1b"), "bf16", 64, 1), topology)
    fused = DecodeCost(target, draft, 7, 0.8)
    separate = DecodeCost(target, draft, 7, 0.8, fused=False)
    assert separate.base_s(1) - fused.base_s(1) == pytest.approx(7e-3)
    assert fused.tokens_per_iteration == pytest.approx((1 - 0.8 ** 8) / 0.2)
    # fused, the draft's prefill is in the target's context-encoding graph: neither its host
    # overhead nor the graph's own prefill overhead is paid twice
    assert (separate.prefill_s([(512, 0)], 0, 0.0, 1) - fused.prefill_s([(512, 0)], 0, 0.0, 1)
            == pytest.approx(1e-3 + hw.serving.prefill_overhead_s))


def test_prefill_spills_activations_beyond_the_on_chip_sram() -> None:
    """Llama 2 70B at TP 32 on trn1 (24 MiB of SBUF per rank): a 1,024-token prompt's hidden
    states (16 MiB) stay on chip, a 2,048-token one's (32 MiB) go to HBM around every
    operation, so TTFT grows faster than the prompt between them (published x2.97, SDK
    2.18; the model's roofline alone gave x1.95)."""
    it = _iteration(tp=32, name="llama2-70b", hardware="trn1")
    assert it.activations_on_chip(1024) and not it.activations_on_chip(2048)
    assert it.activations_on_chip(1536) and not it.activations_on_chip(1537)
    assert it.prefill_s(2048) / it.prefill_s(1024) > 2.1
    # On chip only the weights travel from HBM; vector work costs nothing there.
    from clustersim.training.workload import layer_forward_ops
    ops = it._weights_at_precision(layer_forward_ops(it.shape.model, 1, 1024, 32, False,
                                                     "bf16"), on_chip=True)
    for op in ops:
        expected = 2 * op.k * op.n * op.count if op.name in ("qkv", "projection", "mlp_in",
                                                             "mlp_out") else 0.0
        assert op.bytes == expected, op.name
    # Without SRAM in the catalog nothing stays on chip.
    hw = catalog_entry("trn1")
    bare = hw.model_copy(update={"chip": hw.chip.model_copy(update={"sram_bytes": None})})
    plain = IterationModel(it.shape, build_topology(bare, 2))
    assert not plain.activations_on_chip(1)
    assert plain.prefill_s(1024) > it.prefill_s(1024)
    assert plain.prefill_s(2048) == pytest.approx(it.prefill_s(2048))


def test_the_trn2_speculation_check_rows() -> None:
    """The NxD tutorial's rows (clustersim.calibration.speculation): the speculative TTFT adds
    the draft's prefill of the prompt; its TPOT falls with acceptance as the tokens each
    iteration emits grow, the iteration itself unchanged."""
    from clustersim.calibration.speculation import TRN2_SPECULATION, predict_speculation
    plain, spec = predict_speculation(acceptance=0.8)
    assert [m.run for m in TRN2_SPECULATION] == ["no speculation", "fused speculation"]
    topology = build_topology(catalog_entry("trn2"), 1)
    draft = IterationModel(ReplicaShape(_model("llama3.2-1b"), "bf16", 64, 1), topology)
    fused_once = draft.overhead_s + draft.hardware.serving.prefill_overhead_s  # one graph
    assert spec[0] - plain[0] == pytest.approx(draft.prefill_s(12_288) - fused_once)
    tpots = [predict_speculation(acceptance=a)[1][1] for a in (0.6, 0.8, 0.95)]
    assert tpots[0] > tpots[1] > tpots[2]
    emitted = [(1 - a ** 8) / (1 - a) for a in (0.6, 0.95)]
    assert tpots[0] / tpots[2] == pytest.approx(emitted[1] / emitted[0], rel=0.02)


def test_fp8_activations_need_fp8_weights() -> None:
    """A matmul of fp8 tokens by bf16 weights runs at bf16: {weights: bf16, activations:
    fp8} would be costed at the fp8 peak (prefill about 45% faster than bf16). Refused, for
    the target and the draft alike, with the key path."""
    with pytest.raises(ScenarioError, match="serve.0.precision") as info:
        scenario_from_dict(_deployment(precision={"weights": "bf16", "activations": "fp8"}))
    assert "serve.0.precision.activations" in str(info.value)
    assert "or weights: fp8 for fp8 matmuls" in str(info.value)
    with pytest.raises(ScenarioError, match="serve.0.speculative.precision"):
        scenario_from_dict(_deployment(speculative={"draft": "llama3.2-1b", "precision": {
            "weights": "fp16", "activations": "fp8"}}))


@pytest.mark.parametrize("hardware,model,tp,ep,drift", [
    ("trn2", "llama3.3-70b", 64, 1, 0.0),
    ("trn2", "llama3.1-8b", 16, 1, 0.0025),
    ("trn2", "llama3.1-8b", 4, 1, 0.0025),
    ("trn2", "qwen3-30b-a3b", 8, 1, 0.0025),
    ("trn2", "deepseek-v3", 64, 1, 0.025),
    # (found by harden16: the bound above was said to hold for all but DeepSeek-V3)
    ("trn2", "llama3.1-70b", 16, 1, 0.026),
    ("trn2", "llama3.1-70b", 8, 1, 0.0035),
    ("trn2", "qwen3-235b-a22b", 64, 8, 0.023),
    ("trn2", "llama3.1-405b", 64, 1, 0.02),
    ("trn2", "qwen3-32b", 16, 1, 0.015),
    ("trn2", "llama4-scout", 16, 16, 0.013)])
def test_a_longer_prompt_costs_less_by_a_bounded_drift(hardware: str, model: str, tp: int,
                                                       ep: int, drift: float) -> None:
    """With the all-reduces pipelined under the matrix work over the tokens' 128-row tiles,
    the tiles are counted as a fraction (docs/scenario.md, `overlap_collectives`): rounded
    up, a 129-token prompt got a second tile's overlap and cost 2.1% (70B) to 4.0%
    (DeepSeek-V3) less than a 128-token one. What is left (docs/serving.md, "Left out"): the
    hidden share of the collectives' fixed time grows with the tiles, so a longer prompt
    can cost up to 2.6% less than a shorter one between 129 and about 512 tokens, where the
    collectives' fixed time is large beside the matrix work (Llama 3.1 70B at TP 16, and
    DeepSeek-V3's MLA all-gathers at TP 64), under 0.35% where it is small."""
    hw = catalog_entry(hardware)
    replica = IterationModel(ReplicaShape(_model(model), "bf16", tp, 1, "bf16", "bf16", ep),
                             build_topology(hw, 1))
    assert hw.serving.overlap_collectives
    costs = [replica.prefill_s(n) for n in range(1, 1025)]
    longest_so_far = 0.0
    for tokens, cost in enumerate(costs, start=1):
        assert cost >= longest_so_far * (1 - drift) - 1e-15, tokens
        longest_so_far = max(longest_so_far, cost)
    assert costs[128] >= costs[127]  # 129 tokens against 128


@pytest.mark.parametrize("model,tp,drift", [("llama3.3-70b", 64, 0.0),
                                            ("llama3.1-8b", 16, 0.0025),
                                            ("llama3.1-8b", 4, 0.0085),
                                            ("qwen3-30b-a3b", 8, 0.0035),
                                            ("deepseek-v3", 64, 0.035)])
def test_a_larger_decode_batch_costs_less_by_a_bounded_drift(model: str, tp: int,
                                                             drift: float) -> None:
    """The decode iteration's overlapped all-reduces are tiled over the batch's tokens as
    the prompt's are (docs/serving.md, "Left out"): past 128 sequences a larger batch can
    cost up to 0.75% less than a smaller one (Llama 3.1 8B at TP 4, batch 256), 3.2% for
    DeepSeek-V3 at TP 64 (batch 512 against its most costly smaller batch)."""
    hw = catalog_entry("trn2")
    replica = IterationModel(ReplicaShape(_model(model), "bf16", tp, 1, "bf16", "bf16"),
                             build_topology(hw, 1))
    costliest = 0.0
    for batch in range(1, 513):
        cost = replica.decode_base_s(batch)
        assert cost >= costliest * (1 - drift) - 1e-15, batch
        costliest = max(costliest, cost)
