"""tools/image/oci.py: layer blobs, and one archive that is both an OCI layout and a
docker archive.

Covers: a compressed layer's digests (blob and uncompressed diff_id) and that the same
tree gives the same bytes whatever its files' times; the archive's index names the
image for containerd and by tag, its manifest and config point at blobs the archive
holds, and docker's manifest.json lists the same config and layers in order; short
names are qualified as CRI does.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest

from tools.image.oci import (
    ImageConfig,
    compress_layer,
    containerd_name,
    image_config,
    tar_dir_chunks,
    write_archive,
)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def make_tree(root: Path, mtime: int) -> Path:
    (root / "usr/local/bin").mkdir(parents=True)
    (root / "usr/local/bin/klet").write_text("#!/usr/bin/python3\n")
    (root / "usr/local/bin/klet").chmod(0o755)
    (root / "usr/local/lib").mkdir()
    (root / "usr/local/lib/a.py").write_text("A = 1\n")
    (root / "usr/local/lib/link").symlink_to("a.py")
    for path in [*root.rglob("*"), root]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


def test_a_layer_is_the_same_whatever_the_file_times(tmp_path: Path) -> None:
    one = compress_layer(
        tar_dir_chunks(make_tree(tmp_path / "one", 1_000_000_000)), tmp_path / "one.tar.gz"
    )
    two = compress_layer(
        tar_dir_chunks(make_tree(tmp_path / "two", 1_700_000_000)), tmp_path / "two.tar.gz"
    )
    assert one.path.read_bytes() == two.path.read_bytes()
    blob = one.path.read_bytes()
    raw = gzip.decompress(blob)
    assert (one.digest, one.size) == (sha(blob), len(blob))
    assert (one.diff_id, one.uncompressed_size) == (sha(raw), len(raw))

    with tarfile.open(one.path) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [
        "usr",
        "usr/local",
        "usr/local/bin",
        "usr/local/bin/klet",
        "usr/local/lib",
        "usr/local/lib/a.py",
        "usr/local/lib/link",
    ]
    assert {(m.uid, m.gid, m.mtime) for m in members} == {(0, 0, 946684800)}
    by_name = {m.name: m for m in members}
    assert by_name["usr/local/bin/klet"].mode & 0o777 == 0o755
    assert by_name["usr/local/lib/link"].issym()
    assert by_name["usr/local/lib/link"].linkname == "a.py"


@pytest.mark.parametrize(
    ("reference", "name"),
    [
        ("klet:0.1.0", "docker.io/library/klet:0.1.0"),
        ("someone/klet:1", "docker.io/someone/klet:1"),
        ("127.0.0.1:5000/klet:1", "127.0.0.1:5000/klet:1"),
        ("registry.klet.test/klet:1", "registry.klet.test/klet:1"),
    ],
)
def test_short_names_are_qualified_as_cri_looks_them_up(reference: str, name: str) -> None:
    assert containerd_name(reference) == name


def test_the_archive_is_an_oci_layout_and_a_docker_archive(tmp_path: Path) -> None:
    base = compress_layer(
        tar_dir_chunks(make_tree(tmp_path / "tree", 1_000_000_000)), tmp_path / "base.tar.gz"
    )
    (tmp_path / "top").mkdir()
    (tmp_path / "top/etc").write_text("klet\n")
    top = compress_layer(tar_dir_chunks(tmp_path / "top"), tmp_path / "top.tar.gz")
    layers = [base, top]
    config = image_config(
        layers,
        ImageConfig(entrypoint=["klet"], cmd=["--help"], env={"PATH": "/usr/bin"}, labels={}),
        history=["test"],
    )
    archive = tmp_path / "klet.oci.tar"
    digest = write_archive(archive, reference="klet:0.1.0", layers=layers, config=config)

    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert sha(data) == "sha256:" + name.rpartition("/")[2]

    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"] == {
        "io.containerd.image.name": "docker.io/library/klet:0.1.0",
        "org.opencontainers.image.ref.name": "0.1.0",
    }
    manifest = json.loads(files["blobs/sha256/" + digest.removeprefix("sha256:")])
    assert manifest["config"]["digest"] == sha(config)
    assert [d["digest"] for d in manifest["layers"]] == [base.digest, top.digest]
    assert json.loads(config)["rootfs"]["diff_ids"] == [base.diff_id, top.diff_id]
    assert json.loads(config)["config"]["Entrypoint"] == ["klet"]

    (docker,) = json.loads(files["manifest.json"])
    assert docker == {
        "Config": "blobs/sha256/" + sha(config).removeprefix("sha256:"),
        "RepoTags": ["klet:0.1.0"],
        "Layers": ["blobs/sha256/" + layer.digest.removeprefix("sha256:") for layer in layers],
    }
