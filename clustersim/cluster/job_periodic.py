"""A job's training between state-changing events, with its periodic checkpoints in closed
form (`clustersim.cluster.periodic`): one segment from now to the step target, the
horizon or the end of a transient slowdown, however many checkpoints fall inside it.

A part of JobRun (`clustersim.cluster.jobrun`), which holds the state these methods keep.
The per-checkpoint version (`JobRun._train`, one event per checkpoint) stays as the
reference the closed form is tested against (Timeline(checkpoint_events=True)).

Trace: a blocking write is still a `checkpointing` interval of the job (the rows are made
together when the segment is credited); the checkpoints a segment completes are one
`checkpoint` row of the events table, when the segment ends, with their count, period and
the first one's completion.
"""

from __future__ import annotations

import math

import numpy as np

from clustersim.cluster.instants import event_at
from clustersim.cluster.job_recovery import Ended
from clustersim.cluster.periodic import (
    async_snapshots,
    blocking_span,
    blocking_wall_for,
    blocking_writes,
)

__all__ = ["PeriodicTraining"]

_RUNNING, _WRITING = 0, 1
_STATE_NAMES = ("running", "checkpointing")


def segment_steps(steps: float, training_s: float, seconds: float) -> float:
    """The steps of `seconds` (at most `training_s`) of a segment training `steps` in
    `training_s`: as a share of it, not through its rate, which overflows when a jittered
    segment draws a training time of a few 1e-300 s (inf x 0 = NaN)."""
    return steps * min(seconds / training_s, 1.0) if training_s > 0 else 0.0


class PeriodicTraining:
    """Training segments with their checkpoints worked out, not simulated one by one."""

    def _train_closed(self):
        """Run until the step target, the horizon or a pace change. Returns True when the
        step target is reached."""
        env = self.t.env
        out = self.outcome
        if self.t.scenario.stragglers.transient is not None:
            self.pace = self._pace()
        step_s = self.step_time * self.pace
        remaining = math.inf if out.steps_target is None else out.steps_target - self.progress
        if remaining <= 1e-9:
            return True
        now = env.now
        cap = self.t.scenario.duration_s - now
        if self.pace_until > now:
            cap = min(cap, self.pace_until - now)
        cap = max(cap, 0.0)
        need = remaining * step_s
        nominal = min(need, cap)
        steps_planned = nominal / step_s
        training = nominal
        jitter = self.t.scenario.stragglers.jitter
        if jitter > 0 and steps_planned > 0:
            drawn = float(self.t.rng_jobs.gamma(steps_planned / jitter**2, step_s * jitter**2))
            # A sliver of a step (up to a pace change) runs at its nominal time: a gamma of
            # so small a shape draws nearly 0 almost always, and a segment that did not move
            # the clock was planned again at the same instant (180 times in one run).
            training = drawn if steps_planned >= 1.0 else nominal
        ck = self.checkpoint
        full = (training if ck.async_write
                else blocking_wall_for(self.cycle_u, training, self.interval, ck.write_s))
        wall = min(full, cap) if nominal < need else full
        to_target = nominal >= need and wall >= full
        self.closed_segment = (now, training, steps_planned, wall, to_target)
        # Its run time ends first (or with it: the end's watch came first): the segment,
        # planned as ever, is cut there, as the watch's interrupt would cut it.
        end = self.run_end if not self.end_armed else None
        cut = end is not None and end <= now + wall
        try:
            yield event_at(env, end) if cut else env.timeout(wall)
        except BaseException:
            self._credit_segment(env.now)
            raise
        self._credit_segment(env.now)
        if cut:
            raise Ended("run_for")
        if to_target:
            self.progress = float(out.steps_target)
            return True
        return False

    def _credit_closed(self, now: float) -> None:
        """Credit a closed-form segment up to `now`: training, the checkpoints completed,
        the time spent writing; once."""
        start, training, steps, wall, to_target = self.closed_segment
        self.closed_segment = None
        elapsed = min(max(now - start, 0.0), wall)
        ck = self.checkpoint
        interval, write = self.interval, ck.write_s
        p0, r0 = self.progress, self.outcome.running_s
        recorder = self.t.recorder
        if ck.async_write:
            trained = training if (to_target and elapsed >= wall) else min(elapsed, training)
            x0 = self.since_snapshot
            self._advance(segment_steps(steps, training, trained) if trained < training
                          else steps, trained, now)
            completed, last, pending = async_snapshots(x0, trained, interval, write)
            if completed:
                self.saved = (p0 + segment_steps(steps, training, last), r0 + last)
                self.outcome.checkpoints_completed += completed
                if recorder is not None:
                    first = start + last + write - (completed - 1) * interval
                    recorder.event(now, "checkpoint", "async", -1, -1, self.index,
                                   completed, interval, first)
            self.async_pending.extend(
                (start + o + write, p0 + segment_steps(steps, training, o), r0 + o) for o in pending.tolist())
            taken_last = (last if completed else None)
            if len(pending):
                taken_last = float(pending[-1])
            self.since_snapshot = (x0 + trained if taken_last is None
                                   else trained - taken_last)
            return
        u0 = self.cycle_u
        span = blocking_span(u0, elapsed, interval, write)
        trained = training if (to_target and elapsed >= wall) else min(span.training_s, training)
        self._advance(segment_steps(steps, training, trained) if trained < training
                          else steps, trained, now)
        if span.completed:
            saved = min(span.saved_training_s, training)
            self.saved = (p0 + segment_steps(steps, training, saved), r0 + saved)
            self.outcome.checkpoints_completed += span.completed
            if recorder is not None:
                first_end = start + (interval + write) - u0
                recorder.event(now, "checkpoint", "blocking", -1, -1, self.index,
                               span.completed, interval + write, first_end)
        reached = to_target and elapsed >= wall  # no write under way at the target
        self.cycle_u = min(span.u_end, interval) if reached else span.u_end
        self.since_snapshot = min(self.cycle_u, interval)
        starts, ends = blocking_writes(u0, elapsed, interval, write)
        if len(starts):
            self._periodic_states(start, start + elapsed, starts, ends,
                                  span.writing and not reached)

    def _periodic_states(self, start: float, now: float, starts: np.ndarray, ends: np.ndarray,
                         writing: bool) -> None:
        """The job's state pieces (running, checkpointing) from its last state change to
        `now`, writes at start + starts .. start + ends: time by state and trace rows; the
        state is left open from the last piece's start."""
        n = len(starts)
        bounds = np.empty(2 * n + 3)
        bounds[0], bounds[1], bounds[-1] = self.state_since, start, now
        bounds[2:-1:2] = start + starts
        bounds[3:-1:2] = start + ends
        codes = np.empty(2 * n + 2, dtype=np.int8)
        codes[0] = _WRITING if self.state == "checkpointing" else _RUNNING
        codes[1:-1:2], codes[2:-1:2], codes[-1] = _RUNNING, _WRITING, _RUNNING
        lengths = np.diff(bounds)
        keep = lengths > 0
        piece_start, piece_end, codes = bounds[:-1][keep], bounds[1:][keep], codes[keep]
        if len(codes):  # merge neighbours in the same state
            first = np.concatenate(([True], codes[1:] != codes[:-1]))
            heads = np.flatnonzero(first)
            piece_end = np.append(piece_start[heads[1:]], piece_end[-1])
            piece_start, codes = piece_start[heads], codes[heads]
        final = _WRITING if writing else _RUNNING
        open_from = now
        if len(codes) and codes[-1] == final:
            open_from = float(piece_start[-1])
            piece_start, piece_end, codes = piece_start[:-1], piece_end[:-1], codes[:-1]
        times = self.outcome.time_in_state
        length = piece_end - piece_start
        for code, name in enumerate(_STATE_NAMES):
            times[name] += float(length[codes == code].sum())
        if self.t.recorder is not None and len(codes):
            self.t.recorder.interval_rows([
                ("job", self.index, _STATE_NAMES[c], a, b)
                for c, a, b in zip(codes.tolist(), piece_start.tolist(), piece_end.tolist(),
                                   strict=True)])
        self.state, self.state_since = _STATE_NAMES[final], open_from
