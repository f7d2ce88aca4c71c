"""Failure rates: the per-component rate specs and the presets they come from.

A rate is given per chip, instance, UltraServer, leaf switch or job, as events per unit time
or as an MTBF, with an exponential or Weibull distribution. Presets (`catalog/failures.yaml`)
borrow published GPU-fleet rates, since none are published for Trainium, converted to rates
per accelerator.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any, Literal

from pydantic import Field, model_validator

from clustersim.catalog import read_catalog
from clustersim.hardware import limits, units
from clustersim.hardware.spec import Duration, Rate, Spec

__all__ = [
    "COMPONENTS",
    "StragglerSpec",
    "TransientSlowdownSpec",
    "FailureRateSpec",
    "failure_preset_names",
    "failure_preset_rates",
    "failure_preset_source",
]

COMPONENTS = ("chip", "hbm", "neuronlink", "nic", "host", "switch", "software", "node")
Per = Literal["chip", "instance", "ultraserver", "leaf", "job"]


class FailureRateSpec(Spec):
    """One failure process: a component's rate per unit of hardware (or per job)."""

    component: Literal["chip", "hbm", "neuronlink", "nic", "host", "switch", "software", "node"]
    per: Per = "chip"
    rate_per_s: Rate | None = Field(default=None, alias="rate", description="events per unit")
    mtbf_s: Duration | None = Field(default=None, alias="mtbf", description="mean time between")
    distribution: Literal["exponential", "weibull"] = "exponential"
    shape: float | None = Field(default=None, ge=limits.MIN_WEIBULL_SHAPE,
                                le=limits.MAX_WEIBULL_SHAPE, description="Weibull shape")
    cause: str | None = Field(default=None, description="what the preset calls it")

    @model_validator(mode="after")
    def _check(self) -> FailureRateSpec:
        if (self.rate_per_s is None) == (self.mtbf_s is None):
            raise ValueError("give exactly one of rate (e.g. 0.0065/d) or mtbf (e.g. 40000h)")
        if self.mtbf_s is not None and self.mtbf_s < limits.MIN_MTBF_S:
            raise ValueError(f"mtbf: at least {limits.MIN_MTBF_S:g}s per unit (docs/limits.md), "
                             f"got {self.mtbf_s:g}s")
        if self.distribution == "weibull" and self.shape is None:
            raise ValueError("a weibull distribution needs shape (e.g. 0.8)")
        if self.distribution == "exponential" and self.shape is not None:
            raise ValueError("shape applies to the weibull distribution only")
        return self

    @property
    def events_per_s(self) -> float:
        """Mean failure rate per unit (for Weibull, one over its mean time between failures)."""
        if self.rate_per_s is not None:
            return self.rate_per_s
        assert self.mtbf_s is not None
        return 1.0 / self.mtbf_s


class TransientSlowdownSpec(Spec):
    """Episodes in which one instance runs slower (thermal throttling, a noisy neighbour)."""

    rate_per_s: Rate = Field(alias="rate", description="episodes per instance per unit time")
    duration_s: Duration = Field(alias="duration")
    slowdown: float = Field(gt=1.0, le=limits.MAX_SLOWDOWN,
                            description="step time multiplier while an episode lasts")


class StragglerSpec(Spec):
    """Slow hardware slowing its synchronous group (off unless given).

    A `fraction` of instances is persistently slow by `slowdown`; a job's step takes as long
    as its slowest instance's. `transient` episodes come and go. `jitter` is the coefficient
    of variation of one step's time (steps are then Gamma-distributed, so a run of k steps is
    advanced in one draw of their sum).
    """

    fraction: float = Field(default=0.0, ge=0, le=1, description="persistently slow instances")
    slowdown: float = Field(default=1.0, ge=1.0, le=limits.MAX_SLOWDOWN,
                            description="their step time multiplier")
    transient: TransientSlowdownSpec | None = None
    jitter: float = Field(default=0.0, ge=0, le=1, description="coefficient of variation of a step")


def weibull_scale(mean_s: float, shape: float) -> float:
    """Weibull scale giving this mean: mean = scale x Gamma(1 + 1/shape)."""
    return mean_s / math.gamma(1.0 + 1.0 / shape)


def _document() -> dict[str, Any]:
    return read_catalog("failures")


def failure_preset_names() -> list[str]:
    return list(_document()["presets"])


def failure_preset_source(name: str) -> str:
    return _document()["sources"].get(name, "")


def failure_preset_rates(name: str) -> list[FailureRateSpec]:
    """A preset's causes as per-chip exponential rates (KeyError for an unknown preset)."""
    return list(_preset_rates(name))


@cache  # (the catalog is read once; every job of a 100,000-job mix asks for its rates)
def _preset_rates(name: str) -> tuple[FailureRateSpec, ...]:
    preset = _document()["presets"][name]
    rates = []
    for cause in preset["causes"]:
        if "count" in cause:
            window_s = units.parse_duration(preset["window"])
            per_chip_s = cause["count"] / (window_s * preset["accelerators"])
        else:
            per_chip_s = cause["rate_per_node_day"] / cause["accelerators_per_node"] / 86400.0
        rates.append(
            FailureRateSpec(
                component=cause["component"], per="chip", rate=per_chip_s, cause=cause["cause"]
            )
        )
    return tuple(rates)
