"""The CSI sidecar images of Kubernetes' storage e2e suite, built offline and pushed to
a local registry.

The suite deploys its CSI drivers from `test/e2e/testing-manifests/storage-csi/` and
rewrites every `registry.k8s.io/sig-storage/...` image through its `sigStorageRegistry`
(a KUBE_TEST_REPO_LIST key, mapped to `<host>/sig-storage` by tools/e2e's repo list). So
each image here is named `<host>/sig-storage/<name>:<tag>` with the name and tag the
manifests use, read from the manifests in the k8s.io/kubernetes module (not repeated
here): a version bump of the suite that asks for another tag than tools/csi/build.sh
builds fails here, naming both, instead of serving a binary under a tag it is not.

Shape, as upstream's Dockerfiles give it: the static binary at `/<name>`, entrypoint
`["/<name>"]`, on a base like distroless/static: `/etc/passwd` and `/etc/group` with
root, nobody and nonroot (65532), `/home/nonroot`, `/tmp` (1777). Unlike distroless it
carries no CA bundle or time zones: the sidecars reach only the apiserver, whose CA the
service-account volume brings, and a bundle copied from the build host would make the
image depend on that host.

hostpathplugin is the exception: upstream puts it on Alpine with util-linux, coreutils,
socat and tar, because the driver runs mount, umount and losetup (block volumes) and tar
(snapshots). Its base here is a Debian bookworm minbase made by tools/image with `mount`
(mount, umount, losetup) and socat; util-linux, coreutils and tar are in minbase.

Provided: every sig-storage image the csi-hostpath and CSI Mock manifests name
(csi-provisioner, csi-resizer, csi-snapshotter, csi-attacher, csi-node-driver-registrar,
csi-external-health-monitor-controller, livenessprobe, hostpathplugin; the last five
from the release sources in ../shared/third_party, see build.sh) and snapshot-controller,
which the suite expects the cluster to run. `--missing` lists any the manifests name
that nothing here provides.

    python -m tools.csi.images [--registry 127.0.0.1:PORT] [--host H] [--out-dir D]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from klet.devstack.images import TEST_REGISTRY_HOST, BuiltImage, ImageError, push

from tools.e2e.images import packed
from tools.e2e.layers import Entry, LayerError, cached_layer, dirs, file_digest
from tools.image.layers import LayerCache, Rootfs, rootfs_layer
from tools.image.oci import ImageConfig, Layer, write_archive

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"
UPSTREAM_REGISTRY = "registry.k8s.io/sig-storage"
# The manifests of the drivers the storage suites deploy: csi-hostpath and CSI Mock.
MANIFEST_DIRS = ("hostpath", "mock")
# Components built by build.sh that go into an image, in build.sh's names (= image names).
IMAGED = (
    "csi-provisioner",
    "csi-resizer",
    "csi-snapshotter",
    "snapshot-controller",
    "csi-attacher",
    "csi-node-driver-registrar",
    "csi-external-health-monitor-controller",
    "livenessprobe",
    "hostpathplugin",
)
# Components that need more than a static base (see the module docstring): their rootfs.
ROOTFS = {"hostpathplugin": Rootfs(name="csi-hostpathplugin", packages=("mount", "socat"))}
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Images the cluster needs although no storage-csi manifest names them: the snapshot
# controller, run by the cluster (as by upstream's CI), at its sidecar's version.
CLUSTER_IMAGES = {"snapshot-controller": "csi-snapshotter"}
STATIC_PASSWD = (
    "root:x:0:0:root:/root:/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
    "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
)
STATIC_GROUP = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"

_IMAGE_LINE = re.compile(
    r"^\s*-?\s*image:\s*[\"']?" + re.escape(UPSTREAM_REGISTRY) + r"/([\w.-]+):([\w.-]+)", re.M
)


class CSIImageError(RuntimeError):
    """The components could not be built, or do not match what the manifests name."""


def manifest_images(texts: Iterable[str]) -> dict[str, str]:
    """The sig-storage images the manifest `texts` name, name -> tag. Two tags for one
    name is an error: the suite would need both, and a repo list maps only registries."""
    found: dict[str, str] = {}
    for text in texts:
        for name, tag in _IMAGE_LINE.findall(text):
            if found.setdefault(name, tag) != tag:
                raise CSIImageError(f"manifests name {name} with tags {found[name]} and {tag}")
    return found


def read_manifests(module_dir: Path) -> dict[str, str]:
    """manifest_images() of the storage-csi manifests in the k8s.io/kubernetes module."""
    root = module_dir / "test/e2e/testing-manifests/storage-csi"
    paths = sorted(p for d in MANIFEST_DIRS for p in (root / d).rglob("*.yaml"))
    if not paths:
        raise CSIImageError(f"no manifests under {root}")
    return manifest_images(p.read_text() for p in paths)


@dataclass(frozen=True)
class Plan:
    """What to build: image name -> (binary, tag), and the names nothing here provides."""

    images: dict[str, tuple[Path, str]]
    missing: dict[str, str]  # name -> tag


def plan(wanted: Mapping[str, str], built: Mapping[str, tuple[Path, str]]) -> Plan:
    """Match the manifests' images (`wanted`, name -> tag) with the built components
    (name -> (path, version)). A built version that differs from the wanted tag fails."""
    images: dict[str, tuple[Path, str]] = {}
    for name, tag in sorted(wanted.items()):
        if name not in built:
            continue
        path, version = built[name]
        if version != tag:
            raise CSIImageError(
                f"the manifests ask for {name}:{tag}, tools/csi builds {name} {version}"
            )
        images[name] = (path, tag)
    for name, sidecar in CLUSTER_IMAGES.items():
        if name in built and sidecar in images:
            path, version = built[name]
            images[name] = (path, version)
    missing = {n: t for n, t in sorted(wanted.items()) if n not in images}
    return Plan(images=images, missing=missing)


def build_binaries(*, cache: Path) -> tuple[dict[str, tuple[Path, str]], Path]:
    """Run build.sh for the imaged components and csi-mock (whose build brings the
    k8s.io/kubernetes module, and so the manifests, into the module cache): name ->
    (binary, version), and that module's directory."""
    env = {**os.environ, "KLET_CACHE": str(cache)}
    res = subprocess.run(
        ["bash", str(BUILD_SH), *IMAGED, "csi-mock"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if res.returncode != 0:
        raise CSIImageError(f"{BUILD_SH} exited {res.returncode}:\n{res.stderr[-3000:]}")
    built: dict[str, tuple[Path, str]] = {}
    for line in res.stdout.splitlines():
        name, _, path = line.partition(" ")
        built[name] = (Path(path), Path(path).parent.name)  # .../<name>/<version>/<name>
    # csi-mock's version is k8s.io/kubernetes's plus the digest of our main.go.
    k8s_version = built.pop("csi-mock")[1].partition("-klet.")[0]
    return built, cache / "go/mod" / f"k8s.io/kubernetes@{k8s_version}"


def binary_entries(name: str, binary: Path) -> list[Entry]:
    return [Entry(name, mode=0o755, source=binary)]


def static_base_entries() -> list[Entry]:
    return [
        *dirs("etc", "home"),
        Entry("home/nonroot", tarfile.DIRTYPE, 0o700, uid=65532, gid=65532),
        Entry("tmp", tarfile.DIRTYPE, 0o1777),
        Entry("etc/passwd", data=STATIC_PASSWD.encode()),
        Entry("etc/group", data=STATIC_GROUP.encode()),
    ]


@dataclass(frozen=True)
class CSIImage:
    """One built image: where it goes and what it weighs."""

    name: str
    tag: str
    reference: str  # <host>/sig-storage/<name>:<tag>
    image: BuiltImage
    layers: tuple[Layer, ...]

    @property
    def repository(self) -> str:
        return f"sig-storage/{self.name}"

    @property
    def compressed_size(self) -> int:
        return len(self.image.manifest) + sum(len(b) for b in self.image.blobs.values())

    @property
    def uncompressed_size(self) -> int:
        return sum(layer.uncompressed_size for layer in self.layers)


def build_images(p: Plan, *, cache: Path, host: str = TEST_REGISTRY_HOST) -> list[CSIImage]:
    """The images of `p`, each the static base plus its binary, from cached layers."""
    layers = LayerCache(cache / "csi" / "images")
    base = cached_layer(
        layers,
        "csi-static-base",
        inputs={"passwd": STATIC_PASSWD, "group": STATIC_GROUP},
        entries=static_base_entries,
    )
    out = []
    for name, (binary, tag) in sorted(p.images.items()):
        layer = cached_layer(
            layers,
            f"csi-{name}",
            inputs={"name": name, "binary": file_digest(binary)},
            entries=partial(binary_entries, name, binary),
        )
        reference = f"{host}/sig-storage/{name}:{tag}"
        if name in ROOTFS:
            rootfs = ROOTFS[name]
            below = rootfs_layer(rootfs, LayerCache(cache / "image")).layer
            what = f"mmdebstrap --variant=minbase --include={','.join(rootfs.packages)} bookworm"
            path = DEBIAN_PATH
        else:
            below, what = base, "static base: passwd, group, /tmp (tools/csi/images.py)"
            path = "/usr/local/bin:/usr/bin:/bin"
        config = ImageConfig(
            entrypoint=[f"/{name}"],
            cmd=[],
            env={"PATH": path},
            labels={"org.opencontainers.image.version": tag},
        )
        image = packed(reference, [below, layer], config, [what, f"{name} {tag}"])
        out.append(CSIImage(name, tag, reference, image, (below, layer)))
    return out


def push_images(images: Iterable[CSIImage], registry: str) -> dict[str, str]:
    """Push each image to the plain-HTTP registry `registry` (host:port) as
    sig-storage/<name>:<tag>; unchanged ones move nothing. Reference -> manifest digest."""
    return {
        img.reference: push(
            img.image, registry, repository=img.repository, tag=img.tag, timeout_s=120
        )
        for img in images
    }


def write_archives(images: Iterable[CSIImage], out_dir: Path) -> list[Path]:
    """The images as OCI archives (for `ctr images import` / `skopeo copy`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for img in images:
        dest = out_dir / f"{img.name}-{img.tag}.oci.tar"
        config = img.image.blobs[img.image.config_digest]
        write_archive(dest, reference=img.reference, layers=list(img.layers), config=config)
        paths.append(dest)
    return paths


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m tools.csi.images", description=doc[:80])
    parser.add_argument("--registry", help="host:port of a plain-HTTP registry to push to")
    parser.add_argument(
        "--host",
        default=TEST_REGISTRY_HOST,
        help=f"the registry host the node's containerd maps to that registry "
        f"(default {TEST_REGISTRY_HOST})",
    )
    parser.add_argument("--out-dir", type=Path, help="also write OCI archives here")
    parser.add_argument(
        "--missing",
        action="store_true",
        help="exit 1 when the manifests name images that nothing here provides",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("KLET_CACHE", "/var/cache/klet")),
        help="binaries, module and layer cache (default $KLET_CACHE or /var/cache/klet)",
    )
    args = parser.parse_args(argv)
    try:
        built, module_dir = build_binaries(cache=args.cache_dir)
        p = plan(read_manifests(module_dir), built)
        images = build_images(p, cache=args.cache_dir, host=args.host)
        if args.out_dir:
            write_archives(images, args.out_dir)
        digests = push_images(images, args.registry) if args.registry else {}
    except (CSIImageError, LayerError, ImageError, OSError) as err:
        print(f"csi images: {err}", file=sys.stderr)
        return 1
    for img in images:
        record = {
            "reference": img.reference,
            "digest": img.image.manifest_digest,
            "compressed_bytes": img.compressed_size,
            "uncompressed_bytes": img.uncompressed_size,
        }
        if img.reference in digests:
            record["pushed"] = args.registry
        print(json.dumps(record))
    for name, tag in p.missing.items():
        print(f"csi images: not provided: {UPSTREAM_REGISTRY}/{name}:{tag}", file=sys.stderr)
    return 1 if args.missing and p.missing else 0


if __name__ == "__main__":
    sys.exit(main())
