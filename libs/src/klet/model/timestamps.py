"""Time as the Kubernetes API spells it: RFC 3339 in UTC, at the three precisions the
API uses.

- `rfc3339`: metav1.Time (whole seconds), the precision of status times, Events and
  Node conditions;
- `rfc3339_nano`: Go's RFC3339Nano, fraction with trailing zeros trimmed (to
  microseconds, all a float timestamp holds), as the `kubernetes.io/config.seen`
  annotation is written;
- `micro_time`: metav1.MicroTime, exactly six fractional digits (Lease renewTime).

Every function takes seconds since the epoch.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_nano(ts: float) -> str:
    text = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return text + "Z"


def micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
