"""Trn2's own constants, fitted on Trn2 data only (clustersim/calibration/trn2.py), and the GPU
serving calibration (clustersim/calibration/gpu_serving.py); docs/calibration.md lists every
row's error."""

from __future__ import annotations

import pytest

from clustersim.calibration.trn2 import (
    TRN2_COLLECTIVES,
    TRN2_SERVING,
    UNFITTED,
    UNSEEN_TRN2_SERVING,
    predict_trn2_collectives,
    predict_trn2_serving,
    step_band,
)
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry, catalog_sources
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.training.transformer import TransformerShape, model_preset_values


def test_every_fitted_trn2_serving_row_within_10_percent():
    """TTFT and TPOT of the NxD Inference rows: Llama 3.3 70B with and without fused
    speculation, the prefix-caching table's rows without cache hits but the one row reported
    with weight 0 (sonnet 2k: 3.2 times the line the other three TTFTs lie on), and the
    Llama 3.1 405B rows (bf16, and fp8 with fused speculation), in the fit since the 70B
    rows alone left decode's HBM efficiency open."""
    checked = 0
    for row, (ttft, tpot) in zip(TRN2_SERVING, predict_trn2_serving(), strict=True):
        if row.name in UNFITTED:
            continue
        assert abs(ttft * 1e3 / row.ttft_ms - 1) < 0.10, (row.name, ttft)
        checked += 1
        if row.tpot_ms is not None:
            assert abs(tpot * 1e3 / row.tpot_ms - 1) < 0.10, (row.name, tpot)
            checked += 1
    assert checked == 10
    assert sum("405b" in r.model for r in TRN2_SERVING) == 2 and not UNSEEN_TRN2_SERVING


def test_trn2_collective_example_rows_keep_the_algorithm_and_floor():
    """The 16-rank example (Trn2: 4 chips at LNC 2) with the algorithm it printed; no row
    below the example's 300 us floor; the bandwidth-bound 512 MB KangaRing row within 35%."""
    predicted = predict_trn2_collectives()
    assert [m.algorithm for m in TRN2_COLLECTIVES] == ["mesh", "rdh", "kangaring", "kangaring"]
    assert all(t >= 300e-6 for t in predicted)
    assert abs(predicted[-1] / (TRN2_COLLECTIVES[-1].time_us * 1e-6) - 1) < 0.35


def test_trn2_names_each_constant_fitted_or_bounded():
    """Every calibrated trn2 constant says where it comes from (`clustersim hardware trn2`):
    fitted on Trn2 data (FIT-TRN2, FIT-TRN2-TRAIN) or bounded by it (BOUND-TRN2, with the
    bound); none is borrowed from the Trn1 fit."""
    sources = catalog_sources("trn2")
    fitted = ["collectives." + k for k in ("link_efficiency", "hbm_efficiency",
                                           "step_latency", "chip_step_latency")]
    fitted += ["serving." + k for k in ("hbm_efficiency", "iteration_overhead",
                                        "prefill_layer_overhead", "all_reduce", "matmul")]
    fitted += ["chip.efficiency.step_error_band"]
    trained = ["collectives.efa_efficiency", "collectives.efa_step_latency"]
    bounded = ["chip.efficiency.matmul", "chip.efficiency.vector",
               "chip.efficiency.pass_overhead"]
    for path in fitted:
        assert sources[path].startswith("FIT-TRN2:"), path
    for path in trained:
        assert sources[path].startswith("FIT-TRN2-TRAIN:"), path
    for path in bounded:
        assert sources[path].startswith("BOUND-TRN2:"), path
    assert not [p for p, s in sources.items() if "borrowed from the trn1" in s.lower()]
    assert catalog_sources("trn2u")["collectives.link_efficiency"].startswith("FIT-TRN2")


def test_trn2_step_band_is_trn1s_widened_by_the_trn2_rows():
    """The catalog's Trn2 band is what clustersim.calibration.trn2.step_band computes (a
    refit must update it), and it contains Trn1's."""
    trn1 = tuple(catalog_entry("trn1").chip.efficiency.step_error_band)
    band = tuple(catalog_entry("trn2").chip.efficiency.step_error_band)
    assert band == pytest.approx(step_band(trn1), abs=0.002)
    assert band[0] <= trn1[0] and band[1] >= trn1[1] and band != trn1


def test_overlapped_collectives_leave_decode_alone_and_pipeline_prefill():
    """With serving.overlap_collectives, one decode token (one row tile) costs what it did;
    a long prompt costs between max(compute, collectives) and their sum."""
    base = catalog_entry("trn2")
    model = TransformerShape(**model_preset_values("llama3.1-70b"))
    times = {}
    for overlap in (False, True):
        hw = base.model_copy(update={"serving": base.serving.model_copy(
            update={"overlap_collectives": overlap})})
        it = IterationModel(ReplicaShape(model, "bf16", 64, 1), build_topology(hw, 1))
        times[overlap] = (it.decode_base_s(1), it._body_s(4096))
    assert times[True][0] == pytest.approx(times[False][0])
    assert times[True][1] < times[False][1]
    assert times[True][1] > 0.5 * times[False][1]


@pytest.mark.parametrize("name, mib", [("p4d", 40960), ("p4de", 81920), ("p5", 81559),
                                       ("p5e", 143771), ("p5en", 143771)])
def test_gpu_hbm_as_the_driver_reports_it(name, mib):
    assert catalog_entry(name).chip.hbm_bytes == mib * 2**20


def _gpu_rows(**match):
    from clustersim.calibration.gpu_serving import GPU_SERVING
    return tuple(r for r in GPU_SERVING if all(getattr(r, k) == v for k, v in match.items()))


def test_gpu_throughput_row_from_the_simulator():
    """One fitted TensorRT-LLM row (Llama 3.1 70B on two H100, 5000/500), every request
    queued at once through the serving simulator: within 10% of the published tokens/s."""
    from clustersim.calibration.gpu_serving import predict_throughput
    (row,) = _gpu_rows(model="llama3.1-70b", input_tokens=5000, output_tokens=500)
    (predicted,) = predict_throughput((row,), max_requests=300)
    assert abs(predicted / row.output_tokens_per_s - 1) < 0.10


@pytest.mark.slow
def test_gpu_fitted_rows_as_docs_calibration_md_reports_them():
    """The 18 fitted H100 rows: every row within 10% (-9.4% to +9.4%), mean absolute error
    under 6.5% (5.6%); the unseen H200 and TensorRT-LLM 1.0 rows: mean under 6.5% (5.3%), at
    least 26 of 30 within 10%, none beyond 25%."""
    from clustersim.calibration.gpu_serving import (
        GPU_SERVING,
        UNSEEN_GPU_SERVING,
        predict_throughput,
    )
    errors = [p / r.output_tokens_per_s - 1
              for p, r in zip(predict_throughput(GPU_SERVING), GPU_SERVING, strict=True)]
    assert sum(abs(e) for e in errors) / len(errors) < 0.065
    assert max(abs(e) for e in errors) < 0.10
    unseen = [p / r.output_tokens_per_s - 1 for p, r in zip(
        predict_throughput(UNSEEN_GPU_SERVING), UNSEEN_GPU_SERVING, strict=True)]
    assert sum(abs(e) for e in unseen) / len(unseen) < 0.065
    assert sum(abs(e) < 0.10 for e in unseen) >= 26 and max(abs(e) for e in unseen) < 0.25


def test_gpu_tp_all_reduce_is_trtllms_kernel_up_to_its_workspace():
    """p5's serving TP all-reduce: within 30% of every measured point of TensorRT-LLM's
    custom all-reduce on H100 (TP 2, 4, 8; 512 B to 1 MiB; before its fit the model was 2x
    fast at 1 MiB on TP 2); beyond the kernel's workspace (16 MB at TP 2, 8 MB beyond) it is
    NCCL's, the collectives' cost; non-decreasing in size throughout; bf16 messages."""
    import numpy as np

    from clustersim.calibration.gpu_serving import predict_tp_all_reduce
    points = predict_tp_all_reduce()
    assert len(points) == 18
    for size, tp, measured, model in points:
        assert abs(model / measured - 1) < 0.30, (size, tp, measured, model)
    hw = catalog_entry("p5")
    model = TransformerShape(**model_preset_values("llama3.1-70b"))
    for tp, limit in ((2, 16e6), (8, 8e6)):
        it = IterationModel(ReplicaShape(model, "fp8", tp, 1, "fp8", "fp8"),
                            build_topology(hw, 1))
        sizes = np.geomspace(8, 2**30, 60)
        times = [it.tp_all_reduce_s(x) for x in sizes]
        assert all(b >= a for a, b in zip(times, times[1:], strict=False))
        big = 2 * limit
        nccl = min(it.collectives.cost("all-reduce", it.tp_group, big, intra=a).time_s
                   for a in ("mesh", "mesh1"))
        assert it.tp_all_reduce_s(big) == pytest.approx(nccl)
        assert it.hidden_bytes == 2  # W8A8: the messages stay bf16
