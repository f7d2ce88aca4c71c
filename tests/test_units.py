"""Units: parsing and printing sizes, bandwidths, durations, rates and power (clustersim.hardware.units)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.hardware import units
from clustersim.hardware.units import (
    BANDWIDTH_UNITS,
    BYTE_UNITS,
    DURATION_UNITS,
    POWER_UNITS,
    UnitError,
    format_bandwidth,
    format_bytes,
    format_duration,
    format_power,
    format_rate,
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_power,
    parse_rate,
)

DAY = 86400.0
YEAR = 365 * DAY
GiB = 2.0**30

PARSERS = [parse_bytes, parse_bandwidth, parse_duration, parse_rate, parse_power]


def close(a: float, b: float, rel: float = 1e-12) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


# ---------------------------------------------------------------------------------------------
# Sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("96GiB", 96 * GiB),
        ("32GiB", 32 * 2**30),
        ("1KiB", 1024),
        ("224MiB", 224 * 2**20),
        ("2TiB", 2 * 2**40),
        ("1PiB", 2**50),
        ("1EiB", 2**60),
        ("40GB", 40e9),
        ("141GB", 141e9),
        ("512MB", 512e6),
        ("1kB", 1e3),
        ("1KB", 1e3),
        ("3TB", 3e12),
        ("1PB", 1e15),
        ("1EB", 1e18),
        ("7B", 7.0),
        ("1.5GiB", 1.5 * GiB),
        (".5GiB", 0.5 * GiB),
        ("1e3GiB", 1e3 * GiB),
        ("1.5e-3GB", 1.5e6),
        (" 96 GiB ", 96 * GiB),
        ("+2GB", 2e9),
    ],
)
def test_parse_bytes(text: str, expected: float) -> None:
    assert close(parse_bytes(text), expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0.0), (1024, 1024.0), (1.5e9, 1.5e9), ("1024", 1024.0), ("1e9", 1e9), ("2.5", 2.5)],
)
def test_plain_numbers_are_bytes(value: object, expected: float) -> None:
    result = parse_bytes(value)
    assert isinstance(result, float)
    assert result == expected


# ---------------------------------------------------------------------------------------------
# Bandwidths


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.9TB/s", 2.9e12),
        ("4.9TB/s", 4.9e12),
        ("820GiB/s", 820 * GiB),
        ("384GiB/s", 384 * GiB),
        ("1024GB/s", 1024e9),
        ("256GB/s", 256e9),
        ("1B/s", 1.0),
        ("1kB/s", 1e3),
        # Bits per second, as network figures are quoted: 8 bits to the byte.
        ("200Gbps", 25e9),
        ("200Gb/s", 25e9),
        ("3200Gbps", 400e9),
        ("800Gbps", 100e9),
        ("12800Gbps", 1.6e12),
        ("1.6Tbps", 200e9),
        ("100Mbps", 12.5e6),
        ("8bps", 1.0),
        ("8b/s", 1.0),
        ("8kbps", 1e3),
        ("8Kbps", 1e3),
    ],
)
def test_parse_bandwidth(text: str, expected: float) -> None:
    assert close(parse_bandwidth(text), expected)


def test_bits_and_bytes_agree() -> None:
    assert parse_bandwidth("200Gbps") == 25e9
    assert parse_bandwidth("200Gbps") == parse_bandwidth("25GB/s")
    assert parse_bandwidth("200Gb/s") == parse_bandwidth("200Gbps")


@pytest.mark.parametrize(("value", "expected"), [(25e9, 25e9), (7, 7.0), ("1e12", 1e12)])
def test_plain_numbers_are_bytes_per_second(value: object, expected: float) -> None:
    assert parse_bandwidth(value) == expected


@pytest.mark.parametrize("text", ["96GiB", "200G", "2.9TBs", "5s", "200Gbit"])
def test_bandwidth_refuses_other_units(text: str) -> None:
    with pytest.raises(UnitError):
        parse_bandwidth(text)


# ---------------------------------------------------------------------------------------------
# Durations


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("15us", 15e-6),
        ("15µs", 15e-6),
        ("1.5us", 1.5e-6),
        ("10ns", 10e-9),
        ("3ms", 3e-3),
        ("60s", 60.0),
        ("60sec", 60.0),
        ("30min", 1800.0),
        ("2min", 120.0),
        ("4h", 4 * 3600.0),
        ("4hr", 4 * 3600.0),
        ("40000h", 40000 * 3600.0),
        ("54d", 54 * DAY),
        ("1day", DAY),
        ("3days", 3 * DAY),
        ("2w", 14 * DAY),
        ("1y", 365 * DAY),
        ("1y", YEAR),
        ("0s", 0.0),
        ("0.5h", 1800.0),
    ],
)
def test_parse_duration(text: str, expected: float) -> None:
    assert close(parse_duration(text), expected)


@pytest.mark.parametrize(
    ("value", "expected"), [(0, 0.0), (60, 60.0), (1.5, 1.5), ("3600", 3600.0)]
)
def test_plain_numbers_are_seconds(value: object, expected: float) -> None:
    assert parse_duration(value) == expected


@pytest.mark.parametrize("text", ["5GiB", "5m", "5hours", "5 minutes", "5y5d", "1h30min"])
def test_duration_refuses_other_units(text: str) -> None:
    with pytest.raises(UnitError):
        parse_duration(text)


# ---------------------------------------------------------------------------------------------
# Rates


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0065/d", 0.0065 / DAY),
        ("2/y", 2 / YEAR),
        ("1/1000h", 1 / (1000 * 3600.0)),
        ("3/1000d", 3 / (1000 * DAY)),
        ("1/s", 1.0),
        ("6/min", 0.1),
        ("1/h", 1 / 3600.0),
        ("1/w", 1 / (7 * DAY)),
        ("1 / d", 1 / DAY),
        ("1/ 1000h", 1 / (1000 * 3600.0)),
        ("1/.5d", 2 / DAY),
        ("1e-3/d", 1e-3 / DAY),
    ],
)
def test_parse_rate(text: str, expected: float) -> None:
    assert close(parse_rate(text), expected)


@pytest.mark.parametrize(("value", "expected"), [(1e-6, 1e-6), (2, 2.0), (0, 0.0)])
def test_plain_numbers_are_events_per_second(value: object, expected: float) -> None:
    assert parse_rate(value) == expected


def test_rate_and_mtbf_agree() -> None:
    # 40,000 h between failures is 1/40000h.
    assert close(parse_rate("1/40000h"), 1 / parse_duration("40000h"))


# ---------------------------------------------------------------------------------------------
# Power


@pytest.mark.parametrize(
    ("value", "expected"),
    [("500W", 500.0), ("1.2kW", 1200.0), ("2MW", 2e6), (700, 700.0), ("400", 400.0)],
)
def test_parse_power(value: object, expected: float) -> None:
    assert close(parse_power(value), expected)


@pytest.mark.parametrize("text", ["500w", "1KW", "5J", "500GiB"])
def test_power_refuses_other_units(text: str) -> None:
    with pytest.raises(UnitError):
        parse_power(text)


# ---------------------------------------------------------------------------------------------
# Errors


def test_unit_error_is_a_value_error() -> None:
    assert issubclass(UnitError, ValueError)


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.__name__)
@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "",
        "   ",
        True,
        False,
        None,
        [96],
        {"value": 96},
        float("nan"),
        float("inf"),
        float("-inf"),
        "nan",
        "inf",
        "-inf",
        "1..5GiB",
        "GiB",
    ],
    ids=repr,
)
def test_every_parser_refuses_garbage(parser, value: object) -> None:
    with pytest.raises(UnitError):
        parser(value)


@pytest.mark.parametrize("text", ["96GiBs", "96Gib", "96gib", "96G", "96 GiB s", "96GiB/s", "5min"])
def test_bytes_refuses_unknown_units(text: str) -> None:
    with pytest.raises(UnitError):
        parse_bytes(text)


def test_error_names_the_offending_unit_and_what_is_expected() -> None:
    with pytest.raises(UnitError) as info:
        parse_bytes("96GiBs")
    message = str(info.value)
    assert "GiBs" in message
    assert "96GiBs" in message
    assert "GiB" in message.split("expected", 1)[1]


def test_error_for_a_boolean_says_boolean() -> None:
    with pytest.raises(UnitError, match="boolean"):
        parse_duration(True)


@pytest.mark.parametrize(
    "text", ["1/", "1/ ", "x/d", "/d", "1/0h", "1/0d", "1/xyz", "1/GiB", "1d", "0.0065", "1/d/d"]
)
def test_rate_errors(text: str) -> None:
    with pytest.raises(UnitError):
        parse_rate(text)


def test_rate_error_says_what_is_expected() -> None:
    with pytest.raises(UnitError, match="e.g. 0.0065/d"):
        parse_rate("1/")


@pytest.mark.parametrize("text", ["1e400GiB", "1e300EB", "1e305y"])
def test_overflow_is_an_error(text: str) -> None:
    parser = parse_duration if text.endswith("y") else parse_bytes
    with pytest.raises(UnitError):
        parser(text)


@pytest.mark.parametrize("text", ["nan/d", "inf/d", "1e400/d"])
def test_rate_refuses_non_finite_counts(text: str) -> None:
    with pytest.raises(UnitError):
        parse_rate(text)


@pytest.mark.parametrize("parser", [parse_bytes, parse_duration], ids=lambda p: p.__name__)
def test_plain_number_strings_must_be_finite(parser) -> None:
    with pytest.raises(UnitError):
        parser("1e400")


# ---------------------------------------------------------------------------------------------
# Printing and round trips


@pytest.mark.parametrize(
    ("formatted", "expected"),
    [
        (format_bytes(96 * GiB), "96GiB"),
        (format_bytes(103079215104, binary=False), "103.1GB"),
        (format_bytes(0), "0B"),
        (format_bandwidth(2.9e12), "2.9TB/s"),
        (format_bandwidth(25e9, bits=True), "200Gbps"),
        (format_bandwidth(400e9, bits=True), "3.2Tbps"),
        (format_duration(15e-6), "15us"),
        (format_duration(1800), "30min"),
        (format_duration(4 * 3600), "4h"),
        (format_duration(54 * DAY), "54d"),
        (format_duration(0), "0s"),
        (format_rate(0.0065 / DAY), "0.0065/d"),
        (format_power(500), "500W"),
        (format_power(1.2e6), "1.2MW"),
    ],
)
def test_format(formatted: str, expected: str) -> None:
    assert formatted == expected


@pytest.mark.parametrize(
    ("fmt", "parse", "value"),
    [
        (format_bytes, parse_bytes, 96 * GiB),
        (format_bytes, parse_bytes, 32 * GiB),
        (format_bytes, parse_bytes, 1536.0),
        (lambda v: format_bytes(v, binary=False), parse_bytes, 141e9),
        (format_bandwidth, parse_bandwidth, 2.9e12),
        (lambda v: format_bandwidth(v, bits=True), parse_bandwidth, 25e9),
        (lambda v: format_bandwidth(v, bits=True), parse_bandwidth, 100e9),
        (format_duration, parse_duration, 15e-6),
        (format_duration, parse_duration, 1800.0),
        (format_duration, parse_duration, 4 * 3600.0),
        (format_duration, parse_duration, 54 * DAY),
        (format_duration, parse_duration, 0.0),
        (format_rate, parse_rate, 0.0065 / DAY),
        (format_rate, parse_rate, 3 / DAY),
        (format_power, parse_power, 500.0),
        (format_power, parse_power, 1.2e3),
    ],
)
def test_round_trip_exact_values(fmt, parse, value: float) -> None:
    assert close(parse(fmt(value)), value, rel=1e-9)


_ROUND_TRIPS = [
    (format_bytes, parse_bytes),
    (lambda v: format_bytes(v, binary=False), parse_bytes),
    (format_bandwidth, parse_bandwidth),
    (lambda v: format_bandwidth(v, bits=True), parse_bandwidth),
    (format_duration, parse_duration),
    (format_rate, parse_rate),
    (format_power, parse_power),
]


@settings(max_examples=200, deadline=None)
@given(
    value=st.floats(min_value=1e-12, max_value=1e21, allow_nan=False, allow_infinity=False),
    which=st.integers(min_value=0, max_value=len(_ROUND_TRIPS) - 1),
)
def test_round_trip_keeps_four_significant_digits(value: float, which: int) -> None:
    fmt, parse = _ROUND_TRIPS[which]
    assert math.isclose(parse(fmt(value)), value, rel_tol=6e-4)


# ---------------------------------------------------------------------------------------------
# Properties: number + unit is number x factor, for every unit


_positive = st.floats(min_value=1e-9, max_value=1e9, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(x=_positive, unit=st.sampled_from(sorted(BYTE_UNITS)))
def test_every_byte_unit_scales(x: float, unit: str) -> None:
    assert math.isclose(parse_bytes(f"{x}{unit}"), x * BYTE_UNITS[unit], rel_tol=1e-12)


@settings(max_examples=300, deadline=None)
@given(x=_positive, unit=st.sampled_from(sorted(DURATION_UNITS)))
def test_every_duration_unit_scales(x: float, unit: str) -> None:
    assert math.isclose(parse_duration(f"{x}{unit}"), x * DURATION_UNITS[unit], rel_tol=1e-12)


@settings(max_examples=300, deadline=None)
@given(x=_positive, unit=st.sampled_from(sorted(BANDWIDTH_UNITS)))
def test_every_bandwidth_unit_scales(x: float, unit: str) -> None:
    assert math.isclose(
        parse_bandwidth(f"{x}{unit}"), x * BANDWIDTH_UNITS[unit], rel_tol=1e-12
    )


@settings(max_examples=100, deadline=None)
@given(x=_positive, unit=st.sampled_from(sorted(POWER_UNITS)))
def test_every_power_unit_scales(x: float, unit: str) -> None:
    assert math.isclose(parse_power(f"{x}{unit}"), x * POWER_UNITS[unit], rel_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(count=_positive, per=_positive, unit=st.sampled_from(sorted(DURATION_UNITS)))
def test_every_rate_is_count_over_time(count: float, per: float, unit: str) -> None:
    expected = count / (per * DURATION_UNITS[unit])
    assert math.isclose(parse_rate(f"{count}/{per}{unit}"), expected, rel_tol=1e-12)


@settings(max_examples=100, deadline=None)
@given(x=_positive)
def test_plain_number_strings_are_base_units(x: float) -> None:
    for parser in (parse_bytes, parse_bandwidth, parse_duration, parse_power):
        assert parser(repr(x)) == x
        assert parser(x) == x


def test_unit_tables_are_consistent() -> None:
    assert BYTE_UNITS["GiB"] == 2**30
    assert BYTE_UNITS["GB"] == 1e9
    assert BANDWIDTH_UNITS["GB/s"] == 1e9
    assert BANDWIDTH_UNITS["Gbps"] == 1e9 / 8
    assert DURATION_UNITS["y"] == 365 * DURATION_UNITS["d"]
    assert all(factor > 0 for table in (BYTE_UNITS, BANDWIDTH_UNITS, DURATION_UNITS,
                                        POWER_UNITS) for factor in table.values())
    assert set(units.__all__) >= {"UnitError", "parse_bytes", "format_bytes", "BYTE_UNITS"}
