"""`make image` builds images that the real tools accept and that run.

Builds `klet:<version>` and `klet-redis:<version>` with tools/image (the layer cache makes
this fast after the first run), then, against the test stack's own containerd and
registry: the archives import with `ctr images import`; a container from the klet image
runs `klet --help`, and every service's `klet run <service> --help` with `klet.devstack`
made unimportable (the dev stack is not part of a deployment), the gRPC stubs importable
and mount/umount on the PATH; the Redis image runs Debian's redis-server; `skopeo copy
oci-archive:` pushes the klet image to the registry unchanged. The docker-archive side
(`manifest.json`, which docker 20.10's `docker load` reads) is checked as docker checks
it: every layer's uncompressed digest is the config's diff_id, and skopeo reads it as a
`docker-archive:`. Building twice gives the same image, digest for digest.

Slow the first time (mmdebstrap, about two minutes); not part of `make test` yet: run it
with `make test-image`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from klet.devstack import DevStack

from tools.image.__main__ import version
from tools.image.oci import ANNOTATION_CONTAINERD_NAME, MEDIA_MANIFEST

pytestmark = [pytest.mark.image, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc")


@dataclass(frozen=True)
class Archive:
    path: Path
    reference: str

    def member(self, name: str) -> bytes:
        with tarfile.open(self.path) as tar:
            f = tar.extractfile(name)
            assert f is not None, name
            return f.read()

    def json(self, name: str) -> object:
        return json.loads(self.member(name))

    def containerd_name(self) -> str:
        index = self.json("index.json")
        assert isinstance(index, dict)
        return str(index["manifests"][0]["annotations"][ANNOTATION_CONTAINERD_NAME])

    def manifest_digest(self) -> str:
        index = self.json("index.json")
        assert isinstance(index, dict)
        return str(index["manifests"][0]["digest"])


def build_images(out: Path, *images: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "tools.image", "--out-dir", str(out), *images],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Archive]:
    out = tmp_path_factory.mktemp("image")
    build_images(out)
    return {
        "klet": Archive(out / f"klet-{version()}.oci.tar", f"klet:{version()}"),
        "redis": Archive(out / f"klet-redis-{version()}.oci.tar", f"klet-redis:{version()}"),
    }


@pytest.fixture(scope="module")
def imported(devstack: DevStack, archives: dict[str, Archive]) -> Iterator[DevStack]:
    assert devstack.containerd is not None
    for archive in archives.values():
        devstack.containerd.import_image(archive.path)
    yield devstack
    for archive in archives.values():
        devstack.containerd.ctr(["images", "rm", archive.containerd_name()])


def ctr_run(stack: DevStack, image: str, *command: str) -> subprocess.CompletedProcess[str]:
    """Run `command` (or the image's own entrypoint) to completion in a host-network container."""
    assert stack.containerd is not None
    argv = [
        "ctr",
        "--address",
        str(stack.containerd.socket),
        "--namespace",
        "k8s.io",
        "run",
        "--rm",
        "--net-host",
        image,
        f"klet-image-test-{uuid.uuid4().hex[:8]}",
        *command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_klet_image_runs_the_cli(imported: DevStack, archives: dict[str, Archive]) -> None:
    res = ctr_run(imported, archives["klet"].containerd_name())
    assert res.returncode == 0, res.stderr
    assert "usage: klet <command>" in res.stdout
    for service in SERVICES:
        assert service in res.stdout


# Every service parses its flags with klet.devstack unimportable (None in sys.modules
# makes `import` raise): a deployment does not carry the dev stack.
SERVICES_WITHOUT_DEVSTACK = f"""
import shutil, sys
sys.modules["klet.devstack"] = None
from klet.cli.main import main
import klet.rpc.gen.klet.podcontrol.v1.podcontrol_pb2_grpc
for service in {list(SERVICES)!r}:
    try:
        main(["run", service, "--help"])
    except SystemExit as done:
        assert done.code == 0, (service, done.code)
    else:
        raise AssertionError(service + ": --help did not exit")
    print("help-ok", service)
print("mount", shutil.which("mount"), "umount", shutil.which("umount"))
"""


def test_services_start_without_the_dev_stack(
    imported: DevStack, archives: dict[str, Archive]
) -> None:
    res = ctr_run(
        imported, archives["klet"].containerd_name(), "python3", "-c", SERVICES_WITHOUT_DEVSTACK
    )
    assert res.returncode == 0, res.stderr
    for service in SERVICES:
        assert f"help-ok {service}" in res.stdout
    assert "mount /usr/bin/mount umount /usr/bin/umount" in res.stdout


def test_redis_image_runs_redis_server(imported: DevStack, archives: dict[str, Archive]) -> None:
    res = ctr_run(imported, archives["redis"].containerd_name(), "redis-server", "--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Redis server v=7.")


def test_skopeo_pushes_the_archive_to_the_registry(
    devstack: DevStack, archives: dict[str, Archive]
) -> None:
    archive = archives["klet"]
    name, tag = archive.reference.split(":")
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            f"oci-archive:{archive.path}",
            f"docker://{devstack.registry_address}/{archive.reference}",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    resp = httpx.head(
        f"http://{devstack.registry_address}/v2/{name}/manifests/{tag}",
        headers={"Accept": MEDIA_MANIFEST},
        trust_env=False,
    )
    assert resp.status_code == 200
    assert resp.headers["Docker-Content-Digest"] == archive.manifest_digest()


@pytest.mark.parametrize("image", ["klet", "redis"])
def test_docker_archive_manifest_matches_the_image(
    archives: dict[str, Archive], image: str
) -> None:
    archive = archives[image]
    entries = archive.json("manifest.json")
    assert isinstance(entries, list) and len(entries) == 1
    entry = entries[0]
    assert entry["RepoTags"] == [archive.reference]
    config = archive.json(entry["Config"])
    assert isinstance(config, dict)
    assert "sha256:" + hashlib.sha256(archive.member(entry["Config"])).hexdigest() == (
        "sha256:" + Path(entry["Config"]).name
    )
    diff_ids = [
        "sha256:" + hashlib.sha256(gzip.decompress(archive.member(layer))).hexdigest()
        for layer in entry["Layers"]
    ]
    assert diff_ids == config["rootfs"]["diff_ids"]
    inspect = subprocess.run(
        ["skopeo", "inspect", "--raw", "--config", f"docker-archive:{archive.path}"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(inspect.stdout)["rootfs"]["diff_ids"] == diff_ids


def test_a_rebuild_is_the_same_image(archives: dict[str, Archive], tmp_path: Path) -> None:
    # Same inputs, same digests: a push of an unchanged image is a no-op and a node
    # that has the layers keeps them.
    build_images(tmp_path, "klet")
    again = Archive(tmp_path / archives["klet"].path.name, archives["klet"].reference)
    assert again.manifest_digest() == archives["klet"].manifest_digest()
