"""The planner on a DeepSeek-V3-class pre-training job: expert parallelism searched with its
all-to-all and its rank order, and the README's figures of it (slow: each plan screens
250,000-800,000 candidates; each scenario is planned once per module)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from clustersim.hardware.catalog import catalog_entry
from clustersim.planning.ettr import renewal_ettr
from clustersim.planning.outputs import best_scenario
from clustersim.planning.planner import PlanOptions, plan, recovery_for
from clustersim.planning.simulate import simulate_task
from clustersim.planning.space import Candidate, job_for, tp_domain_ranks
from clustersim.scenario.loader import load_scenario, scenario_from_dict
from clustersim.training.ranks import expert_group_ranks, expert_groups_by_split, rank_chips

ROOT = Path(__file__).resolve().parent.parent
_WORDS = {2: "two", 3: "three", 4: "four"}
_ORDINALS = {2: "second", 4: "fourth", 8: "eighth", 16: "sixteenth"}
TRN2 = catalog_entry("trn2")


def _readme_mixture() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return " ".join(text.split("**A mixture of experts**")[1].split("\n## ")[0].split())


def _planning_mixtures() -> str:
    text = (ROOT / "docs/planning.md").read_text(encoding="utf-8")
    return " ".join(text.split("## Mixtures of experts")[1].split("\n## ")[0].split())


def _plan(name: str):
    scenario = load_scenario(ROOT / f"scenarios/{name}.yaml", planning=True)
    return plan(scenario, PlanOptions(top=10))


@pytest.fixture(scope="module")
def trn2():
    return _plan("plan-deepseek-v3-trn2")


@pytest.fixture(scope="module")
def p5en():
    scenario = load_scenario(ROOT / "scenarios/plan-deepseek-v3-trn2.yaml", planning=True)
    return plan(scenario, PlanOptions(top=10, hardware=("p5en",)))


@pytest.fixture(scope="module")
def trn3():
    return _plan("plan-deepseek-v3-trn3")


def _layout(best: dict) -> str:
    inside = (" inside each instance" if best["order"] == "tp-cp-ep-pp-dp" else "")
    return (f"TP {best['tp']}, CP {best['cp']}, PP {best['pp']}, DP {best['dp']:,} with expert "
            f"parallelism {best['ep']}{inside}, ZeRO-{best['zero']}, micro-batch "
            f"{best['micro_batch']}")


@pytest.mark.slow
def test_deepseek_v3_on_trn2_plans_expert_parallelism(trn2) -> None:
    """Issue 31: ep > 1 on 16,384 Trn2 chips, its all-to-all inside the instance (order
    tp-cp-ep-pp-dp) rather than over EFA; the table's all-to-all is the step's exposed ep."""
    best = trn2.best
    assert best["ep"] > 1 and best["all_to_all_s"] > 0
    assert best["order"] == "tp-cp-ep-pp-dp"
    assert best["tp"] * best["cp"] * best["ep"] <= 64  # the group inside one trn2.48xlarge
    # the same layout strided over instances is bounded (or simulated) slower
    twin = _twin(trn2)
    assert (twin["step_time_s"] > best["step_time_s"]) or twin["bound_s"] >= best["step_time_s"]
    # --write-scenario keeps the order, and the scenario it writes loads
    written = best_scenario(trn2)
    assert written["jobs"][0]["parallelism"]["order"] == "tp-cp-ep-pp-dp"
    job = scenario_from_dict(written, "written").jobs[0]
    assert job.parallelism.order == "tp-cp-ep-pp-dp" and job.parallelism.ep == best["ep"]


def _twin(result):
    """The best's row in the default rank order (the same everything else)."""
    best, rows = result.best, result.rows
    same = rows["order"] == "tp-cp-pp-dp"
    for key in ("hardware", "chips", "tp", "cp", "pp", "dp", "ep", "interleave", "micro_batch",
                "recompute", "sequence_parallel", "zero"):
        same &= rows[key] == best[key]
    assert same.sum() == 1
    return rows[same].iloc[0]


@pytest.mark.slow
def test_deepseek_v3_on_trn2_plans_as_the_readme_and_planning_say(trn2) -> None:
    best = trn2.best
    twin = _twin(trn2)
    strided = rank_chips(TRN2, expert_group_ranks(SimpleNamespace(
        tp=best["tp"], cp=best["cp"], pp=best["pp"], dp=best["dp"], ep=best["ep"],
        order="tp-cp-pp-dp")), np.arange(best["chips"] // 16)) // 16
    for quoted in (_readme_mixture(), _planning_mixtures()):
        assert _layout(best) in quoted
        assert (f"{best['step_time_s']:.2f} s per step (MFU {best['mfu']:.1%}, ETTR "
                f"{best['ettr']:.3f})") in quoted
        assert f"leaving {best['all_to_all_s']:.2f} s of all-to-all exposed" in quoted
        assert f"strided over {len(set(strided.tolist()))} instances" in quoted
        assert f"cannot step in under {twin['bound_s']:.2f} s (its lower bound)" in quoted
    planning = _planning_mixtures()
    assert f"{trn2.considered:,} candidates considered, {trn2.simulated} simulated" in planning
    # the best layout without expert parallelism (the plan's best before the order)
    old = Candidate("trn2", best["chips"], 16, 32, 128, 1, 1, 2, "none", True, 2)
    group = trn2.groups[0]
    figures = simulate_task((group.key, [job_for(trn2.scenario.jobs[0], old)]))[0]
    assert (f"TP 16, PP 32, DP 128 at {figures['step_time_s']:.2f} s, MFU "
            f"{figures['mfu']:.1%}") in planning
    if best["cp"] > 1:  # the same layout's context ranks folded into data parallelism
        folded = Candidate("trn2", best["chips"], best["tp"], best["pp"], best["dp"] * best["cp"],
                           best["ep"] * best["cp"], 1, best["micro_batch"], best["recompute"],
                           bool(best["sequence_parallel"]), best["zero"], 1, best["order"])
        cp1 = simulate_task((group.key, [job_for(trn2.scenario.jobs[0], folded)]))[0]
        assert cp1["step_time_s"] > best["step_time_s"]
        assert (f"Context parallelism beats CP 1 (TP {best['tp']}, PP {best['pp']}, DP "
                f"{folded.dp:,} with expert parallelism {folded.ep}, "
                f"{cp1['step_time_s']:.2f} s)") in planning


@pytest.mark.slow
def test_deepseek_v3_on_trn3_plans_expert_parallelism_as_the_readme_says(trn3) -> None:
    """The Trn3 plan's best keeps every expert group inside one NeuronSwitch domain; the
    layout best while rank 0's group stood for all (groups straddling two UltraServers,
    now costed over EFA: collectives.uneven) is slower, as README and planning.md say."""
    best = trn3.best
    hw = trn3.groups[0].hw
    assert best["ep"] > 1 and best["all_to_all_s"] > 0
    span = best["tp"] * best["cp"] * best["pp"] * best["ep"]
    domain = tp_domain_ranks(hw)
    assert best["order"] == "tp-cp-pp-dp" and domain % span == 0  # every group inside
    quoted, planning = _readme_mixture(), _planning_mixtures()
    figures = (f"{best['step_time_s']:.2f} s per step (MFU {best['mfu']:.1%}, ETTR "
               f"{best['ettr']:.3f})")
    layout = (f"TP {best['tp']}, CP {best['cp']}, PP {best['pp']}, DP {best['dp']:,} with "
              f"expert parallelism {best['ep']}, ZeRO-{best['zero']}")
    assert f"{layout}, at {figures}" in quoted and f"{layout}, at {figures}" in planning
    assert (f"every expert group ({span} ranks) inside one UltraServer's NeuronSwitch "
            f"leaving {best['all_to_all_s']:.2f} s of all-to-all exposed") in quoted
    assert f"leaving {best['all_to_all_s']:.2f} s of all-to-all exposed" in planning
    assert f"expert groups are {span} ranks" in planning
    assert f"tile a {domain}-rank domain" in planning
    assert f"{trn3.considered:,} candidates considered, {trn3.simulated} simulated" in planning
    # the best layout with ZeRO-3: each rank gathers its own experts every layer
    def simulated(candidate: Candidate) -> dict:
        return simulate_task((trn3.groups[0].key, [job_for(trn3.scenario.jobs[0],
                                                           candidate)]))[0]

    assert best["zero"] != 3
    zero3 = simulated(Candidate("trn3-gen2", best["chips"], best["tp"], best["pp"], best["dp"],
                                best["ep"], 1, best["micro_batch"], best["recompute"],
                                bool(best["sequence_parallel"]), 3, best["cp"]))
    assert zero3["step_time_s"] > best["step_time_s"]
    assert f"with ZeRO-3 the same layout steps in {zero3['step_time_s']:.2f} s" in quoted
    assert (f"({zero3['memory_per_chip_gib']:.0f} GiB per chip against "
            f"{best['memory_per_chip_gib']:.0f}) steps in {zero3['step_time_s']:.2f} s") in planning
    holders = best["dp"] * best["cp"] // best["ep"]  # context ranks hold the same experts
    assert f"{holders:,} ranks holding them (both context ranks of every " \
        f"{_ORDINALS[best['ep']]} data-parallel rank)" in planning
    # the layout planned before the straddling groups were costed: its experts' holders
    # (192 ranks, 24 instances apart) split unevenly over the UltraServers
    was = simulated(Candidate("trn3-gen2", best["chips"], 4, 3, 3072, 16, 1, 1, "none",
                              True, 3, 2))
    assert "asymmetric group" in was["unplaceable"]
    assert "cannot be placed" in quoted
    apart = 4 * 2 * 3 * 16 // hw.ranks_per_instance  # tp x cp x pp x ep ranks, in instances
    assert (f"and the {3072 // 16} ranks holding the same experts, {apart} instances apart, "
            "split") in planning
    span = 4 * 2 * 3 * 16
    assert domain % span and f"groups are {span} ranks and a domain is {domain} ranks" in (
        planning)
    par = SimpleNamespace(tp=4, cp=2, pp=3, dp=3072, ep=16, order="tp-cp-pp-dp")
    placed = np.arange(best["chips"] // hw.chips_per_instance)
    unit = hw.chips_per_instance * hw.instances_per_ultraserver
    splits = [np.unique(rank_chips(hw, g, placed) // unit, return_counts=True)[1].tolist()
              for g in expert_groups_by_split(hw, par, placed)]
    assert splits == [[16], [8, 8]]  # inside, and straddling 8 / 8
    period = math.lcm(span, domain) // span
    last = 15 * 4 * 2 * 3  # a group's last rank
    across = sum((span * k) // domain != (span * k + last) // domain for k in range(period))
    assert f"one group in {_WORDS[period // across]}" in planning
    assert f"one group in {_WORDS[period // across]} split 8 / 8" in quoted
    assert "straddles two UltraServers, split 8 / 8" in planning
    c2, c3 = TRN2.collectives, hw.collectives
    assert (f"a {c3.efa_step_latency_s * 1e6:.0f} us step and {c3.efa_efficiency:.3f} of the "
            f"NIC, from an earlier Trn1 fit; Trn2's own fit has "
            f"{c2.efa_step_latency_s * 1e6:.0f} us and {c2.efa_efficiency:.3f}") in planning
    assert 128 == 4 * 2 * 16 and "tp x cp x ep = 128 ranks does not tile 576" in planning


def test_the_spares_figures_are_the_ettr_models() -> None:
    """docs/planning.md's hot spares and ETTR figures, from the plan's recovery model."""
    planning = _planning_mixtures()
    scenario = load_scenario(ROOT / "scenarios/plan-deepseek-v3-trn2.yaml", planning=True)
    job, hw, n = scenario.jobs[0], scenario.hardware, scenario.working_instances

    def recovery(spares: str):
        s = load_scenario(ROOT / "scenarios/plan-deepseek-v3-trn2.yaml",
                          [f"cluster.spares={spares}"], planning=True)
        return recovery_for(s, hw, job, n, False)

    none = recovery("0")
    assert f"recovery ({none.recovery_s / 3600:.2f} h on Trn2)" in planning
    assert f"MTBF ({none.mtbf_s / 3600:.2f} h)" in planning
    assert none.recovery_s > none.mtbf_s
    assert f"ETTR falls to {renewal_ettr(none):.3f}" in planning
    assert f"{none.hardware_rate_per_s * none.repair_s:.2f} instances" in planning
    ettr = {k: renewal_ettr(recovery(str(k))) for k in (1, 2, 4, 7, 8)}
    assert (f"ETTR {ettr[1]:.3f} with one spare, {ettr[2]:.3f} with two, {ettr[4]:.3f} with "
            f"four and {ettr[8]:.3f} from eight on") in planning
    assert ettr[7] < ettr[8]  # "from eight on": the ceiling to three digits
    own = renewal_ettr(recovery_for(scenario, hw, job, n, False))
    five = renewal_ettr(recovery("5%"))
    assert f"{ettr[8]:.3f}" == f"{own:.3f}" == f"{five:.3f}"
    assert f"1% ({scenario.cluster.spares} Trn2 instances" in planning


@pytest.mark.slow
def test_deepseek_v3_trn2_against_p5en_as_the_readme_says(trn2, p5en) -> None:
    """The README's comparison: the same job at the same chip count, each at its best."""
    trn, gpu = trn2.best, p5en.best
    assert gpu["hardware"] == "p5en" and gpu["chips"] == trn["chips"]
    quoted = _readme_mixture()
    inside = " inside each instance" if gpu["order"] == "tp-cp-ep-pp-dp" else ""
    assert (f"TP {gpu['tp']}, CP {gpu['cp']}, PP {gpu['pp']}, DP {gpu['dp']:,} with expert "
            f"parallelism {gpu['ep']}{inside}, at {gpu['step_time_s']:.2f} s per step (MFU "
            f"{gpu['mfu']:.1%}), {gpu['all_to_all_s']:.2f} s of all-to-all exposed") in quoted
    assert (f"${gpu['cost_usd']:.2f} per million tokens against Trn2's "
            f"${trn['cost_usd']:.2f}") in quoted
    assert f"{gpu['cost_usd'] / trn['cost_usd']:.2f} times P5en's tokens per dollar" in quoted
    assert trn["mfu"] < gpu["mfu"] / 2  # "its MFU under half the GPUs'"
    # "a gap inside Trn2's expected step band": Trn2 at the band's edge would cost P5en's
    low, high = trn2.rows.loc[trn2.rows["step_time_s"] == trn["step_time_s"],
                              "step_time_s_band"].iloc[0]
    ratio = gpu["cost_usd"] / trn["cost_usd"]
    assert low / trn["step_time_s"] < ratio < high / trn["step_time_s"]
    assert "a gap inside Trn2's expected step band" in quoted
    row = trn2.rows[(trn2.rows["step_time_s"] == trn["step_time_s"])].iloc[0]
    assert (row["bubble_s"] + row["exposed_comm_s"]) / row["step_time_s"] > 0.5  # "mostly"
    assert "Trn2 gives 1.52 times the tokens per dollar" in " ".join(
        (ROOT / "README.md").read_text(encoding="utf-8").split())  # the dense row it cites
