"""The status-reporter service as a real process against a real Redis, over real HTTP.

Covers, in standalone mode: pods written to the bus the way pod-source and syncloop
write them show up on the read-only `/pods` with their computed status; a newer status
version replaces an older one and an older one does not; malformed `podstatus` entries
are skipped and do not stop the good entry after them (the stream is read without a
consumer group); `/healthz` answers on the healthz port (`ping`) and on the read-only
port with the kubelet API's checks, both recorded on its /metrics/slis, and the private
port serves /readyz and /metrics; the read-only port is off unless configured; with
Redis stopped `/pods` keeps serving the last view, and after Redis comes back empty and
the tables are written again the view follows them; SIGTERM stops the process cleanly.
Two replicas share the read-only and healthz ports (SO_REUSEPORT), both serve every
pod, exactly one holds the lease (`klet_leader`), and after one is SIGKILLed every new
connection is answered by the other.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import klet.status_reporter
from klet.bus import Bus, NodeBus
from klet.devstack import DevStack, ManagedProcess, RedisServer, free_port
from klet.model.records import PodStatusChange, PodStatusRecord
from klet.model.types import JSON
from klet.testbed.fakes.status_reporter import desired_record, make_pod, status_record
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.node import sample_value

pytest_plugins = ["tests.harness.fixtures"]

NODE = "node1"
T = TypeVar("T")


def _service_env() -> dict[str, str]:
    # The child must import this checkout's package even where the environment's
    # editable install predates it.
    src = str(Path(klet.status_reporter.__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


@contextmanager
def service(
    dir: Path, redis: RedisServer, *, extra: tuple[str, ...] = (), **ports: int
) -> Iterator[ManagedProcess]:
    """Run `python -m klet.status_reporter`; ports by flag name without dashes, then
    `extra` flags."""
    argv = [
        sys.executable, "-m", "klet.status_reporter",
        *redis.service_flags(NODE, "status-reporter"),
        "--hostname-override", NODE,
        "--run-dir", str(dir / "run"),
        "--root-dir", str(dir / "root"),
        "--v", "4",
        *extra,
    ]  # fmt: skip
    for flag, port in ports.items():
        argv += [f"--{flag.replace('_', '-')}", str(port)]
    proc = ManagedProcess("status-reporter", argv, dir=dir, env=_service_env())
    proc.start()
    try:
        yield proc
    finally:
        code = proc.stop()
        # None: the test killed it already.
        assert code in (0, None), f"status-reporter exited {code}; see {proc.log_path}"


async def eventually(
    probe: Callable[[], Awaitable[T]],
    accept: Callable[[T], bool],
    *,
    what: str,
    timeout_s: float = 20.0,
) -> T:
    """Poll `probe` until `accept` holds; errors count as "not yet"."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: object = None
    while True:
        try:
            last = value = await probe()
            if accept(value):
                return value
        except (httpx.HTTPError, OSError) as err:
            last = err
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last seen: {last!r}")
        await asyncio.sleep(0.1)


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@asynccontextmanager
async def node_bus(redis: RedisServer) -> AsyncIterator[NodeBus]:
    """The test's own view of the node's bus (as the admin: it plays pod-source and
    syncloop)."""
    bus = Bus.from_url(redis.url, NODE, auth=redis.admin)
    try:
        yield NodeBus.of(bus, service="status-reporter")
    finally:
        await bus.close()


async def write_pod(node: NodeBus, pod: JSON) -> None:
    """What pod-source does for a pod (the `pods` stream is not read by this service)."""
    record = desired_record(pod)
    await node.desired.put(record.uid, record)


async def report(node: NodeBus, record: PodStatusRecord) -> None:
    """What syncloop does when a pod's status changes: table, then the wake-up."""
    async with node.bus.transaction() as tx:
        tx.put(node.status, record.uid, record)
        tx.publish(node.podstatus, PodStatusChange(uid=record.uid, version=record.version))


def phases(body: Any) -> dict[str, Any]:
    return {i["metadata"]["name"]: i["status"] for i in body["items"]}


def healthchecks(page: str, check: str, status: str) -> float:
    """kubernetes_healthchecks_total of `check` with `status` on a /metrics/slis page."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == "kubernetes_healthchecks_total"
        and sample.labels.get("name") == check
        and sample.labels.get("status") == status
    )


async def test_serves_the_pod_view_and_survives_redis_outages(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    ro, hz, svc = free_port(), free_port(), free_port()
    web, db = make_pod("web"), make_pod("db", namespace="prod")
    with service(
        tmp_path / "sr", redis_server, read_only_port=ro, healthz_port=hz, service_port=svc
    ) as proc:
        async with httpx.AsyncClient(timeout=5) as http, node_bus(redis_server) as node:

            async def pods() -> dict[str, Any]:
                resp = await http.get(f"http://127.0.0.1:{ro}/pods")
                resp.raise_for_status()
                body: dict[str, Any] = resp.json()
                return body

            hz_resp = await eventually(
                lambda: http.get(f"http://127.0.0.1:{hz}/healthz"),
                lambda r: r.status_code == 200,
                what="/healthz on the healthz port",
            )
            assert hz_resp.text == "ok", proc.log_path
            await eventually(
                lambda: http.get(f"http://127.0.0.1:{svc}/readyz"),
                lambda r: r.status_code == 200,
                what="/readyz on the service port",
            )

            # The read-only port runs the kubelet API's checks: no syncloop runs here, so
            # its /healthz fails on `syncloop` alone; 10248 runs `ping` alone. Both
            # listeners record in the read-only port's /metrics/slis.
            ping = await eventually(
                lambda: http.get(f"http://127.0.0.1:{ro}/healthz/ping"),
                lambda r: r.status_code == 200,
                what="/healthz/ping on the read-only port",
            )
            assert ping.text == "ok"
            ro_health = await http.get(f"http://127.0.0.1:{ro}/healthz", params={"verbose": ""})
            assert ro_health.status_code == 500, ro_health.text
            assert ro_health.text == (
                "[+]ping ok\n[+]log ok\n[-]syncloop failed: reason withheld\nhealthz check failed\n"
            )
            slis = (await http.get(f"http://127.0.0.1:{ro}/metrics/slis")).text
            assert healthchecks(slis, "syncloop", "error") == 1.0, slis
            pings = healthchecks(slis, "ping", "success")
            assert pings >= 2.0, slis  # 10248's and the read-only port's
            assert (await http.get(f"http://127.0.0.1:{hz}/healthz")).text == "ok"
            slis = (await http.get(f"http://127.0.0.1:{ro}/metrics/slis")).text
            assert healthchecks(slis, "ping", "success") == pings + 1

            # A desired pod before syncloop reported on it, then with its status.
            await write_pod(node, web)
            await report(node, status_record(web, version=2, status={"phase": "Running"}))
            body = await eventually(
                pods, lambda b: phases(b) == {"web": {"phase": "Running"}}, what="web Running"
            )
            assert (body["kind"], body["apiVersion"], body["metadata"]) == ("PodList", "v1", {})
            assert body["items"][0]["spec"] == web["spec"]
            assert body["items"][0]["metadata"] == web["metadata"]

            # Newer version replaces.
            v3 = {"phase": "Running", "message": "v3"}
            await report(node, status_record(web, version=3, status=v3))
            await eventually(pods, lambda b: phases(b)["web"] == v3, what="web v3")

            # Older version, malformed entries, then a good entry for another pod: once
            # db shows up, everything before it was handled in order.
            await report(node, status_record(web, version=1, status={"phase": "Pending"}))
            await node.bus.client.xadd(node.podstatus.key, {"r": "{not json"})
            await node.bus.client.xadd(node.podstatus.key, {"r": '{"v":7,"uid":"x"}'})
            await node.bus.client.xadd(node.podstatus.key, {"other": "field"})
            await write_pod(node, db)
            await report(node, status_record(db, version=1, status={"phase": "Pending"}))
            body = await eventually(pods, lambda b: "db" in phases(b), what="db listed")
            assert phases(body) == {"web": v3, "db": {"phase": "Pending"}}
            # The stream is tailed without a consumer group (every replica reads all).
            groups = await node.bus.client.xinfo_groups(node.podstatus.key)
            assert groups == [], groups

            # The reload reads the same table: still v3 after the next full reload, seen
            # as the view's age dropping below the time since this point.
            async def view_age() -> float:
                page = (await http.get(f"http://127.0.0.1:{svc}/metrics")).text
                age = sample_value(page, "klet_status_reporter_view_age_seconds")
                assert age is not None, "no view age in /metrics"
                return age

            mark = time.monotonic()
            await eventually(
                view_age, lambda age: age < time.monotonic() - mark, what="a full reload"
            )
            assert phases(await pods())["web"] == v3

            metrics = (await http.get(f"http://127.0.0.1:{ro}/metrics")).text
            assert "kubelet_running_pods 1.0" in metrics
            assert "klet_status_reporter_view_age_seconds" in metrics
            private = (await http.get(f"http://127.0.0.1:{svc}/metrics")).text
            assert "kubelet_running_pods 1.0" in private

            # Redis down: the last view keeps being served, also once the service has
            # failed to read the bus.
            async def bus_errors() -> float:
                page = (await http.get(f"http://127.0.0.1:{svc}/metrics")).text
                return sample_value(page, "klet_status_reporter_bus_errors_total") or 0.0

            before = await pods()
            failed_reads = await bus_errors()
            redis_server.stop()
            await eventually(
                bus_errors, lambda n: n > failed_reads, what="a failed read of the bus"
            )
            assert await pods() == before
            assert (await http.get(f"http://127.0.0.1:{hz}/healthz")).text == "ok"

            # Redis back, empty (a restart without persistence); its writers rebuild
            # the tables: a new syncloop epoch, and db no longer desired.
            redis_server.start()
            after = {"phase": "Succeeded", "message": "after restart"}
            # A new client: this one's pooled connection died with the old server.
            async with node_bus(redis_server) as fresh:
                await write_pod(fresh, web)
                await report(fresh, status_record(web, version=1, epoch=2.0, status=after))
            await eventually(
                pods,
                lambda b: phases(b) == {"web": after},
                what="the view rebuilt from the new tables",
            )
            errors = (await http.get(f"http://127.0.0.1:{svc}/metrics")).text
            assert "klet_status_reporter_bus_errors_total 0.0" not in errors
    outage_lines = [
        line
        for line in proc.log_path.read_text().splitlines()
        if line.startswith("W") and "bus unavailable" in line
    ]
    assert len(outage_lines) == 1, outage_lines  # once per outage, not once per retry


def listening_ports(pid: int) -> set[int]:
    """TCP ports process `pid` listens on (its socket inodes matched in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A = LISTEN
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


async def test_read_only_port_is_off_by_default(tmp_path: Path, redis_server: RedisServer) -> None:
    upstream_default = 10255
    was_free = refused(upstream_default)
    hz, svc = free_port(), free_port()
    with service(tmp_path / "sr", redis_server, healthz_port=hz, service_port=svc) as proc:
        async with httpx.AsyncClient(timeout=5) as http:
            await eventually(
                lambda: http.get(f"http://127.0.0.1:{svc}/readyz"),
                lambda r: r.status_code == 200,
                what="/readyz on the service port",
            )
            assert (await http.get(f"http://127.0.0.1:{hz}/healthz")).text == "ok"
        assert proc.pid is not None
        # Only the healthz and private ports: no read-only (nor any other) listener.
        assert listening_ports(proc.pid) == {hz, svc}
        if was_free:
            assert refused(upstream_default)


async def test_read_only_port_serves_cadvisor_metrics_without_the_kubelet_api(
    tmp_path: Path, redis_server: RedisServer, devstack: DevStack
) -> None:
    """A standalone node's usual set-up: 10250 off (Webhook authorization without a
    kubeconfig), the read-only port on; /metrics/cadvisor is served there, as upstream
    serves it on its read-only port, through a CRI client of its own."""
    ro, hz, svc = free_port(), free_port(), free_port()
    runtime = ("--container-runtime-endpoint", devstack.runtime_endpoint)
    with service(
        tmp_path / "sr", redis_server, read_only_port=ro, healthz_port=hz, service_port=svc,
        extra=runtime,
    ) as proc:  # fmt: skip
        async with httpx.AsyncClient(timeout=20) as http:
            resp = await eventually(
                lambda: http.get(f"http://127.0.0.1:{ro}/metrics/cadvisor"),
                lambda r: r.status_code == 200,
                what="/metrics/cadvisor on the read-only port",
            )
        assert proc.pid is not None
        assert listening_ports(proc.pid) == {ro, hz, svc}  # no kubelet API
    page = resp.text
    assert sample_value(page, "container_scrape_error") == 0.0, page[:2000]
    assert (sample_value(page, "machine_cpu_cores") or 0) >= 1
    assert sample_value(page, "container_cpu_usage_seconds_total", id="/", cpu="total")


async def test_two_replicas_share_the_ports_and_survive_one_being_killed(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    ro, hz = free_port(), free_port()
    svc = {"a": free_port(), "b": free_port()}
    web = make_pod("web")
    with (
        service(
            tmp_path / "a", redis_server, read_only_port=ro, healthz_port=hz, service_port=svc["a"]
        ) as a,
        service(
            tmp_path / "b", redis_server, read_only_port=ro, healthz_port=hz, service_port=svc["b"]
        ) as b,
    ):
        async with node_bus(redis_server) as node:
            await write_pod(node, web)
            await report(node, status_record(web, version=1, status={"phase": "Running"}))

        async def private(name: str, path: str) -> httpx.Response:
            async with httpx.AsyncClient(timeout=5) as http:
                return await http.get(f"http://127.0.0.1:{svc[name]}{path}")

        async def leader_flags() -> dict[str, float | None]:
            out = {}
            for name in svc:
                page = (await private(name, "/metrics")).text
                out[name] = sample_value(page, "klet_leader", service="status-reporter")
            return out

        # Both ready (a standby serves reads), exactly one leads.
        for name in svc:
            await eventually(
                lambda n=name: private(n, "/readyz"),  # type: ignore[misc]
                lambda r: r.status_code == 200,
                what=f"/readyz of replica {name}",
            )
        flags = await eventually(
            leader_flags, lambda f: sorted(f.values()) == [0.0, 1.0], what="one leader"
        )
        assert a.pid is not None and b.pid is not None
        for proc in (a, b):
            assert proc.pid is not None and {ro, hz} <= listening_ports(proc.pid)

        async def fresh_requests(n: int) -> list[dict[str, Any]]:
            # A new connection per request, so the kernel picks a replica each time.
            out = []
            for _ in range(n):
                async with httpx.AsyncClient(timeout=5) as http:
                    resp = await http.get(f"http://127.0.0.1:{ro}/pods")
                    resp.raise_for_status()
                    out.append(phases(resp.json()))
                    assert (await http.get(f"http://127.0.0.1:{hz}/healthz")).text == "ok"
            return out

        # Both views hold the pod before the kill (it reached each through the tables
        # or the stream, not through a consumer group that hands it to one of them).
        await eventually(
            lambda: fresh_requests(20),
            lambda seen: all(p == {"web": {"phase": "Running"}} for p in seen),
            what="web Running on every replica",
        )

        victim = a if flags["a"] == 1.0 else b
        victim.kill()
        seen = await fresh_requests(40)  # at once: no retry, no refused connection
        assert all(p == {"web": {"phase": "Running"}} for p in seen)
