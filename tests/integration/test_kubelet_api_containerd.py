"""The kubelet HTTPS API against real containerd: a KletNode runs a static pod, and the
API is served in this process (a thread of its own) over the status-reporter's real pod
view (Redis) and a real CRI client, with certificates from a test CA.

Covers: /pods is 401 without credentials and 200 with a client certificate; /healthz
(with upstream's named checks, syncloop's asked of the node's real syncloop, and their
record on /metrics/slis), /runningpods/ and /stats/summary report the running pod (its
emptyDir's usage, its network namespace's counters after a request to it, the node's
network with the default route's interface first);
containerLogs returns what the container printed, honours tailLines and follows new
lines as they are written; exec through the streaming proxy to containerd's stream
server (WebSocket, channel protocol v4) runs a command with stdout and stderr kept apart
and feeds stdin; portForward over WebSocket reaches the pod's httpd; /metrics/cadvisor
shows a busy container's CPU counter growing between two scrapes, its memory and limits
and the pod's network with cAdvisor's labels; /checkpoint answers containerd 1.6's
Unimplemented as upstream's 500; PSI (KubeletPSI) as this host has it: the node's from
/proc/pressure, none for a cgroup v1 host's pods and containers. SPDY (kubectl) is
covered by the cluster test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websocket
from klet.config import Settings, load_settings
from klet.config.kubelet import (
    KubeletAnonymousAuthentication,
    KubeletAuthentication,
    KubeletAuthorization,
    KubeletWebhookAuthentication,
    KubeletX509Authentication,
)
from klet.cri import CRISettings, RuntimeClient
from klet.devstack import free_port
from klet.kube.client import KubeClient
from klet.stats.model import parse_default_route
from klet.status_reporter.kubeletapi import build_kubelet_api_deps
from klet.status_reporter.kubeletapi.server import serve_kubelet_api
from klet.status_reporter.pods.podcache import CachePolicy
from klet.status_reporter.wiring import Overrides, build_deps
from klet.testbed.pki import CertificateAuthority, CertPair
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

TALKER = """
apiVersion: v1
kind: Pod
metadata:
  name: talker
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: talk
      image: registry.klet.test/busybox:1.36
      command:
        - sh
        - -c
        - >-
          for i in 1 2 3 4 5; do echo hello-$i; done;
          i=0; while true; do i=$((i+1)); echo tick-$i; sleep 0.3; done
    - name: web
      image: registry.klet.test/httpd:1.36
      command:
        - sh
        - -c
        - echo served-through-port-forward > /www/index.html && exec httpd -f -p 8080 -h /www
      volumeMounts:
        - name: www
          mountPath: /www
  volumes:
    - name: www
      emptyDir: {}
"""


class KubeletApiThread:
    """serve_kubelet_api, with the status-reporter's pod view refreshing under it, on an
    event loop in a thread of its own (the tests' clients are blocking)."""

    def __init__(self, settings: Settings, *, kubeconfig: Path | None = None) -> None:
        self.settings = settings
        self.kubeconfig = kubeconfig
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kubelet-api", daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.settings.kubelet.port}"

    def __enter__(self) -> KubeletApiThread:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"kubelet API did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # noqa: BLE001 - reported to the starting thread
            self._error = err
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        reporter = build_deps(
            self.settings, overrides=Overrides(policy=CachePolicy(reload_interval_s=0.5))
        )
        k = self.settings.kubelet
        cri = RuntimeClient(CRISettings(runtime_endpoint=k.container_runtime_endpoint))
        kube = None
        if self.kubeconfig is not None:
            from klet.kube import KubeSettings

            kube = KubeClient(KubeSettings(kubeconfig=self.kubeconfig))
        deps = build_kubelet_api_deps(
            self.settings,
            pods=reporter.pods,
            runtime=cri,
            # Not the reporter's: build_deps already registered the API's metrics there.
            registry=CollectorRegistry(),
            apiserver=kube,
        )
        ready = asyncio.Event()
        tasks = [
            asyncio.create_task(reporter.pods.run_reloader()),
            asyncio.create_task(reporter.pods.run_consumer()),
            asyncio.create_task(serve_kubelet_api(deps, ready=ready)),
        ]
        try:
            await reporter.pods.loaded.wait()
            await ready.wait()
            self._ready.set()
            stop = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stop:
                    t.result()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await cri.close()
            if kube is not None:
                await kube.close()
            await reporter.close()


def api_settings(
    node: KletNode,
    *,
    ca: CertificateAuthority,
    serving: CertPair,
    authorization: str = "AlwaysAllow",
    webhook: bool = False,
    extra_flags: tuple[str, ...] = (),
) -> Settings:
    settings = load_settings(
        [*node.flags, *node.redis_flags("status-reporter"), *extra_flags],
        env={},
        service="status-reporter",
    )
    kubelet = dataclasses.replace(
        settings.kubelet,
        address="127.0.0.1",
        port=free_port(),
        tls_cert_file=str(serving.cert),
        tls_private_key_file=str(serving.key),
        authentication=KubeletAuthentication(
            x509=KubeletX509Authentication(client_ca_file=str(ca.cert_path)),
            webhook=KubeletWebhookAuthentication(enabled=webhook),
            anonymous=KubeletAnonymousAuthentication(enabled=False),
        ),
        authorization=KubeletAuthorization(mode=authorization),
    )
    return dataclasses.replace(settings, kubelet=kubelet)


@dataclasses.dataclass
class Client:
    """Blocking HTTPS and WebSocket access to the API as one identity."""

    url: str
    ca: Path
    cert: CertPair | None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if self.cert is not None:
            ctx.load_cert_chain(str(self.cert.cert), str(self.cert.key))
        return ctx

    def get(self, path: str, *, timeout_s: float = 10) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(
                self.url + path, context=self.context(), timeout=timeout_s
            ) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            with err:
                return err.code, err.read()

    def post(self, path: str, *, timeout_s: float = 30) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, data=b"", method="POST")
        try:
            with urllib.request.urlopen(request, context=self.context(), timeout=timeout_s) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            with err:
                return err.code, err.read()

    def websocket(self, path: str, protocol: str) -> websocket.WebSocket:
        sslopt: dict[str, Any] = {"ca_certs": str(self.ca)}
        if self.cert is not None:
            sslopt |= {"certfile": str(self.cert.cert), "keyfile": str(self.cert.key)}
        return websocket.create_connection(
            self.url.replace("https://", "wss://") + path,
            subprotocols=[protocol],
            sslopt=sslopt,
            timeout=15,
        )


def exec_ws(client: Client, path: str, stdin: bytes = b"") -> tuple[bytes, bytes, dict[str, Any]]:
    """Run an exec over WebSocket (v4.channel.k8s.io): (stdout, stderr, status)."""
    ws = client.websocket(path, "v4.channel.k8s.io")
    out, err, status = bytearray(), bytearray(), {}
    try:
        if stdin:
            ws.send_binary(b"\x00" + stdin)
        while True:
            try:
                opcode, data = ws.recv_data()
            except websocket.WebSocketConnectionClosedException:
                break
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                break
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == 1:
                out += payload
            elif channel == 2:
                err += payload
            elif channel == 3:
                status = json.loads(payload)
    finally:
        ws.close()
        ws.shutdown()  # close() leaves the socket open when the server closed first
    return bytes(out), bytes(err), status


@pytest.fixture
def pki(tmp_path: Path) -> tuple[CertificateAuthority, CertPair, CertPair]:
    ca = CertificateAuthority.create(tmp_path / "pki", "kubelet-api-test-ca")
    serving = ca.issue(
        "system:node:test",
        ["system:nodes"],
        ip_addresses=["127.0.0.1"],
        server=True,
        name="serving",
    )
    admin = ca.issue("test-admin", ["system:masters"], client=True, name="admin")
    return ca, serving, admin


@pytest.fixture
def talker(node_factory: Any, manifests: Path) -> KletNode:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "talker.yaml").write_text(TALKER)

    def running() -> bool:
        pod = node.pods().get(f"talker-{node.node_name}")
        return bool(
            pod
            and pod["status"].get("phase") == "Running"
            and bool(statuses := pod["status"].get("containerStatuses"))
            and all(c["ready"] for c in statuses)
        )

    wait_for(running, timeout_s=30, what="talker Running")
    return node


@contextlib.contextmanager
def serving_api(
    node: KletNode, pki: tuple[CertificateAuthority, CertPair, CertPair]
) -> Iterator[tuple[Client, Client, str]]:
    ca, serving, admin = pki
    with KubeletApiThread(api_settings(node, ca=ca, serving=serving)) as api:
        yield (
            Client(api.url, ca.cert_path, admin),
            Client(api.url, ca.cert_path, None),
            f"talker-{node.node_name}",
        )


def test_pods_logs_stats_and_auth(talker: KletNode, pki: Any) -> None:
    with serving_api(talker, pki) as (admin, anonymous, pod):
        assert anonymous.get("/pods") == (401, b"Unauthorized")
        status, body = admin.get("/pods")
        assert status == 200
        assert pod in {p["metadata"]["name"] for p in json.loads(body)["items"]}
        assert admin.get("/healthz") == (200, b"ok")
        # upstream's named checks: syncloop is the node's real one, asked on its port
        assert admin.get("/healthz?verbose") == (
            200,
            b"[+]ping ok\n[+]log ok\n[+]syncloop ok\nhealthz check passed\n",
        )
        assert admin.get("/healthz/syncloop") == (200, b"ok")
        slis = admin.get("/metrics/slis")[1].decode()
        assert 'kubernetes_healthcheck{name="syncloop",type="healthz"} 1.0' in slis
        assert (
            'kubernetes_healthchecks_total{name="syncloop",status="success",type="healthz"} 2.0'
            in slis
        )
        running = json.loads(admin.get("/runningpods/")[1])
        [entry] = [p for p in running["items"] if p["metadata"]["name"] == pod]
        assert {c["name"] for c in entry["spec"]["containers"]} == {"talk", "web"}
        summary = json.loads(admin.get("/stats/summary")[1])
        assert summary["node"]["memory"]["workingSetBytes"] > 0
        [stats] = [p for p in summary["pods"] if p["podRef"]["name"] == pod]
        assert {c["name"] for c in stats["containers"]} == {"talk", "web"}
        assert all(c["memory"]["workingSetBytes"] > 0 for c in stats["containers"])
        [www] = stats["volume"]  # the emptyDir, with index.html in it, as du counts it
        assert www["name"] == "www" and www["inodesUsed"] == 2 and www["usedBytes"] >= 4096
        assert www["capacityBytes"] == summary["node"]["fs"]["capacityBytes"]
        # upstream's ephemeral-storage sum: the writable layers, their logs, the emptyDir
        layers = sum(
            c["rootfs"]["usedBytes"] + c["logs"]["usedBytes"]
            for c in stats["containers"]
            if "rootfs" in c
        )
        ephemeral = stats["ephemeral-storage"]
        assert ephemeral["usedBytes"] == layers + www["usedBytes"] >= www["usedBytes"]
        assert ephemeral["capacityBytes"] == summary["node"]["fs"]["capacityBytes"]

        # network: the pod's own namespace (its eth0 carried a request from this host to
        # its httpd) and the node's, whose default is the default route's interface
        [listed] = [p for p in json.loads(body)["items"] if p["metadata"]["name"] == pod]
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(f"http://{listed['status']['podIP']}:8080/", timeout=10) as r:
            assert r.read() == b"served-through-port-forward\n"
        summary = json.loads(admin.get("/stats/summary")[1])
        [stats] = [p for p in summary["pods"] if p["podRef"]["name"] == pod]
        network = stats["network"]
        assert network["name"] == "eth0" and network["interfaces"][0]["name"] == "eth0"
        assert network["rxBytes"] > 0 and network["txBytes"] > 0
        assert "lo" not in {i["name"] for i in network["interfaces"]}
        node_net = summary["node"]["network"]
        route = Path("/proc/net/route").read_text()
        assert node_net["name"] == parse_default_route(route)
        assert node_net["interfaces"][0]["name"] == node_net["name"]
        assert node_net["rxBytes"] > 0

        logs = f"/containerLogs/default/{pod}/talk"

        def ticked() -> str | None:
            text = admin.get(logs)[1].decode()
            return text if "tick-2" in text else None

        text = wait_for(ticked, timeout_s=10, what="ticks in the log")
        assert text.startswith("hello-1\nhello-2\nhello-3\nhello-4\nhello-5\ntick-1\n")
        tail = admin.get(logs + "?tailLines=2")[1].decode().splitlines()
        assert len(tail) == 2 and all(t.startswith("tick-") for t in tail)
        assert admin.get(logs + "?tailLines=-1")[0] == 422
        assert admin.get(f"/containerLogs/default/{pod}/nope")[0] == 404

        # follow: the lines printed after the request arrive on the open response
        last = int(tail[-1].split("-")[1])
        with urllib.request.urlopen(
            admin.url + logs + "?follow=true&tailLines=1", context=admin.context(), timeout=10
        ) as r:
            seen = [r.readline().decode().strip() for _ in range(4)]
        numbers = [int(s.split("-")[1]) for s in seen]
        assert numbers == list(range(numbers[0], numbers[0] + 4)) and numbers[-1] > last + 1


def test_checkpoint_on_a_runtime_without_it(talker: KletNode, pki: Any) -> None:
    """containerd 1.6 has no CheckpointContainer: the answer is upstream's 500 with the
    runtime's Unimplemented status in gRPC's Go form, which clients (upstream's e2e spec)
    read as "the runtime does not implement it", not a 404."""
    with serving_api(talker, pki) as (admin, _, pod):
        status, body = admin.post(f"/checkpoint/default/{pod}/talk?timeout=5")
        assert status == 500, body
        text = body.decode()
        assert text.startswith(f"checkpointing of default/{pod}/talk failed (rpc error: "), text
        assert (
            "code = Unimplemented desc = unknown method CheckpointContainer" in text
            or "code = Unimplemented desc = method CheckpointContainer not implemented" in text
        ), text
        assert admin.post(f"/checkpoint/default/{pod}/nope")[0] == 404


def test_exec_and_port_forward_through_the_proxy(talker: KletNode, pki: Any) -> None:
    with serving_api(talker, pki) as (admin, anonymous, pod):
        out, err, status = exec_ws(
            admin,
            f"/exec/default/{pod}/talk?command=sh&command=-c"
            "&command=echo+exec-ok;+echo+oops+>%262;+cat+/etc/hostname&output=1&error=1",
        )
        assert out.decode().splitlines()[0] == "exec-ok" and err == b"oops\n"
        assert out.decode().splitlines()[1] == pod
        assert status.get("status") == "Success"
        out, _, _ = exec_ws(
            admin,
            f"/exec/default/{pod}/talk?command=sh&command=-c&command=read+x;+echo+got-$x"
            "&input=1&output=1&error=1",
            stdin=b"typed-in\n",
        )
        assert out == b"got-typed-in\n"
        assert anonymous.get(f"/exec/default/{pod}/talk?command=ls&output=1")[0] == 401

        ws = admin.websocket(f"/portForward/default/{pod}?port=8080", "v4.channel.k8s.io")
        try:
            ws.send_binary(b"\x00" + b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n")
            received = bytearray()
            deadline = time.monotonic() + 10
            while b"served-through-port-forward" not in received and time.monotonic() < deadline:
                opcode, data = ws.recv_data()
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    break
                if data and data[0] == 0:
                    received += data[1:]
        finally:
            ws.close()
            ws.shutdown()  # close() leaves the socket open when the server closed first
        # Each channel's first message is the port, little-endian, then the data.
        assert received[:2] == struct.pack("<H", 8080)
        assert b"served-through-port-forward" in received


BURNER = """
apiVersion: v1
kind: Pod
metadata:
  name: burner
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: burn
      image: registry.klet.test/busybox:1.36
      command: [sh, -c, "while :; do :; done"]
      resources:
        limits: {cpu: 200m, memory: 64Mi}
"""


def cadvisor_samples(client: Client) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, body = client.get("/metrics/cadvisor", timeout_s=20)
    assert status == 200
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_metrics_cadvisor_of_a_busy_container(node_factory: Any, manifests: Path, pki: Any) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "burner.yaml").write_text(BURNER)
    pod = f"burner-{node.node_name}"

    def pod_ip() -> str | None:
        p = node.pods().get(pod)
        running = p and p["status"].get("phase") == "Running"
        return p["status"].get("podIP") if running and p else None

    ip = wait_for(pod_ip, timeout_s=30, what="burner Running with an IP")
    # Some traffic into the pod's network namespace (refused: nothing listens there).
    with contextlib.suppress(OSError), socket.create_connection((ip, 9), timeout=2):
        pass
    ca, serving, admin_cert = pki
    with KubeletApiThread(api_settings(node, ca=ca, serving=serving)) as api:
        admin = Client(api.url, ca.cert_path, admin_cert)
        first = cadvisor_samples(admin)
        time.sleep(1.5)
        second = cadvisor_samples(admin)

    def burn(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
        [value] = [v for labels, v in samples[name] if labels["container"] == "burn"]
        return value

    [(labels, _)] = [
        (lb, v)
        for lb, v in second["container_cpu_usage_seconds_total"]
        if lb["container"] == "burn"
    ]
    assert labels["pod"] == pod and labels["namespace"] == "default" and labels["cpu"] == "total"
    assert "busybox" in labels["image"]
    assert labels["id"].startswith("/kubepods/") and labels["id"].endswith(labels["name"])
    cpu = "container_cpu_usage_seconds_total"
    assert burn(second, cpu) > burn(first, cpu) + 0.05  # a busy loop under a 200m limit
    assert burn(second, "container_memory_working_set_bytes") > 0
    assert burn(second, "container_spec_memory_limit_bytes") == 64 << 20
    assert burn(second, "container_spec_cpu_quota") == 20000  # 200m of a 100 ms period
    assert burn(second, "container_cpu_cfs_periods_total") > 0

    # the pod's own series: container="" and its network namespace's interfaces
    pod_series = [
        (lb, v) for lb, v in second["container_network_receive_bytes_total"] if lb["pod"] == pod
    ]
    assert pod_series and all(lb["container"] == "" for lb, _ in pod_series)
    assert any(lb["interface"] == "eth0" and v > 0 for lb, v in pod_series)
    assert any(
        lb["pod"] == pod and lb["container"] == "" and v > 0
        for lb, v in second["container_memory_working_set_bytes"]
    )
    # the root cgroup, without pod labels, and the machine
    [(root, _)] = [
        (lb, v) for lb, v in second["container_cpu_usage_seconds_total"] if lb["id"] == "/"
    ]
    assert root["pod"] == root["namespace"] == root["container"] == ""
    assert second["machine_cpu_cores"][0][1] >= 1
    assert second["container_scrape_error"] == [({}, 0.0)]


def test_psi_as_this_host_has_it(talker: KletNode, pki: Any) -> None:
    """KubeletPSI on the real host: the node's PSI in /stats/summary and on the root's
    cAdvisor series where the kernel has /proc/pressure; the pods' and containers' only
    on a cgroup v2 host (this machine's cgroup v1 hierarchies have no pressure files, so
    theirs are absent, not zeros)."""
    node_psi = all(
        (Path("/proc/pressure") / r).is_file() for r in ("cpu", "memory", "io")
    ) and bool(Path("/proc/pressure/cpu").read_text().strip())
    unified = Path("/sys/fs/cgroup/cgroup.controllers").is_file()
    with serving_api(talker, pki) as (admin, _, pod):
        summary = json.loads(admin.get("/stats/summary")[1])
        samples = cadvisor_samples(admin)
    node = summary["node"]
    if node_psi:
        for part in (node["cpu"], node["memory"], node["io"]):
            assert set(part["psi"]) == {"full", "some"}
            assert set(part["psi"]["some"]) == {"total", "avg10", "avg60", "avg300"}
        assert node["cpu"]["psi"]["some"]["total"] > 0  # this machine is never idle
    else:
        assert "psi" not in node["cpu"] and "io" not in node
    [stats] = [p for p in summary["pods"] if p["podRef"]["name"] == pod]
    containers = stats["containers"]
    waiting = {
        lb["id"] for lb, _ in samples.get("container_pressure_cpu_waiting_seconds_total", [])
    }
    if unified:
        assert "psi" in stats["cpu"] and all("psi" in c["cpu"] for c in containers)
    else:
        assert "psi" not in stats["cpu"] and "io" not in stats
        assert all("psi" not in c["cpu"] and "io" not in c for c in containers)
        assert waiting == ({"/"} if node_psi else set())
