"""The shape of a job's placement: what its step depends on, and a canonical placement of
that shape on which the step model simulates it (one simulation per shape, not per placement).

Over several sites (`spread_shape`), the shape is how many instances are in which sites,
and the canonical placement each site's share from the start of the site, whole
UltraServers first. Within a site the leaf pattern is left
out: a spread job's step is set by its cross-site reduction, and on a non-blocking fabric
the leaves do not change it (an oversubscribed one is paced by the timeline's uplink
sharing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from clustersim.training.experts import expert_load
from clustersim.training.ranks import pipeline_stride
from clustersim.training.workload import TrainingJob

if TYPE_CHECKING:
    from clustersim.hardware.topology import Topology
    from clustersim.training.step import StepModel

__all__ = ["placement_shape", "small_placement_shape", "alike_shape", "spread_shape",
           "leaves_matter", "first_seen_labels", "labels_bytes", "SMALL"]


def placement_shape(model: StepModel, job: TrainingJob, placed: np.ndarray) -> tuple[tuple, np.ndarray]:
    """The placement's shape and a canonical placement of that shape (each leaf's share
    from the start of a leaf), on which the step is simulated.

    The shape is what the step on the canonical placement depends on: in rank order, each
    instance's UltraServer (renamed by first appearance) and its place in it, and the leaf
    of each pipeline rank's first instance (its sends cross a spine or not). On a
    non-blocking fabric the leaves change nothing else: a leaf's uplinks carry all its
    chips' EFA, so a collective's crossing flows never outrun their NICs
    (`collectives.fabric`). There, placements that differ only in how their instances
    fall on leaves share one simulation (tests/test_step.py checks it against simulating
    each); on an oversubscribed fabric the shape keeps the instances per leaf."""
    # The last answer for a read-only placement (a job's `held`) is kept: a replacement asks
    # whether its shape is cached (`StepModel.has_profile`), then for its profile, on the
    # same instances (thousands for a large job).
    last = _SHAPE_KEPT[0]
    if last is not None and last[2] is placed and last[1] is job and last[0] is model:
        return last[3]
    found = _placement_shape(model, job, placed)
    if not placed.flags.writeable:
        _SHAPE_KEPT[0] = (model, job, placed, found)
    return found


_SHAPE_KEPT: list[tuple | None] = [None]  # (model, job, placement, its shape), the last one


def _placement_shape(model: StepModel, job: TrainingJob, placed: np.ndarray
                     ) -> tuple[tuple, np.ndarray]:
    par = job.parallelism
    hw = model.hardware
    per_leaf = model.topology.fabric.leaf_size(hw.instances_per_ultraserver)
    ipu = hw.instances_per_ultraserver
    head = _head(model, job, len(placed))
    spread = spread_shape(model.topology, placed)
    if spread is not None:  # over several sites: the shape is how it splits over them
        split, canonical = spread
        return (*head, "sites", split), canonical
    n = len(placed)
    if n <= SMALL:
        return small_placement_shape(model, job, head, placed, per_leaf, ipu)
    leaves = placed // per_leaf
    # Instances per leaf, leaves in order of first appearance (one pass when sorted).
    if n > 1 and bool((leaves[1:] >= leaves[:-1]).all()):
        starts = np.concatenate(([0], np.flatnonzero(leaves[1:] != leaves[:-1]) + 1))
        counts = np.diff(np.append(starts, n))
    else:
        _, starts, counts = np.unique(leaves, return_index=True, return_counts=True)
        counts = counts[np.argsort(starts)]
    offset = int(placed[0] % ipu)
    contiguous = int(placed[-1]) - int(placed[0]) == n - 1 and (
        n == 1 or bool((np.diff(placed) == 1).all()))
    if contiguous:
        canonical = placed
    else:
        # Each leaf's share from the start of the leaf (in leaf order: ascending).
        first = np.arange(len(counts)) * per_leaf + offset % per_leaf
        canonical = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(n)
        if canonical[-1] >= model.topology.instances:
            canonical = placed  # no room for the canonical form: use the placement itself
    if model._leaves_matter:
        us_counts = tuple(sorted(np.unique(placed // ipu, return_counts=True)[1].tolist()))
        return (*head, offset, tuple(counts.tolist()), us_counts), canonical
    stride = pipeline_stride(par)
    firsts = canonical[np.arange(par.pp) * stride // hw.ranks_per_instance]
    return (*head, "ultraservers", first_seen_labels(canonical // ipu).tobytes(),
            (canonical % ipu).tobytes(), first_seen_labels(firsts // per_leaf).tobytes()
            ), canonical


def small_placement_shape(model: StepModel, job: TrainingJob, head: tuple, placed: np.ndarray,
                          per_leaf: int, ipu: int) -> tuple[tuple, np.ndarray]:
    """`placement_shape` of a placement of a few instances, the same key and canonical placement
    computed on Python integers (most jobs of a fleet are a few instances, placed again
    at every start and recovery; numpy's per-call cost was most of their shape)."""
    ids = placed.tolist()
    counts: dict[int, int] = {}  # instances per leaf, in order of first appearance
    for i in ids:
        counts[i // per_leaf] = counts.get(i // per_leaf, 0) + 1
    offset = ids[0] % ipu
    canonical_ids = ids
    if any(b - a != 1 for a, b in zip(ids, ids[1:], strict=False)):
        shares = [leaf * per_leaf + offset % per_leaf + k
                  for leaf, count in enumerate(counts.values()) for k in range(count)]
        if shares[-1] < model.topology.instances:
            canonical_ids = shares
    canonical = placed if canonical_ids is ids else np.array(canonical_ids, dtype=np.int64)
    if model._leaves_matter:
        servers: dict[int, int] = {}
        for i in ids:
            servers[i // ipu] = servers.get(i // ipu, 0) + 1
        return (*head, offset, tuple(counts.values()), tuple(sorted(servers.values()))
                ), canonical
    par = job.parallelism
    stride = pipeline_stride(par)
    rpi = model.hardware.ranks_per_instance
    firsts = [canonical_ids[d * stride // rpi] for d in range(par.pp)]
    return (*head, "ultraservers", labels_bytes([i // ipu for i in canonical_ids]),
            np.array([i % ipu for i in canonical_ids], dtype=np.int64).tobytes(),
            labels_bytes([i // per_leaf for i in firsts])), canonical


SMALL = 16  # placements of at most this many instances: `small_placement_shape`


def _head(model: StepModel, job: TrainingJob, instances: int) -> tuple:
    """What of the job the step depends on, on `instances` instances."""
    return (job.model, job.sequence_length, job.global_batch, job.micro_batch, job.parallelism,
            job.precision, job.recompute, model.attention(job), model.hardware.name, instances,
            expert_load(job))


def alike_shape(model: StepModel, job: TrainingJob, canonical: np.ndarray) -> tuple | None:
    """A coarser key than `placement_shape`'s for a step whose placements it cannot tell
    apart, or None: over several sites (where the leaves count) but on a canonical placement
    in one site where they do not (`leaves_matter`), a job whose only collectives across
    instances are its data-parallel reduction over all its replicas (one stage, no
    context or expert parallelism, no ZeRO-3 or hybrid shard, its tensor-parallel groups
    inside whole instances). Its step then depends on the placement only through that
    reduction, which `GradientReduction` keys by the site and the multiset of which
    instances of each UltraServer it holds (`_domain_shape`: every instance carries the
    same ranks): so this key, and placements that differ in their leaves or in the order
    of their UltraServers share one simulation (tests/test_step_alike.py checks it against
    simulating each). The step model keys its shapes' cache as before (`has_profile`,
    which decides when a replacement keeps the last solved step, answers as before): only
    simulations are saved, the 30-day slice's 4,622 of small jobs in one site 1,539."""
    par = job.parallelism
    hw = model.hardware
    rpi = hw.ranks_per_instance
    if not model._alike_in_site or not (
            par.pp == 1 and par.cp == 1 and par.ep == 1 and not job.model.moe
            and par.zero < 3 and par.shard_ranks in (1, par.replicas)
            and rpi % par.tp == 0 and par.ranks % rpi == 0):
        return None
    ids = canonical.tolist()
    sites = model.topology.chip_site
    cpi = hw.chips_per_instance
    site = int(sites[min(ids) * cpi])
    if site != int(sites[max(ids) * cpi]):
        return None
    ipu = hw.instances_per_ultraserver
    held: dict[int, int] = {}  # UltraServer -> its instances held, a bit each
    for i in ids:
        held[i // ipu] = held.get(i // ipu, 0) | 1 << (i % ipu)
    return (*_head(model, job, len(ids)), "in-site", site, tuple(sorted(held.values())))


def labels_bytes(ids: list[int]) -> bytes:
    """`first_seen_labels(np.array(ids)).tobytes()` for a short list."""
    seen: dict[int, int] = {}
    return np.array([seen.setdefault(i, len(seen)) for i in ids], dtype=np.int64).tobytes()


def first_seen_labels(ids: np.ndarray) -> np.ndarray:
    """Each id renamed by the order of its first appearance: [7, 3, 7, 9] -> [0, 1, 0, 2]."""
    if len(ids) < 2 or bool((ids[1:] >= ids[:-1]).all()):  # sorted: count the changes
        return np.concatenate(([0], np.cumsum(ids[1:] != ids[:-1])))
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse]


def spread_shape(topology: Topology, placed: np.ndarray) -> tuple[tuple, np.ndarray] | None:
    """((site, instances) per site in order, canonical placement), or None in one site."""
    if topology.chip_site is None or topology.sites is None:
        return None
    # Sites are blocks of consecutive instances: in one site when its lowest and highest
    # instance are (two look-ups, not one per instance: asked at every placement).
    cpi = topology.hardware.chips_per_instance
    chip_site = topology.chip_site
    if len(placed) <= SMALL:  # (on Python integers: numpy's min and max cost more here)
        ids = placed.tolist()
        lowest, highest = min(ids), max(ids)
    else:
        lowest, highest = int(placed.min()), int(placed.max())
    if chip_site[lowest * cpi] == chip_site[highest * cpi]:
        return None
    # A spread job's placement is asked for its split several times over (its profile, its
    # cross-site step, its replacement check), each a sort of thousands of instances: the
    # last few answers are kept for read-only arrays (a job's `held`, a canonical placement
    # from here), which cannot have changed since.
    found = _SPREAD_KEPT.get(id(placed))
    if found is not None and found[0] is placed and found[1] is topology:
        return found[2]
    sites = chip_site[placed * cpi]
    ids, counts = np.unique(sites, return_counts=True)
    starts = topology.sites.first_instance
    canonical = np.concatenate([np.arange(starts[s], starts[s] + c)
                                for s, c in zip(ids.tolist(), counts.tolist(), strict=True)])
    canonical.flags.writeable = False
    split = tuple(zip(ids.tolist(), counts.tolist(), strict=True))
    if not placed.flags.writeable:
        while len(_SPREAD_KEPT) > _SPREAD_KEEP - 2:  # (two entries each: the placement's
            del _SPREAD_KEPT[next(iter(_SPREAD_KEPT))]  # and its canonical placement's)
        _SPREAD_KEPT[id(placed)] = (placed, topology, (split, canonical))
        _SPREAD_KEPT[id(canonical)] = (canonical, topology, (split, canonical))
    return split, canonical


# `spread_shape`'s last answers for read-only placements: id -> (placement, topology, answer)
# (the placement kept: its id cannot be reused while it is here).
_SPREAD_KEPT: dict[int, tuple] = {}
_SPREAD_KEEP = 16


def leaves_matter(topology: Topology, sites: bool = True) -> bool:
    """Whether the leaves a placement's instances fall on can change a collective beyond
    which spine a send crosses: over several sites, on an oversubscribed fabric, or with
    UltraServers split across leaves. Otherwise a leaf's uplinks carry all its chips' EFA,
    so crossing flows never outrun their NICs (`collectives.fabric`), and the step model
    keys its caches without the leaves. `sites` False: whether they matter inside one site
    (each site's fabric is built alike)."""
    hw = topology.hardware
    ipu = hw.instances_per_ultraserver
    fabric = topology.fabric
    return ((sites and topology.site_count > 1) or fabric.oversubscription > 1.0
            or fabric.leaf_size(ipu) % ipu != 0)
