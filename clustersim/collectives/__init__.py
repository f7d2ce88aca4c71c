"""The network layer: collective operations costed on the topology graph, by algorithm and level.
"""

from clustersim.collectives.model import (
    ALGORITHMS,
    OPS,
    CollectiveCost,
    CollectiveError,
    CollectiveModel,
    Group,
    StageCost,
    bus_factor,
    check_rank_split,
    normalise_op,
    place_ranks,
    simultaneous,
)

__all__ = [
    "OPS",
    "ALGORITHMS",
    "CollectiveError",
    "check_rank_split",
    "Group",
    "StageCost",
    "CollectiveCost",
    "CollectiveModel",
    "bus_factor",
    "normalise_op",
    "place_ranks",
    "simultaneous",
]
