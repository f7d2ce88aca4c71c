"""Check that every collective's time is non-decreasing in message size, on every catalog
entry, for every operation and a range of group shapes, on a dense grid of sizes.

    python scripts/collective_monotonicity.py            # 8 B to 4 GiB, 160 sizes
    python scripts/collective_monotonicity.py --sizes 400

The test suite runs a hypothesis property on a sample of these (tests/test_collectives.py);
this is the longer run. Prints every violation and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustersim.collectives import OPS, CollectiveError, CollectiveModel, place_ranks  # noqa: E402
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry, catalog_names  # noqa: E402


def shapes(hw) -> list[tuple[int, int]]:
    """(ranks, instances): part of a chip's ranks, part and all of an instance, several
    instances, and one or two whole UltraServers."""
    rpi, k, ipu = hw.ranks_per_instance, hw.chip.ranks, hw.instances_per_ultraserver
    found = {(k, 1), (2 * k, 1), (rpi // 2, 1), (rpi, 1), (2 * rpi, 2), (4 * rpi, 4), (2 * k, 2)}
    if ipu > 1:
        found |= {(rpi * ipu, ipu), (2 * rpi * ipu, 2 * ipu)}
    return sorted(s for s in found if s[0] >= 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, default=160, help="sizes from 8 B to 4 GiB")
    args = parser.parse_args()
    sizes = np.unique(np.round(np.logspace(3, 32, args.sizes, base=2)))
    violations = checked = 0
    for name in catalog_names():
        hw = catalog_entry(name)
        ipu = hw.instances_per_ultraserver
        model = CollectiveModel(build_topology(hw, 4 * ipu))
        for ranks, instances in shapes(hw):
            try:
                group = place_ranks(model.topology, ranks, instances)
            except CollectiveError:
                continue
            for op in OPS:
                times = np.array([model.cost(op, group, s).time_s for s in sizes])
                checked += 1
                falls = np.flatnonzero(np.diff(times) < -1e-12 * times[1:])
                for i in falls:
                    violations += 1
                    print(f"{name} {ranks} ranks / {instances} instances {op}: "
                          f"{times[i] * 1e6:.1f} us at {sizes[i]:.0f} B, "
                          f"{times[i + 1] * 1e6:.1f} us at {sizes[i + 1]:.0f} B")
    print(f"{checked} curves of {len(sizes)} sizes checked, {violations} falls")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
