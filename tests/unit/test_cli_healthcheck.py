"""`klet healthcheck <service>` (klet.cli.healthcheck): the URL it checks (the service's
port from KLET_SERVICE_PORT or its default, a wildcard bind address reached on
loopback) and its exit codes against a real HTTP server answering 200, 500 or nothing."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from klet.cli.healthcheck import healthcheck, healthz_url
from klet.devstack import free_port


def test_url_defaults_to_the_service_port() -> None:
    assert healthz_url("syncloop", {}) == "http://127.0.0.1:10261/healthz"
    assert healthz_url("image-gc", {"KLET_SERVICE_PORT": "0"}) == "http://127.0.0.1:10264/healthz"


def test_url_follows_the_service_environment() -> None:
    env = {"KLET_SERVICE_PORT": "12000", "KLET_SERVICE_BIND_ADDRESS": "0.0.0.0"}
    assert healthz_url("eviction", env) == "http://127.0.0.1:12000/healthz"
    env = {"KLET_SERVICE_PORT": "12000", "KLET_SERVICE_BIND_ADDRESS": "::"}
    assert healthz_url("eviction", env) == "http://[::1]:12000/healthz"
    env = {"KLET_SERVICE_BIND_ADDRESS": "10.1.2.3"}
    assert healthz_url("pod-source", env) == "http://10.1.2.3:10260/healthz"


class _Healthz(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        ok = self.path == "/healthz" and self.status == 200
        body = b"[+]bus ok\nhealthz check passed\n" if ok else b"[-]bus failed\n"
        self.send_response(200 if ok else 500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.HTTPServer]:
    srv = http.server.HTTPServer(("127.0.0.1", free_port()), _Healthz)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_exit_codes(
    server: http.server.HTTPServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KLET_SERVICE_PORT", str(server.server_address[1]))
    monkeypatch.delenv("KLET_SERVICE_BIND_ADDRESS", raising=False)
    _Healthz.status = 200
    assert healthcheck(["syncloop"]) == 0
    _Healthz.status = 500
    assert healthcheck(["syncloop"]) == 1
    assert "500" in capsys.readouterr().err
    server.server_close()  # nothing listens any more
    assert healthcheck(["syncloop"], timeout_s=1.0) == 1
    assert healthcheck(["nosuch"]) == 2
    assert healthcheck([]) == 2
