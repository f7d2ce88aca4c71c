"""Failures and repairs: every failure process of the scenario as one superposed stream, the
blast radius of each fault, and the repair of downed instances.

Every exponential process of every component (chip, HBM, NeuronLink, NIC, host, leaf
switch, software, ...), per chip, instance, UltraServer or leaf, is one superposed Poisson
stream: one exponential draw for the next failure, then which process and which unit.
Weibull processes keep a heap of per-unit next-failure times, drawn vectorised.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from clustersim.cluster.owners import FLUID, FREE, SERVING
from clustersim.cluster.rates import effective_rates, failure_population
from clustersim.hardware.failures import weibull_scale

if TYPE_CHECKING:
    from clustersim.cluster.ports import FaultsTimeline

__all__ = ["FailureProcess", "FailureSource"]


@dataclass(frozen=True)
class FailureProcess:
    """One failure process over a population of units."""

    component: str
    cause: str
    per: str
    rate_per_s: float  # per unit
    shape: float | None  # Weibull shape, None for exponential


class FailureSource:
    """The failures of one timeline: which unit fails when, what goes down, repairs."""

    def __init__(self, timeline: FaultsTimeline):
        self.t = timeline
        self.rng = timeline.rng_failures
        self.failures: Counter = Counter()
        self.failures_by_cause: Counter = Counter()
        self.repairs = 0
        self.populations = failure_population(self.t.scenario)  # the budget's too
        scale = self.t.scenario.failures.scale
        self.exp_processes: list[FailureProcess] = []
        self.exp_weights: list[float] = []
        self.weibull_heap: list[tuple[float, int, int]] = []
        self.weibull_processes: list[FailureProcess] = []
        for spec in effective_rates(self.t.scenario):
            rate = spec.events_per_s * scale
            if rate <= 0:
                continue
            proc = FailureProcess(spec.component, spec.cause or spec.component, spec.per, rate,
                                  spec.shape if spec.distribution == "weibull" else None)
            count = self.population(spec.per)
            if count == 0:
                continue
            if proc.shape is None:
                self.exp_processes.append(proc)
                self.exp_weights.append(rate * count)
            else:
                index = len(self.weibull_processes)
                self.weibull_processes.append(proc)
                scale_s = weibull_scale(1.0 / rate, proc.shape)
                times = scale_s * self.rng.weibull(proc.shape, count)
                self.weibull_heap.extend(zip(times.tolist(), [index] * count, range(count),
                                             strict=True))
        heapq.heapify(self.weibull_heap)
        self.exp_total = float(sum(self.exp_weights))
        self.exp_cumulative = np.cumsum(self.exp_weights) / self.exp_total if self.exp_total else (
            np.array([]))

    def run(self):
        """The simpy process: the next failure of every process, one at a time."""
        env = self.t.env
        next_exp = env.now + (self.rng.exponential(1.0 / self.exp_total)
                              if self.exp_total > 0 else math.inf)
        while True:
            next_weibull = self.weibull_heap[0][0] if self.weibull_heap else math.inf
            when = min(next_exp, next_weibull)
            if not math.isfinite(when):
                return
            yield env.timeout(max(0.0, when - env.now))
            if next_exp <= next_weibull:
                index = int(np.searchsorted(self.exp_cumulative, self.rng.random(),
                                            side="right"))
                proc = self.exp_processes[min(index, len(self.exp_processes) - 1)]
                unit = int(self.rng.integers(self.population(proc.per)))
                next_exp = env.now + self.rng.exponential(1.0 / self.exp_total)
            else:
                _, index, unit = heapq.heappop(self.weibull_heap)
                proc = self.weibull_processes[index]
                # Renewal: the unit's next failure is drawn from its return to service.
                back = env.now + (self.t.repair_s if proc.component != "software" else 0.0)
                if math.isfinite(back):
                    gap = weibull_scale(1.0 / proc.rate_per_s, proc.shape) * (
                        self.rng.weibull(proc.shape))
                    heapq.heappush(self.weibull_heap, (back + gap, index, unit))
            self.fail(proc, unit)

    def population(self, per: str) -> int:
        return self.populations[per]

    def _instances_of(self, per: str, unit: int) -> range:
        if per == "chip":
            first = unit // self.t.cpi
            return range(first, first + 1)
        if per == "instance":
            return range(unit, unit + 1)
        if per == "ultraserver":
            return range(unit * self.t.ipu, min(self.t.n_instances, (unit + 1) * self.t.ipu))
        return range(unit * self.t.per_leaf, min(self.t.n_instances, (unit + 1) * self.t.per_leaf))

    def fail(self, proc: FailureProcess, unit: int) -> None:
        """Apply one failure: down the hardware it hits and interrupt the jobs on it."""
        now = self.t.env.now
        if proc.per == "job":  # a job-level fault (software): no hardware goes down
            run = self.t.jobs[unit]
            if run.state in ("running", "checkpointing"):  # software fails while it trains
                first = int(run.held[0]) if run.held_count else 0
                self._count(proc, first * self.t.cpi, first, unit)
                run.interrupt(proc.component, [])
            return
        instances = self._instances_of(proc.per, unit)
        chip = unit if proc.per == "chip" else instances[0] * self.t.cpi
        if proc.component == "software":
            job = int(self.t.owner[instances[0]])
            if job >= 0 and self.t.jobs[job].state in ("running", "checkpointing"):
                self._count(proc, chip, instances[0], job)
                self.t.jobs[job].interrupt(proc.component, [])
            elif job == FLUID and self.t.holdings is not None:  # a replica restarts
                self._count(proc, chip, instances[0], -1)
                self.t.holdings.software(instances[0])
            return
        hit_jobs: dict[int, list[int]] = {}
        downed = free_downed = False
        repaired: list[int] = []  # what this failure downed: repaired together
        for inst in instances:
            if not self.t.healthy[inst]:
                continue  # already down: this failure changes nothing
            downed = True
            self.t.set_healthy(inst, False)
            self.t.instance_down_since[inst] = now
            job = int(self.t.owner[inst])
            if job >= 0:
                hit_jobs.setdefault(job, []).append(inst)
            elif job == FREE:
                free_downed = True
            elif job == SERVING:  # the serving simulator takes its replicas down
                chip_in_instance = unit - inst * self.t.cpi if proc.per == "chip" else -1
                free_downed |= self._serving_down(inst, chip_in_instance, now)
            elif job == FLUID and self.t.holdings is not None:  # its replicas are gone
                self.t.holdings.hit(inst)
            repaired.append(inst)
        if not downed:
            return
        if math.isfinite(self.t.repair_s):
            self.t.env.process(self._repair(repaired))
        self._count(proc, chip, instances[0], next(iter(hit_jobs), -1))
        if free_downed:  # the free pool shrank with no job to tell: record it now
            self.t.scheduler.record_state()
        for job, lost in hit_jobs.items():
            self.t.jobs[job].interrupt(proc.component, lost)

    def _serving_down(self, inst: int, chip_in_instance: int, now: float) -> bool:
        """A failure downed an instance a serving deployment holds: record the outage of its
        slot (the deployment's instance position) for the serving simulator, with how long
        the replicas stay down. With hot spares, a free healthy instance takes the slot at
        once (the replicas restart on it; the failed one joins the pool once repaired);
        without, the replicas wait for the repair. Returns whether the pool shrank."""
        t = self.t
        f = t.scenario.failures
        slot = int(t.serving_slot[inst])
        took_spare = False
        spares = t.scenario.total_instances > t.scenario.working_instances  # per site too
        free = np.flatnonzero(t.free_mask()) if spares else ()
        if len(free):
            spare = int(free[-1])  # the pool's last: spares sit at the end of the cluster
            t.set_owner(spare, SERVING)
            t.set_owner(inst, FREE)
            t.serving_slot[spare], t.serving_slot[inst] = slot, -1
            t.serving_per_leaf[t.instance_leaf[spare]] += 1
            t.serving_per_leaf[t.instance_leaf[inst]] -= 1
            down_s = f.detect_s + f.restart_s
            took_spare = True
        elif math.isfinite(t.repair_s):
            down_s = f.detect_s + t.repair_s + f.restart_s
        else:
            down_s = math.inf
        t.serving_outages.append((now, slot, chip_in_instance, down_s))
        return took_spare

    def _count(self, proc: FailureProcess, chip: int, instance: int, job: int) -> None:
        self.failures[proc.component] += 1
        self.failures_by_cause[proc.cause] += 1
        if self.t.recorder is not None:
            self.t.recorder.event(self.t.env.now, "failure", proc.component, chip, instance, job)

    def _repair(self, instances: list[int]):
        """The instances one failure downed come back together, in one scheduler pass (an
        UltraServer or a leaf switch is one repair, not one pass per instance)."""
        yield self.t.env.timeout(self.t.repair_s)
        for inst in instances:
            self.t.set_healthy(inst, True)
            self.repairs += 1
            if self.t.recorder is not None:
                self.record_down(inst, self.t.env.now)
                self.t.recorder.event(self.t.env.now, "repair", "", inst * self.t.cpi, inst, -1)
        self.t.release(instances)

    def record_down(self, inst: int, end_s: float) -> None:
        """Chip intervals of a downed instance: `failed` until the failure is detected, then
        `repairing` until it is back (or the horizon). The instance is the unit of repair, so
        all its chips share the two intervals. Without repairs it stays `failed`."""
        assert self.t.recorder is not None
        start = float(self.t.instance_down_since[inst])
        detected = min(start + self.t.scenario.failures.detect_s, end_s)
        if not math.isfinite(self.t.repair_s):
            detected = end_s
        first = inst * self.t.cpi
        # The chips' rows in one call, in the order row by row gave them (785,000 calls in
        # the 30-day slice of rainier-year)
        spans = ([("failed", start, detected)] if detected > start else []) + (
            [("repairing", detected, end_s)] if end_s > detected else [])
        self.t.recorder.interval_rows([("chip", chip, state, since, until)
                                       for chip in range(first, first + self.t.cpi)
                                       for state, since, until in spans])
