"""Calibration rows as scenario files (scenarios/calibration/): the files are what
scripts/calibration_scenarios.py writes from the rows' tables, and running them as `clustersim
run` / `clustersim step` do gives the figures the fits report."""

from __future__ import annotations

import pytest

from clustersim.calibration.scenarios import (
    CALIBRATION_DIR,
    file_for,
    model_serving_files,
    run_serving_row,
    run_training_row,
    training_files,
    trn1_file,
    trn1_serving_files,
    trn2_serving_files,
)
from clustersim.calibration.step import family_rows, predict_step
from clustersim.calibration.trn2 import TRN2_SERVING, UNFITTED, predict_trn2_serving


def _same_as_written(files) -> None:
    for f in files:
        path = CALIBRATION_DIR / f.path
        assert path.read_text(encoding="utf-8") == f.text, (
            f"{path}: run python scripts/calibration_scenarios.py")
        if f.trace is not None:
            assert path.with_suffix(".csv").read_text(encoding="utf-8") == f.trace, path


def test_serving_scenario_files_are_the_script_output():
    _same_as_written(trn2_serving_files() + model_serving_files() + trn1_serving_files())


@pytest.mark.slow
def test_training_scenario_files_are_the_script_output():
    _same_as_written(training_files())


@pytest.mark.parametrize("row", [r for r in TRN2_SERVING if r.name not in UNFITTED],
                         ids=lambda r: r.name)
def test_nxd_inference_rows_through_clustersim_run_within_10_percent(row):
    """Each fitted NxD Inference row, written as a scenario with the nxd-inference stack and
    its compiled buckets and run as `clustersim run` runs it: TTFT and TPOT p50 within 10%
    of the published figures, and what the fit's cost formulas give (within 0.5%: the
    simulator's p50 over a few identical requests against the formula's mean)."""
    ttft, tpot = run_serving_row(file_for("serving", f"trn2-{row.name}"))
    assert abs(ttft * 1e3 / row.ttft_ms - 1) < 0.10, ttft
    (formula,) = predict_trn2_serving(rows=(row,))
    assert ttft == pytest.approx(formula[0], rel=0.005)
    if row.tpot_ms is not None:
        assert abs(tpot * 1e3 / row.tpot_ms - 1) < 0.10, tpot
        assert tpot == pytest.approx(formula[1], rel=0.005)


@pytest.mark.parametrize("m", family_rows("trn2"), ids=lambda m: m.name)
def test_trn2_training_rows_through_clustersim_step(m):
    """The AXLearn rows' scenario files give, through `clustersim step`'s code, what the
    calibration reports, and stay within 10% of the published step."""
    path = file_for("training", m.name)
    step_s = run_training_row(path, m.metric)
    assert step_s == pytest.approx(predict_step(m)[0], rel=1e-9)
    assert abs(m.measured / step_s - 1) < 0.10


def _trn1_rows():
    from clustersim.calibration.serving import SERVING_MEASUREMENTS, UNSEEN_SERVING_218
    return SERVING_MEASUREMENTS + UNSEEN_SERVING_218


@pytest.mark.parametrize("row", _trn1_rows(),
                         ids=lambda r: f"{r.model}-{r.sdk}-b{r.batch}-{r.input_tokens}")
def test_transformers_neuronx_rows_through_clustersim_run_are_the_fit(row):
    """Each Trn1 row's scenario (its release's stack, a batch of 4 as one static batch) run
    as `clustersim run` runs it gives what the fit's formulas give, so the errors printed
    from the runs are the fit's; the fitted rows of each release within 10%."""
    from clustersim.calibration.serving import SERVING_MEASUREMENTS
    from clustersim.calibration.serving_stacks import predict_release

    ttft, tpot = run_serving_row(trn1_file(row))
    (formula,) = predict_release(f"transformers-neuronx@{row.sdk}", (row,))
    assert ttft == pytest.approx(formula[0], rel=1e-6)
    assert tpot == pytest.approx(formula[1], rel=1e-6)
    if row in SERVING_MEASUREMENTS or row.sdk == "2.18.1":
        assert abs(ttft * 1e3 / row.ttft_ms - 1) < 0.10
        assert abs(tpot * 1e3 / row.tpot_ms - 1) < 0.10
