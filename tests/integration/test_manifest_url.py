"""The manifest-URL source end to end: a PodList served over HTTP becomes running pods,
and a server that answers 500 or stops answering leaves the last good set running."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from klet.devstack import DevStack

from tests.harness.node import KletNode
from tests.harness.pods import running, runtime_containers
from tests.harness.waiting import wait_for


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.klet.test/busybox:1.36",
                    "command": ["sleep", "100000"],
                }
            ],
        },
    }


class Manifests(BaseHTTPRequestHandler):
    mode = "ok"
    body = b""
    requests = 0
    headers_seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).requests += 1
        type(self).headers_seen.append(self.headers.get("X-Klet-Test", ""))
        if self.mode == "error":
            self.send_response(500)
            self.end_headers()
            return
        if self.mode == "hang":
            time.sleep(15)  # past the source's 10 s client timeout
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[Manifests]]]:
    handler = type("Handler", (Manifests,), {"headers_seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/pods", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_url_podlist_and_outages(
    node_factory: Any, server: tuple[str, type[Manifests]], devstack: DevStack
) -> None:
    url, handler = server
    handler.body = json.dumps(
        {"apiVersion": "v1", "kind": "PodList", "items": [pod("url-a"), pod("url-b")]}
    ).encode()
    node: KletNode = node_factory(
        manifest_url=url, extra_flags=["--manifest-url-header", "X-Klet-Test:yes"]
    )
    node.start()
    for name in ("url-a", "url-b"):
        wait_for(lambda name=name: running(node, name), timeout_s=20, what=f"{name} Running")
    assert "yes" in handler.headers_seen
    pod_a = node.pods()[f"url-a-{node.node_name}"]
    assert pod_a["metadata"]["annotations"]["kubernetes.io/config.source"] == "http"
    before = runtime_containers(devstack, f"url-a-{node.node_name}")

    handler.mode = "error"
    seen = handler.requests
    wait_for(lambda: handler.requests >= seen + 3, timeout_s=15, what="three polls answered 500")
    assert running(node, "url-a") and running(node, "url-b")

    handler.mode = "hang"
    wait_for(
        lambda: "no complete answer within 10s" in node.log("pod-source"),
        timeout_s=25,
        what="a poll that ran into the client timeout",
    )
    assert running(node, "url-a") and running(node, "url-b")
    assert runtime_containers(devstack, f"url-a-{node.node_name}") == before

    handler.mode = "ok"
    handler.body = json.dumps(
        {"apiVersion": "v1", "kind": "PodList", "items": [pod("url-b")]}
    ).encode()
    wait_for(
        lambda: f"url-a-{node.node_name}" not in node.pods(),
        timeout_s=30,
        what="url-a removed once the URL answers without it",
    )
    assert running(node, "url-b")
