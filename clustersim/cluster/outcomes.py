"""What a run of the timeline produced: per job (JobOutcome, with the contract's figures) and
for the cluster (TimelineResult)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clustersim.analysis.trace import JOB_STATES

__all__ = ["JobOutcome", "TimelineResult"]


@dataclass(slots=True)
class JobOutcome:
    """What happened to one job over the horizon (slots: a year keeps a million)."""

    name: str
    instances: int
    chips: int
    step_time_s: float
    tokens_per_step: int
    steps_target: int | None
    submit_s: float
    start_s: float | None = None
    end_s: float | None = None
    progress_steps: float = 0.0
    time_in_state: Counter = field(default_factory=Counter)
    interruptions: Counter = field(default_factory=Counter)
    lost_work_s: float = 0.0
    requeued_s: float = 0.0  # queued again after preemptions (part of time_in_state's queued)
    running_s: float = 0.0
    checkpoints_completed: int = 0
    checkpoint_interval_s: float | None = None
    checkpoint_write_s: float | None = None
    held_chip_s: float = 0.0  # chip-time of the instances it held (for the effective cost)
    checkpoint_default: bool = False  # no checkpoint block: given Daly's (rates.default_checkpoint)
    young_interval_s: float | None = None
    daly_interval_s: float | None = None
    mtbf_s: float | None = None
    status: str = "queued"
    reason: str = ""
    replacements: int = 0
    ultraservers_lost: int = 0
    preemptions: int = 0
    placement_step_time_s: float | None = None
    contention_slowdown: float = 1.0  # worst slowdown of its uplink traffic by other jobs
    ideal_s: float | None = None  # run time alone, without failures or queueing
    team: str = "-"  # its team (clustersim.scenario.teams; "-" for none)
    trace_outcome: str | None = None  # how it ended in the trace it was read from

    @property
    def steps_completed(self) -> int:
        return int(math.floor(self.progress_steps + 1e-9))

    @property
    def unfinished_s(self) -> float:
        """Running time spent on a step still unfinished at the end: not useful (it produced
        no completed step), counted with the lost work."""
        worked = max(0.0, self.running_s - self.lost_work_s)
        if self.progress_steps <= 0:
            return worked
        return worked * max(0.0, 1.0 - self.steps_completed / self.progress_steps)

    @property
    def useful_s(self) -> float:
        """Running time that produced completed steps: neither work later lost nor the step
        unfinished at the end (a job whose steps never complete, at a step time of years,
        has no useful time)."""
        return max(0.0, self.running_s - self.lost_work_s) - self.unfinished_s

    @property
    def lost_s(self) -> float:
        """Work lost to failures and preemptions, and the unfinished last step (the
        `lost_time_s.lost_work` of the summary: useful plus lost time is the wall time)."""
        return self.lost_work_s + self.unfinished_s

    def figures(self, horizon_s: float) -> dict[str, Any]:
        """The contract's job figures and where the lost hours went."""
        start = self.start_s if self.start_s is not None else horizon_s
        end = self.end_s if self.end_s is not None else horizon_s
        wall = max(0.0, end - start)
        since_submit = max(0.0, end - self.submit_s)
        states = {s: self.time_in_state.get(s, 0.0) for s in JOB_STATES
                  if s != "done"}
        # `queued`: the wait before the first start, outside the wall time; `requeued`: the
        # waits after preemptions, inside it. Wall minus useful is the sum of the entries
        # after `queued`; useful plus every entry is the time since submission.
        requeued = min(self.requeued_s, states["queued"])
        # (each once here: the properties were asked for several times a job)
        useful, steps = self.useful_s, self.steps_completed
        lost = {
            "queued": states["queued"] - requeued,
            "requeued": requeued,
            "checkpointing": states["checkpointing"],
            "down": states["down"],
            "waiting_for_hardware": states["waiting_for_hardware"],
            "restarting": states["restarting"],
            "restoring": states["restoring"],
            "lost_work": self.lost_s,
        }
        return {
            "status": self.status,
            "reason": self.reason,
            "steps_completed": steps,
            "tokens_trained": steps * self.tokens_per_step,
            "interruptions": int(sum(self.interruptions.values())),
            "interruptions_by_cause": dict(sorted(self.interruptions.items())),
            "ettr": useful / wall if wall > 0 else 0.0,
            "goodput": useful / since_submit if since_submit > 0 else 0.0,
            "useful_s": useful,
            "lost_work_s": self.lost_work_s,
            "wall_s": wall,
            "held_chip_s": self.held_chip_s,
            "time_by_state_s": states,
            "lost_time_s": lost,
            "checkpoints_completed": self.checkpoints_completed,
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "checkpoint_write_s": self.checkpoint_write_s,
            "checkpoint_default": self.checkpoint_default,
            "young_interval_s": self.young_interval_s,
            "daly_interval_s": self.daly_interval_s,
            "job_mtbf_s": self.mtbf_s,
            "instances_replaced": self.replacements,
            "ultraservers_lost": self.ultraservers_lost,
            "preemptions": self.preemptions,
            "queue_wait_s": states["queued"],
            "slowdown": ((end - self.submit_s) / (steps * self.step_time_s)
                         if steps > 0 else None),
            "placement_slowdown": (self.placement_step_time_s / self.step_time_s
                                   if self.placement_step_time_s else None),
            "uplink_contention": self.contention_slowdown,
            "start_s": self.start_s,
            "end_s": self.end_s,
            **({"trace_outcome": self.trace_outcome} if self.trace_outcome is not None
               else {}),
        }


@dataclass
class TimelineResult:
    """Everything a run of the timeline produced."""

    horizon_s: float
    jobs: dict[str, JobOutcome]
    failures: Counter
    failures_by_cause: Counter
    repairs_completed: int
    allocated_chip_s: float
    useful_chip_s: float
    total_chips: int
    min_free_instances: int
    event_count: int
    fragmentation_mean: float = 0.0
    # (time, slot, chip in the instance or -1, down seconds) of the hardware failures that
    # downed a serving deployment's instance (Timeline.serving_outages)
    serving_outages: tuple[tuple[float, int, int, float], ...] = ()
    # fluid deployments' holdings and their books (cluster.fluid_holding.HoldingBook)
    holdings: Any = None

    def cluster_figures(self) -> dict[str, Any]:
        chip_time = self.total_chips * self.horizon_s
        statuses = Counter(outcome.status for outcome in self.jobs.values())
        # A job that never started has a censored wait (at least its time queued so far):
        # apart from the waits of the jobs that started, never in their mean or percentiles.
        waits, censored = [], []
        for outcome in self.jobs.values():
            wait = outcome.time_in_state.get("queued", 0.0)
            (waits if outcome.start_s is not None else censored).append(wait)
        return {
            "jobs": len(self.jobs),
            "jobs_by_status": dict(sorted(statuses.items())),
            "mean_queue_wait_s": float(np.mean(waits)) if waits else 0.0,
            "p50_queue_wait_s": float(np.quantile(waits, 0.5)) if waits else 0.0,
            "p95_queue_wait_s": float(np.quantile(waits, 0.95)) if waits else 0.0,
            "jobs_never_started": len(censored),
            "mean_censored_queue_wait_s": float(np.mean(censored)) if censored else None,
            "fragmentation": self.fragmentation_mean,
            "utilisation": self.allocated_chip_s / chip_time if chip_time else 0.0,
            "useful_utilisation": self.useful_chip_s / chip_time if chip_time else 0.0,
            "failures": dict(sorted(self.failures.items())),
            "failures_by_cause": dict(sorted(self.failures_by_cause.items())),
            "repairs_completed": self.repairs_completed,
            "min_free_instances": self.min_free_instances,
            "discrete_events": self.event_count,
        }


# ---------------------------------------------------------------------------------------------
