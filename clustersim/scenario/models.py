"""The sections of a scenario file as immutable pydantic specs (docs/scenario.md has the format).

Each spec checks its own fields; the rules that tie sections together (tp x pp x dp equals a
job's ranks, heads divisible by tp, ...) are in `clustersim.scenario.rules`, run once the
whole scenario is read.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from clustersim.hardware import limits
from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.failures import FailureRateSpec, StragglerSpec, failure_preset_names
from clustersim.hardware.sites import (
    InterSiteSpec,
    SiteEventSpec,
    SiteNetwork,
    SiteSpec,
    site_network,
)
from clustersim.hardware.spec import (
    Duration,
    NonNegativeDuration,
    Spec,
    at_least,
    at_most,
    printable,
    show_duration,
)
from clustersim.hardware.topology import FabricSpec
from clustersim.scenario.errors import ScenarioCheckError
from clustersim.scenario.fleetday import ElasticSpec, FluidSpec
from clustersim.scenario.jobmix import WorkloadSpec
from clustersim.scenario.rules import cross_checks
from clustersim.scenario.serving import DeploymentSpec
from clustersim.scenario.teams import TeamSpec
from clustersim.training.sites import CrossSiteSyncSpec
from clustersim.training.transformer import TransformerShape
from clustersim.training.workload import ParallelismSpec

__all__ = [
    "TRACE_LEVELS",
    "ClusterSpec",
    "CheckpointSpec",
    "JobSpec",
    "FailuresSpec",
    "SchedulerSpec",
    "TraceSpec",
    "Scenario",
]

TRACE_LEVELS = ("cluster", "job", "ultraserver", "instance")


class ClusterSpec(Spec):
    """How many instances (or UltraServers) the cluster has, its hot spares and fabric."""

    instances: int | None = Field(default=None, gt=0, le=limits.MAX_INSTANCES)
    ultraservers: int | None = Field(default=None, gt=0, le=limits.MAX_INSTANCES)
    spares: int | str = Field(
        default=0, description="hot-spare instances, beyond the rest: a count, or a share of "
        "the working instances such as 5% (rounded up to whole instances, or UltraServers); "
        "`plan` keeps the share at every size it tries (a count is taken as its share of the "
        "scenario's size)")
    fabric: FabricSpec = FabricSpec()
    sites: list[SiteSpec] = Field(
        default_factory=list, max_length=16,
        description="several data centers, each with its instances and its own leaf-spine "
        "fabric (docs/sites.md); instead of instances or ultraservers")
    inter_site: InterSiteSpec | None = Field(
        default=None, description="links between sites: per pair and/or a shared backbone")

    @field_validator("spares")
    @classmethod
    def _spares(cls, value: int | str) -> int | str:
        if isinstance(value, str):
            text = value.strip()
            try:
                share = float(text.removesuffix("%"))
            except ValueError:
                share = math.nan
            if not text.endswith("%") or not (0 <= share <= 100):
                raise ValueError(f"expected a count of instances or a share from 0% to 100% "
                                 f"such as 5%, got {value!r}")
            return text
        if not 0 <= value <= limits.MAX_INSTANCES:
            raise ValueError(f"expected 0 to {limits.MAX_INSTANCES:,} instances, got {value}")
        return value

    @property
    def spares_share(self) -> float | None:
        """The share of the working instances given as `spares: N%`, or None for a count."""
        return float(self.spares.removesuffix("%")) / 100 if isinstance(self.spares, str) else None

    @model_validator(mode="after")
    def _one_size(self) -> ClusterSpec:
        if self.sites:
            if self.instances is not None or self.ultraservers is not None:
                raise ValueError("with sites, give each site's instances or ultraservers, not "
                                 "the cluster's")
            if self.spares:
                raise ValueError("with sites, give spares per site")
            return self
        if (self.instances is None) == (self.ultraservers is None):
            raise ValueError("give exactly one of instances or ultraservers")
        if self.inter_site is not None:
            raise ValueError("inter_site needs sites")
        return self


class CheckpointSpec(Spec):
    interval_s: Duration | Literal["auto", "never"] = Field(
        default="auto", alias="interval",
        description="time between checkpoints, auto (Daly), or never (no checkpoints at all)"
    )
    write_s: NonNegativeDuration = Field(default=60.0, alias="write",
                                         le=limits.MAX_DURATION_S)
    restore_s: NonNegativeDuration = Field(default=300.0, alias="restore")
    async_write: bool = Field(default=False, alias="async")

    @model_validator(mode="after")
    def _check(self) -> CheckpointSpec:
        if self.interval_s == "auto" and self.write_s <= 0:
            # Young/Daly's interval is sqrt(2 x write x MTBF): zero with a free write.
            raise ValueError("interval auto needs a write time above zero (with a free write "
                             "the Daly interval is zero); give the interval")
        if 0 < self.write_s < limits.MIN_CHECKPOINT_WRITE_S:
            raise ValueError(f"write: at least {show_duration(limits.MIN_CHECKPOINT_WRITE_S)} "
                             f"(or 0 for a free write; docs/limits.md), got "
                             f"{show_duration(self.write_s)}")
        if (self.interval_s not in ("auto", "never")
                and self.interval_s < limits.MIN_CHECKPOINT_INTERVAL_S):
            raise ValueError(f"interval: at least "
                             f"{show_duration(limits.MIN_CHECKPOINT_INTERVAL_S)} "
                             f"(docs/limits.md), got {show_duration(self.interval_s)}")
        return self


class JobSpec(Spec):
    name: Annotated[str, AfterValidator(printable)] = Field(min_length=1)
    model: TransformerShape
    seq_len: int | None = Field(default=None, gt=0, le=limits.MAX_SEQ_LEN,
                                description="defaults to the model's")
    global_batch: int = Field(gt=0, le=limits.MAX_GLOBAL_BATCH, description="sequences per step")
    micro_batch: int = Field(default=1, gt=0, le=limits.MAX_MICRO_BATCH)
    parallelism: ParallelismSpec = ParallelismSpec()
    precision: Literal["bf16", "fp16", "fp8", "tf32", "fp32"] = Field(
        default="bf16", description="the matrix work's peak and every activation's bytes "
        "(fp8: one byte for activations and messages, the bound of an fp8 recipe; weights "
        "stay 2 bytes; docs/models.md)")
    recompute: Literal["none", "selective", "full"] = "none"
    attention: Literal["flash", "unfused"] | None = Field(
        default=None, description="attention kernel: flash (scores stay on chip) or unfused "
        "(scores, softmax and dropout through HBM); default: the hardware's framework.attention",
    )
    routing_imbalance: float = Field(
        default=1.0, ge=1.0, le=limits.MAX_EXPERTS, description="mixture of experts: the "
        "busiest expert-parallel rank's routed tokens over the mean (1: balanced; at most ep, "
        "and not with capacity_factor); the step waits for it (training.experts)")
    capacity_factor: float | None = Field(
        default=None, gt=0, le=limits.MAX_EXPERTS, description="mixture of experts: each "
        "expert takes at most this multiple of its mean tokens and is padded to it "
        "(capacity-based dispatch; at most experts / top_k, every token); none: dropless, the "
        "load is routing_imbalance")
    instances: int | None = Field(default=None, gt=0, le=limits.MAX_INSTANCES)
    submit_s: NonNegativeDuration = Field(default=0.0, alias="submit")
    steps: int | None = Field(default=None, gt=0, le=limits.MAX_STEPS,
                              description="default: run to the horizon")
    run_for_s: Duration | None = Field(
        default=None, alias="run_for", description="ends after this long since it first "
        "started, a wall-clock reservation: time preempted, queued again or recovering counts "
        "(a job preempted for longer than its run_for ends done with no more training)"
    )
    deadline_s: Duration | None = Field(
        default=None, alias="deadline", description="stopped this long after submission"
    )
    priority: int = Field(default=0, ge=-limits.MAX_PRIORITY, le=limits.MAX_PRIORITY,
                          description="higher runs first (priority, backfill)")
    team: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                             max_length=128, description="the team (or user) it belongs to: "
                             "its quota and fair share (teams)")
    trace_outcome: str | None = Field(default=None, max_length=64, description="how the "
                                      "job ended in the trace it came from (kept in outputs)")
    checkpoint: CheckpointSpec | None = None
    cross_site_sync: CrossSiteSyncSpec | None = Field(
        default=None, description="over several sites: average across them once every "
        "`every` steps, local steps between (docs/sites.md)")
    elastic: ElasticSpec | None = Field(default=None, description="shrinks for serving "
                                        "instead of stopping (fleet-day runs; "
                                        "docs/fleet-day.md)")

    @property
    def ranks(self) -> int:
        return self.parallelism.ranks

    @property
    def sequence_length(self) -> int:
        return self.seq_len if self.seq_len is not None else self.model.seq_len


class FailuresSpec(Spec):
    preset: str = "none"
    scale: float = Field(default=1.0, ge=0, le=limits.MAX_FAILURE_SCALE,
                         description="multiplies every rate")
    rates: list[FailureRateSpec] = Field(default_factory=list)
    detect_s: NonNegativeDuration = Field(default=120.0, alias="detect")
    repair_s: NonNegativeDuration | Literal["never"] = Field(
        default=4 * 3600.0, alias="repair", description="time to repair an instance, or never"
    )
    restart_s: NonNegativeDuration = Field(default=600.0, alias="restart")
    site_events: list[SiteEventSpec] = Field(
        default_factory=list, description="power, cooling and network-partition events per "
        "site (docs/sites.md)")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in failure_preset_names():
            raise ValueError(
                f"unknown failure preset; expected one of {', '.join(failure_preset_names())}"
            )
        return value


class SchedulerSpec(Spec):
    """How queued jobs start: fifo, priority, backfill (EASY) or fairshare (the team
    furthest below its share first, EASY backfill behind it); preemption of lower
    priorities by a job that does not fit; borrowing of idle team quota."""

    policy: Literal["fifo", "priority", "backfill", "fairshare"] = "fifo"
    preemption: bool = False
    borrowing: bool = Field(default=False, description="a team may borrow the quota other "
                            "teams leave idle (Kueue cohorts; docs/fleet.md)")


class TraceSpec(Spec):
    enabled: bool = True
    bin_s: Duration = Field(default=60.0, alias="bin", description="utilisation time bin (the "
                            "default shrinks to a shorter run's duration)")
    levels: list[Literal["cluster", "job", "ultraserver", "instance"]] = Field(
        default_factory=lambda: ["cluster", "job"]
    )

    @field_validator("bin_s")
    @classmethod
    def _bin_bounds(cls, value: float) -> float:
        return at_least(limits.MIN_TRACE_BIN_S, show_duration)(value)


class Scenario(Spec):
    """A whole scenario, validated; see docs/scenario.md for the file format."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=128)
    description: str = ""
    seed: int = Field(default=0, ge=0, le=limits.MAX_SEED)
    duration_s: Duration = Field(default=30 * 86400.0, alias="duration")
    hardware: HardwareSpec
    cluster: ClusterSpec
    jobs: list[JobSpec] = Field(default_factory=list, max_length=limits.MAX_JOBS)
    serve: list[DeploymentSpec] = Field(default_factory=list, description="inference "
                                        "deployments (clustersim.scenario.serving)")
    failures: FailuresSpec = FailuresSpec()
    scheduler: SchedulerSpec = SchedulerSpec()
    teams: list[TeamSpec] = Field(default_factory=list, max_length=10_000,
                                  description="quotas and fair-share weights "
                                  "(clustersim.scenario.teams)")
    workload: WorkloadSpec | None = None
    stragglers: StragglerSpec = StragglerSpec()
    trace: TraceSpec = TraceSpec()
    fluid: FluidSpec = Field(default=FluidSpec(), description="the fleet-level serving model "
                             "(docs/fleet-day.md)")

    @field_validator("duration_s")
    @classmethod
    def _duration_bounds(cls, value: float) -> float:
        at_least(limits.MIN_DURATION_S, show_duration)(value)
        return at_most(limits.MAX_DURATION_S, show_duration)(value)

    _source_yaml: str = PrivateAttr(default="")
    _source: str = PrivateAttr(default="<scenario>")
    _spares_share: float | None = PrivateAttr(default=None)
    _cluster_given: bool = PrivateAttr(default=True)
    _trace_rows: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _resolve_spares(self) -> Scenario:
        """`spares: N%` becomes a count: the share of the working instances, rounded up to
        whole UltraServers where the hardware has them (the share is kept: spares_share)."""
        share = self.cluster.spares_share
        if share is not None:
            unit = self.hardware.instances_per_ultraserver
            count = math.ceil(share * self.working_instances / unit - 1e-9) * unit
            cluster = self.cluster.model_copy(update={"spares": count})
            object.__setattr__(self, "cluster", cluster)
            self._spares_share = share
        return self

    @model_validator(mode="after")
    def _default_bin_within(self) -> Scenario:
        """The default trace bin (1 min) shrinks to a shorter run's duration; a bin written
        longer than the duration is still refused (rules.cross_checks)."""
        if "bin_s" not in self.trace.model_fields_set and self.trace.bin_s > self.duration_s:
            trace = self.trace.model_copy(update={"bin_s": self.duration_s})
            object.__setattr__(self, "trace", trace)
        return self

    @model_validator(mode="after")
    def _check_together(self, info: ValidationInfo) -> Scenario:
        planning = bool(info.context and info.context.get("planning"))
        issues = list(cross_checks(self, planning))
        if issues:
            raise ScenarioCheckError(issues)
        return self

    # Derived figures.
    @property
    def working_instances(self) -> int:
        """Instances available to jobs (not counting hot spares)."""
        if self.cluster.sites:
            return self.total_instances - sum(site.spares for site in self.cluster.sites)
        if self.cluster.instances is not None:
            return self.cluster.instances
        assert self.cluster.ultraservers is not None
        return self.cluster.ultraservers * self.hardware.instances_per_ultraserver

    @property
    def spares_share(self) -> float:
        """Hot spares as a share of the working instances: as written (`spares: 5%`), or the
        count's share of the cluster (what `plan` keeps at every size)."""
        if self._spares_share is not None:
            return self._spares_share
        return (self.total_instances - self.working_instances) / self.working_instances

    @property
    def cluster_given(self) -> bool:
        """False when `plan` was given no `cluster:` (its --chips give the sizes)."""
        return self._cluster_given

    @property
    def total_instances(self) -> int:
        if self.cluster.sites:
            return sum(self.site_network.instances)
        return self.working_instances + self.cluster.spares

    @property
    def site_network(self) -> SiteNetwork | None:
        """The sites and their links, resolved (None for a single-site cluster)."""
        if not self.cluster.sites:
            return None
        hw = self.hardware
        return site_network(self.cluster.sites, self.cluster.inter_site,
                            hw.instances_per_ultraserver, hw.instance.efa_bytes_per_s)

    @property
    def total_chips(self) -> int:
        return self.total_instances * self.hardware.chips_per_instance

    def job_instances(self, job: JobSpec) -> int:
        """Instances a job holds: as written, or its ranks over ranks per instance."""
        if job.instances is not None:
            return job.instances
        return job.ranks // self.hardware.ranks_per_instance

    @property
    def source(self) -> str:
        """Where the scenario came from (its file), for error messages."""
        return self._source

    @property
    def trace_rows(self) -> dict[str, Any] | None:
        """What became of a published trace's rows (workload.trace): read, replayed and left
        out by reason; None without a trace."""
        return self._trace_rows

    @property
    def source_yaml(self) -> str:
        """The effective scenario (file plus overrides) as YAML, for trace metadata."""
        return self._source_yaml
