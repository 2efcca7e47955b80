"""The one OCI writer (klet.devstack.oci): canonical JSON has one spelling; the config
wraps a runtime config with the fixed platform, creation time, diff_ids and history; the
manifest and the index describe their documents by digest and size and name each image
for containerd; an archive starts with the blob directories and keeps its members in the
caller's order with root-owned fixed-time headers. And both image builders write
through it: the dev stack's test images and `make image`'s archives have the same layout
headers and index shape, and neither defines canonical JSON or digests of its own."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from klet.devstack import images as test_images
from klet.devstack import oci
from klet.devstack.images import Busybox, ImageSpec, build, oci_archive_bytes

from tools.image import oci as product_images


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_canonical_json_and_digests() -> None:
    assert oci.canonical_json({"b": [1, {"d": 2, "c": 3}], "a": "x"}) == (
        b'{"a":"x","b":[1,{"c":3,"d":2}]}'
    )
    assert oci.digest_of(b"abc") == sha(b"abc")
    assert oci.blob_name("sha256:00ff") == "blobs/sha256/00ff"
    assert oci.LAYOUT_MARKER == b'{"imageLayoutVersion":"1.0.0"}'


def test_config_manifest_and_index_documents() -> None:
    config = oci.config_document({"Cmd": ["sh"]}, diff_ids=["sha256:1", "sha256:2"], history=["a"])
    assert json.loads(config) == {
        "architecture": "amd64",
        "os": "linux",
        "created": "2000-01-01T00:00:00Z",
        "config": {"Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:1", "sha256:2"]},
        "history": [{"created": "2000-01-01T00:00:00Z", "created_by": "a"}],
    }
    layers = [oci.Descriptor(oci.MEDIA_LAYER, "sha256:l1", 10)]
    manifest = oci.manifest_document(config, layers)
    assert json.loads(manifest) == {
        "schemaVersion": 2,
        "mediaType": oci.MEDIA_MANIFEST,
        "config": {"mediaType": oci.MEDIA_CONFIG, "digest": sha(config), "size": len(config)},
        "layers": [{"mediaType": oci.MEDIA_LAYER, "digest": "sha256:l1", "size": 10}],
    }
    index = json.loads(oci.index_document([oci.Named(manifest, "docker.io/library/x:1", "1")]))
    assert index["mediaType"] == oci.MEDIA_INDEX
    [entry] = index["manifests"]
    assert entry["digest"] == sha(manifest) and entry["size"] == len(manifest)
    assert entry["annotations"] == {
        oci.ANNOTATION_CONTAINERD_NAME: "docker.io/library/x:1",
        oci.ANNOTATION_REF_NAME: "1",
    }
    assert oci.containerd_name("x:1") == "docker.io/library/x:1"
    assert oci.containerd_name("a/x:1") == "docker.io/a/x:1"
    assert oci.containerd_name("localhost/x:1") == "localhost/x:1"


def test_layout_members_in_the_callers_order_with_fixed_headers() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        oci.write_layout(tar, [("z", 1, io.BytesIO(b"z")), ("a", 2, io.BytesIO(b"aa"))])
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        members = tar.getmembers()
        assert [(m.name, m.isdir()) for m in members] == [
            ("blobs", True),
            ("blobs/sha256", True),
            ("z", False),
            ("a", False),
        ]
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {
            (oci.FIXED_MTIME, 0, 0, "", "")
        }
        assert tar.extractfile("a").read() == b"aa"  # type: ignore[union-attr]


def headers(archive: tarfile.TarFile) -> list[tuple[str, int, int, int]]:
    return [(m.name, m.mode, int(m.mtime), m.uid) for m in archive.getmembers()]


def test_both_builders_write_through_the_one_writer(tmp_path: Path) -> None:
    for module in (test_images, product_images):
        own = {name for name, value in vars(module).items() if callable(value)}
        assert own.isdisjoint({"_canonical_json", "_tar_entry", "_entry"}), module.__name__
    assert product_images.canonical_json is oci.canonical_json
    assert product_images.sha256_digest is test_images.digest_of is oci.digest_of

    fake = Busybox(binary=b"\x7fELF", applets=("sh",))
    test_image = build(ImageSpec(name="registry.klet.test/t", tag="1"), busybox=fake)
    with tarfile.open(fileobj=io.BytesIO(oci_archive_bytes(test_image))) as tar:
        test_headers = headers(tar)
        test_index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]

    layer = product_images.compress_layer([b"x" * 100], tmp_path / "layer")
    config = product_images.image_config(
        [layer],
        product_images.ImageConfig(entrypoint=["/x"], cmd=[], env={}, labels={}),
        history=["x"],
    )
    product_images.write_archive(
        tmp_path / "a.tar", reference="klet:1", layers=[layer], config=config
    )
    with tarfile.open(tmp_path / "a.tar") as tar:
        product_headers = headers(tar)
        product_index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]

    assert (
        test_headers[:2]
        == product_headers[:2]
        == [
            ("blobs", 0o755, oci.FIXED_MTIME, 0),
            ("blobs/sha256", 0o755, oci.FIXED_MTIME, 0),
        ]
    )
    assert {(mode, mtime, uid) for _, mode, mtime, uid in test_headers[2:]} == {
        (mode, mtime, uid) for _, mode, mtime, uid in product_headers[2:]
    }
    assert test_index.keys() == product_index.keys()
    assert test_index["manifests"][0].keys() == product_index["manifests"][0].keys()
    assert product_index["manifests"][0]["annotations"][oci.ANNOTATION_CONTAINERD_NAME] == (
        "docker.io/library/klet:1"
    )
