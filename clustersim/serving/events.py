"""Events of the serving simulation: bare simpy events driving callback state machines,
and an environment whose run loop is simpy's `step` inline.

A replica's server loop and the router are the hot path of a serving run (about five events
per request). As simpy processes each event resumes a generator through `Process._resume`;
as callbacks (`Wake`) they cost a heap push and a call. They are scheduled exactly where the
processes scheduled theirs (same time, priority and order), so the run is the same.
"""

from __future__ import annotations

from heapq import heappop, heappush

import simpy
from simpy.events import NORMAL

__all__ = ["Wake", "ServingEnvironment"]


class Wake:
    """A bare simpy event, scheduled at once: the environment calls its callbacks when it
    reaches it. It stands for what a process's Timeout, Initialize, Interruption or an idle
    event's succeed() would schedule (same time, priority and order), without a generator
    to resume: the replica and the router are callback state machines on the hot path."""

    __slots__ = ("callbacks", "cause")
    _ok = True  # read by Environment.step
    _value = None

    def __init__(self, env: simpy.Environment, callback, delay: float = 0.0,
                 priority=NORMAL, cause: object = None):
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        self.callbacks = [callback]
        self.cause = cause
        # env.schedule(self, priority, delay), inline (several million times a run)
        heappush(env._queue, (env._now + delay, priority, next(env._eid), self))


class ServingEnvironment(simpy.Environment):
    """A simpy environment with `run_until`: `run(until=event)` with `step` inline."""

    def run_until(self, until: simpy.Event) -> None:
        """Process events until `until` has been processed (as `run(until=until)`)."""
        queue = self._queue
        while until.callbacks is not None:
            try:
                self._now, _, _, event = heappop(queue)
            except IndexError:
                raise RuntimeError(f"no scheduled events left but {until} was not "
                                   "triggered") from None
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc
