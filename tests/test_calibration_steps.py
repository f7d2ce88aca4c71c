"""The step model against the published runs it is calibrated on (computed here, from the
catalog's constants: a change to the model or the constants that moves a row out of its
tolerance fails), and the physics the calibration relies on."""

from __future__ import annotations

import pytest

from clustersim.calibration.step import (
    FAMILIES,
    STEP_MEASUREMENTS,
    choose_schedule,
    error,
    error_band,
    family_rows,
    predict_step,
    step_scenario,
)
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.training.step import StepModel
from clustersim.training.workload import hardware_flops_per_step, stage_work

ROW_TOLERANCE = 0.08
MEAN_TOLERANCE = 0.05


@pytest.fixture(scope="module")
def visible_errors() -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for family in FAMILIES:
        out[family] = {}
        for m in family_rows(family):
            predicted, profile = predict_step(m, schedule=choose_schedule(m))
            assert profile.fits_memory, f"{m.name} does not fit in the model"
            out[family][m.name] = error(m, predicted)
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_calibration_row_within_8_percent(visible_errors, family):
    errors = visible_errors[family]
    assert errors, family
    worst = {name: e for name, e in errors.items() if abs(e) > ROW_TOLERANCE}
    assert not worst, worst


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_mean_absolute_error_within_5_percent(visible_errors, family):
    errors = list(visible_errors[family].values())
    assert sum(abs(e) for e in errors) / len(errors) <= MEAN_TOLERANCE, visible_errors[family]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_catalog_band_is_the_residual_band(visible_errors, family):
    """step_error_band in the catalog is what the family's rows give, calibration and unseen
    (a refit must update it), and every member of the family carries the fitted entry's
    constants."""
    entry, members = FAMILIES[family]
    unseen = [error(m, predict_step(m)[0]) for m in family_rows(family, visible=False)]
    low, high = error_band(list(visible_errors[family].values()) + unseen)
    eff = catalog_entry(entry).chip.efficiency
    if family == "trn2":  # Trn1's band widened by these and the prefill rows (trn2.step_band)
        assert eff.step_error_band[0] <= low + 0.005 and eff.step_error_band[1] >= high - 0.005
    else:
        assert eff.step_error_band == pytest.approx((low, high), abs=0.005)
    for member in members:
        other = catalog_entry(member).chip.efficiency
        assert (other.matmul, other.vector, other.pass_overhead_s) == (
            eff.matmul, eff.vector, eff.pass_overhead_s), member
        assert other.step_error_band == eff.step_error_band, member


def test_band_brackets_the_step_time():
    m = family_rows("trainium")[0]
    _, profile = predict_step(m, schedule=(1, 1))
    low, high = profile.step_time_s_band
    assert low <= profile.step_time_s <= high
    assert profile.as_dict()["step_time_s_band"] == [low, high]


def test_every_published_configuration_fits():
    """Every calibration and unseen row fits its chip's HBM as published (the rule picks
    schedules among those that fit; the rows that give theirs must fit as given)."""
    for m in STEP_MEASUREMENTS:
        if m.micro_batch is None:
            continue
        _, profile = predict_step(m)
        assert profile.fits_memory, (m.name, profile.memory.as_gib())


def _profile(raw_job: dict, hardware: str, instances: int):
    from clustersim.scenario.loader import scenario_from_dict

    scenario = scenario_from_dict({"name": "t", "hardware": hardware,
                                   "cluster": {"instances": instances}, "jobs": [raw_job]})
    topology = build_topology(scenario.hardware, instances, scenario.cluster.fabric)
    return scenario.jobs[0], StepModel(topology).profile(scenario.jobs[0])


def test_llama2_70b_fits_trn1_as_the_neuron_benchmarks_ran_it():
    """TP 8, PP 8 on 32 trn1.32xlarge, sequence 4,096, ZeRO-1, sequence parallel, selective
    recompute: fits 32 GiB only with NeuronX Distributed's bf16 gradients and flash
    attention; with Megatron's fp32 gradients it does not."""
    job = {"name": "l70", "model": "llama2-70b", "seq_len": 4096, "global_batch": 1024,
           "parallelism": {"tp": 8, "pp": 8, "dp": 16, "zero": 1, "sequence_parallel": True},
           "recompute": "selective"}
    _, profile = _profile(job, "trn1", 32)
    assert profile.fits_memory, profile.memory.as_gib()
    fp32 = {"base": "trn1", "chip": {"framework": {"gradients": "fp32"}}}
    _, heavier = _profile(job, fp32, 32)
    assert not heavier.fits_memory


def test_attention_kernel_changes_bytes_not_flops():
    m = next(r for r in STEP_MEASUREMENTS if r.name.startswith("megatron-1.7B"))
    scenario = step_scenario(m, micro_batch=4)
    job = scenario.jobs[0]
    flash = job.model_copy(update={"attention": "flash"})
    unfused = job.model_copy(update={"attention": "unfused"})
    works = {j.attention: stage_work(j, 4, False, False) for j in (flash, unfused)}
    flops = {k: sum(op.flops for op in w.forward + w.backward) for k, w in works.items()}
    traffic = {k: sum(op.bytes for op in w.forward + w.backward) for k, w in works.items()}
    assert flops["flash"] == pytest.approx(flops["unfused"])
    assert traffic["unfused"] > 1.5 * traffic["flash"]
    assert hardware_flops_per_step(flash) == hardware_flops_per_step(unfused)
    topology = build_topology(scenario.hardware, scenario.total_instances)
    times = {j.attention: StepModel(topology).profile(j).step_time_s for j in (flash, unfused)}
    assert times["unfused"] > times["flash"]


def test_selective_recompute_recomputes_the_unfused_softmax():
    m = next(r for r in STEP_MEASUREMENTS if r.name.startswith("korthikanti-22B selective"))
    job = step_scenario(m).jobs[0]
    names = [op.name for op in stage_work(job, 1, False, False, "unfused").backward]
    assert names.count("softmax") == 1 and names.count("dropout") == 1
    flash_names = [op.name for op in stage_work(job, 1, False, False, "flash").backward]
    assert "softmax" not in flash_names and flash_names.count("attention") == 1


def test_small_matrices_reach_a_lower_fraction_of_peak():
    """Wave quantisation on an A100: 109 output tiles take two waves of 108 SMs."""
    from clustersim.training.step import matmul_quantisation
    from clustersim.training.workload import Op

    eff = catalog_entry("p4d").chip.efficiency
    full = Op("a", "matmul", 0, 0, 128 * 108, 128, 4096)
    spill = Op("b", "matmul", 0, 0, 128 * 109, 128, 4096)
    assert matmul_quantisation(full, eff) == pytest.approx(1.0)
    assert matmul_quantisation(spill, eff) == pytest.approx(109 / 216)
    few = Op("d", "matmul", 0, 0, 1, 128 * 10, 8192)  # 10 tiles: split-K fills 130 of 132
    h100 = catalog_entry("p5").chip.efficiency
    assert matmul_quantisation(few, h100) == pytest.approx(1 / 128 * 130 / 132)
    trn = catalog_entry("trn1").chip.efficiency
    sliced = Op("c", "matmul", 0, 0, 4096, 448, 4096)  # Llama 3.1 8B FFN over TP 32
    assert matmul_quantisation(sliced, trn) == pytest.approx(448 / 512)
