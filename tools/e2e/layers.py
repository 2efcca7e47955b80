"""Layers whose every member the e2e image builder names itself, cached by their inputs.

tools/image makes layers from directory trees (owned by root) and Debian rootfs; the e2e
images need a few files with set owners and modes (a setuid binary, a home directory of
uid 1000) on top of a base, so these layers are written entry by entry: sorted, fixed
times, reproducible. They are gzipped by tools/image and kept in its LayerCache, keyed
by the digests of their inputs, so a warm build only hashes the inputs.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tools.image.layers import LayerCache
from tools.image.oci import FIXED_MTIME, Layer, canonical_json, compress_layer

# Bumped when the way a layer is put together from its inputs changes, so cached
# layers are not reused.
LAYOUT_VERSION = 1


class LayerError(RuntimeError):
    """A layer could not be built from its inputs."""


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
    raise LayerError(f"{layer.path}: no {', '.join(sorted(set(names) - set(found)))}")


def key(parts: Mapping[str, object]) -> str:
    return hashlib.sha256(canonical_json({**parts, "layout": LAYOUT_VERSION})).hexdigest()[:32]


def file_digest(path: Path) -> str:
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
        key({"kind": what, **inputs}),
        lambda dest: (compress_layer([tar_entries(entries())], dest), {"what": what}),
    )
    return layer
