"""Teams: who a job belongs to, each team's quota of instances and its fair-share weight.

```yaml
teams:
  - {name: research, quota: 2048, share: 1}   # quota: instances its admitted jobs may hold
  - {name: pretrain, quota: 24576, share: 3}  # share: fair-share weight (policy fairshare)
  - {name: interns}                           # no quota: only the cluster limits it
scheduler: {policy: fairshare, preemption: true, borrowing: true}
jobs:
  - {name: j, team: research, ...}
```

A job is admitted against its team's quota when it starts (its whole size counts until it
ends or is preempted, recoveries included). With `scheduler.borrowing`, a team over its
quota may borrow what the other teams leave idle, as Kueue's cohorts do: a job that would
take its team past its quota starts only if the whole cohort (all teams with a quota) stays
within the sum of the quotas. Borrowed instances are not reclaimed by preemption; they come
back as the borrowing jobs end (a team under its quota is still admitted: its quota is
nominal, and it may wait for the instances). A job waiting on its team's quota does not hold
back other teams' jobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from clustersim.hardware import limits
from clustersim.hardware.spec import Spec

if TYPE_CHECKING:
    from clustersim.scenario.models import Scenario

__all__ = ["TeamSpec", "NO_TEAM", "quota_bars", "never_admitted"]

NO_TEAM = "-"  # the team of a job that names none (no quota, share 1)


class TeamSpec(Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=128)
    quota: int | None = Field(default=None, ge=0, le=limits.MAX_INSTANCES,
                              description="instances its admitted jobs may hold (none: "
                              "unlimited)")
    share: float = Field(default=1.0, gt=0, le=1e6,
                         description="fair-share weight (scheduler.policy fairshare)")


def quota_bars(need: int, quota: int | None, borrowing: bool, cohort_quota: int) -> str:
    """Why a job of `need` instances can never be admitted against its team's quota (the
    rule of `cluster.quotas.TeamBook.admits` with nothing else admitted), or "" when it
    can be: over its team's quota and, with borrowing, over the cohort's too."""
    if quota is None or need <= quota:
        return ""
    if not borrowing:
        return f"over its team's quota of {quota:,}"
    if need <= cohort_quota:
        return ""
    return (f"over its team's quota of {quota:,} and the cohort's of {cohort_quota:,} "
            "(borrowing)")


def never_admitted(scenario: Scenario) -> list[str]:
    """One line per job its team's quota can never admit (and the cohort's, with
    borrowing): `jobs.N (name): ...`, for a warning before the run."""
    quotas = {t.name: t.quota for t in scenario.teams}
    cohort = sum(q for q in quotas.values() if q is not None)
    borrowing = scenario.scheduler.borrowing
    lines = []
    for index, job in enumerate(scenario.jobs):
        team = job.team if job.team is not None else NO_TEAM
        need = scenario.job_instances(job)
        why = quota_bars(need, quotas.get(team), borrowing, cohort)
        if why:
            lines.append(f"jobs.{index} ({job.name}): {need:,} instances, {why} (team "
                         f"{team}): it can never start")
    return lines
