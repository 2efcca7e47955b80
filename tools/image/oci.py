"""Layer blobs, image config and manifest, and the archive that carries them.

The documents (canonical JSON, config, manifest, index) and the archive layout are
klet.devstack.oci's, the one writer the dev stack's test images use too; what is here is
what only the product images need: gzip layers streamed from disk, reproducible tars of
a directory, and the docker `manifest.json` beside the OCI index.

An image here is a list of gzip-compressed layer blobs on disk plus a config; the
archive is an OCI image layout as one tar (`oci-layout`, `index.json`, `blobs/sha256/*`)
that also holds the docker-archive `manifest.json` beside it, pointing at the same
blobs. So one file serves every consumer: `ctr images import` and `skopeo copy
oci-archive:` read the OCI index (containerd names the image from the
`io.containerd.image.name` annotation), and docker 20.10's `docker load`, which knows
only the docker format, reads `manifest.json` and ignores the rest.

Trade-offs: layers are gzip (not zstd) because docker 20.10 and distribution 2.8 know
no other compression, and gzip's header carries no timestamp or name here, so a layer
built twice from the same tar has the same digest. The builder never holds a layer in
memory: a rootfs layer is about 40 MB compressed and streams through hashlib and zlib.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from klet.devstack.oci import (
    ANNOTATION_CONTAINERD_NAME,
    ANNOTATION_REF_NAME,
    FIXED_CREATED,
    FIXED_MTIME,
    LAYOUT_MARKER,
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_LAYER_GZIP,
    MEDIA_MANIFEST,
    Descriptor,
    Member,
    Named,
    blob_name,
    canonical_json,
    config_document,
    containerd_name,
    index_document,
    manifest_document,
    write_layout,
)
from klet.devstack.oci import digest_of as sha256_digest

__all__ = [
    "ANNOTATION_CONTAINERD_NAME",
    "ANNOTATION_REF_NAME",
    "FIXED_CREATED",
    "FIXED_MTIME",
    "MEDIA_CONFIG",
    "MEDIA_INDEX",
    "MEDIA_LAYER_GZIP",
    "MEDIA_MANIFEST",
    "ImageConfig",
    "Layer",
    "canonical_json",
    "compress_layer",
    "containerd_name",
    "file_chunks",
    "image_config",
    "manifest",
    "sha256_digest",
    "tar_dir_chunks",
    "write_archive",
]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Layer:
    """A compressed layer blob on disk, with the digests a manifest and config need."""

    path: Path
    digest: str  # sha256 of the compressed blob
    diff_id: str  # sha256 of the uncompressed tar
    size: int  # bytes of the compressed blob
    uncompressed_size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "diff_id": self.diff_id,
            "size": self.size,
            "uncompressed_size": self.uncompressed_size,
        }

    @staticmethod
    def from_json(path: Path, data: dict[str, Any]) -> Layer:
        return Layer(
            path=path,
            digest=str(data["digest"]),
            diff_id=str(data["diff_id"]),
            size=int(data["size"]),
            uncompressed_size=int(data["uncompressed_size"]),
        )


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image config: what `docker inspect` shows as Config."""

    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    working_dir: str = "/"
    stop_signal: str = "SIGTERM"
    user: str = ""  # "uid:gid"; empty: root


class _HashingWriter:
    """A file-like sink that hashes and counts what passes through to `out`."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def compress_layer(chunks: Iterable[bytes], dest: Path) -> Layer:
    """gzip the uncompressed layer tar `chunks` into `dest` (atomically) and digest both."""
    tmp = dest.with_name(dest.name + ".tmp")
    raw = hashlib.sha256()
    raw_size = 0
    with tmp.open("wb") as f:
        sink = _HashingWriter(f)
        # mtime=0 and no file name: the gzip header does not vary between builds.
        with gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0, compresslevel=6) as gz:
            for chunk in chunks:
                raw.update(chunk)
                raw_size += len(chunk)
                gz.write(chunk)
    tmp.replace(dest)
    return Layer(
        path=dest,
        digest="sha256:" + sink.sha.hexdigest(),
        diff_id="sha256:" + raw.hexdigest(),
        size=sink.size,
        uncompressed_size=raw_size,
    )


def file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def tar_dir_chunks(root: Path, *, prefix: str = "") -> Iterator[bytes]:
    """A reproducible tar of the tree under `root`: sorted, owned by root, fixed mtimes.

    Entries are named relative to `root` (with `prefix` in front); regular files,
    directories and symlinks only, which is all a wheel installation produces.
    """
    buf = _ChunkBuffer()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in _walk_sorted(root):
            rel = prefix + str(path.relative_to(root))
            info = tar.gettarinfo(str(path), arcname=rel)
            info.mtime = FIXED_MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            yield from buf.drain()
    yield from buf.drain()


def _walk_sorted(root: Path) -> Iterator[Path]:
    """Every path under `root`, parents before children, names in byte order."""
    for entry in sorted(root.iterdir(), key=lambda p: p.name.encode()):
        yield entry
        if entry.is_dir() and not entry.is_symlink():
            yield from _walk_sorted(entry)


class _ChunkBuffer(io.RawIOBase):
    """What tarfile writes, handed on in chunks instead of accumulated."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.parts.append(bytes(data))
        return len(data)

    def drain(self) -> Iterator[bytes]:
        parts, self.parts = self.parts, []
        yield from parts


def image_config(layers: list[Layer], config: ImageConfig, *, history: list[str]) -> bytes:
    body: dict[str, Any] = {
        "Entrypoint": config.entrypoint,
        "Env": [f"{k}={v}" for k, v in config.env.items()],
        "Labels": config.labels,
        "WorkingDir": config.working_dir,
        "StopSignal": config.stop_signal,
    }
    if config.cmd:
        body["Cmd"] = config.cmd
    if config.user:
        body["User"] = config.user
    return config_document(body, diff_ids=[layer.diff_id for layer in layers], history=history)


def manifest(layers: list[Layer], config: bytes) -> bytes:
    return manifest_document(
        config, [Descriptor(MEDIA_LAYER_GZIP, layer.digest, layer.size) for layer in layers]
    )


def write_archive(dest: Path, *, reference: str, layers: list[Layer], config: bytes) -> str:
    """Write the OCI layout + docker-archive tar for one image; return the manifest digest."""
    body = manifest(layers, config)
    tag = reference.rpartition(":")[2]
    index = index_document([Named(body, containerd_name(reference), tag)])
    docker_manifest = canonical_json(
        [
            {
                "Config": blob_name(sha256_digest(config)),
                "RepoTags": [reference],
                "Layers": [blob_name(layer.digest) for layer in layers],
            }
        ]
    )
    small = {
        "oci-layout": LAYOUT_MARKER,
        "index.json": index,
        "manifest.json": docker_manifest,
        blob_name(sha256_digest(body)): body,
        blob_name(sha256_digest(config)): config,
    }
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        write_layout(tar, _members(small, layers))
    tmp.replace(dest)
    return sha256_digest(body)


def _members(small: dict[str, bytes], layers: list[Layer]) -> Iterator[Member]:
    """The documents, then each distinct layer blob read from its file on disk."""
    for name, data in small.items():
        yield name, len(data), io.BytesIO(data)
    seen: set[str] = set()
    for layer in layers:
        if layer.digest in seen:
            continue
        seen.add(layer.digest)
        with layer.path.open("rb") as f:
            yield blob_name(layer.digest), layer.size, f
