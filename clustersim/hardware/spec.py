"""Shared building blocks for the validated, immutable specs: base model and unit-typed fields.

Specs are pydantic models validated once at the boundary (scenario files, catalog data) and
trusted inside. Field names carry their unit (`hbm_bytes`, `latency_s`); the keys users
write are the short aliases of the contract (`hbm`, `latency`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Strict,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from clustersim.hardware import limits, units

__all__ = [
    "Spec",
    "KeyedError",
    "Bytes",
    "Bandwidth",
    "Duration",
    "NonNegativeDuration",
    "Rate",
    "RequestRate",
    "Power",
    "positive",
    "printable",
    "non_negative",
    "at_most",
    "at_least",
    "show_duration",
]


_FLAG = Annotated[bool, Strict()]  # a boolean field of a Spec (Spec.__init_subclass__)

# (a tuple, not `bool | dict | list | tuple`: that union is built again at every call, and a
# million generated jobs' 22 million fields pass here)
_CAN_HIDE_A_BOOLEAN = (bool, dict, list, tuple)


class KeyedError(ValueError):
    """A spec's own check that names the key below the spec (`parallelism.ep`, `top_k`)
    and its value: the issue is reported at that key (scenario.messages finds it in the
    error pydantic wraps), not at the spec's (`serve.0`, `jobs.0.model`)."""

    def __init__(self, key: str, message: str, value: Any):
        super().__init__(f"{key} {value!r}: {message}")
        self.key = key
        self.message = message
        self.value = value


class Spec(BaseModel):
    """Frozen, strict-keyed model: unknown keys are errors, values never change after checks.
    NaN and infinity are refused wherever a number is meant, and so is a boolean (`dp: true`
    is not 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              allow_inf_nan=False)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every boolean field is strict: a flag is a YAML true or false, where pydantic's
        lax mode would read "yes", "Off", "0", 1 or 0.0. Set here, on the annotations before
        pydantic reads them, for every spec at once and at no cost per value (a check in the
        validator below cost a million generated jobs' load seconds)."""
        annotations = cls.__dict__.get("__annotations__", {})
        for name, annotation in annotations.items():
            if annotation is bool or annotation == "bool":
                annotations[name] = _FLAG
        super().__init_subclass__(**kwargs)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, _CAN_HIDE_A_BOOLEAN):
            # only these can hide a boolean (100,000 jobs validate fast)
            return value
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _boolean_where_number(value, field.annotation):
            raise ValueError("expected a number, not true or false")
        return value


def _boolean_where_number(value: Any, annotation: Any) -> bool:
    """A boolean given for a number (also inside a mapping or list of numbers)."""
    if annotation is bool or annotation is Any:
        return False
    args = get_args(annotation)
    origin = get_origin(annotation)
    if origin is Annotated:
        return _boolean_where_number(value, args[0])
    if isinstance(value, bool):
        if origin is Literal:  # `zero: true` is not the stage 1
            return not any(isinstance(a, bool) for a in args) and any(
                isinstance(a, int) for a in args)
        if args:  # a union: a boolean is fine if one member takes it
            return not any(a is bool or get_origin(a) is Literal or a is Any for a in args) and (
                any(_takes_number(a) for a in args))
        return _takes_number(annotation)
    if args and origin not in (dict, list, tuple, Literal):
        # an optional list or mapping (`buckets: list[int] | None`): its members' types say
        # what the items are; pydantic's lax mode would take [true] as [1]
        members = _container_members(annotation)
        for member in members:
            if _boolean_where_number(value, member):
                return True
        return False
    if isinstance(value, dict) and origin is dict and len(args) == 2:
        return any(_boolean_where_number(v, args[1]) for v in value.values())
    if isinstance(value, list | tuple) and origin in (list, tuple) and args:
        return any(_boolean_where_number(v, args[0]) for v in value)
    return False


_MEMBERS: dict[int, tuple[Any, tuple[Any, ...]]] = {}


def _container_members(annotation: Any) -> tuple[Any, ...]:
    """A union's list, tuple and mapping members, found once per annotation (a million
    jobs' fields pass here; keyed by identity: hashing a union hashes its members)."""
    known = _MEMBERS.get(id(annotation))
    if known is not None and known[0] is annotation:
        return known[1]
    members = tuple(a for a in get_args(annotation)
                    if get_origin(a) in (dict, list, tuple) or get_origin(a) is Annotated)
    _MEMBERS[id(annotation)] = (annotation, members)
    return members


def _takes_number(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        return _takes_number(get_args(annotation)[0])
    return annotation in (int, float)


def printable(text: str) -> str:
    """A name as messages and tables show it on one line: something visible, and no control
    or format characters (a newline, a tab, a right-to-left override)."""
    if not text.strip():
        raise ValueError("expected a name with a visible character, got only spaces")
    if not text.isprintable():
        raise ValueError("expected a name without control characters (newlines, tabs, ...)")
    return text


def positive(value: float) -> float:
    if value <= 0:
        raise ValueError(f"must be greater than zero, got {value:g}")
    return value


def non_negative(value: float) -> float:
    if value < 0:
        raise ValueError(f"must not be negative, got {value:g}")
    return value


def at_most(limit: float, show: Any) -> Any:
    """A check that a value is at most `limit` (shown with `show`, in the value's units)."""

    def check(value: float) -> float:
        if value > limit:
            raise ValueError(f"at most {show(limit)} (docs/limits.md), got {show(value)}")
        return value

    return check


def at_least(limit: float, show: Any) -> Any:
    def check(value: float) -> float:
        if value < limit:
            raise ValueError(f"at least {show(limit)} (docs/limits.md), got {show(value)}")
        return value

    return check


def _unit_type(parser: Any, checks: list[Any], pattern_doc: str, example: str) -> Any:
    schema = {
        "anyOf": [{"type": "number"}, {"type": "string"}],
        "description": pattern_doc,
        "examples": [example],
    }
    return Annotated[float, BeforeValidator(parser), *map(AfterValidator, checks),
                     WithJsonSchema(schema)]


def show_duration(seconds: float) -> str:
    """A duration for a message: in years from a year up (format_duration stops at days)."""
    if seconds >= limits.YEAR_S:
        return f"{seconds / limits.YEAR_S:,.4g}y"
    return units.format_duration(seconds)


_duration_cap = at_most(limits.MAX_ANY_DURATION_S, show_duration)
Bytes = _unit_type(units.parse_bytes, [positive, at_most(limits.MAX_BYTES, units.format_bytes)],
                   "size: bytes, or a string with a unit", "96GiB")
Bandwidth = _unit_type(
    units.parse_bandwidth,
    [positive, at_least(limits.MIN_BANDWIDTH_BYTES_PER_S, units.format_bandwidth),
     at_most(limits.MAX_BANDWIDTH_BYTES_PER_S, units.format_bandwidth)],
    "bandwidth: bytes/s, or a string with a unit", "200Gbps"
)
Duration = _unit_type(
    units.parse_duration, [positive, _duration_cap], "duration: seconds, or a string with a unit",
    "30min"
)
NonNegativeDuration = _unit_type(
    units.parse_duration, [non_negative, _duration_cap],
    "duration: seconds, or a string with a unit", "60s"
)
Rate = _unit_type(units.parse_rate,
                  [positive, at_most(limits.MAX_RATE_PER_S, lambda r: f"{r:g}/s")],
                  "events per second, or events/time", "0.0065/d")
RequestRate = _unit_type(units.parse_rate,
                         [positive, at_most(limits.MAX_REQUEST_RATE_PER_S, lambda r: f"{r:g}/s")],
                         "requests per second, or requests/time", "10/s")
Power = _unit_type(units.parse_power, [positive, at_most(limits.MAX_POWER_W, units.format_power)],
                   "power: watts, or a string with a unit", "500W")
