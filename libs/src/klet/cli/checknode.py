"""`klet check-node --node NAME`: exit 0 when the Node is Ready and its Lease is renewed.

The chart's `helm test` pod runs it on the klet node: that the pod runs there at all
proves the node runs pods; this adds what the apiserver says of the node. It reads the
Node and its Lease (kube-node-lease/<name>) through klet.kube with the kubeconfig given
(the test pod's ServiceAccount may only get those two objects) and checks:

- the Node's Ready condition is True;
- the Lease's renewTime is within its leaseDurationSeconds of now (the node controller's
  rule: an older renewal means the node stopped heartbeating, whatever Ready says).

It checks again every `--interval` until both hold or `--timeout` runs out (a freshly
rolled status-reporter takes a few seconds to renew), printing each new reason on the
way; it exits 1 with the last reasons, 2 on a usage error.

`node_problems` is the pure decision, table-tested; `check_node` is the I/O around it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from klet.kube import KubeClient, KubeError, KubeSettings, NotFound
from klet.model.types import JSON

LEASE_NAMESPACE = "kube-node-lease"


class Getter(Protocol):
    """The one apiserver call the check makes (KubeClient.get)."""

    async def get(self, path: str, **params: Any) -> Any: ...


def _parse_time(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time (Time or MicroTime, 'Z' or offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def node_problems(node: JSON | None, lease: JSON | None, *, now: float) -> list[str]:
    """Why the node does not count as up; empty when it is Ready with a live Lease."""
    problems: list[str] = []
    if node is None:
        problems.append("node not registered")
    else:
        ready = [
            c
            for c in (node.get("status") or {}).get("conditions") or []
            if c.get("type") == "Ready"
        ]
        if not ready:
            problems.append("node has no Ready condition")
        elif ready[0].get("status") != "True":
            c = ready[0]
            problems.append(
                f"node Ready={c.get('status')} ({c.get('reason', '')}: {c.get('message', '')})"
            )
    if lease is None:
        problems.append(f"no Lease in {LEASE_NAMESPACE}")
        return problems
    spec = lease.get("spec") or {}
    renew, duration = spec.get("renewTime"), spec.get("leaseDurationSeconds")
    if not isinstance(renew, str) or not isinstance(duration, int):
        problems.append(f"Lease without renewTime or leaseDurationSeconds: {spec}")
        return problems
    try:
        age = now - _parse_time(renew)
    except ValueError:
        problems.append(f"Lease renewTime unreadable: {renew!r}")
        return problems
    if age > duration:
        problems.append(f"Lease renewed {age:.0f}s ago, more than its {duration}s")
    return problems


async def _get(client: Getter, path: str) -> JSON | None:
    try:
        found: JSON = await client.get(path)
    except NotFound:
        return None
    return found


async def check_node(
    client: Getter, node: str, *, timeout_s: float, interval_s: float
) -> list[str]:
    """The problems of the last check: empty once the node is up, within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    said: list[str] = []
    while True:
        try:
            problems = node_problems(
                await _get(client, f"/api/v1/nodes/{node}"),
                await _get(
                    client,
                    f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node}",
                ),
                now=time.time(),
            )
        except KubeError as err:
            problems = [f"apiserver: {err}"]
        if not problems or time.monotonic() >= deadline:
            return problems
        if problems != said:
            print(f"{node}: {'; '.join(problems)} (checking again)", file=sys.stderr)
            said = problems
        await asyncio.sleep(interval_s)


async def _run(args: argparse.Namespace) -> int:
    client = KubeClient(KubeSettings(kubeconfig=args.kubeconfig, user_agent="klet-check-node"))
    try:
        problems = await check_node(
            client, args.node, timeout_s=args.timeout, interval_s=args.interval
        )
    finally:
        await client.close()
    where = os.environ.get("POD_NODE_NAME")
    suffix = f"; this check ran on node {where}" if where else ""
    if problems:
        print(f"{args.node}: NOT up: {'; '.join(problems)}{suffix}", file=sys.stderr)
        return 1
    print(f"{args.node}: Ready, Lease renewed{suffix}")
    return 0


def check_node_cli(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="klet check-node",
        description="Exit 0 when the Node is Ready and its Lease renewed within its duration.",
    )
    parser.add_argument("--node", required=True, help="the Node's name")
    parser.add_argument("--kubeconfig", required=True, type=Path, help="kubeconfig to read with")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to keep checking (default 60)"
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between checks (default 2)"
    )
    args = parser.parse_args(list(argv))
    if not args.kubeconfig.is_file():
        print(f"klet check-node: --kubeconfig: no file {args.kubeconfig}", file=sys.stderr)
        return 2
    return asyncio.run(_run(args))
