"""Published collective measurements the collectives model is calibrated against.

The rows and full curves of docs/calibration.md (the nccom-test page of the Neuron docs,
tools/neuron-sys-tools/nccom-test, fp32 all-reduce): 2 ranks on one instance from 1 KiB to
1 GiB, and 64 ranks on two instances from 8 B to 1 GiB. The page names no instance type; its
32 ranks per instance and its date make it trn1.32xlarge, as which they are evaluated here
(ranks fill a chip's two cores before the next chip, as the runtime places them).
`scripts/calibrate_collectives.py` fits the catalog's `collectives` constants to them.
The same page's 16-rank `--show-algorithm` example (mesh, RDH, KangaRing) is a Trn2 example:
it is in `clustersim.calibration.trn2`, with the Trn2 fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.collectives.model import CollectiveModel, place_ranks
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import HardwareSpec, catalog_entry

__all__ = ["Measurement", "MEASUREMENTS", "LARGE_MESSAGE_BYTES", "predict_times"]

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
