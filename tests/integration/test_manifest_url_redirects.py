"""The manifest-URL source and redirects, against real local HTTP and HTTPS servers.

Also its encodings: it asks for `identity`; a gzip body is decoded, and a gzip bomb
(64 KiB that inflate to 64 MiB) is refused as too large, keeping the last good set.

An https URL redirected to http is refused (the pods would travel without TLS); a
redirect to another host is refused while custom headers are configured, and that host
never sees the headers; without custom headers it is followed, and a redirect on the
same host keeps the headers. A refused redirect keeps the last good set (no snapshot),
reported with the reason. `redirect_problem` itself is checked case by case.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from klet.obs import new_registry
from klet.pod_source.inbox import Inbox
from klet.pod_source.metrics import create_metrics
from klet.pod_source.sources.http import HttpSource, redirect_problem
from klet.testbed.pki import CertificateAuthority

BODY = json.dumps(
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "redirected"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
).encode()


class Server:
    """A local server that answers every GET with `answer(path)` and records headers."""

    def __init__(self, answer: Callable[[str], tuple[int, dict[str, str], bytes]]) -> None:
        self.seen: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                server.seen.append(dict(self.headers.items()))
                status, headers, body = answer(self.path)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]

    def start(self) -> Server:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def ok(_path: str) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, BODY


def redirect_to(location: str) -> Callable[[str], tuple[int, dict[str, str], bytes]]:
    return lambda _path: (302, {"Location": location}, b"")


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting it) for 127.0.0.1."""
    ca = CertificateAuthority.create(tmp_path / "ca", "redirect-test-ca")
    pair = ca.issue("127.0.0.1", ip_addresses=["127.0.0.1"], server=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(pair.cert, pair.key)
    client_ctx = ssl.create_default_context(cafile=str(ca.cert_path))
    return server_ctx, client_ctx


def poll(
    url: str, *, headers: dict[str, list[str]] | None = None, verify: Any = True
) -> tuple[list[Any] | None, list[str]]:
    """One poll of a real HttpSource: (the pods offered or None, the errors counted)."""
    inbox = Inbox()
    metrics = create_metrics(new_registry())
    source = HttpSource(
        url=url,
        headers=headers or {},
        node_name="node1",
        period_s=60,
        inbox=inbox,
        metrics=metrics,
        timeout_s=5,
        tls_verify=verify,
    )

    async def go() -> None:
        async with source._client() as client:
            await source.run_once(client)

    asyncio.run(go())
    pending, _ = inbox.take()
    errors = [
        f"{s.labels['reason']}"
        for metric in metrics.manifest_errors.collect()
        for s in metric.samples
        if s.name.endswith("_total") and s.value
    ]
    return pending.get("http"), errors


def test_gzip_is_decoded_and_a_gzip_bomb_refused(servers: list[Server]) -> None:
    small = Server(lambda _p: (200, {"Content-Encoding": "gzip"}, gzip.compress(BODY))).start()
    bomb = gzip.compress(b" " * (64 << 20))
    large = Server(lambda _p: (200, {"Content-Encoding": "gzip"}, bomb)).start()
    servers += [small, large]
    pods, errors = poll(f"http://127.0.0.1:{small.port}/pods")
    assert pods is not None and [p["metadata"]["name"] for p in pods] == ["redirected-node1"]
    assert small.seen[0].get("Accept-Encoding") == "identity"
    pods, errors = poll(f"http://127.0.0.1:{large.port}/pods")
    assert pods is None and errors == ["too_large"]


def test_https_redirected_to_http_is_refused(
    servers: list[Server], tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    plain = Server(ok).start()
    secure = Server(redirect_to(f"http://127.0.0.1:{plain.port}/pods"))
    secure.httpd.socket = tls[0].wrap_socket(secure.httpd.socket, server_side=True)
    secure.start()
    servers += [plain, secure]
    pods, errors = poll(f"https://127.0.0.1:{secure.port}/pods", verify=tls[1])
    assert pods is None and errors == ["read"]
    assert secure.seen and not plain.seen  # the http URL was never fetched


def test_https_on_the_same_host_is_followed(
    servers: list[Server], tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    target = Server(ok)
    target.httpd.socket = tls[0].wrap_socket(target.httpd.socket, server_side=True)
    first = Server(redirect_to(f"https://127.0.0.1:{target.port}/pods"))
    first.httpd.socket = tls[0].wrap_socket(first.httpd.socket, server_side=True)
    servers += [target.start(), first.start()]
    pods, errors = poll(f"https://127.0.0.1:{first.port}/pods", verify=tls[1])
    assert errors == [] and pods and pods[0]["metadata"]["name"] == "redirected-node1"


def test_cross_host_redirect_with_custom_headers_is_refused(servers: list[Server]) -> None:
    other = Server(ok).start()  # "localhost" is another host than "127.0.0.1" for the client
    first = Server(redirect_to(f"http://localhost:{other.port}/pods")).start()
    servers += [other, first]
    url = f"http://127.0.0.1:{first.port}/pods"
    pods, errors = poll(url, headers={"X-Token": ["s3cret"]})
    assert pods is None and errors == ["read"]
    assert first.seen[0]["X-Token"] == "s3cret"
    assert not other.seen  # the token never left for the other host

    pods, errors = poll(url)  # without custom headers the redirect is harmless
    assert errors == [] and pods and pods[0]["metadata"]["name"] == "redirected-node1"


def test_same_host_redirect_keeps_the_headers(servers: list[Server]) -> None:
    first = Server(lambda path: ok(path) if path == "/v2" else (301, {"Location": "/v2"}, b""))
    servers.append(first.start())
    pods, errors = poll(f"http://127.0.0.1:{first.port}/pods", headers={"X-Token": ["t"]})
    assert errors == [] and pods
    assert [s.get("X-Token") for s in first.seen] == ["t", "t"]


def test_a_redirect_loop_ends(servers: list[Server]) -> None:
    loop = Server(redirect_to("/again"))
    servers.append(loop.start())
    pods, errors = poll(f"http://127.0.0.1:{loop.port}/pods")
    assert pods is None and errors == ["read"]
    assert len(loop.seen) == 11  # the first request and ten redirects


@pytest.mark.parametrize(
    ("origin", "target", "headers", "refused"),
    [
        ("https://a/x", "http://a/x", False, "https to"),
        ("https://a/x", "https://b/x", False, None),
        ("http://a/x", "https://a/x", True, None),  # an upgrade on the default ports
        ("http://a/x", "http://a:8080/x", True, "another host"),
        ("http://a/x", "http://A/y", True, None),
        ("http://a/x", "http://b/x", True, "another host"),
        ("http://a/x", "http://b/x", False, None),
        ("http://a/x", "file:///etc/passwd", False, "not an http"),
    ],
)
def test_redirect_problem(origin: str, target: str, headers: bool, refused: str | None) -> None:
    problem = redirect_problem(httpx.URL(origin), httpx.URL(target), custom_headers=headers)
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem
