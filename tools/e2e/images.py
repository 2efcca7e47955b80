"""The images Kubernetes' e2e suite runs, built offline and pushed to a local registry.

The [NodeConformance] tests pull four images: `e2e-test-images/agnhost`, `busybox` and
`nonewprivs`, and `pause`. The test machines cannot reach registry.k8s.io, so this
module makes them from what is here:

- **agnhost** and **nonewprivs** from their Go sources in the k8s.io/kubernetes module
  (`tools/e2e/build.sh` compiles them static), each as one layer over a base, in the
  shape their upstream Dockerfiles give them: agnhost at `/agnhost` with the `agnhost-2`
  link, the porter's `localhost.crt`/`localhost.key`, `/uploads`, the user
  `user-defined-in-image` (1000) in the group `group-defined-in-image` (50000),
  entrypoint `/agnhost` and CMD `pause`; nonewprivs' `nnp` setuid root in
  /usr/local/bin, CMD `nnp`.
- Upstream's bases are Alpine. agnhost's here is a Debian bookworm minbase made by
  tools/image (mmdebstrap) with the tools the tests run in it: curl (lifecycle hooks and
  the pod networking checks of [NodeConformance]), bash, nc, ip, iperf, ps; not Alpine's
  bind-tools (dig drags in 35 MB of ICU for DNS tests that are not node tests) nor
  coredns. nonewprivs needs nothing but nnp: its base is the dev stack's busybox layer.
- **busybox** and **pause** are the dev stack's own (klet.devstack.images) pushed again
  under the names the suite asks for; busybox also under each tag the CSI drivers'
  manifests name (`build_csi_manifest_images`: CSI Mock's driver pod runs
  `e2e-test-images/busybox:1.36.1-1`).
- **volume/nfs** (the NFS server of the storage specs, built only when a run asks for
  it: `extra=("VolumeNFSServer",)`) is upstream's Fedora + nfs-utils image redone on a
  Debian minbase with nfs-kernel-server, upstream's own `run_nfs.sh` and `index.html`
  from the module source, `/exports`, entrypoint run_nfs.sh and CMD `/exports /`. It
  serves only where the kernel has nfsd (and the node an NFS client); the script goes on
  to print "NFS started" when nfsd fails, so the server pod still runs and the specs
  that need only its address get it.

Names and tags are read from the suite's own table (`test/utils/image/manifest.go` in
the module cache; tools/e2e/suite.py), not repeated here, and so are the registries a
`KUBE_TEST_REPO_LIST` file can remap: the file written here points every public one at
the local registry host, and leaves the deliberately unreachable or authenticated ones
(invalid, private, gcAuthenticated) as they are. The suite reads that file when its
package loads, so it must be named by the KUBE_TEST_REPO_LIST environment variable of
the e2e.test process.

Layers and images are built with tools/image (gzip layers, reproducible tars, OCI
archive). The Debian rootfs is cached by tools/image under `$KLET_CACHE/image` (about a
minute to make the first time), the layers written entry by entry (tools/e2e/layers.py)
by their inputs under `$KLET_CACHE/e2e/<k8s>/images`, so a second run only hashes the
binaries and pushes nothing new.

    python -m tools.e2e.images [--registry 127.0.0.1:PORT] [--repo-list FILE] ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from klet.devstack.images import (
    TEST_REGISTRY_HOST,
    BuiltImage,
    ImageError,
    ImageSpec,
    build,
    build_layer,
    push,
    standard_images,
)

from tools.e2e.layers import (
    Entry,
    LayerError,
    cached_layer,
    dirs,
    file_digest,
    key,
    rootfs_files,
)
from tools.e2e.suite import (
    E2EImageError,
    SuiteImage,
    SuiteManifest,
    parse_manifest,
    repo_list_yaml,
)
from tools.image.layers import LayerCache, Rootfs, rootfs_layer
from tools.image.oci import (
    ImageConfig,
    Layer,
    compress_layer,
    image_config,
    manifest,
    sha256_digest,
    write_archive,
)

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"
# Alpine's default, which the upstream images inherit.
ALPINE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What agnhost's Dockerfile installs on Alpine, by Debian's names (bash is essential).
AGNHOST_ROOTFS = Rootfs(
    name="agnhost", packages=("curl", "iperf", "iproute2", "netcat-openbsd", "procps")
)
# The user and group agnhost's Dockerfile adds, appended to the rootfs's own files
# (SupplementalGroups tests run as 1000 and expect 50000 from the image's /etc/group).
AGNHOST_PASSWD = "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
AGNHOST_GROUP = (
    "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
)
# What volume/nfs's Dockerfile installs on Fedora (ps, nfs-utils), by Debian's names;
# nfs-kernel-server brings nfs-common and rpcbind (rpcinfo, rpcbind, rpc.statd).
NFS_ROOTFS = Rootfs(name="volume-nfs", packages=("nfs-kernel-server", "procps"))


@dataclass(frozen=True)
class Sources:
    """Where the inputs come from: the binaries build.sh made and the module source."""

    bin_dir: Path  # agnhost, nnp
    module_dir: Path  # $GOMODCACHE/k8s.io/kubernetes@<version>

    @property
    def k8s_version(self) -> str:
        return self.module_dir.name.partition("@")[2]

    def manifest(self) -> SuiteManifest:
        path = self.module_dir / "test/utils/image/manifest.go"
        try:
            return parse_manifest(path.read_text())
        except OSError as err:
            raise E2EImageError(f"cannot read {path}: {err}") from err


def build_binaries(*, cache: Path) -> Sources:
    """Run build.sh for agnhost and nnp (a check when they are cached); the sources."""
    env = {**os.environ, "KLET_CACHE": str(cache)}
    res = subprocess.run(
        ["bash", str(BUILD_SH), "agnhost", "nnp"], capture_output=True, text=True, env=env
    )
    if res.returncode != 0:
        raise E2EImageError(f"{BUILD_SH} exited {res.returncode}:\n{res.stderr[-3000:]}")
    bin_dir = Path(res.stdout.strip().splitlines()[-1])
    version = bin_dir.parent.name
    return Sources(bin_dir=bin_dir, module_dir=cache / f"go/mod/k8s.io/kubernetes@{version}")


def agnhost_entries(src: Sources, base: Layer) -> list[Entry]:
    porter = src.module_dir / "test/images/agnhost/porter"
    etc = rootfs_files(base, ("etc/passwd", "etc/group"))
    return [
        *dirs("etc", "home", "uploads"),
        Entry("home/user-defined-in-image", tarfile.DIRTYPE, 0o755, uid=1000, gid=1000),
        Entry("agnhost", mode=0o755, source=src.bin_dir / "agnhost"),
        Entry("agnhost-2", tarfile.SYMTYPE, 0o777, linkname="agnhost"),
        Entry("localhost.crt", source=porter / "localhost.crt"),
        Entry("localhost.key", source=porter / "localhost.key"),
        Entry("etc/passwd", data=etc["etc/passwd"] + AGNHOST_PASSWD.encode()),
        Entry("etc/group", data=etc["etc/group"] + AGNHOST_GROUP.encode()),
    ]


def nfs_entries(src: Sources) -> list[Entry]:
    image_dir = src.module_dir / "test/images/volume/nfs"
    return [
        *dirs("exports", "tmp", "usr", "usr/local", "usr/local/bin"),
        Entry("usr/local/bin/run_nfs.sh", mode=0o755, source=image_dir / "run_nfs.sh"),
        Entry("tmp/index.html", mode=0o644, source=image_dir / "index.html"),
    ]


def nonewprivs_entries(src: Sources) -> list[Entry]:
    return [
        *dirs("usr", "usr/local", "usr/local/bin"),
        # setuid root: the test checks that allowPrivilegeEscalation decides whether a
        # non-root user gets euid 0 from it.
        Entry("usr/local/bin/nnp", mode=0o4755, source=src.bin_dir / "nnp"),
    ]


def busybox_layer(cache: LayerCache) -> Layer:
    """The dev stack's busybox layer (the host's busybox-static), gzipped and cached."""
    raw = build_layer(standard_images()["busybox"])
    layer, _ = cache.put(
        key({"kind": "busybox-base", "sha256": hashlib.sha256(raw).hexdigest()}),
        lambda dest: (compress_layer([raw], dest), {"what": "busybox base"}),
    )
    return layer


def packed(
    reference: str, layers: list[Layer], config: ImageConfig, history: list[str]
) -> BuiltImage:
    """A built image of `layers` as klet.devstack's push() takes it (blobs in memory)."""
    body = image_config(layers, config, history=history)
    manifest_body = manifest(layers, body)
    name, _, tag = reference.rpartition(":")
    return BuiltImage(
        spec=ImageSpec(name=name, tag=tag),
        manifest=manifest_body,
        manifest_digest=sha256_digest(manifest_body),
        config_digest=sha256_digest(body),
        layer_digests=tuple(layer.digest for layer in layers),
        diff_ids=tuple(layer.diff_id for layer in layers),
        blobs={
            sha256_digest(body): body,
            **{layer.digest: layer.path.read_bytes() for layer in layers},
        },
    )


@dataclass(frozen=True)
class E2EImage:
    """One image of the suite, built: what it is, where it goes, what it weighs."""

    suite: SuiteImage
    reference: str  # under the mirror host, e.g. registry.klet.test/e2e-test-images/...
    image: BuiltImage
    layers: tuple[Layer, ...]  # the gzip layers on disk; empty for the dev stack's images

    @property
    def repository(self) -> str:
        return self.reference.rpartition(":")[0].partition("/")[2]

    @property
    def compressed_size(self) -> int:
        return len(self.image.manifest) + sum(len(b) for b in self.image.blobs.values())

    @property
    def uncompressed_size(self) -> int:
        if not self.layers:
            return self.compressed_size
        return sum(layer.uncompressed_size for layer in self.layers)


def nfs_image(src: Sources, *, cache: Path, host: str) -> E2EImage:
    """volume/nfs, the storage specs' NFS server (see the module docstring)."""
    suite = src.manifest()
    if "VolumeNFSServer" not in suite.images:
        raise E2EImageError("manifest.go: no entry for VolumeNFSServer")
    debian = rootfs_layer(NFS_ROOTFS, LayerCache(cache / "image")).layer
    image_dir = src.module_dir / "test/images/volume/nfs"
    nfs = cached_layer(
        LayerCache(cache / "e2e" / src.k8s_version / "images"),
        "volume-nfs",
        inputs={
            "base": debian.diff_id,
            "files": [file_digest(image_dir / f) for f in ("run_nfs.sh", "index.html")],
        },
        entries=lambda: nfs_entries(src),
    )
    ref = suite.reference("VolumeNFSServer", host)
    return E2EImage(
        suite.images["VolumeNFSServer"],
        ref,
        packed(
            ref,
            [debian, nfs],
            ImageConfig(
                entrypoint=["/usr/local/bin/run_nfs.sh"],
                cmd=["/exports", "/"],
                env={"PATH": ALPINE_PATH},
                labels={"org.opencontainers.image.version": src.k8s_version},
            ),
            [
                "mmdebstrap --variant=minbase "
                f"--include={','.join(sorted(NFS_ROOTFS.packages))} bookworm",
                f"k8s.io/kubernetes@{src.k8s_version}/test/images/volume/nfs",
            ],
        ),
        (debian, nfs),
    )


# The images a run may ask for beyond the four: ImageID -> builder.
EXTRA_IMAGES = {"VolumeNFSServer": nfs_image}

# The CSI drivers' manifests (test/e2e/testing-manifests/storage-csi/<dir>) name, besides
# tools/csi's sig-storage images, images of the suite's registries at tags of their own:
# CSI Mock's csi-mock-proxy.yaml runs `e2e-test-images/busybox:1.36.1-1` (the suite's
# BusyBox is 1.37.0-1), the container the embedded mock driver execs into for every
# NodeStage/NodePublish (proxy.PodDirIO). Without it the driver pod's busybox stays in
# ImagePullBackOff and each exec is "container not found", as upstream's kubelet answers
# for a container that is not running. The dev stack builds these names (devstack name).
CSI_MANIFEST_DIRS = ("hostpath", "mock")
CSI_MANIFEST_BUILDS = {"busybox": "busybox"}
# The registry whose images tools/csi builds (klet's tools.csi.images).
CSI_TOOLS_REGISTRY_KEY = "sigStorageRegistry"
_MANIFEST_IMAGE = re.compile(r"^\s*-?\s*image:\s*[\"']?([\w.-]+(?:/[\w.-]+)+):([\w.-]+)", re.M)


def csi_manifest_images(texts: Iterable[str], suite: SuiteManifest) -> list[SuiteImage]:
    """The images of the suite's own registries that the CSI manifest `texts` name
    but sig-storage's, which tools/csi builds (each once, sorted), as SuiteImages keyed
    by their registry. An image that nothing here builds is refused naming it."""
    by_default = {default: key for key, default in suite.registries.items()}
    found: dict[tuple[str, str], SuiteImage] = {}
    for text in texts:
        for repository, tag in _MANIFEST_IMAGE.findall(text):
            registry, _, name = repository.rpartition("/")
            key = by_default.get(registry)
            if (
                key is None
                or key == CSI_TOOLS_REGISTRY_KEY
                or (registry, name) in found
                and found[registry, name].tag == tag
            ):
                continue
            if name not in CSI_MANIFEST_BUILDS:
                raise E2EImageError(
                    f"the CSI manifests name {repository}:{tag}, which tools/e2e does not "
                    f"build (it builds {sorted(CSI_MANIFEST_BUILDS)})"
                )
            if (registry, name) in found:
                raise E2EImageError(
                    f"the CSI manifests name {repository} with tags "
                    f"{found[registry, name].tag} and {tag}"
                )
            found[registry, name] = SuiteImage(f"csi-manifest:{name}", key, name, tag)
    return [found[k] for k in sorted(found)]


def build_csi_manifest_images(src: Sources, *, host: str = TEST_REGISTRY_HOST) -> list[E2EImage]:
    """csi_manifest_images() of the module's storage-csi manifests, built (the dev
    stack's images) and named for the mirror `host`."""
    suite = src.manifest()
    root = src.module_dir / "test/e2e/testing-manifests/storage-csi"
    paths = sorted(p for d in CSI_MANIFEST_DIRS for p in (root / d).rglob("*.yaml"))
    if not paths:
        raise E2EImageError(f"no manifests under {root}")
    out = []
    for image in csi_manifest_images((p.read_text() for p in paths), suite):
        ref = f"{suite.mirror(host)[image.registry_key]}/{image.name}:{image.tag}"
        built = build(standard_images()[CSI_MANIFEST_BUILDS[image.name]])
        out.append(E2EImage(image, ref, built, ()))
    return out


def build_images(
    src: Sources, *, cache: Path, host: str = TEST_REGISTRY_HOST, extra: Iterable[str] = ()
) -> list[E2EImage]:
    """The four images, and the `extra` ones (EXTRA_IMAGES keys), named for the mirror
    `host`, from cached layers where possible."""
    unknown = sorted(set(extra) - EXTRA_IMAGES.keys())
    if unknown:
        raise E2EImageError(f"no builder for {', '.join(unknown)}; known: {sorted(EXTRA_IMAGES)}")
    suite = src.manifest()
    layers = LayerCache(cache / "e2e" / src.k8s_version / "images")
    busybox = busybox_layer(layers)
    debian = rootfs_layer(AGNHOST_ROOTFS, LayerCache(cache / "image")).layer
    porter = src.module_dir / "test/images/agnhost/porter"
    agnhost = cached_layer(
        layers,
        "agnhost",
        inputs={
            "base": debian.diff_id,
            "agnhost": file_digest(src.bin_dir / "agnhost"),
            "porter": [file_digest(porter / f) for f in ("localhost.crt", "localhost.key")],
            "passwd": AGNHOST_PASSWD,
            "group": AGNHOST_GROUP,
        },
        entries=lambda: agnhost_entries(src, debian),
    )
    nnp = cached_layer(
        layers,
        "nonewprivs",
        inputs={"nnp": file_digest(src.bin_dir / "nnp")},
        entries=lambda: nonewprivs_entries(src),
    )
    labels = {"org.opencontainers.image.version": src.k8s_version}

    def ref(image_id: str) -> str:
        return suite.reference(image_id, host)

    out = [
        E2EImage(
            suite.images["Agnhost"],
            ref("Agnhost"),
            packed(
                ref("Agnhost"),
                [debian, agnhost],
                ImageConfig(
                    entrypoint=["/agnhost"],
                    cmd=["pause"],
                    env={"PATH": ALPINE_PATH},
                    labels=labels,
                ),
                [
                    "mmdebstrap --variant=minbase "
                    f"--include={','.join(sorted(AGNHOST_ROOTFS.packages))} bookworm",
                    f"k8s.io/kubernetes@{src.k8s_version}/test/images/agnhost",
                ],
            ),
            (debian, agnhost),
        ),
        E2EImage(
            suite.images["Nonewprivs"],
            ref("Nonewprivs"),
            packed(
                ref("Nonewprivs"),
                [busybox, nnp],
                ImageConfig(entrypoint=[], cmd=["nnp"], env={"PATH": ALPINE_PATH}, labels=labels),
                [
                    "busybox-static (klet.devstack.images)",
                    f"k8s.io/kubernetes@{src.k8s_version}/test/images/nonewprivs",
                ],
            ),
            (busybox, nnp),
        ),
    ]
    for image_id, devstack_name in (("BusyBox", "busybox"), ("Pause", "pause")):
        out.append(
            E2EImage(
                suite.images[image_id],
                ref(image_id),
                build(standard_images()[devstack_name]),
                (),
            )
        )
    out += [EXTRA_IMAGES[image_id](src, cache=cache, host=host) for image_id in extra]
    return out


def push_images(images: Iterable[E2EImage], registry: str) -> dict[str, str]:
    """Push each image to the plain-HTTP registry at `registry` (host:port) under its
    mirror repository and tag; unchanged ones are skipped. Reference -> manifest digest."""
    return {
        img.reference: push(
            img.image, registry, repository=img.repository, tag=img.suite.tag, timeout_s=120
        )
        for img in images
    }


def write_archives(images: Iterable[E2EImage], out_dir: Path) -> list[Path]:
    """The built images as OCI archives (for `ctr images import` / `skopeo copy`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for img in images:
        if not img.layers:
            continue
        # volume/nfs -> volume-nfs-1.4.oci.tar
        dest = out_dir / f"{img.suite.name.replace('/', '-')}-{img.suite.tag}.oci.tar"
        config = img.image.blobs[img.image.config_digest]
        write_archive(dest, reference=img.reference, layers=list(img.layers), config=config)
        paths.append(dest)
    return paths


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m tools.e2e.images", description=doc[:80])
    parser.add_argument(
        "--registry", help="host:port of a plain-HTTP registry to push to (default: no push)"
    )
    parser.add_argument(
        "--host",
        default=TEST_REGISTRY_HOST,
        help="the registry host name the node's containerd maps to that registry "
        f"(default {TEST_REGISTRY_HOST}, as the dev stack's containerd does)",
    )
    parser.add_argument("--repo-list", type=Path, help="write the KUBE_TEST_REPO_LIST file here")
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        choices=sorted(EXTRA_IMAGES),
        help="also build this image of the suite (repeatable)",
    )
    parser.add_argument("--out-dir", type=Path, help="also write OCI archives here")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("KLET_CACHE", "/var/cache/klet")),
        help="binaries, module and layer cache (default $KLET_CACHE or /var/cache/klet)",
    )
    args = parser.parse_args(argv)
    try:
        src = build_binaries(cache=args.cache_dir)
        images = build_images(src, cache=args.cache_dir, host=args.host, extra=args.extra)
        if args.out_dir:
            write_archives(images, args.out_dir)
        if args.registry:
            push_images(images, args.registry)
        if args.repo_list:
            args.repo_list.write_text(repo_list_yaml(src.manifest(), args.host))
    except (E2EImageError, LayerError, ImageError, OSError) as err:
        print(f"e2e images: {err}", file=sys.stderr)
        return 1
    for img in images:
        print(
            json.dumps(
                {
                    "reference": img.reference,
                    "digest": img.image.manifest_digest,
                    "compressed_bytes": img.compressed_size,
                    "uncompressed_bytes": img.uncompressed_size,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
