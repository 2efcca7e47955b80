"""Two status-reporter processes for one node against a real kube-apiserver, a real
Redis and the devstack's containerd: only the holder of the "status-reporter" bus lease
talks to the apiserver, and when it is SIGKILLed the other takes over.

Each replica reaches the apiserver through a TCP proxy of its own that counts
connections, so "only one writes" is measured, not inferred: the standby opens no
connection at all. Both bind the same kubelet API and read-only ports (SO_REUSEPORT).
After the kill (with a run directory shared by both, as on one host, and with one each),
the standby leads (`klet_leader`), renews the node Lease and reports the
node status; the Node's Ready condition stays True throughout (polled, and its
lastTransitionTime unchanged), and an Event posted before the handover is not posted
again. Each leader announces its own start ("Starting"), as a restarted kubelet does;
no other Event is duplicated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import klet.status_reporter
import pytest
from klet.bus import Bus, NodeBus
from klet.devstack import DevStack, ManagedProcess, RedisServer, free_port
from klet.model.records import EventRecord, SourceState
from klet.model.types import JSON
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import eventually, kubectl_json
from tests.harness.node import sample_value


class CountingProxy:
    """A TCP relay to the apiserver that counts the connections it was asked for (TLS
    passes through untouched: the client still checks the apiserver's certificate)."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        assert parts.hostname is not None and parts.port is not None
        self.host, self.port = parts.hostname, parts.port
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[Any]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        writers = [writer]
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            writers.append(up_writer)

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                with contextlib.suppress(OSError, ConnectionError):
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()

            # Either side closing ends the connection (TLS has no use for half-closes).
            pipes = [
                asyncio.create_task(pipe(reader, up_writer)),
                asyncio.create_task(pipe(up_reader, writer)),
            ]
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pipes:
                    p.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            for w in writers:
                w.close()
            for w in writers:
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            self._relays.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._relays):
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


def proxied_kubeconfig(cp: ControlPlane, node: str, port: int, path: Path) -> Path:
    config = json.loads(cp.node_kubeconfig(node).read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.touch(mode=0o600)
    path.write_text(json.dumps(config))
    return path


def replica(
    base: Path,
    *,
    node: str,
    redis: RedisServer,
    kubeconfig: Path,
    runtime_endpoint: str,
    ports: dict[str, int],
    run_dir: Path,
) -> ManagedProcess:
    base.mkdir(parents=True, exist_ok=True)
    (base / "manifests").mkdir(exist_ok=True)
    argv = [
        sys.executable, "-m", "klet.status_reporter",
        *redis.service_flags(node, "status-reporter"),
        "--hostname-override", node,
        "--kubeconfig", str(kubeconfig),
        "--container-runtime-endpoint", runtime_endpoint,
        "--run-dir", str(run_dir),
        "--root-dir", str(base / "root"),
        "--pod-manifest-path", str(base / "manifests"),
        "--node-ip", "127.0.0.1",
        "--healthz-port", "0",
        "--v", "4",
    ]  # fmt: skip
    for flag, port in ports.items():
        argv += [f"--{flag.replace('_', '-')}", str(port)]
    src = str(Path(klet.status_reporter.__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = ManagedProcess(f"status-reporter-{base.name}", argv, dir=base, env=env)
    proc.start()
    return proc


def ready_condition(node: JSON) -> JSON:
    return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")


def stamp(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def leader_flag(port: int) -> float | None:
    async with httpx.AsyncClient(timeout=3) as http:
        page = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return sample_value(page, "klet_leader", service="status-reporter")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("run_dirs", ["shared", "separate"])
async def test_only_the_leader_writes_and_a_killed_leader_is_replaced_without_flapping(
    run_dirs: str,
    tmp_path: Path,
    redis_server: RedisServer,
    control_plane: ControlPlane,
    devstack: DevStack,
) -> None:
    # shared: the replicas share a run directory (one host's /run/klet, as under
    # compose), so the standby sees the leader's slot free the moment it dies
    # (klet.bus.leaderslot); separate: it waits for the lease TTL (15 s).
    cp = control_plane
    name = f"sr-rep-{uuid.uuid4().hex[:6]}"
    bus = Bus.from_url(redis_server.url, name, auth=redis_server.admin, timeout_s=2.0)
    node_bus = NodeBus.of(bus, service="status-reporter")
    for source in ("file", "api"):
        await node_bus.sources.put(source, SourceState(source=source, ready=True, at=time.time()))
    proxies = {r: CountingProxy(cp.server) for r in ("a", "b")}
    shared = {"port": free_port(), "read_only_port": free_port()}
    service_ports = {"a": free_port(), "b": free_port()}
    procs: dict[str, ManagedProcess] = {}
    ready_seen: list[str] = []
    watching = True

    def start(r: str, proxy_port: int) -> None:
        procs[r] = replica(
            tmp_path / r,
            node=name,
            redis=redis_server,
            kubeconfig=proxied_kubeconfig(cp, name, proxy_port, tmp_path / f"{r}.kubeconfig"),
            runtime_endpoint=devstack.runtime_endpoint,
            ports={**shared, "service_port": service_ports[r]},
            run_dir=tmp_path / ("run" if run_dirs == "shared" else f"{r}-run"),
        )

    async def watch_ready() -> None:
        while watching:
            obj = await kubectl_json(cp, "node", name)
            if obj is not None:
                ready_seen.append(ready_condition(obj)["status"])
            await asyncio.sleep(0.25)

    watcher: asyncio.Task[None] | None = None
    try:
        start("a", await proxies["a"].start())
        await eventually(
            lambda: _is(leader_flag(service_ports["a"]), 1.0), what="a leading", timeout_s=30
        )
        start("b", await proxies["b"].start())
        await eventually(
            lambda: _is(leader_flag(service_ports["b"]), 0.0), what="b standing by", timeout_s=30
        )

        async def ready_node() -> JSON | None:
            obj = await kubectl_json(cp, "node", name)
            return obj if obj and ready_condition(obj)["status"] == "True" else None

        node = await eventually(ready_node, what="the Node Ready", timeout_s=30)
        transition = ready_condition(node)["lastTransitionTime"]

        await node_bus.events.publish(
            EventRecord(
                type="Normal",
                reason="ReplicaTest",
                message="posted once",
                involved={"kind": "Node", "name": name, "uid": name},
                component="kubelet",
                at=time.time(),
            )
        )

        async def node_events() -> list[JSON]:
            listed = await kubectl_json(
                cp, "events", "-n", "default", f"--field-selector=involvedObject.name={name}"
            )
            return list((listed or {}).get("items") or [])

        await eventually(lambda: _has(node_events(), "ReplicaTest"), what="the Event", timeout_s=30)

        async def lease_renewed_after(t: float) -> JSON | None:
            obj = await kubectl_json(cp, "lease", "-n", "kube-node-lease", name)
            return obj if obj and stamp(obj["spec"]["renewTime"]) > t else None

        now = time.time()
        await eventually(lambda: lease_renewed_after(now), what="a renewal", timeout_s=30)
        # Everything so far came from a: b has not opened a single apiserver connection.
        assert proxies["a"].connections > 0
        assert proxies["b"].connections == 0

        watcher = asyncio.create_task(watch_ready())
        # Heartbeat times have whole seconds: b's first report may fall in the second of
        # the kill, so "reported since" means a heartbeat other than a's last one.
        last_heartbeat = ready_condition(await ready_node() or node).get("lastHeartbeatTime")
        killed_at = time.time()
        procs["a"].kill()
        await eventually(
            lambda: _is(leader_flag(service_ports["b"]), 1.0), what="b leading", timeout_s=40
        )
        # Shared: b saw the leader slot free the moment a died and took the lease as its
        # heir, without waiting out the TTL; separate: it could only wait for the TTL.
        took_over_by_slot = "the leader slot is free" in procs["b"].log_path.read_text(
            errors="replace"
        )
        assert took_over_by_slot == (run_dirs == "shared")
        await eventually(lambda: lease_renewed_after(killed_at), what="b renewing", timeout_s=30)

        async def reported_again() -> JSON | None:
            obj = await kubectl_json(cp, "node", name)
            heartbeat = obj and ready_condition(obj).get("lastHeartbeatTime")
            return obj if heartbeat and heartbeat != last_heartbeat else None

        node = await eventually(reported_again, what="b reporting node status", timeout_s=30)
        assert proxies["b"].connections > 0
        watching = False
        await watcher
        assert ready_seen and set(ready_seen) == {"True"}, ready_seen
        assert ready_condition(node)["lastTransitionTime"] == transition

        events = await node_events()
        by_key: dict[tuple[str, str], list[JSON]] = {}
        for e in events:
            by_key.setdefault((e["reason"], e["message"]), []).append(e)
        test_events = by_key[("ReplicaTest", "posted once")]
        assert len(test_events) == 1 and test_events[0]["count"] == 1, test_events
        duplicated = {k: len(v) for k, v in by_key.items() if len(v) > 1 and k[0] != "Starting"}
        assert duplicated == {}, duplicated
    finally:
        watching = False
        if watcher is not None:
            await asyncio.gather(watcher, return_exceptions=True)
        for proc in procs.values():
            proc.stop()
        for proxy in proxies.values():
            await proxy.close()
        await bus.close()
        await asyncio.to_thread(cp.kubectl, "delete", "node", name, "--wait=false")


async def _is(value: Awaitable[float | None], want: float) -> bool:
    return (await value) == want


async def _has(events: Awaitable[list[JSON]], reason: str) -> bool:
    return any(e.get("reason") == reason for e in await events)
