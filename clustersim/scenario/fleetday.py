"""Serving over days: a deployment's load as a daily curve, its autoscaling, and the fleet
level (fluid) model's settings (docs/fleet-day.md).

`workload.load` gives the arrival rate over time (hourly points, or a sinusoid between a
trough and a peak, with multiplicative noise); `autoscale` lets the replica count follow it;
`fidelity` picks the request-level simulator or the fluid fleet model; the scenario's
`fluid:` section sets the fleet model's step. Validated here; the drivers trust it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from clustersim.hardware import limits, units
from clustersim.hardware.spec import (
    Duration,
    NonNegativeDuration,
    RequestRate,
    Spec,
    at_least,
    at_most,
    show_duration,
)

if TYPE_CHECKING:
    from clustersim.scenario.models import Scenario
    from clustersim.scenario.serving import DeploymentSpec

__all__ = ["elastic_unit", "elastic_smallest", "ElasticSpec", "SinusoidSpec",
           "LoadCurveSpec", "AutoscaleSpec", "FluidSpec", "LoadRate", "fleet_day_checks",
           "is_fleet_day", "in_event_fleet", "resolved_fidelity", "fidelity_choice",
           "replica_chips", "AUTO_REQUESTS"]

DAY_S = 86400.0
# fidelity auto: the request-level simulator up to this many expected requests per deployment
# (about a minute of simulation), the fluid model beyond.
AUTO_REQUESTS = 2_000_000


def _rate_or_zero(value: object) -> float:
    """A request rate that may be zero (a night with no traffic); negative refused."""
    rate = units.parse_rate(value)
    if not math.isfinite(rate):
        raise ValueError(f"rate {value!r} is not finite")
    if rate < 0:
        raise ValueError(f"rate {value!r} is negative; expected requests per second >= 0")
    if rate > limits.MAX_REQUEST_RATE_PER_S:
        raise ValueError(f"rate {value!r} is above {limits.MAX_REQUEST_RATE_PER_S:g}/s "
                         "(docs/limits.md)")
    return rate


# A request rate that may be zero: requests per second, or a string such as 20/s.
LoadRate = Annotated[float, BeforeValidator(_rate_or_zero), WithJsonSchema({
    "anyOf": [{"type": "number"}, {"type": "string"}],
    "description": "requests per second (0 or more), or requests/time", "examples": ["20/s"]})]


class ElasticSpec(Spec):
    """A training job that shrinks by whole data-parallel groups instead of stopping when a
    serving deployment of higher priority needs its chips (fleet-day runs only), and grows
    back when they are free again; each resize restarts it from its last checkpoint."""

    min_dp: int = Field(ge=1, le=limits.MAX_INSTANCES, description="the fewest data-parallel "
                        "groups it runs on")


class SinusoidSpec(Spec):
    """A daily sinusoid: `trough` at `peak_at` + 12 h, `peak` at `peak_at`."""

    peak_per_s: RequestRate = Field(alias="peak", description="requests per second at the peak")
    trough_per_s: LoadRate = Field(alias="trough", description="requests per second at the trough")
    peak_at_s: NonNegativeDuration = Field(default=14 * 3600.0, alias="peak_at",
                                           le=DAY_S, description="time of day of the peak")

    @model_validator(mode="after")
    def _check(self) -> SinusoidSpec:
        if self.trough_per_s > self.peak_per_s:
            raise ValueError(f"trough {self.trough_per_s:g}/s is above peak "
                             f"{self.peak_per_s:g}/s")
        return self


class LoadCurveSpec(Spec):
    """A deployment's arrival rate over time: `hourly` points (requests per second at the
    start of each hour, linear in between or held (`between: step`); `repeat: daily` repeats
    24 of them), or a daily
    `sinusoid`; times `noise`, a log-normal factor of mean 1 and spread `noise` drawn per
    `noise_interval` (the same draws at both levels of fidelity)."""

    hourly: list[LoadRate] | None = Field(default=None, description="requests per second at "
                                       "each hour's start (linear between points)")
    repeat: Literal["daily", "none"] = Field(default="daily", description="daily: 24 hourly "
                                             "points repeated each day; none: the points "
                                             "must cover the horizon")
    between: Literal["linear", "step"] = Field(default="linear", description="between hourly "
                                               "points: linear, or each held for its hour")
    sinusoid: SinusoidSpec | None = None
    noise: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False,
                         description="standard deviation of the log of the noise factor")
    noise_interval_s: Duration = Field(default=900.0, alias="noise_interval",
                                       description="time between noise draws")

    @field_validator("noise_interval_s")
    @classmethod
    def _noise_interval_bound(cls, value: float) -> float:  # said in its unit
        return at_least(60.0, show_duration)(value)

    @field_validator("hourly", mode="before")
    @classmethod
    def _points(cls, value: object) -> object:
        if value is None:
            return None
        if not isinstance(value, list) or not value:
            raise ValueError("expected a list of request rates (e.g. [20/s, 18/s, ...])")
        out = []
        for index, item in enumerate(value):
            if isinstance(item, bool):
                raise ValueError(f"point {index}: expected a rate, got {item!r}")
            try:
                out.append(_rate_or_zero(item))
            except (ValueError, units.UnitError) as error:
                raise ValueError(f"point {index} (hour {index}): {error}") from None
        return out

    @model_validator(mode="after")
    def _check(self) -> LoadCurveSpec:
        if (self.hourly is None) == (self.sinusoid is None):
            raise ValueError("give exactly one of hourly (a list of rates) or sinusoid")
        if self.hourly is not None and self.repeat == "daily" and len(self.hourly) != 24:
            raise ValueError(f"repeat daily needs 24 hourly points, got {len(self.hourly)} "
                             "(or repeat: none with points covering the horizon)")
        if self.hourly is not None and max(self.hourly) <= 0:
            raise ValueError("every hourly point is zero: the deployment gets no requests")
        return self

    def covers_s(self) -> float:
        """How long the curve is defined for (infinite when it repeats)."""
        if self.hourly is None or self.repeat == "daily":
            return math.inf
        return len(self.hourly) * 3600.0

    def peak_per_s(self) -> float:
        """The curve's highest rate before noise."""
        if self.sinusoid is not None:
            return self.sinusoid.peak_per_s
        assert self.hourly is not None
        return max(self.hourly)

    def mean_per_s(self) -> float:
        """The curve's mean rate over a day (or over its points), before noise."""
        if self.sinusoid is not None:
            return (self.sinusoid.peak_per_s + self.sinusoid.trough_per_s) / 2.0
        assert self.hourly is not None
        return sum(self.hourly) / len(self.hourly)


class AutoscaleSpec(Spec):
    """Replicas follow the load: a decision every `interval`; a new replica serves after its
    weights load from storage (the catalog's bandwidth) and `warmup`; a removed one holds its
    chips for `drain`. `priority` ranks the deployment against training jobs: it preempts
    jobs of lower priority for chips."""

    min_replicas: int = Field(alias="min", ge=0, le=limits.MAX_REPLICAS)
    max_replicas: int = Field(alias="max", gt=0, le=limits.MAX_REPLICAS)
    policy: Literal["utilisation", "slo"] = Field(
        default="utilisation", description="utilisation: keep load / capacity at target; slo: "
        "provision the rate a replica holds within its SLO, plus headroom")
    target: float = Field(default=0.7, gt=0, le=1, allow_inf_nan=False,
                          description="utilisation: load over capacity to aim at")
    headroom: float = Field(default=0.2, ge=0, le=10, allow_inf_nan=False,
                            description="slo: extra capacity over the load")
    interval_s: Duration = Field(default=60.0, alias="interval", description="between decisions")
    warmup_s: NonNegativeDuration = Field(default=60.0, alias="warmup",
                                          le=limits.MAX_DURATION_S,
                                          description="after loading the weights, before serving")
    drain_s: NonNegativeDuration = Field(default=60.0, alias="drain", le=limits.MAX_DURATION_S,
                                         description="a removed replica's chips stay held")
    scale_down_after_s: NonNegativeDuration = Field(
        default=600.0, alias="scale_down_after", le=limits.MAX_DURATION_S,
        description="scale down only after the need stayed lower this long")
    priority: int = Field(default=limits.MAX_PRIORITY, ge=-limits.MAX_PRIORITY,
                          le=limits.MAX_PRIORITY,
                          description="against training jobs' priorities (default: above all)")

    @model_validator(mode="after")
    def _check(self) -> AutoscaleSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min replicas {self.min_replicas} is above max "
                             f"{self.max_replicas}")
        return self


class FluidSpec(Spec):
    """The fleet-level serving model (docs/fleet-day.md)."""

    interval_s: Duration = Field(default=60.0, alias="interval", description="the fleet's step")
    curve_requests: int = Field(default=3000, ge=200, le=100_000,
                                description="requests simulated per point of a replica's "
                                "latency curve")
    curve_replicas: int = Field(default=4, ge=1, le=64, description="replicas the curves are "
                                "measured on (the router pools them)")

    @field_validator("interval_s")
    @classmethod
    def _interval_bounds(cls, value: float) -> float:  # said in its unit: "at least 1s"
        at_least(1.0, show_duration)(value)
        return at_most(3600.0, show_duration)(value)


def elastic_unit(instances: int, dp: int) -> int | None:
    """Instances an elastic job grows or shrinks by: one data-parallel group's, or one
    instance when several groups share an instance; None when neither divides the other."""
    if instances % dp == 0:
        return instances // dp
    if dp % instances == 0:
        return 1
    return None


def elastic_smallest(instances: int, dp: int, min_dp: int) -> int:
    """Instances of `min_dp` data-parallel groups, in whole units (elastic_unit)."""
    unit = elastic_unit(instances, dp) or instances
    return min(instances, unit * -(-min_dp * instances // (dp * unit)))


def _smallest(s: Scenario, job) -> int:
    """Instances a job needs to run at all (its minimum when elastic)."""
    instances, dp = s.job_instances(job), job.parallelism.dp
    if job.elastic is None or elastic_unit(instances, dp) is None:
        return instances
    return elastic_smallest(instances, dp, job.elastic.min_dp)


def replica_chips(d: DeploymentSpec, ranks_per_chip: int) -> int:
    return max(1, -(-d.tp * d.pp // ranks_per_chip))


def resolved_fidelity(d: DeploymentSpec, duration_s: float) -> str:
    """requests or fluid: `auto` is fluid with autoscaling or past AUTO_REQUESTS requests;
    unset, fluid with autoscaling, else requests (`fidelity_choice` says why)."""
    return fidelity_choice(d, duration_s)[0]


def fidelity_choice(d: DeploymentSpec, duration_s: float) -> tuple[str, str]:
    """(level, why): the level a deployment is simulated at and the reason, as a run reports
    it (summary.json `deployments.<name>.fidelity_reason`)."""
    if d.fidelity is None and d.autoscale is None:
        return "requests", "fidelity unset and no autoscale: request by request"
    if d.fidelity is None:
        return "fluid", ("fidelity unset with autoscale: the fluid level (the request level "
                         "holds a fixed replica count)")
    if d.fidelity != "auto":
        return d.fidelity, f"fidelity: {d.fidelity} in the scenario"
    if d.autoscale is not None:
        return "fluid", ("auto with autoscale: the fluid level (the request level holds a "
                         "fixed replica count)")
    w = d.workload
    if w.load is not None:
        expected = w.load.mean_per_s() * duration_s
    elif w.rate_per_s is not None:
        expected = w.rate_per_s * duration_s
    else:
        return "requests", "auto with a request trace: request by request"
    if w.requests is not None:
        expected = min(expected, w.requests)
    if expected > AUTO_REQUESTS and d._fluid_unchecked is not None:
        return "requests", (f"auto: about {expected:,.0f} requests expected, over the "
                            f"{AUTO_REQUESTS:,} the request level simulates in about a "
                            f"minute, but {d._fluid_unchecked}: request by request")
    if expected > AUTO_REQUESTS:
        return "fluid", (f"auto: about {expected:,.0f} requests expected, over the "
                         f"{AUTO_REQUESTS:,} the request level simulates in about a minute")
    return "requests", (f"auto: about {expected:,.0f} requests expected, within the "
                        f"{AUTO_REQUESTS:,} the request level simulates in about a minute "
                        "(the fluid level's figures beside, in fluid_check)")


def is_fleet_day(s: Scenario) -> bool:
    """A run of the fleet-level model: some deployment is fluid (or autoscaled)."""
    return any(resolved_fidelity(d, s.duration_s) == "fluid" for d in s.serve)


def in_event_fleet(s: Scenario) -> bool:
    """Fluid deployments beside a generated or replayed workload (`workload:`): the
    event-driven timeline runs the jobs and holds the deployments' instances as their plans
    change (clustersim.serving.fluid_plan), instead of the fleet-day level's steps."""
    return s.workload is not None and is_fleet_day(s)


_TO_EVENT_FLEET = ("{why}; expected {expected}, or a `workload:` (`workload: {{}}` beside "
                   "the jobs will do) to run the jobs in the event-driven fleet, which reads "
                   "it (docs/fleet-day.md)")
_NOT_READ = ("the fleet-day level (fluid deployments beside `jobs:` and no `workload:`) does "
             "not read it")


def _event_fleet_keys(s: Scenario) -> Iterable[tuple[str, str, object]]:
    """Keys only the event-driven timeline reads: teams and quotas, the scheduler's policy
    (the fleet-day level starts jobs by priority then submission, and only serving preempts
    them), stragglers. Accepted, they changed nothing."""
    if s.teams:
        yield ("teams", _TO_EVENT_FLEET.format(why=_NOT_READ, expected="no teams key"),
               [t.name for t in s.teams][:5])
    sched = s.scheduler
    if sched.policy not in ("priority", "fifo") or (
            sched.policy == "fifo" and "policy" in sched.model_fields_set):
        yield ("scheduler.policy", _TO_EVENT_FLEET.format(
            why="the fleet-day level starts jobs by priority, then submission",
            expected="policy priority (or no policy key)"), sched.policy)
    for key in ("preemption", "borrowing"):
        if getattr(sched, key):
            yield (f"scheduler.{key}", _TO_EVENT_FLEET.format(
                why=_NOT_READ + (" (only serving preempts jobs there)" if key == "preemption"
                                 else ""), expected=f"no {key} key"), True)
    if s.stragglers != type(s.stragglers)():
        yield ("stragglers", _TO_EVENT_FLEET.format(why=_NOT_READ,
                                                     expected="no stragglers key"),
               s.stragglers.model_dump(by_alias=True, exclude_defaults=True))


def _decision_steps(s: Scenario, at: str, a: AutoscaleSpec
                    ) -> Iterable[tuple[str, str, object]]:
    """An autoscale interval the fluid level can keep: whole fluid steps (it decides at a
    step's end; 1s and 7min at a 5min step were rounded to 5min, and said nothing). Unset, it
    decides every step."""
    if "interval_s" not in a.model_fields_set:
        return
    step = s.fluid.interval_s
    ratio = a.interval_s / step
    if round(ratio) >= 1 and abs(ratio - round(ratio)) <= 1e-9 * ratio:
        return
    below, above = math.floor(ratio) * step, math.ceil(ratio) * step
    near = " or ".join(units.format_duration(v) for v in (below, above) if v > 0)
    yield (f"{at}.autoscale.interval", f"not a whole number of the fluid level's steps "
           f"(fluid.interval {units.format_duration(step)}): it decides at a step's end; "
           f"expected a multiple of fluid.interval, such as {near} (or a shorter "
           "fluid.interval)", units.format_duration(a.interval_s))


def fleet_day_checks(s: Scenario) -> Iterable[tuple[str, str, object]]:
    """(path, message, value) for load curves, autoscaling and fidelity that do not fit the
    scenario: a curve short of the horizon, a fluid deployment without a rate, a request
    -level one with autoscaling or beside fluid ones, minimums that do not fit."""
    fleet = is_fleet_day(s)
    hw = s.hardware
    minimum_instances = 0
    for index, d in enumerate(s.serve):
        at = f"serve.{index}"
        load = d.workload.load
        if load is not None and load.covers_s() < s.duration_s:
            yield (f"{at}.workload.load.hourly", f"the curve's {len(load.hourly or [])} "
                   f"hourly points cover {units.format_duration(load.covers_s())}, the "
                   f"horizon is {units.format_duration(s.duration_s)}; expected points up to "
                   "the horizon (or repeat: daily with 24 points)", len(load.hourly or []))
        fidelity = resolved_fidelity(d, s.duration_s)
        if d.autoscale is not None and d.fidelity == "requests":
            yield (f"{at}.fidelity", "the request-level simulator holds a fixed replica count; "
                   "expected fluid or auto with autoscale", d.fidelity)
        elif fleet and fidelity == "requests":
            yield (f"{at}.fidelity", "requests beside fluid deployments: one run simulates its "
                   "deployments at one level; expected fluid or auto", d.fidelity)
        if fleet and fidelity == "fluid" and d.autoscale is not None:
            yield from _decision_steps(s, at, d.autoscale)
        if fleet:
            if d.workload.arrival == "trace":
                yield (f"{at}.workload.arrival", "the fluid model needs a rate or a load "
                       "curve, not a trace", d.workload.arrival)
            if d.disaggregated is not None:
                yield (f"{at}.disaggregated", "not yet in the fluid model: expected a "
                       "deployment whose replicas both prefill and decode",
                       d.disaggregated.model_dump())
            if d.workload.requests is not None:
                yield (f"{at}.workload.requests", "the fluid model runs to the horizon: a "
                       "count of requests would be ignored; expected no requests key (or "
                       "fidelity: requests)", d.workload.requests)
            per_chips = replica_chips(d, hw.chip.ranks)
            count = d.autoscale.min_replicas if d.autoscale is not None else d.replicas
            need = -(-count * per_chips // hw.chips_per_instance)
            minimum_instances += need
            if minimum_instances > s.working_instances:
                yield (f"{at}.autoscale.min" if d.autoscale is not None else f"{at}.replicas",
                       f"the deployments' minimum replicas need {minimum_instances} instances "
                       f"up to this one; the cluster has {s.working_instances}", count)
    if fleet and not in_event_fleet(s):
        yield from _event_fleet_keys(s)
    if fleet and not in_event_fleet(s):  # (the timeline keeps no per-step books of jobs)
        steps = math.ceil(s.duration_s / s.fluid.interval_s - 1e-9)
        fluid = sum(resolved_fidelity(d, s.duration_s) == "fluid" for d in s.serve)
        rows = steps * (fluid + len(s.jobs) + 1)
        if rows > limits.MAX_FLEET_DAY_ROWS:
            yield ("duration", f"a fleet-day run of {steps:,} steps of "
                   f"{units.format_duration(s.fluid.interval_s)} for {fluid} deployment(s) "
                   f"and {len(s.jobs)} job(s) keeps {rows:,} rows of books; expected at most "
                   f"{limits.MAX_FLEET_DAY_ROWS:,} (docs/limits.md): a shorter duration, a "
                   "longer fluid.interval, or fewer deployments", units.format_duration(
                       s.duration_s))
    timeline = in_event_fleet(s)
    for index, job in enumerate(s.jobs):
        if job.elastic is None:
            continue
        if timeline:
            yield (f"jobs.{index}.elastic", "beside a workload the event-driven timeline runs "
                   "jobs at their size (elastic jobs shrink for serving in a fleet-day run "
                   "only); expected no elastic key", {"min_dp": job.elastic.min_dp})
            continue
        if not fleet:  # (it was accepted and did nothing: the timeline runs jobs at their size)
            yield (f"jobs.{index}.elastic", "no fluid (autoscaled) deployment to shrink for: "
                   "elastic jobs shrink for serving in a fleet-day run only "
                   "(docs/fleet-day.md); expected no elastic key", {"min_dp": job.elastic.min_dp})
            continue
        dp = job.parallelism.dp
        if job.elastic.min_dp > dp:
            yield (f"jobs.{index}.elastic.min_dp", f"above the job's dp {dp}",
                   job.elastic.min_dp)
        elif elastic_unit(s.job_instances(job), dp) is None:
            yield (f"jobs.{index}.elastic", f"the job's {s.job_instances(job)} instances do "
                   f"not split into its {dp} data-parallel groups (nor they into them)",
                   job.elastic.min_dp)
    if fleet:
        working = s.working_instances  # (once: over sites it resolves their network)
        free = working - minimum_instances
        for index, job in enumerate(s.jobs):
            if s.job_instances(job) > working:
                yield (f"jobs.{index}.instances", f"needs {s.job_instances(job)} instances; "
                       f"the cluster has {working}", s.job_instances(job))
            elif _smallest(s, job) > free >= 0:
                yield (f"jobs.{index}", f"needs {s.job_instances(job)} instances; the "
                       f"deployments' minimum replicas leave {free}", s.job_instances(job))
