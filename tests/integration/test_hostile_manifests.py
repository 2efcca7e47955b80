"""Hostile input end to end on real containerd: bad manifests beside a good one, and
invalid records written straight into the bus, hurt nobody else.

- pod-source, given a 5,000-digit integer (which crash-looped it before), a YAML alias
  bomb, a manifest UID and a volume name that walk out of the root dir, binary garbage
  and a truncated file, reports each file by name and keeps running; the good pod runs.
- syncloop, given desired records that bypass pod-source (a volume named `../../..`,
  another node's pod), refuses them with a logged error naming the pod and field and a
  FailedValidation Event; it creates nothing outside the root dir and the good pod
  keeps running without a restart.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from klet.bus import NodeBus
from klet.devstack import DevStack
from klet.model.records import DesiredPod, PodChange
from klet.model.types import PodUID

from tests.harness.node import RELISTS, KletNode, bus_events
from tests.harness.pods import running, runtime_containers
from tests.harness.waiting import wait_for

GOOD = """\
apiVersion: v1
kind: Pod
metadata:
  name: good
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: registry.klet.test/busybox:1.36
    command: ["sleep", "100000"]
"""


def bomb() -> str:
    lines = ['  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"  {name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
    return (
        GOOD.replace("name: good", "name: bomb")
        + "  x:\n"
        + "\n".join("  " + line for line in lines)
    )


def bad_files(escape: Path) -> dict[str, bytes]:
    return {
        "big-int.yaml": GOOD.replace("name: good", "name: bigint")
        .replace("terminationGracePeriodSeconds: 2", "terminationGracePeriodSeconds: " + "9" * 5000)
        .encode(),
        "big-int.json": (
            '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bigjson"},'
            '"spec":{"containers":[{"name":"c","image":"x","ports":[{"containerPort":'
            + "8" * 5000
            + "}]}]}}"
        ).encode(),
        "bomb.yaml": bomb().encode(),
        "uid.yaml": GOOD.replace(
            "name: good", f"name: uid\n  uid: ../../../../{escape.name}"
        ).encode(),
        "volume.yaml": (
            GOOD.replace("name: good", "name: volume")
            + "  volumes:\n  - name: ../../../../x\n    emptyDir: {}\n"
        ).encode(),
        "binary.yaml": bytes(range(256)) * 4,
        "truncated.yaml": GOOD.encode()[:70],
    }


def test_bad_manifests_beside_a_good_one(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    escape = tmp_path / "escaped"
    node: KletNode = node_factory(manifest_dir=manifests)
    for name, data in bad_files(escape).items():
        (manifests / name).write_bytes(data)
    (manifests / "good.yaml").write_text(GOOD)
    started = time.monotonic()
    node.start()
    wait_for(lambda: running(node, "good"), timeout_s=30, what="the good pod Running")
    assert set(node.pods()) == {f"good-{node.node_name}"}
    log = node.log("pod-source")
    for name in bad_files(escape):
        assert f"bad static pod manifest {manifests / name}" in log, f"{name} not reported"
    assert "spec.terminationGracePeriodSeconds: integer" in log
    assert "aliases expand" in log
    assert "metadata.uid" in log and "spec.volumes[0].name" in log
    assert "Traceback" not in log
    for svc in ("pod-source", "syncloop", "status-reporter"):
        assert node.procs[svc].alive
    assert not escape.exists()
    print(f"bad manifests refused; good pod Running after {time.monotonic() - started:.1f}s")


def test_syncloop_refuses_invalid_records_on_the_bus(
    node_factory: Any, manifests: Path, tmp_path: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    (manifests / "good.yaml").write_text(GOOD)
    node.start()
    wait_for(lambda: running(node, "good"), timeout_s=30, what="the good pod Running")
    before = runtime_containers(devstack, f"good-{node.node_name}")

    def record(uid: str, name: str, **spec: Any) -> DesiredPod:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {
                "nodeName": node.node_name,
                "containers": [{"name": "main", "image": "registry.klet.test/busybox:1.36"}],
                **spec,
            },
        }
        return DesiredPod(uid=PodUID(uid), pod=pod, source="file", hash=uid, seen_at=time.time())

    escape = tmp_path / "escaped-volume"
    records = [
        record(
            "evil-volume", "evil", volumes=[{"name": f"../../../../{escape.name}", "emptyDir": {}}]
        ),
        record("other-node", "elsewhere", nodeName="some-other-node"),
    ]

    async def write() -> None:
        bus = node.bus(service="pod-source")  # the only writer of `desired`
        try:
            nb = NodeBus.of(bus, service="pod-source")
            for rec in records:
                await nb.desired.put(rec.uid, rec)
                await nb.pods.publish(PodChange(op="ADD", uid=rec.uid, source="file"))
        finally:
            await bus.close()

    asyncio.run(write())
    wait_for(
        lambda: (
            "is invalid, not run" in node.log("syncloop")
            and "belongs to another node" in node.log("syncloop")
        ),
        timeout_s=15,
        what="syncloop refusing both records",
    )
    log = node.log("syncloop")
    assert "default/evil" in log and "spec.volumes[0].name" in log
    wait_for(
        lambda: [e for e in bus_events(node) if e.reason == "FailedValidation"],
        timeout_s=10,
        what="a FailedValidation event",
    )
    # A window for a late effect, counted in syncloop's relists: none of them shows a
    # container of the refused records.
    node.wait_passes("syncloop", RELISTS, 3, timeout_s=15)
    assert not escape.exists()
    assert not [p for p in node.pods() if p.startswith(("evil", "elsewhere"))]
    assert running(node, "good")
    assert runtime_containers(devstack, f"good-{node.node_name}") == before
    assert node.procs["syncloop"].alive
