"""The kubelet API listener for real on loopback TLS (in-process, fakes behind it):
401 without credentials, client certificates (CN/O) and bearer tokens authenticating,
Webhook authorization answering 403 with upstream's body, keep-alive, a followed log
streamed chunk by chunk until the client leaves, the exec proxy (request head rewritten
for the runtime's stream server, 101 relayed, bytes spliced both ways, error answers
relayed), and the self-signed certificate generated into certDir."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from klet.status_reporter.kubeletapi import KubeletApiDeps
from klet.status_reporter.kubeletapi.authn import AuthnSettings
from klet.status_reporter.kubeletapi.logstream import FollowPolicy
from klet.status_reporter.kubeletapi.server import serve_kubelet_api
from klet.testbed.fakes.kubeletapi import FakeApiServer, FollowerClock
from klet.testbed.pki import CertificateAuthority

from tests.unit.status_reporter.kubeletapi.test_app import World, log_line


@dataclasses.dataclass
class Pki:
    ca: CertificateAuthority
    admin: ssl.SSLContext
    plain: ssl.SSLContext


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = CertificateAuthority.create(tmp_path / "pki", "test-ca")
    serving = ca.issue(
        "system:node:n1", ["system:nodes"], ip_addresses=["127.0.0.1"], server=True, name="serving"
    )
    admin = ca.issue("alice", ["system:masters", "devs"], client=True, name="alice")
    ctx = ssl.create_default_context(cafile=str(ca.cert_path))
    ctx.load_cert_chain(str(admin.cert), str(admin.key))
    plain = ssl.create_default_context(cafile=str(ca.cert_path))
    ca.serving = serving  # type: ignore[attr-defined]
    return Pki(ca, ctx, plain)


def deps_for(world: World, pki: Pki, **changes: Any) -> KubeletApiDeps:
    serving = pki.ca.serving  # type: ignore[attr-defined]
    values: dict[str, Any] = {
        "address": "127.0.0.1",
        "port": 0,
        "tls_cert_file": str(serving.cert),
        "tls_private_key_file": str(serving.key),
        "client_ca_file": pki.ca.cert_path,
        "authn": AuthnSettings(x509=True),
        "authorization_mode": "AlwaysAllow",
    }
    settings = dataclasses.replace(world.deps.settings, **{**values, **changes})
    return dataclasses.replace(
        world.deps, settings=settings, follow=FollowPolicy(poll_s=0.02, check_s=0.1)
    )


@contextlib.asynccontextmanager
async def serving(deps: KubeletApiDeps) -> AsyncIterator[str]:
    ready = asyncio.Event()
    ports: list[int] = []
    task = asyncio.create_task(
        serve_kubelet_api(deps, ready=ready, on_listening=lambda h, p: ports.append(p)),
        name="kubelet-api",
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait([task, waiter], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()
    try:
        yield f"https://127.0.0.1:{ports[0]}"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_authentication(world: World, pki: Pki) -> None:
    async with serving(deps_for(world, pki)) as url:
        async with httpx.AsyncClient(base_url=url, verify=pki.plain) as anon:
            r = await anon.get("/pods")
            assert (r.status_code, r.text) == (401, "Unauthorized")
        async with httpx.AsyncClient(base_url=url, verify=pki.admin) as admin:
            r = await admin.get("/pods")
            assert r.status_code == 200 and r.json()["items"][0]["metadata"]["name"] == "web"
            assert (await admin.get("/healthz")).text == "ok"  # same connection, kept alive
            assert (await admin.get("/nowhere")).status_code == 404


async def test_tokens_and_webhook_authorization(world: World, pki: Pki) -> None:
    api = FakeApiServer()
    api.tokens["tok-mon"] = {"username": "monitor", "groups": ["mon"]}
    api.tokens["tok-ops"] = {"username": "ops"}
    api.allowed |= {("monitor", "get", "stats"), ("ops", "get", "proxy"), ("alice", "get", "pods")}
    deps = dataclasses.replace(
        deps_for(
            world, pki, authorization_mode="Webhook", authn=AuthnSettings(x509=True, webhook=True)
        ),
        apiserver=api,
    )
    async with serving(deps) as url:
        async with httpx.AsyncClient(base_url=url, verify=pki.plain) as c:
            mon = {"Authorization": "Bearer tok-mon"}
            assert (await c.get("/stats/summary", headers=mon)).status_code == 200
            r = await c.get("/pods", headers=mon)
            assert (r.status_code, r.text) == (
                403,
                "Forbidden (user=monitor, verb=get, resource=nodes, subresource(s)=[pods proxy])\n",
            )
            r = await c.get(
                "/containerLogs/ns/web/app", headers={"Authorization": "Bearer tok-ops"}
            )
            assert r.status_code == 200 and r.text.startswith("line0")
            r = await c.get("/pods", headers={"Authorization": "Bearer stolen"})
            assert r.status_code == 401
        async with httpx.AsyncClient(base_url=url, verify=pki.admin) as admin:
            assert (await admin.get("/pods")).status_code == 200
            assert (await admin.get("/configz")).status_code == 403
        api.fail = True
        async with httpx.AsyncClient(base_url=url, verify=pki.admin) as admin:
            r = await admin.get("/metrics")
            assert r.status_code == 500 and r.text.startswith("Authorization error (user=alice")


async def test_follow_streams_until_the_client_leaves(world: World, pki: Pki) -> None:
    clock = FollowerClock()
    deps = deps_for(world, pki)
    deps = dataclasses.replace(deps, follow=dataclasses.replace(deps.follow, sleep=clock.sleep))
    async with serving(deps) as url:
        async with httpx.AsyncClient(base_url=url, verify=pki.admin, timeout=5) as c:
            async with c.stream("GET", "/containerLogs/ns/web/app?follow=true&tailLines=1") as r:
                assert r.headers.get("transfer-encoding") == "chunked"
                chunks = r.aiter_bytes()
                try:
                    assert await anext(chunks) == b"line4\n"
                    with world.log.open("ab") as f:
                        f.write(log_line("line5", 5))
                    await clock.until(lambda: clock.sleeping > 0)
                    await clock.advance(deps.follow.poll_s)
                    assert await anext(chunks) == b"line5\n"
                finally:
                    await chunks.aclose()  # type: ignore[attr-defined]
        # The client closed mid-stream: the follower, which asks the runtime whether the
        # container still runs every check_s, must have stopped (left its sleep), and
        # however long the time moves on, it asks nothing more.
        await clock.until(lambda: clock.sleeping == 0)
        polls = len(world.runtime.calls)
        await clock.advance(10 * deps.follow.check_s)
        assert len(world.runtime.calls) == polls


class Backend:
    """A stand-in for the runtime's stream server: records the request head, answers
    101 and echoes, or answers `status` with a body."""

    def __init__(self, status: int = 101) -> None:
        self.status = status
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.heads.append(await reader.readuntil(b"\r\n\r\n"))
        if self.status == 101:
            writer.write(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                b"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io"
                b"\r\n\r\n"
            )
            while data := await reader.read(1024):
                writer.write(data.upper())
                await writer.drain()
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nno stream")
            await writer.drain()
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/exec/TOKEN42"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def open_upgrade(
    url: str, ctx: ssl.SSLContext, path: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    port = int(url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\n"
        "Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
        "Authorization: Bearer secret\r\nContent-Length: 0\r\n\r\n".encode()
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return reader, writer, head


async def test_exec_is_proxied_to_the_stream_server(world: World, pki: Pki) -> None:
    backend = Backend()
    async with backend as stream_url, serving(deps_for(world, pki)) as url:
        world.runtime.stream_url = stream_url
        reader, writer, head = await open_upgrade(
            url, pki.admin, "/exec/ns/web/app?command=cat&input=1&output=1"
        )
        assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
        assert b"X-Stream-Protocol-Version: v4.channel.k8s.io" in head
        writer.write(b"hello through the proxy")
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(23), 5) == b"HELLO THROUGH THE PROXY"
        writer.close()
        sent = backend.heads[0].decode()
        assert sent.startswith("POST /exec/TOKEN42 HTTP/1.1\r\n")
        assert f"Host: {stream_url.split('/')[2]}\r\n" in sent
        assert "Upgrade: SPDY/3.1" in sent and "Authorization" not in sent
        assert world.runtime.calls[-1] == ("exec", ("c1", ["cat"], False, True, True, False))


async def test_stream_errors(world: World, pki: Pki) -> None:
    backend = Backend(status=404)
    async with backend as stream_url, serving(deps_for(world, pki)) as url:
        world.runtime.stream_url = stream_url
        reader, writer, head = await open_upgrade(url, pki.admin, "/exec/ns/web/app?output=1")
        assert head.startswith(b"HTTP/1.1 404")
        assert await asyncio.wait_for(reader.read(), 5) == b"no stream"
        writer.close()
        reader, writer, head = await open_upgrade(url, pki.admin, "/exec/ns/gone/app?output=1")
        assert head.startswith(b"HTTP/1.1 404")
        writer.close()
        reader, writer, head = await open_upgrade(url, pki.plain, "/exec/ns/web/app?output=1")
        assert head.startswith(b"HTTP/1.1 401")
        writer.close()
    world.runtime.stream_url = "http://127.0.0.1:1/closed"
    async with serving(deps_for(world, pki)) as url:
        reader, writer, head = await open_upgrade(url, pki.admin, "/exec/ns/web/app?output=1")
        assert head.startswith(b"HTTP/1.1 502")
        writer.close()


async def test_self_signed_certificate(world: World, pki: Pki, tmp_path: Path) -> None:
    deps = deps_for(
        world,
        pki,
        tls_cert_file="",
        tls_private_key_file="",
        cert_dir=tmp_path / "certs",
        node_ips=("127.0.0.1",),
    )
    async with serving(deps) as url:
        crt = tmp_path / "certs" / "kubelet.crt"
        assert (tmp_path / "certs" / "kubelet.key").stat().st_mode & 0o777 == 0o600
        leaf, ca = x509.load_pem_x509_certificates(crt.read_bytes())
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sans.get_values_for_type(x509.DNSName) == ["n1"]
        assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        ctx = ssl.create_default_context(cafile=str(crt))
        ctx.load_cert_chain(str(pki.ca.dir / "alice.crt"), str(pki.ca.dir / "alice.key"))
        async with httpx.AsyncClient(base_url=url, verify=ctx) as c:
            assert (await c.get("/healthz")).text == "ok"
    before = crt.read_bytes()
    async with serving(deps):
        assert crt.read_bytes() == before  # reused, not regenerated


async def test_connections_open_at_shutdown_end_without_a_callback_error(
    world: World, pki: Pki
) -> None:
    """Stopping the server with a client connected logged "Exception in callback" (a
    CancelledError from asyncio's stream protocol asking the cancelled connection task
    for its exception) at every status-reporter shutdown."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        async with serving(deps_for(world, pki)) as url:
            port = int(url.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pki.admin)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        # The server is gone, the connection was open (keep-alive) when it stopped.
        for _ in range(5):
            await asyncio.sleep(0)
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
    finally:
        loop.set_exception_handler(previous)
    assert errors == []


async def test_requests_are_counted_timed_and_in_flight_by_upstreams_labels(
    world: World, pki: Pki
) -> None:
    def value(name: str, method: str, path: str, long_running: str = "false") -> float | None:
        labels = {
            "method": method,
            "path": path,
            "server_type": "readwrite",
            "long_running": long_running,
        }
        return world.registry.get_sample_value(name, labels)

    backend = Backend()
    async with backend as stream_url, serving(deps_for(world, pki)) as url:
        world.runtime.stream_url = stream_url
        async with httpx.AsyncClient(base_url=url, verify=pki.admin) as admin:
            for _ in range(3):
                assert (await admin.get("/pods")).status_code == 200
            assert (await admin.get("/stats/summary")).status_code == 200
            assert (await admin.get("/no/such/root")).status_code == 404
        async with httpx.AsyncClient(base_url=url, verify=pki.plain) as anon:
            assert (await anon.get("/metrics/cadvisor")).status_code == 401
        reader, writer, head = await open_upgrade(url, pki.admin, "/exec/ns/web/app?output=1")
        assert head.startswith(b"HTTP/1.1 101")
        # the stream is in flight until it closes
        assert value("kubelet_http_inflight_requests", "POST", "exec", "true") == 1
        assert value("kubelet_http_requests_total", "POST", "exec", "true") == 1
        writer.close()
        for _ in range(100):
            if value("kubelet_http_inflight_requests", "POST", "exec", "true") == 0:
                break
            await asyncio.sleep(0.02)
    assert value("kubelet_http_inflight_requests", "POST", "exec", "true") == 0
    assert value("kubelet_http_requests_duration_seconds_count", "POST", "exec", "true") == 1
    assert value("kubelet_http_requests_total", "GET", "pods") == 3
    assert value("kubelet_http_requests_duration_seconds_count", "GET", "pods") == 3
    assert value("kubelet_http_inflight_requests", "GET", "pods") == 0
    assert value("kubelet_http_requests_total", "GET", "stats") == 1
    assert value("kubelet_http_requests_total", "GET", "other") == 1
    # a refused request is counted too, as upstream's ServeHTTP wraps its auth filter
    assert value("kubelet_http_requests_total", "GET", "metrics/cadvisor") == 1
