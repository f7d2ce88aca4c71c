"""The UltraServer level: the instances of a Trn2 UltraServer over the NeuronLink Z rings.

Each chip position runs its own group along its Z ring, with every rank of the chip in a
parallel group: ring, bidirectional ring, mesh and single-step mesh."""

from __future__ import annotations

from clustersim.collectives.costs import Step
from clustersim.collectives.ops import COPY_ACCESSES, REDUCE_ACCESSES

__all__ = ["z_columns", "z_steps", "z_algorithms"]


def z_algorithms(op: str) -> list[str]:
    """The algorithms the Z rings run for `op`."""
    return ["ring", "biring", "mesh"] + (["mesh1"] if op == "all-reduce" else [])


def z_columns(chips: list[int], per_instance: int) -> list[list[int]]:
    """The chips of each (x, y) position, one per instance, in Z order."""
    return [chips[i::per_instance] for i in range(per_instance)]


def z_steps(op: str, columns: list[list[int]], k: int, buffer: float, algorithm: str
            ) -> list[Step]:
    m = len(columns[0])
    per_chip = buffer * k  # k ranks of a chip, each in its own Z group
    flows_one: list[tuple[int, int]] = []
    flows_both: list[tuple[int, int]] = []
    all_pairs: list[tuple[int, int]] = []
    for column in columns:
        hops = list(zip(column, column[1:] + column[:1], strict=True)) if m > 2 else (
            [(column[0], column[1])] if m == 2 else [])
        flows_one += hops
        flows_both += hops + [(b, a) for a, b in hops]
        all_pairs += [(a, b) for a in column for b in column if a != b]
    if m == 2:
        flows_one = flows_both  # two members exchange both ways in a ring step
    if algorithm in ("ring", "biring"):
        directions = 1 if algorithm == "ring" else 2
        flows = flows_one if directions == 1 else flows_both
        chunk = per_chip / m / directions
        if op == "broadcast":
            return [Step(m - 1, [], 0.0, 0.0), Step(1, flows, per_chip / directions, 0.0)]
        count = (2 if op == "all-reduce" else 1) * (m - 1)
        return [Step(count, flows, chunk, REDUCE_ACCESSES * chunk * directions)]
    if algorithm == "mesh1":
        return [Step(1, all_pairs, per_chip, REDUCE_ACCESSES * per_chip * m)]
    if op == "broadcast":
        return [Step(1, all_pairs[: m - 1], per_chip, COPY_ACCESSES * per_chip)]
    if op == "all-to-all":  # the buffer is what leaves the instance, split over peers
        return [Step(1, all_pairs, per_chip / (m - 1), COPY_ACCESSES * per_chip)]
    count = 2 if op == "all-reduce" else 1
    return [Step(count, all_pairs, per_chip / m, REDUCE_ACCESSES * per_chip)]
