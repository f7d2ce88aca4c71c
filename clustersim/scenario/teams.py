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

from pydantic import Field

from clustersim.hardware import limits
from clustersim.hardware.spec import Spec

__all__ = ["TeamSpec", "NO_TEAM"]

NO_TEAM = "-"  # the team of a job that names none (no quota, share 1)


class TeamSpec(Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=128)
    quota: int | None = Field(default=None, ge=0, le=limits.MAX_INSTANCES,
                              description="instances its admitted jobs may hold (none: "
                              "unlimited)")
    share: float = Field(default=1.0, gt=0, le=1e6,
                         description="fair-share weight (scheduler.policy fairshare)")
