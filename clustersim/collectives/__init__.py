"""The network layer: collective operations costed on the topology graph, by algorithm and level.

Modules: `ops` (names, errors, bus factors), `groups` (groups, placement, the level layout),
`costs` (step, stage and collective costs), `links` (costing steps on the graph), one module
per algorithm family (`ring`, `mesh`, `rdh`, `kangaring`, `zring` for the UltraServer's Z
rings, `fabric` for EFA), `levels` (each level's algorithms and auto choice), `model` (the
level planner, `CollectiveModel`) and `contention` (collectives sharing links at once).
"""

from clustersim.collectives.contention import simultaneous
from clustersim.collectives.costs import CollectiveCost, StageCost
from clustersim.collectives.groups import Group, check_rank_split, place_ranks
from clustersim.collectives.model import CollectiveModel
from clustersim.collectives.ops import (
    ALGORITHMS,
    OPS,
    CollectiveError,
    bus_factor,
    normalise_op,
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
