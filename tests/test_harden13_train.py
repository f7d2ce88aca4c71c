"""Session 13's hardening of the training surfaces on the mixtures, MLA and the attention
variants: what a demanding user found with `step`, `run` and `plan`. One test (or a few)
per defect."""

from __future__ import annotations

import pytest

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.scenario.loader import scenario_from_dict
from clustersim.training.step import StepModel
from clustersim.training.workload import model_flops_per_step

# 1. A capacity factor below 1 drops tokens: their expert FLOPs are not the model's ---------

_HEAVY_EXPERTS = {"layers": 4, "hidden": 4096, "heads": 32, "vocab": 1024, "experts": 8,
                  "top_k": 8, "expert_ffn_hidden": 65536, "gated": True, "seq_len": 512}


def _capped(capacity: float | None):
    job = {"name": "j", "model": _HEAVY_EXPERTS, "global_batch": 256, "micro_batch": 4,
           "parallelism": {"tp": 1, "dp": 64, "zero": 1}}
    if capacity is not None:
        job["capacity_factor"] = capacity
    return scenario_from_dict({"name": "cf", "hardware": "trn2", "cluster": {"instances": 1},
                               "jobs": [job]}).jobs[0]


def test_dropped_tokens_leave_the_model_flops():
    """Every expert takes at most c x its mean tokens: 1 - c of the routed copies skip their
    expert, so the model FLOPs lose 6 x (1 - c) x the routed experts' weights per token."""
    full, half = model_flops_per_step(_capped(None)), model_flops_per_step(_capped(0.5))
    m = _capped(None).model
    routed = m.layers * m.top_k * 3 * 4096 * 65536
    assert full - half == pytest.approx(6.0 * 0.5 * routed * 256 * 512)
    assert model_flops_per_step(_capped(1.25)) == full  # padding is not the model's work


@pytest.mark.parametrize("capacity", [0.1, 1e-9])
def test_mfu_stays_below_one_when_a_capacity_factor_drops_most_tokens(capacity: float):
    """Experts are nearly all of this model's FLOPs; at capacity 0.1 the step computes a
    tenth of them. Counting the dropped ones put MFU at 1.76 (0.1) and 1.86 (1e-9)."""
    hw = catalog_entry("trn2")
    profile = StepModel(build_topology(hw, 1)).profile(_capped(capacity))
    assert 0.0 < profile.mfu <= profile.hfu <= 1.0
