"""Go durations and Kubernetes quantities, the two value syntaxes of kubelet configuration.

Pure, and read by the settings tree (klet.config) and the pod and node models alike, so
it lives in klet.model, the floor config stands on: from config it made model import
config while config imports model.

The upstream file format writes durations as Go `time.Duration` strings ("1m30s",
"100ms") and resource amounts as `resource.Quantity` strings ("100Mi", "500m", "1e3").
klet keeps durations as float seconds (what asyncio and time.monotonic speak) and
quantities as `Decimal` (exact: "0.1" CPU must not become 0.10000000000000001).

Trade-offs: durations are converted through integer nanoseconds, like Go, so
`format_duration(parse_duration(s))` gives Go's canonical spelling ("90s" -> "1m30s")
and values round to the nanosecond. Percentages ("10%") are not quantities; eviction
thresholds accept either, and callers use `parse_percentage` for that form.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

__all__ = [
    "format_duration",
    "parse_duration",
    "parse_percentage",
    "parse_quantity",
    "parse_quantity_int",
]

_NS_PER_UNIT: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN, as Go accepts and prints
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU, also accepted by Go
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_MAX_NS = 2**63 - 1  # Go's time.Duration is an int64 count of nanoseconds
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)([a-z\u00b5\u03bc]*)")


def parse_duration(text: str) -> float:
    """Parse a Go duration string ("1m30s", "100ms", "2h", "-1.5s", "0") to seconds.

    Raises ValueError naming the text when it is empty, lacks a unit, has an unknown
    unit or overflows Go's int64 nanoseconds.
    """
    if not isinstance(text, str):
        raise ValueError(f'invalid duration {text!r}: must be a string like "1m30s"')
    rest = text
    sign = 1
    if rest[:1] in ("+", "-"):
        sign = -1 if rest[0] == "-" else 1
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f'invalid duration "{text}"')
    total = Decimal(0)
    pos = 0
    while pos < len(rest):
        match = _DURATION_PART.match(rest, pos)
        if match is None:
            raise ValueError(f'invalid duration "{text}"')
        number, unit = match.groups()
        if not unit:
            raise ValueError(f'invalid duration "{text}": missing unit (for example "{text}s")')
        if unit not in _NS_PER_UNIT:
            raise ValueError(f'invalid duration "{text}": unknown unit "{unit}"')
        total += Decimal(number) * _NS_PER_UNIT[unit]
        pos = match.end()
    nanos = int(total)  # Go truncates fractional nanoseconds
    if nanos > _MAX_NS:
        raise ValueError(f'invalid duration "{text}": out of range')
    return sign * nanos / 1e9


def _trim(whole: int, frac: int, digits: int) -> str:
    if frac == 0:
        return str(whole)
    return f"{whole}.{frac:0{digits}d}".rstrip("0")


def format_duration(seconds: float) -> str:
    """Format seconds the way Go's Duration.String() does ("1m30s", "100ms", "0s")."""
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"cannot format duration {seconds!r}")
    nanos = round(seconds * 1e9)
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    if nanos < 1_000:
        return f"{sign}{nanos}ns"
    if nanos < 1_000_000:
        return f"{sign}{_trim(nanos // 1_000, nanos % 1_000, 3)}\u00b5s"
    if nanos < 1_000_000_000:
        return f"{sign}{_trim(nanos // 1_000_000, nanos % 1_000_000, 6)}ms"
    hours, nanos = divmod(nanos, 3600 * 1_000_000_000)
    minutes, nanos = divmod(nanos, 60 * 1_000_000_000)
    secs = _trim(nanos // 1_000_000_000, nanos % 1_000_000_000, 9) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}"
    if minutes:
        return f"{sign}{minutes}m{secs}"
    return f"{sign}{secs}"


_BINARY_SUFFIXES: dict[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL_EXPONENTS: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_QUANTITY = re.compile(r"([+-]?)(\d+\.?\d*|\.\d+)(.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE]([+-]?\d+)")


def parse_quantity(text: str) -> Decimal:
    """Parse a Kubernetes quantity ("100Mi", "1.5Gi", "500m", "1e3", "2k") exactly.

    Percentages are not quantities: "10%" raises ValueError (see parse_percentage).
    """
    if not isinstance(text, str):
        raise ValueError(f"invalid quantity {text!r}: must be a string")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f'invalid quantity "{text}"')
    sign, number, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
        raise ValueError(f'invalid quantity "{text}"') from exc
    if suffix in _BINARY_SUFFIXES:
        value *= _BINARY_SUFFIXES[suffix]
    elif suffix in _DECIMAL_EXPONENTS:
        value = value.scaleb(_DECIMAL_EXPONENTS[suffix])
    elif (exp := _EXPONENT.fullmatch(suffix)) is not None:
        value = value.scaleb(int(exp.group(1)))
    else:
        raise ValueError(f'invalid quantity "{text}"')
    return -value if sign == "-" else value


def parse_quantity_int(text: str) -> int:
    """A quantity as an integer, rounded up like Quantity.Value() ("1.5k" -> 1500, "1m" -> 1)."""
    return math.ceil(parse_quantity(text))


def parse_percentage(text: str) -> float:
    """Parse "10%" or "7.5%" to 10.0 / 7.5; the range check is the caller's."""
    if not isinstance(text, str) or not text.endswith("%"):
        raise ValueError(f'invalid percentage "{text}"')
    try:
        value = float(text[:-1])
    except ValueError as exc:
        raise ValueError(f'invalid percentage "{text}"') from exc
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f'invalid percentage "{text}"')
    return value
