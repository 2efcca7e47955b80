"""The dev stack starts real, working components: Redis, the registry, containerd + CNI.

Covers what every other integration test relies on: Redis answers, the registry holds
the standard test images, containerd serves CRI with runtime and network ready, pulls
``registry.klet.test/...`` from the local registry, runs a sandbox with a pod IP from
the private bridge and a container whose exit code is observed; a private Redis can be
restarted on its port; and stopping a stack leaves no mount, shim or network behind.
"""

from __future__ import annotations

import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc
from klet.devstack import BUSYBOX_IMAGE, DevStack, RedisServer
from klet.devstack.redis_server import redis_command, redis_ping


class Cri:
    """Raw CRI stubs: this test checks the runtime itself, not klet's CRI client."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.insecure_channel(endpoint)
        # The generated stubs are untyped.
        self.runtime = cri_grpc.RuntimeServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.images = cri_grpc.ImageServiceStub(self.channel)  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def cri_client(devstack: DevStack) -> Iterator[Cri]:
    client = Cri(devstack.runtime_endpoint)
    yield client
    client.channel.close()


def sandbox_config(stack: DevStack, name: str) -> cri.PodSandboxConfig:
    uid = str(uuid.uuid4())
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=name, namespace="default", uid=uid, attempt=0),
        hostname=name,
        log_directory=str(stack.dir / "pod-logs" / uid),
        linux=cri.LinuxPodSandboxConfig(),
    )


def run_sandbox(client: Cri, stack: DevStack, name: str) -> tuple[str, cri.PodSandboxConfig]:
    config = sandbox_config(stack, name)
    resp = client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60)
    return resp.pod_sandbox_id, config


def remove_sandbox(client: Cri, sandbox_id: str) -> None:
    client.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id))
    client.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id))


def test_redis_is_a_root_only_unix_socket_with_auth(devstack: DevStack) -> None:
    sock = devstack.redis.socket_path
    assert devstack.redis_url == f"unix://{sock}"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    assert redis_ping(sock, devstack.redis.admin)
    # The default (unauthenticated) user is off.
    assert redis_command(sock, "PING").startswith(b"-NOAUTH")


def test_registry_holds_the_standard_images(devstack: DevStack) -> None:
    base = f"http://{devstack.registry_address}"
    tags = httpx.get(f"{base}/v2/busybox/tags/list", trust_env=False).json()
    assert tags == {"name": "busybox", "tags": ["1.36"]}
    head = httpx.head(
        f"{base}/v2/pause/manifests/3.10",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        trust_env=False,
    )
    assert head.headers["Docker-Content-Digest"] == devstack.images["pause"].manifest_digest


def test_pushing_again_is_a_no_op(devstack: DevStack) -> None:
    img = devstack.add_image(devstack.specs["busybox"])
    assert img.manifest_digest == devstack.images["busybox"].manifest_digest


def test_cri_runtime_and_network_ready(cri_client: Cri) -> None:
    version = cri_client.runtime.Version(cri.VersionRequest())
    assert version.runtime_name == "containerd"
    status = cri_client.runtime.Status(cri.StatusRequest()).status
    conditions = {c.type: c.status for c in status.conditions}
    assert conditions == {"RuntimeReady": True, "NetworkReady": True}


def test_pull_from_local_registry_through_cri(devstack: DevStack, cri_client: Cri) -> None:
    ref = cri_client.images.PullImage(
        cri.PullImageRequest(image=cri.ImageSpec(image=BUSYBOX_IMAGE)), timeout=60
    ).image_ref
    status = cri_client.images.ImageStatus(
        cri.ImageStatusRequest(image=cri.ImageSpec(image=BUSYBOX_IMAGE))
    ).image
    assert status.id == ref == devstack.images["busybox"].config_digest
    assert BUSYBOX_IMAGE in status.repo_tags
    assert status.size == devstack.images["busybox"].size


def test_pull_of_a_missing_tag_is_not_found(cri_client: Cri) -> None:
    with pytest.raises(grpc.RpcError) as err:
        cri_client.images.PullImage(
            cri.PullImageRequest(image=cri.ImageSpec(image="registry.klet.test/busybox:nope")),
            timeout=60,
        )
    assert "not found" in str(err.value.details()).lower()


def test_sandbox_gets_an_ip_and_a_container_exit_code_is_observed(
    devstack: DevStack, cri_client: Cri
) -> None:
    assert devstack.containerd is not None
    subnet = devstack.containerd.network.subnet
    cri_client.images.PullImage(
        cri.PullImageRequest(image=cri.ImageSpec(image=BUSYBOX_IMAGE)), timeout=60
    )
    sandbox_id, config = run_sandbox(cri_client, devstack, "devstack-run")
    try:
        sandbox = cri_client.runtime.PodSandboxStatus(
            cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id)
        ).status
        assert sandbox.state == cri.SANDBOX_READY
        assert sandbox.network.ip.startswith(str(subnet.network_address).rsplit(".", 2)[0])

        container_id = cri_client.runtime.CreateContainer(
            cri.CreateContainerRequest(
                pod_sandbox_id=sandbox_id,
                config=cri.ContainerConfig(
                    metadata=cri.ContainerMetadata(name="sleeper"),
                    image=cri.ImageSpec(image=BUSYBOX_IMAGE),
                    command=["sh", "-c", "sleep 1; echo done"],
                    log_path="sleeper/0.log",
                ),
                sandbox_config=config,
            )
        ).container_id
        cri_client.runtime.StartContainer(cri.StartContainerRequest(container_id=container_id))
        deadline = time.monotonic() + 30
        while True:
            status = cri_client.runtime.ContainerStatus(
                cri.ContainerStatusRequest(container_id=container_id)
            ).status
            if status.state == cri.CONTAINER_EXITED or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status.state == cri.CONTAINER_EXITED
        assert status.exit_code == 0
        log = Path(config.log_directory, "sleeper/0.log").read_text()
        assert log.rstrip().endswith("stdout F done")
    finally:
        remove_sandbox(cri_client, sandbox_id)


def test_private_redis_restarts_on_the_same_socket_with_its_users(
    redis_server: RedisServer,
) -> None:
    sock = redis_server.socket_path
    syncloop = redis_server.credentials("n1", "syncloop")
    redis_server.stop()
    with pytest.raises(OSError):
        redis_ping(sock, redis_server.admin)
    redis_server.restart()
    assert redis_server.socket_path == sock
    assert redis_ping(sock, redis_server.admin)
    assert redis_ping(sock, syncloop)


def test_stop_leaves_nothing_behind() -> None:
    dir = Path(tempfile.mkdtemp(prefix="klet-", dir="/tmp"))
    stack = DevStack(dir)
    stack.start()
    try:
        assert stack.containerd is not None
        client = Cri(stack.runtime_endpoint)
        # Left running on purpose: stop() must kill it and undo its mounts and network.
        run_sandbox(client, stack, "left-running")
        client.channel.close()
        address = str(stack.containerd.socket)
        network = stack.containerd.network
    finally:
        stack.stop()
    assert str(dir) not in Path("/proc/self/mountinfo").read_text()
    shims = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert address not in shims
    assert not Path(f"/sys/class/net/{network.bridge}").exists()
    rules = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True)
    assert network.network_name not in rules.stdout
    subprocess.run(["rm", "-rf", str(dir)], check=True)
