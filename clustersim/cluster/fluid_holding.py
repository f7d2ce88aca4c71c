"""Serving deployments as holdings of instances in the timeline, resized at their change
points (their plans come from `clustersim.serving.fluid_plan`: known up front, since a
deployment's demand over the horizon is).

At each change a holding grows or shrinks to the instances asked: growing takes free
instances (whole UltraServers where its replicas need them, on one site where they fit),
and when too few are free evicts running jobs of lower priority than the deployment's
(lowest priority, latest started first, as the scheduler's preemption does: they lose the
work since their last checkpoint and queue again); what still does not fit is a shortfall,
recorded (the deployment serves on fewer replicas). Shrinking gives instances back to the
pool and wakes the scheduler (a replica's drain is in its plan already). A hardware failure
of a held instance takes it out of the holding (its replicas are gone); it is replaced from
the free pool once the failure is detected. A software failure restarts one replica (it is
recorded; the figures take the replica out for the detection and the restart). Site events
leave serving instances alone, as they do request-level deployments'.

The books: each holding's healthy instances after every change, for its chip-time and the
replicas it could serve (`HoldingBook.counts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import simpy

from clustersim.cluster.owners import FLUID, FREE

__all__ = ["Holding", "HoldingBook", "HoldingBooks"]


@dataclass
class Holding:
    """A deployment's plan as the timeline needs it: when its holding changes, to how many
    instances, and the priority it takes them at."""

    name: str
    priority: float
    whole_ultraservers: bool
    change_s: np.ndarray  # (C,) increasing, the first at or after 0
    instances: np.ndarray  # (C,) instances held from each change on


class HoldingTimeline(Protocol):
    """What the holdings read and change of the timeline (cluster.timeline.Timeline)."""

    scenario: Any
    env: simpy.Environment
    scheduler: Any
    active: Any
    cpi: int
    ipu: int
    n_instances: int
    owner: np.ndarray
    healthy: np.ndarray

    def set_owner(self, instances: Any, owner: int) -> None: ...
    def free_mask(self) -> np.ndarray: ...
    def release(self, instances: list[int]) -> None: ...
    def place(self, count: int, whole_ultraservers: bool, free: np.ndarray | None = None,
              held: np.ndarray | None = None) -> np.ndarray | None: ...


class HoldingBook:
    """The holdings of a timeline: their instances (`Timeline.owner` FLUID, `dep_of` which)
    and their books."""

    def __init__(self, timeline: HoldingTimeline, holdings: Sequence[Holding]):
        self.t = timeline
        self.holdings = list(holdings)
        count = len(self.holdings)
        self.dep_of = np.full(timeline.n_instances, -1, dtype=np.int16)
        self.asked = [0] * count
        self.held = [0] * count  # healthy instances each holds (owner FLUID, dep_of it)
        self.log_s: list[list[float]] = [[0.0] for _ in range(count)]
        self.log_held: list[list[int]] = [[0] for _ in range(count)]
        self.evicted = [0] * count  # jobs preempted for it
        self.short_changes = [0] * count  # changes that got fewer instances than asked
        self.failures = [0] * count  # held instances downed by hardware failures
        self.software_s: list[list[float]] = [[] for _ in range(count)]  # replica restarts
        self._topping = False

    # ------------------------------------------------------------------ the plan
    def start(self) -> None:
        """The holdings at 0 (the fleet was serving before), before any job is placed."""
        for d, h in enumerate(self.holdings):
            if len(h.change_s) and h.change_s[0] <= 0.0:
                self.asked[d] = int(h.instances[0])
        for d in self._order(range(len(self.holdings))):
            self._apply(d)

    def run(self):
        """The changes after 0, in time order (at one instant, shrinks before growths, then
        the highest priority first)."""
        env = self.t.env
        times, deps, values = [], [], []
        for d, h in enumerate(self.holdings):
            later = h.change_s > 0.0
            times.append(h.change_s[later])
            values.append(h.instances[later].astype(np.int64))
            deps.append(np.full(int(later.sum()), d, dtype=np.int64))
        if not times:
            return
        at, dep, value = (np.concatenate(x) for x in (times, deps, values))
        if not len(at):
            return
        order = np.lexsort((dep, at))
        at, dep, value = at[order].tolist(), dep[order].tolist(), value[order].tolist()
        i = 0
        while i < len(at):
            now = at[i]
            if now > env.now:
                yield env.timeout(now - env.now)
            changed = []
            while i < len(at) and at[i] == now:
                self.asked[dep[i]] = value[i]
                changed.append(dep[i])
                i += 1
            for d in self._order(changed):
                self._apply(d)

    def _order(self, deps) -> list[int]:
        """Shrinks first (what they give back may serve a growth), then by priority."""
        return sorted(deps, key=lambda d: (self.asked[d] >= self._held_count(d),
                                           -self.holdings[d].priority, d))

    # ------------------------------------------------------------------ one change
    def _held(self, d: int) -> np.ndarray:
        t = self.t
        return np.flatnonzero((self.dep_of == d) & (t.owner == FLUID) & t.healthy)

    def _held_count(self, d: int) -> int:
        return self.held[d]

    def _apply(self, d: int) -> None:
        want = self.asked[d]
        if self.held[d] > want:
            give = self._held(d)[want:]  # the last (whole UltraServers when it holds those)
            self.dep_of[give] = -1
            self.t.set_owner(give, FREE)
            self.held[d] -= len(give)
            self._record(d)
            self.t.release(give.tolist())
            return
        if self.held[d] < want:
            short = want - self.held[d]
            if self._grow(d, short) < short:
                self.short_changes[d] += 1
        self._record(d)

    def _grow(self, d: int, need: int) -> int:
        t = self.t
        h = self.holdings[d]
        whole = h.whole_ultraservers and t.ipu > 1 and need % t.ipu == 0
        free = t.free_mask()
        chosen = t.place(need, whole, free)
        if chosen is None:
            self._evict_for(d, need - int(np.count_nonzero(free)))
            free = t.free_mask()
            chosen = t.place(need, whole, free)
        if chosen is None:  # what fits: whole free UltraServers, or free instances
            chosen = self._what_fits(free, need, whole)
        if len(chosen):
            t.set_owner(chosen, FLUID)
            self.dep_of[chosen] = d
            self.held[d] += len(chosen)
            t.scheduler.record_state()
        return len(chosen)

    def _evict_for(self, d: int, short: int) -> None:
        """Evict jobs below the deployment's priority until `short` more instances are free
        (or none is left to evict)."""
        t = self.t
        priority = self.holdings[d].priority
        if short <= 0 or t.active.lowest_priority() >= priority:
            return
        now = t.env.now
        victims, freed = [], 0
        for run in t.active.by_preemption_order(priority):
            if not run.held_count or run.state == "done" or run.ends_by(now):
                continue
            victims.append(run)
            freed += run.held_count
            if freed >= short:
                break
        for victim in victims:  # (after the walk: evicting changes what it walks)
            victim.evict()
        self.evicted[d] += len(victims)

    def _what_fits(self, free: np.ndarray, need: int, whole: bool) -> np.ndarray:
        t = self.t
        if whole and t.n_instances % t.ipu == 0:
            units = np.flatnonzero(free.reshape(-1, t.ipu).all(axis=1))[: need // t.ipu]
            return (units[:, None] * t.ipu + np.arange(t.ipu)).ravel()
        return np.flatnonzero(free)[:need]

    def _record(self, d: int) -> None:
        now = float(self.t.env.now)
        count = self._held_count(d)
        if self.log_s[d][-1] == now:
            self.log_held[d][-1] = count
        else:
            self.log_s[d].append(now)
            self.log_held[d].append(count)

    # ------------------------------------------------------------------ failures
    def hit(self, inst: int) -> None:
        """A hardware failure downed a held instance (already marked unhealthy): it leaves
        the holding (back to the pool once repaired); a replacement is sought once the
        failure is detected."""
        d = int(self.dep_of[inst])
        self.dep_of[inst] = -1
        if d < 0:
            return
        self.failures[d] += 1
        self.held[d] -= 1
        self._record(d)
        if not self._topping:
            self._topping = True
            self.t.env.process(self._top_up())

    def software(self, inst: int) -> None:
        """A software failure on a held (healthy) instance: one of its replicas restarts (the
        figures take it out of service for the detection and the restart)."""
        d = int(self.dep_of[inst])
        if d >= 0:
            self.software_s[d].append(float(self.t.env.now))

    def _top_up(self):
        yield self.t.env.timeout(self.t.scenario.failures.detect_s)
        self._topping = False
        for d in self._order(range(len(self.holdings))):
            if self._held_count(d) < self.asked[d]:
                self._apply(d)

    # ------------------------------------------------------------------ books
    def books(self) -> HoldingBooks:
        """What the run's figures read (picklable: a replication's result crosses processes)."""
        for d in range(len(self.holdings)):  # the running counts are the owners'
            if self.held[d] != len(self._held(d)):
                raise AssertionError(f"holding {self.holdings[d].name}: {self.held[d]} "
                                     f"counted, {len(self._held(d))} owned")
        return HoldingBooks(self.t.cpi, [list(x) for x in self.log_s],
                            [list(x) for x in self.log_held], list(self.evicted),
                            list(self.short_changes), list(self.failures),
                            [list(x) for x in self.software_s])


@dataclass
class HoldingBooks:
    """Each holding's healthy instances after every change, and its counts."""

    cpi: int
    log_s: list[list[float]]
    log_held: list[list[int]]
    evicted: list[int]  # jobs preempted for each holding
    short_changes: list[int]  # changes that got fewer instances than asked
    failures: list[int]  # held instances downed by hardware failures
    software_s: list[list[float]]  # times of software failures restarting a replica

    def counts(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """(times, healthy instances held from each on) of holding `d`."""
        return np.asarray(self.log_s[d]), np.asarray(self.log_held[d], dtype=np.int64)

    def chip_s(self, horizon_s: float) -> float:
        """Chip-seconds the holdings held (healthy instances) over the horizon."""
        total = 0.0
        for d in range(len(self.log_s)):
            times, held = self.counts(d)
            ends = np.minimum(np.append(times[1:], horizon_s), horizon_s)
            total += float(np.dot(held, ends - np.minimum(times, horizon_s)))
        return total * self.cpi
