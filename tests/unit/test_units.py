"""Go duration and Kubernetes quantity parsing (klet.model.units).

Covers: Go duration syntax (compound units, fractions, signs, "0", the micro sign), the
errors for malformed durations, Go's canonical Duration.String() spelling, Kubernetes
quantities with binary/decimal suffixes and exponents (exact Decimal results, rounding
up to integers), and percentages.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from klet.model.units import (
    format_duration,
    parse_duration,
    parse_percentage,
    parse_quantity,
    parse_quantity_int,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("0s", 0.0),
        ("20s", 20.0),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("1h0m0s", 3600.0),
        ("100ms", 0.1),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("250us", 0.00025),
        ("250\u00b5s", 0.00025),
        ("250\u03bcs", 0.00025),
        ("10ns", 1e-8),
        ("-1.5h", -5400.0),
        ("+3s", 3.0),
        ("1h30m15s500ms", 5415.5),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'invalid duration ""'),
        ("abc", 'invalid duration "abc"'),
        ("5", 'invalid duration "5": missing unit'),
        ("5x", 'invalid duration "5x": unknown unit "x"'),
        ("1d", 'invalid duration "1d": unknown unit "d"'),
        ("s", 'invalid duration "s"'),
        ("1m 30s", 'invalid duration "1m 30s"'),
        ("-", 'invalid duration "-"'),
        ("3000000h", 'invalid duration "3000000h": out of range'),
    ],
)
def test_parse_duration_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (20.0, "20s"),
        (60.0, "1m0s"),
        (90.0, "1m30s"),
        (7200.0, "2h0m0s"),
        (0.1, "100ms"),
        (0.0015, "1.5ms"),
        (0.00025, "250\u00b5s"),
        (1e-8, "10ns"),
        (1.5, "1.5s"),
        (3661.25, "1h1m1.25s"),
        (-90.0, "-1m30s"),
    ],
)
def test_format_duration_matches_go(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["1m30s", "100ms", "2h0m0s", "1.5s", "0s", "4h0m0s"])
def test_duration_round_trip(text: str) -> None:
    assert format_duration(parse_duration(text)) == text


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Decimal(0)),
        ("100Mi", Decimal(100 * 2**20)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("1Ki", Decimal(1024)),
        ("1Ei", Decimal(2**60)),
        ("500m", Decimal("0.5")),
        ("100n", Decimal("1E-7")),
        ("2u", Decimal("0.000002")),
        ("2k", Decimal(2000)),
        ("1M", Decimal(10**6)),
        ("3G", Decimal(3 * 10**9)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("1E", Decimal(10**18)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("2.5e-3", Decimal("0.0025")),
        ("+10", Decimal(10)),
        ("-1Gi", Decimal(-(2**30))),
        (".5", Decimal("0.5")),
        ("0.1", Decimal("0.1")),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "10Zz", "10%", "Mi", "1.2.3", " 1", "1 Mi", "1e", "1mi", "0x10"]
)
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=f'^invalid quantity "{text}"$'):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "value"), [("1.5k", 1500), ("1m", 1), ("100Mi", 104857600), ("0", 0), ("0.4", 1)]
)
def test_parse_quantity_int_rounds_up(text: str, value: int) -> None:
    assert parse_quantity_int(text) == value


@pytest.mark.parametrize(("text", "value"), [("10%", 10.0), ("7.5%", 7.5), ("0%", 0.0)])
def test_parse_percentage(text: str, value: float) -> None:
    assert parse_percentage(text) == value


@pytest.mark.parametrize("text", ["10", "%", "abc%", "nan%"])
def test_parse_percentage_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid percentage"):
        parse_percentage(text)
