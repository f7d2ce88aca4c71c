"""What a run will cost, estimated before it starts, and the refusal of one that would not end.

The timeline's work grows with its discrete events: failures (each with its detection,
repair and the restarts of the jobs it hits), transient slowdowns, job arrivals. Periodic
checkpoints are not events (worked out in closed form, cluster.job_periodic), but a blocking
write is a pause of the job that a trace records as two `intervals` rows, so with traces on
those rows are counted with the events. Their expected number follows from the scenario's rates
and intervals, so a scenario that would run for days (a rate of 1e30, an MTBF of a
nanosecond, a checkpoint every microsecond) is refused with the reason, as the trace-size
check (`check_trace_size`) refuses a trace too large to write. Limits:
clustersim.hardware.limits, docs/limits.md.
A job too large for its chips' memory is refused too (runner.api.check_fit), told what it
could use (`fit_remedies`), and so is one whose groups of ranks the collectives cannot form
on its instances (`job_profiles`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from clustersim.cluster.rates import (
    cluster_failure_rate,
    job_checkpoint,
    job_checkpoint_intervals,
    job_failure_rates,
)
from clustersim.cluster.site_rates import site_events_per_s
from clustersim.collectives.ops import CollectiveError
from clustersim.hardware import limits
from clustersim.scenario.errors import Issue, ScenarioError
from clustersim.scenario.models import JobSpec, Scenario
from clustersim.training.profile import StepProfile
from clustersim.training.sites import site_profile
from clustersim.training.step import StepModel

__all__ = ["EventEstimate", "estimate_events", "check_run_budget", "check_request_traces",
           "check_trace_size", "fit_remedies", "job_profiles"]

# Events one failure costs: the failure, its repair, and the detection, restart and restore
# of the job it interrupts.
EVENTS_PER_FAILURE = 5
# Trace rows of one blocking checkpoint (its `checkpointing` interval and the `running` one
# after it); asynchronous checkpoints and untraced runs cost none.
ROWS_PER_BLOCKING_CHECKPOINT = 2
EVENTS_PER_JOB = 10  # submission, placement, start, end, watchers


@dataclass(frozen=True)
class EventEstimate:
    """Expected discrete events of one replication, by source (and the biggest source's key
    path, for the message)."""

    failures: float
    checkpoints: float
    transients: float
    jobs: float
    checkpoint_path: str = ""
    site_events: float = 0.0

    @property
    def total(self) -> float:
        return (self.failures + self.checkpoints + self.transients + self.jobs
                + self.site_events + 100)


def estimate_events(scenario: Scenario) -> EventEstimate:
    """Expected discrete events of one replication of the scenario."""
    horizon = scenario.duration_s
    failures = cluster_failure_rate(scenario) * horizon * EVENTS_PER_FAILURE
    checkpoints = 0.0
    worst, worst_path = 0.0, ""
    rate_of = job_failure_rates(scenario)
    traced = scenario.trace.enabled
    for index, job in enumerate(scenario.jobs if traced else ()):
        span = horizon - job.submit_s
        if job.run_for_s is not None:
            span = min(span, job.run_for_s)
        # the checkpoint and interval the timeline runs the job with (cluster.rates)
        checkpoint, _ = job_checkpoint(scenario, job, rate_of(job))
        if checkpoint is None or checkpoint.async_write:
            continue  # an asynchronous write changes no state: no trace rows
        interval = job_checkpoint_intervals(scenario, job, rate_of(job))[0]
        count = span / interval * ROWS_PER_BLOCKING_CHECKPOINT if interval > 0 else math.inf
        checkpoints += count
        if count > worst:
            worst, worst_path = count, f"jobs.{index}.checkpoint"
    transients = 0.0
    spec = scenario.stragglers.transient
    if spec is not None:
        transients = 2 * spec.rate_per_s * scenario.total_instances * horizon
    # A site event is a failure to the timeline: the event, its end, and the interruption,
    # restart and restore of the jobs it stops.
    site_events = site_events_per_s(scenario) * horizon * EVENTS_PER_FAILURE
    return EventEstimate(failures, checkpoints, transients, EVENTS_PER_JOB * len(scenario.jobs),
                         worst_path, site_events)


def check_run_budget(scenario: Scenario, replications: int = 1) -> EventEstimate:
    """Refuse a scenario whose expected events exceed limits.MAX_EVENTS per replication (or
    ten times that over all replications), naming the biggest source."""
    estimate = estimate_events(scenario)
    total = estimate.total
    if total <= limits.MAX_EVENTS and total * replications <= 10 * limits.MAX_EVENTS:
        return estimate
    sources = {"failures": estimate.failures,
               "blocking checkpoints' trace rows": estimate.checkpoints,
               "transient slowdowns": estimate.transients, "jobs": estimate.jobs,
               "site events": estimate.site_events}
    biggest = max(sources, key=lambda k: sources[k])
    path = {"failures": "failures",
            "blocking checkpoints' trace rows": estimate.checkpoint_path or "jobs",
            "transient slowdowns": "stragglers.transient", "jobs": "jobs",
            "site events": "failures.site_events"}[biggest]
    hint = {"failures": "lower the rates or failures.scale, or shorten duration",
            "blocking checkpoints' trace rows": "a longer checkpoint interval (or write time, "
            "with interval auto), asynchronous writes, or trace.enabled=false",
            "transient slowdowns": "a lower stragglers.transient.rate",
            "jobs": "fewer jobs",
            "site events": "lower site event rates, or shorten duration"}[biggest]
    if total <= limits.MAX_EVENTS:
        what = (f"{replications:,} replications of about {total:,.0f} events each; expected "
                f"at most {10 * limits.MAX_EVENTS:,} in all (docs/limits.md): fewer "
                "replications")
    else:
        what = (f"about {total:,.0f} discrete events ({sources[biggest]:,.0f} from "
                f"{biggest}); expected at most {limits.MAX_EVENTS:,} per run "
                f"(docs/limits.md): {hint}")
    raise ScenarioError(scenario.source, [Issue(path, f"the run would take {what}")])


def check_request_traces(scenario: Scenario) -> None:
    """Refuse, before any work, a deployment's request trace that is not a regular file, is
    beyond limits.MAX_REQUEST_TRACE_BYTES or MAX_REQUEST_TRACE_ROWS, or whose rows with the
    other deployments' expected requests pass limits.MAX_SERVED_REQUESTS (the rate-driven
    ones alone are checked with the scenario)."""
    from pathlib import Path

    from clustersim.scenario.serving import expected_requests
    from clustersim.serving.requests import TraceError, check_request_trace

    source = Path(scenario.source)
    base_dir = source.parent if source.is_file() else None
    total = 0.0
    for index, d in enumerate(scenario.serve):
        expected = expected_requests(d, scenario.duration_s)
        if d.workload.trace is not None:
            path = Path(d.workload.trace)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            try:
                rows = check_request_trace(path)
            except TraceError as error:
                raise ScenarioError(scenario.source, [Issue(
                    f"serve.{index}.workload.trace", str(error), d.workload.trace, True)]
                ) from None
            if d.workload.arrival == "trace" and rows is not None:
                expected = min(rows, d.workload.requests or rows)
        total += expected
        if total > limits.MAX_SERVED_REQUESTS:
            raise ScenarioError(scenario.source, [Issue(
                f"serve.{index}.workload", f"the deployments would receive about {total:,.0f} "
                f"requests; expected at most {limits.MAX_SERVED_REQUESTS:,} in a run "
                "(docs/limits.md)")])


def fit_remedies(job: JobSpec) -> str:
    """What could make a job fit that it does not use yet (a ZeRO-3 job with full
    recompute is not told to use ZeRO-1 and recompute)."""
    par = job.parallelism
    remedies = ["more tensor or pipeline parallelism"]
    if job.model.moe and par.ep < job.model.experts:
        remedies.append("more expert parallelism")
    if par.zero < 3:
        remedies.append(f"ZeRO-{par.zero + 1}" + (" to 3" if par.zero < 2 else ""))
    if not par.sequence_parallel:
        remedies.append("sequence parallelism")
    if job.recompute != "full":
        remedies.append("full recompute" if job.recompute == "selective" else "recompute")
    return ", ".join(remedies[:-1]) + " or " + remedies[-1] if len(remedies) > 1 \
        else remedies[0]


def job_profiles(scenario: Scenario, model: StepModel, named: bool
                  ) -> dict[str, StepProfile]:
    """Each job's step (`named`: under its own name, else the cached profile of its shape).
    A job whose groups of ranks the collectives cannot form on its instances (an expert
    group split unevenly over two Trn3 UltraServers, say) is refused under its parallelism,
    as the planner leaves such a candidate out ('placement'), not an internal error."""
    steps = {}
    for index, job in enumerate(scenario.jobs):
        try:
            steps[job.name] = site_profile(model, job, job.name if named else None)
        except CollectiveError as error:
            shown = job.parallelism.model_dump(exclude_defaults=True)
            raise ScenarioError(scenario.source, [Issue(
                f"jobs.{index}.parallelism", f"job {job.name}: a group of its ranks cannot "
                f"be formed on {scenario.hardware.name} ({error}); expected degrees whose "
                "groups hold the same share of every instance or UltraServer they span "
                "(`clustersim plan` lists the layouts that place)", shown, True)]) from None
    return steps


def check_trace_size(scenario: Scenario, limit_rows: int = 20_000_000) -> None:
    """Refuse utilisation levels that would write more rows than a trace should hold."""
    bins = math.ceil(scenario.duration_s / scenario.trace.bin_s)
    keys = {"cluster": 1, "job": len(scenario.jobs), "instance": scenario.total_instances,
            "ultraserver": math.ceil(scenario.total_instances
                                     / scenario.hardware.instances_per_ultraserver)}
    rows = sum(keys[level] for level in scenario.trace.levels) * bins
    if scenario.trace.enabled and rows > limit_rows:
        raise ScenarioError(scenario.source, [Issue(
            "trace.levels", f"utilisation at these levels would write {rows:,} rows "
            f"({bins:,} bins); expected at most {limit_rows:,}: use a longer trace.bin"
            f"{_droppable(scenario.trace.levels)}", list(scenario.trace.levels), True)])


def _droppable(levels: Sequence[str]) -> str:
    """The trace levels whose rows a refusal may suggest dropping (those written): it said
    "drop the instance/ultraserver levels" of a trace of [cluster, job]."""
    others = [level for level in levels if level != "cluster"]
    return f" or drop the {'/'.join(others)} level{'s' * (len(others) > 1)}" if others else ""
