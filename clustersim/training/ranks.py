"""Where a training job's ranks sit: the chip of each rank, and the group of a set of ranks.

Placement follows Neuron and Megatron: ranks fill a chip's cores, chips an instance, and the
job's instances in the order given; the rank order (`parallelism.order`) says which degree
is innermost:

- `tp-cp-pp-dp` (the default): rank = tp rank + tp x (cp rank + cp x (pp rank + pp x dp
  rank)); tensor parallelism innermost (on the torus or switch), then pipeline stages, then
  data parallelism across instances. An expert-parallel group (dp ranks 0 .. ep-1) is then
  strided by tp x cp x pp ranks: beyond one instance as soon as tp x cp x pp fills it.
- `tp-cp-ep-pp-dp`: the dp rank splits into (ep rank, the rest), dp rank = ep rank + ep x
  rest, and the ep rank sits next to tensor and context parallelism: rank = tp rank + tp x
  (cp rank + cp x (ep rank + ep x (pp rank + pp x rest))). An expert group's members are
  tp x cp ranks apart, inside one instance (or UltraServer) while tp x cp x ep fits it, so
  the experts' all-to-all runs on NeuronLink rather than EFA (Megatron-Core's
  `initialize_model_parallel` orders ranks tp-cp-ep-dp-pp by default: its expert groups too
  are the ranks next to tensor and context parallelism);
  the pipeline stages and the rest of data parallelism move out by the factor ep.

The step model, its chunk times and its data-parallel reduction cost every collective on the
group these functions give.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clustersim.collectives.model import Group
from clustersim.hardware.catalog import HardwareSpec

__all__ = ["rank_chips", "rank_group", "ORDERS", "DEFAULT_ORDER", "EXPERTS_INSIDE",
           "experts_inside", "pipeline_stride", "dp_rank_offsets", "expert_group_ranks",
           "expert_groups_by_split"]

DEFAULT_ORDER = "tp-cp-pp-dp"
EXPERTS_INSIDE = "tp-cp-ep-pp-dp"
ORDERS = (DEFAULT_ORDER, EXPERTS_INSIDE)


def experts_inside(par: Any) -> bool:
    """Whether the expert-parallel rank sits next to tensor and context parallelism (the
    order `tp-cp-ep-pp-dp` with ep > 1; with ep 1 both orders are the same)."""
    return getattr(par, "order", DEFAULT_ORDER) == EXPERTS_INSIDE and par.ep > 1


def pipeline_stride(par: Any) -> int:
    """Ranks between pipeline rank d and d + 1 of the same tp, cp and dp ranks."""
    return par.tp * par.cp * (par.ep if experts_inside(par) else 1)


def dp_rank_offsets(par: Any, dp_ranks: np.ndarray) -> np.ndarray:
    """Rank of each data-parallel rank of tp, cp and pp rank 0."""
    d = np.asarray(dp_ranks, dtype=np.int64)
    block = par.tp * par.cp
    if experts_inside(par):
        return block * (d % par.ep) + block * par.ep * par.pp * (d // par.ep)
    return block * par.pp * d


def expert_group_ranks(par: Any) -> np.ndarray:
    """Rank 0's expert-parallel group: dp ranks 0 .. ep-1 (of tp, cp and pp rank 0)."""
    return dp_rank_offsets(par, np.arange(par.ep))


def expert_groups_by_split(hardware: HardwareSpec, par: Any, placed: np.ndarray
                           ) -> list[np.ndarray]:
    """One expert group's ranks for each way the job's expert groups split over NeuronLink
    domains (UltraServers, or instances without one), rank 0's group first. Every (tp, cp,
    pp) rank and block of ep data-parallel ranks has a group; where tp x cp x pp x ep (or
    tp x cp x ep in the inner order) does not tile a domain, some straddle two, their
    members split unevenly, and a synchronous step waits for the slowest."""
    base = (np.arange(par.tp * par.cp)[:, None]
            + pipeline_stride(par) * np.arange(par.pp)[None, :]).ravel()
    members = (np.arange(par.dp // par.ep)[:, None] * par.ep + np.arange(par.ep)[None, :])
    groups = (base[:, None, None] + dp_rank_offsets(par, members)[None]).reshape(-1, par.ep)
    unit = hardware.chips_per_instance * hardware.instances_per_ultraserver
    domains = np.sort(rank_chips(hardware, groups, placed) // unit, axis=1)
    # a group's split: its members' domains relative to its first one's
    relative = np.ascontiguousarray(domains - domains[:, :1])
    if not relative.any():  # every group inside one domain
        return [groups[0]]
    rows = relative.view(np.dtype((np.void, relative.dtype.itemsize * par.ep))).ravel()
    _, first = np.unique(rows, return_index=True)
    return [groups[i] for i in sorted(first.tolist())]


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
