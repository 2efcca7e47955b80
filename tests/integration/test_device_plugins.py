"""Device plugins on real containerd: the project's own test plugin
(tests/harness/deviceplugin.py, two devices backed by a /dev/null copy and a file each)
registers on `<root-dir>/device-plugins/kubelet.sock` of a running node.

Covers, in one node's life: the bus `devices` record shows the two healthy devices; a
static pod asking `example.com/foo: 1` runs, and from inside its container the env,
the read-only mount and the character device that the plugin's Allocate answered are
there (PreStartContainer was called with the same device); a pod asking 2 is rejected
with upstream's UnexpectedAdmissionError and message, and never reaches the runtime;
upstream's registration and Allocate metrics count them; the allocation is in
`kubelet_internal_checkpoint`, which verifies with upstream's
checksum; syncloop SIGKILLed and restarted keeps the container (same ID, no restart),
the plugin registers again and no new Allocate happens, and the pod asking 2 stays
out; a device turned unhealthy leaves 1 healthy of 2; the plugin stopping leaves the
resource disconnected with nothing healthy.

The PodResources API v1 on `<root-dir>/pod-resources/kubelet.sock` is read along the
way by a client of the generated upstream-wire stubs: List and Get give the pod, its
container and the device it holds, Get of an unknown pod fails with upstream's
message, GetAllocatableResources the plugin's healthy devices and the static CPU
manager's CPUs (CPU 0 reserved); the rejected pod is not in List but Get finds it; a
Guaranteed pod of 1 whole CPU is listed with its exclusive CPU; a burst of concurrent
calls beyond upstream's 10 tokens is refused RESOURCE_EXHAUSTED, and
kubelet_pod_resources_endpoint_requests_total counts the calls let through; after syncloop's
SIGKILL the restarted leader serves the same answer on a new socket; an unhealthy
device, then the plugin gone, leave 1, then 0 allocatable devices while the pod keeps
its device in List.

Upstream's sample device plugin (k8s.io/kubernetes v1.34.4 test/images/sample-device-plugin,
built by tools/deviceplugin/build.sh) in its plugin-watcher mode: its socket in
`<root-dir>/plugins_registry/`, no Register on kubelet.sock. The watcher's GetInfo finds a
`DevicePlugin` for `example.com/resource`, the bus shows its two healthy devices, the
plugin logs no refusal and never registered on kubelet.sock; a pod asking one runs with
the device file its Allocate mounted; syncloop SIGKILLed and restarted takes the plugin
back from the socket that stayed (same container, no restart); SIGTERM to the plugin
(its socket removed) leaves the resource disconnected with nothing healthy.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from klet.bus.schema import NodeBus
from klet.cri import CRISettings, RuntimeClient
from klet.model.records import DeviceResourceRecord
from klet.model.types import ContainerID
from klet.rpc.gen.klet.podresources.v1 import api_pb2 as prpb
from klet.rpc.gen.klet.podresources.v1 import api_pb2_grpc as prpb_grpc
from klet.syncloop.devices.checkpoint import decode

from tests.harness.deviceplugin import (
    SAMPLE_RESOURCE,
    FakeDevicePlugin,
    SampleDevicePlugin,
    sample_device_plugin_binary,
)
from tests.harness.node import KletNode, bus_events, container_status
from tests.harness.pods import running, runtime_containers, runtime_sandboxes
from tests.harness.waiting import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(240),
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="CPU 0 is reserved: 2 CPUs needed"),
]

POD = """
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      resources:
        limits: {{example.com/foo: "{count}"}}
"""

RESOURCE = "example.com/foo"
PINNED = """
apiVersion: v1
kind: Pod
metadata: {name: pinned}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      resources:
        limits: {cpu: "1", memory: 32Mi}
"""
CPUS = [f"cpu/{i}" for i in range(1, os.cpu_count() or 1)]
"""The static policy's allocatable CPUs: every CPU but the reserved CPU 0."""


def devices(node: KletNode) -> dict[str, DeviceResourceRecord]:
    """The bus `devices` table, as status-reporter reads it."""

    async def read() -> dict[str, DeviceResourceRecord]:
        bus = node.bus(service="status-reporter")
        try:
            return dict(await NodeBus.of(bus, service="status-reporter").devices.all())
        finally:
            await bus.close()

    return asyncio.run(read())


def counts(node: KletNode, resource: str = RESOURCE) -> tuple[int, int, bool] | None:
    rec = devices(node).get(resource)
    return None if rec is None else (rec.healthy, rec.unhealthy, rec.connected)


def exec_in(node: KletNode, pod: dict[str, Any], container: str, *cmd: str) -> str:
    cid = container_status(pod, container)["containerID"].split("://", 1)[1]

    async def go() -> tuple[int, bytes, bytes]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=node.stack.runtime_endpoint, timeout_s=30))
        try:
            return await cri.exec_sync(ContainerID(cid), list(cmd), timeout_s=20)
        finally:
            await cri.close()

    code, out, err = asyncio.run(go())
    assert code == 0, f"{cmd} in {container}: exit {code}: {err.decode()}"
    return out.decode()


Held = list[tuple[str, str, list[tuple[str, str]]]]
"""(namespace, pod, [(container, resource/device)]) as the PodResources API lists them."""


class PodResources:
    """A client of the PodResources API on the node's socket (upstream's wire); each
    call opens its own channel in its own event loop, as the other helpers here do."""

    def __init__(self, node: KletNode) -> None:
        self.socket = node.root_dir / "pod-resources" / "kubelet.sock"

    def _call(self, method: str, request: Any, copies: int = 1) -> list[Any]:
        """`copies` concurrent calls; each answer or its AioRpcError."""

        async def go() -> list[Any]:
            async with grpc.aio.insecure_channel(f"unix://{self.socket}") as channel:
                stub = prpb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
                calls = [getattr(stub, method)(request, timeout=10) for _ in range(copies)]
                return list(await asyncio.gather(*calls, return_exceptions=True))

        return asyncio.run(go())

    def _one(self, method: str, request: Any) -> Any:
        (answer,) = self._call(method, request)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    @staticmethod
    def held(pods: Any) -> Held:
        out = []
        for p in pods:
            for c in p.containers:
                assert list(c.memory) == []  # no memory manager: upstream's None policy
            devices = [
                (c.name, f"{d.resource_name}/{i}")
                for c in p.containers
                for d in c.devices
                for i in d.device_ids
            ]
            cpus = [(c.name, f"cpu/{i}") for c in p.containers for i in c.cpu_ids]
            out.append((p.namespace, p.name, devices + cpus))
        return sorted(out)

    def list(self) -> Held:
        return self.held(self._one("List", prpb.ListPodResourcesRequest()).pod_resources)

    def get(self, namespace: str, name: str) -> Held:
        request = prpb.GetPodResourcesRequest(pod_namespace=namespace, pod_name=name)
        return self.held([self._one("Get", request).pod_resources])

    def allocatable(self) -> list[str]:
        answer = self._one("GetAllocatableResources", prpb.AllocatableResourcesRequest())
        devices = [f"{d.resource_name}/{i}" for d in answer.devices for i in d.device_ids]
        return sorted(devices) + [f"cpu/{i}" for i in sorted(answer.cpu_ids)]

    def burst(self) -> tuple[int, list[grpc.aio.AioRpcError]]:
        """Up to 20 rounds of 50 concurrent List calls, until one is refused: how many
        passed, and the refusals."""
        passed, refused = 0, []
        for _ in range(20):
            for answer in self._call("List", prpb.ListPodResourcesRequest(), copies=50):
                if isinstance(answer, grpc.aio.AioRpcError):
                    refused.append(answer)
                else:
                    assert not isinstance(answer, BaseException), answer
                    passed += 1
            if refused:
                break
        return passed, refused


def rejected(node: KletNode, name: str) -> dict[str, Any] | None:
    pod = node.pods().get(f"{name}-{node.node_name}")
    return pod if pod and pod["status"].get("phase") == "Failed" else None


def test_device_plugin_allocation_admission_and_restart(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    # The static CPU manager with CPU 0 reserved, so a Guaranteed pod gets exclusive CPUs
    # the PodResources API lists.
    node: KletNode = node_factory(
        manifest_dir=manifests,
        extra_flags=["--cpu-manager-policy", "static", "--reserved-cpus", "0"],
    )
    node.start()
    plugin_dir = node.root_dir / "device-plugins"
    wait_for(lambda: (plugin_dir / "kubelet.sock").exists(), timeout_s=30, what="kubelet.sock")
    plugin = FakeDevicePlugin(plugin_dir, tmp_path / "backing")
    plugin.start()
    try:
        plugin.wait_registered(1)
        wait_for(lambda: counts(node) == (2, 0, True), timeout_s=30, what="2 healthy devices")

        (manifests / "one.yaml").write_text(POD.format(name="one", count=1))
        pod = wait_for(lambda: running(node, "one"), timeout_s=60, what="one Running")
        assert len(plugin.allocations) == 1
        (device,) = plugin.allocations[0]
        assert plugin.pre_starts == [[device]]
        assert node.metric("syncloop", "kubelet_device_plugin_registration_total") == 1
        assert node.metric("syncloop", "kubelet_device_plugin_alloc_duration_seconds_count") == 1
        env = exec_in(node, pod, "main", "sh", "-c", "echo $FOO_DEVICES")
        assert env.strip() == device
        assert exec_in(node, pod, "main", "cat", f"/var/foo/{device}") == f"device {device}\n"
        index = device.rsplit("-", 1)[1]
        exec_in(node, pod, "main", "test", "-c", f"/dev/foo{index}")  # a character device
        # The mount is read-only, as Allocate said.
        assert "Read-only" in exec_in(
            node, pod, "main", "sh", "-c", f"(echo x > /var/foo/{device}) 2>&1 || true"
        )

        # The PodResources API: the pod, its container and its device.
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        one = (ns, name, [("main", f"{RESOURCE}/{device}")])
        api = PodResources(node)
        assert api.list() == [one]
        assert api.get(ns, name) == [one]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            api.get(ns, "absent")
        assert err.value.details() == f"pod absent in namespace {ns} not found"
        assert api.allocatable() == sorted(f"{RESOURCE}/{d}" for d in plugin.health) + CPUS

        (manifests / "two.yaml").write_text(POD.format(name="two", count=2))
        failed = wait_for(lambda: rejected(node, "two"), timeout_s=30, what="two Failed")
        # A rejected pod is not active: List leaves it out, Get still finds it.
        assert api.list() == [one]
        # A Guaranteed pod of whole CPUs: its exclusive CPU is listed.
        (manifests / "pinned.yaml").write_text(PINNED)
        pinned_pod = wait_for(lambda: running(node, "pinned"), timeout_s=60, what="pinned Running")
        pinned_name = pinned_pod["metadata"]["name"]
        listed = {p[1]: p for p in api.list()}
        assert sorted(listed) == sorted([name, pinned_name]) and listed[name] == one
        pinned = listed[pinned_name]
        ((container, cpu),) = pinned[2]  # one exclusive CPU, no device
        assert container == "main" and cpu in CPUS, pinned
        assert api.get(ns, pinned_name) == [pinned]
        both = sorted([one, pinned])
        assert api.get(ns, failed["metadata"]["name"]) == [(ns, failed["metadata"]["name"], [])]
        passed, refused = api.burst()
        assert passed >= 1 and refused, (passed, refused)
        assert {(e.code(), e.details()) for e in refused} == {
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        }
        # upstream's requests counter: the 8 calls above and those of the burst let through
        requests = "kubelet_pod_resources_endpoint_requests_total"
        assert node.metric("syncloop", requests, server_api_version="v1") == 8 + passed
        made = api.socket.stat()
        socket_before = (made.st_ino, made.st_ctime_ns)  # inode numbers are reused
        message = (
            "Allocate failed due to requested number of devices unavailable for "
            "example.com/foo. Requested: 2, Available: 1, which is unexpected"
        )
        assert (failed["status"]["reason"], failed["status"]["message"]) == (
            "UnexpectedAdmissionError",
            f"Pod was rejected: {message}",
        )
        assert [
            e.message for e in bus_events(node, "two") if e.reason == "UnexpectedAdmissionError"
        ]
        full_two = f"two-{node.node_name}"
        assert runtime_sandboxes(node.stack, full_two) == []
        assert runtime_containers(node.stack, full_two) == {}

        uid = pod["metadata"]["uid"]
        cp = decode((plugin_dir / "kubelet_internal_checkpoint").read_bytes())
        held = [
            (e.pod_uid, e.container_name, e.resource_name, e.devices()) for e in cp.entries or ()
        ]
        assert held == [(uid, "main", RESOURCE, {device})]

        # syncloop SIGKILLed: the container runs on, the allocation is read back.
        before = container_status(pod, "main")
        node.kill("syncloop")
        node.start("syncloop")
        plugin.wait_registered(2)
        wait_for(lambda: counts(node) == (2, 0, True), timeout_s=30, what="plugin back")
        node.wait_passes("syncloop", "kubelet_pleg_relist_duration_seconds_count", 3, timeout_s=60)
        after = container_status(node.pods()[f"one-{node.node_name}"], "main")
        assert after["containerID"] == before["containerID"]
        assert after["restartCount"] == 0
        assert len(plugin.allocations) == 1  # no new Allocate after the restart
        cp = decode((plugin_dir / "kubelet_internal_checkpoint").read_bytes())
        assert [(e.pod_uid, e.devices()) for e in cp.entries or ()] == [(uid, {device})]
        assert rejected(node, "two") is not None
        # The restarted leader serves the PodResources API again, on a new socket, from
        # the checkpoint it read back.
        api = PodResources(node)
        wait_for(lambda: api.socket.exists(), timeout_s=30, what="pod-resources socket")
        remade = api.socket.stat()
        assert (remade.st_ino, remade.st_ctime_ns) != socket_before
        assert api.list() == both

        # An unhealthy device leaves 1 allocatable of 2; the plugin going leaves none.
        other = next(d for d in plugin.health if d != device)
        plugin.set_health(other, "Unhealthy")
        wait_for(lambda: counts(node) == (1, 1, True), timeout_s=30, what="1 healthy, 1 not")
        assert api.allocatable() == [f"{RESOURCE}/{device}"] + CPUS
        plugin.stop()
        wait_for(lambda: counts(node) == (0, 2, False), timeout_s=30, what="plugin gone")
        assert api.allocatable() == CPUS
        assert api.list() == both  # the running container keeps its device
    finally:
        plugin.stop()


SAMPLE_POD = """
apiVersion: v1
kind: Pod
metadata: {name: sample}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      resources:
        limits: {example.com/resource: "1"}
"""


def test_upstreams_sample_device_plugin_registers_through_the_plugin_watcher(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    binary = sample_device_plugin_binary()
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    plugin = SampleDevicePlugin(binary, node.root_dir / "plugins_registry", tmp_path)
    plugin.start()
    try:
        wait_for(
            lambda: counts(node, SAMPLE_RESOURCE) == (2, 0, True),
            timeout_s=60,
            what="the sample plugin's 2 healthy devices",
        )
        (sock,) = plugin.sockets()
        log = plugin.logged()
        assert "GetInfo" in log and "Registration failed" not in log, log
        assert "Device Plugin registered with the Kubelet" not in log  # not via kubelet.sock

        (manifests / "sample.yaml").write_text(SAMPLE_POD)
        pod = wait_for(lambda: running(node, "sample"), timeout_s=60, what="sample Running")
        # The sample plugin's Allocate mounts a file /tmp/<device ID> of the host.
        mounted = exec_in(node, pod, "main", "ls", "/tmp").split()
        assert len([f for f in mounted if f in ("Dev-1", "Dev-2")]) == 1, mounted

        # syncloop SIGKILLed: its first scan of plugins_registry takes the plugin back.
        before = container_status(pod, "main")
        node.kill("syncloop")
        node.start("syncloop")
        node.wait_passes("syncloop", "kubelet_pleg_relist_duration_seconds_count", 3, timeout_s=60)
        wait_for(
            lambda: counts(node, SAMPLE_RESOURCE) == (2, 0, True),
            timeout_s=30,
            what="the sample plugin back after the restart",
        )
        after = container_status(node.pods()[f"sample-{node.node_name}"], "main")
        assert (after["containerID"], after["restartCount"]) == (before["containerID"], 0)
        assert plugin.sockets() == [sock]

        plugin.stop()  # SIGTERM: the plugin removes its socket
        wait_for(
            lambda: counts(node, SAMPLE_RESOURCE) == (0, 2, False),
            timeout_s=30,
            what="the sample plugin withdrawn",
        )
    finally:
        plugin.stop()
