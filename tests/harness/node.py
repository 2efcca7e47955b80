"""A klet node for integration tests: each service its own process, against a DevStack.

Unlike `klet up`, which supervises and restarts its services, this keeps every service
under the test's control so a test can SIGKILL one, restart it, or stop Redis, and then
observe that no pod restarted. Ports are free ports; the read-only API is on, so tests
read `/pods` as an operator would.
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from klet.bus import Bus
from klet.cli.up import optimized_bytecode
from klet.devstack import DevStack, ManagedProcess, RedisServer, free_port
from klet.model.records import EventRecord
from klet.syncloop.volumes.fs import mounts_under
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.waiting import wait_for

SERVICES = ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc")

# Counters of the services' loops, for KletNode.wait_passes.
RELISTS = "kubelet_pleg_relist_duration_seconds_count"  # syncloop: one per PLEG relist
EVICTION_PASSES = "klet_eviction_passes_total"  # eviction: one per completed pass


def run_syncloop(tmp: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """syncloop alone, run to its end, with its run and root directories under `tmp`: for
    the refusals at start (it exits before it needs a bus)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "klet.syncloop",
            "--run-dir",
            str(tmp / "run"),
            "--root-dir",
            str(tmp / "root"),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


class KletNode:
    def __init__(
        self,
        stack: DevStack,
        dir: Path,
        *,
        node_name: str,
        manifest_dir: Path | None = None,
        manifest_url: str | None = None,
        extra_flags: Sequence[str] = (),
        redis: RedisServer | None = None,
    ) -> None:
        self.stack = stack
        self.dir = dir
        self.node_name = node_name
        # Each service connects as its own ACL user of this node (klet.bus.acl), with
        # its password file's path on its command line, as `klet up` does.
        self.redis = redis or stack.redis
        self.redis_url = self.redis.url
        self.read_only_port = free_port()
        self.healthz_port = free_port()
        self.kubelet_port = free_port()  # the 10250 API, off unless it can authorize
        self.ports = {s: free_port() for s in SERVICES}
        self.root_dir = dir / "root"
        self.logs_dir = dir / "logs"
        flags = [
            "--hostname-override",
            node_name,
            "--container-runtime-endpoint",
            stack.runtime_endpoint,
            "--run-dir",
            str(dir / "run"),
            "--root-dir",
            str(self.root_dir),
            "--pod-logs-dir",
            str(self.logs_dir),
            "--read-only-port",
            str(self.read_only_port),
            "--healthz-port",
            str(self.healthz_port),
            "--port",
            str(self.kubelet_port),
            "--cert-dir",
            str(dir / "pki"),
            "--file-check-frequency",
            "1s",
            "--http-check-frequency",
            "1s",
            "-v",
            "4",
            # Runtime events drive PLEG and its relist runs every 20 s by default; tests
            # prove "nothing restarted" over a few passes of the loop that would act, so
            # the harness keeps the relist at upstream's 1 s (a later flag overrides it).
            "--evented-pleg-relist-period",
            "1s",
        ]
        if manifest_dir is not None:
            flags += ["--pod-manifest-path", str(manifest_dir)]
        if manifest_url is not None:
            flags += ["--manifest-url", manifest_url]
        self.flags = [*flags, *extra_flags]
        # The services run as `klet up` runs them: without docstrings (PYTHONOPTIMIZE=2)
        # where make setup compiled the optimised bytecode.
        optimize = ["-OO"] if optimized_bytecode() else []
        self.procs = {
            s: ManagedProcess(
                s,
                [
                    sys.executable,
                    *optimize,
                    "-m",
                    f"klet.{s.replace('-', '_')}",
                    *self.flags,
                    *self.redis_flags(s),
                    "--service-port",
                    str(self.ports[s]),
                ],
                dir=dir / "svc",
            )
            for s in SERVICES
        }

    def redis_flags(self, service: str) -> list[str]:
        """The bus flags of `service`: the URL, its user and its password file."""
        return self.redis.service_flags(self.node_name, service)

    def bus(self, *, service: str | None = None, timeout_s: float = 5.0) -> Bus:
        """A bus client of this node: as `service`'s user, or (None) as the admin, for
        tests that read or plant records no single service may."""
        auth = (
            self.redis.admin if service is None else self.redis.credentials(self.node_name, service)
        )
        return Bus.from_url(self.redis_url, self.node_name, auth=auth, timeout_s=timeout_s)

    def start(self, *services: str) -> None:
        for s in services or SERVICES:
            self.procs[s].start()
        for s in services or SERVICES:
            self.procs[s].wait_ready(functools.partial(self._healthy, s), 30, f"{s} /healthz")

    def _healthy(self, service: str) -> bool:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.ports[service]}/healthz", timeout=1
        ) as r:
            return bool(r.status == 200)

    def stop(self, *services: str) -> None:
        for s in services or reversed(SERVICES):
            self.procs[s].stop()

    def release_mounts(self) -> None:
        """Unmount what the node's pods left mounted under its directory (tmpfs of
        Memory emptyDirs, secret and projected volumes) once its services are stopped,
        so the test's temporary directory can be removed. Deepest first."""
        for point in mounts_under(self.dir):
            subprocess.run(["umount", point], capture_output=True, check=False)

    def kill(self, service: str) -> None:
        self.procs[service].kill()

    def log(self, service: str) -> str:
        return self.procs[service].log_path.read_text(errors="replace")

    def get(self, path: str, *, port: int | None = None) -> Any:
        url = f"http://127.0.0.1:{port or self.read_only_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read().decode()
        return json.loads(body) if body.startswith(("{", "[")) else body

    def pods(self) -> dict[str, dict[str, Any]]:
        """`/pods` by pod name."""
        return {p["metadata"]["name"]: p for p in self.get("/pods")["items"]}

    def metrics(self, service: str) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.ports[service]}/metrics", timeout=5
        ) as r:
            return str(r.read().decode())

    def metric(self, service: str, name: str, **labels: str) -> float | None:
        """The samples `name` with `labels` among their labels in `service`'s /metrics,
        summed (a counter over all its label values), or None when it has none."""
        return sample_value(self.metrics(service), name, **labels)

    def wait_passes(self, service: str, counter: str, count: int, *, timeout_s: float) -> None:
        """Wait until `service`'s `counter` (RELISTS, EVICTION_PASSES, ...) grew by `count`
        from now. A test that proves a negative ("nothing restarts") watches for that many
        more passes of the loop that would act, not for a number of seconds that a slow
        machine may not fill with passes."""
        start = self.metric(service, counter) or 0.0
        wait_for(
            lambda: (self.metric(service, counter) or 0.0) >= start + count,
            timeout_s=timeout_s,
            what=f"{count} more {counter} of {service}",
        )


def sample_value(text: str, name: str, **labels: str) -> float | None:
    """The sum of the samples `name` with `labels` among their labels in a Prometheus
    text page, or None when there is none."""
    values = [
        float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]
    return sum(values) if values else None


def fetch(url: str, *, timeout_s: float = 3) -> str:
    """GET `url` and return the body, closing the connection (no leaked sockets)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return str(r.read().decode())


def container_status(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod.get("status", {}).get("containerStatuses", []) if c["name"] == name)


def bus_events(node: KletNode, pod: str | None = None) -> list[EventRecord]:
    """The Events the node's services put on its bus (each its own stream), oldest
    first, optionally of one static pod (by its manifest name, without `-<node>`)."""

    async def go() -> list[EventRecord]:
        bus = node.bus()
        try:
            found: list[EventRecord] = []
            for service in SERVICES:
                raw = await bus.client.xrange(bus.key(f"events:{service}"))
                entries = cast(list[tuple[str, dict[str, str]]], raw)
                found += [EventRecord.decode(f["r"]) for _, f in entries]
            return sorted(found, key=lambda e: e.at)
        finally:
            await bus.close()

    found = asyncio.run(go())
    if pod is None:
        return found
    full = f"{pod}-{node.node_name}"
    return [e for e in found if e.involved.get("name") == full]


def klet_why(node: KletNode, pod: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`klet why <pod>` as an operator runs it, with status-reporter's bus user."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "klet.cli.main",
            "why",
            pod,
            *node.redis_flags("status-reporter"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def why_story(node: KletNode, pod: str) -> dict[str, Any] | None:
    """`klet why <pod> -o json`, None while no history of it is kept."""
    done = klet_why(node, pod, "-o", "json")
    if done.returncode == 1 and "no history of pod" in done.stderr:
        return None
    assert done.returncode == 0, done.stderr
    story: dict[str, Any] = json.loads(done.stdout)
    return story
