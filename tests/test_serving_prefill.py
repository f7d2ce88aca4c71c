"""Prefill that scales like the hardware (issue 20, item 4): unfused attention's scores
through HBM once they leave the on-chip SRAM, a fixed time per layer of a context-encoding
iteration, and the Trn1 SDK 2.18 TTFT series over the prompt's length."""

from __future__ import annotations

import pytest

from clustersim.calibration.serving import (
    SERVING_MEASUREMENTS,
    UNSEEN_SERVING_218,
    predict_serving,
)
from clustersim.hardware.catalog import catalog_entry
from clustersim.hardware.topology import build_topology
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.training.transformer import TransformerShape, model_preset_values


def _iteration(family: str = "trn1", model: str = "llama2-70b", tp: int = 32,
               **serving) -> IterationModel:
    hw = catalog_entry(family)
    if serving:
        hw = hw.model_copy(update={"serving": hw.serving.model_copy(update=serving)})
    shape = ReplicaShape(TransformerShape(**model_preset_values(model)), "bf16", tp, 1)
    return IterationModel(shape, build_topology(hw, 1))


def test_unfused_scores_cost_nothing_on_chip_and_grow_quadratically_beyond():
    """Llama 2 70B on TP 32 (two heads a rank): a 1,024-token prompt's scores (2 x 1,024^2
    x 2 bytes, twice for a pass's input and output: 8.4 MB) fit the 24 MiB of SBUF; a
    2,048-token prompt's (33.6 MB) do not, and 4,096 tokens cost four times 2,048."""
    unfused = _iteration()
    flash = _iteration(attention="flash")
    assert unfused.hardware.serving.attention == "unfused"
    heads = unfused.heads.per_rank
    assert unfused._spilled_scores_s(heads * 1024 * 1024) == 0.0
    at_2k = unfused._spilled_scores_s(heads * 2048 * 2048)
    assert at_2k > 0 and flash._spilled_scores_s(heads * 2048 * 2048) == 0.0
    assert unfused._spilled_scores_s(heads * 4096 * 4096) == pytest.approx(4 * at_2k)
    # 12 passes of 2-byte scores at the fitted fraction of a rank's HBM bandwidth
    hw = unfused.hardware
    per_rank = hw.chip.hbm_bandwidth_bytes_per_s / hw.chip.ranks
    assert at_2k == pytest.approx(12 * heads * 2048**2 * 2
                                  / (per_rank * hw.serving.score_efficiency))
    assert (unfused._prefill_attention_s(1024, 0)
            == pytest.approx(flash._prefill_attention_s(1024, 0)))
    assert unfused._prefill_attention_s(2048, 0) > flash._prefill_attention_s(2048, 0)


def test_prefill_layer_overhead_counts_every_layer_once_per_prefill_iteration():
    base = _iteration("trn2", "llama3.1-70b", 64)
    seven = _iteration("trn2", "llama3.1-70b", 64, prefill_layer_overhead_s=0.0)
    layers = base.shape.model.layers
    per_layer = base.hardware.serving.prefill_layer_overhead_s
    assert per_layer > 0
    assert base.prefill_s(512) - seven.prefill_s(512) == pytest.approx(layers * per_layer)
    # decode iterations do not pay it
    assert base.iteration_s([], 4, 1000.0) == pytest.approx(seven.iteration_s([], 4, 1000.0))


def test_trn1_ttft_follows_the_published_series_over_the_prompt():
    """Llama 2 70B on trn1 (SDK 2.18): TTFT 53.9, 81.9, 232.5 and 691.0 ms at 128, 256,
    1,024 and 2,048 tokens. The model's growth from 128 to 256 and from 256 to 1,024 tokens
    within 5% of the published (x1.52, x2.84); from 1,024 to 2,048 x2.53 against x2.97 (x2.18
    before the unfused attention term): the Llama 3 70B 2,048-token row, the same shape, is
    26% faster as published and the fit sits between the two."""
    rows = {m.input_tokens: (m, p) for m, p in zip(SERVING_MEASUREMENTS, predict_serving(),
                                                   strict=True)
            if m.model == "llama2-70b" and m.batch == 1}
    growth = {}
    for short, long in ((128, 256), (256, 1024), (1024, 2048)):
        published = rows[long][0].ttft_ms / rows[short][0].ttft_ms
        growth[long] = rows[long][1][0] / rows[short][1][0] / published - 1
    assert abs(growth[256]) < 0.05 and abs(growth[1024]) < 0.05, growth
    assert -0.18 < growth[2048] < 0, growth


def test_unseen_trn1_sdk_218_rows():
    """The same data file's rows the fit never saw: Llama 2 70B and Llama 3 70B with other
    prompt and output lengths (TTFT and TPOT within 10%), and Llama 2 13B's 4,096- and
    8,192-token prompts (four and sixteen times the fitted 2,048-token prompt's scores): the
    model is 36% and 29% fast on TTFT there (59% and 69% before the unfused attention term),
    and 21% fast on the 8,192-token TPOT (its decode reads 8K-16K tokens of KV cache)."""
    predicted = predict_serving(rows=UNSEEN_SERVING_218)
    assert len(predicted) == 6
    for row, (ttft, tpot) in zip(UNSEEN_SERVING_218, predicted, strict=True):
        ttft_error = ttft * 1e3 / row.ttft_ms - 1
        tpot_error = tpot * 1e3 / row.tpot_ms - 1
        if row.model == "llama2-13b":
            assert -0.40 < ttft_error < -0.25, (row, ttft_error)
            assert abs(tpot_error) < (0.25 if row.input_tokens == 8192 else 0.10), row
        else:
            assert abs(ttft_error) < 0.10 and abs(tpot_error) < 0.10, (row, ttft_error)
