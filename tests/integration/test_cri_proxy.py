"""The CRI allow-list proxy (klet.cri.proxy) in front of real containerd, reached as the
services reach it, through klet.cri.RuntimeClient on `<run-dir>/cri/<service>.sock`:
status-reporter's connection lists containers and sandboxes, and is refused
RunPodSandbox, CreateContainer, StartContainer and UpdateRuntimeConfig with
PERMISSION_DENIED naming the method, before containerd sees them (no sandbox appears);
image-gc's may remove an image; a proxy restarted on the same directory is reached
again by the client that used the old one, with no change on its side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from klet.cri import CRIError, CRISettings, RuntimeClient
from klet.cri.proxy import CRIProxy
from klet.cri.types import ContainerConfig, LinuxContainerSecurity, SandboxConfig
from klet.devstack import DevStack
from klet.model.types import ContainerID, SandboxID

IMAGE = "registry.klet.test/busybox:1.36"


async def started(devstack: DevStack, socket_dir: Path) -> CRIProxy:
    proxy = CRIProxy(
        runtime_endpoint=devstack.runtime_endpoint,
        sockets={s: socket_dir / f"{s}.sock" for s in ("status-reporter", "eviction", "image-gc")},
    )
    await proxy.start()
    return proxy


@pytest.fixture
async def proxy(devstack: DevStack, tmp_path: Path) -> AsyncIterator[CRIProxy]:
    p = await started(devstack, tmp_path / "cri")
    try:
        yield p
    finally:
        await p.stop()


def client(proxy: CRIProxy, service: str) -> RuntimeClient:
    endpoint = f"unix://{proxy.sockets[service]}"
    return RuntimeClient(CRISettings(runtime_endpoint=endpoint, timeout_s=30))


async def test_status_reporter_lists_and_is_refused_creating(
    proxy: CRIProxy, devstack: DevStack
) -> None:
    direct = RuntimeClient(CRISettings(runtime_endpoint=devstack.runtime_endpoint, timeout_s=30))
    cri = client(proxy, "status-reporter")
    try:
        await direct.pull_image(IMAGE)
        before = {s.id for s in await direct.list_pod_sandboxes()}
        # Reads pass and answer what containerd answers directly.
        assert {c.id for c in await cri.list_containers()} == {
            c.id for c in await direct.list_containers()
        }
        assert {s.id for s in await cri.list_pod_sandboxes()} == before
        assert (await cri.version()).runtime_name == (await direct.version()).runtime_name
        assert any(i.id for i in await cri.list_images())

        config = SandboxConfig("proxy", "default", "uid-cri-proxy", 0, "proxy", "/tmp/klet-px")
        with pytest.raises(CRIError) as refused:
            await cri.run_pod_sandbox(config)
        assert refused.value.code == "PERMISSION_DENIED"
        assert "/runtime.v1.RuntimeService/RunPodSandbox" in str(refused.value)
        assert "status-reporter" in str(refused.value)

        container = ContainerConfig(
            "c",
            0,
            IMAGE,
            command=("sleep", "1"),
            log_path="c.log",
            security=LinuxContainerSecurity(),
        )
        with pytest.raises(CRIError) as refused:
            await cri.create_container(SandboxID("any"), container, config)
        assert refused.value.code == "PERMISSION_DENIED"
        assert "/runtime.v1.RuntimeService/CreateContainer" in str(refused.value)
        with pytest.raises(CRIError) as refused:
            await cri.start_container(ContainerID("any"))
        assert "/runtime.v1.RuntimeService/StartContainer" in str(refused.value)

        # A method the client has no wrapper for, sent raw: refused by name too.
        path = proxy.sockets["status-reporter"]
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            raw = channel.unary_unary("/runtime.v1.RuntimeService/UpdateRuntimeConfig", None, None)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "UpdateRuntimeConfig" in (err.value.details() or "")

        # Nothing reached containerd.
        assert {s.id for s in await direct.list_pod_sandboxes()} == before
        assert proxy.refused_calls == 4
    finally:
        await cri.close()
        await direct.close()


async def test_image_gc_may_remove_and_eviction_may_not(proxy: CRIProxy) -> None:
    gc = client(proxy, "image-gc")
    ev = client(proxy, "eviction")
    try:
        # Passed to containerd, which answers for an image it does not have.
        try:
            await gc.remove_image("registry.klet.test/no-such-image:0")
        except CRIError as err:
            assert err.code != "PERMISSION_DENIED", err
        assert await ev.image_fs_info()
        with pytest.raises(CRIError) as refused:
            await ev.remove_image("registry.klet.test/no-such-image:0")
        assert refused.value.code == "PERMISSION_DENIED"
        assert "RemoveImage" in str(refused.value) and "eviction" in str(refused.value)
    finally:
        await gc.close()
        await ev.close()


async def test_a_restarted_proxy_is_reached_again(devstack: DevStack, tmp_path: Path) -> None:
    socket_dir = tmp_path / "cri"
    first = await started(devstack, socket_dir)
    cri = client(first, "eviction")
    try:
        await cri.list_containers()
        await first.stop()
        # A dead proxy's socket file left behind is replaced by the next one.
        (socket_dir / "eviction.sock").touch()
        second = await started(devstack, socket_dir)
        try:
            for _ in range(100):
                try:
                    await cri.list_containers()
                    break
                except CRIError:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("the client never reached the restarted proxy")
        finally:
            await second.stop()
    finally:
        await cri.close()
