"""Shared building blocks for the validated, immutable specs: base model and unit-typed fields.

Specs are pydantic models validated once at the boundary (scenario files, catalog data) and
trusted inside. Field names carry their unit (`hbm_bytes`, `latency_s`); the keys users
write are the short aliases of the contract (`hbm`, `latency`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, WithJsonSchema

from clustersim.hardware import units

__all__ = [
    "Spec",
    "Bytes",
    "Bandwidth",
    "Duration",
    "NonNegativeDuration",
    "Rate",
    "Power",
    "positive",
    "non_negative",
]


class Spec(BaseModel):
    """Frozen, strict-keyed model: unknown keys are errors, values never change after checks."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def positive(value: float) -> float:
    if value <= 0:
        raise ValueError(f"must be greater than zero, got {value:g}")
    return value


def non_negative(value: float) -> float:
    if value < 0:
        raise ValueError(f"must not be negative, got {value:g}")
    return value


def _unit_type(parser: Any, check: Any, pattern_doc: str, example: str) -> Any:
    schema = {
        "anyOf": [{"type": "number"}, {"type": "string"}],
        "description": pattern_doc,
        "examples": [example],
    }
    return Annotated[float, BeforeValidator(parser), AfterValidator(check), WithJsonSchema(schema)]


Bytes = _unit_type(units.parse_bytes, positive, "size: bytes, or a string with a unit", "96GiB")
Bandwidth = _unit_type(
    units.parse_bandwidth, positive, "bandwidth: bytes/s, or a string with a unit", "200Gbps"
)
Duration = _unit_type(
    units.parse_duration, positive, "duration: seconds, or a string with a unit", "30min"
)
NonNegativeDuration = _unit_type(
    units.parse_duration, non_negative, "duration: seconds, or a string with a unit", "60s"
)
Rate = _unit_type(units.parse_rate, positive, "events per second, or events/time", "0.0065/d")
Power = _unit_type(units.parse_power, positive, "power: watts, or a string with a unit", "500W")
