"""What the nxd-inference rows' TTFT and TPOT are made of in the model, term by term, and what
the tutorials' compiled token-generation buckets would change (docs/calibration.md, "Qwen3-32B
term by term").

The three NxD Inference rows without speculation on one trn2.48xlarge at TP 64 and batch 1:
Llama 3.3 70B (10,000 in / 1,500 out) and Llama 3.1 405B (10,000 / 1,785), fitted, and
Qwen3-32B (128 / 512), judging. Each decode token is split into the host's time per iteration
(`serving.iteration_overhead`), the two TP all-reduces a layer, the weight reads, the KV reads
(the context the row's mean decode iteration holds) and the rest (vector work, the output
layer's sampling); each prompt into the host's time, the context-encoding graph's fixed time
per layer (`serving.prefill_layer_overhead`), the layers' matmul and vector work, their
all-reduces, what overlapping them saves, the attention core and the rest (embedding, output).

Token-generation buckets. With `enable_bucketing` NxD Inference compiles token generation in
buckets too (neuronx-distributed-inference, modules/autobucketing.py generate_buckets_for_tkg:
the config's `token_generation_buckets`, else generate_buckets(128, seq_len)), and a decode
step attends over its whole bucket: the Llama 3.1 405B tutorial
sets `--token-generation-buckets 12800`; the Llama 3.3 70B tutorial compiles `--seq-len 12800`
with `--enable-bucketing`, whose generated buckets (powers of two from 128 below it, then it)
put every position from 10,000 to 11,500 in the 12,800 one; the Qwen3-32B tutorial's vLLM
(`--max-model-len 6400`, the plugin's default `enable_bucketing`) generates them up to 6,400.
The stack does not model them (catalog/stacks.yaml: no `token_buckets` for nxd-inference);
`bucket_feasibility` says what they would do to the three decode bands.
"""

from __future__ import annotations

import math

import numpy as np

from clustersim.calibration.models_serving import (
    QWEN3_TRN2,
    _iteration_model,
    _without,
    decode_breakdown,
)
from clustersim.calibration.trn2 import TRN2_SERVING, Trn2Serving, _decode_cost, predict_trn2_serving
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import HardwareSpec, catalog_entry

__all__ = ["NXD_DECODE_ROWS", "NXD_PREFILL_ROWS", "TUTORIAL_TOKEN_BUCKETS", "generated_buckets",
           "decode_terms", "prefill_terms", "bucketed_tpots", "bucket_feasibility",
           "short_prompt_trend", "report"]

# The rows without speculation that have a TPOT: the two fitted Llama rows and Qwen3-32B.
NXD_DECODE_ROWS: tuple[Trn2Serving, ...] = tuple(
    r for r in TRN2_SERVING if r.draft is None and r.tpot_ms) + (QWEN3_TRN2,)
# The same rows' prompts, and the 70B's short prompts (512 and 1,024 tokens, TTFT only).
NXD_PREFILL_ROWS: tuple[Trn2Serving, ...] = NXD_DECODE_ROWS[:1] + tuple(
    r for r in TRN2_SERVING if r.tpot_ms is None and r.input_tokens <= 1024) + \
    NXD_DECODE_ROWS[1:]


def generated_buckets(top: int) -> tuple[int, ...]:
    """NxD Inference's generated buckets up to `top` (autobucketing's generate_buckets(128,
    top)): the powers of two from 128 below round(log2(top)), then `top`."""
    return (*(2**i for i in range(7, round(math.log2(top)))), top)


# What each tutorial compiled for token generation (module docstring).
TUTORIAL_TOKEN_BUCKETS: dict[str, tuple[int, ...]] = {
    "llama3.1-70b": generated_buckets(12800),
    "llama3.1-405b": (12800,),
    "qwen3-32b": generated_buckets(6400),
}


def _hardware(hardware: HardwareSpec | None) -> HardwareSpec:
    return hardware or catalog_entry("trn2")  # trn2's default stack is nxd-inference's


def _mean_context(row: Trn2Serving) -> float:
    """The KV tokens of the row's mean decode iteration: the model's TPOT is the mean of
    n = output - 1 iterations from input + 1 tokens, each adding one (linear in context)."""
    n = row.output_tokens - 1
    return row.input_tokens + 1 + (n - 1) / 2.0


def decode_terms(hardware: HardwareSpec | None = None) -> dict[str, dict[str, float]]:
    """Each decode row's model TPOT (s) in its terms: host, collectives, weight_reads,
    kv_reads, other (the rest: vector work, the output layer, sampling) and total, the
    model's TPOT (the iteration at the mean context), with the row's published `tpot_s`."""
    hardware = _hardware(hardware)
    out = {}
    for row in NXD_DECODE_ROWS:
        it = _iteration_model(row.model, hardware, row.tp, row.precision)
        context = _mean_context(row)
        parts = decode_breakdown(it, 1, context)
        kv = it.kv_coefficient_s * context
        out[row.model] = {"host": parts["host"], "collectives": parts["collectives"],
                          "weight_reads": parts["weight_reads"], "kv_reads": kv,
                          "other": parts["compute"] - kv, "total": parts["total"],
                          "tpot_s": row.tpot_ms * 1e-3, "layers": it.shape.model.layers,
                          "context": context}
    return out


def prefill_terms(hardware: HardwareSpec | None = None) -> dict[str, dict[str, float]]:
    """Each row's model TTFT (s) in its terms: host, fixed (the context-encoding graph's
    time per layer), layer_ops (matmuls and vector work), collectives, overlap (what running
    the all-reduces beside the next tile's work saves: zero or less), attention and other
    (embedding, the output layer), and total (the prompt's bucket alone, as the row runs
    it), with the published `ttft_s`; keyed by the row's name."""
    from clustersim.serving.layers import layer_collectives_s, layer_kinds
    from clustersim.training.workload import _embedding_ops
    hardware = _hardware(hardware)
    out = {}
    for row in NXD_PREFILL_ROWS:
        it = _iteration_model(row.model, hardware, row.tp, row.precision)
        tokens = row.prefill_tokens
        ops = comm = 0.0
        for layers, layer_ops, moe in layer_kinds(it, tokens, it.activations_on_chip(tokens)):
            ops += layers * it._op_s(layer_ops)
            comm += layers * layer_collectives_s(it, tokens, moe)
        s = it.shape
        ends = it._op_s(_embedding_ops(s.model, 1, tokens, s.activation_precision))
        total = it.prefill_s(tokens)
        attention = it._prefill_attention_s(tokens, 0)
        out[row.name] = {"host": it.overhead_s, "fixed": it.prefill_fixed_s, "layer_ops": ops,
                         "collectives": comm, "overlap": it._body_s(tokens) - ends - ops - comm,
                         "attention": attention,
                         "other": ends + it._outputs_s(1), "total": total,
                         "ttft_s": row.ttft_ms * 1e-3, "tokens": tokens,
                         "layers": s.model.layers}
    return out


def bucketed_tpots(hardware: HardwareSpec | None = None,
                   rows: tuple[Trn2Serving, ...] = NXD_DECODE_ROWS) -> list[float]:
    """Each row's model TPOT (s) when its decode reads the KV cache padded to its tutorial's
    token-generation bucket (`TUTORIAL_TOKEN_BUCKETS`), as predict_trn2_serving runs it."""
    topology = build_topology(_hardware(hardware), 1)
    out = []
    for row in rows:
        cost = _decode_cost(row, topology)
        cost.token_buckets = TUTORIAL_TOKEN_BUCKETS[row.model]
        n = row.output_tokens - 1
        out.append(cost.run_s(1, row.input_tokens + 1, n / cost.tokens_per_iteration) / n)
    return out


def bucket_feasibility(hardware: HardwareSpec | None = None, llama_band: float = 0.10,
                       qwen_band: float = 0.15, steps: int = 141) -> dict[str, float]:
    """models_serving.decode_bands_feasibility with the tutorials' token-generation buckets:
    the widest margin (ms) over decode HBM efficiencies 0.30 to 1.0 by which one iteration
    overhead holds the two Llama TPOTs within `llama_band` and Qwen3-32B's within
    `qwen_band`, the efficiency and overhead there, and Qwen3-32B's TTFT error with that
    overhead (the prompt's bucket alone). Also the three TPOT errors with the buckets at the
    catalog's constants (`errors_now`)."""
    hardware = _hardware(hardware)
    rows = NXD_DECODE_ROWS
    bands = [qwen_band if r is QWEN3_TRN2 else llama_band for r in rows]
    best = {"margin_ms": -math.inf, "hbm_efficiency": math.nan, "overhead_ms": math.nan}
    for efficiency in np.linspace(0.30, 1.0, steps):
        bare = _without(hardware, iteration_overhead_s=0.0, hbm_efficiency=float(efficiency))
        predicted = [t * 1e3 for t in bucketed_tpots(bare, rows)]
        lower = max((1 - b) * r.tpot_ms - p for r, p, b in zip(rows, predicted, bands,
                                                                 strict=True))
        upper = min((1 + b) * r.tpot_ms - p for r, p, b in zip(rows, predicted, bands,
                                                                 strict=True))
        if upper - lower > best["margin_ms"]:
            best = {"margin_ms": upper - lower, "hbm_efficiency": float(efficiency),
                    "overhead_ms": (upper + lower) / 2}
    there = _without(hardware, iteration_overhead_s=best["overhead_ms"] * 1e-3,
                     hbm_efficiency=best["hbm_efficiency"])
    (ttft, _), = predict_trn2_serving(there, (QWEN3_TRN2,))
    best["qwen_ttft_error"] = ttft * 1e3 / QWEN3_TRN2.ttft_ms - 1
    best["errors_now"] = {r.model: t * 1e3 / r.tpot_ms - 1
                          for r, t in zip(rows, bucketed_tpots(hardware, rows), strict=True)}
    return best


def short_prompt_trend(hardware: HardwareSpec | None = None, tokens: int = 128
                       ) -> dict[str, float]:
    """The Llama 3.3 70B's own short prompts against Qwen3-32B's: the line through the 70B's
    published 512- and 1,024-token TTFTs (ms) taken down to `tokens` (Qwen3's bucket), the
    model's 70B TTFT there and its error against that line (`llama_error`), beside the
    model's errors on the two rows and on Qwen3-32B's TTFT (`qwen_error`)."""
    hardware = _hardware(hardware)
    short = [r for r in NXD_PREFILL_ROWS if r.tpot_ms is None]
    (a, b) = short
    slope = (b.ttft_ms - a.ttft_ms) / (b.prefill_tokens - a.prefill_tokens)
    line = a.ttft_ms + slope * (tokens - a.prefill_tokens)
    it = _iteration_model(a.model, hardware, a.tp, a.precision)
    model = it.prefill_s(tokens) * 1e3
    terms = prefill_terms(hardware)
    return {"slope_ms_per_token": slope, "intercept_ms": a.ttft_ms - slope * a.prefill_tokens,
            "line_ms": line, "llama_model_ms": model, "llama_error": model / line - 1,
            "errors": [terms[r.name]["total"] / terms[r.name]["ttft_s"] - 1 for r in short],
            "qwen_error": terms[QWEN3_TRN2.name]["total"] / terms[QWEN3_TRN2.name]["ttft_s"] - 1}


def report(hardware: HardwareSpec | None = None) -> list[str]:
    """The lines `calibrate_serving.py --family models` prints: both tables, the 70B's
    short-prompt trend and the token-generation buckets' decode window."""
    lines = ["== nxd-inference decode, TP 64, batch 1: one token at the mean context, term by "
             "term (ms)"]
    names = ("host", "collectives", "weight_reads", "kv_reads", "other", "total")
    lines.append(f"{'row':<16}{'context':>8}" + "".join(f"{n:>13}" for n in names)
                 + f"{'pub':>8}")
    for model, t in decode_terms(hardware).items():
        lines.append(f"{model:<16}{t['context']:>8.0f}"
                     + "".join(f"{t[n] * 1e3:>13.3f}" for n in names)
                     + f"{t['tpot_s'] * 1e3:>8.2f}")
    names = ("host", "fixed", "layer_ops", "collectives", "overlap", "attention", "other",
             "total")
    lines += ["", "== nxd-inference prefill, TP 64: the prompt's bucket alone, term by term (ms)",
              f"{'row':<46}{'bucket':>7}" + "".join(f"{n:>12}" for n in names) + f"{'pub':>8}"]
    for name, t in prefill_terms(hardware).items():
        lines.append(f"{name:<46}{t['tokens']:>7}" + "".join(f"{t[n] * 1e3:>12.2f}" for n in names)
                     + f"{t['ttft_s'] * 1e3:>8.1f}")
    trend = short_prompt_trend(hardware)
    lines.append(
        f"the 70B's published short prompts lie on {trend['intercept_ms']:.1f} ms + "
        f"{trend['slope_ms_per_token']:.4f} ms a token (model {trend['errors'][0]:+.1%} at 512, "
        f"{trend['errors'][1]:+.1%} at 1,024): at 128 tokens {trend['line_ms']:.1f} ms, the "
        f"model {trend['llama_model_ms']:.1f} ms ({trend['llama_error']:+.1%}); Qwen3-32B's "
        f"128 tokens {trend['qwen_error']:+.1%}")
    near = bucket_feasibility(hardware)
    now = ", ".join(f"{m} {e:+.1%}" for m, e in near["errors_now"].items())
    lines.append(
        f"with the tutorials' token-generation buckets: TPOT errors {now} at the catalog's "
        f"constants; the three decode bands' widest margin {near['margin_ms']:+.2f} ms at decode "
        f"HBM efficiency {near['hbm_efficiency']:.3f} and {near['overhead_ms']:.2f} ms an "
        f"iteration, where Qwen3-32B's TTFT is {near['qwen_ttft_error']:+.1%}")
    return lines
