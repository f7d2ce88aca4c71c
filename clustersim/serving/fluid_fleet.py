"""The figures of fluid deployments the event-driven fleet held (`fluid_plan` made their plans,
`cluster.fluid_holding` their holdings): the fleet-day level's fluid queue and latency books,
vectorised over the steps, on the replicas the holdings actually got.

Per step, the replicas serving are the plan's, but no more than the instances held can carry
(a holding short of its plan, or one that lost instances to failures, serves on fewer), and
instances granted late warm up first (the running minimum over a replica's start time). The
queue is the fleet-day level's (arrivals, at most replicas x capacity served, the rest a
backlog served first), solved in closed form: the backlog after step k is the running sum of
arrivals less capacity minus its lowest value so far (Lindley's recursion), no loop per step.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from clustersim.scenario.models import Scenario
from clustersim.serving.fleetday_figures import fluid_deployment_figures
from clustersim.serving.fleetday_latency import latency_books
from clustersim.serving.fluid_plan import FluidPlan, running

__all__ = ["fluid_queue", "held_per_step", "held_replicas_series", "restarting_per_step",
           "fluid_fleet_figures"]

LEVEL = ("fluid, held in the event-driven fleet beside its jobs (docs/fleet-day.md, "
         "In the event-driven fleet)")


def fluid_queue(arrived: np.ndarray, capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(served, backlog after) per step of a fluid queue starting empty: at most `capacity`
    served a step, the backlog first (Lindley: b_k = S_k - min(0, min_j<=k S_j), S the
    running sum of arrivals less capacity)."""
    if not len(arrived):
        return arrived.copy(), arrived.copy()
    total = np.cumsum(arrived - capacity)
    backlog = np.maximum(total - np.minimum(np.minimum.accumulate(total), 0.0), 0.0)
    before = np.concatenate(([0.0], backlog[:-1]))
    served = np.maximum(before + arrived - backlog, 0.0)
    return served, backlog


def held_per_step(log_s: np.ndarray, log_held: np.ndarray, times_s: np.ndarray
                  ) -> np.ndarray:
    """A holding's instances at each step's start, from its books (a step function)."""
    at = np.searchsorted(log_s, times_s, side="right") - 1
    return np.where(at >= 0, log_held[np.maximum(at, 0)], 0)


def held_replicas_series(plan: FluidPlan, instances: np.ndarray, cpi: int) -> np.ndarray:
    """Replicas serving per step: the plan's, within what the instances held carry, those
    granted late warming up first."""
    fit = instances * cpi // plan.dep.chips
    warm = math.ceil(plan.dep.start_s / plan.dt_s[0] - 1e-9) + 1 if len(plan.dt_s) else 1
    return np.minimum(plan.up, running(fit.astype(np.int64), warm, "min"))


def restarting_per_step(times_s: np.ndarray, hits_s: np.ndarray, down_s: float
                        ) -> np.ndarray:
    """Replicas out of service per step: each hit takes one out from its step to the step
    its detection and restart end in (whole steps)."""
    steps = len(times_s)
    count = np.zeros(steps + 1)
    if len(hits_s) and steps:
        first = np.searchsorted(times_s, hits_s, side="right") - 1
        last = np.searchsorted(times_s, hits_s + down_s, side="right") - 1
        np.add.at(count, np.clip(first, 0, steps - 1), 1)
        np.add.at(count, np.clip(last, 0, steps - 1) + 1, -1)
    return np.cumsum(count)[:steps].astype(np.int64)


def fluid_fleet_figures(scenario: Scenario, plans: list[FluidPlan], holdings: Any
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary.json `deployments`, `serving`) of the fluid deployments a timeline held."""
    cpi = scenario.hardware.chips_per_instance
    price = scenario.hardware.instance.price_per_hour_usd
    chip_price_h = None if price is None else price / cpi
    horizon = scenario.duration_s
    deployments: dict[str, Any] = {}
    tokens_total = chip_h_total = 0.0
    for d, plan in enumerate(plans):
        dep = plan.dep
        log_s, log_held = holdings.counts(d)
        instances = held_per_step(log_s, log_held, plan.times_s)
        up = held_replicas_series(plan, instances, cpi)
        hits = np.asarray(holdings.software_s[d], dtype=float)
        f = scenario.failures
        up = np.maximum(up - restarting_per_step(plan.times_s, hits, f.detect_s + f.restart_s),
                        0)
        dts = plan.dt_s
        arrived = dep.rates * dts
        served, backlog = fluid_queue(arrived, up * dep.curve.capacity_per_s * dts)
        before = np.concatenate(([0.0], backlog[:-1]))
        carried = np.minimum(instances * cpi // dep.chips, plan.held)
        s = {"replicas": up.astype(float), "starting": np.maximum(carried - up, 0).astype(float),
             "draining": np.zeros(len(up)), "instances": instances.astype(float),
             "load_per_s": dep.rates, "served": served,
             "arrived": arrived, "backlog_mean": (before + backlog) / 2.0}
        dep.backlog = float(backlog[-1]) if len(backlog) else 0.0
        changes = np.diff(plan.held)
        dep.scale_ups = int(changes[changes > 0].sum())
        dep.scale_downs = int(-changes[changes < 0].sum())
        dep.preempted_for = holdings.evicted[d]
        dep.failures = holdings.failures[d] + len(hits)
        # in flight on the replicas a failure stops: an instance's (hardware), one (software)
        per_instance = max(1, cpi // dep.chips)
        dep.retries = (holdings.failures[d] * per_instance + len(hits)) \
            * float(dep.curve.e2e_mean_s[0]) * dep.per_replica_rate
        h = latency_books(dep, s, dts)
        figures = fluid_deployment_figures(scenario, dep, s, h, plan.times_s, dts, horizon)
        ends = np.append(log_s[1:], horizon)
        chip_h = float(np.dot(log_held, ends - log_s)) * cpi / 3600.0
        figures.update({
            "level": LEVEL,
            # the chips its holding held (whole blocks of instances; their unused chips too)
            "chip_hours": chip_h,
            "cost_per_million_output_tokens_usd": (
                chip_h * chip_price_h / figures["output_tokens"] * 1e6
                if chip_price_h is not None and figures["output_tokens"] > 0 else None),
            "replica_hours": float(np.dot(up, dts)) / 3600.0,
            "replica_hours_planned": float(np.dot(plan.up, dts)) / 3600.0,
            "replica_shortfall_hours": float(np.dot(np.maximum(plan.up - up, 0), dts)) / 3600,
            "holding_block_instances": plan.block,
            "holding_changes": int(len(plan.change_s)),
            "holding_changes_short": holdings.short_changes[d],
        })
        deployments[plan.name] = figures
        tokens_total += figures["output_tokens"]
        chip_h_total += chip_h
    serving = {
        "level": LEVEL, "interval_s": scenario.fluid.interval_s,
        "chip_hours": chip_h_total, "output_tokens": tokens_total,
        "cost_per_million_output_tokens_usd": (
            chip_h_total * chip_price_h / tokens_total * 1e6
            if chip_price_h is not None and tokens_total > 0 else None),
    }
    return deployments, serving
