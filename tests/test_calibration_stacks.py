"""Serving stacks of Trn1 (transformers-neuronx releases) and GPUs (tensorrt-llm): their rows
as scenario files run as `clustersim run` runs them, and each stack's constants reproducing
the fit printed for them (docs/calibration.md)."""

from __future__ import annotations

import pytest

from clustersim.calibration.scenarios import (
    CALIBRATION_DIR,
    file_for,
    gpu_name,
    gpu_serving_files,
    run_throughput_row,
)


def test_gpu_scenario_files_are_the_script_output():
    files = gpu_serving_files()
    assert len(files) == 48  # 18 fitted H100 rows, 30 unseen
    for f in files:
        path = CALIBRATION_DIR / f.path
        assert path.read_text(encoding="utf-8") == f.text, (
            f"{path}: run python scripts/calibration_scenarios.py")


def test_gpu_row_through_clustersim_run_is_the_fit():
    """A fitted TensorRT-LLM row's file (Llama 3.1 70B on two H100, 5000/500, stack
    tensorrt-llm) run as `clustersim run` runs it gives what the fit's simulator call gives,
    within 10% of the published tokens/s."""
    from clustersim.calibration.gpu_serving import GPU_SERVING, predict_throughput

    (row,) = [r for r in GPU_SERVING if r.model == "llama3.1-70b" and r.input_tokens == 5000]
    path = file_for("serving", gpu_name(row))
    assert "stack: tensorrt-llm" in path.read_text(encoding="utf-8")
    figure = run_throughput_row(path)
    assert figure == pytest.approx(predict_throughput((row,))[0], rel=1e-9)
    assert abs(figure / row.output_tokens_per_s - 1) < 0.10
