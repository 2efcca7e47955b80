"""tools/e2e/images.py's images for the CSI drivers' manifests (csi_manifest_images).

Covers: CSI Mock's csi-mock-proxy.yaml names `e2e-test-images/busybox:1.36.1-1`, a tag
other than the suite's BusyBox; the run must serve it, or the embedded mock driver's
execs into that container fail "container not found" (the two "Delegate FSGroup to CSI
driver" specs' failure). The image is found under the suite's registry key, so the
repo list's mirror names where it is pushed; sig-storage images are left to tools/csi;
an image nothing here builds, and two tags of one image, are refused naming them.
"""

from __future__ import annotations

import pytest

from tools.e2e.images import csi_manifest_images
from tools.e2e.suite import E2EImageError, SuiteImage, SuiteManifest

SUITE = SuiteManifest(
    images={"BusyBox": SuiteImage("BusyBox", "promoterE2eRegistry", "busybox", "1.37.0-1")},
    registries={
        "promoterE2eRegistry": "registry.k8s.io/e2e-test-images",
        "sigStorageRegistry": "registry.k8s.io/sig-storage",
        "gcRegistry": "registry.k8s.io",
    },
)

# The containers of v1.34.4's csi-mock-proxy.yaml, cut down to their images.
MOCK_PROXY = """
      containers:
        - name: csi-provisioner
          image: registry.k8s.io/sig-storage/csi-provisioner:v5.1.0
        - name: mock
          image: registry.k8s.io/sig-storage/hostpathplugin:v1.16.1
        - name: busybox
          image: registry.k8s.io/e2e-test-images/busybox:1.36.1-1
"""


def test_the_mock_drivers_busybox_is_served_at_its_own_tag() -> None:
    images = csi_manifest_images([MOCK_PROXY, MOCK_PROXY], SUITE)
    assert images == [
        SuiteImage("csi-manifest:busybox", "promoterE2eRegistry", "busybox", "1.36.1-1")
    ]
    mirror = SUITE.mirror("registry.klet.test")[images[0].registry_key]
    assert f"{mirror}/busybox:1.36.1-1" == "registry.klet.test/e2e-test-images/busybox:1.36.1-1"


def test_sig_storage_and_unknown_registries_are_not_its_business() -> None:
    text = (
        "  image: registry.k8s.io/sig-storage/livenessprobe:v2.15.0\n"
        "  image: quay.io/someone/thing:1\n"
    )
    assert csi_manifest_images([text], SUITE) == []


def test_an_image_nothing_builds_is_refused_by_name() -> None:
    text = "  - image: registry.k8s.io/e2e-test-images/agnhost:2.56\n"
    with pytest.raises(E2EImageError, match=r"e2e-test-images/agnhost:2\.56.*busybox"):
        csi_manifest_images([text], SUITE)


def test_two_tags_of_one_image_are_refused() -> None:
    other = MOCK_PROXY.replace("1.36.1-1", "1.37.0-1")
    with pytest.raises(E2EImageError, match=r"busybox with tags 1\.36\.1-1 and 1\.37\.0-1"):
        csi_manifest_images([MOCK_PROXY, other], SUITE)
