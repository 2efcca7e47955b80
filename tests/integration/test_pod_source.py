"""The pod-source service against a real Redis, run in-process (`app.main(deps)` as a task,
with the production wiring and its HTTP port), reading a real directory and a real HTTP
server.

Covers: a manifest written appears in the `desired` table and the `pods` stream under
its normalised name and content-hash UID, and marks the file source ready; an edited
manifest gives a new UID (REMOVE old, ADD new) and a deleted one a REMOVE; malformed
manifests (bad YAML, kind Service, invalid name, no containers, over 10 MiB, an editor
backup duplicating a pod name) next to good ones leave the good ones alone and are
counted once each on /metrics, the duplicate also as a FailedValidation event; the URL
source publishes a PodList and keeps it through a 500 and a request that hangs past the
timeout, and an empty body empties it; a restarted (empty) Redis gets the desired table
and the sources entry back; a restarted pod-source sends REMOVE for a manifest deleted
while it was down and nothing for unchanged ones; a standby replica takes over when the
leader stops.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import pytest
import yaml
from klet.bus import Bus, NodeBus
from klet.config import load_settings
from klet.devstack import RedisServer, free_port
from klet.model.records import DesiredPod, EventRecord, PodChange
from klet.pod_source import app
from klet.pod_source.normalize import static_pod_uid
from klet.pod_source.publisher import RetryPolicy
from klet.pod_source.wiring import Deps, Overrides, build_deps
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

NODE = "node1"
T = TypeVar("T")

WEB = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: app
    image: registry.klet.test/httpd:1.36
"""


def manifest(name: str, image: str = "registry.klet.test/busybox:1.36") -> str:
    return WEB.replace("name: web", f"name: {name}").replace("registry.klet.test/httpd:1.36", image)


def file_uid(path: Path, text: str) -> str:
    return static_pod_uid(yaml.safe_load(text), node_name=NODE, source="file", origin=str(path))


@dataclass
class Service:
    deps: Deps
    task: asyncio.Task[int]
    port: int

    async def metric(self, name: str, **labels: str) -> float:
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{self.port}/metrics")).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return sample.value
        return 0.0


@asynccontextmanager
async def running(
    tmp: Path,
    redis: RedisServer,
    *,
    manifests: Path | None = None,
    url: str | None = None,
    holder: str = "replica-a",
) -> AsyncIterator[Service]:
    """pod-source with the production wiring, short timeouts, on a free port."""
    port = free_port()
    argv = [
        *redis.service_flags(NODE, "pod-source"),
        "--hostname-override", NODE,
        "--run-dir", str(tmp / "run"),
        "--service-port", str(port),
        "--file-check-frequency", "1s",
        "--http-check-frequency", "1s",
    ]  # fmt: skip
    if manifests is not None:
        argv += ["--pod-manifest-path", str(manifests)]
    if url is not None:
        argv += ["--manifest-url", url]
    settings = load_settings(argv, env={}, service="pod-source")
    deps = build_deps(
        settings,
        Overrides(
            registry=CollectorRegistry(),
            retry=RetryPolicy(initial_s=0.1, max_s=0.5),
            lease_ttl_s=3.0,
            lease_holder=holder,
            http_timeout_s=1.0,
        ),
    )
    task = asyncio.create_task(app.main(deps, handle_signals=False), name=f"pod-source-{holder}")
    service = Service(deps, task, port)

    async def healthy() -> bool:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200

    try:
        await eventually(healthy, what="pod-source /healthz")
        yield service
    finally:
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=20)
        if not done:
            stuck = sorted(t.get_name() for t in asyncio.all_tasks() if not t.done())
            raise AssertionError(f"pod-source did not stop when cancelled; running: {stuck}")
        await asyncio.gather(task, return_exceptions=True)  # retrieve its outcome


async def eventually(check: Callable[[], Awaitable[T]], *, what: str, timeout_s: float = 30.0) -> T:
    """Poll `check` until it returns something truthy; fail naming `what`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: Any = None
    while True:
        try:
            result = await check()
            if result:
                return result
            last = result
        except Exception as err:  # noqa: BLE001 - not there yet; remember why
            last = err
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
        await asyncio.sleep(0.1)


@pytest.fixture
async def bus(redis_server: RedisServer) -> AsyncIterator[NodeBus]:
    """The test's own view of the node's tables and streams."""
    b = Bus.from_url(redis_server.url, NODE, auth=redis_server.admin, timeout_s=2.0)
    try:
        yield NodeBus.of(b, service="pod-source")
    finally:
        await b.close()


async def desired(nb: NodeBus) -> dict[str, DesiredPod]:
    return await nb.desired.all()


async def names(nb: NodeBus) -> set[str]:
    return {r.pod["metadata"]["name"] for r in (await nb.desired.all()).values()}


async def changes(nb: NodeBus) -> list[tuple[str, str]]:
    """(op, uid) of every `pods` stream entry so far."""
    raw = await nb.bus.client.xrange(nb.pods.key)
    entries = cast(list[tuple[str, dict[str, str]]], raw)  # decode_responses=True
    return [(c.op, c.uid) for c in (PodChange.decode(f["r"]) for _, f in entries)]


async def events(nb: NodeBus) -> list[EventRecord]:
    raw = await nb.bus.client.xrange(nb.events.key)
    entries = cast(list[tuple[str, dict[str, str]]], raw)
    return [EventRecord.decode(f["r"]) for _, f in entries]


async def source_ready(nb: NodeBus, source: str) -> bool:
    state = await nb.sources.get(source)
    return state is not None and state.ready


async def test_manifest_add_change_remove(
    tmp_path: Path, redis_server: RedisServer, bus: NodeBus
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    path = manifests / "web.yaml"
    path.write_text(WEB)
    uid1 = file_uid(path, WEB)
    async with running(tmp_path, redis_server, manifests=manifests):
        table = await eventually(lambda: desired(bus), what="the pod in the desired table")
        record = table[uid1]
        assert record.pod["metadata"]["name"] == f"web-{NODE}"
        assert record.pod["metadata"]["uid"] == uid1 == record.hash
        assert record.source == "file"
        assert record.pod["metadata"]["annotations"]["kubernetes.io/config.source"] == "file"
        assert await changes(bus) == [("ADD", uid1)]
        assert await source_ready(bus, "file")

        edited = WEB.replace("httpd:1.36", "busybox:1.36")
        path.write_text(edited)
        uid2 = file_uid(path, edited)
        assert uid2 != uid1

        async def replaced() -> bool:
            return set(await desired(bus)) == {uid2}

        await eventually(replaced, what="the edited pod under its new UID")
        assert await changes(bus) == [("ADD", uid1), ("REMOVE", uid1), ("ADD", uid2)]

        path.unlink()

        async def emptied() -> bool:
            return await desired(bus) == {}

        await eventually(emptied, what="the removed pod to leave the desired table")
        assert (await changes(bus))[-1] == ("REMOVE", uid2)
        assert await source_ready(bus, "file")


async def test_bad_manifests_do_not_affect_good_ones(
    tmp_path: Path, redis_server: RedisServer, bus: NodeBus
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "a-good.yaml").write_text(manifest("good"))
    (manifests / "bad-yaml.yaml").write_text("apiVersion: v1\nkind: [Pod\n")
    (manifests / "service.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    (manifests / "bad-name.yaml").write_text(manifest("Bad_Name"))
    (manifests / "no-containers.json").write_text(
        '{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "empty"}, "spec": {}}'
    )
    (manifests / "huge.yaml").write_text(manifest("huge") + "#" * (10 * 1024 * 1024))
    (manifests / ".hidden.yaml").write_text("this is ignored: [")
    # An editor backup: read like any non-dot file, dropped as a duplicate name.
    (manifests / "a-good.yaml~").write_text(manifest("good"))

    async with running(tmp_path, redis_server, manifests=manifests) as svc:
        await eventually(lambda: source_ready(bus, "file"), what="the file source to be ready")
        assert await names(bus) == {f"good-{NODE}"}

        async def counted() -> bool:
            counts = {
                reason: await svc.metric(
                    "klet_pod_source_manifest_errors_total", source="file", reason=reason
                )
                for reason in ("parse", "invalid", "too_large", "duplicate")
            }
            return counts == {"parse": 1, "invalid": 3, "too_large": 1, "duplicate": 1}

        await eventually(counted, what="one error counted per bad manifest")
        # The lease task elects this replica beside the publisher, so the event may be
        # written a pass after the errors were counted.
        (event,) = await eventually(lambda: events(bus), what="the FailedValidation event")
        assert (event.reason, event.involved["name"]) == ("FailedValidation", f"good-{NODE}")
        # Two more scans of the directory: the same errors are not counted again.
        scans = await svc.metric("klet_pod_source_file_scans_total")

        async def scanned_twice_more() -> bool:
            return await svc.metric("klet_pod_source_file_scans_total") >= scans + 2

        await eventually(scanned_twice_more, what="two more scans")
        assert await counted()

        # Good files added next to the bad ones are picked up as usual.
        (manifests / "b-good.json").write_text(
            '{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other"},'
            ' "spec": {"containers": [{"name": "c", "image": "busybox"}]}}'
        )

        async def both() -> bool:
            return await names(bus) == {f"good-{NODE}", f"other-{NODE}"}

        await eventually(both, what="the second good manifest")
        assert await svc.metric("klet_pod_source_pods", source="file") == 2
        assert not svc.task.done()


class ManifestServer:
    """A local HTTP server whose answer the test switches: a body, an error, or a hang."""

    def __init__(self) -> None:
        self.mode = "body"
        self.body = b""
        self.requests = 0
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                outer.requests += 1
                if outer.mode == "hang":
                    outer.release.wait(30)
                    return
                if outer.mode == "error":
                    self.send_error(500, "boom")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/pods"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ManifestServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def manifest_server() -> Iterator[ManifestServer]:
    with ManifestServer() as server:
        yield server


# JSON is YAML's flow style: a YAML PodList whose items are written as JSON objects.
POD_LIST = f"""\
apiVersion: v1
kind: PodList
items:
- {json.dumps(yaml.safe_load(manifest("one")))}
- {json.dumps(yaml.safe_load(manifest("two")))}
"""


async def test_http_source_keeps_the_last_good_set(
    tmp_path: Path, redis_server: RedisServer, bus: NodeBus, manifest_server: ManifestServer
) -> None:
    manifest_server.body = POD_LIST.encode()
    async with running(tmp_path, redis_server, url=manifest_server.url) as svc:
        good = {f"one-{NODE}", f"two-{NODE}"}

        async def published() -> bool:
            return await names(bus) == good

        await eventually(published, what="the PodList's pods")
        assert await source_ready(bus, "http")
        table = await desired(bus)
        assert {r.source for r in table.values()} == {"http"}
        adds = await changes(bus)

        async def errors() -> float:
            return await svc.metric(
                "klet_pod_source_manifest_errors_total", source="http", reason="read"
            )

        manifest_server.mode = "error"
        await eventually(lambda: errors(), what="the HTTP 500 to be counted")
        seen = manifest_server.requests
        await eventually(
            lambda: asyncio.sleep(0, manifest_server.requests >= seen + 2), what="two more polls"
        )
        assert await names(bus) == good
        assert await errors() == 1  # once per distinct error, not per poll

        manifest_server.mode = "hang"

        async def timed_out() -> bool:
            return await errors() == 2

        await eventually(timed_out, what="the hanging request to time out")
        assert await names(bus) == good
        assert await changes(bus) == adds  # nothing was published meanwhile

        manifest_server.mode = "body"
        manifest_server.body = b""
        manifest_server.release.set()

        async def emptied() -> bool:
            return await desired(bus) == {}

        await eventually(emptied, what="an empty body to empty the set")
        assert await source_ready(bus, "http")
        assert not svc.task.done()


async def test_redis_restart_repopulates_the_tables(
    tmp_path: Path, redis_server: RedisServer, bus: NodeBus
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "web.yaml").write_text(WEB)
    async with running(tmp_path, redis_server, manifests=manifests) as svc:
        first = await eventually(lambda: desired(bus), what="the pod in the desired table")
        await eventually(lambda: source_ready(bus, "file"), what="the file source to be ready")

        await asyncio.to_thread(redis_server.restart)  # same port, no data

        async def repopulated() -> bool:
            return await desired(bus) == first and await source_ready(bus, "file")

        await eventually(repopulated, what="the desired table and sources entry to come back")
        assert [op for op, _ in await changes(bus)] == ["ADD"]
        assert not svc.task.done()


async def test_restart_diffs_against_what_was_published(
    tmp_path: Path, redis_server: RedisServer, bus: NodeBus
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    keep, gone = manifests / "keep.yaml", manifests / "gone.yaml"
    keep.write_text(manifest("keep"))
    gone.write_text(manifest("gone"))
    async with running(tmp_path, redis_server, manifests=manifests):

        async def both() -> bool:
            return len(await desired(bus)) == 2

        await eventually(both, what="both pods")
    before = await desired(bus)
    gone.unlink()
    async with running(tmp_path, redis_server, manifests=manifests):

        async def one() -> bool:
            return set(await desired(bus)) == {file_uid(keep, manifest("keep"))}

        await eventually(one, what="the pod removed while pod-source was down to go")
    after = await desired(bus)
    uid_keep, uid_gone = file_uid(keep, manifest("keep")), file_uid(gone, manifest("gone"))
    assert after[uid_keep] == before[uid_keep]  # untouched, first-seen time included
    assert (await changes(bus))[2:] == [("REMOVE", uid_gone)]


async def test_standby_takes_over(tmp_path: Path, redis_server: RedisServer, bus: NodeBus) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "a.yaml").write_text(manifest("a"))
    async with running(tmp_path / "b", redis_server, manifests=manifests, holder="b") as b:
        async with running(tmp_path / "a", redis_server, manifests=manifests, holder="a") as a:

            async def a_or_b_leads() -> bool:
                return a.deps.publisher.leading != b.deps.publisher.leading and bool(
                    await desired(bus)
                )

            await eventually(a_or_b_leads, what="exactly one leader")
            leader, standby = (a, b) if a.deps.publisher.leading else (b, a)
            assert leader is b  # b started first
            # The standby reads and merges too, so it can take over without a re-read.
            await eventually(
                lambda: asyncio.sleep(0, standby.deps.publisher.ready), what="standby ready"
            )
        # a stopped; b still leads. Now stop the leader while a standby runs.
    async with running(tmp_path / "c", redis_server, manifests=manifests, holder="c") as c:
        async with running(tmp_path / "d", redis_server, manifests=manifests, holder="d") as d:
            await eventually(lambda: asyncio.sleep(0, c.deps.publisher.leading), what="c to lead")
            c.task.cancel()  # releases the lease on the way out
            await asyncio.gather(c.task, return_exceptions=True)
            await eventually(
                lambda: asyncio.sleep(0, d.deps.publisher.leading), what="d to take over"
            )
            (manifests / "b.yaml").write_text(manifest("b"))

            async def published() -> bool:
                return await names(bus) == {f"a-{NODE}", f"b-{NODE}"}

            await eventually(published, what="the new leader to publish a change")
