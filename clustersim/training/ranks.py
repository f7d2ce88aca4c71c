"""Where a training job's ranks sit: the chip of each rank, and the group of a set of ranks.

Placement follows Neuron and Megatron: rank r = tp_rank + tp x (pp_rank + pp x dp_rank);
ranks fill a chip's cores, chips an instance, and the job's instances in the order given, so
tensor parallelism is innermost (on the torus or switch), then pipeline stages, then data
parallelism across instances. The step model, its chunk times and its data-parallel reduction
cost every collective on the group these functions give.
"""

from __future__ import annotations

import numpy as np

from clustersim.collectives.model import Group
from clustersim.hardware.catalog import HardwareSpec

__all__ = ["rank_chips", "rank_group"]


def rank_chips(hardware: HardwareSpec, ranks: np.ndarray, placed: np.ndarray) -> np.ndarray:
    """Chip of each rank: ranks fill a chip's cores, chips an instance, instances in order."""
    ranks_per_instance = hardware.ranks_per_instance
    return (placed[ranks // ranks_per_instance] * hardware.chips_per_instance
            + (ranks % ranks_per_instance) // hardware.chip.ranks)


def rank_group(hardware: HardwareSpec, ranks: np.ndarray, placed: np.ndarray
               ) -> tuple[Group, int]:
    """The group of these ranks, and how many such groups share each of its chips."""
    group = Group.from_rank_chips(rank_chips(hardware, ranks, placed).tolist())
    return group, max(1, hardware.chip.ranks // group.ranks_per_chip)
