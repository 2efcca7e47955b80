"""How cluster tests wait for their Node, make a pod, and read an API pod and its Events
through the real kubectl.

`node_registered` (waits until the Node exists), `sleeper_pod` (a pod of one busybox
container sleeping an hour: an API object or, dumped, a static manifest), `get_pod` (None
while it is not there), `in_phase` (the pod once its phase is the one asked for, for
`wait_for`) and `events` (the Events of an object with a given reason, in namespace
default). Helpers only; the tests live in tests/cluster.
"""

from __future__ import annotations

import json
from typing import Any

from klet.testbed.cluster import ControlPlane

from tests.harness.waiting import wait_for

BUSYBOX = "registry.klet.test/busybox:1.36"


def node_registered(cp: ControlPlane, node: str, *, timeout_s: float = 60) -> None:
    """Wait until the Node `node` exists in the apiserver."""
    wait_for(
        lambda: cp.kubectl("get", "node", node).returncode == 0,
        timeout_s=timeout_s,
        what="the Node registered",
    )


def sleeper_pod(
    name: str, *, node: str | None = None, container: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """A Pod in namespace default of one container `main` running `sleep 3600` in busybox;
    `node` binds it (spec.nodeName), `container` adds fields to its container, `spec`
    to its spec."""
    main: dict[str, Any] = {"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"]}
    pod_spec: dict[str, Any] = {**({"nodeName": node} if node else {}), **spec}
    pod_spec["containers"] = [{**main, **(container or {})}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": pod_spec,
    }


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
