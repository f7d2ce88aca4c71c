"""Published collective measurements the collectives model is calibrated against.

The rows and full curves of docs/calibration.md (the nccom-test page of the Neuron docs,
tools/neuron-sys-tools/nccom-test, fp32 all-reduce): 2 ranks on one instance from 1 KiB to
1 GiB, and 64 ranks on two instances from 8 B to 1 GiB. The page names no instance type; its
32 ranks per instance and its date make it trn1.32xlarge, as which they are evaluated here
(ranks fill a chip's two cores before the next chip, as the runtime places them).
`scripts/calibrate_collectives.py` fits the catalog's `collectives` constants to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.collectives.model import CollectiveModel, place_ranks
from clustersim.hardware.catalog import HardwareSpec, catalog_entry
from clustersim.hardware.topology import build_topology

__all__ = ["Measurement", "MEASUREMENTS", "LARGE_MESSAGE_BYTES", "predict_times", "StepMeasurement",
           "STEP_MEASUREMENTS", "predict_step", "step_scenario"]

GIB = 2**30
LARGE_MESSAGE_BYTES = 2**27  # the rows whose bus bandwidth the model must match (128 MiB+)


@dataclass(frozen=True)
class Measurement:
    ranks: int
    instances: int
    size_bytes: float
    time_us: float
    busbw_gib_s: float | None  # as published (nccom-test prints GiB/s)
    source: str


_CURVE_2_RANKS = [(1024, 58), (4096, 58), (16384, 58), (65536, 58), (262144, 60), (1048576, 68),
                  (4194304, 107), (16777216, 332), (67108864, 1214), (268435456, 4750)]
_CURVE_64_RANKS = [(16, 520), (64, 525), (256, 709), (1024, 840), (4096, 916), (16384, 1031),
                   (65536, 1315), (262144, 1311), (1048576, 1328), (4194304, 1378),
                   (16777216, 2138), (67108864, 3963), (134217728, 6279), (268435456, 11954),
                   (536870912, 21803)]

MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement(2, 1, 1 * GIB, 18930, 52.8, "docs/calibration.md"),
    Measurement(16, 1, 2e6, 686, 5.7, "docs/calibration.md (RDH)"),
    Measurement(16, 1, 32e6, 2754, 22.8, "docs/calibration.md (KangaRing)"),
    Measurement(16, 1, 512e6, 9690, 103.9, "docs/calibration.md (KangaRing)"),
    Measurement(64, 2, 8, 520, None, "docs/calibration.md"),
    Measurement(64, 2, 32 * 2**20, 2711, 22.7, "docs/calibration.md"),
    Measurement(64, 2, 1 * GIB, 41806, 47.1, "docs/calibration.md"),
) + tuple(Measurement(2, 1, s, t, None, "nccom-test page, 2-rank curve") for s, t in _CURVE_2_RANKS
          ) + tuple(Measurement(64, 2, s, t, None, "nccom-test page, 64-rank curve")
                    for s, t in _CURVE_64_RANKS)


def predict_times(hardware: HardwareSpec | None = None) -> list[float]:
    """Model time (s) of every measurement, on trn1 (or on `hardware`, e.g. with trial
    constants)."""
    hardware = hardware or catalog_entry("trn1")
    topology = build_topology(hardware, 2)
    model = CollectiveModel(topology)
    return [
        model.cost("all-reduce", place_ranks(topology, m.ranks, m.instances), m.size_bytes).time_s
        for m in MEASUREMENTS
    ]


# ---------------------------------------------------------------------------------------------
# Training throughput (the step model)


@dataclass(frozen=True)
class StepMeasurement:
    """A published training throughput: a job on some hardware and what it reached."""

    name: str
    hardware: str
    instances: int
    model: str
    seq_len: int
    global_batch: int
    micro_batch: int
    parallelism: dict
    recompute: str
    measured: float  # sequences/s, or MFU/HFU for `metric`
    metric: str  # "sequences_per_s" or "hfu"
    source: str


# docs/calibration.md (Neuron docs, Trn1/Trn1n training performance): AdamW, micro-batch 1, global
# batch 1,024, BF16 autocast. Not stated there and assumed here as NeuronX Distributed's
# Llama recipes run them: sequence parallelism with TP and selective recompute.
# Megatron-LM (Narayanan et al. 2021, table 1): the 1T model on 3,072 A100s reached 163
# teraFLOP/s per GPU, 52% of peak, counting the recomputed forward (full recompute).
STEP_MEASUREMENTS: tuple[StepMeasurement, ...] = (
    StepMeasurement("llama2-7b trn1 x16", "trn1", 16, "llama2-7b", 4096, 1024, 1,
                    {"tp": 8, "pp": 1, "dp": 64, "sequence_parallel": True}, "selective",
                    95.14, "sequences_per_s", "docs/calibration.md (SDK 2.21)"),
    StepMeasurement("llama2-13b trn1 x32", "trn1", 32, "llama2-13b", 4096, 1024, 1,
                    {"tp": 8, "pp": 8, "dp": 16, "sequence_parallel": True}, "selective",
                    80.33, "sequences_per_s", "docs/calibration.md (SDK 2.21)"),
    StepMeasurement("llama3.1-8b trn1 x32", "trn1", 32, "llama3.1-8b", 8192, 1024, 1,
                    {"tp": 32, "pp": 1, "dp": 32, "zero": 1, "sequence_parallel": True},
                    "selective", 47.95, "sequences_per_s", "docs/calibration.md (SDK 2.24)"),
    StepMeasurement("megatron-1t p4d x384", "p4d", 384, "megatron-1t", 2048, 3072, 1,
                    {"tp": 8, "pp": 64, "dp": 6}, "full", 0.52, "hfu",
                    "Narayanan et al. 2021, table 1 (163 of 312 TFLOPS per A100)"),
)


def step_scenario(m: StepMeasurement, hardware: HardwareSpec | None = None):
    """The measurement as a scenario (hardware may carry trial constants)."""
    from clustersim.scenario.loader import scenario_from_dict  # the scenario layer sits above

    raw = {
        "name": "calibration",
        "hardware": hardware.model_dump(by_alias=True) if hardware is not None else m.hardware,
        "cluster": {"instances": m.instances},
        "jobs": [{
            "name": m.name.replace(" ", "_"), "model": m.model, "seq_len": m.seq_len,
            "global_batch": m.global_batch, "micro_batch": m.micro_batch,
            "parallelism": m.parallelism, "precision": "bf16", "recompute": m.recompute,
        }],
    }
    return scenario_from_dict(raw)


def predict_step(m: StepMeasurement, hardware: HardwareSpec | None = None) -> float:
    """The model's figure for a measurement (sequences/s or HFU)."""
    from clustersim.training.step import StepModel

    scenario = step_scenario(m, hardware)
    topology = build_topology(scenario.hardware, scenario.total_instances,
                              scenario.cluster.fabric)
    profile = StepModel(topology).profile(scenario.jobs[0])
    return profile.sequences_per_s if m.metric == "sequences_per_s" else profile.hfu
