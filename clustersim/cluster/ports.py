"""What the timeline's collaborators use of it, and of one another, as protocols: each one
receives its port, not the Timeline, and no module of cluster/ but the timeline imports it
(not even for an annotation: tests/test_layout.py checks it).

`clustersim.cluster.timeline.Timeline` satisfies every `...Timeline` port below, the
Scheduler `Scheduling`, FailureSource `FaultCounts`, UplinkBook `UplinkDemand`, ActiveJobs
`ActiveSet`, TeamBook `TeamRules`, FreePool `FreeCounts`, and JobRun every job view. Each
names exactly what its user reads or calls. This module sits below every other of cluster/ (it imports none of
them), so a job appears here by what is used of it, never as JobRun.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, MutableSet, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import simpy

    from clustersim.analysis.trace import MemoryRecorder
    from clustersim.hardware.sites import SiteNetwork
    from clustersim.scenario.models import JobSpec, Scenario
    from clustersim.training.step import StepModel

__all__ = ["Member", "StruckJob", "SiteJob", "UplinkJob", "Scheduling", "FaultCounts",
           "UplinkDemand", "ActiveSet", "TeamRules", "FreeCounts", "FaultsTimeline", "SitesTimeline",
           "UplinksTimeline", "JobTimeline", "SchedulerTimeline"]


# ------------------------------------------------------------------ jobs, as each uses them
class Member(Protocol):
    """A job as its team's books see it (quotas.TeamBook)."""

    team: str
    instances_needed: int
    admitted: bool


class StruckJob(Protocol):
    """A job as failures see it (faults.FailureSource)."""

    state: str
    held_count: int

    @property
    def held(self) -> np.ndarray: ...
    def interrupt(self, component: str, lost: list[int]) -> None: ...


class SiteJob(Protocol):
    """A job as the sites see it (sites: partitions, shared inter-site links); its
    `site_cross_s` is read with getattr (set only on several sites)."""

    index: int
    state: str
    held_count: int
    held_mask: np.ndarray | None
    site_links: frozenset | None

    def interrupt(self, component: str, lost: list[int]) -> None: ...
    def set_site_slowdown(self, slowdown: float) -> None: ...


class UplinkJob(Protocol):
    """A job as the leaf uplinks' books see it (uplinks.UplinkBook)."""

    index: int
    state: str
    held_count: int
    spans_leaves: bool

    @property
    def held(self) -> np.ndarray: ...
    def set_uplink_slowdown(self, slowdown: float) -> None: ...


# ------------------------------------------------------------------ collaborators' books
class Scheduling(Protocol):
    """The scheduler, as jobs, failures and site events call it."""

    def submit(self, run: Any) -> None: ...
    def withdraw(self, run: Any) -> None: ...
    def schedule(self) -> None: ...
    def record_state(self) -> None: ...


class FaultCounts(Protocol):
    """The failures' counts, as site events add to them (faults.FailureSource)."""

    failures: Counter
    failures_by_cause: Counter

    def record_down(self, inst: int, end_s: float) -> None: ...


class UplinkDemand(Protocol):
    """The leaf uplinks' books (uplinks.UplinkBook)."""

    def update(self, run: Any) -> None: ...
    def share(self) -> None: ...


class ActiveSet(Protocol):
    """The jobs holding instances or granted them (queues.ActiveJobs)."""

    def add(self, run: Any) -> None: ...
    def discard(self, run: Any) -> None: ...
    def by_preemption_order(self, below: float) -> Iterator[Any]: ...
    def expected_ends(self, head: Any) -> Iterator[tuple[float, int]]: ...
    def lowest_priority(self) -> float: ...
    def __len__(self) -> int: ...


class TeamRules(Protocol):
    """The teams' quotas and usage (quotas.TeamBook)."""

    quota: dict[str, int | None]
    borrowing: bool

    def share(self, team: str) -> float: ...
    def admits(self, run: Any) -> bool: ...
    def room(self, team: str) -> float: ...
    def admits_beside(self, run: Any, ahead: Any) -> bool: ...
    def admit(self, run: Any, now: float) -> None: ...
    def release(self, run: Any) -> None: ...


class FreeCounts(Protocol):
    """The free pool's counts, kept as owners and health change (freepool.FreePool)."""

    count: int  # free instances (healthy, owned by nobody)
    per_leaf: np.ndarray  # free instances under each leaf switch


# ------------------------------------------------------------------ the timeline, per user
class UplinksTimeline(Protocol):
    """What the leaf uplinks' and inter-site links' sharing read (uplinks.UplinkBook,
    uplinks.share_uplinks, sites.share_site_links)."""

    scenario: Scenario
    n_leaves: int
    per_leaf: int
    instance_leaf: np.ndarray
    site_network: SiteNetwork | None
    site_first_instance: np.ndarray
    site_spread: set[int]
    site_speeds: tuple | None
    site_changed: bool
    uplinks: UplinkDemand

    @property
    def jobs(self) -> Sequence[Any]: ...  # UplinkJob and SiteJob


class FaultsTimeline(Protocol):
    """What failures and repairs read and change (faults.FailureSource)."""

    scenario: Scenario
    env: simpy.Environment
    rng_failures: np.random.Generator
    recorder: MemoryRecorder | None
    scheduler: Scheduling
    repair_s: float
    cpi: int
    ipu: int
    per_leaf: int
    n_instances: int
    healthy: np.ndarray
    owner: np.ndarray
    instance_down_since: np.ndarray
    instance_leaf: np.ndarray
    serving_slot: np.ndarray
    serving_per_leaf: np.ndarray
    serving_outages: list[tuple[float, int, int, float]]
    holdings: Any  # cluster.fluid_holding.HoldingBook, or None

    @property
    def jobs(self) -> Sequence[StruckJob]: ...
    def free_mask(self) -> np.ndarray: ...
    def set_owner(self, instances: Any, owner: int) -> None: ...
    def set_healthy(self, instances: Any, healthy: bool) -> None: ...
    def release(self, instances: list[int]) -> None: ...


class SitesTimeline(UplinksTimeline, Protocol):
    """What site events and partitions read and change (sites.SiteEvents, sites.cut_off)."""

    env: simpy.Environment
    recorder: MemoryRecorder | None
    scheduler: Scheduling
    faults: FaultCounts
    site_seed: np.random.SeedSequence
    cpi: int
    ipu: int
    healthy: np.ndarray
    owner: np.ndarray
    instance_down_since: np.ndarray
    partitioned: np.ndarray

    @property
    def jobs(self) -> Sequence[SiteJob]: ...
    def set_owner(self, instances: Any, owner: int) -> None: ...
    def set_healthy(self, instances: Any, healthy: bool) -> None: ...
    def release(self, instances: list[int]) -> None: ...
    def wake_waiting(self) -> None: ...


class JobTimeline(UplinksTimeline, Protocol):
    """What one job's process reads and changes (jobrun.JobRun with its parts
    job_accounting.JobAccounting, job_recovery.JobRecovery, uplinks.UplinkPacing)."""

    env: simpy.Environment
    rng_jobs: np.random.Generator
    recorder: MemoryRecorder | None
    step_model: StepModel | None
    scheduler: Scheduling
    teams: TeamRules
    active: ActiveSet
    recovering: MutableSet[Any]
    failure_rate: Callable[[JobSpec], float]
    repair_s: float
    cpi: int
    ipu: int
    n_instances: int
    healthy: np.ndarray
    owner: np.ndarray
    taken_at: np.ndarray
    hardware_event: simpy.Event
    checkpoint_events: bool  # an event per checkpoint (the tested reference), not closed form

    def set_owner(self, instances: Any, owner: int) -> None: ...
    def set_healthy(self, instances: Any, healthy: bool) -> None: ...
    def release(self, instances: list[int]) -> None: ...
    def slowdown(self, held: np.ndarray) -> float: ...
    def cut_off(self, run: Any) -> bool: ...
    def retire(self, run: Any) -> None: ...


class SchedulerTimeline(UplinksTimeline, Protocol):
    """What the scheduler's passes read and change (scheduler.Scheduler, which hands the
    policies of `policies` the queue state they need)."""

    env: simpy.Environment
    recorder: MemoryRecorder | None
    teams: TeamRules
    active: ActiveSet
    recovering: MutableSet[Any]  # JobRuns that lost instances
    repair_s: float
    n_instances: int
    serving_instances: int
    min_free: int
    healthy: np.ndarray
    owner: np.ndarray
    instance_down_since: np.ndarray
    serving_per_leaf: np.ndarray
    free_pool: FreeCounts

    def free_mask(self) -> np.ndarray: ...
    def set_owner(self, instances: Any, owner: int) -> None: ...
    def place(self, count: int, whole_ultraservers: bool, free: np.ndarray | None = None,
              held: np.ndarray | None = None) -> np.ndarray | None: ...
    def wake_waiting(self) -> None: ...
