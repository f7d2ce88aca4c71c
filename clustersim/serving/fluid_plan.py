"""Fluid deployments inside the event-driven fleet: each autoscaled deployment's replicas over
the horizon, worked out up front and vectorised, as a holding of instances that changes only
where its count does (docs/fleet-day.md, "In the event-driven fleet").

A deployment's demand over the horizon is known before the run: its load curve with the noise
the run's seed draws (the fleet-day level's draws, `fleetday_state.deployment_states`). The
autoscaler of the fleet-day level is then a few array operations per deployment, not a loop
per step:

- at each decision (every `autoscale.interval`) the need is the rate observed in the last
  step over what one replica is provisioned for (utilisation: target x capacity; slo: the
  rate held within the SLO over 1 + headroom), clipped to [min, max];
- scaling down waits until the need stayed lower for `scale_down_after`: the count kept is
  the need's running maximum over that window (scaling up at once, down to the window's
  highest need: the fleet-day level's rule, step for step, without the backlog's term);
- a new replica serves after its weights load and its warm-up (`start_s`): the replicas up
  are the count's running minimum over that span; a removed one holds its chips for `drain`:
  the replicas held are the count's running maximum over it.

The holding is in whole UltraServers (whole instances without them) and moves in blocks of
about 1/HOLD_LEVELS of the deployment's peak, so the timeline sees a few hundred changes a
day, not one a minute; the chips of a block's unused part are held by serving (idle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from clustersim.scenario.fleetday import resolved_fidelity
from clustersim.scenario.models import Scenario
from clustersim.serving.fleetday_state import DeploymentState, deployment_states

__all__ = ["HOLD_LEVELS", "FluidPlan", "fluid_plans", "autoscaled_counts", "running",
           "holding_blocks", "change_points"]

# A holding moves in blocks of about its peak over this many (whole UltraServers).
HOLD_LEVELS = 100


@dataclass
class FluidPlan:
    """One deployment's plan: per step, the replicas the autoscaler wants held and serving,
    and the instances its holding asks the timeline for at each change."""

    dep: DeploymentState
    times_s: np.ndarray  # (T,) step starts
    dt_s: np.ndarray  # (T,)
    held: np.ndarray  # (T,) replicas holding chips (serving, loading, warming, draining)
    up: np.ndarray  # (T,) replicas serving, were every instance granted
    block: int  # instances per block of the holding
    change_s: np.ndarray  # (C,) times the holding changes (the first at 0 or its start)
    instances: np.ndarray  # (C,) instances held from each change on

    @property
    def name(self) -> str:
        return self.dep.spec.name


def running(values: np.ndarray, window: int, how: str) -> np.ndarray:
    """The running maximum or minimum of `values` over each step and the `window` - 1 before
    it (those before the first taken as the first)."""
    if window <= 1 or not len(values):
        return values.copy()
    padded = np.concatenate((np.full(window - 1, values[0], dtype=values.dtype), values))
    view = sliding_window_view(padded, window)
    return view.max(axis=1) if how == "max" else view.min(axis=1)


def autoscaled_counts(rates: np.ndarray, per_replica_rate: float, minimum: int, maximum: int,
                      every: int, keep_decisions: int, start_step: int = 0) -> np.ndarray:
    """The replica count the autoscaler sets at each step: its need at each decision (every
    `every` steps, on the last step's rate) kept at the highest over the last
    `keep_decisions` + 1 decisions, held between decisions; 0 before `start_step`."""
    steps = len(rates)
    decisions = np.arange(0, steps, every)
    observed = rates[np.maximum(decisions - 1, 0)]
    need = np.ceil(observed / per_replica_rate - 1e-9)
    need = np.clip(need, minimum, maximum).astype(np.int64)
    if start_step:
        # its first decision sees its first step's load (it starts loaded, `place`)
        first = int(np.searchsorted(decisions, start_step))
        if first < len(need):
            at = min(start_step, steps - 1)
            need[first] = int(np.clip(math.ceil(rates[at] / per_replica_rate - 1e-9),
                                      minimum, maximum))
    kept = running(need, keep_decisions + 1, "max")
    counts = np.repeat(kept, every)[:steps]
    counts[:start_step] = 0
    return counts


def holding_blocks(held_replicas: np.ndarray, chips: int, cpi: int, ipu: int
                   ) -> tuple[np.ndarray, int]:
    """Instances held per step, rounded up to whole blocks, and the block: whole UltraServers
    (`ipu` instances), about the peak over HOLD_LEVELS of them."""
    per = np.ceil(held_replicas * chips / cpi).astype(np.int64)
    peak = int(per.max()) if len(per) else 0
    block = ipu * max(1, math.ceil(peak / (HOLD_LEVELS * ipu)))
    return -(-per // block) * block, block


def change_points(times_s: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, values) where a step function changes (and its first value)."""
    if not len(values):
        return times_s[:0], values[:0]
    at = np.concatenate(([0], np.flatnonzero(np.diff(values)) + 1))
    return times_s[at], values[at]


def fluid_plans(scenario: Scenario, seed: int) -> list[FluidPlan]:
    """Every fluid deployment's plan over the scenario's horizon, at `fluid.interval`."""
    hw = scenario.hardware
    cpi, ipu = hw.chips_per_instance, max(1, hw.instances_per_ultraserver)
    horizon = scenario.duration_s
    step = scenario.fluid.interval_s
    steps = max(1, math.ceil(horizon / step - 1e-9))
    times = np.arange(steps) * step
    dts = np.minimum(step, horizon - times)
    fluid = {d.name for d in scenario.serve if resolved_fidelity(d, horizon) == "fluid"}
    plans = []
    for dep in deployment_states(scenario, seed, fluid, times, step):
        a = dep.spec.autoscale
        start_step = min(steps - 1, math.ceil(dep.spec.start_s / step - 1e-9))
        if a is None:  # a fixed count: what it holds from its start
            counts = np.full(steps, dep.minimum, dtype=np.int64)
            counts[:start_step] = 0
            held, up = counts, counts
        else:
            every = max(1, round(a.interval_s / step))
            keep = int(a.scale_down_after_s // (every * step))
            counts = autoscaled_counts(dep.rates, dep.per_replica_rate, dep.minimum,
                                       dep.maximum, every, keep, start_step)
            held = running(counts, math.ceil(a.drain_s / step - 1e-9) + 1, "max")
            # loaded before its start (or the horizon's): the first count is up at once
            loaded = counts.copy()
            loaded[:start_step] = counts[start_step]
            up = running(loaded, math.ceil(dep.start_s / step - 1e-9) + 1, "min")
            up[:start_step] = 0
        instances, block = holding_blocks(held, dep.chips, cpi, ipu)
        change_s, values = change_points(times, instances)
        plans.append(FluidPlan(dep, times, dts, held, up, block, change_s, values))
    return plans
