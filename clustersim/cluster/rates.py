"""Failure rates seen by a job, and the checkpoint intervals they call for (Young, Daly)."""

from __future__ import annotations

import math
from collections.abc import Callable

from clustersim.catalog import read_catalog
from clustersim.hardware import units
from clustersim.hardware.failures import FailureRateSpec, failure_preset_rates
from clustersim.scenario.models import CheckpointSpec, JobSpec, Scenario
from clustersim.training.memory import weight_bytes_per_param

__all__ = [
    "young_interval",
    "daly_interval",
    "checkpoint_intervals",
    "checkpoint_bytes",
    "default_checkpoint",
    "storage_bandwidth_per_instance",
    "storage_aggregate_bandwidth",
    "checkpoint_bandwidth",
    "effective_rates",
    "job_failure_rate",
    "job_failure_rates",
    "failure_population",
    "cluster_failure_rate",
    "job_checkpoint",
    "job_checkpoint_intervals",
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


def job_failure_rates(scenario: Scenario) -> Callable[[JobSpec], float]:
    """`job_failure_rate` for the jobs of one scenario, computed once per job size (all it
    depends on of a job): a 100,000-job mix has a few dozen sizes."""
    by_size: dict[int, float] = {}

    def rate(job: JobSpec) -> float:
        instances = scenario.job_instances(job)
        found = by_size.get(instances)
        if found is None:
            found = by_size[instances] = job_failure_rate(scenario, job)
        return found

    return rate


# ---------------------------------------------------------------------------------------------


def storage_bandwidth_per_instance() -> float:
    """Bytes/s one instance writes or reads a checkpoint at (catalog/storage.yaml, sourced)."""
    figure = read_catalog("storage")["storage"]["per_instance_bandwidth"]
    return units.parse_bandwidth(figure["value"])


def checkpoint_bytes(job: JobSpec) -> float:
    """A checkpoint of the whole model: its weights and optimizer state (mixed-precision Adam:
    2 + 12 bytes per parameter in bf16), as the step model's memory counts them."""
    weights, _, optimizer = weight_bytes_per_param(job.precision)
    return job.model.parameter_count() * (weights + optimizer)


def storage_aggregate_bandwidth() -> float:
    """Bytes/s the whole file system moves, shared by every writer (catalog/storage.yaml)."""
    figure = read_catalog("storage")["storage"]["aggregate_bandwidth"]
    return units.parse_bandwidth(figure["value"])


def checkpoint_bandwidth(instances: int) -> float:
    """Bytes/s a job of `instances` instances writes (or reads back) its checkpoint at: each
    instance its shard at the per-client throughput, all of them within the file system's
    aggregate throughput."""
    return min(storage_bandwidth_per_instance() * instances, storage_aggregate_bandwidth())


def default_checkpoint(scenario: Scenario, job: JobSpec) -> CheckpointSpec:
    """What a job without a `checkpoint:` block is given when failures can hit it: Daly's
    interval, and a write (and restore) time of its checkpoint's bytes over the storage
    bandwidth of its instances (each writes its shard, within the file system's aggregate)."""
    bandwidth = checkpoint_bandwidth(scenario.job_instances(job))
    seconds = checkpoint_bytes(job) / bandwidth
    return CheckpointSpec(interval="auto", write=seconds, restore=seconds)


def checkpoint_intervals(checkpoint: CheckpointSpec | None, mtbf_s: float | None
                         ) -> tuple[float, float | None, float | None]:
    """(interval, Young's, Daly's) of a job: the interval it checkpoints at (infinite without
    checkpoints; `auto` is Daly's, or back to back for asynchronous writes, which cost no
    training), and the two optima for its MTBF (None without checkpoints or failures)."""
    if checkpoint is None or checkpoint.interval_s == "never":
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


def job_checkpoint(scenario: Scenario, job: JobSpec, rate: float
                   ) -> tuple[CheckpointSpec | None, bool]:
    """The checkpoint a job runs with at `rate` interruptions per second, and whether it is the
    default: its own block; Daly's default (`default_checkpoint`) when it has none and can
    fail (never silently none); none when its block asks for `never`."""
    checkpoint = job.checkpoint
    if checkpoint is None and rate > 0:
        return default_checkpoint(scenario, job), True
    if checkpoint is not None and checkpoint.interval_s == "never":
        return None, False  # asked for: a failure loses everything since the start
    return checkpoint, False


def job_checkpoint_intervals(scenario: Scenario, job: JobSpec, rate: float
                             ) -> tuple[float, float | None, float | None]:
    """`checkpoint_intervals` of the checkpoint the job runs with (`job_checkpoint`)."""
    checkpoint, _ = job_checkpoint(scenario, job, rate)
    return checkpoint_intervals(checkpoint, 1.0 / rate if rate > 0 else None)


def failure_population(scenario: Scenario) -> dict[str, int]:
    """How many units a failure process of each `per` draws over: chips, instances,
    UltraServers, leaves (of the fabric's leaf size) and jobs."""
    hw = scenario.hardware
    n = scenario.total_instances
    ipu = hw.instances_per_ultraserver
    per_leaf = scenario.cluster.fabric.leaf_size(ipu)
    return {"chip": n * hw.chips_per_instance, "instance": n,
            "ultraserver": math.ceil(n / ipu) if hw.ultraserver else 0,
            "leaf": math.ceil(n / per_leaf), "job": len(scenario.jobs)}


def cluster_failure_rate(scenario: Scenario) -> float:
    """Failures per second over the whole cluster: each process's scaled rate times the units
    it draws over (`failure_population`)."""
    population = failure_population(scenario)
    scale = scenario.failures.scale
    return sum(r.events_per_s * scale * population[r.per] for r in effective_rates(scenario))
