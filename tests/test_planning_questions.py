"""The planner on real questions: any layer count, constraints nothing meets, spares as a
share, sizes without a cluster, dominated candidates, recipe layouts."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.planning import PlanOptions, plan
from clustersim.planning.planner import spares_for
from clustersim.scenario.loader import scenario_from_dict

runner = CliRunner()
TINY = {"name": "tiny", "layers": 8, "hidden": 256, "heads": 4, "vocab": 8000, "seq_len": 1024}


def _raw(layers: int = 8, **top) -> dict:
    raw = {"name": "q", "hardware": "trn1", "cluster": {"instances": 1, "spares": 1},
           "jobs": [{"name": "train", "model": {**TINY, "layers": layers}, "global_batch": 32}],
           "failures": {"preset": "llama3"}}
    raw.update(top)
    return raw


@pytest.mark.slow
@pytest.mark.parametrize("layers", [1, 160])
def test_any_layer_count_plans(layers):
    """One layer (no pipeline at all) and 160 (interleave capped at 64, uneven stages)."""
    result = plan(scenario_from_dict(_raw(layers), planning=True), PlanOptions(top=3))
    assert result.ranked
    rows = result.rows
    assert rows["interleave"].max() <= 64
    assert (rows["pp"] * rows["interleave"] <= layers).all() or (
        rows[rows["pp"] * rows["interleave"] > layers]["why"].str.startswith("divisibility")
    ).all()


@pytest.mark.slow
def test_uneven_stages_are_searched():
    """126 layers on 32 ranks: pp 4, 8, 16 and 32 do not divide them, and are not pruned for
    it."""
    result = plan(scenario_from_dict(_raw(126), planning=True), PlanOptions(top=3))
    rows = result.rows
    uneven = rows[(126 % rows["pp"]) != 0]
    assert len(uneven) and not uneven["why"].str.contains("layers").any()


def test_a_deadline_nothing_meets_writes_the_plan_and_exits_0(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text(json.dumps(_raw()))
    out = tmp_path / "out"
    done = runner.invoke(app, ["plan", str(path), "--tokens", "1T", "--deadline", "1h",
                               "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert "nothing meets the constraints" in done.output.splitlines()[0]
    shown = json.loads((out / "plan.json").read_text())
    assert shown["meets_constraints"] is False
    assert shown["candidates"] and shown["candidates"][0]["meets"] is False
    frame = pd.read_parquet(out / "plan.parquet")
    simulated = frame[frame["status"] == "simulated"]
    assert len(simulated) and not simulated["meets"].any()
    assert simulated["unmet"].str.startswith("deadline").all()


def test_spares_are_a_share_of_every_size():
    s = scenario_from_dict(_raw(cluster={"instances": 40, "spares": "5%"}), planning=True)
    assert s.cluster.spares == 2 and s.spares_share == pytest.approx(0.05)
    assert spares_for(s, s.hardware, 400) == 20
    counted = scenario_from_dict(_raw(cluster={"instances": 40, "spares": 4}), planning=True)
    assert spares_for(counted, counted.hardware, 400) == 40
    from clustersim.hardware.catalog import catalog_entry
    assert spares_for(s, catalog_entry("trn2u"), 64) == 4  # one whole UltraServer
    with pytest.raises(Exception, match="share"):
        scenario_from_dict(_raw(cluster={"instances": 40, "spares": "five"}))


def test_chips_are_enough_without_a_cluster(tmp_path):
    raw = _raw()
    del raw["cluster"]
    s = scenario_from_dict(raw, planning=True)
    result = plan(s, PlanOptions(chips=(16,), top=2))
    assert [g.chips for g in result.groups] == [16]
    with pytest.raises(Exception, match="--chips"):
        plan(s, PlanOptions())
    raw["cluster"] = {"spares": "10%"}
    s = scenario_from_dict(raw, planning=True)
    assert s.spares_share == pytest.approx(0.1)


def test_dominated_candidates_leave_the_ranked_list():
    result = plan(scenario_from_dict(_raw(), planning=True), PlanOptions(top=50))
    ranked = result.ranked
    for a in ranked:
        for b in ranked:
            if a is b or (a["hardware"], a["chips"]) != (b["hardware"], b["chips"]):
                continue
            assert not (b["step_time_s"] <= a["step_time_s"]
                        and b["memory_per_chip_gib"] <= a["memory_per_chip_gib"]
                        and (b["step_time_s"], b["memory_per_chip_gib"])
                        != (a["step_time_s"], a["memory_per_chip_gib"]))
    assert result.rows["dominated"].fillna(False).any()


@pytest.mark.slow
def test_nxd_recipe_layout_is_evaluated_and_located(tmp_path):
    """NeuronX Distributed's Llama 3 70B recipe on trn2: TP 32, PP 4 (here DP 2 on 4
    instances): `step` evaluates it, and `plan` has it as its reference row."""
    raw = {"name": "nxd-70b", "hardware": "trn2", "cluster": {"instances": 4},
           "jobs": [{"name": "train", "model": "llama3-70b", "seq_len": 8192,
                     "global_batch": 32, "recompute": "full",
                     "parallelism": {"tp": 32, "pp": 4, "dp": 2, "zero": 1,
                                     "sequence_parallel": True}}]}
    path = tmp_path / "nxd.yaml"
    path.write_text(json.dumps(raw))
    done = runner.invoke(app, ["step", str(path), "--json"])
    assert done.exit_code == 0, done.output
    result = plan(scenario_from_dict(raw, planning=True), PlanOptions(top=3))
    reference = result.rows[result.rows["reference"]]
    assert len(reference) == 1 and reference.iloc[0]["step_time_s"] > 0
