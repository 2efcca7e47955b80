"""Attacks on the bus, against the real Redis that `klet up` and the harness run.

Writing a node's `desired` table is root on that node (syncloop runs what it says), so:
a client without credentials, a client with a wrong password, and a client holding
another service's or another node's credentials cannot write desired pods, the `pods`
stream, leases, node conditions or another service's Events (one writer per key:
eviction forged syncloop's Ready, and an XADD with the largest ID broke the shared
stream for all), neither directly nor through klet's functions (the fenced-write path),
while every service reads the tables it is granted (one record, many in one HMGET, all).
Each refusal is paired with the owner doing the same write, so the
test cannot pass by everything failing. A service's own condition key carries only the
condition types it owns as far as any reader is concerned (eviction's forged Ready and
syncloop's pressure never reach status-reporter). No service may SELECT another database, run Lua
of its own (EVAL, FUNCTION LOAD, a function not klet's): a looping script of a service
blocked every client of the Redis. A Redis without klet's functions (restarted, not
loaded yet) is unavailable, not an error; `klet bus-acl --apply` sets a node's users
and the functions on a Redis klet did not start. Also:
rediss:// with TLS against redis-server's own TLS listener, server certificate verified,
with a client certificate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from klet.bus import Bus, BusError, BusUnavailable, NodeBus, functions
from klet.bus.acl import ACCESS, SERVICES, Credentials
from klet.config import RedisAuth
from klet.devstack import RedisServer, RedisTLS
from klet.model.records import DesiredPod, NodeConditionRecord, PodChange, SourceState
from klet.model.types import PodUID
from klet.testbed.pki import CertificateAuthority

NODE, OTHER = "victim", "attacker"


def evil_pod() -> DesiredPod:
    pod = {
        "metadata": {"name": "root", "namespace": "default", "uid": "evil-uid"},
        "spec": {
            "nodeName": NODE,
            "hostPID": True,
            "containers": [
                {"name": "c", "image": "busybox", "securityContext": {"privileged": True}}
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        },
    }
    return DesiredPod(uid=PodUID("evil-uid"), pod=pod, source="api", hash="x", seen_at=1.0)


def pressure() -> NodeConditionRecord:
    return NodeConditionRecord(
        type="MemoryPressure",
        status="True",
        reason="KubeletHasInsufficientMemory",
        message="fake",
        at=time.time(),
    )


def not_ready() -> NodeConditionRecord:
    return NodeConditionRecord(type="Ready", status="False", message="forged", at=time.time())


@asynccontextmanager
async def node_bus(server: RedisServer, auth: Credentials | None) -> AsyncIterator[NodeBus]:
    bus = Bus.from_url(server.url, NODE, auth=auth, timeout_s=2.0)
    try:
        yield NodeBus.of(bus, service="syncloop")
    finally:
        await bus.close()


async def attempts(nb: NodeBus, server: RedisServer, auth: Credentials | None) -> dict[str, bool]:
    """Try every dangerous write; which ones Redis accepted."""
    done: dict[str, bool] = {}

    async def attempt(name: str, write: object) -> None:
        try:
            await write  # type: ignore[misc]
            done[name] = True
        except BusError:
            done[name] = False

    client = nb.bus.client
    lease_key = nb.bus.key("lease:pod-source")
    await attempt("desired", nb.desired.put("evil-uid", evil_pod()))
    await attempt(
        "pods", nb.pods.publish(PodChange(op="ADD", uid=PodUID("evil-uid"), source="api"))
    )
    # One writer per key: each service's conditions and Events are its own.
    await attempt(
        "node:eviction",
        nb.bus.table("node:eviction", NodeConditionRecord).put("MemoryPressure", pressure()),
    )
    await attempt(
        "node:syncloop",
        nb.bus.table("node:syncloop", NodeConditionRecord).put("Ready", not_ready()),
    )
    # The largest possible ID: every later XADD to that stream would fail.
    await attempt(
        "events:eviction",
        _call(
            client.xadd(nb.bus.key("events:eviction"), {"r": "x"}, id=f"{2**64 - 1}-{2**64 - 1}")
        ),
    )
    await attempt("status", nb.status.delete("some-uid"))
    for service in SERVICES:
        # One lease per bus (a bus with a lease fences every write by it): a bus each.
        thief = Bus.from_url(server.url, NODE, auth=auth, timeout_s=2.0)
        try:
            lease = thief.lease(service, f"thief-{service}", ttl_ms=60_000)
            await attempt(f"lease:{service}", lease.try_acquire())
        finally:
            await thief.close()
    # The same write through the fenced-write function, as the leader writes run; the
    # lease value is nobody's, so only the ACL can refuse it first.
    await attempt(
        "desired-by-function",
        _call(
            client.fcall(
                functions.FENCED_WRITE, 2, lease_key, nb.desired.key, "x", "hset", "2", "e", "x"
            )
        ),
    )
    return done


async def _call(call: Awaitable[object]) -> None:
    """Await a raw client call: a refusal by Redis is BusError; the function's own
    verdict on the lease (FENCED or LAPSED: the ACL let the call through) is success."""
    from redis.exceptions import RedisError

    try:
        await call
    except RedisError as err:
        if str(err).startswith(("FENCED", "LAPSED")):
            return
        raise BusError(str(err)) from err


NOTHING_WRITTEN = {"desired": {}, "pods": 0, "node": {}, "events": 0, "leases": []}


async def written(server: RedisServer) -> dict[str, object]:
    """What the attempts left on the bus, read as the admin."""
    async with node_bus(server, server.admin) as nb:
        client = nb.bus.client
        return {
            "desired": await client.hgetall(nb.desired.key),
            "pods": await client.xlen(nb.pods.key),
            "node": await nb.node.all(),
            "events": await client.xlen(nb.bus.key("events:eviction")),
            "leases": await client.keys(f"klet:{NODE}:lease:*"),
        }


async def test_no_credentials_and_a_wrong_password_write_nothing(
    redis_server: RedisServer,
) -> None:
    redis_server.add_node(NODE)
    async with node_bus(redis_server, None) as nb:
        assert not any((await attempts(nb, redis_server, None)).values())
    wrong = Credentials(f"klet-pod-source@{NODE}", Path("/nonexistent"), "not-the-password")
    async with node_bus(redis_server, wrong) as nb:
        assert not any((await attempts(nb, redis_server, wrong)).values())
    assert await written(redis_server) == NOTHING_WRITTEN


@pytest.mark.parametrize("service", SERVICES)
async def test_each_service_writes_only_what_it_owns(
    redis_server: RedisServer, service: str
) -> None:
    cred = redis_server.credentials(NODE, service)
    async with node_bus(redis_server, cred) as nb:
        done = await attempts(nb, redis_server, cred)
    owned = {
        "pod-source": {"desired", "desired-by-function", "pods", "lease:pod-source"},
        "syncloop": {"node:syncloop", "status", "lease:syncloop"},
        "status-reporter": {"lease:status-reporter"},
        "eviction": {"node:eviction", "events:eviction", "lease:eviction"},
        "image-gc": {"lease:image-gc"},
    }[service]
    assert {name for name, ok in done.items() if ok} == owned


@pytest.mark.parametrize("service", SERVICES)
async def test_each_service_reads_its_tables_one_many_and_all(
    redis_server: RedisServer, service: str
) -> None:
    # Batched readers (syncloop's pods consumer, status-reporter's view) use HMGET: a
    # grant without it failed every batch and left pods to the 5 s table resync.
    redis_server.add_node(NODE)
    access = ACCESS[service]
    async with node_bus(redis_server, redis_server.credentials(NODE, service)) as nb:
        for name in (*access.reads, *access.writes):
            table = nb.bus.table(name, SourceState)
            assert await table.get("k") is None, name
            assert await table.get_many(["k", "l"]) == {"k": None, "l": None}, name
            assert await table.all() == {}, name


@pytest.mark.parametrize("service", SERVICES)
async def test_no_service_may_leave_database_0(redis_server: RedisServer, service: str) -> None:
    # With SELECT granted, pod-source wrote `desired` in database 5, where nothing of
    # klet's looks and anything else of the operator's may.
    from redis.exceptions import NoPermissionError

    redis_server.add_node(NODE)
    async with node_bus(redis_server, redis_server.credentials(NODE, service)) as nb:
        with pytest.raises(NoPermissionError):
            await nb.bus.client.execute_command("SELECT", 5)
        assert await nb.bus.client.ping()  # the connection itself is fine


@pytest.mark.parametrize("service", SERVICES)
async def test_no_service_may_run_lua_of_its_own(redis_server: RedisServer, service: str) -> None:
    from redis.exceptions import NoPermissionError

    redis_server.add_node(NODE)
    loop = "while true do end"
    async with node_bus(redis_server, redis_server.credentials(NODE, service)) as nb:
        key = nb.bus.key(f"lease:{service}")
        client = nb.bus.client
        with pytest.raises(NoPermissionError):
            await client.eval(f"redis.call('SET', KEYS[1], 'x'); {loop}", 1, key)
        with pytest.raises(NoPermissionError):
            await client.eval_ro("return 1", 0)
        with pytest.raises(NoPermissionError):
            await client.function_load(
                f"#!lua name=evil\nredis.register_function('evil', function() {loop} end)"
            )
        # A function of another library, even one loaded by the admin, is not klet's.
        async with node_bus(redis_server, redis_server.admin) as admin:
            await admin.bus.client.function_load(
                "#!lua name=other\nredis.register_function('other', function() return 1 end)",
                replace=True,
            )
        with pytest.raises(NoPermissionError):
            await client.fcall("other", 0)
        # klet's own functions it may call: its lease is free, so it gets it.
        lease = nb.bus.lease(service, f"owner-{service}", ttl_ms=10_000)
        assert await lease.try_acquire()


async def test_a_redis_without_the_functions_is_unavailable_until_they_are_loaded(
    redis_server: RedisServer,
) -> None:
    cred = redis_server.credentials(NODE, "syncloop")
    async with node_bus(redis_server, redis_server.admin) as admin:
        await admin.bus.client.function_flush()
        async with node_bus(redis_server, cred) as nb:
            lease = nb.bus.lease("syncloop", "owner-syncloop", ttl_ms=10_000)
            with pytest.raises(BusUnavailable, match="functions .* are not loaded"):
                await lease.try_acquire()
            redis_server.load_functions()
            assert await lease.try_acquire()
            await nb.status.delete("x")  # a fenced write


async def test_bus_acl_apply_sets_a_nodes_users_and_the_functions(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    from klet.cli.busacl import bus_acl

    async with node_bus(redis_server, redis_server.admin) as admin:
        await admin.bus.client.function_flush()
    secrets_dir = tmp_path / "secrets"
    argv = ["--node", "applied", "--secrets-dir", str(secrets_dir), "--apply", redis_server.url]
    argv += ["--admin-password-file", str(redis_server.admin.password_file)]
    assert await asyncio.to_thread(bus_acl, argv) == 0
    cred = Credentials.from_file("klet-pod-source@applied", secrets_dir / "applied" / "pod-source")
    bus = Bus.from_url(redis_server.url, "applied", auth=cred, timeout_s=2.0)
    try:
        nb = NodeBus.of(bus, service="syncloop")
        assert await nb.bus.lease("pod-source", "ps-1", ttl_ms=10_000).try_acquire()
        await nb.desired.put("uid-1", evil_pod())  # its own write, fenced
        with pytest.raises(BusError):  # and not another service's
            await nb.status.delete("uid-1")
    finally:
        await bus.close()
    # Re-applying keeps the passwords the services hold.
    assert await asyncio.to_thread(bus_acl, argv) == 0
    assert Credentials.from_file(cred.username, cred.password_file).password == cred.password
    wrong = [*argv[:-1], str(tmp_path / "missing")]
    assert await asyncio.to_thread(bus_acl, wrong) == 2


async def test_another_nodes_credentials_write_nothing_on_this_node(
    redis_server: RedisServer,
) -> None:
    redis_server.add_node(NODE)
    for service in SERVICES:
        cred = redis_server.credentials(OTHER, service)
        async with node_bus(redis_server, cred) as nb:
            assert not any((await attempts(nb, redis_server, cred)).values()), service
    assert await written(redis_server) == NOTHING_WRITTEN


async def test_rediss_with_a_verified_server_and_a_client_certificate(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "pki", "redis-ca")
    server_cert = ca.issue("redis", ip_addresses=["127.0.0.1"], server=True)
    client_cert = ca.issue("klet-syncloop", client=True)
    other_ca = CertificateAuthority.create(tmp_path / "other", "someone-else")
    server = RedisServer(
        tmp_path / "redis",
        tls=RedisTLS(server_cert.cert, server_cert.key, ca.cert_path, client_certs=True),
    )
    server.start()
    try:
        cred = server.credentials(NODE, "syncloop")
        auth = RedisAuth(
            username=cred.username,
            password=cred.password,
            ca_file=ca.cert_path,
            cert_file=client_cert.cert,
            key_file=client_cert.key,
        )
        bus = Bus.from_url(server.tls_url, NODE, auth=auth, timeout_s=3.0)
        try:
            await NodeBus.of(bus, service="syncloop").status.delete(
                "x"
            )  # a write syncloop owns, over TLS
        finally:
            await bus.close()
        # A server certificate the client's CA did not sign is refused.
        impostor = RedisAuth(
            username=cred.username,
            password=cred.password,
            ca_file=other_ca.cert_path,
            cert_file=client_cert.cert,
            key_file=client_cert.key,
        )
        bus = Bus.from_url(server.tls_url, NODE, auth=impostor, timeout_s=3.0)
        try:
            with pytest.raises(BusError, match="certificate verify failed"):
                await bus.ping()
        finally:
            await bus.close()
    finally:
        server.stop()


async def test_a_condition_type_its_writer_does_not_own_never_reaches_a_reader(
    redis_server: RedisServer,
) -> None:
    # Each writes its own key with the direct HSET its grant allows (one grant per key,
    # not per field; the fenced write refuses these rows, test_bus_caps), and
    # status-reporter, reading with its own credential, gets only what each owns.
    shutdown = NodeConditionRecord(
        type="Ready", status="False", message="node is shutting down", at=time.time()
    )
    buses = {
        s: Bus.from_url(redis_server.url, NODE, auth=redis_server.credentials(NODE, s))
        for s in ("eviction", "syncloop", "status-reporter")
    }
    try:
        writers = {s: NodeBus.of(buses[s], service=s) for s in ("eviction", "syncloop")}
        for nb in writers.values():
            for type_, record in (("MemoryPressure", pressure()), ("Ready", not_ready())):
                await nb.bus.client.hset(nb.conditions.key, type_, record.encode())
        for service, nb in writers.items():
            assert await nb.bus.lease(service, f"host:1:{service[:4]}bbbbbbbb").try_acquire()
        node = NodeBus.of(buses["status-reporter"], service="status-reporter").node
        # eviction's Ready is the shutdown's only; syncloop has no pressure to report.
        assert set(await node.all()) == {"eviction:MemoryPressure", "syncloop:Ready"}
        await writers["eviction"].conditions.put("Ready", shutdown)
        assert set(await node.all()) == {
            "eviction:MemoryPressure",
            "eviction:Ready",
            "syncloop:Ready",
        }
    finally:
        for bus in buses.values():
            await bus.close()
