"""A training job's step profile: what the step model reports of one job's step."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from clustersim.training.memory import (
    MemoryBreakdown,
)

__all__ = [
    "JobDoesNotFit",
    "StepProfile",
]


class JobDoesNotFit(Exception):
    """Raised by callers that refuse to run a job whose memory exceeds the chip's HBM."""


@dataclass(frozen=True)
class StepProfile:
    """One step of one job: its time, where the time goes, throughput, efficiency, memory."""

    name: str
    step_time_s: float
    compute_s: float
    exposed_comm_s: dict[str, float]  # tp, pp, dp
    bubble_s: float
    optimizer_s: float
    tokens_per_step: int
    sequences_per_step: int
    model_flops: float
    hardware_flops: float
    peak_flops: float  # of all the job's chips at its precision
    memory: MemoryBreakdown
    chips: int
    instances: int
    microbatches: int
    energy_per_token_j: float | None
    cost_per_million_tokens_usd: float | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Largest under- and over-prediction of the chip family's published rows (fractions).
    error_band: tuple[float, float] = (0.0, 0.0)

    @property
    def step_time_s_band(self) -> tuple[float, float]:
        """[low, high] step time from the family's residuals: the published step of every
        row of the family was between (1 + low) and (1 + high) times the model's."""
        low, high = self.error_band
        return (self.step_time_s * (1 + low), self.step_time_s * (1 + high))

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def sequences_per_s(self) -> float:
        return self.sequences_per_step / self.step_time_s

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.step_time_s * self.peak_flops)

    @property
    def hfu(self) -> float:
        return self.hardware_flops / (self.step_time_s * self.peak_flops)

    @property
    def fits_memory(self) -> bool:
        return self.memory.fits

    def as_dict(self) -> dict[str, Any]:
        """The contract's `step --json` entry (plus more detail)."""
        return {
            "name": self.name,
            "step_time_s": self.step_time_s,
            "step_time_s_band": list(self.step_time_s_band),
            "tokens_per_s": self.tokens_per_s,
            "sequences_per_s": self.sequences_per_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "memory_per_chip_gib": self.memory.per_chip / 2**30,
            "fits_memory": self.fits_memory,
            "step_breakdown": {
                "compute_s": self.compute_s,
                "exposed_comm_s": sum(self.exposed_comm_s.values()),
                "bubble_s": self.bubble_s,
                "optimizer_s": self.optimizer_s,
                **{f"{kind}_comm_s": value for kind, value in self.exposed_comm_s.items()},
            },
            "memory_gib": self.memory.as_gib(),
            "chips": self.chips,
            "instances": self.instances,
            "microbatches": self.microbatches,
            "tokens_per_step": self.tokens_per_step,
            "energy_per_token_j": self.energy_per_token_j,
            "cost_per_million_tokens_usd": self.cost_per_million_tokens_usd,
            "notes": list(self.notes),
        }


def renamed(profile: StepProfile, name: str) -> StepProfile:
    """A copy of the profile under another name (a shallow copy with the name set: a fleet
    asks it for each of 100,000 jobs, and `dataclasses.replace` re-ran the whole __init__)."""
    renamed = copy.copy(profile)
    object.__setattr__(renamed, "name", name)  # (frozen: set on the fresh copy only)
    return renamed
