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
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.serving.unfused import spilled_scores_s, unfused_scores_s
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
    assert spilled_scores_s(unfused, heads * 1024 * 1024) == 0.0
    at_2k = spilled_scores_s(unfused, heads * 2048 * 2048)
    assert at_2k > 0 and spilled_scores_s(flash, heads * 2048 * 2048) == 0.0
    assert spilled_scores_s(unfused, heads * 4096 * 4096) == pytest.approx(4 * at_2k)
    # 12 passes of 2-byte scores at the fitted fraction of a rank's HBM bandwidth
    hw = unfused.hardware
    per_rank = hw.chip.hbm_bandwidth_bytes_per_s / hw.chip.ranks
    assert at_2k == pytest.approx(12 * heads * 2048**2 * 2
                                  / (per_rank * hw.serving.score_efficiency))
    assert unfused.prefill_s(1024) == pytest.approx(flash.prefill_s(1024))
    layers = unfused.shape.model.layers
    assert unfused.prefill_s(2048) == pytest.approx(flash.prefill_s(2048) + layers * at_2k)


def test_unfused_scores_of_a_static_batch_share_the_sram():
    """transformers-neuronx encodes a static batch's prompts in one graph whose score tensor
    is (sequences, heads, tokens, positions): four 1,024-token prompts hold four times one
    prompt's scores (33.6 MB for a pass's input and output), which spill where one prompt's
    do not. Under continuous batching each prompt's context is encoded by itself: four
    1,024-token prompts in one iteration spill nothing. Flash attention (tiles kept on chip)
    pays nothing either way, and decode iterations never pay it."""
    unfused = _iteration()
    flash = _iteration(attention="flash")
    one = [(1024, 0)]
    four = one * 4
    assert unfused.iteration_s(one, 0, 0.0, 1, static_batch=True) == pytest.approx(
        flash.iteration_s(one, 0, 0.0, 1))
    layers = unfused.shape.model.layers
    heads = unfused.heads.per_rank
    per_rank = unfused.hardware.chip.hbm_bandwidth_bytes_per_s / unfused.hardware.chip.ranks
    spill = 12 * 4 * heads * 1024**2 * 2 / (per_rank * unfused.hardware.serving.score_efficiency)
    assert unfused.iteration_s(four, 0, 0.0, 4, static_batch=True) == pytest.approx(
        flash.iteration_s(four, 0, 0.0, 4) + layers * spill)
    assert unfused.iteration_s(four, 0, 0.0, 4) == pytest.approx(flash.iteration_s(four, 0, 0.0, 4))
    # a chunk over earlier context scores its whole span: 512 tokens over 1,536 (8.4 MB for
    # a pass's input and output) fit alone, but not beside a 2,048-token prompt in one graph
    mixed = [(512, 1536), (2048, 0)]
    alone = layers * (spilled_scores_s(unfused, heads * 512 * 2048)
                      + spilled_scores_s(unfused, heads * 2048 * 2048))
    together = layers * spilled_scores_s(unfused, heads * (512 * 2048 + 2048 * 2048))
    assert unfused_scores_s(unfused, mixed, False) == pytest.approx(alone)
    assert unfused_scores_s(unfused, mixed, True) == pytest.approx(together)
    assert together > alone > 0
    for model in (unfused, flash):  # decode attention reads the KV cache: no score passes
        assert model.iteration_s([], 8, 8 * 4096.0) == pytest.approx(
            flash.iteration_s([], 8, 8 * 4096.0))


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
    """Llama 2 70B on trn1 (SDK 2.18.0): TTFT 53.9, 81.9, 232.5 and 691.0 ms at 128, 256,
    1,024 and 2,048 tokens. The model's growth from 128 to 256, 256 to 1,024 and 1,024 to
    2,048 tokens within 5% of the published (x1.52, x2.84, x2.97; x2.18 from 1,024 to 2,048
    before the unfused attention term)."""
    rows = {m.input_tokens: (m, p) for m, p in zip(SERVING_MEASUREMENTS, predict_serving(),
                                                   strict=True)
            if m.model == "llama2-70b" and m.batch == 1}
    growth = {}
    for short, long in ((128, 256), (256, 1024), (1024, 2048)):
        published = rows[long][0].ttft_ms / rows[short][0].ttft_ms
        growth[long] = rows[long][1][0] / rows[short][1][0] / published - 1
    assert all(abs(g) < 0.05 for g in growth.values()), growth


def test_the_fitted_trn1_rows_are_one_release_and_the_other_judges():
    """The fit takes one software release, SDK 2.18.0; the data files' SDK 2.18.1 rows
    (Llama 3 70B: the same shape as Llama 2 70B) are unseen."""
    assert {m.sdk for m in SERVING_MEASUREMENTS} == {"2.18.0"}
    judged = {m.sdk for m in UNSEEN_SERVING_218}
    assert judged == {"2.18.0", "2.18.1"}
    assert all(m.model == "llama3-70b" for m in UNSEEN_SERVING_218 if m.sdk == "2.18.1")


def _unseen_errors():
    return [(row, ttft * 1e3 / row.ttft_ms - 1, tpot * 1e3 / row.tpot_ms - 1)
            for row, (ttft, tpot) in zip(UNSEEN_SERVING_218,
                                         predict_serving(rows=UNSEEN_SERVING_218), strict=True)]


# (batch, model, input, output) -> the model's TTFT error as docs/calibration.md gives it
_SDK_2180_TTFT_ERRORS = {
    (1, "llama2-70b", 128, 1024): -0.080, (1, "llama2-70b", 1024, 2048): 0.022,
    (1, "llama2-13b", 4096, 4096): -0.177, (1, "llama2-13b", 8192, 8192): -0.024,
    (4, "llama2-70b", 128, 128): -0.068, (4, "llama2-70b", 256, 256): -0.109,
    (4, "llama2-70b", 1024, 1024): -0.289, (4, "llama2-70b", 1024, 2048): -0.289,
    (4, "llama2-70b", 2048, 2048): -0.091}
_SDK_2181_TTFT_ERRORS = {
    (1, "llama3-70b", 128, 128): 0.014, (1, "llama3-70b", 128, 1024): 0.001,
    (1, "llama3-70b", 2048, 2048): 0.263, (4, "llama3-70b", 128, 128): 0.122,
    (4, "llama3-70b", 128, 1024): 0.126, (4, "llama3-70b", 2048, 2048): 0.489}


def test_unseen_trn1_sdk_2180_rows():
    """The SDK 2.18.0 rows the fit never saw (docs/calibration.md): Llama 2 70B at batch 1
    with other lengths within 10%; Llama 2 13B's 4,096- and 8,192-token prompts (four and
    sixteen times the fitted 2,048-token prompt's scores) -18% and -2% on TTFT (-36%, -29%
    with the release-mixed fit; -59%, -69% before the unfused term) and -21% on the
    8,192-token TPOT (decode over 8K-16K tokens of KV cache); the batch-4 rows of the
    throughput file within 11% but the two 1,024-token prompts, 29% fast (published 6.4 times
    the batch-1 TTFT for four prompts)."""
    seen = 0
    for row, ttft_error, tpot_error in _unseen_errors():
        if row.sdk != "2.18.0":
            continue
        seen += 1
        assert abs(tpot_error) < (0.24 if row.input_tokens == 8192 else 0.08), row
        assert ttft_error == pytest.approx(_SDK_2180_TTFT_ERRORS[row.batch, row.model,
                                                                 row.input_tokens,
                                                                 row.output_tokens], abs=0.03)
    assert seen == len(_SDK_2180_TTFT_ERRORS) == 9


def test_unseen_trn1_sdk_2181_rows_are_faster_than_the_fit():
    """SDK 2.18.1's Llama 3 70B rows: short prompts within 13%; the 2,048-token prompts 26%
    (batch 1) and 49% (batch 4) slower in the model, as Llama 2 70B's SDK 2.18.0 rows of the
    same shape are (690.96 against 547.00 ms; 2,722 against 1,661 ms)."""
    errors = [(row, t, p) for row, t, p in _unseen_errors() if row.sdk == "2.18.1"]
    assert len(errors) == len(_SDK_2181_TTFT_ERRORS) == 6
    for row, ttft_error, tpot_error in errors:
        assert abs(tpot_error) < 0.075, row
        assert ttft_error == pytest.approx(_SDK_2181_TTFT_ERRORS[row.batch, row.model,
                                                                 row.input_tokens,
                                                                 row.output_tokens], abs=0.03)


def _calibrate_collectives(*args: str):
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "scripts" / "calibrate_collectives.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_score_efficiency_refit_alone_reproduces_the_catalog():
    """`calibrate_collectives.py --only score_efficiency` (the other constants held at the
    catalog's) gives the catalog's value back."""
    done = _calibrate_collectives("--only", "score_efficiency")
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.strip().startswith("score_efficiency:"))
    fitted = float(line.split(":")[1])
    assert fitted == pytest.approx(catalog_entry("trn1").serving.score_efficiency, abs=0.0015)


@pytest.mark.slow  # the four constants' coordinate search: about 8 s
def test_trn1_serving_constants_are_their_refit():
    """The trn1 entry's four fitted serving constants (transformers-neuronx@2.18.0's) are
    what `calibrate_collectives.py --only` refits them to from the catalog, the collectives
    and step constants held: within 1.5% each (iteration_overhead 0.25 ms, left over from
    before decode read its token bucket, refits to 0.196 ms and fails here)."""
    names = {"serving_hbm_efficiency": "hbm_efficiency",
             "serving_overhead": "iteration_overhead_s",
             "prefill_layer_overhead": "prefill_layer_overhead_s",
             "score_efficiency": "score_efficiency"}
    done = _calibrate_collectives("--only", *names)
    assert done.returncode == 0, done.stderr
    serving = catalog_entry("trn1").serving
    for name, field in names.items():
        line = next(x for x in done.stdout.splitlines() if x.strip().startswith(f"{name}:"))
        text = line.split(":")[1].strip()
        fitted = float(text[:-2]) * 1e-6 if text.endswith("us") else float(text)
        assert fitted == pytest.approx(getattr(serving, field), rel=0.015), name


def test_only_refuses_what_it_cannot_fit(monkeypatch, capsys):
    """A step constant without --joint, and --only with --check or --family trn2, exit 2
    before any fitting (the script's own argument checks, run in this process)."""
    import importlib.util
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "scripts" / "calibrate_collectives.py"
    spec = importlib.util.spec_from_file_location("calibrate_collectives", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for args in (("--only", "matmul"), ("--only", "score_efficiency", "--check"),
                 ("--family", "trn2", "--only", "score_efficiency")):
        monkeypatch.setattr(sys, "argv", ["calibrate_collectives.py", *args])
        with pytest.raises(SystemExit) as stop:
            module.main()
        assert stop.value.code == 2, args
        assert "--only" in capsys.readouterr().err
