"""Mesh (direct writes to every peer; the direct algorithm on a switch) and the single-step
mesh all-reduce, inside the chip-to-chip domain."""

from __future__ import annotations

from clustersim.collectives.costs import Step
from clustersim.collectives.ops import COPY_ACCESSES

__all__ = ["mesh_steps", "mesh1_steps"]


def mesh1_steps(chips: list[int], k: int, buffer: float) -> list[Step]:
    """Single-step mesh all-reduce: each chip reduces its ranks' buffers, sends the whole
    buffer to every other chip, reduces the p buffers it then holds, and broadcasts the
    result to its ranks."""
    p = len(chips)
    flows = [(a, b) for a in chips for b in chips if a != b]
    steps = [Step(1, [], 0.0, (k + 1) * buffer)] if k > 1 else []
    if p > 1:
        steps.append(Step(1, flows, buffer, (p + 1) * buffer))
    if k > 1:
        steps.append(Step(1, [], 0.0, (k + 1) * buffer))
    return steps


def mesh_steps(op: str, chips: list[int], k: int, buffer: float) -> list[Step]:
    """Writes go straight to every other chip (routed, so links may be oversubscribed); the
    ranks of a chip reduce (or share) what arrives in one more step."""
    p = len(chips)
    flows = [(a, b) for a in chips for b in chips if a != b]
    if op == "all-to-all":
        return [Step(1, flows, buffer * k / p, COPY_ACCESSES * buffer * k)]
    if op == "broadcast":
        return [Step(1, flows[: p - 1], buffer, COPY_ACCESSES * buffer)]
    reduce_scatter = [Step(1, flows, buffer / p, (k + 1) * buffer)]
    all_gather = [Step(1, flows, buffer / p, buffer)] if p > 1 else []
    if p > 1:
        reduce_scatter.append(Step(1, [], 0.0, buffer * (1 + 1 / p)))
    if k > 1:
        all_gather.append(Step(1, [], 0.0, (k + 1) * buffer))
    if op == "reduce-scatter":
        return reduce_scatter
    if op == "all-gather":
        return all_gather
    return reduce_scatter + all_gather
