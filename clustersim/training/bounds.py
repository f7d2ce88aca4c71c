"""A lower bound of the pipelined step from its passes' durations (what the planner prunes with)."""

from __future__ import annotations

__all__ = [
    "pipeline_bound",
    "pipeline_terms",
]


def pipeline_terms(forward_s: list[float], backward_s: list[float], pp: int
                   ) -> list[tuple[float, float, float]]:
    """Per pipeline rank d, (fill, drain, busy): the forward passes of chunks 0 .. d-1, their
    backward passes, and rank d's passes of one micro-batch (`pipeline_bound`)."""
    chunks = len(forward_s)
    terms = []
    fill = drain = 0.0
    for d in range(pp):
        busy = sum(forward_s[g] + backward_s[g] for g in range(d, chunks, pp))
        terms.append((fill, drain, busy))
        fill += forward_s[d]
        drain += backward_s[d]
    return terms


def pipeline_bound(forward_s: list[float], backward_s: list[float], pp: int,
                   microbatches: int, reduce_s: list[float], gather_s: list[float],
                   optimizer_s: list[float]) -> float:
    """A lower bound of the step `StepModel.profile` simulates, from each global chunk's
    forward and backward pass durations and each pipeline rank's data-parallel reduction,
    gather and optimizer step (any lower bounds of them).

    The pipeline (`run_pipeline`) runs each rank's passes one at a time, a forward of chunk g
    after the forward of chunk g - 1 of the same micro-batch, a backward of chunk g after the
    backward of chunk g + 1. So pipeline rank d starts no earlier than the forward of its
    first micro-batch through chunks 0 .. d-1, then is busy for all its passes, and ends with
    a backward (of its chunk d), after which that micro-batch's backward still runs through
    chunks d-1 .. 0 before rank 0 ends. After its last pass, a rank waits for what of its
    reduction outlasted that pass (the reduction starts with it), its gather and its
    optimizer step; the step ends when the last rank does. The bound is lowered by 1e-9
    of itself, for the sums' rounding."""
    chunks = len(forward_s)

    def tail(d: int) -> float:
        longest = max(backward_s[g] for g in range(d, chunks, pp))
        return max(0.0, reduce_s[d] - longest) + gather_s[d] + optimizer_s[d]

    last_of_first = tail(0)
    bound = 0.0
    for d, (fill, drain, busy) in enumerate(pipeline_terms(forward_s, backward_s, pp)):
        end = fill + microbatches * busy
        bound = max(bound, end + tail(d), end + drain + last_of_first)
    return bound * (1.0 - 1e-9)
