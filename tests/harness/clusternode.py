"""A KletNode joined to the cluster harness's real control plane, for cluster tests.

The node gets a client certificate of its own (`system:node:<name>`), a serving
certificate for its 10250 API signed by the cluster CA, and the 127.0.0.1 node IP. On
exit it is stopped, its pods are removed from CRI (static ones by name, the apiserver's
by the UIDs of the pods bound to it) and from the apiserver, and the Node object is
deleted, so the next module starts clean.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
from klet.devstack import DevStack
from klet.model.types import JSON
from klet.testbed.cluster import ControlPlane

from tests.harness.node import KletNode
from tests.harness.waiting import wait_for
from tests.integration.conftest import remove_node_pods

T = TypeVar("T")


async def kubectl_json(cp: ControlPlane, *args: str) -> JSON | None:
    """`kubectl get <args> -o json` as admin, parsed; None when kubectl fails (not found)."""
    res = await asyncio.to_thread(cp.kubectl, "get", *args, "-o", "json")
    if res.returncode != 0:
        return None
    out: JSON = json.loads(res.stdout)
    return out


async def eventually(check: Callable[[], Awaitable[T | None]], *, what: str, timeout_s: float) -> T:
    """Await `check` every 0.25 s until it returns something truthy; an error counts as
    "not yet" (an object not written yet, a replica not answering); fail naming `what`
    and the last value or error."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: Any = None
    while True:
        try:
            result = await check()
            if result:
                return result
            last = result
        except (AssertionError, httpx.HTTPError, OSError, KeyError, TypeError, ValueError) as err:
            last = err
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(0.25)


def wait_node_ready(cp: ControlPlane, name: str, *, timeout_s: float = 60) -> None:
    """Wait until the Node `name` reports Ready=True (admin's view, through kubectl)."""

    def ready() -> bool:
        r = cp.kubectl("get", "node", name, "-o", "json")
        if r.returncode != 0:
            return False
        conditions = json.loads(r.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(ready, timeout_s=timeout_s, what=f"node {name} Ready")


@contextmanager
def cluster_node(
    control_plane: ControlPlane,
    devstack: DevStack,
    base: Path,
    *,
    name: str,
    extra_flags: list[str] | None = None,
    node_flags: list[str] | None = None,
) -> Iterator[KletNode]:
    """A started node `name` under `base`; its static-pod directory is `node.manifests`.
    `node_flags` replace the control plane's (`ControlPlane.node_flags`: a kubeconfig
    with the node's certificate, a serving certificate, the client CA)."""
    manifests = base / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    node = KletNode(
        devstack,
        base,
        node_name=name,
        manifest_dir=manifests,
        extra_flags=[
            *(control_plane.node_flags(name) if node_flags is None else node_flags),
            *(extra_flags or []),
        ],
    )
    node.manifests = manifests  # type: ignore[attr-defined]
    node.start()
    try:
        yield node
    finally:
        node.stop()
        bound = control_plane.kubectl(
            "get",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={name}",
            "-o",
            "jsonpath={.items[*].metadata.uid}",
        )
        asyncio.run(
            remove_node_pods(devstack.runtime_endpoint, name, uids=set(bound.stdout.split()))
        )
        node.release_mounts()
        control_plane.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={name}",
            "--grace-period=0",
            "--force",
            "--ignore-not-found",
        )
        control_plane.kubectl("delete", "node", name, "--ignore-not-found")
