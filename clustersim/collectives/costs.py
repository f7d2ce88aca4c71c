"""What a collective costs: one algorithm step, one level's stage, the whole collective."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from clustersim.collectives.groups import Group
from clustersim.collectives.ops import bus_factor

__all__ = ["Step", "StageCost", "CollectiveCost"]


@dataclass
class Step:
    """One algorithm step: flows between chips, HBM traffic per chip, and how many times."""

    count: int
    flows: list[tuple[int, int]]  # directed chip pairs sending at once
    flow_bytes: float
    hbm_bytes_per_chip: float


@dataclass(frozen=True)
class StageCost:
    """One level's part of a collective."""

    level: str  # instance | ultraserver | fabric | chip
    op: str
    algorithm: str
    members: int  # ranks (instance level) or chips/domains taking part at this level
    bytes_per_rank: float
    steps: int
    latency_s: float
    transfer_s: float

    @property
    def time_s(self) -> float:
        return self.latency_s + self.transfer_s


@dataclass(frozen=True)
class CollectiveCost:
    """Time of one collective and why: its stages, algbw and busbw (nccom-test's figures)."""

    op: str
    size_bytes: float
    ranks: int
    algorithm: str
    stages: tuple[StageCost, ...]
    group: Group | None = field(default=None, repr=False, compare=False)

    @property
    def latency_s(self) -> float:
        return sum(s.latency_s for s in self.stages)

    @property
    def transfer_s(self) -> float:
        return sum(s.transfer_s for s in self.stages)

    @property
    def time_s(self) -> float:
        return self.latency_s + self.transfer_s

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.stages)

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.size_bytes / self.time_s if self.time_s > 0 else math.inf

    @property
    def busbw_bytes_per_s(self) -> float:
        return self.algbw_bytes_per_s * bus_factor(self.op, self.ranks)

    def scaled(self, slowdown: float) -> CollectiveCost:
        """The same collective with its transfer time stretched (contention)."""
        stages = tuple(replace(s, transfer_s=s.transfer_s * slowdown) for s in self.stages)
        return replace(self, stages=stages)
