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
  under the names the suite asks for.

Names and tags are read from the suite's own table (`test/utils/image/manifest.go` in
the module cache), not repeated here, and so are the registries a `KUBE_TEST_REPO_LIST`
file can remap: the file written here points every public one at the local registry
host, and leaves the deliberately unreachable or authenticated ones (invalid, private,
gcAuthenticated) as they are. The suite reads that file when its package loads, so it
must be named by the KUBE_TEST_REPO_LIST environment variable of the e2e.test process.

Layers and images are built with tools/image (gzip layers, reproducible tars, OCI
archive). The Debian rootfs is cached by tools/image under `$KLET_CACHE/image` (about a
minute to make the first time), the other layers by their inputs under
`$KLET_CACHE/e2e/<k8s>/images`, so a second run only hashes the binaries and pushes
nothing new.

    python -m tools.e2e.images [--registry 127.0.0.1:PORT] [--repo-list FILE] ...
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
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

from tools.image.layers import LayerCache, Rootfs, rootfs_layer
from tools.image.oci import (
    FIXED_MTIME,
    ImageConfig,
    Layer,
    canonical_json,
    compress_layer,
    image_config,
    manifest,
    sha256_digest,
    write_archive,
)

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"
# Bumped when the way an image is put together changes, so cached layers are not reused.
LAYOUT_VERSION = 1
# Alpine's default, which the upstream images inherit.
ALPINE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# RegistryList fields the repo list leaves alone: a registry meant not to exist, and the
# ones that need credentials the tests bring themselves.
NOT_MIRRORED = frozenset({"invalidRegistry", "gcAuthenticatedRegistry", "privateRegistry"})
# The ImageIDs of manifest.go this module provides.
PROVIDED = ("Agnhost", "BusyBox", "Nonewprivs", "Pause")

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


class E2EImageError(RuntimeError):
    """The suite's image table could not be read, or an image could not be built."""


@dataclass(frozen=True)
class SuiteImage:
    """One image as the suite names it: `<registry of registry_key>/<name>:<tag>`."""

    image_id: str  # the ImageID constant in manifest.go, e.g. Agnhost
    registry_key: str  # the RegistryList YAML key, e.g. promoterE2eRegistry
    name: str
    tag: str


@dataclass(frozen=True)
class SuiteManifest:
    """What manifest.go says: the images by ImageID, the default registry of each key."""

    images: dict[str, SuiteImage]
    registries: dict[str, str]  # YAML key -> default, e.g. gcRegistry -> registry.k8s.io

    def mirror(self, host: str) -> dict[str, str]:
        """The KUBE_TEST_REPO_LIST mapping that serves every public registry from `host`:
        `registry.k8s.io/e2e-test-images` becomes `<host>/e2e-test-images`."""
        mapped = {}
        for key, default in sorted(self.registries.items()):
            if key in NOT_MIRRORED:
                continue
            _, _, path = default.partition("/")
            mapped[key] = f"{host}/{path}" if path else host
        return mapped

    def reference(self, image_id: str, host: str) -> str:
        """Where the suite pulls `image_id` from once its repo list is mirror(`host`)."""
        image = self.images[image_id]
        return f"{self.mirror(host)[image.registry_key]}/{image.name}:{image.tag}"


_FIELD = re.compile(r"^\s*(\w+)\s+string\s+`yaml:\"(\w+)\"`", re.M)
_DEFAULT = re.compile(r"^\s*(\w+):\s+\"([^\"]+)\",", re.M)
_CONFIG = re.compile(r"configs\[(\w+)\] = Config\{list\.(\w+), \"([^\"]+)\", \"([^\"]+)\"\}")


def parse_manifest(source: str) -> SuiteManifest:
    """Read the image table of test/utils/image/manifest.go (its `RegistryList` struct,
    the `initRegistry` defaults and the `configs[...] = Config{...}` lines)."""
    keys = dict(_FIELD.findall(source))
    start = source.find("initRegistry = RegistryList{")
    end = source.find("\n\t}", start)
    if not keys or start < 0 or end < 0:
        raise E2EImageError("manifest.go: no RegistryList struct or initRegistry block")
    defaults = dict(_DEFAULT.findall(source[start:end]))
    registries: dict[str, str] = {}
    for field, key in keys.items():
        if field not in defaults:
            raise E2EImageError(f"manifest.go: initRegistry has no default for {field}")
        registries[key] = defaults[field]
    images: dict[str, SuiteImage] = {}
    for image_id, field, name, tag in _CONFIG.findall(source):
        if field not in keys:
            raise E2EImageError(f"manifest.go: {image_id} uses unknown registry {field}")
        images[image_id] = SuiteImage(image_id, keys[field], name, tag)
    if missing := [i for i in PROVIDED if i not in images]:
        raise E2EImageError(f"manifest.go: no entry for {', '.join(missing)}")
    return SuiteManifest(images=images, registries=registries)


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


@dataclass(frozen=True)
class Entry:
    """One member of a layer tar that the builder writes itself."""

    path: str
    kind: bytes = tarfile.REGTYPE
    mode: int = 0o644
    data: bytes = b""
    source: Path | None = None  # a file to copy instead of `data`
    linkname: str = ""
    uid: int = 0
    gid: int = 0


def tar_entries(entries: Iterable[Entry]) -> bytes:
    """An uncompressed layer tar: parents first, fixed times, the given owners and modes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(e.path)
            info.type = e.kind
            info.mode = e.mode
            info.mtime = FIXED_MTIME
            info.uid, info.gid = e.uid, e.gid
            info.linkname = e.linkname
            data = e.source.read_bytes() if e.source is not None else e.data
            if e.kind == tarfile.REGTYPE:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def dirs(*paths: str, mode: int = 0o755) -> list[Entry]:
    return [Entry(p, tarfile.DIRTYPE, mode) for p in paths]


def rootfs_files(layer: Layer, names: tuple[str, ...]) -> dict[str, bytes]:
    """Regular files of a rootfs layer by path (`etc/passwd`), read from its blob."""
    found: dict[str, bytes] = {}
    with tarfile.open(layer.path, mode="r:gz") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if name in names and member.isreg():
                data = tar.extractfile(member)
                if data is not None:
                    found[name] = data.read()
            if len(found) == len(names):
                return found
    raise E2EImageError(f"{layer.path}: no {', '.join(sorted(set(names) - set(found)))}")


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


def nonewprivs_entries(src: Sources) -> list[Entry]:
    return [
        *dirs("usr", "usr/local", "usr/local/bin"),
        # setuid root: the test checks that allowPrivilegeEscalation decides whether a
        # non-root user gets euid 0 from it.
        Entry("usr/local/bin/nnp", mode=0o4755, source=src.bin_dir / "nnp"),
    ]


def _key(parts: Mapping[str, object]) -> str:
    return hashlib.sha256(canonical_json({**parts, "layout": LAYOUT_VERSION})).hexdigest()[:32]


def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cached_layer(
    cache: LayerCache,
    what: str,
    *,
    inputs: Mapping[str, object],
    entries: Callable[[], list[Entry]],
) -> Layer:
    """The gzip layer of `entries()`, from the cache when it was built from the same
    `inputs` (the digests of what goes in; how it goes in is LAYOUT_VERSION's)."""
    layer, _ = cache.put(
        _key({"kind": what, **inputs}),
        lambda dest: (compress_layer([tar_entries(entries())], dest), {"what": what}),
    )
    return layer


def busybox_layer(cache: LayerCache) -> Layer:
    """The dev stack's busybox layer (the host's busybox-static), gzipped and cached."""
    raw = build_layer(standard_images()["busybox"])
    layer, _ = cache.put(
        _key({"kind": "busybox-base", "sha256": hashlib.sha256(raw).hexdigest()}),
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


def build_images(src: Sources, *, cache: Path, host: str = TEST_REGISTRY_HOST) -> list[E2EImage]:
    """The four images, named for the mirror `host`, from cached layers where possible."""
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
            "agnhost": _file_digest(src.bin_dir / "agnhost"),
            "porter": [_file_digest(porter / f) for f in ("localhost.crt", "localhost.key")],
            "passwd": AGNHOST_PASSWD,
            "group": AGNHOST_GROUP,
        },
        entries=lambda: agnhost_entries(src, debian),
    )
    nnp = cached_layer(
        layers,
        "nonewprivs",
        inputs={"nnp": _file_digest(src.bin_dir / "nnp")},
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
        dest = out_dir / f"{img.suite.name}-{img.suite.tag}.oci.tar"
        config = img.image.blobs[img.image.config_digest]
        write_archive(dest, reference=img.reference, layers=list(img.layers), config=config)
        paths.append(dest)
    return paths


def repo_list_yaml(suite: SuiteManifest, host: str) -> str:
    """The KUBE_TEST_REPO_LIST file content that makes the suite pull from `host`."""
    return yaml.safe_dump(suite.mirror(host), sort_keys=True)


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
        images = build_images(src, cache=args.cache_dir, host=args.host)
        if args.out_dir:
            write_archives(images, args.out_dir)
        if args.registry:
            push_images(images, args.registry)
        if args.repo_list:
            args.repo_list.write_text(repo_list_yaml(src.manifest(), args.host))
    except (E2EImageError, ImageError, OSError) as err:
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
