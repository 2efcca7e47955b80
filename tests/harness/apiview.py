"""How cluster tests read an API pod and its Events through the real kubectl.

`get_pod` (None while it is not there), `in_phase` (the pod once its phase is the one
asked for, for `wait_for`) and `events` (the Events of an object with a given reason,
in namespace default). Helpers only; the tests live in tests/cluster.
"""

from __future__ import annotations

import json
from typing import Any

from klet.testbed.cluster import ControlPlane


def get_pod(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    res = cp.kubectl("get", "pod", name, "-o", "json")
    return json.loads(res.stdout) if res.returncode == 0 else None


def in_phase(cp: ControlPlane, name: str, phase: str) -> dict[str, Any] | None:
    p = get_pod(cp, name)
    return p if p and p["status"].get("phase") == phase else None


def events(cp: ControlPlane, name: str, reason: str) -> list[dict[str, Any]]:
    res = cp.kubectl(
        "get",
        "events",
        "-n",
        "default",
        f"--field-selector=involvedObject.name={name},reason={reason}",
        "-o",
        "json",
    )
    return list(json.loads(res.stdout or "{}").get("items", []))
