"""Fidelity of the serving model on 2025's models (clustersim/calibration/models_serving.py):
the figures docs/calibration.md and docs/serving.md quote, and issue 31's bands.

Fitted: on the DeepSeek-V3 port's row (stack nxd-inference-contrib), its host time (TPOT
less the profiled token), trn2's serving.moe_layer_overhead (TPOT) and the stack's expert
invocation overhead (TTFT); the sglang@0.4.1 stack's moe_layer_overhead on SGLang's batch-1
TPOT on 8 x H200. Everything else judges.
"""

from __future__ import annotations

import pytest

from clustersim.calibration import models_serving as ms
from clustersim.hardware.catalog import catalog_entry


@pytest.fixture(scope="module")
def trn2_rows():
    (ds_ttft, ds_tpot), (q_ttft, q_tpot) = ms.predict_trn2_rows()
    return {"ds_ttft": ds_ttft * 1e3 / ms.DEEPSEEK_TRN2.ttft_ms - 1,
            "ds_tpot": ds_tpot * 1e3 / ms.DEEPSEEK_TRN2.tpot_ms - 1,
            "q_ttft": q_ttft * 1e3 / ms.QWEN3_TRN2.ttft_ms - 1,
            "q_tpot": q_tpot * 1e3 / ms.QWEN3_TRN2.tpot_ms - 1}


def test_catalog_reproduces_its_moe_fits():
    """Every mixture constant is what its closed form (`calibrate_serving.py --fit-moe`)
    prints from the catalog's earlier ones: the port's stack's host time and expert
    invocation overhead, trn2's moe_layer_overhead and moe_expert_load_overhead (the port's
    batch 1 and its vLLM batch 8), the sglang stack's moe_layer_overhead."""
    from clustersim.hardware.stacks import stack_named, with_stack
    contrib = ms.contrib_hardware()
    assert contrib.serving.iteration_overhead_s == pytest.approx(
        ms.fit_contrib_iteration_overhead(), rel=1e-4)
    assert catalog_entry("trn2").serving.moe_layer_overhead_s == pytest.approx(
        ms.fit_moe_layer_overhead("trn2"), rel=1e-4)
    assert catalog_entry("trn2").serving.moe_expert_load_overhead_s == pytest.approx(
        ms.fit_moe_expert_load_overhead(), rel=1e-4)
    assert catalog_entry("trn2").serving.moe_decode_loads == "per-token"
    assert contrib.serving.expert_invocation_overhead_s == pytest.approx(
        ms.fit_expert_invocation_overhead(), rel=1e-4)
    assert contrib.serving.moe_prefill == "every-expert"
    sglang = with_stack(catalog_entry("p5en"), stack_named(ms.SGLANG_STACK))
    assert sglang.serving.moe_layer_overhead_s == pytest.approx(
        ms.fit_moe_layer_overhead("p5en"), rel=1e-4)
    # families and stacks without mixture rows keep none (TensorRT-LLM on p5en: none)
    assert catalog_entry("trn1").serving.moe_layer_overhead_s == 0.0
    assert catalog_entry("p5en").serving.moe_layer_overhead_s == 0.0
    # NxD Inference through vLLM keeps the routed prefill
    assert catalog_entry("trn2").serving.moe_prefill == "routed"


def test_deepseek_v3_within_the_bands_and_its_profile(trn2_rows):
    """DeepSeek-V3 at TP 64 on trn2, the port's stack: TPOT within 15% and TTFT within 20%
    (both fitted: +0.0%); the one-token profile's parts within 30% (judging): compute 13.67
    ms against about 12 (+13.9%), TP collectives 2.76 against about 3 (-8.0%), weight reads
    2.57 against about 3 (-14.2%), the host's 1.50 ms outside the profile."""
    assert abs(trn2_rows["ds_tpot"]) < 0.15 and abs(trn2_rows["ds_ttft"]) < 0.20
    assert abs(trn2_rows["ds_tpot"]) < 1e-3 and abs(trn2_rows["ds_ttft"]) < 1e-3  # fitted
    parts = ms.deepseek_breakdown()
    figures = {name: parts[name] * 1e3 for name in ("compute", "collectives", "weight_reads",
                                                    "host")}
    assert figures == pytest.approx({"compute": 13.67, "collectives": 2.76,
                                     "weight_reads": 2.57, "host": 1.50}, abs=0.01)
    for name, published in ms.DEEPSEEK_PROFILE_MS.items():
        assert abs(parts[name] * 1e3 / published - 1) < 0.30, name
    # the parts and the host make the token
    assert sum(figures.values()) == pytest.approx(parts["total"] * 1e3)


def test_mla_compressions_are_all_gathered_at_tp_64():
    """The collectives of a DeepSeek-V3 decode token at TP 64: two all-reduces of the hidden
    state per layer and, MLA's compressions being split over the ranks, two all-gathers
    (the query's 1,536 and the latent's 512 + 64) per layer."""
    from clustersim.serving.attention import compressed_widths
    from clustersim.serving.layers import layer_collectives_s
    it = ms._iteration_model("deepseek-v3", ms.contrib_hardware(), 64, "bf16")
    assert compressed_widths(it.shape.model) == (1536, 576)
    cost = it.tp_collectives.cost
    expected = 2 * it.tp_all_reduce_s(7168 * 2) + sum(
        cost("all-gather", it.tp_group, w * 2).time_s for w in (1536, 576))
    assert layer_collectives_s(it, 1, True) == pytest.approx(expected)
    assert ms.deepseek_breakdown()["collectives"] == pytest.approx(61 * expected)


@pytest.mark.xfail(strict=True, reason="not met: Qwen3-32B TTFT 58.5 ms against 48.3 (+21.2%) "
                   "on the nxd-inference stack's constants (the Llama rows' fit)")
def test_qwen3_32b_ttft_within_15_percent(trn2_rows):
    assert abs(trn2_rows["q_ttft"]) < 0.15


@pytest.mark.xfail(strict=True, reason="not met: Qwen3-32B TPOT 13.89 ms against 11.74 "
                   "(+18.4%): nxd-inference's 10.03 ms iteration overhead is the Llama rows' fit")
def test_qwen3_32b_tpot_within_15_percent(trn2_rows):
    assert abs(trn2_rows["q_tpot"]) < 0.15


def test_errors_as_docs_report_them(trn2_rows):
    """The rows' errors as reported: Qwen3-32B TTFT +21.2% and TPOT +18.4%; the port
    through vLLM at batch 1, 2, 4 (judging) and 8 (fitted): TPOT -5.8%, -17.9%, -12.2%,
    -0.0%; 8 x H200 through SGLang at batch 8 and 32: -1.7%, +11.2%."""
    assert trn2_rows["q_ttft"] == pytest.approx(0.212, abs=0.002)
    assert trn2_rows["q_tpot"] == pytest.approx(0.184, abs=0.002)
    rows = ms.DEEPSEEK_VLLM_BATCHES + ms.SGLANG_H200[1:]
    errors = [p * 1e3 / r.tpot_ms - 1 for r, p in zip(rows, ms.predict_batches(rows),
                                                        strict=True)]
    assert errors == pytest.approx([-0.058, -0.179, -0.122, 0.0, -0.017, 0.112], abs=0.002)


def test_trn2_against_h200_answer():
    """DeepSeek-V3, 128 in / 256 out: Trn2 (TP 64, bf16, the port through vLLM) over 8 x
    H200 (TP 8, FP8) per output token: 0.63 at batch 1 (band [0.63, 0.71]) and 1.25 at batch
    8 ([1.25, 1.40]); per dollar, 0.36 ([0.36, 0.40]) and 0.70 ([0.70, 0.79])
    (docs/serving.md)."""
    one, eight = ms.trn2_against_h200()
    assert (one["ratio"], one["low"], one["high"]) == pytest.approx((0.63, 0.63, 0.71),
                                                                    abs=0.005)
    assert (eight["ratio"], eight["low"], eight["high"]) == pytest.approx((1.25, 1.25, 1.40),
                                                                          abs=0.005)
    assert (one["cost_ratio"], one["cost_high"]) == pytest.approx((0.36, 0.40), abs=0.005)
    assert (eight["cost_ratio"], eight["cost_high"]) == pytest.approx((0.70, 0.79), abs=0.005)


@pytest.mark.parametrize("name, row", [
    ("trn2-deepseek-v3-256-256-nxd-inference-contrib", ms.DEEPSEEK_TRN2),
    ("trn2-qwen3-32b-128-512-nxd-inference", ms.QWEN3_TRN2),
    *((f"trn2-deepseek-v3-vllm-batch-{r.batch}", r) for r in ms.DEEPSEEK_VLLM_BATCHES)])
def test_calibration_scenarios_run_as_users_run_them(name, row):
    """scenarios/calibration/serving/: the rows as `clustersim run` scenarios (written by
    scripts/calibration_scenarios.py) give what the cost formulas give (within 0.5%: the
    p50 over identical requests against the formula's mean); the port's prompts run in its
    512-token context graph, every expert over every token."""
    from clustersim.calibration.scenarios import file_for, run_serving_row
    ttft, tpot = run_serving_row(file_for("serving", name))
    if row in ms.DEEPSEEK_VLLM_BATCHES:
        (formula,) = ms.predict_batches((row,))
    else:
        formula_ttft, formula = ms.predict_trn2_rows()[0 if row is ms.DEEPSEEK_TRN2 else 1]
        assert ttft == pytest.approx(formula_ttft, rel=0.005)
    assert tpot == pytest.approx(formula, rel=0.005)


def test_vllm_batches_ttft_as_reported():
    """The port through vLLM: TTFT about 1.7 s at every batch; the model's every-expert
    prefill grows with the padded tokens: 1,667, 1,916, 2,416 and 3,417 ms at batch 1, 2, 4,
    8 (-1.9%, +12.7%, +42.1%, +101.0%: judging, docs/calibration.md)."""
    from clustersim.calibration.scenarios import file_for, run_serving_row
    ttfts = [run_serving_row(file_for("serving", f"trn2-deepseek-v3-vllm-batch-{b}"))[0]
             for b in (1, 2, 4, 8)]
    assert [t * 1e3 for t in ttfts] == pytest.approx([1667.4, 1915.8, 2415.6, 3417.3], abs=0.5)


def test_sglang_scenarios_run_as_their_formula():
    """The H200 rows' scenario files (one batch arriving together) give their formula's
    TPOT through `clustersim run`; their prompts' TTFT is short beside it."""
    from clustersim.calibration.scenarios import file_for, run_serving_row
    for row, formula in zip(ms.SGLANG_H200, ms.predict_batches(ms.SGLANG_H200), strict=True):
        ttft, tpot = run_serving_row(file_for("serving",
                                              f"p5en-deepseek-v3-sglang-batch-{row.batch}"))
        assert tpot == pytest.approx(formula, rel=0.005), row.batch
        assert ttft < 0.2


def test_the_docs_quote_the_fits():
    """docs/calibration.md and docs/serving.md quote the mixture fits as the closed forms
    give them: the port's host time, trn2's moe_layer_overhead, the expert invocation
    overhead, the every-expert prefill without it, the collectives without MLA's
    all-gathers, and the sglang stack's constant."""
    from pathlib import Path

    from clustersim.calibration.trn2 import predict_trn2_serving
    docs = Path(__file__).resolve().parent.parent / "docs"
    calibration = " ".join((docs / "calibration.md").read_text(encoding="utf-8").split())
    serving = " ".join((docs / "serving.md").read_text(encoding="utf-8").split())
    host = f"{ms.fit_contrib_iteration_overhead() * 1e3:.1f} ms"
    moe = f"{ms.fit_moe_layer_overhead('trn2') * 1e3:.4f} ms per MoE layer"
    load = f"{ms.fit_moe_expert_load_overhead() * 1e6:.2f} us per expert load"
    invocation = f"{ms.fit_expert_invocation_overhead() * 1e6:.1f} us per expert"
    sglang = f"{ms.fit_moe_layer_overhead('p5en') * 1e3:.3f} ms per MoE layer"
    for text in (calibration, serving):
        for quoted in (host, moe, load, invocation, sglang):
            assert quoted in text, quoted
    bare = ms._without(ms.contrib_hardware(), expert_invocation_overhead_s=0.0)
    (ttft, _), = predict_trn2_serving(bare, (ms.DEEPSEEK_TRN2,))
    assert f"512 padded tokens: {ttft:.2f} s" in calibration
    it = ms._iteration_model("deepseek-v3", ms.contrib_hardware(), 64, "bf16")
    reduces = 61 * 2 * it.tp_all_reduce_s(7168 * 2)
    assert f"the collectives were {reduces * 1e3:.2f} ms (-42%)" in calibration
    assert reduces * 1e3 / ms.DEEPSEEK_PROFILE_MS["collectives"] - 1 == pytest.approx(-0.42,
                                                                                     abs=0.005)


def test_the_vllm_stack_is_the_port_plus_vllms_host_gap():
    """nxd-inference-contrib-vllm takes the port's stack's constants (`base`) and adds only
    vLLM's published 437 us host gap to its host time; trn2's default stack stays NxD
    Inference's (the one without constants of its own)."""
    from clustersim.hardware.stacks import default_stack, stack_named
    port = dict(stack_named(ms.CONTRIB_STACK).serving)
    vllm = dict(stack_named(ms.VLLM_STACK).serving)
    assert {k: v for k, v in vllm.items() if k != "iteration_overhead_s"} == \
        {k: v for k, v in port.items() if k != "iteration_overhead_s"}
    assert vllm["iteration_overhead_s"] == pytest.approx(port["iteration_overhead_s"] + 437e-6)
    assert default_stack("trn2").name == "nxd-inference"


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_why_qwen3_stays_judged():
    """docs/calibration.md's case that nxd-inference's iteration overhead cannot be
    re-expressed (per layer, per context token or per width) to hold Qwen3-32B with the
    Llama rows: the fixed time each row leaves, the Llama pair's negative slope over layers
    at the catalog's decode HBM efficiency, the efficiency where they leave the same time
    and Qwen3's then, and what within 15% on Qwen3 would do to the 70B row."""
    from pathlib import Path

    from clustersim.training.transformer import model_preset_values
    left = ms.fixed_time_left()
    fit = left.pop("fit")
    llama, big, qwen = left["llama3.3-70b"], left["llama3.1-405b"], left["qwen3-32b"]
    doc = " ".join((Path(__file__).resolve().parent.parent / "docs/calibration.md")
                   .read_text(encoding="utf-8").split())
    assert (f"is {llama['left_ms']:.2f} ms for the Llama 3.3 70B ({llama['layers']} layers), "
            f"{big['left_ms']:.2f} ms for the Llama 3.1 405B ({big['layers']} layers) and "
            f"{qwen['left_ms']:.2f} ms for Qwen3-32B ({qwen['layers']} layers)") in doc
    assert fit["slope_us_per_layer"] < 0  # more layers, less time left: no per-layer cost
    assert (f"({fit['slope_us_per_layer']:.1f} us per layer at the decode HBM efficiency of "
            f"{fit['hbm_efficiency']:.3f})") in doc
    assert fit["hbm_efficiency"] < fit["even_hbm_efficiency"] < 1.0
    assert llama["even_ms"] == pytest.approx(big["even_ms"], rel=1e-6)
    assert (f"at {fit['even_hbm_efficiency']:.3f} of HBM bandwidth, and then both leave "
            f"{llama['even_ms']:.2f} ms against Qwen3-32B's {qwen['even_ms']:.2f} ms") in doc
    assert qwen["even_ms"] < 0.7 * llama["even_ms"]
    # the 405B: more KV bytes a token (layers x KV heads x head width), twice the width
    a, b = model_preset_values("llama3.1-70b"), model_preset_values("llama3.1-405b")
    kv = [m["layers"] * m["kv_heads"] * m["hidden"] // m["heads"] for m in (a, b)]
    assert f"{kv[1] / kv[0]:.1f} times the 70B's KV" in doc and b["hidden"] == 2 * a["hidden"]
    # within 15% on Qwen3's TPOT: the most an iteration may take, and the 70B row then
    most = 1.15 * ms.QWEN3_TRN2.tpot_ms - (ms.QWEN3_TRN2.tpot_ms - qwen["left_ms"])
    at_most = (19.66 - llama["left_ms"] + most) / 19.66 - 1
    assert f"needs at most {most:.2f} ms an iteration, which puts the 70B row at {at_most:.0%}" in doc
    assert "the Llama pair (TPOT -8.7% and +9.9%)" in doc
    # the efficiency free too: no pair holds the three bands (issue 31's 15%, 32's 10%)
    near = ms.decode_bands_feasibility()
    assert near["margin_ms"] < 0
    assert (f"(the nearest, at {near['hbm_efficiency']:.3f} and {near['overhead_ms']:.2f} ms, "
            f"misses by {-near['margin_ms']:.2f} ms") in doc
    assert ms.decode_bands_feasibility(qwen_band=0.20)["margin_ms"] > 0  # the scan can pass


def test_qwen3_row_read_in_qwen3_tokens():
    """The tutorial's LLMPerf counted the 512 Qwen3 tokens each request asked for as 558
    (its default Llama 2 tokenizer): the row's TPOT is the p99 end-to-end less the TTFT
    over the 511 tokens after the first, not 1 / 102.3 tokens/s."""
    row = ms.QWEN3_TRN2
    assert (row.input_tokens, row.output_tokens) == (128, 512)
    assert row.tpot_ms == pytest.approx((6044.886 - 48.284) / 511, rel=1e-6)
    assert row.tpot_ms == pytest.approx(11.735, abs=0.001)
    assert 1000 / 102.3 < row.tpot_ms  # 102.3 a second is a rate of Llama 2 tokens
