"""Pipeline schedules: the order in which each pipeline rank runs its forward and backward
passes (Megatron-LM's 1F1B and interleaved 1F1B; Narayanan et al. 2021)."""

from __future__ import annotations

__all__ = ["Task", "pipeline_order", "peak_in_flight", "in_flight"]

Task = tuple[str, int, int]  # ("F" or "B", chunk on this rank, micro-batch)


def pipeline_order(stages: int, microbatches: int, interleave: int = 1) -> list[list[Task]]:
    """Per pipeline rank, its passes in order.

    1F1B: rank d runs `stages - d - 1` warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards. Interleaved (`interleave` = v > 1 chunks
    per rank, chunk c of rank d being global stage c x stages + d): micro-batches go in groups
    of `stages` through chunk 0, then chunk 1, ...; warm-up is (stages - d - 1) x 2 +
    (v - 1) x stages forwards; backwards take the chunks in reverse. Needs micro-batches to be
    a multiple of stages, as Megatron does.
    """
    if stages < 1 or microbatches < 1 or interleave < 1:
        raise ValueError("stages, micro-batches and interleave must be at least 1")
    if interleave > 1 and microbatches % stages:
        raise ValueError(
            f"the interleaved schedule needs micro-batches ({microbatches}) to be a multiple of "
            f"the pipeline stages ({stages})"
        )
    orders = []
    total = microbatches * interleave
    group = stages * interleave
    for rank in range(stages):
        if interleave == 1:
            warmup = min(stages - rank - 1, microbatches)
        else:
            warmup = min((stages - rank - 1) * 2 + (interleave - 1) * stages, total)

        def forward(k: int) -> Task:
            return ("F", (k // stages) % interleave, (k // group) * stages + k % stages)

        def backward(k: int) -> Task:
            return ("B", interleave - 1 - (k // stages) % interleave,
                    (k // group) * stages + k % stages)

        order = [forward(k) for k in range(warmup)]
        for i in range(total - warmup):
            order.append(forward(warmup + i))
            order.append(backward(i))
        order += [backward(k) for k in range(total - warmup, total)]
        orders.append(order)
    return orders


def peak_in_flight(order: list[Task]) -> int:
    """Most chunk micro-batches whose forward ran and backward has not: what a rank must
    keep activations for."""
    live = peak = 0
    for kind, _, _ in order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def in_flight(stages: int, microbatches: int, interleave: int, rank: int) -> int:
    """`peak_in_flight` of `rank`'s order in `pipeline_order(stages, microbatches,
    interleave)`, without building it: its warm-up forwards plus the first steady one."""
    total = microbatches * interleave
    if interleave == 1:
        warmup = min(stages - rank - 1, microbatches)
    else:
        warmup = min((stages - rank - 1) * 2 + (interleave - 1) * stages, total)
    return min(warmup + 1, total)
