"""The OCI image builder of klet.devstack: digests, layer content, manifest and archive.

Images are built from a fake busybox held in memory, so these tests touch neither the
disk nor a registry. They check the invariants containerd and the registry rely on:
diff_id = sha256 of the uncompressed layer, manifest descriptors naming each blob by
its digest and size, and byte-identical output for the same spec.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from typing import Any

import pytest
from klet.devstack.images import (
    ANNOTATION_CONTAINERD_NAME,
    ANNOTATION_REF_NAME,
    MEDIA_CONFIG,
    MEDIA_LAYER,
    MEDIA_MANIFEST,
    PADDING_PATH,
    TEST_REGISTRY_HOST,
    BuiltImage,
    Busybox,
    ImageError,
    ImageSpec,
    build,
    oci_archive_bytes,
    standard_images,
)

FAKE = Busybox(binary=b"\x7fELF fake busybox", applets=("cat", "echo", "sh", "sleep"))


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def make(spec: ImageSpec) -> BuiltImage:
    return build(spec, busybox=FAKE)


def manifest_of(img: BuiltImage) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(img.manifest)
    return result


def config_of(img: BuiltImage) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(img.blobs[img.config_digest])
    return result


def layer_tar(img: BuiltImage) -> tarfile.TarFile:
    return tarfile.open(fileobj=io.BytesIO(img.blobs[img.layer_digests[0]]))


SPEC = ImageSpec(
    name=f"{TEST_REGISTRY_HOST}/tool",
    tag="1.0",
    cmd=["sleep", "1"],
    entrypoint=["/bin/sh", "-c"],
    env={"GREETING": "hi"},
    labels={"a": "b"},
    stop_signal="SIGINT",
    workdir="/www",
)


def test_digests_and_sizes_are_consistent() -> None:
    img = make(SPEC)
    manifest = manifest_of(img)
    assert img.manifest_digest == sha(img.manifest)
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == MEDIA_MANIFEST
    assert manifest["config"] == {
        "mediaType": MEDIA_CONFIG,
        "digest": img.config_digest,
        "size": len(img.blobs[img.config_digest]),
    }
    [layer] = manifest["layers"]
    blob = img.blobs[layer["digest"]]
    assert layer["mediaType"] == MEDIA_LAYER
    assert layer["digest"] == sha(blob)
    assert layer["size"] == len(blob)
    for digest, data in img.blobs.items():
        assert digest == sha(data)
    # Stored uncompressed, so the diff_id is the digest of the very same bytes.
    assert config_of(img)["rootfs"] == {"type": "layers", "diff_ids": [sha(blob)]}
    assert img.size == len(img.manifest) + sum(len(b) for b in img.blobs.values())


def test_config_carries_the_spec() -> None:
    cfg = config_of(make(SPEC))
    assert (cfg["architecture"], cfg["os"]) == ("amd64", "linux")
    c = cfg["config"]
    assert c["Cmd"] == ["sleep", "1"]
    assert c["Entrypoint"] == ["/bin/sh", "-c"]
    assert c["Env"] == ["PATH=/bin", "GREETING=hi"]
    assert c["Labels"] == {"a": "b"}
    assert c["StopSignal"] == "SIGINT"
    assert c["WorkingDir"] == "/www"


def test_minimal_config_omits_unset_fields() -> None:
    c = config_of(make(ImageSpec(name="x.test/min", tag="1", cmd=["sh"])))["config"]
    assert "Entrypoint" not in c and "Labels" not in c and "StopSignal" not in c


def test_layer_holds_busybox_applet_links_and_base_files() -> None:
    tar = layer_tar(make(SPEC))
    members = {m.name: m for m in tar.getmembers()}
    bb = members["bin/busybox"]
    assert bb.isreg() and bb.mode == 0o755
    extracted = tar.extractfile(bb)
    assert extracted is not None and extracted.read() == FAKE.binary
    for applet in FAKE.applets:
        link = members[f"bin/{applet}"]
        assert link.issym() and link.linkname == "busybox"
    for d in ("bin", "tmp", "etc", "proc", "sys", "dev", "var", "www", "root"):
        assert members[d].isdir(), d
    assert members["tmp"].mode == 0o1777
    passwd = tar.extractfile("etc/passwd")
    assert passwd is not None
    users = [line.split(":")[0] for line in passwd.read().decode().splitlines()]
    assert users == ["root", "nobody"]
    assert all(m.mtime == members["bin"].mtime and m.uid == 0 for m in members.values())


def test_extra_files_and_padding() -> None:
    spec = ImageSpec(
        name="x.test/web",
        tag="1",
        cmd=["/app/run.sh"],
        files={"/app/run.sh": b"#!/bin/sh\necho hi\n", "www/index.html": b"hello"},
        padding_bytes=12345,
    )
    tar = layer_tar(make(spec))
    members = {m.name: m for m in tar.getmembers()}
    assert members["app"].isdir()
    assert members["app/run.sh"].mode == 0o755
    assert members["www/index.html"].mode == 0o644
    assert members[PADDING_PATH].size == 12345


def test_file_may_replace_an_applet_link() -> None:
    spec = ImageSpec(name="x.test/a", tag="1", files={"bin/cat": b"#!/bin/sh\n"})
    member = layer_tar(make(spec)).getmember("bin/cat")
    assert member.isreg()


@pytest.mark.parametrize("path", ["", "/", "a/../../etc/x"])
def test_invalid_file_paths_are_refused(path: str) -> None:
    with pytest.raises(ImageError):
        make(ImageSpec(name="x.test/a", tag="1", files={path: b""}))


def test_same_spec_builds_identical_bytes() -> None:
    padded = ImageSpec(name="x.test/big", tag="1", padding_bytes=4096)
    assert make(SPEC) == make(SPEC)
    assert make(padded) == make(padded)


def test_padding_differs_between_images_of_the_same_size() -> None:
    a = make(ImageSpec(name="x.test/a", tag="1", padding_bytes=4096))
    b = make(ImageSpec(name="x.test/b", tag="1", padding_bytes=4096))
    assert a.layer_digests != b.layer_digests


def test_oci_archive_names_images_for_ctr_import() -> None:
    imgs = [make(SPEC), make(ImageSpec(name="x.test/other", tag="2", cmd=["sh"]))]
    tar = tarfile.open(fileobj=io.BytesIO(oci_archive_bytes(imgs)))

    def read(name: str) -> bytes:
        f = tar.extractfile(name)
        assert f is not None
        return f.read()

    assert json.loads(read("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(read("index.json"))
    assert index["schemaVersion"] == 2
    for img, desc in zip(imgs, index["manifests"], strict=True):
        assert desc["digest"] == img.manifest_digest
        assert desc["size"] == len(img.manifest)
        assert desc["annotations"] == {
            ANNOTATION_CONTAINERD_NAME: img.reference,
            ANNOTATION_REF_NAME: img.spec.tag,
        }
        for digest in [img.manifest_digest, *img.blobs]:
            assert sha(read("blobs/sha256/" + digest.removeprefix("sha256:"))) == digest


def test_spec_name_parts() -> None:
    spec = ImageSpec(name="registry.klet.test/team/app", tag="v1")
    assert spec.reference == "registry.klet.test/team/app:v1"
    assert spec.registry_host == "registry.klet.test"
    assert spec.repository == "team/app"
    assert ImageSpec(name="busybox", tag="1").repository == "busybox"
    assert ImageSpec(name="localhost:5000/a", tag="1").registry_host == "localhost:5000"


def test_standard_catalogue() -> None:
    images = standard_images()
    assert {"pause", "busybox"} <= images.keys()
    assert images["pause"].reference == f"{TEST_REGISTRY_HOST}/pause:3.10"
    assert images["busybox"].reference == f"{TEST_REGISTRY_HOST}/busybox:1.36"
    # PID 1 only reacts to signals it handles: the pause command must trap TERM.
    assert "trap" in " ".join(images["pause"].cmd) and "TERM" in " ".join(images["pause"].cmd)
    for key, spec in images.items():
        assert spec.registry_host == TEST_REGISTRY_HOST
        assert spec.repository == key
