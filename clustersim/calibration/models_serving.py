"""Published serving runs of 2025's models (mixtures, MLA, Qwen3) on Trn2 and H200.

Trn2 (one trn2.48xlarge, LNC 2, TP 64, bf16):
- DeepSeek-V3-0324, the port in NxD Inference's contrib models (README at be9c97e,
  2026-04-03; SDK 2.28, bf16 dequantised from FP8, seq_len 512 without bucketing, batch 1,
  256 in / 256 out), run by the port's own script: TPOT p50 20.5 ms, TTFT 1,667 ms, and its
  profile of one token (about 19 ms): compute about 12 ms, TP 64 collectives about 3 ms,
  weight reads about 3 ms (straggler synchronisation about 1 ms). The prompt runs in the
  512-token context graph, whose MoE layers run every expert over every token (NxD's
  forward_all_experts). Stack nxd-inference-contrib (catalog/stacks.yaml). FITTED, three
  closed forms in order: the stack's iteration overhead (the TPOT less the profiled token),
  trn2's `serving.moe_layer_overhead` (the TPOT), the stack's expert invocation overhead
  (the TTFT). The profile's parts judge.
- The same port through vLLM (about 200 in / 200 out): inter-token latency at batch 1, 2, 4
  and 8: 22.2, 30.5, 37.1 and 47.6 ms, TTFT about 1.7 s at every batch. They judge how the
  decode grows with the batch (the experts its tokens reach) and how the every-expert
  prefill grows with the tokens, on the port's stack with vLLM's published host gap
  (nxd-inference-contrib-vllm: nothing fitted on them).
- Qwen3-32B, NxD Inference tutorial "sd-inference-tutorial" (SDK 2.26.1, vLLM, TP 64,
  max-num-seqs 1; LLMPerf, 10 requests of 128 in / 512 out, one at a time; p99 kept):
  TTFT 48.3 ms, end-to-end 6,044.9 ms, 102.3 output tokens/s per request over 558 output
  tokens. The tutorial runs LLMPerf unpatched, so its token counts are the Llama 2
  tokenizer's (LLMPerf's default), not Qwen3's: the server generated the request's
  max_tokens, 512 Qwen3 tokens, which LLMPerf counted as 558 (the 70B tutorial patches
  LLMPerf to count with the model's tokenizer: its 1,501 is the model's). The time per
  output token is therefore the end-to-end less the TTFT over the 511 tokens after the
  first: 11.74 ms (102.3 tokens/s would be 9.78 ms a Llama 2 token). Judges, on the
  nxd-inference stack's constants (fitted on the Llama 3.3 70B and 3.1 405B rows of SDK
  2.29): nothing is fitted on it.

H200 (judge; the GPU constants are the TensorRT-LLM fit's, calibration.gpu_serving):
- DeepSeek-V3, SGLang v0.4.1.post2 release notes (sgl-project/sglang pull request 2643,
  2024-12-29; FP8, TP 8, CUDA graphs, 128 in / 256 out): 30.29 output tokens/s at batch 1,
  206.32 at batch 8, 760.52 at batch 32. The run names no GPU: it is an 8-GPU node holding
  the 671B FP8 checkpoint (about 690 GB with its KV cache), which an 8 x H100 (640 GB) cannot
  hold; SGLang's DeepSeek-V3 support was developed on H200 nodes (its benchmark README's
  thanks to DataCrunch, whose H200 blog ran it). Read as 8 x H200 (p5en).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from clustersim.calibration.trn2 import Trn2Serving, predict_trn2_serving
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import HardwareSpec, catalog_entry

__all__ = ["DEEPSEEK_TRN2", "QWEN3_TRN2", "QWEN3_E2E_MS", "DEEPSEEK_VLLM_BATCHES", "DEEPSEEK_PROFILE_MS",
           "SGLANG_H200", "BatchRow", "predict_batches", "decode_breakdown",
           "deepseek_breakdown", "trn2_against_h200", "fit_moe_layer_overhead",
           "CONTRIB_STACK", "VLLM_STACK", "PROFILED_TOKEN_MS", "contrib_hardware",
           "fit_contrib_iteration_overhead", "fit_expert_invocation_overhead", "VLLM_TTFT_MS",
           "fit_moe_expert_load_overhead", "fixed_time_left", "decode_bands_feasibility"]

_PORT = ("NxD Inference contrib models, DeepSeek-V3 port README (be9c97e, 2026-04-03; "
         "SDK 2.28)")
_QWEN = "Neuron docs, NxD Inference tutorial sd-inference-tutorial, Qwen3-32B (SDK 2.26.1)"
_SGLANG = "sgl-project/sglang pull request 2643 (v0.4.1.post2 release notes, 2024-12-29)"

CONTRIB_STACK = "nxd-inference-contrib"  # the port's own script (catalog/stacks.yaml)
VLLM_STACK = "nxd-inference-contrib-vllm"  # the port through vLLM: its host gap added
# Fitted: its TPOT (the stack's iteration overhead with the profiled token; then
# serving.moe_layer_overhead), its TTFT (the stack's expert invocation overhead).
DEEPSEEK_TRN2 = Trn2Serving("deepseek-v3 256/256 (NxD Inference port)", "deepseek-v3", 256,
                            256, 512, 1667.0, 20.5, source=_PORT)
# Judges.
# LLMPerf's p99 end-to-end and TTFT, in Qwen3 tokens (above)
QWEN3_E2E_MS = 6044.886132028841
QWEN3_TRN2 = Trn2Serving("qwen3-32b 128/512 (NxD Inference tutorial)", "qwen3-32b", 128, 512,
                         128, 48.3, (QWEN3_E2E_MS - 48.28366368776187) / 511, source=_QWEN)
# The port's profile of one decode token (ms): what the model's parts are compared with.
DEEPSEEK_PROFILE_MS = {"compute": 12.0, "collectives": 3.0, "weight_reads": 3.0}
PROFILED_TOKEN_MS = 19.0  # the profile's whole token (with about 1 ms of straggler waits)


@dataclass(frozen=True)
class BatchRow:
    """A batch of identical requests decoding together: its time per output token."""

    name: str
    model: str
    hardware: str
    tp: int
    precision: str
    batch: int
    input_tokens: int
    output_tokens: int
    tpot_ms: float
    source: str
    activations: str | None = None  # fp8: W8A8 matmuls (the GPU stacks' FP8 checkpoints)
    stack: str | None = None  # serving stack (catalog/stacks.yaml); None: the hardware's


DEEPSEEK_VLLM_BATCHES: tuple[BatchRow, ...] = tuple(
    BatchRow(f"deepseek-v3 vLLM batch {b}", "deepseek-v3", "trn2", 64, "bf16", b, 200, 200,
             ms, _PORT + ", through vLLM", stack=VLLM_STACK)
    for b, ms in ((1, 22.2), (2, 30.5), (4, 37.1), (8, 47.6)))

VLLM_TTFT_MS = 1700.0  # "about 1.7 s at every batch" (judges, to its rounding)

SGLANG_STACK = "sglang@0.4.1"
# Output tokens/s of the batch -> ms per token of each sequence: batch / rate.
SGLANG_H200: tuple[BatchRow, ...] = tuple(
    BatchRow(f"deepseek-v3 SGLang batch {b}", "deepseek-v3", "p5en", 8, "fp8", b, 128, 256,
             1000.0 * b / rate, _SGLANG, "fp8", SGLANG_STACK)
    for b, rate in ((1, 30.29), (8, 206.32), (32, 760.52)))


def _iteration_model(model: str, hardware: HardwareSpec, tp: int, precision: str,
                     activations: str | None = None):
    from clustersim.serving.iteration import IterationModel, ReplicaShape
    from clustersim.training.transformer import TransformerShape, model_preset_values
    shape = TransformerShape(**model_preset_values(model))
    return IterationModel(ReplicaShape(shape, precision, tp, 1, "bf16", activations),
                          build_topology(hardware, 1))


def predict_batches(rows: tuple[BatchRow, ...], hardware: dict[str, HardwareSpec] | None = None
                    ) -> list[float]:
    """Model TPOT (s) of each batch row: the mean decode iteration while its context grows
    from the prompt over the output."""
    from clustersim.serving.replica import DecodeCost
    out = []
    models: dict[tuple, object] = {}
    from clustersim.hardware.stacks import stack_named, with_stack
    for row in rows:
        hw = (hardware or {}).get(row.hardware) or with_stack(
            catalog_entry(row.hardware), stack_named(row.stack) if row.stack else None)
        key = (row.model, row.hardware, row.tp, row.precision, row.activations, row.stack)
        if key not in models:
            models[key] = _iteration_model(row.model, hw, row.tp, row.precision,
                                           row.activations)
        cost = DecodeCost(models[key])
        n = row.output_tokens - 1
        out.append(cost.run_s(row.batch, row.batch * (row.input_tokens + 1), n) / n)
    return out


_WEIGHT_OPS = ("qkv", "projection", "mlp_in", "mlp_out", "router", "logits", "expert_in",
               "expert_out")


def decode_breakdown(it, batch: int = 1, context: float = 0.0) -> dict[str, float]:
    """One decode iteration of `batch` sequences holding `context` KV tokens, in the parts
    a profile shows (s): the TP (and expert-parallel) collectives, the weight reads (each
    weight operand's bytes at the serving HBM bandwidth of a rank), the host's time between
    iterations (`serving.iteration_overhead`: outside a device profile) and the rest,
    compute (matmul and vector work, the KV reads, the device's fixed times)."""
    from clustersim.serving.layers import layer_collectives_s, layer_kinds
    from clustersim.training.workload import _output_ops
    total = it.iteration_s([], batch, context)
    hw = it.steps.topology.hardware
    bandwidth = hw.chip.hbm_bandwidth_bytes_per_s / hw.chip.ranks * hw.chip.efficiency.vector
    collectives = weights = 0.0
    for layers, ops, moe in layer_kinds(it, batch, it.activations_on_chip(batch)):
        collectives += layers * layer_collectives_s(it, batch, moe)
        weights += layers * sum(_weight_bytes(op, it) for op in ops) / bandwidth
    s = it.shape
    out = _output_ops(s.model, 1, batch, s.tp, s.activation_precision)
    weights += sum(_weight_bytes(op, it) for op in out) / bandwidth
    host = it.overhead_s
    return {"total": total, "host": host, "collectives": collectives, "weight_reads": weights,
            "compute": total - host - collectives - weights}


def _weight_bytes(op, it) -> float:
    if op.name not in _WEIGHT_OPS:
        return 0.0
    if op.name.startswith("expert_"):  # the reached experts' (fractional) weights
        return op.flops / (2.0 * op.m) * it.element_bytes
    return op.count * op.k * op.n * it.element_bytes


def deepseek_breakdown(hardware: HardwareSpec | None = None) -> dict[str, float]:
    """The model's parts of one DeepSeek-V3 decode token on trn2 at TP 64 (the port's row:
    batch 1, a mid-output context), on the port's stack."""
    hardware = contrib_hardware(hardware)
    it = _iteration_model("deepseek-v3", hardware, 64, "bf16")
    row = DEEPSEEK_TRN2
    return decode_breakdown(it, 1, row.input_tokens + row.output_tokens / 2)


def contrib_hardware(hardware: HardwareSpec | None = None) -> HardwareSpec:
    """trn2 (or `hardware`) with the port's stack's constants over its own."""
    from clustersim.hardware.stacks import stack_named, with_stack
    return with_stack(hardware or catalog_entry("trn2"), stack_named(CONTRIB_STACK))


def predict_trn2_rows(hardware: HardwareSpec | None = None):
    """(TTFT s, TPOT s) of the DeepSeek-V3 row (the port's stack) and the Qwen3-32B row
    (NxD Inference's) on one trn2.48xlarge, by the cost formulas."""
    hardware = hardware or catalog_entry("trn2")
    return predict_trn2_serving(contrib_hardware(hardware), (DEEPSEEK_TRN2,)) + \
        predict_trn2_serving(hardware, (QWEN3_TRN2,))


def trn2_against_h200(batches: tuple[int, ...] = (1, 8)) -> list[dict[str, float]]:
    """DeepSeek-V3, 128 in / 256 out, `batch` requests decoding together: one trn2.48xlarge
    (TP 64, bf16 weights, the contrib port through vLLM) against one 8 x H200 p5en.48xlarge (TP
    8, FP8 W8A8, SGLang's MoE constant): each side's TPOT, their ratio (Trn2 over H200:
    below 1, Trn2 is faster) and the ratio of costs per output token (on-demand prices).
    The band: each side's error on a judged row (Trn2: the vLLM batch 4, its batches 1 and 8
    being fitted; H200: batch 8, its batch 1 fitted), applied as published / model:
    [ratio, corrected] ordered."""
    judged = {"trn2": DEEPSEEK_VLLM_BATCHES[2], "p5en": SGLANG_H200[1]}
    errors = {k: r.tpot_ms * 1e-3 / p for (k, r), p in zip(
        judged.items(), predict_batches(tuple(judged.values())), strict=True)}
    correction = errors["trn2"] / errors["p5en"]
    prices = catalog_entry("trn2").instance.price_per_hour_usd / \
        catalog_entry("p5en").instance.price_per_hour_usd
    out = []
    for batch in batches:
        rows = (BatchRow("trn2", "deepseek-v3", "trn2", 64, "bf16", batch, 128, 256, 0.0, "",
                         stack=VLLM_STACK),
                dataclasses.replace(SGLANG_H200[0], batch=batch))
        trn2, h200 = predict_batches(rows)
        ratio = trn2 / h200
        low, high = sorted((ratio, ratio * correction))
        out.append({"batch": batch, "trn2_tpot_s": trn2, "h200_tpot_s": h200, "ratio": ratio,
                    "low": low, "high": high, "cost_ratio": ratio * prices,
                    "cost_low": low * prices, "cost_high": high * prices})
    return out


def _without(hardware: HardwareSpec, **zero: float) -> HardwareSpec:
    return hardware.model_copy(update={"serving": hardware.serving.model_copy(update=zero)})


def fit_contrib_iteration_overhead() -> float:
    """The port's stack's `iteration_overhead` (s): the host's time per token, the TPOT p50
    less the device's profiled token (both the port's README)."""
    return (DEEPSEEK_TRN2.tpot_ms - PROFILED_TOKEN_MS) * 1e-3


def _trn2_moe_equations() -> tuple[float, float]:
    """What the trn2 MoE constants must add to a token (s) at batch 1 (the port's TPOT, its
    own stack) and at batch 8 (its vLLM row, the vLLM stack): published less the model's
    without them."""
    from clustersim.hardware.stacks import stack_named, with_stack
    zero = {"moe_layer_overhead_s": 0.0, "moe_expert_load_overhead_s": 0.0}
    trn2 = _without(catalog_entry("trn2"), **zero)
    (_, one), = predict_trn2_serving(contrib_hardware(trn2), (DEEPSEEK_TRN2,))
    row = DEEPSEEK_VLLM_BATCHES[-1]
    eight, = predict_batches((row,), {"trn2": with_stack(trn2, stack_named(row.stack))})
    return DEEPSEEK_TRN2.tpot_ms * 1e-3 - one, row.tpot_ms * 1e-3 - eight


def fit_moe_expert_load_overhead() -> float:
    """trn2's `serving.moe_expert_load_overhead` (s): NxD's selective loading loads each
    token's top-k experts by itself, so a MoE layer's fixed time is a + b x loads (8 at
    batch 1, 64 at batch 8); the port's batch-1 TPOT and its vLLM batch-8 row give the two
    (closed form: 58 MoE layers x 56 more loads)."""
    from clustersim.training.transformer import TransformerShape, model_preset_values
    m = TransformerShape(**model_preset_values("deepseek-v3"))
    one, eight = _trn2_moe_equations()
    batch = DEEPSEEK_VLLM_BATCHES[-1].batch
    return (eight - one) / (m.moe_layers * m.top_k * (batch - 1))


def fit_moe_layer_overhead(family: str) -> float:
    """`serving.moe_layer_overhead` (s) from a batch-1 DeepSeek-V3 row (trn2: the NxD
    Inference port's TPOT on its stack, less its 8 expert loads' `fit_moe_expert_load_overhead`;
    p5en: SGLang's on 8 x H200, the sglang stack's): a fixed time per MoE layer of an
    iteration adds moe_layers x it to each decode iteration, so the constant is the
    published TPOT less the model's without it, over the MoE layers (closed form)."""
    from clustersim.hardware.stacks import stack_named, with_stack
    from clustersim.training.transformer import TransformerShape, model_preset_values
    moe_layers = TransformerShape(**model_preset_values("deepseek-v3")).moe_layers
    if family == "trn2":
        one, _ = _trn2_moe_equations()
        top_k = TransformerShape(**model_preset_values("deepseek-v3")).top_k
        return one / moe_layers - top_k * fit_moe_expert_load_overhead()
    hardware = with_stack(catalog_entry(family), stack_named(SGLANG_STACK))
    bare = _without(hardware, moe_layer_overhead_s=0.0)
    model, = predict_batches(SGLANG_H200[:1], {SGLANG_H200[0].hardware: bare})
    return (SGLANG_H200[0].tpot_ms * 1e-3 - model) / moe_layers


def fit_expert_invocation_overhead() -> float:
    """The port's stack's `expert_invocation_overhead` (s): its TTFT less the model's
    without it (every expert over the 512-token context graph: the FLOPs, every expert's
    weights and partial outputs through HBM), over the experts its MoE layers run (closed
    form: the constant adds moe_layers x experts to a context-encoding iteration)."""
    from clustersim.training.transformer import TransformerShape, model_preset_values
    bare = _without(contrib_hardware(), expert_invocation_overhead_s=0.0)
    (model, _), = predict_trn2_serving(bare, (DEEPSEEK_TRN2,))
    m = TransformerShape(**model_preset_values("deepseek-v3"))
    return (DEEPSEEK_TRN2.ttft_ms * 1e-3 - model) / (m.moe_layers * m.experts)


def fixed_time_left(hardware: HardwareSpec | None = None) -> dict[str, dict[str, float]]:
    """Why Qwen3-32B's row stays judged (docs/calibration.md): the fixed time per decode
    iteration each nxd-inference row without speculation leaves, its published TPOT less
    the model's without `iteration_overhead` (one token an iteration), for the Llama 3.3 70B
    and 3.1 405B rows (fitted: SDK 2.29, p50, 10,000-token prompts) and Qwen3-32B's
    (judging: SDK 2.26.1, p99, 128-token prompt); all three at TP 64 and batch 1.

    `left_ms` at the catalog's decode HBM efficiency; `even_ms` at the efficiency where the
    two Llama rows leave the same time (`even_hbm_efficiency`): below it the 405B (126
    layers, 1.6 times the 70B's KV a token, the same context) leaves less than the 70B (80
    layers), so a fixed time growing with layers or context would need a negative slope;
    `slope_us_per_layer`: the Llama rows' difference over their layers at the catalog's."""
    from clustersim.calibration.trn2 import TRN2_SERVING
    from clustersim.training.transformer import model_preset_values
    hardware = hardware or catalog_entry("trn2")
    rows = tuple(r for r in TRN2_SERVING if r.draft is None and r.tpot_ms) + (QWEN3_TRN2,)
    names = ("llama3.3-70b", "llama3.1-405b", "qwen3-32b")

    def left(efficiency: float) -> list[float]:
        bare = _without(hardware, iteration_overhead_s=0.0, hbm_efficiency=efficiency)
        return [r.tpot_ms - tpot * 1e3 for r, (_, tpot) in zip(
            rows, predict_trn2_serving(bare, rows), strict=True)]

    low, high = 0.3, 2.0  # the 70B's minus the 405B's falls as the efficiency rises
    for _ in range(40):
        mid = (low + high) / 2
        a, b, _ = left(mid)
        low, high = (mid, high) if a > b else (low, mid)
    even = (low + high) / 2
    at_catalog, at_even = left(hardware.serving.hbm_efficiency), left(even)
    layers = [model_preset_values(r.model)["layers"] for r in rows]
    out: dict[str, dict[str, float]] = {}
    for name, row, lay, now, flat in zip(names, rows, layers, at_catalog, at_even,
                                         strict=True):
        out[name] = {"left_ms": now, "even_ms": flat, "layers": lay,
                     "per_layer_us": now / lay * 1e3, "input_tokens": row.input_tokens}
    out["fit"] = {"even_hbm_efficiency": even, "hbm_efficiency": hardware.serving.hbm_efficiency,
                  "slope_us_per_layer": (at_catalog[1] - at_catalog[0]) / (layers[1] - layers[0])
                  * 1e3,
                  "iteration_overhead_ms": hardware.serving.iteration_overhead_s * 1e3}
    return out


def decode_bands_feasibility(hardware: HardwareSpec | None = None, llama_band: float = 0.10,
                             qwen_band: float = 0.15, steps: int = 141
                             ) -> dict[str, float]:
    """Whether any decode HBM efficiency (0.30 to 1.0) and iteration overhead put the two
    Llama TPOTs within `llama_band` (issue 32's 10%) and Qwen3-32B's within `qwen_band`
    (issue 31's 15%) at once: each row's model TPOT is its published TPOT less the time it
    leaves plus the overhead, so at each efficiency every row bounds the overhead from
    below and above. `margin_ms`: the widest (smallest upper less largest lower) over the
    efficiencies scanned, at `hbm_efficiency`; negative: no pair holds all three."""
    from clustersim.calibration.trn2 import TRN2_SERVING
    hardware = hardware or catalog_entry("trn2")
    rows = tuple(r for r in TRN2_SERVING if r.draft is None and r.tpot_ms) + (QWEN3_TRN2,)
    bands = (llama_band, llama_band, qwen_band)
    best = {"margin_ms": -math.inf, "hbm_efficiency": math.nan, "overhead_ms": math.nan}
    for efficiency in np.linspace(0.30, 1.0, steps):
        bare = _without(hardware, iteration_overhead_s=0.0, hbm_efficiency=float(efficiency))
        predicted = [tpot * 1e3 for _, tpot in predict_trn2_serving(bare, rows)]
        lower = max((1 - band) * r.tpot_ms - p for r, p, band in zip(rows, predicted, bands,
                                                                       strict=True))
        upper = min((1 + band) * r.tpot_ms - p for r, p, band in zip(rows, predicted, bands,
                                                                       strict=True))
        if upper - lower > best["margin_ms"]:
            best = {"margin_ms": upper - lower, "hbm_efficiency": float(efficiency),
                    "overhead_ms": (upper + lower) / 2}
    return best
