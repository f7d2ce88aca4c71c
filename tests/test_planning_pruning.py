"""The pruned search against an exhaustive one: the bounds only leave out what cannot win.

The exhaustive search is the same planner with both bounds at zero, so that every
candidate that passes divisibility, placement and memory is simulated."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersim.planning import PlanOptions, plan, planner
from clustersim.planning.plans import PlanError
from clustersim.scenario.loader import scenario_from_dict

FIGURES = ("step_time_s", "mfu", "memory_per_chip_gib", "exposed_comm_s", "bubble_s",
           "ettr", "cost_usd", "tokens_per_s")


def _scenario(hardware: str, instances: int, layers: int, batch: int, hidden: int = 512,
              seq: int = 4096):
    raw = {"name": "prune", "hardware": hardware, "cluster": {"instances": instances,
                                                               "spares": 0},
           "jobs": [{"name": "train", "global_batch": batch, "seq_len": seq,
                     "model": {"name": "tiny", "layers": layers, "hidden": hidden, "heads": 8,
                               "kv_heads": 4, "vocab": 8000, "seq_len": seq, "gated": True}}],
           "failures": {"preset": "llama3"}}
    return scenario_from_dict(raw, planning=True)


def _exhaustive(scenario, options: PlanOptions):
    with mock.patch.object(planner, "step_lower_bound", lambda *a, **k: 0.0), \
            mock.patch.object(planner, "quick_bound", lambda model, job, fallback: 0.0):
        return plan(scenario, options)


def _same_search(scenario) -> None:
    options = PlanOptions(top=3)
    try:
        pruned = plan(scenario, options)
    except PlanError:  # nothing runs (a random job can be infeasible): nor without the bounds
        with pytest.raises(PlanError):
            _exhaustive(scenario, options)
        return
    full = _exhaustive(scenario, options)
    fast, every = pruned.rows, full.rows
    assert len(fast) == len(every) and (fast["tp"] == every["tp"]).all()
    simulated = fast["status"] == "simulated"
    assert simulated.sum() <= (every["status"] == "simulated").sum()
    # The best is the exhaustive search's (any of equal step time), with its figures.
    assert pruned.best["step_time_s"] == full.best["step_time_s"]
    for name in FIGURES:
        assert fast.loc[simulated, name].tolist() == every.loc[simulated, name].tolist(), name
    # Each bound is below the step it bounds; what the bound left out could not win.
    steps = every["step_time_s"]
    known = steps.notna() & fast["bound_s"].notna()
    assert (fast.loc[known, "bound_s"] <= steps[known]).all()
    left_out = fast["why"].str.startswith("bound")
    assert (fast.loc[left_out, "bound_s"] >= pruned.best["step_time_s"]).all()
    assert (steps[left_out] >= pruned.best["step_time_s"]).all()
    assert set(every.loc[every["status"] == "simulated"].index) >= set(fast[simulated].index)


@pytest.mark.parametrize("hardware, instances, layers, batch", [
    ("trn2", 2, 5, 32),  # data parallelism over EFA, uneven stages, cp 2, ZeRO 0-3
    pytest.param("trn2u", 4, 6, 16, marks=pytest.mark.slow),  # TP over the Z rings
])
def test_pruned_search_finds_the_exhaustive_best(hardware, instances, layers, batch):
    scenario = _scenario(hardware, instances, layers, batch, seq=2048)
    _same_search(scenario)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hardware=st.sampled_from(["trn1", "trn2", "p5en"]), instances=st.sampled_from([2, 4]),
       layers=st.integers(1, 9), batch=st.sampled_from([8, 16, 24, 32]),
       hidden=st.sampled_from([256, 1024]))
def test_pruned_search_is_exhaustive_on_random_jobs(hardware, instances, layers, batch,
                                                    hidden):
    _same_search(_scenario(hardware, instances, layers, batch, hidden, seq=2048))
