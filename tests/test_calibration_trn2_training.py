"""Trn2's training constants against AXLearn's Trn2 run (clustersim/calibration/trn2_training.py):
the two rows, the published cost of full recompute, and the fit the catalog's EFA constants
come from."""

from __future__ import annotations

import pytest

from clustersim.calibration.trn2_training import (
    RECOMPUTE_COST,
    fit_efa,
    recompute_cost,
    trn2_errors,
)
from clustersim.hardware.catalog import catalog_entry


def test_axlearn_rows_within_10_percent_with_the_published_layout():
    """Llama 2 7B (1.2 s) and 70B (11.2 s) on 64 trn2.48xlarge, TP 4, ZeRO-3 over dp 1,024:
    8.02 s (+40%) for the 70B with Trn1's EFA constants."""
    rows = trn2_errors()
    assert [m.model for m, _, _ in rows] == ["llama2-7b", "llama2-70b"]
    for m, _, err in rows:
        assert m.parallelism == {"tp": 4, "pp": 1, "dp": 1024, "zero": 3,
                                 "sequence_parallel": True}
        assert abs(err) < 0.10, (m.name, err)


def test_the_70b_step_is_fsdp_traffic_with_trn1s_efa_it_is_not():
    """The physics of the fit: with Trn1's EFA constants the 70B is 40% fast and the 7B
    within 5%; a slower EFA rate moves the 70B (four times the bytes a collective) more."""
    trn1 = catalog_entry("trn1").collectives
    before = trn2_errors({"efa_efficiency": 0.674, "efa_step_latency": 718e-6})
    assert before[1][2] > 0.35 and abs(before[0][2]) < 0.05
    slower = trn2_errors({"efa_efficiency": trn1.efa_efficiency / 2,
                          "efa_step_latency": 718e-6})
    assert slower[1][2] - before[1][2] < slower[0][2] - before[0][2] < 0


def test_full_recompute_costs_about_what_axlearn_reports():
    """AXLearn's table: full recompute costs 1% (compute hidden under FSDP traffic)."""
    assert 0 <= recompute_cost() <= 2 * RECOMPUTE_COST


def test_catalog_efa_constants_reproduce_their_fit():
    """Refitting from the catalog's values lands on them (scripts/calibrate_trn2_training.py
    prints the fit): a change to the model or the constants that moves the fit fails."""
    c = catalog_entry("trn2").collectives
    fitted = fit_efa({"efa_efficiency": c.efa_efficiency,
                      "efa_step_latency": c.efa_step_latency_s})
    assert fitted["efa_efficiency"] == pytest.approx(c.efa_efficiency, rel=0.02)
    assert fitted["efa_step_latency"] == pytest.approx(c.efa_step_latency_s, rel=0.05)


def test_docs_quote_the_trn2_training_figures_the_model_gives():
    """docs/calibration.md's Trn2 training figures: the step table rows as
    `scripts/validate_model.py --steps --markdown` prints them, and the fitted row of the
    before/after table from the catalog's constants."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "calibration.md").read_text(
        encoding="utf-8")
    c = catalog_entry("trn2").collectives
    rows = trn2_errors()
    for m, predicted, err in rows:
        assert (f"| {m.name} | {m.measured:.3f} | {predicted:.3f} | {err:+.1%} | s/step; "
                f"micro-batch 1, interleave 1; {m.source} |") in text, m.name
    (_, p7, e7), (_, p70, e70) = rows
    assert (f"| {c.efa_efficiency:.3f} | {c.efa_step_latency_s * 1e6:.0f} us | {p7:.3f} s, "
            f"{e7:+.1%} | {p70:.3f} s, {e70:+.1%} |") in text
