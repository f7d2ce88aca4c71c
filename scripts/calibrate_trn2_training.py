"""Fit Trn2's EFA constants on AXLearn's Trn2 training rows, and bound its matmul efficiency.

    python scripts/calibrate_trn2_training.py            # fit from the catalog's values
    python scripts/calibrate_trn2_training.py --check    # the catalog's values, no fit

The rows (clustersim/calibration/step.py, family `trn2`): AXLearn's Llama 2 7B and 70B on 64
trn2.48xlarge, TP 4 inside each chip, ZeRO-3 over all 1,024 chips. The fitted constants are
the trn2 entry's `collectives.efa_efficiency` and `collectives.efa_step_latency`
(clustersim/calibration/trn2_training.py says why these two); the script prints them, every
row's error with the catalog's and with the fitted values, what full recompute costs, and
the lowest `efficiency.matmul` the rows allow. Nothing is fitted per row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustersim.calibration.trn2_training import (  # noqa: E402
    RECOMPUTE_COST,
    efficiency_bound,
    fit_efa,
    recompute_cost,
    trn2_errors,
)
from clustersim.hardware.catalog import catalog_entry  # noqa: E402


def _print(title: str, rows) -> None:
    print(title)
    for m, predicted, err in rows:
        print(f"  {m.name:32s} published {m.measured:6.2f} s  model {predicted:6.2f} s  "
              f"error {err:+.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="the catalog's values only")
    args = parser.parse_args()
    c = catalog_entry("trn2").collectives
    current = {"efa_efficiency": c.efa_efficiency, "efa_step_latency": c.efa_step_latency_s}
    print(f"catalog: efa_efficiency {c.efa_efficiency:.3f}, efa_step_latency "
          f"{c.efa_step_latency_s * 1e6:.0f} us")
    _print("Trn2 training rows (error = published step / model step - 1: + is too fast), "
           "catalog:", trn2_errors())
    if not args.check:
        fitted = fit_efa(current)
        print(f"fitted: efa_efficiency {fitted['efa_efficiency']:.3f}, efa_step_latency "
              f"{fitted['efa_step_latency'] * 1e6:.0f} us")
        _print("with the fitted values:", trn2_errors(fitted))
    print(f"full recompute, 70B: model {recompute_cost():+.1%} (published "
          f"{RECOMPUTE_COST:+.0%}); 7B: {recompute_cost(model='llama2-7b'):+.1%}")
    eff = catalog_entry("trn2").chip.efficiency
    print("bounds the rows put on the compute constants (full recompute within twice the "
          "published cost; past them compute shows through the FSDP traffic):")
    print(f"  matmul >= {efficiency_bound('matmul')} (catalog {eff.matmul}), vector >= "
          f"{efficiency_bound('vector')} (catalog {eff.vector}), pass_overhead <= "
          f"{efficiency_bound('pass_overhead') * 1e3:.0f} ms (catalog "
          f"{eff.pass_overhead_s * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
