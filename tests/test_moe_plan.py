"""The planner on a DeepSeek-V3-class pre-training job: expert parallelism searched with its
all-to-all, and the README's figures of it (slow: each plan screens 200,000-600,000
candidates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.planning.planner import PlanOptions, plan
from clustersim.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def _readme_mixture() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return " ".join(text.split("**A mixture of experts**")[1].split("\n## ")[0].split())


@pytest.mark.slow
def test_deepseek_v3_on_trn2_plans_expert_parallelism_as_the_readme_says() -> None:
    scenario = load_scenario(ROOT / "scenarios/plan-deepseek-v3-trn2.yaml", planning=True)
    best = plan(scenario, PlanOptions(top=3)).best
    assert best["ep"] > 1 and best["all_to_all_s"] > 0
    quoted = _readme_mixture()
    assert (f"TP {best['tp']}, CP {best['cp']}, DP {best['dp']:,} with expert parallelism "
            f"{best['ep']}") in quoted
    assert f"{best['step_time_s']:.2f} s per step (MFU {best['mfu']:.1%})" in quoted
    assert f"{best['all_to_all_s']:.2f} s is the experts' all-to-all" in quoted


@pytest.mark.slow
def test_deepseek_v3_on_trn3_plans_expert_parallelism_as_the_readme_says() -> None:
    scenario = load_scenario(ROOT / "scenarios/plan-deepseek-v3-trn3.yaml", planning=True)
    best = plan(scenario, PlanOptions(top=3)).best
    assert best["ep"] > 1 and best["all_to_all_s"] > 0
    quoted = _readme_mixture()
    assert (f"TP {best['tp']}, CP {best['cp']}, PP {best['pp']}, DP {best['dp']:,} with "
            f"expert parallelism {best['ep']}") in quoted
    assert f"{best['step_time_s']:.2f} s per step (MFU {best['mfu']:.1%})" in quoted
    assert f"NeuronSwitch leaving {best['all_to_all_s']:.2f} s exposed" in quoted
