"""pod-source's apiserver source against a real kube-apiserver and a real Redis, the
service run in-process (`app.main(deps)` as a task, production wiring) with
`--kubeconfig` set to the node's own client certificate (Node authorizer).

Covers: a pod bound to this node by an admin appears in the `desired` table as source
`api` under the apiserver's UID and name, with an ADD on the `pods` stream, and marks
the api source ready; pods bound to another node and mirror pods do not appear;
`kubectl delete --wait=false` gives a DELETE carrying deletionTimestamp and the grace
period, and force-deleting the object a REMOVE; with the apiserver stopped for a few
seconds the desired set stays (errors counted), and changes made after it returns
arrive. Watches are asked for 3-6 s, so the rewatch after a server-side timeout runs
in every test.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from klet.bus import Bus, NodeBus
from klet.config import load_settings
from klet.devstack import RedisServer, free_port
from klet.model.records import DesiredPod, PodChange
from klet.pod_source import app
from klet.pod_source.publisher import RetryPolicy
from klet.pod_source.wiring import Deps, Overrides, build_deps
from klet.testbed.cluster import ControlPlane
from prometheus_client import CollectorRegistry

T = TypeVar("T")
WATCH_TIMEOUT_S = 3
WATCH_THREAD = "watch /api/v1/pods"


@dataclass
class Service:
    deps: Deps
    task: asyncio.Task[int]

    def metric(self, name: str, **labels: str) -> float:
        return self.deps.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def node() -> str:
    """A node name of this test's own, so tests sharing the apiserver never see each
    other's pods."""
    return f"api-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def bus(redis_server: RedisServer, node: str) -> AsyncIterator[NodeBus]:
    b = Bus.from_url(redis_server.url, node, auth=redis_server.admin, timeout_s=2.0)
    try:
        yield NodeBus.of(b, service="pod-source")
    finally:
        await b.close()


@asynccontextmanager
async def running(
    tmp: Path, redis: RedisServer, *, node: str, kubeconfig: Path
) -> AsyncIterator[Service]:
    """pod-source for `node` with only the api source, short back-offs and watches."""
    argv = [
        *redis.service_flags(node, "pod-source"),
        "--hostname-override", node,
        "--run-dir", str(tmp / "run"),
        "--service-port", str(free_port()),
        "--kubeconfig", str(kubeconfig),
    ]  # fmt: skip
    settings = load_settings(argv, env={}, service="pod-source")
    deps = build_deps(
        settings,
        Overrides(
            registry=CollectorRegistry(),
            retry=RetryPolicy(initial_s=0.1, max_s=0.5),
            api_retry=RetryPolicy(initial_s=0.2, max_s=1.0),
            api_watch_timeout_s=WATCH_TIMEOUT_S,
            lease_ttl_s=3.0,
            lease_holder="replica-a",
        ),
    )
    task = asyncio.create_task(app.main(deps, handle_signals=False), name=f"pod-source-{node}")
    try:
        yield Service(deps, task)
    finally:
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=20)
        assert done, "pod-source did not stop when cancelled"
        await asyncio.gather(task, return_exceptions=True)
        await _watch_threads_ended()


async def _watch_threads_ended() -> None:
    """Wait (while the event loop still runs) for the client's watch threads to end.

    klet.kube runs each watch in a thread that notices it was stopped only when the
    stream yields or ends; it then posts to the loop it came from. The short watch
    timeout bounds the wait.
    """
    deadline = asyncio.get_running_loop().time() + 3 * WATCH_TIMEOUT_S + 10
    while any(t.name == WATCH_THREAD and t.is_alive() for t in threading.enumerate()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("a watch thread outlived pod-source")
        await asyncio.sleep(0.2)


async def eventually(check: Callable[[], Awaitable[T]], *, what: str, timeout_s: float = 30.0) -> T:
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: Any = None
    while True:
        try:
            result = await check()
            if result:
                return result
            last = result
        except Exception as err:  # noqa: BLE001 - not there yet; remember why
            last = err
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
        await asyncio.sleep(0.1)


async def kubectl(cp: ControlPlane, *args: str, input: str | None = None) -> str:
    """Run kubectl as admin off the event loop (pod-source runs on it); stdout."""
    res = await asyncio.to_thread(cp.kubectl, *args, input=input)
    assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
    return res.stdout


async def create_pod(cp: ControlPlane, name: str, node: str, **annotations: str) -> str:
    """A pod bound to `node` in `default`; returns the UID the apiserver gave it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.klet.test/busybox:1.36"}],
        },
    }
    out = await kubectl(cp, "create", "-o", "json", "-f", "-", input=json.dumps(pod))
    return str(json.loads(out)["metadata"]["uid"])


async def force_delete(cp: ControlPlane, *names: str) -> None:
    await kubectl(
        cp, "delete", "pod", "-n", "default", "--grace-period=0", "--force",
        "--ignore-not-found", *names,
    )  # fmt: skip


async def desired(nb: NodeBus) -> dict[str, DesiredPod]:
    return await nb.desired.all()


async def changes(nb: NodeBus) -> list[tuple[str, str]]:
    raw = await nb.bus.client.xrange(nb.pods.key)
    entries = cast(list[tuple[str, dict[str, str]]], raw)  # decode_responses=True
    return [(c.op, c.uid) for c in (PodChange.decode(f["r"]) for _, f in entries)]


async def api_ready(nb: NodeBus) -> bool:
    state = await nb.sources.get("api")
    return state is not None and state.ready


async def test_this_nodes_pods_are_desired(
    tmp_path: Path,
    control_plane: ControlPlane,
    redis_server: RedisServer,
    bus: NodeBus,
    node: str,
) -> None:
    ours = f"{node}-web"
    other = f"{node}-other"
    mirror = f"{node}-static-{node}"
    kubeconfig = control_plane.node_kubeconfig(node)
    try:
        async with running(tmp_path, redis_server, node=node, kubeconfig=kubeconfig) as svc:
            await eventually(lambda: api_ready(bus), what="the api source to be ready")
            assert await desired(bus) == {}

            uid = await create_pod(control_plane, ours, node)
            await create_pod(control_plane, other, f"{node}-elsewhere")
            await create_pod(control_plane, mirror, node, **{"kubernetes.io/config.mirror": "x"})

            table = await eventually(lambda: desired(bus), what="the pod in the desired table")
            assert set(table) == {uid}
            record = table[uid]
            assert record.source == "api"
            meta = record.pod["metadata"]
            assert (meta["name"], meta["namespace"], meta["uid"]) == (ours, "default", uid)
            assert meta["annotations"]["kubernetes.io/config.source"] == "api"
            assert "kubernetes.io/config.seen" in meta["annotations"]
            assert record.pod["spec"]["nodeName"] == node
            assert await changes(bus) == [("ADD", uid)]

            # Outlive two server-side watch timeouts: nothing is lost or repeated.
            watches = svc.metric("klet_pod_source_api_watches_total")

            async def two_more_watches() -> bool:
                return svc.metric("klet_pod_source_api_watches_total") >= watches + 2

            await eventually(two_more_watches, what="two watches timed out by the server")
            assert set(await desired(bus)) == {uid}
            assert await changes(bus) == [("ADD", uid)]
            assert svc.metric("klet_pod_source_api_relists_total") == 0
    finally:
        await force_delete(control_plane, ours, other, mirror)


async def test_graceful_then_forced_deletion(
    tmp_path: Path,
    control_plane: ControlPlane,
    redis_server: RedisServer,
    bus: NodeBus,
    node: str,
) -> None:
    name = f"{node}-web"
    kubeconfig = control_plane.node_kubeconfig(node)
    try:
        async with running(tmp_path, redis_server, node=node, kubeconfig=kubeconfig):
            uid = await create_pod(control_plane, name, node)
            await eventually(lambda: desired(bus), what="the pod in the desired table")

            await kubectl(control_plane, "delete", "pod", "-n", "default", name, "--wait=false")

            async def being_deleted() -> dict[str, Any] | None:
                rec = (await desired(bus)).get(uid)
                meta: dict[str, Any] = rec.pod["metadata"] if rec else {}
                return meta if meta.get("deletionTimestamp") else None

            meta = await eventually(being_deleted, what="the deletionTimestamp in the table")
            assert meta["deletionGracePeriodSeconds"] == 30  # the spec's default grace
            assert await changes(bus) == [("ADD", uid), ("DELETE", uid)]

            await force_delete(control_plane, name)

            async def removed() -> bool:
                return uid not in await desired(bus)

            await eventually(removed, what="the force-deleted pod to leave the table")
            assert (await changes(bus))[-1] == ("REMOVE", uid)
            assert await api_ready(bus)
    finally:
        await force_delete(control_plane, name)


async def test_apiserver_outage_keeps_the_desired_set(
    tmp_path: Path,
    control_plane: ControlPlane,
    redis_server: RedisServer,
    bus: NodeBus,
    node: str,
) -> None:
    first, second = f"{node}-first", f"{node}-second"
    kubeconfig = control_plane.node_kubeconfig(node)
    try:
        async with running(tmp_path, redis_server, node=node, kubeconfig=kubeconfig) as svc:
            uid1 = await create_pod(control_plane, first, node)
            await eventually(lambda: desired(bus), what="the first pod in the desired table")

            await asyncio.to_thread(control_plane.stop_apiserver)
            try:

                async def failing() -> bool:
                    return (
                        svc.metric("klet_pod_source_api_watch_errors_total", reason="unavailable")
                        > 0
                    )

                await eventually(failing, what="the source to notice the outage")

                async def failed_three_times() -> bool:
                    return (
                        svc.metric("klet_pod_source_api_watch_errors_total", reason="unavailable")
                        >= 3
                    )

                # Two retries (after 0.2 s and 0.4 s of back-off here) fail as well.
                await eventually(failed_three_times, what="three failed attempts")
                assert set(await desired(bus)) == {uid1}
                assert await api_ready(bus)
                assert svc.task.done() is False
            finally:
                await asyncio.to_thread(control_plane.start_apiserver)

            uid2 = await create_pod(control_plane, second, node)
            await force_delete(control_plane, first)

            async def caught_up() -> bool:
                return set(await desired(bus)) == {uid2}

            await eventually(caught_up, what="the changes made after the outage")
            ops = await changes(bus)
            assert ops[0] == ("ADD", uid1)
            # A forced deletion sets deletionTimestamp (grace 0) before the object goes,
            # so a DELETE may come first; whichever arrived, REMOVE is the last word.
            assert ("ADD", uid2) in ops
            assert [op for op, uid in ops if uid == uid1][-1] == "REMOVE"
            assert {op for op, uid in ops[1:] if uid == uid1} <= {"DELETE", "REMOVE"}
    finally:
        if not control_plane.apiserver_running:
            await asyncio.to_thread(control_plane.start_apiserver)
        await force_delete(control_plane, first, second)
