"""Fit the step model's compute efficiencies to published training throughput.

    python scripts/calibrate_step.py            # fit, print every case's error
    python scripts/calibrate_step.py --check    # errors with the catalog's values only

Only hardware-level constants are fitted, per chip family: Trainium (trn1) matmul and vector
efficiency, to the three Trn1 rows of docs/calibration.md; the A100 (p4d) matmul efficiency, to
Megatron-LM's 1T-parameter run (52% of peak on 3,072 GPUs). The fit minimises squared log
errors. Nothing is fitted per case; the cases and their assumptions are in
clustersim/calibration/collectives.py.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustersim.calibration.collectives import STEP_MEASUREMENTS, predict_step  # noqa: E402
from clustersim.hardware.catalog import HardwareSpec, catalog_entry  # noqa: E402

FAMILIES = {"trn1": ("matmul", "vector"), "p4d": ("matmul",)}


def with_efficiency(name: str, values: dict[str, float]) -> HardwareSpec:
    base = catalog_entry(name)
    efficiency = base.chip.efficiency.model_copy(update=values)
    return base.model_copy(update={"chip": base.chip.model_copy(update={"efficiency": efficiency})})


def errors(name: str, values: dict[str, float]) -> list[tuple[str, float, float]]:
    hardware = with_efficiency(name, values)
    out = []
    for m in STEP_MEASUREMENTS:
        if m.hardware == name:
            predicted = predict_step(m, hardware)
            out.append((m.name, m.measured, predicted))
    return out


def loss(name: str, values: dict[str, float]) -> float:
    return sum(math.log(p / m) ** 2 for _, m, p in errors(name, values))


def fit(name: str) -> dict[str, float]:
    eff = catalog_entry(name).chip.efficiency
    values = {p: getattr(eff, p) for p in FAMILIES[name]}
    best = loss(name, values)
    step = 0.3
    while step > 0.002:
        improved = False
        for param in FAMILIES[name]:
            for direction in (1, -1):
                trial = dict(values)
                trial[param] = min(1.0, max(0.05, values[param] * math.exp(direction * step)))
                score = loss(name, trial)
                if score < best - 1e-12:
                    values, best, improved = trial, score, True
        if not improved:
            step /= 2
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report the catalog's values only")
    args = parser.parse_args()
    for name in FAMILIES:
        eff = catalog_entry(name).chip.efficiency
        values = {p: getattr(eff, p) for p in FAMILIES[name]}
        if not args.check:
            values = fit(name)
            print(f"{name}: fitted " + ", ".join(f"{k} = {v:.3f}" for k, v in values.items()))
        for case, measured, predicted in errors(name, values):
            print(f"  {case:24s} measured {measured:8.3f} model {predicted:8.3f} "
                  f"error {predicted / measured - 1:+.1%}")


if __name__ == "__main__":
    main()
