"""The e2e suite's images, built offline (tools/e2e/images.py), serve and run.

Covers: the four images the [NodeConformance] tests pull are in the dev stack's registry
under the names the written KUBE_TEST_REPO_LIST file gives them (busybox and pause being
the dev stack's own); their configs carry upstream's entrypoint and CMD; agnhost, pulled
and run through klet's CRI client on the dev stack's containerd, starts as `/agnhost
pause`, is version 2.56, has the image user and group, /uploads, the porter's key pair
and the agnhost-2 link, curl reaches a second agnhost serving netexec in the pod, bash, nc,
ip and ps are there, and it handles SIGTERM itself (exit code 2); nonewprivs' nnp is
setuid root, so a non-root container gets euid 0 from it unless no_new_privs is set.

Cost: the module fixture runs tools/e2e/build.sh for agnhost and nnp, then packs and
pushes the images. Warm (binaries and layers cached) the module takes about 20 s, most
of it pushing and unpacking agnhost (50 MB compressed). The first run on a machine
adds about 85 s when GOCACHE already holds the k8s packages (tools/cluster): agnhost
7 s, nnp under 1 s, agnhost's Debian rootfs 55 s (mmdebstrap, downloading packages),
the gzip of the layers. On empty Go caches it first downloads the k8s.io/kubernetes
module and compiles agnhost's dependencies (minutes): hence the long timeout here.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from klet.cri import RuntimeClient
from klet.cri.types import (
    ContainerConfig,
    ContainerState,
    ContainerStatusInfo,
    LinuxContainerSecurity,
    SandboxConfig,
)
from klet.devstack import DevStack
from klet.model.types import ContainerID, SandboxID

from tests.harness.devstackio import cri_call, registry_get
from tests.harness.waiting import wait_for
from tools.e2e.images import E2EImage, build_binaries, build_images, push_images
from tools.e2e.suite import repo_list_yaml

pytestmark = pytest.mark.timeout(900)


# What the suite pulls (test/utils/image/manifest.go of v1.34.4, issue 16), written out
# here rather than read from the parser under test.
UPSTREAM = {
    "agnhost": "registry.k8s.io/e2e-test-images/agnhost:2.56",
    "busybox": "registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
    "nonewprivs": "registry.k8s.io/e2e-test-images/nonewprivs:1.3",
    "pause": "registry.k8s.io/pause:3.10.1",
}
# RegistryList keys of the upstream registries above.
UPSTREAM_KEYS = {
    "registry.k8s.io/e2e-test-images": "promoterE2eRegistry",
    "registry.k8s.io": "gcRegistry",
}
ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


@dataclass(frozen=True)
class SuiteImages:
    images: dict[str, E2EImage]  # by upstream name: agnhost, busybox, ...
    repo_list: dict[str, str]  # the KUBE_TEST_REPO_LIST file, parsed


@pytest.fixture(scope="module")
def suite_images(
    devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SuiteImages]:
    cache = Path(os.environ.get("KLET_CACHE", "/var/cache/klet"))
    src = build_binaries(cache=cache)
    built = build_images(src, cache=cache)
    push_images(built, devstack.registry_address)
    path = tmp_path_factory.mktemp("e2e") / "repo-list.yaml"
    path.write_text(repo_list_yaml(src.manifest(), "registry.klet.test"))
    yield SuiteImages(
        images={img.suite.name: img for img in built}, repo_list=yaml.safe_load(path.read_text())
    )

    # The shared containerd keeps no image of this module's. busybox and pause are not
    # pulled here: removing them would remove the dev stack's own (the same image).
    async def remove(c: RuntimeClient) -> None:
        for name in ("agnhost", "nonewprivs"):
            await c.remove_image(next(i.reference for i in built if i.suite.name == name))

    cri_call(devstack, remove)


def local_reference(upstream: str, repo_list: dict[str, str]) -> str:
    """Where the suite pulls `upstream` from under `repo_list`, as manifest.go maps it."""
    registry, _, name_tag = upstream.rpartition("/")
    return f"{repo_list[UPSTREAM_KEYS[registry]]}/{name_tag}"


def image_config(devstack: DevStack, reference: str) -> dict[str, object]:
    """The `config` object of `reference`'s image config, read back from the registry."""
    repository, _, tag = reference.partition("/")[2].rpartition(":")
    manifest = registry_get(devstack, f"/v2/{repository}/manifests/{tag}", accept=ACCEPT).json()
    blob = registry_get(
        devstack, f"/v2/{repository}/blobs/{manifest['config']['digest']}", accept=ACCEPT
    )
    config = json.loads(blob.content)["config"]
    assert isinstance(config, dict)
    return config


def test_registry_holds_the_images_under_the_repo_list_names(
    devstack: DevStack, suite_images: SuiteImages
) -> None:
    assert suite_images.repo_list["promoterE2eRegistry"] == "registry.klet.test/e2e-test-images"
    assert suite_images.repo_list["gcRegistry"] == "registry.klet.test"
    # Meant to fail or to need credentials: left to the suite's defaults.
    assert "invalidRegistry" not in suite_images.repo_list
    assert "privateRegistry" not in suite_images.repo_list
    for name, upstream in UPSTREAM.items():
        reference = local_reference(upstream, suite_images.repo_list)
        assert suite_images.images[name].reference == reference
        repository, _, tag = reference.partition("/")[2].rpartition(":")
        head = httpx.head(
            f"http://{devstack.registry_address}/v2/{repository}/manifests/{tag}",
            headers={"Accept": ACCEPT},
            trust_env=False,
        )
        assert head.status_code == 200, reference
        assert (
            head.headers["Docker-Content-Digest"] == suite_images.images[name].image.manifest_digest
        )
    # busybox and pause are the dev stack's images under a second name.
    for name in ("busybox", "pause"):
        assert (
            suite_images.images[name].image.manifest_digest == devstack.images[name].manifest_digest
        )


def test_image_configs_are_upstreams(devstack: DevStack, suite_images: SuiteImages) -> None:
    agnhost = image_config(devstack, suite_images.images["agnhost"].reference)
    assert agnhost["Entrypoint"] == ["/agnhost"]
    assert agnhost["Cmd"] == ["pause"]
    nonewprivs = image_config(devstack, suite_images.images["nonewprivs"].reference)
    assert nonewprivs["Cmd"] == ["nnp"]
    assert not nonewprivs.get("Entrypoint")
    assert "/usr/local/bin" in str(nonewprivs["Env"])
    assert image_config(devstack, suite_images.images["busybox"].reference)["Cmd"] == ["sh"]


@pytest.fixture
def sandbox(devstack: DevStack) -> Iterator[tuple[SandboxID, SandboxConfig]]:
    uid = str(uuid.uuid4())
    config = SandboxConfig(
        name=f"e2e-images-{uid[:8]}",
        namespace="e2e-images",
        uid=uid,
        attempt=0,
        hostname="e2e-images",
        log_directory=str(devstack.dir / "pod-logs" / uid),
    )
    sandbox_id = cri_call(devstack, lambda c: c.run_pod_sandbox(config))
    try:
        yield sandbox_id, config
    finally:

        async def remove(c: RuntimeClient) -> None:
            await c.stop_pod_sandbox(sandbox_id)
            await c.remove_pod_sandbox(sandbox_id)

        cri_call(devstack, remove)


def start(
    devstack: DevStack,
    sandbox: tuple[SandboxID, SandboxConfig],
    config: ContainerConfig,
) -> ContainerID:
    sandbox_id, sandbox_config = sandbox

    async def run(c: RuntimeClient) -> ContainerID:
        await c.pull_image(config.image)
        container_id = await c.create_container(sandbox_id, config, sandbox_config)
        await c.start_container(container_id)
        return container_id

    return cri_call(devstack, run)


def exec_ok(devstack: DevStack, container_id: ContainerID, cmd: list[str]) -> str:
    code, out, err = cri_call(devstack, lambda c: c.exec_sync(container_id, cmd, timeout_s=30))
    assert code == 0, (cmd, out, err)
    return out.decode()


def log_text(sandbox: tuple[SandboxID, SandboxConfig], log_path: str) -> str:
    return Path(sandbox[1].log_directory, log_path).read_text()


def test_agnhost_runs_on_containerd(
    devstack: DevStack,
    suite_images: SuiteImages,
    sandbox: tuple[SandboxID, SandboxConfig],
) -> None:
    image = suite_images.images["agnhost"]
    # No command or args: the image's entrypoint and CMD, as most e2e pods run it.
    container_id = start(
        devstack,
        sandbox,
        ContainerConfig(
            name="agnhost",
            attempt=0,
            image=image.reference,
            log_path="agnhost.log",
            # Its own PID namespace (the kubelet's default), so its entrypoint is PID 1.
            security=LinuxContainerSecurity(),
        ),
    )
    status = cri_call(devstack, lambda c: c.container_status(container_id))
    assert status.state is ContainerState.RUNNING
    name = image.reference.rpartition(":")[0]
    assert status.image_ref == f"{name}@{image.image.manifest_digest}"
    assert exec_ok(devstack, container_id, ["cat", "/proc/1/cmdline"]) == "/agnhost\0pause\0"
    assert exec_ok(devstack, container_id, ["/agnhost-2", "--version"]) == "app version 2.56\n"
    assert exec_ok(devstack, container_id, ["id", "-G", "user-defined-in-image"]) == "1000 50000\n"
    exec_ok(devstack, container_id, ["test", "-d", "/uploads"])
    cert = exec_ok(devstack, container_id, ["cat", "/localhost.crt"])
    assert cert.startswith("-----BEGIN CERTIFICATE-----")
    # The tools the tests run inside agnhost: curl (lifecycle hooks, pod networking
    # checks) against a second agnhost serving netexec in the same pod, bash, nc, ip.
    start(
        devstack,
        sandbox,
        ContainerConfig(
            name="netexec",
            attempt=0,
            image=image.reference,
            args=("netexec", "--http-port=8080", "--udp-port=8081"),
            log_path="netexec.log",
        ),
    )

    def echoed() -> str | None:
        code, out, _ = cri_call(
            devstack,
            lambda c: c.exec_sync(
                container_id,
                ["sh", "-c", "curl -s 'http://127.0.0.1:8080/echo?msg=poststart'"],
                timeout_s=30,
            ),
        )
        return out.decode() if code == 0 else None

    assert wait_for(echoed, timeout_s=60, what="curl from agnhost to netexec") == "poststart"
    exec_ok(devstack, container_id, ["bash", "-c", "command -v nc ip ps"])
    wait_for(
        lambda: "Signals registered" in log_text(sandbox, "agnhost.log"),
        timeout_s=30,
        what="agnhost pause to handle signals",
    )

    cri_call(devstack, lambda c: c.stop_container(container_id, timeout_s=30))
    status = cri_call(devstack, lambda c: c.container_status(container_id))
    # agnhost pause handles SIGTERM itself and exits 2 (1 for SIGINT): PID 1 is agnhost.
    assert (status.state, status.exit_code) == (ContainerState.EXITED, 2)
    assert 'exiting because of signal "terminated"' in log_text(sandbox, "agnhost.log")


def test_nonewprivs_nnp_is_setuid_root(
    devstack: DevStack,
    suite_images: SuiteImages,
    sandbox: tuple[SandboxID, SandboxConfig],
) -> None:
    image = suite_images.images["nonewprivs"]
    for no_new_privs, expected in ((False, "Effective uid: 0"), (True, "Effective uid: 1000")):
        name = f"nnp-{str(no_new_privs).lower()}"
        container_id = start(
            devstack,
            sandbox,
            ContainerConfig(
                name=name,
                attempt=0,
                image=image.reference,
                log_path=f"{name}.log",
                security=LinuxContainerSecurity(run_as_user=1000, no_new_privs=no_new_privs),
            ),
        )

        def exited(cid: ContainerID = container_id) -> ContainerStatusInfo | None:
            status = cri_call(devstack, lambda c: c.container_status(cid))
            return status if status.state is ContainerState.EXITED else None

        status = wait_for(exited, timeout_s=60, what=f"{name} to print its euid and exit")
        assert status.exit_code == 0
        assert log_text(sandbox, f"{name}.log").rstrip().endswith(expected)
