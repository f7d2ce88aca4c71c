"""Failure rates seen by a job, and the checkpoint intervals they call for (Young, Daly)."""

from __future__ import annotations

import math

from clustersim.hardware.failures import FailureRateSpec, failure_preset_rates
from clustersim.scenario.models import CheckpointSpec, JobSpec, Scenario

__all__ = [
    "young_interval",
    "daly_interval",
    "checkpoint_intervals",
    "effective_rates",
    "job_failure_rate",
]


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974): tau = sqrt(2 C M)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006, eq. 37): for delta < 2M, sqrt(2 delta M)[1 + sqrt(delta/2M)/3 +
    (delta/2M)/9] - delta; otherwise M."""
    delta, m = checkpoint_s, mtbf_s
    if delta >= 2 * m:
        return m
    ratio = delta / (2 * m)
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - delta


def effective_rates(scenario: Scenario) -> list[FailureRateSpec]:
    """The preset's rates plus the scenario's, before scaling."""
    return failure_preset_rates(scenario.failures.preset) + list(scenario.failures.rates)


def job_failure_rate(scenario: Scenario, job: JobSpec) -> float:
    """Interruptions per second of a job: every process that can hit its hardware or it."""
    hw = scenario.hardware
    instances = scenario.job_instances(job)
    chips = instances * hw.chips_per_instance
    per_leaf = scenario.cluster.fabric.leaf_size(hw.instances_per_ultraserver)
    units = {
        "chip": chips,
        "instance": instances,
        # Without UltraServers there is nothing for a per-UltraServer rate to hit (as in
        # the timeline, which has no such units then).
        "ultraserver": math.ceil(instances / hw.instances_per_ultraserver) if hw.ultraserver
        else 0,
        "leaf": math.ceil(instances / per_leaf),
        "job": 1,
    }
    scale = scenario.failures.scale
    return sum(r.events_per_s * units[r.per] * scale for r in effective_rates(scenario))


# ---------------------------------------------------------------------------------------------


def checkpoint_intervals(checkpoint: CheckpointSpec | None, mtbf_s: float | None
                         ) -> tuple[float, float | None, float | None]:
    """(interval, Young's, Daly's) of a job: the interval it checkpoints at (infinite without
    checkpoints; `auto` is Daly's, or back to back for asynchronous writes, which cost no
    training), and the two optima for its MTBF (None without checkpoints or failures)."""
    if checkpoint is None:
        return math.inf, None, None
    mtbf = mtbf_s or math.inf
    young = daly = None
    if math.isfinite(mtbf):
        young = young_interval(checkpoint.write_s, mtbf)
        daly = daly_interval(checkpoint.write_s, mtbf)
    if checkpoint.interval_s == "auto":
        interval = max(checkpoint.write_s, 1e-9) if checkpoint.async_write else (daly or math.inf)
    else:
        interval = float(checkpoint.interval_s)
    return interval, young, daly
