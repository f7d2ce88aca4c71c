"""The training planner's options and result: objectives, plan options, candidate groups,
the result and its public columns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from clustersim.hardware.catalog import HardwareSpec
from clustersim.planning.ettr import Recovery
from clustersim.planning.simulate import (
    GroupKey,
)
from clustersim.scenario.loader import Scenario

__all__ = [
    "Group",
    "OBJECTIVES",
    "PUBLIC",
    "PlanError",
    "PlanOptions",
    "PlanResult",
    "default_memory_headroom",
]


OBJECTIVES = {"step": "step_time_s", "cost": "cost_per_million_tokens_usd",
              "energy": "energy_per_token_j", "time-to-train": "time_to_train_s"}


def default_memory_headroom() -> float:
    """The fraction of HBM the planner keeps free unless told (catalog/planning.yaml)."""
    from clustersim.catalog import read_catalog

    return float(read_catalog("planning")["memory_headroom"]["value"])


class PlanError(Exception):
    """The plan cannot be made as asked (bad input, nothing feasible); says what would help."""


@dataclass(frozen=True)
class PlanOptions:
    hardware: tuple[str, ...] = ()  # catalog names; empty: the scenario's hardware
    chips: tuple[int, ...] = ()  # empty: the scenario's job or cluster size
    objective: str = "step"
    tokens: float | None = None
    deadline_s: float | None = None
    budget_usd: float | None = None
    max_chips: int | None = None
    memory_headroom: float = field(default_factory=lambda: default_memory_headroom())
    top: int = 10


@dataclass
class Group:
    """One hardware at one size: its failure figures and its candidates."""

    name: str
    hw: HardwareSpec
    chips: int
    instances: int
    key: GroupKey
    recovery: dict[bool, Recovery]  # by whole-UltraServer replacement
    rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class PlanResult:
    scenario: Scenario
    options: PlanOptions
    rows: pd.DataFrame  # every candidate considered
    ranked: list[dict[str, Any]]  # simulated candidates, best first
    groups: list[Group]
    considered: int
    pruned: int
    simulated: int
    stops_paying: dict[str, int | None]
    notes: list[str]
    met: bool = True  # False: nothing meets --deadline / --budget; `ranked` is the closest
    sites: dict[str, Any] | None = None  # several sites: spread vs one site (planning.sites)

    @property
    def best(self) -> dict[str, Any]:
        return self.ranked[0]

    def as_json(self) -> dict[str, Any]:
        """`plan --json`: best, the top candidates and the counts."""
        return {"best": _public(self.best), "candidates": [_public(r) for r in
                                                            self.ranked[: self.options.top]],
                "considered": self.considered, "pruned": self.pruned,
                "simulated": self.simulated, "meets_constraints": self.met} | (
                    {} if self.sites is None else {"sites": self.sites})


PUBLIC = ("hardware", "chips", "tp", "cp", "pp", "dp", "ep", "interleave", "micro_batch",
          "recompute", "sequence_parallel", "zero", "step_time_s", "mfu", "memory_per_chip_gib", "ettr",
          "time_to_train_s", "cost_usd", "energy_j", "tokens_per_s", "job_mtbf_s", "recovery_s",
          "checkpoint_interval_s", "cost_per_million_tokens_usd", "energy_per_token_j",
          "step_time_s_band", "reference", "meets", "unmet", "all_to_all_s", "order")


def _public(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name in PUBLIC:
        value = row.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out[name] = value
    return out
