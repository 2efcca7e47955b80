"""API timestamps (klet.model.timestamps): whole seconds for metav1.Time, trimmed
fractions for RFC3339Nano, six digits for metav1.MicroTime, always UTC."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from klet.model.timestamps import micro_time, rfc3339, rfc3339_nano

T0 = 1_700_000_000.0


@pytest.mark.parametrize(
    ("fmt", "ts", "want"),
    [
        (rfc3339, T0, "2023-11-14T22:13:20Z"),
        (rfc3339, T0 + 0.999, "2023-11-14T22:13:20Z"),
        (rfc3339, 0.0, "1970-01-01T00:00:00Z"),
        (rfc3339_nano, T0, "2023-11-14T22:13:20Z"),
        (rfc3339_nano, T0 + 0.5, "2023-11-14T22:13:20.5Z"),
        (rfc3339_nano, 1.25, "1970-01-01T00:00:01.25Z"),
        (micro_time, 1.5, "1970-01-01T00:00:01.500000Z"),
        (micro_time, T0, "2023-11-14T22:13:20.000000Z"),
    ],
)
def test_formats(fmt: Callable[[float], str], ts: float, want: str) -> None:
    assert fmt(ts) == want
