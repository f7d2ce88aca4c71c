"""Parse and print physical quantities: sizes, bandwidths, durations, rates and power.

Every quantity is held in base units inside clustersim: bytes, bytes/s, seconds, events per
second and watts. Scenario files and the catalog may write them with units (`96GiB`,
`2.9TB/s`, `200Gbps`, `15us`, `30min`, `0.0065/d`, `500W`) or as plain numbers in base units.
Anything else is an error that says what was expected; `96GiBs` is not 96 GiB.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "UnitError",
    "parse_bytes",
    "parse_bandwidth",
    "parse_duration",
    "parse_rate",
    "parse_power",
    "format_bytes",
    "format_bandwidth",
    "format_duration",
    "format_rate",
    "format_power",
    "format_or_dash",
    "format_latencies",
    "BYTE_UNITS",
    "BANDWIDTH_UNITS",
    "DURATION_UNITS",
    "POWER_UNITS",
]


class UnitError(ValueError):
    """A quantity that cannot be read: bad number, unknown unit or wrong kind of unit."""


_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_IEC = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}

BYTE_UNITS: dict[str, float] = {f"{p}B": f for p, f in _SI.items()}
BYTE_UNITS.update({f"{p}B": f for p, f in _IEC.items()})
BYTE_UNITS["kB"] = 1e3  # common spelling of kilobyte

BANDWIDTH_UNITS: dict[str, float] = {f"{u}/s": f for u, f in BYTE_UNITS.items()}
# Network rates in bits per second, as NIC and EFA figures are quoted.
for _p, _f in _SI.items():
    BANDWIDTH_UNITS[f"{_p}bps"] = _f / 8.0
    BANDWIDTH_UNITS[f"{_p}b/s"] = _f / 8.0
BANDWIDTH_UNITS["kbps"] = 1e3 / 8.0

DURATION_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "min": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "w": 7 * 86400.0,
    "y": 365 * 86400.0,  # a year is 365 days, as failure-rate tables count it
}

POWER_UNITS: dict[str, float] = {"W": 1.0, "kW": 1e3, "MW": 1e6}

# ASCII digits only: Python's \d and float() also read other scripts' digits ('١٢' is 12).
_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_NUMBER_UNIT = re.compile(
    rf"^[ \t]*(?P<num>{_NUMBER})[ \t]*(?P<unit>[^\s0-9.+-][^\s]*)?[ \t]*$", re.ASCII
)
_COUNT = re.compile(rf"^[ \t]*{_NUMBER}[ \t]*$", re.ASCII)
# A plain number beyond this is no physical quantity (and a 400-digit integer is no float).
LARGEST = 1e300


def _split(text: str, kind: str, example: str) -> tuple[float, str]:
    match = _NUMBER_UNIT.match(text)
    if match is None:
        raise UnitError(f"cannot read {text!r} as a {kind}; expected a number with a unit, e.g. {example}")
    return float(match.group("num")), match.group("unit") or ""


def _plain_number(value: object, kind: str) -> float | None:
    """Numbers pass through as base units; booleans and other types are refused."""
    if isinstance(value, bool):
        raise UnitError(f"expected a {kind}, got the boolean {value!r}")
    if isinstance(value, int) and abs(value) > LARGEST:
        raise UnitError(f"expected a {kind}, got an integer of {value.bit_length()} bits (too "
                        "large)")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise UnitError(f"expected a finite {kind}, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise UnitError(f"expected a {kind} as a number or a string with a unit, got {value!r}")
    return None


def _parse(value: object, kind: str, units: dict[str, float], example: str) -> float:
    number = _plain_number(value, kind)
    if number is not None:
        return number
    assert isinstance(value, str)
    number, unit = _split(value, kind, example)
    if unit == "":
        if not math.isfinite(number):
            raise UnitError(f"{value!r} is too large for a {kind}")
        return number
    if unit not in units:
        shown = ", ".join(sorted(units, key=lambda u: (units[u], u)))
        raise UnitError(f"unknown {kind} unit {unit!r} in {value!r}; expected one of {shown}")
    result = number * units[unit]
    if not math.isfinite(result):
        raise UnitError(f"{value!r} is too large for a {kind}")
    return result


def parse_bytes(value: object) -> float:
    """Size in bytes: `96GiB`, `2MB`, `1e9` (plain numbers are bytes)."""
    return _parse(value, "size", BYTE_UNITS, "96GiB or 512MB")


def parse_bandwidth(value: object) -> float:
    """Bandwidth in bytes/s: `2.9TB/s`, `384GiB/s`, `200Gbps` (bits), plain numbers are bytes/s."""
    return _parse(value, "bandwidth", BANDWIDTH_UNITS, "2.9TB/s or 200Gbps")


def parse_duration(value: object) -> float:
    """Duration in seconds: `15us`, `30min`, `4h`, `54d`, `1y` (365 days); plain numbers are s."""
    return _parse(value, "duration", DURATION_UNITS, "15us, 30min or 54d")


def parse_power(value: object) -> float:
    """Power in watts: `500W`, `1.2kW`; plain numbers are watts."""
    return _parse(value, "power", POWER_UNITS, "500W")


def parse_rate(value: object) -> float:
    """Events per second: `0.0065/d`, `2/y`, `1/1000h`, `3/1000d`; plain numbers are per second."""
    number = _plain_number(value, "rate")
    if number is not None:
        return number
    assert isinstance(value, str)
    count_text, slash, per_text = value.partition("/")
    if not slash or not per_text.strip():
        raise UnitError(
            f"cannot read {value!r} as a rate; expected events per time, e.g. 0.0065/d, 2/y or 1/1000h"
        )
    try:
        if not _COUNT.match(count_text):
            raise ValueError(count_text)
        count = float(count_text)
    except ValueError:
        raise UnitError(f"cannot read the count {count_text.strip()!r} of the rate {value!r}") from None
    if not math.isfinite(count):
        raise UnitError(f"the count of the rate {value!r} must be a finite number")
    per_text = per_text.strip()
    if per_text[0] in "+-":
        raise UnitError(f"the time in the rate {value!r} must be positive")
    if per_text[0].isdigit() or per_text[0] == ".":
        per_s = parse_duration(per_text)
    else:  # `/d` means per one day
        per_s = parse_duration("1" + per_text)
    if per_s <= 0:
        raise UnitError(f"the time in the rate {value!r} must be positive")
    return count / per_s


def format_or_dash(value: float | None, spec: str = ".3g") -> str:
    """`value` formatted by `spec`, or "-" where a figure is undefined (None: no request
    completed, or none decoded past its first token); printing 0 there read as a latency."""
    return "-" if value is None else format(value, spec)


def format_latencies(name: str, p50_s: float | None, p99_s: float | None) -> str:
    """`TPOT p50 0.0182 s p99 0.0202 s`, or `TPOT none` when no request gave the figure."""
    if p50_s is None or p99_s is None:
        return f"{name} none"
    return f"{name} p50 {p50_s:.3g} s p99 {p99_s:.3g} s"


def _scaled(value: float, steps: list[tuple[float, str]], digits: int) -> str:
    magnitude = abs(value)
    for factor, unit in steps:
        if magnitude >= factor:
            return f"{_trim(value / factor, digits)}{unit}"
    factor, unit = steps[-1]
    return f"{_trim(value / factor, digits)}{unit}"


def _trim(number: float, digits: int) -> str:
    return f"{number:.{digits}g}"


def format_bytes(n_bytes: float, binary: bool = True, digits: int = 4) -> str:
    """`103079215104` -> `96GiB` (binary) or `103.1GB` (decimal)."""
    if binary:
        steps = [(2.0**e, u) for e, u in [(60, "EiB"), (50, "PiB"), (40, "TiB"), (30, "GiB"),
                                           (20, "MiB"), (10, "KiB"), (0, "B")]]
    else:
        steps = [(10.0**e, u) for e, u in [(18, "EB"), (15, "PB"), (12, "TB"), (9, "GB"),
                                            (6, "MB"), (3, "KB"), (0, "B")]]
    return _scaled(n_bytes, steps, digits)


def format_bandwidth(bytes_per_s: float, bits: bool = False, digits: int = 4) -> str:
    """`2.9e12` -> `2.9TB/s`; with `bits=True`, `2.5e10` -> `200Gbps`."""
    if bits:
        steps = [(10.0**e, u) for e, u in [(15, "Pbps"), (12, "Tbps"), (9, "Gbps"), (6, "Mbps"),
                                            (3, "Kbps"), (0, "bps")]]
        return _scaled(bytes_per_s * 8.0, steps, digits)
    steps = [(10.0**e, u) for e, u in [(15, "PB/s"), (12, "TB/s"), (9, "GB/s"), (6, "MB/s"),
                                        (3, "KB/s"), (0, "B/s")]]
    return _scaled(bytes_per_s, steps, digits)


def format_duration(seconds: float, digits: int = 4) -> str:
    """`0.000015` -> `15us`, `1800` -> `30min`, `4665600` -> `54d`."""
    steps = [(86400.0, "d"), (3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms"),
             (1e-6, "us"), (1e-9, "ns")]
    if seconds == 0:
        return "0s"
    return _scaled(seconds, steps, digits)


def format_rate(per_s: float, digits: int = 4) -> str:
    """Events per second as events per day, e.g. `0.0065/d`."""
    return f"{_trim(per_s * 86400.0, digits)}/d"


def format_power(watts: float, digits: int = 4) -> str:
    """`500` -> `500W`, `1.2e6` -> `1.2MW`."""
    return _scaled(watts, [(1e6, "MW"), (1e3, "kW"), (1.0, "W")], digits)
