"""The serving planner searches a mixture's expert parallelism: the ep values a deployment
accepts (scenario.serving's rule, nothing else), shown and written with the answer; a dense
model's candidates and answers are those it had before."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from test_serving_plan import SMALL
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.hardware.catalog import catalog_entry
from clustersim.planning import serving_space as sp
from clustersim.scenario import ScenarioError, scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
MOE = ROOT / "scenarios" / "plan-serving-qwen3-moe.yaml"
MIXTURES = ("mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "llama4-scout",
            "llama4-maverick", "gpt-oss-20b", "gpt-oss-120b")


def _with(raw: dict[str, Any], **deployment: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    out["serve"][0].update(deployment)
    return out


def _deployment(model: str) -> Any:
    return scenario_from_dict(_with(SMALL, model=model, parallelism={"tp": 8}), "x").serve[0]


def _ep_refused(model: str, hardware: str, tp: int, ep: int) -> bool:
    """Whether the scenario's validation refuses `ep` for this tp (its parallelism.ep key)."""
    raw = _with(SMALL, model=model, parallelism={"tp": tp, "ep": ep})
    raw["hardware"] = hardware
    try:
        scenario_from_dict(raw, "x")
    except ScenarioError as error:
        return "parallelism.ep" in str(error)
    return False


@pytest.mark.parametrize("model", MIXTURES)
def test_the_ep_candidates_are_exactly_those_the_deployment_accepts(model):
    """Every divisor of a candidate's tp is proposed as its ep if and only if a deployment
    with that tp and ep passes validation (the validator, not a copy of its rule, decides);
    so an ep that does not divide the experts (Mixtral's 8 at tp 16, Llama 4 Scout's 16 at
    tp 32) is never proposed, and ep never exceeds tp (its groups are the tp ranks)."""
    d = _deployment(model)
    spec = catalog_entry("trn2u")  # a 256-rank domain: tp up to 256
    shapes = sp._shapes("trn2u", "trn2u", spec, (64,), d)
    proposed: dict[int, set[int]] = {}
    for shape in shapes:
        proposed.setdefault(shape.tp, set()).add(shape.ep)
    assert max(proposed) == 256
    refused_somewhere = False
    for tp, eps in proposed.items():
        divisors = {e for e in range(1, tp + 1) if tp % e == 0}
        accepted = {e for e in divisors if not _ep_refused(model, "trn2u", tp, e)}
        assert eps == accepted, (model, tp, sorted(eps), sorted(accepted))
        refused_somewhere |= accepted != divisors
    experts = d.model.experts
    assert refused_somewhere == (experts < 256), model  # e.g. 8 or 16 experts, tp 256
    # Each (tp, pp, max_batch) appears once per proposed ep.
    keys = [(s.tp, s.pp, s.max_batch, s.ep) for s in shapes]
    assert len(keys) == len(set(keys))


def test_a_dense_models_candidates_are_unchanged():
    """A dense model: no ep on any shape (None: no `ep` key written, no `ep` column), the
    same tp x pp x max_batch grid as before ep was searched."""
    d = scenario_from_dict(SMALL, "x").serve[0]
    spec = catalog_entry("trn2")
    shapes = sp._shapes("trn2", "trn2", spec, sp.BATCHES, d)
    batches = sorted(set(sp.BATCHES) | {d.server.max_batch})
    grid = [(2 ** k, pp, b) for k in range(7) for pp in sp.PIPELINE for b in batches]
    assert [(s.tp, s.pp, s.max_batch) for s in shapes] == grid
    assert {s.ep for s in shapes} == {None}
    mapping = sp._raw_variant(SMALL, SMALL["serve"][0], "trn2", 8, 1, 1, 64, 1)
    assert mapping["serve"][0]["parallelism"] == {"tp": 8, "pp": 1}


def test_the_rate_bound_holds_for_expert_parallel_shapes():
    """The pruning bound's rate is at least what any batch whose decode iteration meets the
    TPOT bound gives, for every ep of a mixture too (the iteration's time grows with the
    batch under expert parallelism as without it: the bisection and the sampled minimum
    rely on it)."""
    from clustersim.serving.simulate import replica_models

    raw = yaml.safe_load(MOE.read_text())
    scenario = scenario_from_dict(raw, "moe")
    load, mean_in, mean_out, longest, kth_in = sp._load(scenario, 0, None, 0.99)
    spec = catalog_entry("trn2")
    checked = set()
    for shape in sp._shapes("trn2", "trn2", spec, (256,), scenario.serve[0]):
        if shape.pp != 1 or shape.tp != 8 or shape.max_batch != 256:
            continue  # (the scenario's own max_batch, 64, is a shape too)
        one = scenario_from_dict(sp._raw_variant(raw, raw["serve"][0], "trn2", shape.tp, 1, 1,
                                                 256, 1, shape.ep), "one")
        sp._bound(shape, one, load, mean_in, mean_out, longest, kth_in, 0.99)
        assert not shape.why, shape.why
        cost, capacity, _ = replica_models(one, one.serve[0])
        tpi = cost.tokens_per_iteration
        most = max(1, min(256, int(capacity // mean_in)))
        per_token = min(cost.run_s(b, b * mean_in, 1) / (b * tpi) for b in range(1, most + 1)
                        if cost.run_s(b, b * mean_in, 1) / tpi <= one.serve[0].slo.tpot_s)
        prefill = cost.target.prefill_s(int(mean_in)) - cost.target.prefill_s(1)
        rate = 1.0 / (0.5 * prefill + (mean_out - 1) * per_token)
        assert shape.rate_bound_per_s >= rate * (1 - 1e-9), shape.ep
        checked.add(shape.ep)
    assert checked == {1, 2, 4, 8}


# ---------------------------------------------------------------------------------------------
# A plan of the mixture: ep > 1 where it is cheaper, and the scenario written serves so


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def _figures(folder: Path, *args: Any) -> dict[str, Any]:
    result = invoke("run", *args, "-o", folder, "--force")
    assert result.exit_code == 0, result.output
    return json.loads((folder / "summary.json").read_text())["deployments"]["chat"]


@pytest.fixture(scope="module")
def moe_plan(tmp_path_factory) -> dict[str, Any]:
    """`clustersim plan` of the mixture with --write-scenario; `run` of the scenario written,
    and of it with ep 1 (everything else as written)."""
    folder = tmp_path_factory.mktemp("moeplan")
    written = folder / "best.yaml"
    result = invoke("plan", MOE, "-o", folder / "plan", "--write-scenario", written)
    assert result.exit_code == 0, result.output
    plan = json.loads((folder / "plan" / "plan.json").read_text())
    best = plan["best"]
    return {"plan": plan, "table": result.stdout, "written": written,
            "rows": pd.read_parquet(folder / "plan" / "plan.parquet"),
            "run": _figures(folder / "run", written),
            "run_ep1": _figures(folder / "run-ep1", written, "--set", "serve.0.parallelism="
                                f"{{tp: {best['tp']}, pp: {best['pp']}, ep: 1}}")}


@pytest.fixture(scope="module")
def held_at_1() -> Any:
    """The same search with ep held at 1 (as the planner searched before), in this process."""
    from clustersim.planning.serving_plan import ServingPlanOptions, plan_serving
    from clustersim.runner.api import simulate

    scenario = scenario_from_dict(yaml.safe_load(MOE.read_text()), "moe")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sp, "_expert_parallelism", lambda tp, model: [1])
        return plan_serving(scenario, ServingPlanOptions(capacity=False), None,
                            simulate=simulate)


@pytest.mark.slow  # a plan of the mixture (about 10 s of CPU) and two runs of its answer
def test_the_written_ep_is_run_at_the_figures_planned_and_ep_1_misses_the_slo(moe_plan):
    """The scenario written has the chosen ep, and `run` on it gives the figures the plan
    reported (the same simulation, the same seed). The same replicas at ep 1 (everything
    else as written) keep fewer than 99% of requests within the SLO: their decode iterations
    are slower (trn2's stack loads each token's experts by itself without expert parallelism,
    serving.experts.expert_loads), so the plan's ep is what lets that many replicas hold."""
    best, figures, at_1 = moe_plan["plan"]["best"], moe_plan["run"], moe_plan["run_ep1"]
    assert best["ep"] > 1
    serve = yaml.safe_load(moe_plan["written"].read_text())["serve"][0]
    assert serve["parallelism"] == {"tp": best["tp"], "pp": best["pp"], "ep": best["ep"]}
    assert figures["ep"] == best["ep"] and figures["replicas"] == best["replicas"]
    for key in ("ttft_p99_s", "tpot_p99_s", "slo_goodput", "cost_per_million_output_tokens_usd"):
        assert figures[key] == pytest.approx(best[key], rel=1e-9), key
    assert at_1["slo_goodput"] < 0.99 and at_1["tpot_p99_s"] > figures["tpot_p99_s"]
    # Every row has its ep (trn2: tp up to 64, every divisor of it divides 128 experts), none
    # pruned by the ep rule: no invalid ep was proposed.
    rows = moe_plan["rows"]
    assert rows["ep"].notna().all() and set(rows["ep"]) == {1, 2, 4, 8, 16, 32, 64}
    assert not rows["why"].fillna("").str.contains("parallelism.ep").any()
    header = next(line for line in moe_plan["table"].splitlines() if "hardware" in line)
    assert "tp pp ep" in header
    assert f"ep {best['ep']}, max batch" in moe_plan["table"]


@pytest.mark.slow  # two plans of the mixture in this process, and the one held at ep 1
def test_ep_is_chosen_where_it_is_cheaper_than_every_ep_1_configuration(held_at_1):
    """The same planner with ep held at 1 (the search as it was) finds a dearer best: its
    cheapest configuration costs more per hour than the ep > 1 answer, which therefore wins
    on cost, not on a tie. And the search is the same on a process pool (the bounds are
    computed on the engine too)."""
    from clustersim.planning.engine import Engine
    from clustersim.planning.serving_plan import ServingPlanOptions, plan_serving
    from clustersim.runner.api import simulate

    scenario = scenario_from_dict(yaml.safe_load(MOE.read_text()), "moe")
    options = ServingPlanOptions(capacity=False)
    searched = plan_serving(scenario, options, None, simulate=simulate)
    with Engine("local", workers=2) as engine:
        pooled = plan_serving(scenario, options, None, simulate=simulate, engine=engine)
    assert pooled.as_json() == searched.as_json()
    pd.testing.assert_frame_equal(pooled.rows, searched.rows)
    assert {r["ep"] for r in held_at_1.ranked} == {1}
    assert searched.best["ep"] > 1
    assert searched.best["usd_per_h"] < held_at_1.best["usd_per_h"]
    assert (searched.best["cost_per_million_output_tokens_usd"]
            < held_at_1.best["cost_per_million_output_tokens_usd"])


@pytest.mark.slow  # the plan, its runs and the plan held at ep 1 (the fixtures above)
def test_the_mixture_figures_in_planning_md_are_the_planners(moe_plan, held_at_1):
    """docs/planning.md quotes the mixture's plan, the ep-1 plan's best and the run of the
    best's replicas at ep 1."""
    page = " ".join((ROOT / "docs" / "planning.md").read_text("utf-8").split())
    plan, b, one, at_1 = moe_plan["plan"], moe_plan["plan"]["best"], held_at_1.best, \
        moe_plan["run_ep1"]
    quoted = (f"answers {b['replicas']} replicas of TP {b['tp']} with expert parallelism "
              f"{b['ep']} (max_batch {b['max_batch']}) on {b['instances']} instance at "
              f"${b['cost_per_million_output_tokens_usd']:.2f} per million output tokens "
              f"({b['slo_goodput']:.2%} of requests within the SLO), of {plan['considered']} "
              f"configurations considered; the table has a `tp pp ep` column and the written "
              f"scenario has `ep: {b['ep']}`")
    assert quoted in page, quoted
    quoted = (f"its best is {one['replicas']} replicas of TP {one['tp']} (max_batch "
              f"{one['max_batch']}) on {one['instances']} instances at "
              f"${one['cost_per_million_output_tokens_usd']:.2f}. The same {b['replicas']} "
              f"replicas without expert parallelism (the third command) keep "
              f"{at_1['slo_goodput']:.2%} of requests within the SLO, TPOT p99 "
              f"{at_1['tpot_p99_s'] * 1e3:.1f} ms against the 50 ms bound")
    assert quoted in page, quoted
    assert f"({held_at_1.considered} shapes become {plan['considered']} on trn2" in page
