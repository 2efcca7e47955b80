"""Layer blobs, image config and manifest, and the archive that carries them.

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
import json
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"

ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"

# 2000-01-01T00:00:00Z, for every header and timestamp the builder writes itself.
FIXED_MTIME = 946684800
FIXED_CREATED = "2000-01-01T00:00:00Z"

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


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


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
    return canonical_json(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": FIXED_CREATED,
            "config": body,
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
            "history": [{"created": FIXED_CREATED, "created_by": step} for step in history],
        }
    )


def manifest(layers: list[Layer], config: bytes) -> bytes:
    return canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {
                "mediaType": MEDIA_CONFIG,
                "digest": sha256_digest(config),
                "size": len(config),
            },
            "layers": [
                {"mediaType": MEDIA_LAYER_GZIP, "digest": layer.digest, "size": layer.size}
                for layer in layers
            ],
        }
    )


def containerd_name(reference: str) -> str:
    """The fully qualified name CRI looks up for `reference` (`klet:1` is Docker Hub's)."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return reference
    return f"docker.io/{reference}" if rest else f"docker.io/library/{reference}"


def write_archive(dest: Path, *, reference: str, layers: list[Layer], config: bytes) -> str:
    """Write the OCI layout + docker-archive tar for one image; return the manifest digest."""
    body = manifest(layers, config)
    tag = reference.rpartition(":")[2]
    blob = "blobs/sha256/"
    index = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": sha256_digest(body),
                    "size": len(body),
                    "annotations": {
                        ANNOTATION_CONTAINERD_NAME: containerd_name(reference),
                        ANNOTATION_REF_NAME: tag,
                    },
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
    )
    docker_manifest = canonical_json(
        [
            {
                "Config": blob + sha256_digest(config).removeprefix("sha256:"),
                "RepoTags": [reference],
                "Layers": [blob + layer.digest.removeprefix("sha256:") for layer in layers],
            }
        ]
    )
    small = {
        "oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"}),
        "index.json": index,
        "manifest.json": docker_manifest,
        blob + sha256_digest(body).removeprefix("sha256:"): body,
        blob + sha256_digest(config).removeprefix("sha256:"): config,
    }
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            tar.addfile(_entry(d, tarfile.DIRTYPE, 0o755, 0))
        for name, data in small.items():
            tar.addfile(_entry(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        seen: set[str] = set()
        for layer in layers:
            if layer.digest in seen:
                continue
            seen.add(layer.digest)
            name = blob + layer.digest.removeprefix("sha256:")
            with layer.path.open("rb") as f:
                tar.addfile(_entry(name, tarfile.REGTYPE, 0o644, layer.size), f)
    tmp.replace(dest)
    return sha256_digest(body)


def _entry(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = FIXED_MTIME
    return info
