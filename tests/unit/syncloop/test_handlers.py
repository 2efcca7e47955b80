"""Probe and hook handlers (handlers.py) against in-process servers and the fake CRI.

Covers: exec success/failure with the output as message, stdout+stderr joined and cut
at 10 KiB, a runtime timeout reported as upstream's `command "..." timed out`, other
CRI errors as probe errors; httpGet success with the body, failure with upstream's
status-code message, the request upstream sends (path and query, User-Agent and Accept
defaults, spec headers overriding them, an empty Accept removed, the Host header),
port by name and the errors for unknown names and bad numbers, same-host redirects
followed, another host's redirect reported as success with a warning, a redirect loop
stopped after 10, a timeout, a refused connection worded as Go's, HTTPS without
certificate verification; an HTTPS request a plain-HTTP server answers failing with Go's
"server gave HTTP response to HTTPS client" (a non-HTTP answer does not), and the
hooks' fallback: sent again over HTTP without Authorization, its host:port returned when
answered, the HTTPS error kept when not; tcpSocket connect and refusal; gRPC health SERVING,
NOT_SERVING, an unknown service, a server without the health service, and nobody
listening within the timeout.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from klet.cri import CRIError, RuntimeUnavailable
from klet.cri.types import ContainerConfig, SandboxConfig
from klet.model.types import ContainerID
from klet.syncloop.containers import handlers
from klet.syncloop.containers.handlers import HandlerResult
from klet.testbed.fakes.cri import FakeRuntimeService

# -- exec ------------------------------------------------------------------------------


async def running_container(cri: FakeRuntimeService) -> ContainerID:
    cri.add_image("busybox")
    sb_cfg = SandboxConfig("p", "default", "u1", 0, "p", "/tmp/klet-test-logs")
    sid = await cri.run_pod_sandbox(sb_cfg)
    cid = await cri.create_container(sid, ContainerConfig("app", 0, "busybox"), sb_cfg)
    await cri.start_container(cid)
    return cid


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ((0, b"fine\n", b""), HandlerResult(True, "fine\n")),
        ((1, b"out ", b"err"), HandlerResult(False, "out err")),
        ((2, b"x" * 20_000, b"y"), HandlerResult(False, "x" * 10_240)),
    ],
)
async def test_exec_exit_code_and_output(
    answer: tuple[int, bytes, bytes], expected: HandlerResult
) -> None:
    cri = FakeRuntimeService()
    cid = await running_container(cri)
    seen: list[list[str]] = []

    def respond(container_id: ContainerID, cmd: list[str]) -> tuple[int, bytes, bytes]:
        seen.append(cmd)
        return answer

    cri.exec_responder = respond
    result = await handlers.run_exec(cri, cid, ["sh", "-c", "check"], timeout_s=3)
    assert result == expected
    assert seen == [["sh", "-c", "check"]]
    assert cri.calls_of("ExecSync") == [("ExecSync", cid, "sh", "-c", "check")]


async def test_exec_timeout_and_errors() -> None:
    cri = FakeRuntimeService()
    cid = await running_container(cri)

    def too_slow(container_id: ContainerID, cmd: list[str]) -> tuple[int, bytes, bytes]:
        raise RuntimeUnavailable("ExecSync: DEADLINE_EXCEEDED: timeout", code="DEADLINE_EXCEEDED")

    cri.exec_responder = too_slow
    result = await handlers.run_exec(cri, cid, ["sleep", "10"], timeout_s=1)
    assert result == HandlerResult(False, 'command "sleep 10" timed out')

    cri.exec_responder = None
    cri.fail_next("ExecSync", CRIError("ExecSync: UNKNOWN: boom"))
    result = await handlers.run_exec(cri, cid, ["true"], timeout_s=1)
    assert result == HandlerResult(False, "ExecSync: UNKNOWN: boom", error=True)


# -- an in-process HTTP server ---------------------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]


@dataclass
class Web:
    port: int
    requests: list[Seen] = field(default_factory=list)
    stall: asyncio.Event = field(default_factory=asyncio.Event)


def _response(status: int, body: bytes, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    return head.encode() + body


async def _serve(web: Web, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request_line = (await reader.readline()).decode()
        headers: dict[str, str] = {}
        while True:
            line = (await reader.readline()).decode()
            if line in ("\r\n", "\n", ""):
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        path = request_line.split(" ")[1]
        web.requests.append(Seen(path, headers))
        if path.startswith("/ok"):
            writer.write(_response(200, b"all good"))
        elif path == "/fail":
            writer.write(_response(503, b"secret body"))
        elif path == "/same":
            writer.write(_response(302, b"", "Location: /ok?via=redirect\r\n"))
        elif path == "/other":
            location = f"http://localhost:{web.port}/ok"
            writer.write(_response(302, b"moved", f"Location: {location}\r\n"))
        elif path == "/loop":
            writer.write(_response(302, b"", "Location: /loop\r\n"))
        elif path == "/slow":
            await web.stall.wait()
        await writer.drain()
    finally:
        writer.close()


@pytest.fixture
async def web() -> AsyncIterator[Web]:
    box: list[Web] = []
    server = await asyncio.start_server(lambda r, w: _serve(box[0], r, w), "127.0.0.1", 0)
    box.append(Web(server.sockets[0].getsockname()[1]))
    yield box[0]
    box[0].stall.set()
    server.close()
    await server.wait_closed()


async def free_port() -> int:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    return port


async def http(web: Web, **action: Any) -> HandlerResult:
    return await handlers.run_http_get(
        {"port": web.port, **action}, pod_ip="127.0.0.1", container={}, timeout_s=2
    )


async def test_http_success_sends_upstream_headers(web: Web) -> None:
    assert await http(web, path="/ok") == HandlerResult(True, "all good", answered=True)
    seen = web.requests[-1]
    assert seen.path == "/ok"
    assert seen.headers["user-agent"] == "kube-probe/1.34"
    assert seen.headers["accept"] == "*/*"
    assert seen.headers["host"] == f"127.0.0.1:{web.port}"


async def test_http_spec_headers_override_defaults(web: Web) -> None:
    headers = [
        {"name": "User-Agent", "value": "mine"},
        {"name": "Accept", "value": ""},
        {"name": "X-Custom", "value": "1"},
        {"name": "Host", "value": "example.test"},
    ]
    assert (await http(web, path="/ok?x=1", httpHeaders=headers)).ok
    seen = web.requests[-1]
    assert seen.path == "/ok?x=1"
    assert seen.headers["user-agent"] == "mine"
    assert "accept" not in seen.headers
    assert seen.headers["x-custom"] == "1"
    assert seen.headers["host"] == "example.test"


async def test_http_failure_status_hides_the_body(web: Web) -> None:
    assert await http(web, path="/fail") == HandlerResult(
        False, "HTTP probe failed with statuscode: 503", answered=True
    )


async def test_http_port_by_name_and_port_errors(web: Web) -> None:
    container = {"ports": [{"name": "web", "containerPort": web.port}]}
    by_name = await handlers.run_http_get(
        {"port": "web", "path": "/ok"}, pod_ip="127.0.0.1", container=container, timeout_s=2
    )
    assert by_name.ok
    missing = await handlers.run_http_get(
        {"port": "nope"}, pod_ip="127.0.0.1", container=container, timeout_s=2
    )
    assert missing == HandlerResult(
        False, 'strconv.Atoi: parsing "nope": invalid syntax', error=True
    )
    zero = await handlers.run_http_get(
        {"port": 0}, pod_ip="127.0.0.1", container=container, timeout_s=2
    )
    assert zero == HandlerResult(False, "invalid port number: 0", error=True)


async def test_http_redirects(web: Web) -> None:
    same = await http(web, path="/same")
    assert same == HandlerResult(True, "all good", answered=True)
    assert [r.path for r in web.requests] == ["/same", "/ok?via=redirect"]

    other = await http(web, path="/other")
    assert other == HandlerResult(
        True, "Probe terminated redirects, Response body: moved", warning=True, answered=True
    )
    assert web.requests[-1].path == "/other"  # not followed to localhost

    loop = await http(web, path="/loop")
    assert loop == HandlerResult(
        False, f'Get "http://127.0.0.1:{web.port}/loop": stopped after 10 redirects'
    )


async def test_http_timeout_and_refused(web: Web) -> None:
    slow = await handlers.run_http_get(
        {"port": web.port, "path": "/slow"}, pod_ip="127.0.0.1", container={}, timeout_s=0.3
    )
    assert slow == HandlerResult(
        False,
        f'Get "http://127.0.0.1:{web.port}/slow": context deadline exceeded '
        "(Client.Timeout exceeded while awaiting headers)",
    )
    port = await free_port()
    refused = await handlers.run_http_get(
        {"port": port}, pod_ip="127.0.0.1", container={}, timeout_s=2
    )
    assert refused == HandlerResult(
        False,
        f'Get "http://127.0.0.1:{port}/": dial tcp 127.0.0.1:{port}: connect: connection refused',
    )


def self_signed(tmp: Path) -> ssl.SSLContext:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "probe-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    return ctx


async def test_https_without_certificate_verification(tmp_path: Path) -> None:
    box: list[Web] = []
    server = await asyncio.start_server(
        lambda r, w: _serve(box[0], r, w), "127.0.0.1", 0, ssl=self_signed(tmp_path)
    )
    box.append(Web(server.sockets[0].getsockname()[1]))
    try:
        result = await handlers.run_http_get(
            {"port": box[0].port, "path": "/ok", "scheme": "HTTPS"},
            pod_ip="127.0.0.1",
            container={},
            timeout_s=2,
        )
        assert result == HandlerResult(True, "all good", answered=True)
    finally:
        server.close()
        await server.wait_closed()


# -- HTTPS answered in plain HTTP --------------------------------------------------------


@dataclass
class PlainServer:
    """A plain-HTTP server that answers a TLS ClientHello as Go's net/http does (400 Bad
    Request: it cannot parse it as a request), or with `tls_answer` when set; an HTTP
    request gets 200 unless `drop_http` (then the connection is closed unanswered)."""

    port: int = 0
    tls_answer: bytes = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n400 Bad Request"
    drop_http: bool = False
    handshakes: int = 0
    requests: list[str] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.read(1)
            if first == b"\x16":  # a TLS handshake record
                self.handshakes += 1
                writer.write(self.tls_answer)
            elif first:
                head = first + await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head.decode())
                if not self.drop_http:
                    writer.write(_response(200, b"plain"))
            await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def plain() -> AsyncIterator[PlainServer]:
    state = PlainServer()
    server = await asyncio.start_server(state.serve, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    yield state
    server.close()
    await server.wait_closed()


def https_action(port: int) -> dict[str, Any]:
    return {
        "port": port,
        "path": "/hook",
        "scheme": "HTTPS",
        "httpHeaders": [
            {"name": "Authorization", "value": "Bearer secret"},
            {"name": "X-Custom", "value": "kept"},
        ],
    }


async def get_with_fallback(plain: PlainServer) -> HandlerResult:
    """An HTTPS GET at `plain` with the HTTP fallback lifecycle hooks ask for."""
    return await handlers.run_http_get(
        https_action(plain.port),
        pod_ip="127.0.0.1",
        container={},
        timeout_s=2,
        http_fallback=True,
    )


async def test_a_probe_over_https_answered_in_plain_http_fails_as_gos_scheme_mismatch(
    plain: PlainServer,
) -> None:
    result = await handlers.run_http_get(
        https_action(plain.port), pod_ip="127.0.0.1", container={}, timeout_s=2
    )
    assert result == HandlerResult(
        False,
        f'Get "https://127.0.0.1:{plain.port}/hook": '
        "http: server gave HTTP response to HTTPS client",
        scheme_mismatch=True,
    )
    assert (plain.handshakes, plain.requests) == (1, [])  # probes do not fall back


async def test_http_fallback_sends_the_request_again_over_http_without_authorization(
    plain: PlainServer,
) -> None:
    result = await get_with_fallback(plain)
    assert result == HandlerResult(True, "plain", answered=True, fallback=f"127.0.0.1:{plain.port}")
    [request] = plain.requests
    assert request.startswith("GET /hook HTTP/1.1\r\n")
    assert "X-Custom: kept" in request
    assert "authorization" not in request.lower()
    assert plain.handshakes == 1


async def test_an_unanswered_http_fallback_keeps_the_https_error(plain: PlainServer) -> None:
    plain.drop_http = True
    result = await get_with_fallback(plain)
    assert result.scheme_mismatch and not result.ok and result.fallback == ""
    assert result.message.endswith("http: server gave HTTP response to HTTPS client")
    assert len(plain.requests) == 1  # the retry was sent, and got no answer


async def test_an_answer_that_is_neither_tls_nor_http_is_no_scheme_mismatch(
    plain: PlainServer,
) -> None:
    plain.tls_answer = b"SSH-2.0-OpenSSH_9.2\r\n"
    result = await get_with_fallback(plain)
    assert not result.ok and not result.scheme_mismatch and result.fallback == ""
    assert "server gave HTTP response" not in result.message
    assert plain.requests == []  # Go falls back only on an `HTTP/` record; so does klet


# -- tcpSocket -------------------------------------------------------------------------


async def test_tcp_connect_and_refused(web: Web) -> None:
    ok = await handlers.run_tcp({"port": web.port}, pod_ip="127.0.0.1", container={}, timeout_s=2)
    assert ok == HandlerResult(True, "")
    port = await free_port()
    refused = await handlers.run_tcp(
        {"port": port, "host": "127.0.0.1"}, pod_ip="10.255.255.1", container={}, timeout_s=2
    )
    assert refused == HandlerResult(
        False, f"dial tcp 127.0.0.1:{port}: connect: connection refused"
    )


# -- grpc ------------------------------------------------------------------------------


@pytest.fixture
async def health_server() -> AsyncIterator[tuple[int, health_aio.HealthServicer]]:
    server = grpc.aio.server()
    servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield port, servicer
    await server.stop(None)


async def test_grpc_health(health_server: tuple[int, Any]) -> None:
    port, servicer = health_server
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await servicer.set("db", health_pb2.HealthCheckResponse.NOT_SERVING)

    async def check(**action: Any) -> HandlerResult:
        return await handlers.run_grpc({"port": port, **action}, pod_ip="127.0.0.1", timeout_s=2)

    assert await check() == HandlerResult(True, "service healthy")
    assert await check(service="db") == HandlerResult(
        False, 'service unhealthy (responded with "NOT_SERVING")'
    )
    # grpcio's servicer answers NOT_FOUND without details (grpc-go's says "unknown service")
    assert await check(service="nope") == HandlerResult(
        False, "error: health rpc probe failed: rpc error: code = NotFound desc = "
    )


async def test_grpc_without_health_service_or_server() -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        result = await handlers.run_grpc({"port": port}, pod_ip="127.0.0.1", timeout_s=2)
    finally:
        await server.stop(None)
    assert not result.ok
    assert result.message.startswith(
        "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"
    )
    port = await free_port()
    nobody = await handlers.run_grpc({"port": port}, pod_ip="127.0.0.1", timeout_s=0.5)
    assert nobody == HandlerResult(
        False,
        f'timeout: failed to connect service "127.0.0.1:{port}" within 500ms: '
        "context deadline exceeded",
    )
