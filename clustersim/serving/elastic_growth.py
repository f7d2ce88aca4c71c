"""How an elastic training job grows back as serving releases chips.

A job shrunk for serving (whole data-parallel groups given up, down to its `elastic.min_dp`)
takes chips back as they come free, group by group: all it misses as soon as that is free,
or else the whole groups the free instances hold, once they are at least a tenth of the job
(each resize restarts the job from its last checkpoint, so a trickle of released replicas
is not worth a restart each; the same tenth as the shrink, clustersim.serving.fleetday).
"""

from __future__ import annotations

import math

__all__ = ["grow_by"]


def grow_by(instances: int, held: int, group: int, free: int) -> int:
    """Instances a running elastic job of `instances` (now holding `held`, resized by
    `group`) takes from `free` free instances now; 0 to wait."""
    missing = instances - held
    if missing <= 0 or group <= 0 or free <= 0:
        return 0
    if missing <= free:
        return missing
    take = free // group * group
    return take if take >= max(group, math.ceil(instances / 10)) else 0
