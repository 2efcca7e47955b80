"""tools/dra/images.py: the image the [DRA] e2e specs' proxy pod runs.

Covers: the proxy manifest's hostpathplugin is served by tools/csi's build under the tag
the manifest names (v1.7.3 in v1.34.4's manifest, read as the module writes it); any
other image in the manifest is refused naming it; a manifest without hostpathplugin,
hostpathplugin not built and an unreadable manifest are refused naming what is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.csi.images import CSIImageError
from tools.dra.images import PROXY_MANIFEST, proxy_plan, read_proxy_manifest

BUILT = {
    "hostpathplugin": (Path("/c/hostpathplugin/v1.16.1/hostpathplugin"), "v1.16.1"),
    "csi-provisioner": (Path("/c/csi-provisioner/v5.1.0/csi-provisioner"), "v5.1.0"),
}


def test_hostpathplugin_under_the_manifests_tag() -> None:
    plan = proxy_plan({"hostpathplugin": "v1.7.3"}, BUILT)
    assert plan.images == {"hostpathplugin": (BUILT["hostpathplugin"][0], "v1.7.3")}
    assert plan.missing == {}


def test_another_image_is_refused_by_name() -> None:
    with pytest.raises(CSIImageError, match=r"nothing here provides: csi-attacher:v4.8.0"):
        proxy_plan({"hostpathplugin": "v1.7.3", "csi-attacher": "v4.8.0"}, BUILT)


def test_missing_pieces_are_refused() -> None:
    with pytest.raises(CSIImageError, match="names no hostpathplugin"):
        proxy_plan({}, BUILT)
    with pytest.raises(CSIImageError, match="did not build hostpathplugin"):
        proxy_plan({"hostpathplugin": "v1.7.3"}, {})


def test_unreadable_manifest_names_its_path(tmp_path: Path) -> None:
    with pytest.raises(CSIImageError, match=str(tmp_path / PROXY_MANIFEST)):
        read_proxy_manifest(tmp_path)


def test_the_modules_manifest(tmp_path: Path) -> None:
    """The manifest as written in a module tree: its one sig-storage image."""
    path = tmp_path / PROXY_MANIFEST
    path.parent.mkdir(parents=True)
    path.write_text(
        "      containers:\n"
        "        - name: pause\n"
        "          image: registry.k8s.io/sig-storage/hostpathplugin:v1.7.3\n"
    )
    assert read_proxy_manifest(tmp_path) == {"hostpathplugin": "v1.7.3"}
