"""What a client can make the kubelet API listener hold, for real on loopback TLS
(in-process, fakes behind it): a request head trickled a byte at a time is cut off by
the header deadline while an authenticated kept-alive connection may idle; a head over
64 KiB is answered 431; connections over the per-client and the global cap are closed
before the TLS handshake; a full unauthenticated pool gives the oldest place of the
client holding the most to a newcomer (the authenticated stay), refusals and evictions
counted; a client without credentials gets one answer per connection, and one that
then never finishes the TLS shutdown is reset within seconds; a request whose
TokenReview finds no free slot is answered 429 with Retry-After; a refused request's
body is never waited for (401/413 answered on the head, then close); what a client
pipelines while a followed log streams is bounded; the serving certificate and the
client CA are reloaded when their files change (a broken change keeps the old ones);
the self-generated certificate is regenerated before it expires (clock injected); TLS
1.2 offers only the ECDHE AEAD suites by default."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from klet.status_reporter.kubeletapi import KubeletApiDeps
from klet.status_reporter.kubeletapi.authn import AuthnSettings
from klet.status_reporter.kubeletapi.server import serve_kubelet_api, tls_settings
from klet.status_reporter.kubeletapi.tlsconfig import ServingTLS
from klet.testbed.fakes.kubeletapi import FakeApiServer
from klet.testbed.pki import CertificateAuthority

from tests.unit.status_reporter.kubeletapi import test_server
from tests.unit.status_reporter.kubeletapi.test_app import World
from tests.unit.status_reporter.kubeletapi.test_server import Pki, deps_for

pki = test_server.pki

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextlib.asynccontextmanager
async def serving(deps: KubeletApiDeps, **kwargs: Any) -> AsyncIterator[int]:
    """The server on a free loopback port (yields the port)."""
    ready = asyncio.Event()
    ports: list[int] = []
    task = asyncio.create_task(
        serve_kubelet_api(deps, ready=ready, on_listening=lambda h, p: ports.append(p), **kwargs),
        name="kubelet-api",
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait([task, waiter], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()
    try:
        yield ports[0]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def connect(port: int, ctx: ssl.SSLContext, *, source: str = "127.0.0.1") -> Conn:
    return await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=ctx, local_addr=(source, 0)), 5
    )


async def answer(conn: Conn, timeout_s: float = 10) -> bytes:
    """Everything the server sends until it closes the connection."""
    return await asyncio.wait_for(conn[0].read(), timeout_s)


async def request(conn: Conn, head: str) -> bytes:
    """Send `head`, return the response head."""
    conn[1].write(head.encode())
    await conn[1].drain()
    return await asyncio.wait_for(conn[0].readuntil(b"\r\n\r\n"), 5)


async def status_of(port: int, ctx: ssl.SSLContext, path: str = "/pods") -> int | None:
    """The status of one GET over a new connection; None when TLS refused it."""
    try:
        conn = await connect(port, ctx)
        head = await request(conn, f"GET {path} HTTP/1.1\r\nHost: n1\r\n\r\n")
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        return None
    conn[1].close()
    return int(head.split(b" ", 2)[1])


def insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def served_cert(port: int, ctx: ssl.SSLContext | None = None) -> x509.Certificate:
    conn = await connect(port, ctx or insecure())
    der = conn[1].get_extra_info("ssl_object").getpeercert(binary_form=True)
    conn[1].close()
    return x509.load_der_x509_certificate(der)


def load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificates(path.read_bytes())[0]


def truncate(path: Path) -> None:
    path.write_bytes(b"-----BEGIN PRIVATE KEY-----\n")


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


REFUSED = (ssl.SSLError, ConnectionResetError)
"""A failed handshake: the alert, or the reset when the server drops it unsent."""
GET = "GET /healthz HTTP/1.1\r\nHost: n1\r\n\r\n"


async def test_a_trickled_head_is_cut_off_by_the_deadline(world: World, pki: Pki) -> None:
    head = (GET[:-2] + "X-Padding: " + "a" * 40 + "\r\n\r\n").encode()
    async with serving(deps_for(world, pki, header_timeout_s=0.5)) as port:
        reader, writer = await connect(port, pki.admin)
        sent = 0
        closed = False
        for byte in head:  # one byte every 0.1 s: the head would take ~6 s
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except OSError:
                closed = True
                break
            sent += 1
            try:
                data = await asyncio.wait_for(reader.read(100), 0.1)
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
            assert data == b"", f"the server answered a trickled head: {data!r}"
            closed = True
            break
        assert closed and sent < len(head), "the trickled head was read to its end"
        writer.close()


async def test_an_authenticated_connection_may_idle(world: World, pki: Pki) -> None:
    async with serving(deps_for(world, pki, header_timeout_s=0.3)) as port:
        conn = await connect(port, pki.admin)
        assert (await request(conn, GET)).startswith(b"HTTP/1.1 200")
        await conn[0].readexactly(2)  # "ok"
        await asyncio.sleep(0.6)  # past the head deadline, well within the idle timeout
        assert (await request(conn, GET)).startswith(b"HTTP/1.1 200")
        conn[1].close()
        # Without credentials, the connection may not idle after its 401.
        conn = await connect(port, pki.plain)
        assert (await request(conn, GET)).startswith(b"HTTP/1.1 401")
        assert await answer(conn) == b"Unauthorized"  # then closed by the deadline


async def test_connection_caps(world: World, pki: Pki) -> None:
    deps = deps_for(world, pki, max_connections=3, max_connections_per_client=2)
    async with serving(deps) as port:
        held = [await connect(port, pki.admin), await connect(port, pki.admin)]
        # A third from the same client is closed before the handshake...
        with pytest.raises((OSError, asyncio.IncompleteReadError)):
            conn = await connect(port, pki.admin)
            await request(conn, GET)
        # ...another client still gets in, up to the global cap.
        held.append(await connect(port, pki.admin, source="127.0.0.2"))
        with pytest.raises((OSError, asyncio.IncompleteReadError)):
            conn = await connect(port, pki.admin, source="127.0.0.3")
            await request(conn, GET)
        assert (await request(held[0], GET)).startswith(b"HTTP/1.1 200")
        # A closed connection frees its place.
        held[1][1].close()
        for _ in range(50):
            if await status_of(port, pki.admin) == 200:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the closed connection's place was not freed")
        for _, writer in held:
            writer.close()


async def test_a_head_over_64_kib_is_refused(world: World, pki: Pki) -> None:
    padding = "".join(f"X-Pad-{i}: {'a' * 1000}\r\n" for i in range(66))  # 66 KiB and more
    async with serving(deps_for(world, pki)) as port:
        conn = await connect(port, pki.admin)
        conn[1].write(f"GET /healthz HTTP/1.1\r\nHost: n1\r\n{padding}\r\n".encode())
        with contextlib.suppress(ConnectionResetError):
            await conn[1].drain()
        data = await answer(conn)  # answered and closed, not held until a deadline
        assert data.startswith(b"HTTP/1.1 431")
        conn = await connect(port, pki.admin)  # a head within the bound is served
        small = "".join(f"X-Pad-{i}: {'a' * 1000}\r\n" for i in range(63))
        head = await request(conn, f"GET /healthz HTTP/1.1\r\nHost: n1\r\n{small}\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        conn[1].close()


def sample(world: World, name: str, **labels: str) -> float:
    value = world.registry.get_sample_value(name, labels)
    assert value is not None, f"no sample {name}{labels}"
    return value


async def closed_by_server(conn: Conn) -> bool:
    """Whether the server ended `conn` (EOF or reset) within a second."""
    try:
        return await asyncio.wait_for(conn[0].read(100), 1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


async def test_a_full_unauthenticated_pool_makes_room_for_a_newcomer(
    world: World, pki: Pki
) -> None:
    deps = deps_for(world, pki, max_unauthenticated_connections=4, max_unauthenticated_per_client=3)
    async with serving(deps) as port:
        # An authenticated keep-alive connection: out of the pool, never given away.
        kept = await connect(port, pki.admin)
        assert (await request(kept, GET)).startswith(b"HTTP/1.1 200")
        await kept[0].readexactly(2)
        # Idle TLS connections, no request: three from .2 (its share), one from .3.
        idle = [await connect(port, pki.plain, source="127.0.0.2") for _ in range(3)]
        other = await connect(port, pki.plain, source="127.0.0.3")
        # .2 is at its share: closed before the handshake.
        with pytest.raises((OSError, asyncio.IncompleteReadError)):
            conn = await connect(port, pki.plain, source="127.0.0.2")
            await request(conn, GET)
        # The pool is full, but the admin's address holds none of it: the oldest of .2
        # (the client holding the most) is closed and the admin served.
        assert await status_of(port, pki.admin) == 200
        assert await closed_by_server(idle[0])
        assert not await closed_by_server(idle[1])
        # The admin's connection left the pool when served: .4 fills it again. Then .3
        # (one) takes the oldest place of .2 (two), and holding two, the most, another
        # of .3 is refused.
        fourth = await connect(port, pki.plain, source="127.0.0.4")
        third = await connect(port, pki.plain, source="127.0.0.3")
        assert await closed_by_server(idle[1])
        with pytest.raises((OSError, asyncio.IncompleteReadError)):
            conn = await connect(port, pki.plain, source="127.0.0.3")
            await request(conn, GET)
        assert not await closed_by_server(other)
        assert (await request(kept, GET)).startswith(b"HTTP/1.1 200")
        assert sample(world, "klet_kubelet_api_connections_evicted_total") == 2
        refused = "klet_kubelet_api_connections_refused_total"
        assert sample(world, refused, reason="unauthenticated_client") == 1
        assert sample(world, refused, reason="unauthenticated") == 1
        assert sample(world, "klet_kubelet_api_connections", state="authenticated") == 1
        assert sample(world, "klet_kubelet_api_connections", state="unauthenticated") == 4
        for _, writer in (kept, *idle, other, third, fourth):
            writer.close()


async def test_one_answer_per_connection_without_credentials(world: World, pki: Pki) -> None:
    deps = deps_for(world, pki, max_unauthenticated_per_client=1, header_timeout_s=30)
    async with serving(deps) as port:
        conn = await connect(port, pki.plain)
        head = await request(conn, GET)
        assert head.startswith(b"HTTP/1.1 401") and b"connection: close" in head.lower()
        assert await answer(conn, timeout_s=2) == b"Unauthorized"  # closed, not idling
        # A client that neither reads on nor finishes the TLS shutdown holds its place
        # only a couple of seconds (asyncio alone would wait 30 s for it).
        conn = await connect(port, pki.plain)
        transport: Any = conn[1].transport
        transport.pause_reading()
        conn[1].write(GET.encode())
        started = asyncio.get_running_loop().time()
        while await status_of(port, pki.plain) is None:
            assert asyncio.get_running_loop().time() - started < 5, "the place was not freed"
            await asyncio.sleep(0.2)
        conn[1].transport.abort()


async def test_token_reviews_over_their_slots_are_answered_429(world: World, pki: Pki) -> None:
    api = FakeApiServer()
    api.tokens["good"] = {"username": "sa"}
    api.hold = asyncio.Event()
    deps = dataclasses.replace(
        deps_for(
            world,
            pki,
            authn=AuthnSettings(x509=True, webhook=True),
            review_concurrency=1,
            review_queue=0,
        ),
        apiserver=api,
    )

    def with_token(token: str) -> str:
        return f"GET /healthz HTTP/1.1\r\nHost: n1\r\nAuthorization: Bearer {token}\r\n\r\n"

    async with serving(deps) as port:
        held = await connect(port, pki.plain)
        held[1].write(with_token("good").encode())
        for _ in range(500):  # until its review holds the one slot
            if api.waiting:
                break
            await asyncio.sleep(0.01)
        conn = await connect(port, pki.plain)
        head = await request(conn, with_token("random"))
        assert head.startswith(b"HTTP/1.1 429")
        assert b"retry-after: 1" in head.lower() and b"connection: close" in head.lower()
        assert await answer(conn) == b"Too Many Requests"
        assert sample(world, "klet_kubelet_api_reviews_rejected_total", review="TokenReview") == 1
        # The x509-authenticated needs no TokenReview: served meanwhile.
        assert await status_of(port, pki.admin, "/healthz") == 200
        api.hold.set()
        good = await asyncio.wait_for(held[0].readuntil(b"\r\n\r\n"), 5)
        assert good.startswith(b"HTTP/1.1 200")
        await held[0].readexactly(2)  # "ok"
        assert (await request(held, with_token("good"))).startswith(b"HTTP/1.1 200")
        held[1].close()


async def test_refused_bodies_are_not_read(world: World, pki: Pki) -> None:
    big = "POST /run/ns/web/app?cmd=ls HTTP/1.1\r\nHost: n1\r\nContent-Length: 104857600\r\n\r\n"
    async with serving(deps_for(world, pki)) as port:
        # No credentials: 401 on the head, the 100 MiB body never sent nor waited for.
        conn = await connect(port, pki.plain)
        conn[1].write(big.encode())
        data = await answer(conn)
        assert data.startswith(b"HTTP/1.1 401") and b"connection: close" in data.lower()
        # Authenticated but over the body limit: 413 before a byte of it.
        conn = await connect(port, pki.admin)
        conn[1].write(big.encode())
        data = await answer(conn)
        assert data.startswith(b"HTTP/1.1 413")
        # Bodies within the limit are read as before.
        conn = await connect(port, pki.admin)
        head = await request(
            conn, "POST /run/ns/web/app?cmd=ls HTTP/1.1\r\nHost: n1\r\nContent-Length: 3\r\n\r\nabc"
        )
        assert head.startswith(b"HTTP/1.1 200")
        conn[1].close()


async def test_what_a_client_sends_during_a_stream_is_bounded(world: World, pki: Pki) -> None:
    deps = deps_for(world, pki, max_header_bytes=4096, max_body_bytes=4096)
    async with serving(deps) as port:
        conn = await connect(port, pki.admin)
        head = await request(
            conn, "GET /containerLogs/ns/web/app?follow=true HTTP/1.1\r\nHost: n1\r\n\r\n"
        )
        assert head.startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(conn[0].readuntil(b"line4"), 5)
        for _ in range(16):  # 64 KiB of pipelined garbage while the log is followed
            conn[1].write(b"x" * 4096)
            await conn[1].drain()
        # The server closes the connection (a reset, when our bytes were still unread).
        with contextlib.suppress(ConnectionResetError):
            await answer(conn)  # the end of the stream, not a timeout


async def test_certificate_and_client_ca_reload(world: World, pki: Pki, tmp_path: Path) -> None:
    client_ca = tmp_path / "client-ca.crt"
    client_ca.write_bytes(pki.ca.cert_pem)
    other = CertificateAuthority.create(tmp_path / "other", "other-ca")
    bob = other.issue("bob", ["devs"], client=True, name="bob")
    bob_ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    bob_ctx.load_cert_chain(str(bob.cert), str(bob.key))
    serving_pair = pki.ca.serving  # type: ignore[attr-defined]
    deps = deps_for(world, pki, client_ca_file=client_ca, tls_reload_interval_s=0)
    async with serving(deps) as port:
        first = await served_cert(port)
        assert await status_of(port, bob_ctx) is None  # bob's CA is not trusted yet

        pki.ca.issue("system:node:n1", ["system:nodes"], ip_addresses=["127.0.0.1"],
                     server=True, name="serving")  # fmt: skip
        client_ca.write_bytes(pki.ca.cert_pem + other.cert_pem)
        second = await served_cert(port)
        assert second.serial_number != first.serial_number
        assert second == load_cert(Path(serving_pair.cert))
        assert await status_of(port, bob_ctx) == 200
        assert await status_of(port, pki.admin) == 200

        # A change that does not load (a truncated key) keeps what is served.
        truncate(Path(serving_pair.key))
        assert (await served_cert(port)).serial_number == second.serial_number
        assert await status_of(port, pki.admin) == 200


async def test_self_signed_certificate_is_renewed_before_it_expires(
    world: World, pki: Pki, tmp_path: Path
) -> None:
    deps = deps_for(
        world,
        pki,
        tls_cert_file="",
        tls_private_key_file="",
        cert_dir=tmp_path / "certs",
        node_ips=("127.0.0.1",),
        tls_reload_interval_s=0,
    )
    now = [datetime.datetime.now(datetime.UTC)]
    tls = ServingTLS(tls_settings(deps.settings), clock=lambda: now[0])
    async with serving(deps, tls=tls) as port:
        first = await served_cert(port)
        now[0] = first.not_valid_after_utc - datetime.timedelta(days=60)
        assert (await served_cert(port)).serial_number == first.serial_number
        now[0] = first.not_valid_after_utc - datetime.timedelta(days=1)
        renewed = await served_cert(port)
        assert renewed.serial_number != first.serial_number
        assert renewed.not_valid_after_utc > first.not_valid_after_utc
        assert load_cert(tmp_path / "certs" / "kubelet.crt") == renewed


async def test_tls12_offers_only_ecdhe_aead_suites(world: World, pki: Pki) -> None:
    def tls12(ciphers: str) -> ssl.SSLContext:
        ctx = insecure()
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(ciphers)
        return ctx

    async with serving(deps_for(world, pki)) as port:
        cert = await served_cert(port, tls12("ECDHE-ECDSA-AES128-GCM-SHA256"))
        assert cert.subject.rfc4514_string().startswith("CN=system:node:n1")
        await served_cert(port, tls12("ECDHE-ECDSA-CHACHA20-POLY1305"))
        for cbc in ("ECDHE-ECDSA-AES128-SHA256", "ECDHE-ECDSA-AES256-SHA384"):
            with pytest.raises(REFUSED):
                await served_cert(port, tls12(cbc))
        # The operator's tlsCipherSuites still win.
    chosen = deps_for(world, pki, tls_cipher_suites=("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",))
    async with serving(chosen) as port:
        await served_cert(port, tls12("ECDHE-ECDSA-AES256-GCM-SHA384"))
        with pytest.raises(REFUSED):
            await served_cert(port, tls12("ECDHE-ECDSA-AES128-GCM-SHA256"))
