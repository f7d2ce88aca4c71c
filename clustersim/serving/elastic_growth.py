"""How an elastic training job grows back as serving releases chips.

A job shrunk for serving (whole data-parallel groups given up, down to its `elastic.min_dp`)
takes chips back as they come free, group by group: all it misses as soon as that is free
(as before partial growth), or else the whole groups the free instances hold, when the
resize pays for itself soon enough. Each resize restarts the job from its last checkpoint:
all its instances stop for the restart and the restore, and the work since the checkpoint
is lost; taking `take` more instances repays that after held x cost / take seconds. A
partial step is taken when that is at most REPAY_S, and the job has not been shrunk for
serving within REPAY_S (an hour: the serving day's load moves over hours, while an
autoscaler's noise takes back within minutes what it released; in rainier-serving-day
growing back into that noise cost the experiments job 5% of its useful time in 13 more
resizes).
"""

from __future__ import annotations

__all__ = ["grow_by", "REPAY_S"]

REPAY_S = 3600.0


def grow_by(instances: int, held: int, group: int, free: int, cost_s: float,
            since_shrink_s: float = float("inf")) -> int:
    """Instances a running elastic job of `instances` (now holding `held`, resized by
    `group`) takes from `free` free instances now, a resize costing it `cost_s` seconds of
    all its instances (restart, restore, work since its checkpoint), `since_shrink_s` after
    serving last shrank it; 0 to wait."""
    missing = instances - held
    if missing <= 0 or group <= 0 or free <= 0:
        return 0
    if missing <= free:
        return missing
    take = free // group * group
    if take <= 0 or held * cost_s > REPAY_S * take or since_shrink_s < REPAY_S:
        return 0
    return take
