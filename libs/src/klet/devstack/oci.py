"""The OCI image documents and archive layout, written one way for every image klet
builds: the dev stack's busybox test images (klet.devstack.images) and `make image`'s
product images (tools/image), which the e2e and CSI tools build on too.

What is shared is what must agree byte for byte wherever an image is made: canonical
JSON (sorted keys, no spaces, so a document has one digest), the image config around a
runtime config, the manifest, the index that names each image for containerd, and the
archive (an OCI image layout as one tar, with fixed tar headers). What differs stays
with each builder: the runtime config fields each sets, whether layers are gzip (the
product images, streamed from disk) or plain tar (the test images, a few MB in memory),
and which extra members an archive carries (docker's `manifest.json`). It lives in
devstack because devstack ships in the image and tools/ does not: the shipped code may
not import the tools.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"

ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"

# A fixed timestamp (2000-01-01T00:00:00Z) for tar headers and configs: reproducible,
# and not 0 because some tools treat a zero mtime as "unset".
FIXED_MTIME = 946684800
FIXED_CREATED = "2000-01-01T00:00:00Z"

BLOBS = "blobs/sha256/"


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_name(digest: str) -> str:
    """Where the blob of `digest` lives in an image layout."""
    return BLOBS + digest.removeprefix("sha256:")


@dataclass(frozen=True)
class Descriptor:
    """A layer as a manifest lists it."""

    media_type: str
    digest: str
    size: int


def config_document(
    runtime: dict[str, Any], *, diff_ids: Sequence[str], history: Sequence[str]
) -> bytes:
    """The image config (amd64/linux, fixed creation time) around `runtime`, the part
    `docker inspect` shows as Config, with one history entry per step."""
    return canonical_json(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": FIXED_CREATED,
            "config": runtime,
            "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
            "history": [{"created": FIXED_CREATED, "created_by": step} for step in history],
        }
    )


def manifest_document(config: bytes, layers: Sequence[Descriptor]) -> bytes:
    return canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": digest_of(config), "size": len(config)},
            "layers": [
                {"mediaType": layer.media_type, "digest": layer.digest, "size": layer.size}
                for layer in layers
            ],
        }
    )


@dataclass(frozen=True)
class Named:
    """An image's manifest under the name containerd gives it on import, and its tag."""

    manifest: bytes
    name: str
    tag: str


def index_document(images: Iterable[Named]) -> bytes:
    return canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": digest_of(image.manifest),
                    "size": len(image.manifest),
                    "annotations": {
                        ANNOTATION_CONTAINERD_NAME: image.name,
                        ANNOTATION_REF_NAME: image.tag,
                    },
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
                for image in images
            ],
        }
    )


LAYOUT_MARKER = canonical_json({"imageLayoutVersion": "1.0.0"})
"""The content of `oci-layout`."""


def containerd_name(reference: str) -> str:
    """The fully qualified name CRI looks up for `reference` (`klet:1` is Docker Hub's)."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return reference
    return f"docker.io/{reference}" if rest else f"docker.io/library/{reference}"


def tar_entry(
    name: str, kind: bytes, *, mode: int, size: int = 0, linkname: str = ""
) -> tarfile.TarInfo:
    """A tar header owned by root with the fixed mtime."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = linkname
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


Member = tuple[str, int, BinaryIO]
"""A file of an archive: its name, size, and where its bytes are read from."""


def write_layout(tar: tarfile.TarFile, members: Iterable[Member]) -> None:
    """An image layout into `tar`: the blob directories, then `members` in the order
    given (`oci-layout`, `index.json` and the blobs, and whatever else the caller adds)."""
    for directory in ("blobs", "blobs/sha256"):
        tar.addfile(tar_entry(directory, tarfile.DIRTYPE, mode=0o755))
    for name, size, data in members:
        tar.addfile(tar_entry(name, tarfile.REGTYPE, mode=0o644, size=size), data)
