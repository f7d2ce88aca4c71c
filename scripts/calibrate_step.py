"""Fit the step model's three compute constants per chip family to published throughput.

    python scripts/calibrate_step.py                 # the GPU family (the catalog's fit)
    python scripts/calibrate_step.py --family trainium   # Trainium alone, for comparison

Per family, only its calibration rows are used (clustersim/calibration/step.py): the GPU
family on Megatron-LM's six A100 rows, Trainium on the Trn1 rows. The catalog's Trainium
constants come from the joint fit with the Trn1 collectives and serving constants
(scripts/calibrate_collectives.py --joint); fitting them here alone keeps the catalog's
collectives. The fitted constants are
`efficiency.matmul` (fraction of peak large GEMMs reach), `efficiency.vector` (fraction of
HBM bandwidth memory-bound work reaches) and `efficiency.pass_overhead` (fixed time per
forward or backward pass of a micro-batch through a stage); the fit minimises the squared
log errors. It prints the values to put in clustersim/catalog/hardware.yaml (the family's
entry and those that take its constants) and the error band (`step_error_band`, over the
family's calibration and unseen rows); `python scripts/validate_model.py` then reports every
row. Nothing is fitted per case.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustersim.calibration.step import (  # noqa: E402
    FAMILIES,
    error_band,
    family_errors,
    fit_family,
)
from clustersim.hardware.catalog import catalog_entry  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), action="append")
    args = parser.parse_args()
    families = args.family or ["gpu"]
    if "trainium" in families:
        print("note: the catalog's Trainium constants come from the joint fit with the "
              "collectives and serving constants (python scripts/calibrate_collectives.py "
              "--joint); this fits the step constants alone, on the catalog's collectives")
    for family in families:
        entry, _ = FAMILIES[family]
        eff = catalog_entry(entry).chip.efficiency
        start = {"matmul": eff.matmul, "vector": eff.vector,
                 "pass_overhead": max(eff.pass_overhead_s, 1e-3)}
        values, schedules = fit_family(family, start)
        rows = family_errors(family, values, schedules)
        unseen = family_errors(family, values, visible=False)
        low, high = error_band([e for _, _, e in rows + unseen])
        print(f"{family} ({entry}): matmul = {values['matmul']:.3f}, "
              f"vector = {values['vector']:.3f}, "
              f"pass_overhead = {values['pass_overhead'] * 1e3:.2f}ms, "
              f"step_error_band = [{low:.3f}, {high:.3f}]")
        for m, predicted, err in rows:
            micro, v = schedules[m.name]
            print(f"  {m.name:36s} published {m.measured:8.3f} model {predicted:8.3f} "
                  f"error {err:+.1%}  (micro-batch {micro}, interleave {v})")
        mean = sum(abs(e) for _, _, e in rows) / len(rows)
        print(f"  mean absolute error {mean:.1%}")
        for m, predicted, err in unseen:
            print(f"  unseen: {m.name:28s} published {m.measured:8.3f} model {predicted:8.3f} "
                  f"error {err:+.1%}")


if __name__ == "__main__":
    main()
