"""The 2026 model surfaces under adversarial use (session 15): mixtures of experts, MLA,
windowed attention and expert parallelism in training and serving, found by trying them as
a demanding user would."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import invoke, write


def _deployment(**keys: object) -> dict:
    return {"name": "chat", "model": "qwen3-30b-a3b", "parallelism": {"tp": 8, "ep": 8},
            "replicas": 1,
            "workload": {"arrival": "poisson", "rate": "1/s", "input_tokens": 512,
                         "output_tokens": 64}, **keys}


def _scenario(tmp_path: Path, *serve: dict, **keys: object) -> Path:
    return write(tmp_path, {"name": "h15", "duration": "1min", "hardware": "trn2",
                            "cluster": {"instances": 1}, "serve": list(serve), **keys})


def _table(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


def test_a_fluid_deployments_run_table_line_names_its_expert_parallelism(tmp_path: Path
                                                                          ) -> None:
    """The request level's line says 'tp 8 x pp 1 (ep 8)'; the fluid level's said 'tp 8 x
    pp 1' for the same deployment, as if its experts were not split (summary.json had ep
    8 and the figures used it)."""
    out = tmp_path / "out"
    result = invoke("run", _scenario(tmp_path, _deployment(fidelity="fluid")), "-o", out)
    assert result.exit_code == 0, result.output
    assert "tp 8 x pp 1 (ep 8): " in _table(result.output), result.output


def test_a_serving_plan_on_part_of_an_ultraserver_says_what_a_whole_one_costs() -> None:
    """The serving planner charged a trn2u deployment its held instance (as `run` does) and
    said nothing of the three others of the UltraServer it must rent; found by harden15."""
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.planning.serving_plan import _part_ultraserver_notes

    specs = {name: catalog_entry(name) for name in ("trn2u", "trn2", "trn3-gen2")}
    rows = [{"hardware": "trn2u", "instances": 1}, {"hardware": "trn2u", "instances": 4},
            {"hardware": "trn2", "instances": 1}, {"hardware": "trn3-gen2", "instances": 5}]
    notes = _part_ultraserver_notes(rows, specs)
    assert len(notes) == 2  # trn2u's best (its first row) and trn3-gen2; trn2 has none
    assert notes[0].startswith("trn2u: its best holds 1 of an UltraServer's 4 instances")
    assert "4 instances ($143.04/h)" in notes[0]
    per = specs["trn3-gen2"].instances_per_ultraserver
    assert f"holds 5 of an UltraServer's {per} instances" in notes[1]  # (36 a Gen2 one)
    assert notes[1].endswith("if nothing else uses them")  # no price: no dollars
    assert _part_ultraserver_notes([{"hardware": "trn2u", "instances": 8}], specs) == []
    six, = _part_ultraserver_notes([{"hardware": "trn2u", "instances": 6}], specs)
    assert "holds 6 instances over 2 UltraServers of 4" in six
    assert "8 instances ($286.08/h)" in six


def test_fp8_activations_on_a_chip_without_an_fp8_peak_exit_2(tmp_path: Path) -> None:
    """`{weights: fp8, activations: fp8}` on p4d (A100, no FP8 peak) ran bf16 matmuls on
    1-byte activation traffic without a word; found by harden15. Weight-only fp8 (the
    activations left to their default, bf16) stays accepted."""
    from cli_helpers import refused

    dense = {"name": "chat", "model": "llama3-8b", "parallelism": {"tp": 8}, "replicas": 1,
             "workload": {"arrival": "poisson", "rate": "1/s", "input_tokens": 512,
                          "output_tokens": 64}}
    out = tmp_path / "out"
    both = _scenario(tmp_path, {**dense, "precision": {"weights": "fp8", "activations": "fp8"}},
                     hardware="p4d")
    refused(invoke("run", both, "-o", out), "serve.0.precision.activations", "no fp8 peak")
    assert not out.exists()
    weights_only = _scenario(tmp_path, {**dense, "precision": "fp8"}, hardware="p4d")
    result = invoke("run", weights_only, "-o", out)
    assert result.exit_code == 0, result.output


def _replica(model: str, hardware: str, tp: int, pp: int):
    from clustersim.hardware.build import build_topology
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.serving.iteration import IterationModel, ReplicaShape
    from clustersim.training.transformer import TransformerShape, model_preset_values

    spec = catalog_entry(hardware)
    shape = ReplicaShape(TransformerShape(**model_preset_values(model)), "bf16", tp, pp)
    return IterationModel(shape, build_topology(spec, 2 * spec.instances_per_ultraserver))


def test_serving_weights_per_chip_are_the_heaviest_stages() -> None:
    """With pp > 1 a replica's weights per chip were the average layer's times the layers per
    stage: DeepSeek-V3's three light dense layers all sit in its first stage, so at pp 2 the
    second stage (31 MoE layers and the output layer) holds 6.6% more than that said,
    and the KV capacity was overstated; found by harden15. Dense models whose stages split
    the layers evenly hold what they held."""
    import math

    from clustersim.training.layers import attention_parameters, layer_weights

    it = _replica("deepseek-v3", "trn2", 64, 2)
    m = it.shape.model
    moe_layer = attention_parameters(m) + 2 * m.hidden + layer_weights(m, True, False)
    second = (31 * moe_layer + m.vocab * m.hidden) / 64  # layers 30-60, all MoE
    per_chip = second * it.element_bytes * it.hardware.chip.ranks
    assert it.weight_bytes_per_chip() == pytest.approx(per_chip, rel=1e-12)
    embeddings = 1 if m.tied_embeddings else 2
    average = (m.parameter_count() - m.encoder_parameters - embeddings * m.vocab * m.hidden
               - m.hidden) / m.layers
    was = (30.5 * average + m.vocab * m.hidden) / 64 * it.element_bytes * it.hardware.chip.ranks
    assert 1.06 < per_chip / was < 1.07  # 31 layers of 11.5B, not 30.5 of their 11.0B mean
    dense = _replica("llama3.1-70b", "trn2", 8, 2)
    d = dense.shape.model
    flat = (d.parameter_count() - 2 * d.vocab * d.hidden - d.hidden) / d.layers
    expected = (40 * flat + d.vocab * d.hidden) / 8 * dense.element_bytes * min(
        dense.hardware.chip.ranks, 16)
    assert math.isclose(dense.weight_bytes_per_chip(), expected, rel_tol=1e-12)


# A fleet on which a jittered training segment of a fraction of a step drew a training time
# of a few 1e-300 s: its rate overflowed and its progress became NaN (review15's fuzzing).
NAN_FLEET = {
    "name": "hw7", "seed": 817, "hardware": "p5en", "duration": "2d",
    "cluster": {"instances": 8, "fabric": {"instances_per_leaf": 4, "oversubscription": 1.0},
                "spares": 4},
    "scheduler": {"policy": "fairshare", "preemption": True, "borrowing": False},
    "teams": [{"name": "a", "quota": 7}, {"name": "b"}, {"name": "c", "quota": 7, "share": 2}],
    "workload": {"arrivals": {"rate": "100/d", "until": "1d"}, "templates": [
        {"name": "tiny", "weight": 60, "instances": {"min": 1, "max": 3},
         "run_for": {"median": "1h", "sigma": 1.0}, "teams": {"a": 2, "b": 1, "c": 1},
         "job": {"model": "llama3-8b", "seq_len": 4096,
                 "parallelism": {"tp": 8, "pp": 1, "zero": 1}, "priority": 0,
                 "checkpoint": {"interval": "auto", "write": "30s", "restore": "2min",
                                "async": True}}},
        {"name": "mid", "weight": 30, "instances": [2, 4, 6],
         "run_for": {"median": "5h", "sigma": 1.0}, "teams": {"a": 1, "c": 2},
         "job": {"model": "llama3-8b", "seq_len": 4096,
                 "parallelism": {"tp": 8, "pp": 2, "zero": 1}, "priority": 2,
                 "checkpoint": {"interval": "auto", "write": "30s", "restore": "2min",
                                "async": True}}}]},
    "failures": {"preset": "llama3", "scale": 100.0, "detect": "2min", "restart": "5min",
                 "repair": "never"},
    "stragglers": {"fraction": 0.1, "slowdown": 1.5, "jitter": 0.05,
                   "transient": {"rate": "1/6h", "slowdown": 2.0, "duration": "20min"}},
}


def test_a_jittered_segment_of_a_fraction_of_a_step_keeps_progress_finite() -> None:
    """'internal error: ValueError: cannot convert float NaN to integer' at the end of this
    run (tiny-0089's progress): its segment's steps were credited as rate x seconds with a
    rate of steps over a 1e-300 s training time. Now as a share of the segment."""
    import math

    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import scenario_from_dict

    result = simulate(scenario_from_dict(NAN_FLEET))
    jobs = result.summary["jobs"]
    assert jobs and all(math.isfinite(j["steps_completed"]) and math.isfinite(j["goodput"])
                        for j in jobs.values())


def test_a_sliver_of_a_step_is_not_planned_again_and_again_at_one_instant(monkeypatch) -> None:
    """Up to a pace change a job had a fraction of a step left; the jitter's gamma, of a
    shape that small, drew nearly 0 s, so the segment ended where it began and was planned
    again: 180 segments at one instant on NAN_FLEET (a loop with no bound but chance)."""
    from collections import Counter

    from clustersim.cluster import job_periodic
    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import scenario_from_dict

    starts: Counter = Counter()
    credit = job_periodic.PeriodicTraining._credit_closed

    def counted(self, now: float) -> None:
        starts[(self.index, self.closed_segment[0])] += 1
        credit(self, now)

    monkeypatch.setattr(job_periodic.PeriodicTraining, "_credit_closed", counted)
    simulate(scenario_from_dict(NAN_FLEET))
    assert starts and max(starts.values()) <= 2, starts.most_common(3)


def test_a_trn3_replacement_from_another_ultraserver_does_not_end_the_run() -> None:
    """On Trn3 Gen2 a replacement instance from another NeuronSwitch UltraServer left a
    data-parallel group held 1 and 3 chips by two UltraServers: 'internal error:
    AsymmetricGroupError' mid-run (review15's fuzzing). The job keeps the step of its last
    solved placement, as a replacement of an unsimulated shape does."""
    import copy

    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import scenario_from_dict

    raw = copy.deepcopy(NAN_FLEET)
    raw.update({"hardware": "trn3-gen2", "seed": 526,
                "cluster": {"ultraservers": 3, "spares": 0,
                            "fabric": {"instances_per_leaf": 36, "oversubscription": 3.0}},
                "scheduler": {"policy": "backfill", "preemption": True, "borrowing": True}})
    raw["teams"][0]["quota"], raw["teams"][2]["quota"] = 75, 61
    raw["workload"]["arrivals"]["rate"] = "76/d"
    for template in raw["workload"]["templates"]:
        template["job"]["priority"] = 0
    raw["failures"].update({"scale": 1000.0, "repair": "30min"})
    summary = simulate(scenario_from_dict(raw)).summary
    assert summary["cluster"]["jobs"] > 0 and sum(summary["cluster"]["failures"].values()) > 0


def test_a_runnable_mixture_at_pp_2_holds_its_moe_stage() -> None:
    """Trinity-Large (60 layers, the first 6 dense) at TP 64 x PP 2 on trn2, a shape a
    scenario accepts (DeepSeek-V3's 61 layers do not split in 2): the second stage's 30 MoE
    layers and the output layer, not 30 mean layers; +10.8% per chip."""
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.training.layers import attention_parameters, layer_weights

    scenario_from_dict({  # accepted as a deployment
        "name": "t", "duration": "1min", "hardware": "trn2", "cluster": {"instances": 2},
        "serve": [{"name": "a", "model": "trinity-large", "parallelism": {"tp": 64, "pp": 2},
                   "workload": {"rate": "1/s", "input_tokens": 100, "output_tokens": 10}}]})
    it = _replica("trinity-large", "trn2", 64, 2)
    m = it.shape.model
    moe_layer = attention_parameters(m) + 2 * m.hidden + layer_weights(m, True, False)
    padding = 30 * it.heads.extra_attention_parameters_per_rank(m, 64)  # 48 heads over 64
    second = (30 * moe_layer + m.vocab * m.hidden) / 64 + padding
    per_chip = second * it.element_bytes * it.hardware.chip.ranks
    assert it.weight_bytes_per_chip() == pytest.approx(per_chip, rel=1e-12)
    mean = (m.parameter_count() - 2 * m.vocab * m.hidden - m.hidden) / m.layers
    was = ((30 * mean + m.vocab * m.hidden) / 64 + padding) * it.element_bytes \
        * it.hardware.chip.ranks
    assert per_chip / was == pytest.approx(1.108, abs=0.002)


def test_a_segments_steps_are_its_share_even_of_a_vanishing_training_time() -> None:
    """The closed form credited rate x seconds, the rate steps / training: 5e-7 steps over
    1e-320 s made an infinite rate and 0 s of it NaN steps (the end-to-end case above is
    since kept from such draws by the nominal time of a sliver of a step)."""
    import math

    from clustersim.cluster.job_periodic import segment_steps

    assert segment_steps(5e-7, 1e-320, 0.0) == 0.0
    assert segment_steps(5e-7, 1e-320, 1e-320) == 5e-7
    assert math.isfinite(segment_steps(3.0, 5e-324, 2e-324))
    assert segment_steps(10.0, 4.0, 1.0) == pytest.approx(2.5)
    assert segment_steps(10.0, 0.0, 0.0) == 0.0


def test_a_w8a8_deployment_planned_on_a100_drops_its_fp8_activations_there() -> None:
    """Since fp8 activations are refused on A100, `plan --hardware p5en,p4d` of a W8A8
    deployment pruned every p4d shape at validation and said no configuration holds the
    load (review of session 15). p4d is planned with the activations' default, and says so."""
    from clustersim.planning.serving_space import _raw_variant, foreign_activations

    deployment = {"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 1},
                  "precision": {"weights": "fp8", "activations": "fp8"},
                  "workload": {"rate": "2/s", "input_tokens": 512, "output_tokens": 64}}
    raw = {"name": "w", "duration": "2min", "hardware": "p5en", "cluster": {"instances": 1},
           "serve": [deployment]}
    assert foreign_activations(deployment, "p5en") is None
    assert "p4d: its chip has no fp8 peak" in foreign_activations(deployment, "p4d")
    on_a100 = _raw_variant(raw, deployment, "p4d", 1, 1, 1, 16, 1)["serve"][0]
    assert on_a100["precision"] == {"weights": "fp8"}
    assert _raw_variant(raw, deployment, "p5en", 1, 1, 1, 16, 1)["serve"][0]["precision"] == \
        {"weights": "fp8", "activations": "fp8"}
