"""Periodic checkpoints between failures, in closed form.

Between two events that change a job's state (a failure, a preemption, its end, a pace
change, the horizon) its checkpoints are periodic: a blocking checkpoint trains `interval`
then writes for `write` (training paused), over and over; an asynchronous one takes a
snapshot every `interval` of training, which becomes the restore point `write` later while
training goes on. So the timeline plans one segment to the next such event and, when the
segment ends or is cut short, works out from these functions how much it trained, which
checkpoints completed and where in the cycle it stands: no event per checkpoint.

Blocking cycle coordinates: `u` is the position in the cycle [train `interval`][write
`write`] of period P = interval + write; u < interval trains (u is the training since the
last snapshot), u >= interval writes (the snapshot was taken at u = interval). Write k
completes at u = k P.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BlockingSpan", "blocking_training", "blocking_wall_for", "blocking_span",
           "blocking_writes", "async_snapshots"]


def blocking_training(v: float, interval: float, write: float) -> float:
    """Training done from cycle position 0 to v (writes excluded)."""
    period = interval + write
    cycles = math.floor(v / period)
    return cycles * interval + min(v - cycles * period, interval)


def blocking_wall_for(u0: float, training: float, interval: float, write: float) -> float:
    """Wall time from cycle position u0 until `training` more seconds of training are done:
    the earliest such time (a checkpoint due exactly at the end is not written, as the
    step target ends the job first)."""
    if training <= 0:
        return 0.0
    period = interval + write
    target = min(u0, interval) + training  # training position reached, from cycle start
    k = max(math.ceil(target / interval) - 1, 0)
    if k and target - k * interval <= 1e-9 * interval:  # rounding put it past a cycle's end
        k -= 1
    return k * period + (target - k * interval) - u0


@dataclass(frozen=True)
class BlockingSpan:
    """What `wall` seconds from cycle position u0 amount to."""

    training_s: float  # training done
    completed: int  # writes completed
    saved_training_s: float | None  # training since u0 at the last completed write's snapshot
    u_end: float  # cycle position at the end
    writing: bool  # mid-write at the end


def blocking_span(u0: float, wall: float, interval: float, write: float) -> BlockingSpan:
    period = interval + write
    v = u0 + wall
    cycles = math.floor(v / period)
    rest = v - cycles * period
    start_training = min(u0, interval)
    training = cycles * interval + min(rest, interval) - start_training
    completed = cycles  # u0 < period: write k ends at k P, k >= 1
    saved = cycles * interval - start_training if completed else None
    return BlockingSpan(max(training, 0.0), completed, saved, rest, rest > interval)


def blocking_writes(u0: float, wall: float, interval: float, write: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) wall offsets from the segment's start of the writes within [0, wall]
    (a write cut by the end of the span ends there; one under way at u0 starts at 0)."""
    period = interval + write
    v = u0 + wall
    first = 0 if u0 < period else math.floor(u0 / period)
    last = math.floor((v - interval) / period) if v > interval else -1
    if last < first:
        return np.empty(0), np.empty(0)
    k = np.arange(first, last + 1, dtype=np.float64)
    starts = k * period + interval - u0
    ends = starts + write
    return np.clip(starts, 0.0, wall), np.minimum(ends, wall)


def async_snapshots(x0: float, wall: float, interval: float, write: float
                    ) -> tuple[int, float | None, np.ndarray]:
    """The snapshots an asynchronous checkpoint takes within (0, wall] of a segment, `x0`
    being the training since the last snapshot at its start: (how many of them completed
    by `wall`, the wall offset of the last completed one or None, the offsets of those
    still being written at `wall`). Offsets are from the segment's start."""
    first = max(interval - x0, 0.0)
    if first > wall:
        return 0, None, np.empty(0)
    taken = math.floor((wall - first) / interval) + 1
    done = wall - write - first
    completed = min(math.floor(done / interval) + 1, taken) if done >= 0 else 0
    last = first + (completed - 1) * interval if completed else None
    pending = first + interval * np.arange(completed, taken, dtype=np.float64)
    return completed, last, pending
