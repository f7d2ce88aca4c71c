"""Published training throughput the step model is calibrated and checked against.

Two kinds of rows (docs/calibration.md lists them all with their sources):

- calibration rows (`visible=True`): the family constants of the catalog (`efficiency.matmul`,
  `vector`, `pass_overhead`) are fitted to these and nothing else, per chip family:
  Trainium on the Trn1 rows, the GPU family on the A100 rows (scripts/calibrate_step.py);
- unseen rows (`visible=False`): published runs the constants were not fitted to, reported
  by scripts/validate_model.py as an honest check (Korthikanti et al. 2022, table 5).

What each row assumes beyond its source is written next to it. Where a paper does not give
the micro-batch size or the pipeline interleave of a row (Narayanan et al. 2021, table 1),
one rule chooses them for every such row: the fastest configuration that fits the chip's
memory, over micro-batches 1, 2, 4, 8 and interleaves 1 to 4 (`choose_schedule`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from clustersim.hardware.build import build_topology

__all__ = ["StepMeasurement", "STEP_MEASUREMENTS", "FAMILIES", "step_scenario", "predict_step",
           "choose_schedule", "family_rows", "error", "with_schedule", "fit_family",
           "family_errors", "error_band", "FITTED", "MICRO_BATCHES", "INTERLEAVES"]

MICRO_BATCHES = (1, 2, 4, 8)
INTERLEAVES = (1, 2, 3, 4)

# Chip family -> the catalog entry whose constants are fitted, and the entries that take them.
# Trn2 (trn2, trn2u) has its own constants, fitted on Trn2 data: its training rows' EFA
# constants by clustersim.calibration.trn2_training, the rest by clustersim.calibration.trn2.
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "trainium": ("trn1", ("trn1", "trn1n", "trn3-gen1", "trn3-gen2")),
    "trn2": ("trn2", ("trn2", "trn2u")),
    "gpu": ("p4d", ("p4d", "p4de", "p5", "p5e", "p5en")),
}


@dataclass(frozen=True)
class StepMeasurement:
    """A published training run: a job on some hardware and what it reached."""

    name: str
    family: str  # a key of FAMILIES
    hardware: str | Mapping[str, Any]  # catalog name or a base-derived mapping
    instances: int
    model: str
    seq_len: int
    global_batch: int
    parallelism: dict
    recompute: str
    attention: str
    measured: float
    metric: str  # "sequences_per_s", "hfu" or "step_time_s"
    source: str
    visible: bool = True
    micro_batch: int | None = None  # None: chosen by choose_schedule
    notes: str = ""
    extra: dict = field(default_factory=dict)


_NXD = "NeuronX Distributed Llama scripts: TP, sequence parallel, selective checkpoint, ZeRO-1"
_TRN1 = "Neuron docs, Trn1/Trn1n Training Performance (docs/calibration.md)"
# DGX A100 80 GB: 8 x 200 Gb/s InfiniBand per node (docs/calibration.md). Megatron-LM of 2021 ran
# its tensor-parallel all-reduces after the backward GEMMs; by 2022 it overlapped them with
# the weight-gradient GEMM (Korthikanti et al. 2022, section 6.2).
_DGX_A100 = {"base": "p4de", "instance": {"efa": "1600Gbps", "efa_devices": 8},
             "chip": {"framework": {"tp_overlap": False}}}
_DGX_A100_2022 = {"base": "p4de", "instance": {"efa": "1600Gbps", "efa_devices": 8},
                  "chip": {"framework": {"tp_overlap": True}}}
_NARAYANAN = "Narayanan et al. 2021 (SC21), table 1"
_KORTHIKANTI = "Korthikanti et al. 2022, tables 3 and 5"
# Megatron-LM 2021: mixed precision, full recompute, attention not fused (docs/calibration.md).
_MEGATRON_ROWS = (  # name, model, GPUs, tp, pp, dp, global batch, teraFLOP/s per GPU
    ("1.7B", "megatron-1.7b", 32, 1, 1, 32, 512, 137),
    ("7.5B", "megatron-7.5b", 128, 4, 1, 32, 512, 142),
    ("39B", "megatron-39b", 512, 8, 2, 32, 1536, 138),
    ("145B", "megatron-145b", 1536, 8, 8, 24, 2304, 148),
    ("530B", "megatron-530b", 2520, 8, 35, 9, 2520, 163),
    ("1T", "megatron-1t", 3072, 8, 64, 6, 3072, 163),
)
# Korthikanti et al. 2022 (Selene, DGX A100 80 GB, no data parallelism): name, model, GPUs,
# pp, global batch, micro-batch, interleave, iteration time full recompute, present work (s).
_KORTHIKANTI_ROWS = (
    ("22B", "korthikanti-22b", 8, 1, 4, 4, 1, 1.42, 1.10),
    ("175B", "gpt3-175b-megatron", 64, 8, 64, 1, 3, 18.13, 13.75),
    ("530B", "megatron-530b", 280, 35, 280, 1, 3, 49.05, 37.83),
    ("1T", "megatron-1t", 512, 64, 512, 1, 1, 94.42, 71.49),
)
# Neuron docs, Trn1 training performance, data file general/benchmarks/trn1/
# training_data_decoder.csv of the aws-neuron-sdk repository, NeuronX Distributed rows at SDK
# 2.16 (BF16 autocast, fp32 optimizer, AdamW, micro-batch 1, global batch 1,024, sequence
# 4,096): model, trn1.32xlarge instances, tp, pp, dp, sequences/s.
_TRN1_216 = ("Neuron docs, Trn1 training performance data (training_data_decoder.csv), "
             "SDK 2.16, NeuronX Distributed")
# The same page's data file at SDK 2.24 (about-neuron/benchmarks/trn1/training_data_decoder.csv):
# Llama 3.1 70B on 32 trn1.32xlarge, TP 32, PP 8, DP 4, sequence 8,192, 7.94 sequences/s.
_TRN1_224 = ("Neuron docs, Trn1 training performance data (training_data_decoder.csv), "
             "SDK 2.24, NeuronX Distributed")
_TRN1_UNSEEN_ROWS = (
    ("llama2-7b", 16, 8, 1, 64, 93.3),
    ("llama2-13b", 32, 8, 4, 32, 85.65),
    ("llama2-70b", 32, 32, 4, 8, 15.34),
)
# AXLearn (Lee et al., arXiv 2507.05411, table 3) on 64 trn2.48xlarge: the layout is AXLearn's
# fuji mesh rule for trn2.48xlarge (apple/axlearn, axlearn/experiments/text/gpt/fuji.py):
# `fsdp=-1, model=4` (TP 4 over a chip's four logical cores at LNC 2, weights, gradients and
# optimizer state sharded over all 1,024 chips), sequence-parallel norms (its trn2 partition
# specs), the default layer remat (saves the projections: `selective`). 4,096-token
# sequences, 1,024 a step; step time in seconds.
_AXLEARN = "AXLearn, arXiv 2507.05411, table 3 (64 trn2.48xlarge; fuji mesh rule)"
_AXLEARN_ROWS = (("llama2-7b", 1.2), ("llama2-70b", 11.2))
KORTHIKANTI_MODELS = {  # not in the model presets: layers, hidden, heads (table 3)
    "korthikanti-22b": {"layers": 48, "hidden": 6144, "heads": 64},
    "gpt3-175b-megatron": {"layers": 96, "hidden": 12288, "heads": 96},
}

STEP_MEASUREMENTS: tuple[StepMeasurement, ...] = (
    StepMeasurement("llama2-7b trn1 x16", "trainium", "trn1", 16, "llama2-7b", 4096, 1024,
                    {"tp": 8, "pp": 1, "dp": 64, "zero": 1, "sequence_parallel": True},
                    "selective", "flash", 95.14, "sequences_per_s", _TRN1 + ", SDK 2.21",
                    micro_batch=1, notes=_NXD),
    StepMeasurement("llama2-13b trn1 x32", "trainium", "trn1", 32, "llama2-13b", 4096, 1024,
                    {"tp": 8, "pp": 8, "dp": 16, "zero": 1, "sequence_parallel": True},
                    "selective", "flash", 80.33, "sequences_per_s", _TRN1 + ", SDK 2.21",
                    micro_batch=1, notes=_NXD + "; pipeline 1F1B, no interleave"),
    StepMeasurement("llama3.1-8b trn1 x32 (SDK 2.24)", "trainium", "trn1", 32, "llama3.1-8b",
                    8192, 1024,
                    {"tp": 32, "pp": 1, "dp": 32, "zero": 1, "sequence_parallel": True},
                    "selective", "flash", 47.95, "sequences_per_s", _TRN1 + ", SDK 2.24",
                    micro_batch=1, notes=_NXD),
    StepMeasurement("llama3.1-8b trn1 x32 (SDK 2.21)", "trainium", "trn1", 32, "llama3.1-8b",
                    8192, 1024,
                    {"tp": 32, "pp": 1, "dp": 32, "zero": 1, "sequence_parallel": True},
                    "selective", "flash", 41.99, "sequences_per_s", _TRN1 + ", SDK 2.21",
                    micro_batch=1, notes=_NXD + "; the same run as SDK 2.24, 13% slower"),
) + tuple(
    # Unseen Trn1 rows (not fitted): the same page's data file at SDK 2.16, NxD scripts.
    StepMeasurement(f"{model} trn1 x{instances} (SDK 2.16)", "trainium", "trn1", instances,
                    model, 4096, 1024, {"tp": tp, "pp": pp, "dp": dp, "zero": 1,
                                        "sequence_parallel": True},
                    "selective", "flash", measured, "sequences_per_s", _TRN1_216,
                    visible=False, micro_batch=1, notes=_NXD)
    for model, instances, tp, pp, dp, measured in _TRN1_UNSEEN_ROWS
) + (
    StepMeasurement("llama3.1-70b trn1 x32 (SDK 2.24)", "trainium", "trn1", 32, "llama3.1-70b",
                    8192, 1024, {"tp": 32, "pp": 8, "dp": 4, "zero": 1,
                                 "sequence_parallel": True},
                    "selective", "flash", 7.94, "sequences_per_s", _TRN1_224, visible=False,
                    micro_batch=1, notes=_NXD + "; pipeline 1F1B, no interleave"),
) + tuple(
    StepMeasurement(f"{model} trn2 x64 (AXLearn)", "trn2", "trn2", 64, model, 4096, 1024,
                    {"tp": 4, "pp": 1, "dp": 1024, "zero": 3, "sequence_parallel": True},
                    "selective", "flash", seconds, "step_time_s", _AXLEARN, micro_batch=1,
                    notes="FSDP over every chip: the step is its gathers and reduce-scatters")
    for model, seconds in _AXLEARN_ROWS
) + tuple(
    StepMeasurement(f"megatron-{name} a100 x{gpus}", "gpu", _DGX_A100, gpus // 8, model, 2048,
                    batch, {"tp": tp, "pp": pp, "dp": dp}, "full", "unfused", tflops / 312,
                    "hfu", f"{_NARAYANAN}: {tflops} teraFLOP/s per GPU",
                    notes="micro-batch and interleave by the fastest-that-fits rule")
    for name, model, gpus, tp, pp, dp, batch, tflops in _MEGATRON_ROWS
) + tuple(
    StepMeasurement(f"korthikanti-{name} {label}", "gpu", _DGX_A100_2022, gpus // 8, model, 2048,
                    batch, {"tp": 8, "pp": pp, "dp": 1, "sequence_parallel": sp,
                            "interleave": v},
                    recompute, "unfused", seconds, "step_time_s", f"{_KORTHIKANTI}: {column}",
                    visible=False, micro_batch=micro)
    for name, model, gpus, pp, batch, micro, v, full, present in _KORTHIKANTI_ROWS
    for label, sp, recompute, seconds, column in (
        ("selective+SP", True, "selective", present, "present work"),
        ("full recompute", False, "full", full, "full recompute"))
)


def family_rows(family: str, visible: bool | None = True) -> list[StepMeasurement]:
    return [m for m in STEP_MEASUREMENTS
            if m.family == family and (visible is None or m.visible == visible)]


def _model(name: str) -> str | dict:
    if name in KORTHIKANTI_MODELS:
        return {"name": name, **KORTHIKANTI_MODELS[name], "vocab": 51200, "seq_len": 2048}
    return name


def step_scenario(m: StepMeasurement, efficiency: Mapping[str, Any] | None = None,
                  micro_batch: int | None = None, interleave: int | None = None,
                  collectives: Mapping[str, Any] | None = None, recompute: str | None = None):
    """The measurement as a scenario, with trial efficiency (and collectives) constants if
    given, or another recompute policy."""
    from clustersim.scenario.loader import scenario_from_dict  # the scenario layer sits above

    hardware: Any = m.hardware
    if efficiency or collectives:
        hardware = dict(m.hardware) if isinstance(m.hardware, Mapping) else {"base": m.hardware}
    if efficiency:
        chip = dict(hardware.get("chip", {}))
        chip["efficiency"] = {**chip.get("efficiency", {}), **efficiency}
        hardware["chip"] = chip
    if collectives:
        hardware["collectives"] = {**hardware.get("collectives", {}), **collectives}
    parallelism = dict(m.parallelism)
    if interleave is not None:
        parallelism["interleave"] = interleave
    raw = {
        "name": "calibration",
        "hardware": hardware,
        "cluster": {"instances": m.instances},
        "jobs": [{
            "name": m.name.replace(" ", "_").replace("(", "").replace(")", ""),
            "model": _model(m.model), "seq_len": m.seq_len, "global_batch": m.global_batch,
            "micro_batch": micro_batch or m.micro_batch or 1, "parallelism": parallelism,
            "precision": "bf16", "recompute": recompute or m.recompute,
            "attention": m.attention,
        }],
    }
    return scenario_from_dict(raw)


def _profile(m: StepMeasurement, efficiency: Mapping[str, Any] | None, micro_batch: int | None,
             interleave: int | None):
    from clustersim.training.step import StepModel  # the training layer sits above

    scenario = step_scenario(m, efficiency, micro_batch, interleave)
    topology = build_topology(scenario.hardware, scenario.total_instances,
                              scenario.cluster.fabric)
    return StepModel(topology).profile(scenario.jobs[0])


def _candidates(m: StepMeasurement) -> list[tuple[int, int]]:
    """(micro-batch, interleave) pairs the rule considers for a row that gives neither."""
    par = m.parallelism
    dp, pp = par.get("dp", 1), par.get("pp", 1)
    from clustersim.catalog import read_catalog

    layers = read_catalog("models")["models"][m.model]["layers"]
    out = []
    for micro in MICRO_BATCHES:
        if (m.global_batch // dp) % micro:
            continue
        microbatches = m.global_batch // dp // micro
        for v in INTERLEAVES if pp > 1 else (1,):
            if layers % (pp * v) or (v > 1 and microbatches % pp):
                continue
            out.append((micro, v))
    return out


def choose_schedule(m: StepMeasurement, efficiency: Mapping[str, Any] | None = None
                    ) -> tuple[int, int]:
    """The row's (micro-batch, interleave): as published, or the fastest that fits."""
    if m.micro_batch is not None:
        return m.micro_batch, m.parallelism.get("interleave", 1)
    best: tuple[float, int, int] | None = None
    for micro, v in _candidates(m):
        profile = _profile(m, efficiency, micro, v)
        if profile.fits_memory and (best is None or profile.step_time_s < best[0]):
            best = (profile.step_time_s, micro, v)
    if best is None:
        raise ValueError(f"{m.name}: no micro-batch and interleave fits the chip's memory")
    return best[1], best[2]


def predict_step(m: StepMeasurement, efficiency: Mapping[str, Any] | None = None,
                 schedule: tuple[int, int] | None = None) -> tuple[float, Any]:
    """The model's figure for a measurement (in its metric) and the step profile."""
    micro, v = schedule or choose_schedule(m, efficiency)
    profile = _profile(m, efficiency, micro, v)
    if m.metric == "sequences_per_s":
        return profile.sequences_per_s, profile
    if m.metric == "hfu":
        return profile.hfu, profile
    return profile.step_time_s, profile


def error(m: StepMeasurement, predicted: float) -> float:
    """Error of a prediction as measured step time / model step time - 1, which is also
    model throughput / measured throughput - 1: positive when the model is too fast."""
    if m.metric == "step_time_s":
        return m.measured / predicted - 1
    return predicted / m.measured - 1  # throughput-like metrics: time is their inverse


def with_schedule(m: StepMeasurement, micro: int, interleave: int) -> StepMeasurement:
    return replace(m, micro_batch=micro,
                   parallelism={**m.parallelism, "interleave": interleave})


# ---------------------------------------------------------------------------------------------
# Fitting the family constants (scripts/calibrate_step.py)

FITTED = ("matmul", "vector", "pass_overhead")  # the three fitted constants of a family
# Physical ranges the fit stays in: no chip sustains more than 90% of its dense peak on GEMMs
# or less than 40% of its HBM bandwidth on streaming elementwise work; the overhead of a
# pass is under 0.1 s.
_BOUNDS = {"matmul": (0.3, 0.9), "vector": (0.25, 0.95), "pass_overhead": (0.0, 0.1)}


def family_errors(family: str, constants: Mapping[str, float],
                  schedules: Mapping[str, tuple[int, int]] | None = None,
                  visible: bool | None = True) -> list[tuple[StepMeasurement, float, float]]:
    """(row, model figure, error) of a family's rows with these constants."""
    out = []
    for m in family_rows(family, visible):
        schedule = None if schedules is None else schedules.get(m.name)
        predicted, _ = predict_step(m, constants, schedule)
        out.append((m, predicted, error(m, predicted)))
    return out


def fit_family(family: str, start: Mapping[str, float], iterations: int = 8
               ) -> tuple[dict[str, float], dict[str, tuple[int, int]]]:
    """Fit the family's three constants to its visible rows: damped Gauss-Newton on the log
    errors (their squares summed), within bounds (a constant at a bound leaves the step), the
    rows' schedules chosen by the rule with the starting constants, then with the fitted ones.
    """
    import numpy as np

    values = {k: float(start[k]) for k in FITTED}
    schedules: dict[str, tuple[int, int]] = {}
    for _ in range(2):
        schedules = {m.name: choose_schedule(m, values) for m in family_rows(family)}

        def residuals(trial: Mapping[str, float], chosen: Mapping = schedules) -> np.ndarray:
            return np.array([math.log1p(e) for _, _, e in family_errors(family, trial, chosen)])

        base = residuals(values)
        for _ in range(iterations):
            steps = {k: (1e-4 if k == "pass_overhead" else 0.01) for k in FITTED}
            steps = {k: -v if values[k] + v > _BOUNDS[k][1] else v for k, v in steps.items()}
            columns = {k: (residuals(dict(values, **{k: values[k] + steps[k]})) - base) / steps[k]
                       for k in FITTED}
            active = list(FITTED)
            while active:
                matrix = np.array([columns[k] for k in active]).T
                # Columns scaled to unit norm: the overhead (seconds) and the fractions differ
                # by orders of magnitude.
                norms = np.linalg.norm(matrix, axis=0)
                norms[norms == 0] = 1.0
                solution = np.linalg.lstsq(matrix / norms, -base, rcond=None)[0] / norms
                delta = dict(zip(active, solution, strict=True))
                stuck = [k for k in active if (values[k] + delta[k] < _BOUNDS[k][0] and
                                               values[k] <= _BOUNDS[k][0] + 1e-12)
                         or (values[k] + delta[k] > _BOUNDS[k][1] and
                             values[k] >= _BOUNDS[k][1] - 1e-12)]
                if not stuck:
                    break
                active = [k for k in active if k not in stuck]
            if not active:
                break
            scale, improved = 1.0, False
            while scale > 1 / 256:
                trial = {k: min(_BOUNDS[k][1], max(_BOUNDS[k][0],
                                values[k] + scale * float(delta.get(k, 0.0)))) for k in FITTED}
                trial_residuals = residuals(trial)
                if float(trial_residuals @ trial_residuals) < float(base @ base) - 1e-9:
                    values, base, improved = trial, trial_residuals, True
                    break
                scale /= 2
            if not improved:
                break
    return values, schedules


def error_band(errors: list[float]) -> tuple[float, float]:
    """[low, high] fractions of step time from a family's row errors (always around 0)."""
    return (min(0.0, *errors), max(0.0, *errors))
