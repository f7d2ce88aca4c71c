"""The serving planner's trials and search (issue 34): a trial stopped early says what the
whole run says, a stopped trial finished is the whole run, a candidate given up on cost could
not have won, and the engine (serial, a process pool) changes nothing in the plan."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_serving_plan import SMALL

from clustersim.hardware.catalog import catalog_entry
from clustersim.planning.engine import Engine
from clustersim.planning.serving_plan import ServingPlanOptions, plan_serving
from clustersim.planning.serving_search import (
    MAX_SIMULATIONS_PER_CANDIDATE,
    CandidateTask,
    rank_cost,
    search_candidate,
    settle,
)
from clustersim.planning.serving_space import _Shape
from clustersim.runner.api import simulate
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.simulate import deployment_figures
from clustersim.serving.trials import SloTrial, _allowed_misses

ROOT = Path(__file__).resolve().parent.parent


def _small(replicas: int, rate: float, ttft: str = "1s") -> Any:
    raw = copy.deepcopy(SMALL)
    d = raw["serve"][0]
    d["parallelism"] = {"tp": 16}
    d["replicas"] = replicas
    d["workload"]["rate"] = f"{rate}/s"
    d["slo"]["ttft"] = ttft
    return scenario_from_dict(raw)


def _whole(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in figures.items() if k != "fluid_check"}


@given(n=st.integers(1, 100_000), goodput=st.floats(0.01, 1.0))
def test_allowed_misses_is_the_edge_of_the_figures_test(n, goodput):
    """One more miss than allowed puts the best share possible under goodput (the float
    division deployment_figures makes); the allowed number leaves it reachable."""
    m = _allowed_misses(n, goodput)
    assert -1 <= m <= n
    if m >= 0:
        assert float(n - m) / n >= goodput
    assert m == n or float(n - m - 1) / n < goodput


@pytest.mark.slow  # fifteen runs of 8B on one trn2 instance, each run whole and as a trial
@settings(max_examples=15, deadline=None)
@given(replicas=st.integers(1, 3), rate=st.sampled_from([2.0, 6.0, 12.0, 30.0]),
       ttft=st.sampled_from(["200ms", "1s"]), goodput=st.sampled_from([0.5, 0.9, 0.99]))
def test_a_trial_decides_as_the_whole_run_and_finishes_as_it(replicas, rate, ttft, goodput):
    scenario = _small(replicas, rate, ttft)
    whole = _whole(simulate(scenario).summary["deployments"]["chat"])
    trial = SloTrial("chat", goodput)
    result = simulate(scenario, serving_trial=trial)
    if trial.stopped:
        # stopped: the whole run does miss the target, by at least the misses counted
        assert whole["slo_goodput"] < goodput
        assert whole["slo_goodput"] <= 1 - trial.missed / whole["requests"]
        trial.finish()
        assert not trial.stopped
        assert _whole(deployment_figures(scenario, result.serving)["chat"]) == whole
    else:  # ran to its end: the same events, the same figures
        assert _whole(result.summary["deployments"]["chat"]) == whole


def test_an_overloaded_trial_stops_early_and_a_held_one_does_not():
    overloaded = SloTrial("chat", 0.99)
    simulate(_small(1, 40.0), serving_trial=overloaded)
    assert overloaded.stopped and overloaded.stopped_at_s < 60.0  # of a 2-minute horizon
    held = SloTrial("chat", 0.5)
    simulate(_small(2, 2.0), serving_trial=held)
    assert not held.stopped


# --- the search, with a stand-in simulate: a count holds from `need` replicas up ----------


def _fake(need: int):
    def run(scenario: Any, *, serving_trial: Any = None) -> Any:
        d = scenario.serve[0]
        holds = d.replicas >= need
        figures = {"slo_goodput": 1.0 if holds else 0.5, "saturated": not holds,
                   "instances": -(-d.tp * d.pp * d.replicas
                                  // scenario.hardware.ranks_per_instance)}
        return SimpleNamespace(summary={"deployments": {d.name: figures}})
    return run


def _task(need: int, bound: int, best: float | None, tp: int = 16) -> CandidateTask:
    spec = catalog_entry("trn2")
    shape = _Shape("trn2", "trn2", spec, tp, 1, 64, replicas_bound=bound)
    raw = copy.deepcopy(SMALL)
    return CandidateTask(shape, raw, raw["serve"][0], "test", None, _fake(need), 0.99, "chat",
                         best)


@settings(max_examples=60, deadline=None)
@given(need=st.integers(1, 40), bound=st.integers(1, 40), tp=st.sampled_from([4, 16, 64]),
       best=st.one_of(st.none(), st.sampled_from([1.0, 2, 3, 5, 8, 13]).map(
           lambda k: k * catalog_entry("trn2").instance.price_per_hour_usd)))
def test_settling_a_looser_search_gives_the_one_at_a_time_answer(need, bound, tp, best):
    """A search started with no best, settled against `best`, is the search started with
    `best`: the same answer, or given up on cost after the same trials; and one given up on
    cost could not have won (it needs more replicas than cost `best`)."""
    loose = search_candidate(_task(need, bound, None, tp))
    tight = search_candidate(_task(need, bound, best, tp))
    shape = _task(need, bound, best, tp).shape
    settled = settle(shape, loose, best)
    if tight["outcome"] is None:
        assert settled is None and shape.why.startswith("cost: ")
        assert shape.simulations == len(tight["trials"])
        assert loose["trials"][: len(tight["trials"])] == tight["trials"]
        if loose["outcome"] is not None and loose["outcome"]["holds"]:
            assert loose["outcome"]["rank_cost"] > best
    else:
        assert settled is not None and not shape.why
        assert settled == loose["outcome"] == tight["outcome"]
        assert loose["trials"] == tight["trials"]
    if loose["outcome"] is not None and loose["outcome"]["holds"]:
        # the fewest that hold, unless the cap on trials stopped the bisection first
        assert loose["outcome"]["replicas"] >= need
        if loose["outcome"]["simulations"] < MAX_SIMULATIONS_PER_CANDIDATE:
            assert loose["outcome"]["replicas"] == need
        # the cost the figures charge: instances x price
        outcome = loose["outcome"]
        assert outcome["rank_cost"] == rank_cost(shape, outcome["replicas"]) == (
            outcome["instances"] * shape.spec.instance.price_per_hour_usd)


def seventy_b_at_20() -> Any:
    """Llama 3.1 70B at 20 requests/s for a minute (serving-llama-trn2.yaml's first
    deployment): a plan of seconds that gives candidates up on cost."""
    raw = yaml.safe_load((ROOT / "scenarios" / "serving-llama-trn2.yaml").read_text())
    raw["serve"] = raw["serve"][:1]
    raw["cluster"] = {"instances": 2}
    raw["duration"] = "1min"
    raw["serve"][0]["workload"]["rate"] = "20/s"
    return scenario_from_dict(raw)


@pytest.mark.slow  # a plan twice (serial, then two processes): about 10 s of CPU
def test_the_plan_on_two_processes_is_the_serial_plan():
    scenario = seventy_b_at_20()
    options = ServingPlanOptions(hardware=("trn2",), top=2)
    serial = plan_serving(scenario, options, None, simulate=simulate)
    with Engine("local", workers=2) as engine:
        pooled = plan_serving(scenario, options, None, simulate=simulate, engine=engine)
    assert pooled.as_json() == serial.as_json()
    pd.testing.assert_frame_equal(pooled.rows, serial.rows)
    # candidates given up on cost, each after the trials it ran
    cut = serial.rows[serial.rows["why"].str.startswith("cost: ", na=False)]
    assert len(cut) and (cut["simulations"] >= 1).all()
    assert (cut["status"] == "pruned").all()
    assert serial.best["capacity_rate_per_s"] is not None


def test_the_serving_plan_takes_the_engine_options_and_checks_them(tmp_path):
    """--engine, --workers and --address are the serving plan's too (they were ignored: any
    --engine passed), checked before any work."""
    from typer.testing import CliRunner

    from clustersim.cli.app import app

    scenario = tmp_path / "serve.yaml"
    scenario.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    for args, says in ((["--engine", "spark"], "--engine 'spark': expected local or ray"),
                       (["--address", "h:1"], "used only with --engine ray")):
        result = CliRunner().invoke(app, ["plan", str(scenario), "-o", str(tmp_path / "p"),
                                          *args])
        assert result.exit_code == 2, result.output
        assert says in " ".join(result.output.split())


@pytest.mark.slow  # two rate searches of 8B on one trn2 replica: about 6 s
def test_a_rate_search_stopping_early_finds_the_same_rate():
    from clustersim.serving.capacity import find_rate

    scenario = _small(1, 8.0, "500ms")
    whole = find_rate(scenario, None, 0.99, None, bisections=4)
    early = find_rate(scenario, None, 0.99, None, bisections=4, stop_early=True)
    assert whole.rate_per_s is not None
    assert early.rate_per_s == whole.rate_per_s
    assert _whole(early.figures) == _whole(whole.figures)
    assert [rate for rate, _ in early.tried] == [rate for rate, _ in whole.tried]
    # some runs did stop early (their share so far is under the whole run's)
    assert any(e < w for (_, e), (_, w) in zip(early.tried, whole.tried, strict=True))
