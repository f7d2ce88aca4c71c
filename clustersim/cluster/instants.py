"""Events that land on an exact instant: a simpy timeout's time is now + delay, which for
`at - now` may round off `at` by an ulp; a job's arrival or the end of its run time must
land on the instant an earlier event computed, or the order of events changes."""

from __future__ import annotations

import math
from heapq import heappush

import simpy

__all__ = ["event_at"]


def _delay_to(now: float, at: float) -> float:
    """The delay that simpy adds to `now` to land exactly on `at` (a timeout's time is now +
    delay, which for at - now may round off `at` by an ulp); if none does, the largest
    that lands before it."""
    delay = at - now
    while now + delay < at:
        delay = math.nextafter(delay, math.inf)
    while now + delay > at:
        delay = math.nextafter(delay, -math.inf)
    return delay


def event_at(env: simpy.Environment, at: float) -> simpy.Event:
    """An event that happens at `at` exactly, as a timeout set at time 0 for `at` would (a
    job's arrival, made when the one before it arrives): a timeout where one lands there,
    else (a sum that skips `at`) the event queued at `at` itself, as simpy's `schedule`
    queues it at now + delay."""
    delay = _delay_to(env.now, at)
    if env.now + delay == at:
        return env.timeout(delay)
    event = env.event()
    event._ok, event._value = True, None  # (as a Timeout is: triggered, no value)
    heappush(env._queue, (at, simpy.events.NORMAL, next(env._eid), event))
    return event
