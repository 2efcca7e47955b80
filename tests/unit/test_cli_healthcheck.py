"""`klet healthcheck <service>` (klet.cli.healthcheck): the URL it checks — the port
from the replica's own port file when KLET_SERVICE_PORT_FILE is set (no file yet: "not
listening yet"; someone else's or a malformed one: a failure), else KLET_SERVICE_PORT
or the service's default (0 cannot be checked without the file), a wildcard address
reached on loopback — and its exit codes against a real HTTP server answering 200, 500
or nothing, found through the port file or the variable."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.cli.healthcheck import NotChecked, healthcheck, healthz_url
from klet.devstack import free_port
from klet.portfiles import PortFiles, PortRecord


def test_url_defaults_to_the_service_port() -> None:
    assert healthz_url("syncloop", {}) == "http://127.0.0.1:10261/healthz"
    assert healthz_url("image-gc", {"KLET_SERVICE_PORT": ""}) == "http://127.0.0.1:10264/healthz"


def test_port_zero_needs_the_port_file() -> None:
    with pytest.raises(NotChecked, match="KLET_SERVICE_PORT=0 .* needs KLET_SERVICE_PORT_FILE"):
        healthz_url("image-gc", {"KLET_SERVICE_PORT": "0"})
    with pytest.raises(NotChecked, match="invalid integer"):
        healthz_url("image-gc", {"KLET_SERVICE_PORT": "x"})


def test_url_from_the_port_file(tmp_path: Path) -> None:
    path = tmp_path / "port.json"
    env = {"KLET_SERVICE_PORT_FILE": str(path), "KLET_SERVICE_PORT": "0"}
    with pytest.raises(NotChecked, match=f"eviction: not listening yet \\(no {path}\\)"):
        healthz_url("eviction", env)
    for host, url in [
        ("127.0.0.1", "http://127.0.0.1:41000/healthz"),
        ("0.0.0.0", "http://127.0.0.1:41000/healthz"),
        ("::", "http://[::1]:41000/healthz"),
        ("10.1.2.3", "http://10.1.2.3:41000/healthz"),
    ]:
        path.write_text(PortRecord("eviction", host, 41000, 7, "node-a").to_json())
        assert healthz_url("eviction", env) == url
    # The file wins over the variable and the bind address.
    env |= {"KLET_SERVICE_PORT": "12000", "KLET_SERVICE_BIND_ADDRESS": "10.9.9.9"}
    assert healthz_url("eviction", env) == "http://10.1.2.3:41000/healthz"
    with pytest.raises(NotChecked, match="a port file of eviction, not of syncloop"):
        healthz_url("syncloop", env)
    path.write_text("{half a reco")
    with pytest.raises(NotChecked, match="cannot read"):
        healthz_url("eviction", env)


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
    monkeypatch.delenv("KLET_SERVICE_PORT_FILE", raising=False)
    _Healthz.status = 200
    assert healthcheck(["syncloop"]) == 0
    _Healthz.status = 500
    assert healthcheck(["syncloop"]) == 1
    assert "500" in capsys.readouterr().err
    server.server_close()  # nothing listens any more
    assert healthcheck(["syncloop"], timeout_s=1.0) == 1
    assert healthcheck(["nosuch"]) == 2
    assert healthcheck([]) == 2


def test_exit_codes_through_the_port_file(
    server: http.server.HTTPServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As a container health check runs it: the replica's file, written as the service
    writes it; a port in KLET_SERVICE_PORT (nothing listens there) is not used."""
    path = tmp_path / "port.json"
    monkeypatch.setenv("KLET_SERVICE_PORT_FILE", str(path))
    monkeypatch.setenv("KLET_SERVICE_PORT", str(free_port()))
    _Healthz.status = 200
    assert healthcheck(["syncloop"]) == 1
    assert "not listening yet" in capsys.readouterr().err
    replica = PortFiles("syncloop", run_dir=None, private_file=path)
    replica.publish("127.0.0.1", server.server_address[1])
    assert healthcheck(["syncloop"]) == 0
    _Healthz.status = 500
    assert healthcheck(["syncloop"]) == 1
    assert "500" in capsys.readouterr().err
    _Healthz.status = 200
    replica.withdraw()  # the service stopped cleanly
    assert healthcheck(["syncloop"]) == 1
    assert "not listening yet" in capsys.readouterr().err
