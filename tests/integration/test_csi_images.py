"""The CSI sidecar images of the storage e2e suite (tools/csi/images.py) serve and run.

Covers: csi-provisioner v5.1.0, csi-resizer v1.13.1, csi-snapshotter v8.3.0,
snapshot-controller v8.3.0 and, built from the release sources in ../shared/third_party,
csi-attacher v4.8.0, csi-node-driver-registrar v2.13.0,
csi-external-health-monitor-controller v0.12.1, livenessprobe v2.15.0 and hostpathplugin
v1.16.1 are in the dev stack's registry as sig-storage/<name>:<tag>,
which is where the suite's `sigStorageRegistry`, mapped by tools/e2e's repo list to
registry.klet.test/sig-storage, sends the storage-csi manifests' registry.k8s.io/sig-storage
images; their configs have upstream's entrypoint `/<name>`; each, pulled and run through
klet's CRI client on the dev stack's containerd, reports its version and exits 0
(livenessprobe, which has no --version, prints its flags for --help and exits 0);
hostpathplugin's image has the mount, umount and losetup it runs; no image the manifests
name is left unprovided.

Needs the sidecar binaries built (`make csi-binaries`): a cold build is several minutes
(see tools/csi/README.md), more than `make test` spends on them yet, so only `make
test-csi` collects this module (tests/conftest.py). Cached, it takes a few seconds (the
images' layers are cached too).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.cri import RuntimeClient
from klet.cri.types import ContainerConfig, ContainerState, ContainerStatusInfo, SandboxConfig
from klet.devstack import DevStack
from klet.model.types import ContainerID

from tests.harness.devstackio import cri_call, registry_get
from tests.harness.waiting import wait_for
from tools.csi.images import (
    CSIImage,
    build_binaries,
    build_images,
    plan,
    push_images,
    read_manifests,
)
from tools.e2e.suite import parse_manifest

CACHE = Path(os.environ.get("KLET_CACHE", "/var/cache/klet"))

# What e2e v1.34.4's storage-csi manifests name (and the snapshot controller at its
# sidecar's version), written out here rather than read by the code under test.
EXPECTED = {
    "csi-provisioner": "v5.1.0",
    "csi-resizer": "v1.13.1",
    "csi-snapshotter": "v8.3.0",
    "snapshot-controller": "v8.3.0",
    "csi-attacher": "v4.8.0",
    "csi-external-health-monitor-controller": "v0.12.1",
    "csi-node-driver-registrar": "v2.13.0",
    "hostpathplugin": "v1.16.1",
    "livenessprobe": "v2.15.0",
}
ACCEPT = "application/vnd.oci.image.manifest.v1+json"


pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module")
def images(devstack: DevStack) -> Iterator[dict[str, CSIImage]]:
    built, module_dir = build_binaries(cache=CACHE)
    p = plan(read_manifests(module_dir), built)
    assert p.missing == {}
    out = build_images(p, cache=CACHE)
    push_images(out, devstack.registry_address)
    yield {img.name: img for img in out}

    async def remove(c: RuntimeClient) -> None:
        for img in out:
            await c.remove_image(img.reference)

    cri_call(devstack, remove)


def test_registry_holds_them_where_the_repo_list_points(
    devstack: DevStack, images: dict[str, CSIImage]
) -> None:
    module = CACHE / "go/mod/k8s.io/kubernetes@v1.34.4"
    suite = parse_manifest((module / "test/utils/image/manifest.go").read_text())
    mirror = suite.mirror("registry.klet.test")
    assert mirror["sigStorageRegistry"] == "registry.klet.test/sig-storage"
    assert {n: img.tag for n, img in images.items()} == EXPECTED
    for name, tag in EXPECTED.items():
        img = images[name]
        assert img.reference == f"{mirror['sigStorageRegistry']}/{name}:{tag}"
        manifest = registry_get(devstack, f"/v2/sig-storage/{name}/manifests/{tag}", accept=ACCEPT)
        assert manifest.headers["Docker-Content-Digest"] == img.image.manifest_digest
        config_digest = manifest.json()["config"]["digest"]
        blob = registry_get(
            devstack, f"/v2/sig-storage/{name}/blobs/{config_digest}", accept=ACCEPT
        )
        config = json.loads(blob.content)["config"]
        assert config["Entrypoint"] == [f"/{name}"]
        assert not config.get("Cmd")


def test_each_runs_on_containerd(devstack: DevStack, images: dict[str, CSIImage]) -> None:
    uid = str(uuid.uuid4())
    sandbox_config = SandboxConfig(
        name=f"csi-images-{uid[:8]}",
        namespace="csi-images",
        uid=uid,
        attempt=0,
        hostname="csi-images",
        log_directory=str(devstack.dir / "pod-logs" / uid),
    )
    sandbox_id = cri_call(devstack, lambda c: c.run_pod_sandbox(sandbox_config))
    # Each image with its own entrypoint, and hostpathplugin's with the tools it runs.
    hostpath_tools = "mount --version; umount --version; losetup --version; tar --version"
    runs: list[tuple[str, CSIImage, tuple[str, ...], tuple[str, ...]]] = [
        (name, img, (), ("--help",) if name == "livenessprobe" else ("--version",))
        for name, img in sorted(images.items())
    ]
    runs.append(("hostpath-tools", images["hostpathplugin"], ("/bin/sh", "-ec"), (hostpath_tools,)))
    try:
        for name, img, command, args in runs:
            config = ContainerConfig(
                name=name,
                attempt=0,
                image=img.reference,
                command=command,
                args=args,
                log_path=name,
            )

            async def run(c: RuntimeClient, config: ContainerConfig = config) -> ContainerID:
                await c.pull_image(config.image)
                cid = await c.create_container(sandbox_id, config, sandbox_config)
                await c.start_container(cid)
                return cid

            cid = cri_call(devstack, run)

            def exited(cid: ContainerID = cid) -> ContainerStatusInfo | None:
                status = cri_call(devstack, lambda c: c.container_status(cid))
                return status if status.state is ContainerState.EXITED else None

            status = wait_for(exited, timeout_s=60, what=f"{name} {args} to exit")
            log = Path(sandbox_config.log_directory, name).read_text()
            assert status.exit_code == 0, log
            if name == "livenessprobe":
                assert "-csi-address" in log, log
            elif name == "hostpath-tools":
                for tool in ("mount", "umount", "losetup"):
                    assert f"{tool} from util-linux" in log, log
                assert "GNU tar" in log, log
            else:
                # `<argv[0]> <version>`, as upstream's binaries print it.
                assert f"{name} {img.tag}" in log, log
    finally:

        async def remove(c: RuntimeClient) -> None:
            await c.stop_pod_sandbox(sandbox_id)
            await c.remove_pod_sandbox(sandbox_id)

        cri_call(devstack, remove)
