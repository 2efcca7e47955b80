"""tools/e2e/layers.py: the layers the e2e image builder writes entry by entry.

Covers: a layer tar keeps the owners and modes it is given (setuid included) with fixed
times, parents first, and is the same bytes twice; files are read back from a gzipped
rootfs layer blob, and a missing one is named; a cached layer is built once per inputs.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tools.e2e.layers import Entry, LayerError, cached_layer, dirs, rootfs_files, tar_entries
from tools.image.layers import LayerCache
from tools.image.oci import compress_layer


def test_layer_tar_keeps_owners_and_modes_with_fixed_times() -> None:
    entries = [
        Entry("usr/local/bin/nnp", mode=0o4755, data=b"\x7fELF"),
        *dirs("usr", "usr/local", "usr/local/bin"),
        Entry("home/user", tarfile.DIRTYPE, 0o755, uid=1000, gid=1000),
        Entry("agnhost-2", tarfile.SYMTYPE, 0o777, linkname="agnhost"),
    ]
    raw = tar_entries(entries)
    assert tar_entries(list(reversed(entries))) == raw
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names.index("usr") < names.index("usr/local") < names.index("usr/local/bin/nnp")
        by_name = {m.name: m for m in members}
        nnp = by_name["usr/local/bin/nnp"]
        assert (nnp.mode, nnp.uid, nnp.size) == (0o4755, 0, 4)
        extracted = tar.extractfile(nnp)
        assert extracted is not None and extracted.read() == b"\x7fELF"
        assert (by_name["home/user"].uid, by_name["home/user"].gid) == (1000, 1000)
        assert by_name["agnhost-2"].linkname == "agnhost"
        assert {m.mtime for m in members} == {946684800}


def test_rootfs_files_are_read_from_a_layer_blob(tmp_path: Path) -> None:
    raw = tar_entries(
        [
            *dirs(".", "./etc"),
            Entry("./etc/passwd", data=b"root:x:0:0::/root:/bin/bash\n"),
            Entry("./etc/group", data=b"root:x:0:\n"),
            Entry("./etc/hostname", data=b"x\n"),
        ]
    )
    layer = compress_layer([raw], tmp_path / "rootfs.tar.gz")
    assert rootfs_files(layer, ("etc/passwd", "etc/group")) == {
        "etc/passwd": b"root:x:0:0::/root:/bin/bash\n",
        "etc/group": b"root:x:0:\n",
    }
    with pytest.raises(LayerError, match="no etc/shadow"):
        rootfs_files(layer, ("etc/passwd", "etc/shadow"))


def test_a_cached_layer_is_built_once_per_inputs(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path)
    built: list[str] = []

    def entries(tag: str) -> list[Entry]:
        built.append(tag)
        return [Entry("tag", data=tag.encode())]

    first = cached_layer(cache, "t", inputs={"v": 1}, entries=lambda: entries("a"))
    again = cached_layer(cache, "t", inputs={"v": 1}, entries=lambda: entries("b"))
    other = cached_layer(cache, "t", inputs={"v": 2}, entries=lambda: entries("c"))
    assert built == ["a", "c"]
    assert again == first
    assert other.digest != first.digest
