"""Token users of a kubeconfig: `KubeClient` sends their bearer token on requests and
watches (it went out anonymous, so a ServiceAccount kubeconfig — the Helm chart's
rbac.create mode and its helm test pod — got 403 as system:anonymous); a `tokenFile` is
read relative to the kubeconfig and again after the kubelet rotates it; a user with a
client certificate gets no header; a missing token file is an error at start."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from klet.kube import KubeClient, KubeSettings
from klet.kube.tokens import BearerToken, KubeconfigError


def kubeconfig(path: Path, user: dict[str, Any], *, server: str = "http://127.0.0.1:1") -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def rotate(path: Path, token: str) -> None:
    """As the kubelet updates a projected token: a new file renamed over the old."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(token)
    os.replace(tmp, path)


def test_a_token_file_is_read_relative_to_the_kubeconfig_and_again_after_rotation(
    tmp_path: Path,
) -> None:
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "token").write_text("first\n")
    token = BearerToken.from_kubeconfig(
        kubeconfig(tmp_path / "kubeconfig", {"tokenFile": "sa/token"})
    )
    assert token is not None
    assert token.header() == "Bearer first"
    rotate(tmp_path / "sa" / "token", "second")
    assert token.header() == "Bearer second"


def test_a_token_wins_over_a_token_file_and_a_certificate_user_has_none(tmp_path: Path) -> None:
    both = kubeconfig(tmp_path / "both", {"token": "fixed", "tokenFile": "/nowhere"})
    token = BearerToken.from_kubeconfig(both)
    assert token is not None and token.header() == "Bearer fixed"
    cert = kubeconfig(tmp_path / "cert", {"client-certificate": "c.crt", "client-key": "c.key"})
    assert BearerToken.from_kubeconfig(cert) is None


def test_a_missing_token_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match="tokenFile .*/missing"):
        BearerToken.from_kubeconfig(kubeconfig(tmp_path / "k", {"tokenFile": "missing"}))


def test_a_vanished_token_file_keeps_the_last_token(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text("kept")
    token = BearerToken(token_file=file)
    assert token.header() == "Bearer kept"
    file.unlink()
    assert token.header() == "Bearer kept"


class Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server hook
        Recorder.seen.append((self.path, self.headers.get("Authorization")))
        body = b'{"kind": "Node"}' if "watch" not in self.path else b""
        if "watch" in self.path:
            body = b'{"type": "ADDED", "object": {"kind": "Node"}}\n'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


async def test_requests_and_watches_carry_the_current_token(tmp_path: Path, server: str) -> None:
    (tmp_path / "token").write_text("first")
    config = kubeconfig(tmp_path / "kubeconfig", {"tokenFile": "token"}, server=server)
    client = KubeClient(KubeSettings(kubeconfig=config))
    try:
        await client.get("/api/v1/nodes/n1")
        rotate(tmp_path / "token", "second")
        events = [e async for e in client.watch("/api/v1/nodes", resource_version="1")]
        assert [e.type for e in events] == ["ADDED"]
    finally:
        await client.close()
    assert [auth for _, auth in Recorder.seen] == ["Bearer first", "Bearer second"]


async def test_a_certificate_user_sends_no_authorization(tmp_path: Path, server: str) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", {}, server=server)
    client = KubeClient(KubeSettings(kubeconfig=config))
    try:
        await client.get("/api/v1/nodes/n1")
    finally:
        await client.close()
    assert [auth for _, auth in Recorder.seen] == [None]
