"""A fleet day's figures and tables: latency percentiles from the run's histograms, chip
hours by state, tokens and interruptions per job (day.parquet, fleet.parquet)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from clustersim.analysis.trace import SCHEMAS
from clustersim.hardware.stacks import with_stack
from clustersim.scenario.models import Scenario
from clustersim.serving.fidelity import fluid_fidelity
from clustersim.serving.fleetday_state import (
    CHIP_STATES,
    HISTOGRAM_EDGES_S,
    DeploymentState,
    FleetDayResult,
)
from clustersim.serving.layers import mixture_overheads_fitted

__all__ = [
    "day_table",
    "fleet_day_figures",
    "fleet_table",
    "fluid_deployment_figures",
    "percentile_of",
]


def percentile_of(counts: np.ndarray, q: float) -> float | None:
    total = counts.sum()
    if total <= 0:
        return None
    cumulative = np.cumsum(counts) / total
    i = int(np.searchsorted(cumulative, q))
    i = min(i, len(counts) - 1)
    # geometric middle of the bin, interpolated within it
    low, high = HISTOGRAM_EDGES_S[i], HISTOGRAM_EDGES_S[i + 1]
    before = cumulative[i - 1] if i else 0.0
    share = (q - before) / max(cumulative[i] - before, 1e-12)
    return float(low * (high / low) ** min(max(share, 0.0), 1.0))


def fleet_day_figures(scenario: Scenario, result: FleetDayResult) -> dict[str, Any]:
    """summary.json `fleet_day` and `deployments.<name>` figures of a fleet-day run."""
    hw = scenario.hardware
    price = hw.instance.price_per_hour_usd
    chip_price_h = None if price is None else price / hw.chips_per_instance
    dts = result.dt_s
    hours = {s: float(np.dot(result.fleet[s], dts)) / 3600.0 for s in CHIP_STATES}
    deployments = {}
    serving_tokens = 0.0
    for dep in result.deployments:
        figures = fluid_deployment_figures(scenario, dep, result.series[dep.spec.name],
                                           result.histograms[dep.spec.name],
                                           result.times_s, dts, result.horizon_s)
        serving_tokens += figures["output_tokens"]
        deployments[dep.spec.name] = figures
    jobs = {}
    trained = 0.0
    for job in result.jobs:
        tokens = max(0.0, job.tokens)
        trained += tokens
        end = job.done_s if job.done_s is not None else result.horizon_s
        jobs[job.name] = {
            # the timeline's words: done, or the state it was in "at horizon"
            "status": "done" if job.state == "done" else f"{job.state} at horizon",
            "reason": job.done_why,
            "instances": job.instances, "chips": job.instances * hw.chips_per_instance,
            "start_s": job.start_s, "tokens_trained": tokens,
            "useful_s": max(0.0, job.useful_s), "lost_work_s": job.lost_work_s,
            "checkpointing_s": job.checkpointing_s, "checkpoints_completed": job.checkpoints,
            "checkpoint_interval_s": job.interval_s if math.isfinite(job.interval_s) else None,
            "preemptions": job.preemptions, "interruptions": job.interruptions,
            "shrinks": job.shrinks, "grows": job.grows,
            "held_chip_s": job.held_chip_s,
            "time_by_state_s": dict(sorted(job.time_by_state_s.items())),
            # As the timeline's: useful time over the wall time since it started (ETTR) and
            # since it was submitted (goodput), up to its end or the horizon.
            "ettr": (max(0.0, job.useful_s) / max(end - job.start_s, 1e-9)
                     if job.start_s is not None else 0.0),
            "goodput": max(0.0, job.useful_s) / max(end - job.submit_s, 1e-9),
            "effective_cost_per_million_tokens_usd": (
                job.held_chip_s / 3600 * chip_price_h / tokens * 1e6
                if chip_price_h is not None and tokens > 0 else None),
        }
    cost = (None if chip_price_h is None else
            {s: hours[s] * chip_price_h for s in CHIP_STATES})
    # Serving's cost: the chips its deployments hold, with their partly used instances'
    # unused chips (counted idle in `hours`), as each deployment's cost counts them.
    serving_chip_h = sum(d["chip_hours"] for d in deployments.values())
    return {
        "deployments": deployments, "jobs": jobs,
        "fleet_day": {
            "interval_s": scenario.fluid.interval_s, "steps": len(result.times_s),
            "chip_hours": hours, "chip_hours_total": sum(hours.values()),
            "cluster_chip_hours": result.total_chips * result.horizon_s / 3600.0,
            "peak_load_per_s": float(np.max(np.sum(
                [result.series[n]["load_per_s"] for n in result.names], axis=0)))
            if result.names else 0.0,
            "output_tokens": serving_tokens, "training_tokens": trained,
            "cost_usd": cost,
            "serving_cost_per_million_output_tokens_usd": (
                serving_chip_h * chip_price_h / serving_tokens * 1e6
                if chip_price_h is not None and serving_tokens > 0 else None),
            "training_cost_per_million_tokens_usd": (
                hours["training"] * chip_price_h / trained * 1e6
                if chip_price_h is not None and trained > 0 else None),
            "fleet_cost_per_million_output_tokens_usd": (
                sum(hours.values()) * chip_price_h / serving_tokens * 1e6
                if chip_price_h is not None and serving_tokens > 0 else None),
            "failures": dict(result.failures),
            "curve_requests_simulated": sum(d.curve.requests_simulated
                                            for d in result.deployments),
        },
    }


def fluid_deployment_figures(scenario: Scenario, dep: DeploymentState, s: dict[str, np.ndarray],
                             h: dict[str, np.ndarray], times_s: np.ndarray, dts: np.ndarray,
                             horizon_s: float) -> dict[str, Any]:
    """summary.json `deployments.<name>` of a deployment the fluid level ran, from its
    per-step series (`s`, with the latency columns `latency_books` fills) and its run-wide
    latency histograms (`h`)."""
    price = scenario.hardware.instance.price_per_hour_usd
    chip_price_h = None if price is None else price / scenario.hardware.chips_per_instance
    arrived = float(s["arrived"].sum())
    served = float(s["served"].sum())
    tokens = float(s["output_tokens"].sum())
    # The chips of the instances it holds, a partly used instance's unused ones too: no one
    # else can use them, and the request level charges whole instances as well.
    chip_h = float(np.dot(s["instances"], dts)) * scenario.hardware.chips_per_instance / 3600.0
    # Missed as its own sum of non-negative terms (arrived - met cancelled to -3.7e-9),
    # and the goodput from it: all met is exactly 0 missed and a goodput of 1.
    missed = float(np.dot(1.0 - np.clip(s["slo_attainment"], 0.0, 1.0), s["arrived"]))
    span = max(horizon_s - dep.spec.start_s, 1e-9)
    # Its replicas over its own span: from the step of its start (it holds none before).
    since = times_s >= dep.spec.start_s
    since[-1] = True  # a start in the last step
    live = s["replicas"][since]
    stack = dep.spec.serving_stack(scenario.hardware.name)
    return {
        "model": dep.spec.model.name, "stack": stack.name if stack else None,
        "mixture_overheads_fitted": mixture_overheads_fitted(
            dep.spec.model, with_stack(scenario.hardware, stack)),
        **fluid_fidelity(dep, scenario.duration_s),
        "tp": dep.spec.tp,
        "pp": dep.spec.pp, "ep": dep.spec.ep, "chips_per_replica": dep.chips,
        "replicas_min": int(live.min()), "replicas_max": int(live.max()),
        "replicas_mean": float(np.dot(live, dts[since]) / dts[since].sum()),
        "capacity_per_replica_per_s": dep.curve.capacity_per_s,
        "provisioned_per_replica_per_s": dep.per_replica_rate,
        "replica_start_s": dep.start_s,
        "requests": arrived, "requests_completed": served,
        "requests_per_s": served / span,
        "peak_load_per_s": float(s["load_per_s"].max()),
        "output_tokens_per_s": tokens / span, "output_tokens": tokens,
        "ttft_p50_s": percentile_of(h["ttft"], 0.5), "ttft_p99_s": percentile_of(h["ttft"], 0.99),
        "tpot_p50_s": percentile_of(h["tpot"], 0.5), "tpot_p99_s": percentile_of(h["tpot"], 0.99),
        "slo_goodput": max(0.0, 1.0 - missed / arrived) if arrived > 0 else None,
        "slo_missed_requests": missed,
        "backlog_end": float(dep.backlog),
        "chip_hours": chip_h,
        "cost_per_million_output_tokens_usd": (chip_h * chip_price_h / tokens * 1e6
                                               if chip_price_h is not None and tokens > 0
                                               else None),
        "replica_failures": dep.failures, "retries": dep.retries,
        "scale_ups": dep.scale_ups, "scale_downs": dep.scale_downs,
        "jobs_preempted": dep.preempted_for,
    }


def day_table(result: FleetDayResult) -> pa.Table:
    """`day.parquet`: one row per deployment per step."""
    parts = []
    for index, name in enumerate(result.names):
        s = result.series[name]
        n = len(result.times_s)
        parts.append(pa.table({
            "deployment": pa.array([name] * n, pa.string()).dictionary_encode(),
            "deployment_id": np.full(n, index, dtype=np.int16),
            "time_s": result.times_s, "duration_s": result.dt_s,
            "replicas": s["replicas"].astype(np.int32),
            "replicas_starting": s["starting"].astype(np.int32),
            "replicas_draining": s["draining"].astype(np.int32),
            "load_per_s": s["load_per_s"], "served_per_s": s["served"] / result.dt_s,
            "backlog": s["backlog_mean"],
            "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"],
            "tpot_p50_s": s["tpot_p50_s"], "tpot_p99_s": s["tpot_p99_s"],
            "slo_attainment": s["slo_attainment"], "output_tokens": s["output_tokens"],
        }))
    schema = SCHEMAS["day"]
    return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()


def fleet_table(result: FleetDayResult) -> pa.Table:
    """`fleet.parquet`: one row per step, chips by state (and per job)."""
    columns: dict[str, Any] = {"time_s": result.times_s, "duration_s": result.dt_s}
    for key, values in result.fleet.items():
        name = f"{key}_chips" if not key.startswith("job:") else key
        columns[name] = values.astype(np.int64)
    return pa.table(columns)
