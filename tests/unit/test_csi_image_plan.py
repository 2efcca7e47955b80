"""The pure parts of tools/csi/images.py: which sig-storage images the storage-csi
manifests name, how they are matched with the components tools/csi/build.sh built, and
the distroless-like base layer.

Covers: image lines as containers and list items, quoted or not, with only the
registry.k8s.io/sig-storage ones kept; one name with two tags refused, naming both; a
built version that differs from the manifests' tag refused, naming both; components
nothing here built listed as missing; snapshot-controller imaged beside csi-snapshotter
(at its version) though no manifest names it, and not without it; the base layer's
/tmp, nonroot home and passwd entries.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from tools.csi.images import (
    CSIImageError,
    manifest_images,
    plan,
    static_base_entries,
)

MANIFEST = """
spec:
  containers:
    - name: provisioner
      image: registry.k8s.io/sig-storage/csi-provisioner:v5.1.0
    - image: "registry.k8s.io/sig-storage/csi-resizer:v1.13.1"
      name: resizer
    - name: busybox
      image: registry.k8s.io/e2e-test-images/busybox:1.36.1-1
  initContainers:
  - image: 'registry.k8s.io/sig-storage/hostpathplugin:v1.16.1'
# image: registry.k8s.io/sig-storage/commented-out:v0
"""


def test_manifest_images_keeps_sig_storage_only() -> None:
    assert manifest_images([MANIFEST]) == {
        "csi-provisioner": "v5.1.0",
        "csi-resizer": "v1.13.1",
        "hostpathplugin": "v1.16.1",
    }


def test_manifest_images_same_tag_twice_is_fine() -> None:
    assert manifest_images([MANIFEST, MANIFEST])["csi-provisioner"] == "v5.1.0"


def test_manifest_images_two_tags_refused() -> None:
    other = "      image: registry.k8s.io/sig-storage/csi-resizer:v1.14.0\n"
    with pytest.raises(CSIImageError, match=r"csi-resizer with tags v1.13.1 and v1.14.0"):
        manifest_images([MANIFEST, other])


def built(**versions: str) -> dict[str, tuple[Path, str]]:
    return {
        name.replace("_", "-"): (Path(f"/cache/csi/{name}/{v}/{name}"), v)
        for name, v in versions.items()
    }


@pytest.mark.parametrize(
    ("wanted", "have", "images", "missing"),
    [
        (
            {"csi-provisioner": "v5.1.0", "hostpathplugin": "v1.16.1"},
            built(csi_provisioner="v5.1.0"),
            {"csi-provisioner": "v5.1.0"},
            {"hostpathplugin": "v1.16.1"},
        ),
        (
            {"csi-snapshotter": "v8.3.0"},
            built(csi_snapshotter="v8.3.0", snapshot_controller="v8.3.0"),
            {"csi-snapshotter": "v8.3.0", "snapshot-controller": "v8.3.0"},
            {},
        ),
        # No sidecar wanted: no controller either.
        ({}, built(snapshot_controller="v8.3.0"), {}, {}),
        # Built but not named by any manifest: not imaged.
        ({}, built(csi_sanity="v5.3.1"), {}, {}),
    ],
)
def test_plan(
    wanted: dict[str, str],
    have: dict[str, tuple[Path, str]],
    images: dict[str, str],
    missing: dict[str, str],
) -> None:
    p = plan(wanted, have)
    assert {name: tag for name, (_, tag) in p.images.items()} == images
    assert p.missing == missing
    for name, (path, _) in p.images.items():
        assert path == have[name][0]


def test_plan_refuses_another_version() -> None:
    with pytest.raises(CSIImageError, match=r"csi-provisioner:v5.2.0.*csi-provisioner v5.1.0"):
        plan({"csi-provisioner": "v5.2.0"}, built(csi_provisioner="v5.1.0"))


def test_static_base_entries() -> None:
    by_path = {e.path: e for e in static_base_entries()}
    assert by_path["tmp"].mode == 0o1777
    assert by_path["tmp"].kind == tarfile.DIRTYPE
    home = by_path["home/nonroot"]
    assert (home.uid, home.gid, home.mode) == (65532, 65532, 0o700)
    passwd = by_path["etc/passwd"].data.decode().splitlines()
    assert [line.split(":")[:3] for line in passwd] == [
        ["root", "x", "0"],
        ["nobody", "x", "65534"],
        ["nonroot", "x", "65532"],
    ]
    assert "etc" in by_path and "home" in by_path
