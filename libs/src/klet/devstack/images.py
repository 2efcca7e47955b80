"""OCI test images built from busybox-static, in memory, byte-for-byte reproducibly.
The documents and the archive are klet.devstack.oci's, shared with `make image`.

The tests need images they control: a pause image for sandboxes, a shell, a web server,
images of a known size for garbage-collection tests. Pulling them from the internet is
not an option, so they are assembled here from the host's static busybox: one layer with
busybox and a symlink per applet, an image config and an OCI manifest.

Trade-offs:

- The layer is stored uncompressed (``application/vnd.oci.image.layer.v1.tar``), so the
  layer digest equals its diff_id and the size a runtime reports is the size we wrote.
  busybox compresses to half, but the images are a few MB and only travel over loopback.
- Every tar header has a fixed mtime and owner and entries are sorted, and padding comes
  from a PRNG seeded by the image reference: the same spec always yields the same
  digests, so pushing again is a no-op and a re-run reuses what containerd already has.
"""

from __future__ import annotations

import functools
import io
import random
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from klet.devstack.oci import (
    ANNOTATION_CONTAINERD_NAME,
    ANNOTATION_REF_NAME,
    LAYOUT_MARKER,
    MEDIA_CONFIG,
    MEDIA_LAYER,
    MEDIA_MANIFEST,
    Descriptor,
    Named,
    blob_name,
    config_document,
    digest_of,
    index_document,
    manifest_document,
    tar_entry,
    write_layout,
)

__all__ = [
    "ANNOTATION_CONTAINERD_NAME",
    "ANNOTATION_REF_NAME",
    "BUSYBOX",
    "BUSYBOX_IMAGE",
    "HTTPD_IMAGE",
    "MEDIA_CONFIG",
    "MEDIA_LAYER",
    "MEDIA_MANIFEST",
    "PADDING_PATH",
    "PAUSE_IMAGE",
    "TEST_REGISTRY_HOST",
    "USR1_STOP_IMAGE",
    "BuiltImage",
    "Busybox",
    "ImageError",
    "ImageSpec",
    "build",
    "build_layer",
    "digest_of",
    "oci_archive_bytes",
    "push",
    "standard_images",
    "write_oci_archive",
]

BUSYBOX = Path("/bin/busybox")

TEST_REGISTRY_HOST = "registry.klet.test"
PAUSE_IMAGE = f"{TEST_REGISTRY_HOST}/pause:3.10"
BUSYBOX_IMAGE = f"{TEST_REGISTRY_HOST}/busybox:1.36"
HTTPD_IMAGE = f"{TEST_REGISTRY_HOST}/httpd:1.36"
# busybox whose image config names SIGUSR1 as its stop signal (Dockerfile STOPSIGNAL).
USR1_STOP_IMAGE = f"{TEST_REGISTRY_HOST}/busybox-usr1:1.36"

_DIRS = ("bin", "dev", "etc", "proc", "root", "sys", "tmp", "usr", "var", "www")
_SYMLINKS = {"sbin": "bin", "usr/bin": "../bin", "usr/sbin": "../bin"}
_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = b"root:x:0:\nnobody:x:65534:\n"
PADDING_PATH = "var/padding"


class ImageError(RuntimeError):
    """An image could not be built or pushed."""


@dataclass(frozen=True)
class ImageSpec:
    """What goes into one test image.

    ``name`` is the full repository name including the registry host
    (``registry.klet.test/busybox``); ``files`` maps absolute or relative paths in the
    image to their content (a content starting with ``#!`` is made executable);
    ``padding_bytes`` adds one incompressible file of exactly that size, for images of
    a known size.
    """

    name: str
    tag: str
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    padding_bytes: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    stop_signal: str | None = None
    workdir: str = "/"

    @property
    def reference(self) -> str:
        return f"{self.name}:{self.tag}"

    @property
    def registry_host(self) -> str:
        """The registry part of ``name`` (empty when the name has none)."""
        first, _, rest = self.name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            return first
        return ""

    @property
    def repository(self) -> str:
        """``name`` without its registry host, as the distribution API addresses it."""
        host = self.registry_host
        return self.name[len(host) + 1 :] if host else self.name


@dataclass(frozen=True)
class BuiltImage:
    """A built image: its manifest and every blob it references, by digest."""

    spec: ImageSpec
    manifest: bytes
    manifest_digest: str
    config_digest: str
    layer_digests: tuple[str, ...]
    diff_ids: tuple[str, ...]
    blobs: dict[str, bytes]

    @property
    def reference(self) -> str:
        return self.spec.reference

    @property
    def size(self) -> int:
        """Manifest + config + layers: what containerd reports as the image size."""
        return len(self.manifest) + sum(len(b) for b in self.blobs.values())


@dataclass(frozen=True)
class Busybox:
    """The busybox binary and its applet names, the content of every image's layer.

    A parameter rather than a global so unit tests can build images from a fake
    binary without touching the disk.
    """

    binary: bytes
    applets: tuple[str, ...]

    @staticmethod
    @functools.cache
    def from_host(path: Path = BUSYBOX) -> Busybox:
        """The host's busybox-static and the applets ``busybox --list`` names (cached)."""
        try:
            binary = path.read_bytes()
            out = subprocess.run(
                [str(path), "--list"], check=True, capture_output=True, timeout=10
            ).stdout.decode()
        except (OSError, subprocess.SubprocessError) as exc:
            raise ImageError(f"cannot use {path} (install busybox-static): {exc}") from exc
        applets = sorted(a for a in out.split() if a and a != "busybox" and "/" not in a)
        return Busybox(binary=binary, applets=tuple(applets))


def _padding(spec: ImageSpec) -> bytes:
    # Seeded by the reference so that two images of the same size do not share a layer
    # (GC tests count bytes per image) while a rebuild yields the same bytes.
    return random.Random(f"{spec.reference}:{spec.padding_bytes}").randbytes(spec.padding_bytes)


def build_layer(spec: ImageSpec, busybox: Busybox | None = None) -> bytes:
    """The uncompressed layer tar for ``spec``: busybox, applet links, /etc, extra files."""
    bb = busybox if busybox is not None else Busybox.from_host()
    dirs: set[str] = set(_DIRS)
    files: dict[str, tuple[bytes, int]] = {
        "bin/busybox": (bb.binary, 0o755),
        "etc/passwd": (_PASSWD, 0o644),
        "etc/group": (_GROUP, 0o644),
    }
    links: dict[str, str] = dict(_SYMLINKS)
    for applet in bb.applets:
        links[f"bin/{applet}"] = "busybox"
    if spec.padding_bytes:
        files[PADDING_PATH] = (_padding(spec), 0o644)
    for raw_path, content in spec.files.items():
        path = raw_path.strip("/")
        if not path or ".." in path.split("/"):
            raise ImageError(f"image {spec.reference}: invalid file path {raw_path!r}")
        links.pop(path, None)
        files[path] = (content, 0o755 if content.startswith(b"#!") else 0o644)
    for path in [*files, *links]:
        parts = path.split("/")[:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    # A directory under a symlinked path (usr/bin/x) would need the link target instead.
    dirs -= set(links)

    entries: list[tuple[str, tarfile.TarInfo, bytes | None]] = []
    for d in dirs:
        entries.append(
            (d, tar_entry(d, tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755), None)
        )
    for path, target in links.items():
        entries.append((path, tar_entry(path, tarfile.SYMTYPE, mode=0o777, linkname=target), None))
    for path, (content, mode) in files.items():
        entries.append(
            (path, tar_entry(path, tarfile.REGTYPE, mode=mode, size=len(content)), content)
        )
    # Parents sort before their children because "a" < "a/b".
    entries.sort(key=lambda e: e[0])

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for _, info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _image_config(spec: ImageSpec, diff_ids: Sequence[str]) -> bytes:
    env = {"PATH": "/bin", **spec.env}
    config: dict[str, Any] = {
        "Env": [f"{k}={v}" for k, v in env.items()],
        "WorkingDir": spec.workdir,
    }
    if spec.cmd:
        config["Cmd"] = list(spec.cmd)
    if spec.entrypoint is not None:
        config["Entrypoint"] = list(spec.entrypoint)
    if spec.labels:
        config["Labels"] = dict(spec.labels)
    if spec.stop_signal:
        config["StopSignal"] = spec.stop_signal
    return config_document(config, diff_ids=diff_ids, history=["klet.devstack.images"])


def build(spec: ImageSpec, *, busybox: Busybox | None = None) -> BuiltImage:
    """Build ``spec`` into a manifest and blobs, deterministically (a few ms)."""
    if spec.padding_bytes < 0:
        raise ImageError(f"image {spec.reference}: padding_bytes must be >= 0")
    layer = build_layer(spec, busybox)
    layer_digest = digest_of(layer)
    # Uncompressed: the blob is the tar, so diff_id and blob digest coincide.
    diff_ids = (layer_digest,)
    config = _image_config(spec, diff_ids)
    config_digest = digest_of(config)
    manifest = manifest_document(config, [Descriptor(MEDIA_LAYER, layer_digest, len(layer))])
    return BuiltImage(
        spec=spec,
        manifest=manifest,
        manifest_digest=digest_of(manifest),
        config_digest=config_digest,
        layer_digests=(layer_digest,),
        diff_ids=diff_ids,
        blobs={config_digest: config, layer_digest: layer},
    )


def oci_archive_bytes(images: BuiltImage | Iterable[BuiltImage]) -> bytes:
    """An OCI image layout as a tar, naming each image for ``ctr images import``."""
    imgs = [images] if isinstance(images, BuiltImage) else list(images)
    blobs: dict[str, bytes] = {}
    for img in imgs:
        blobs.update(img.blobs)
        blobs[img.manifest_digest] = img.manifest
    members: dict[str, bytes] = {
        "oci-layout": LAYOUT_MARKER,
        "index.json": index_document(Named(i.manifest, i.reference, i.spec.tag) for i in imgs),
    }
    for digest, data in blobs.items():
        members[blob_name(digest)] = data

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        write_layout(
            tar, ((name, len(members[name]), io.BytesIO(members[name])) for name in sorted(members))
        )
    return buf.getvalue()


def write_oci_archive(images: BuiltImage | Iterable[BuiltImage], path: Path) -> None:
    """Write an OCI archive of one or more images to ``path`` (atomically)."""
    data = oci_archive_bytes(images)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def push(
    img: BuiltImage,
    registry: str,
    repository: str | None = None,
    tag: str | None = None,
    *,
    timeout_s: float = 30.0,
    auth: tuple[str, str] | None = None,
) -> str:
    """Push ``img`` to a plain-HTTP distribution registry at ``registry`` (host:port),
    as ``auth`` (user, password) when the registry requires basic authentication.

    Blobs the repository already has are skipped, and so is the whole push when the tag
    already names this manifest. Returns the manifest digest.
    """
    repo = repository if repository is not None else img.spec.repository
    ref = tag if tag is not None else img.spec.tag
    try:
        # trust_env=False: a proxy from the environment must never see loopback traffic.
        with httpx.Client(
            base_url=f"http://{registry}", timeout=timeout_s, trust_env=False, auth=auth
        ) as client:
            head = client.head(f"/v2/{repo}/manifests/{ref}", headers={"Accept": MEDIA_MANIFEST})
            if (
                head.status_code == 200
                and head.headers.get("Docker-Content-Digest") == img.manifest_digest
            ):
                return img.manifest_digest
            for digest, data in img.blobs.items():
                _push_blob(client, repo, digest, data)
            resp = client.put(
                f"/v2/{repo}/manifests/{ref}",
                content=img.manifest,
                headers={"Content-Type": MEDIA_MANIFEST},
            )
            _expect(resp, 201, f"PUT manifest {repo}:{ref}")
    except httpx.HTTPError as exc:
        raise ImageError(
            f"push of {img.reference} to {registry}/{repo}:{ref} failed: {exc}"
        ) from exc
    return img.manifest_digest


def _push_blob(client: httpx.Client, repo: str, digest: str, data: bytes) -> None:
    if client.head(f"/v2/{repo}/blobs/{digest}").status_code == 200:
        return
    start = client.post(f"/v2/{repo}/blobs/uploads/")
    _expect(start, 202, f"start upload to {repo}")
    location = start.headers.get("Location")
    if not location:
        raise ImageError(f"registry gave no upload Location for {repo}")
    # The Location carries the upload state in its query and may be relative; httpx's
    # ``params=`` would replace that query instead of extending it.
    url = client.base_url.join(location).copy_merge_params({"digest": digest})
    done = client.put(url, content=data, headers={"Content-Type": "application/octet-stream"})
    _expect(done, 201, f"upload {digest} to {repo}")


def _expect(resp: httpx.Response, status: int, what: str) -> None:
    if resp.status_code != status:
        raise ImageError(f"{what}: HTTP {resp.status_code} {resp.text[:500]}")


def standard_images() -> dict[str, ImageSpec]:
    """The images the project's tests and ``klet up`` use, by short name.

    Add an entry here rather than building ad-hoc images in many tests, so the dev
    stack pushes it once per run.
    """
    specs = [
        ImageSpec(
            name=PAUSE_IMAGE.rpartition(":")[0],
            tag=PAUSE_IMAGE.rpartition(":")[2],
            # PID 1 ignores signals it has no handler for, so the shell traps TERM/INT
            # and exits 0, as the real pause does; the sleep runs in the background
            # because a trap only fires once the foreground command returns.
            cmd=[
                "/bin/sh",
                "-c",
                "trap 'kill $! 2>/dev/null; exit 0' TERM INT; sleep 2147483647 & wait",
            ],
            labels={"io.klet.image": "pause"},
        ),
        ImageSpec(
            name=BUSYBOX_IMAGE.rpartition(":")[0],
            tag=BUSYBOX_IMAGE.rpartition(":")[2],
            cmd=["sh"],
        ),
        ImageSpec(
            name=HTTPD_IMAGE.rpartition(":")[0],
            tag=HTTPD_IMAGE.rpartition(":")[2],
            cmd=["httpd", "-f", "-v", "-p", "80", "-h", "/www"],
            files={"www/index.html": b"klet\n"},
        ),
        ImageSpec(
            name=USR1_STOP_IMAGE.rpartition(":")[0],
            tag=USR1_STOP_IMAGE.rpartition(":")[2],
            cmd=["sh"],
            stop_signal="SIGUSR1",
        ),
    ]
    return {s.repository: s for s in specs}
