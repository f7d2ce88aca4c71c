"""A trial of one deployment against its SLO: a request-level run that stops as soon as its
SLO attainment can no longer reach a target, and can be finished later if its figures are
needed after all.

The serving planner asks of most runs only whether at least `goodput` of the requests meet
the SLO; an overloaded one decides that in its first minutes (every queued request's TTFT is
already over the bound) and spends the rest of its run on requests that change nothing.

The bound is exact, not an estimate: a request counts as missed only once nothing that can
still happen makes it meet the SLO:

- rejected (its KV cache never fits), or finished outside a TTFT or TPOT bound (the test the
  figures apply, `deployment_figures`);
- its first token came after the TTFT bound: a failure clears a first token and the retried
  one comes later still, so a late first token stays late;
- no first token yet and the TTFT bound already past (`now - arrival > ttft`): the first
  token can only come at `now` or later.

When more than `(1 - goodput)` of all the requests have missed, at most `requests - missed`
can meet the SLO; with that share under `goodput` (the same float division the figures use)
the run's `slo_goodput` is under it too, whatever comes next. The checks read the requests'
state and change nothing, so a trial that is not stopped runs the same events, in the same
order, as a run without one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL

__all__ = ["SloTrial", "CHECKS_PER_HORIZON"]

# Checks over the horizon: a stop comes at most 1/CHECKS_PER_HORIZON of the horizon after
# the decision, for about a hundred passes over the request arrays (each a few hundred
# microseconds for tens of thousands of requests).
CHECKS_PER_HORIZON = 100


class SloTrial:
    """Watches deployment `name` of a serving run and stops the run once fewer than
    `goodput` of its requests can meet the SLO. After the run: `stopped_at_s` (None when it
    ran to its end) and `missed` (requests known to miss then); `finish()` runs the rest."""

    def __init__(self, name: str, goodput: float):
        if not 0.0 < goodput <= 1.0:
            raise ValueError(f"goodput {goodput!r}: expected a share in (0, 1]")
        self.name = name
        self.goodput = goodput
        self.stopped_at_s: float | None = None
        self.missed = 0
        self._env: Any = None
        self._end: Any = None

    @property
    def stopped(self) -> bool:
        return self.stopped_at_s is not None

    def run(self, env: Any, fleets: dict[str, Any], end: simpy.Event, horizon_s: float
            ) -> None:
        """Run `env` until `end` (the run's own end) or the decision, whichever first."""
        fleet = fleets.get(self.name)
        self._env, self._end = env, end
        if fleet is None or len(fleet.arrival_s) == 0:
            env.run_until(end)
            return
        until = _Until()
        end.callbacks.append(until.reached)
        step_s = max(horizon_s, 1e-9) / CHECKS_PER_HORIZON
        slo = fleet.spec.slo
        n = len(fleet.arrival_s)
        # The most misses that still leave goodput within reach: one more decides.
        allowed = _allowed_misses(n, self.goodput)
        outputs = fleet.output_tokens.astype(float)
        decoding = outputs > 1

        def check(_event: Any) -> None:
            if until.callbacks is None:  # the run's end, or decided
                return
            now = env.now
            status = fleet.status
            first = fleet.first_token_s
            arrival = fleet.arrival_s
            done = status == 1
            waited = arrival <= now
            late_first = (first - arrival) > slo.ttft_s  # NaN compares False
            no_first = np.isnan(first) & waited & ((now - arrival) > slo.ttft_s)
            slow = done & decoding & (
                (fleet.finish_s - first) / np.maximum(outputs - 1, 1) > slo.tpot_s)
            missed = int(((status == 2) | late_first | no_first | slow).sum())
            if missed > allowed:
                self.missed = missed
                self.stopped_at_s = now
                until.reached(None)
                return
            _later(env, step_s, check)

        _later(env, step_s, check)
        env.run_until(until)

    def finish(self) -> None:
        """Run a stopped trial to the run's own end (its figures are then the full run's)."""
        if self.stopped_at_s is None:
            return
        self._env.run_until(self._end)
        self.stopped_at_s = None


def _allowed_misses(requests: int, goodput: float) -> int:
    """The most misses with `(requests - misses) / requests >= goodput` still possible (the
    division `deployment_figures` makes), -1 when even none fall short."""
    misses = max(-1, requests - int(np.ceil(goodput * requests)) + 1)
    # float rounding: step to the exact edge of the figures' own test
    while misses >= 0 and float(requests - misses) / requests < goodput:
        misses -= 1
    while misses + 1 <= requests and float(requests - misses - 1) / requests >= goodput:
        misses += 1
    return misses


class _Until:
    """What `run_until` runs until: it stops once `callbacks` is None, set by the run's end
    (right after its callbacks, as a run until `end` itself would stop) or by the decision."""

    def __init__(self) -> None:
        self.callbacks: list[Any] | None = []

    def reached(self, _event: Any) -> None:
        self.callbacks = None


def _later(env: Any, delay_s: float, callback: Any) -> None:
    """A check `delay_s` from now, after the run's own events due then (a lower priority
    than NORMAL): it reads the state they leave."""
    event = simpy.Event(env)
    event.callbacks.append(callback)
    event._ok = True
    event._value = None
    env.schedule(event, NORMAL + 1, delay_s)
