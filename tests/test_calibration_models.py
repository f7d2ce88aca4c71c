"""Fidelity of the serving model on 2025's models (clustersim/calibration/models_serving.py):
the figures docs/calibration.md and docs/serving.md quote, and issue 31's bands.

Fitted: serving.moe_layer_overhead on a batch-1 DeepSeek-V3 row: trn2's (hardware.yaml) on
the NxD Inference port's TPOT, the sglang@0.4.1 stack's (stacks.yaml) on SGLang's on 8 x H200.
Everything else judges.
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


def test_catalog_reproduces_its_moe_fit():
    assert catalog_entry("trn2").serving.moe_layer_overhead_s == pytest.approx(
        ms.fit_moe_layer_overhead("trn2"), rel=1e-4)
    from clustersim.hardware.stacks import stack_named, with_stack
    sglang = with_stack(catalog_entry("p5en"), stack_named(ms.SGLANG_STACK))
    assert sglang.serving.moe_layer_overhead_s == pytest.approx(
        ms.fit_moe_layer_overhead("p5en"), rel=1e-4)
    # families and stacks without mixture rows keep none (TensorRT-LLM on p5en: none)
    assert catalog_entry("trn1").serving.moe_layer_overhead_s == 0.0
    assert catalog_entry("p5en").serving.moe_layer_overhead_s == 0.0


def test_deepseek_v3_tpot_within_15_percent_and_its_profile_as_reported(trn2_rows):
    """DeepSeek-V3 at TP 64 on trn2: TPOT within 15% (fitted: +0.0%); the one-token
    profile's parts: compute 16.19 ms against about 12 (+34.9%), TP collectives 1.74
    against about 3 (-41.9%), weight reads 2.57 against about 3 (-14.2%)."""
    assert abs(trn2_rows["ds_tpot"]) < 0.15
    parts = ms.deepseek_breakdown()
    assert parts["compute"] * 1e3 == pytest.approx(16.19, abs=0.02)
    assert parts["collectives"] * 1e3 == pytest.approx(1.74, abs=0.02)
    assert parts["weight_reads"] * 1e3 == pytest.approx(2.57, abs=0.02)
    assert abs(parts["weight_reads"] * 1e3 / 3.0 - 1) < 0.30


@pytest.mark.xfail(strict=True, reason="not met on the merged Trn2 constants: compute +34.9% "
                   "(10.03 ms iteration overhead), collectives -41.9%; docs/calibration.md")
def test_deepseek_v3_profile_within_30_percent():
    parts = ms.deepseek_breakdown()
    for name, published in ms.DEEPSEEK_PROFILE_MS.items():
        assert abs(parts[name] * 1e3 / published - 1) < 0.30, name


@pytest.mark.xfail(strict=True, reason="not met: Qwen3-32B TTFT 58.5 ms against 48.3 (+21.2%)")
def test_qwen3_32b_ttft_within_15_percent(trn2_rows):
    assert abs(trn2_rows["q_ttft"]) < 0.15


@pytest.mark.xfail(strict=True, reason="not met: the model's DeepSeek-V3 TTFT is 121.6 ms "
                   "against 1,667 (-92.7%); docs/calibration.md")
def test_deepseek_v3_ttft_within_20_percent(trn2_rows):
    assert abs(trn2_rows["ds_ttft"]) < 0.20


@pytest.mark.xfail(strict=True, reason="not met: Qwen3-32B TPOT 13.89 ms against 9.78 "
                   "(+42.1%): Trn2's 10.03 ms iteration overhead is the Llama rows' fit")
def test_qwen3_32b_tpot_within_15_percent(trn2_rows):
    assert abs(trn2_rows["q_tpot"]) < 0.15


def test_errors_as_docs_report_them(trn2_rows):
    """The rows' errors as reported: DeepSeek-V3 TTFT -92.7%, Qwen3-32B TTFT +21.2% and TPOT
    +42.1%; the judged batches: Trn2 through vLLM at batch 1, 2, 4, 8: -7.7%, -25.2%,
    -28.3%, -29.6%; 8 x H200 through SGLang at batch 8 and 32: -1.7%, +11.1%."""
    assert trn2_rows["ds_ttft"] == pytest.approx(-0.927, abs=0.002)
    assert trn2_rows["q_ttft"] == pytest.approx(0.212, abs=0.002)
    assert trn2_rows["q_tpot"] == pytest.approx(0.421, abs=0.002)
    rows = ms.DEEPSEEK_VLLM_BATCHES + ms.SGLANG_H200[1:]
    errors = [p * 1e3 / r.tpot_ms - 1 for r, p in zip(rows, ms.predict_batches(rows),
                                                        strict=True)]
    assert errors == pytest.approx([-0.077, -0.252, -0.283, -0.296, -0.017, 0.111], abs=0.002)


def test_trn2_against_h200_answer():
    """DeepSeek-V3, 128 in / 256 out: Trn2 (TP 64, bf16) over 8 x H200 (TP 8, FP8) per
    output token: 0.62 at batch 1 (band [0.62, 0.87]) and 0.88 at batch 8 ([0.88, 1.22]);
    per dollar, 0.35 ([0.35, 0.49]) and 0.50 ([0.50, 0.69])."""
    one, eight = ms.trn2_against_h200()
    assert (one["ratio"], one["low"], one["high"]) == pytest.approx((0.62, 0.62, 0.87),
                                                                    abs=0.005)
    assert (eight["ratio"], eight["low"], eight["high"]) == pytest.approx((0.88, 0.88, 1.22),
                                                                          abs=0.005)
    assert (one["cost_ratio"], one["cost_high"]) == pytest.approx((0.35, 0.49), abs=0.005)
    assert (eight["cost_ratio"], eight["cost_high"]) == pytest.approx((0.50, 0.69), abs=0.005)


@pytest.mark.parametrize("name, row", [("deepseek-v3-trn2-nxdi", ms.DEEPSEEK_TRN2),
                                       ("qwen3-32b-trn2-nxdi", ms.QWEN3_TRN2),
                                       ("deepseek-v3-h200-sglang", ms.SGLANG_H200[0])])
def test_calibration_scenarios_run_as_users_run_them(name, row, tmp_path):
    """scenarios/calibration/serving/: the rows as `clustersim run` scenarios. Their p50
    TPOT is the fidelity table's (one request at a time, the context growing over the
    output); DeepSeek-V3's TTFT on trn2 is its 256-token prompt's (the port pads it to its
    512-token context graph: the table's)."""
    from pathlib import Path

    from clustersim.runner.api import run_to
    from clustersim.scenario.loader import load_scenario
    root = Path(__file__).resolve().parent.parent
    run_to(load_scenario(root / "scenarios" / "calibration" / "serving" / f"{name}.yaml"),
           tmp_path / "out")
    import json
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (deployment,) = summary["deployments"].values()
    if row in ms.SGLANG_H200:
        (tpot,) = ms.predict_batches((row,))
    else:
        _, tpot = ms.predict_trn2_rows()[0 if row is ms.DEEPSEEK_TRN2 else 1]
    assert deployment["tpot_p50_s"] == pytest.approx(tpot, rel=0.01)
    assert deployment["ttft_p50_s"] < 0.2
