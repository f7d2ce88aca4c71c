"""Team quotas and fair shares: the instances each team's admitted jobs hold.

A job is admitted when the scheduler starts it and counts its whole size against its team
until it ends or is preempted (a recovery keeps its admission). `admits` is the quota rule of
clustersim.scenario.teams: within the team's quota; or, with borrowing, past it while the
cohort of teams with quotas stays within the sum of their quotas.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

from clustersim.scenario.teams import NO_TEAM

if TYPE_CHECKING:
    from clustersim.cluster.ports import Member
    from clustersim.scenario.models import Scenario

__all__ = ["TeamBook", "team_of"]


def team_of(team: str | None) -> str:
    return team if team is not None else NO_TEAM


class TeamBook:
    """Usage per team (instances of its admitted jobs) against its quota."""

    def __init__(self, scenario: Scenario, record: bool = False):
        self.quota: dict[str, int | None] = {t.name: t.quota for t in scenario.teams}
        self.weight: dict[str, float] = {t.name: t.share for t in scenario.teams}
        self.borrowing = scenario.scheduler.borrowing
        self.usage: Counter = Counter()
        self.cohort_quota = sum(q for q in self.quota.values() if q is not None)
        self.cohort_usage = 0  # instances admitted to teams that have a quota
        # (time, team, its usage after, its quota, cohort usage after, cohort quota) of every
        # admission past the team's quota, and of every admission when `record`.
        self.admissions: list[tuple[float, str, int, int | None, int, int]] | None = (
            [] if record else None)

    def share(self, team: str) -> float:
        """Fair-share position: instances held over the team's weight (lowest goes first)."""
        return self.usage[team] / self.weight.get(team, 1.0)

    def admits(self, run: Member) -> bool:
        quota = self.quota.get(run.team)
        if quota is None:
            return True
        if self.usage[run.team] + run.instances_needed <= quota:
            return True
        return self.borrowing and self.cohort_usage + run.instances_needed <= self.cohort_quota

    def room(self, team: str) -> float:
        """The most instances a job of this team may need and be admitted now: `admits(run)`
        is `run.instances_needed <= room(run.team)` (a team without a quota: infinite)."""
        quota = self.quota.get(team)
        if quota is None:
            return math.inf
        own = quota - self.usage[team]
        if self.borrowing:
            return max(own, self.cohort_quota - self.cohort_usage)
        return own

    def admits_beside(self, run: Member, ahead: Member) -> bool:
        """Whether `run` is admitted with `ahead` (the queue's head, waiting) counted as
        admitted too: a backfilled job must not take the quota the head needs."""
        if ahead.admitted or self.quota.get(ahead.team) is None:
            return self.admits(run)
        self.usage[ahead.team] += ahead.instances_needed
        self.cohort_usage += ahead.instances_needed
        try:
            return self.admits(run)
        finally:
            self.usage[ahead.team] -= ahead.instances_needed
            self.cohort_usage -= ahead.instances_needed

    def admit(self, run: Member, now: float) -> None:
        if run.admitted:
            return
        run.admitted = True
        self.usage[run.team] += run.instances_needed
        quota = self.quota.get(run.team)
        if quota is not None:
            self.cohort_usage += run.instances_needed
        if self.admissions is not None:
            self.admissions.append((now, run.team, self.usage[run.team], quota,
                                    self.cohort_usage, self.cohort_quota))

    def release(self, run: Member) -> None:
        if not run.admitted:
            return
        run.admitted = False
        self.usage[run.team] -= run.instances_needed
        if self.quota.get(run.team) is not None:
            self.cohort_usage -= run.instances_needed
