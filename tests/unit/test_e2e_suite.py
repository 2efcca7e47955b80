"""tools/e2e/suite.py: the suite's image table and the repo list that mirrors it.

Covers: manifest.go's RegistryList keys, their defaults and the image entries are read
into references; the KUBE_TEST_REPO_LIST mapping serves each public registry from the
local host (path kept) and leaves the invalid and authenticated ones out; a table
without one of the images tools/e2e provides, or naming an unknown registry, is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import yaml

from tools.e2e.suite import E2EImageError, parse_manifest, repo_list_yaml

# The shape of test/utils/image/manifest.go, cut down to what the parser reads.
MANIFEST_GO = """
type RegistryList struct {
	GcAuthenticatedRegistry  string `yaml:"gcAuthenticatedRegistry"`
	PromoterE2eRegistry      string `yaml:"promoterE2eRegistry"`
	InvalidRegistry          string `yaml:"invalidRegistry"`
	GcRegistry               string `yaml:"gcRegistry"`
	PrivateRegistry          string `yaml:"privateRegistry"`
	DockerLibraryRegistry    string `yaml:"dockerLibraryRegistry"`
}

var (
	initRegistry = RegistryList{
		GcAuthenticatedRegistry: "gcr.io/authenticated-image-pulling",
		PromoterE2eRegistry:     "registry.k8s.io/e2e-test-images",
		InvalidRegistry:         "invalid.registry.k8s.io/invalid",
		GcRegistry:              "registry.k8s.io",
		PrivateRegistry:          "gcr.io/k8s-authenticated-test",
		DockerLibraryRegistry:    "docker.io/library",
	}
)

func initImageConfigs(list RegistryList) (map[ImageID]Config, map[ImageID]Config) {
	configs := map[ImageID]Config{}
	configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.56"}
	configs[BusyBox] = Config{list.PromoterE2eRegistry, "busybox", "1.37.0-1"}
	configs[Nonewprivs] = Config{list.PromoterE2eRegistry, "nonewprivs", "1.3"}
	configs[Pause] = Config{list.GcRegistry, "pause", "3.10.1"}
	configs[InvalidRegistryImage] = Config{list.InvalidRegistry, "alpine", "3.1"}
"""


def test_manifest_images_and_registries() -> None:
    suite = parse_manifest(MANIFEST_GO)
    assert suite.images["Agnhost"].registry_key == "promoterE2eRegistry"
    assert (suite.images["Pause"].name, suite.images["Pause"].tag) == ("pause", "3.10.1")
    assert suite.registries["gcRegistry"] == "registry.k8s.io"
    assert suite.registries["dockerLibraryRegistry"] == "docker.io/library"


def test_mirror_maps_public_registries_to_the_local_host_keeping_paths() -> None:
    suite = parse_manifest(MANIFEST_GO)
    assert suite.mirror("registry.klet.test") == {
        "promoterE2eRegistry": "registry.klet.test/e2e-test-images",
        "gcRegistry": "registry.klet.test",
        "dockerLibraryRegistry": "registry.klet.test/library",
    }
    assert suite.reference("Agnhost", "127.0.0.1:5000") == (
        "127.0.0.1:5000/e2e-test-images/agnhost:2.56"
    )
    assert suite.reference("Pause", "registry.klet.test") == "registry.klet.test/pause:3.10.1"
    assert yaml.safe_load(repo_list_yaml(suite, "h")) == suite.mirror("h")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.replace("configs[Pause]", "configs[Paused]"), "no entry for Pause"),
        (
            lambda s: s.replace('list.GcRegistry, "pause"', 'list.OtherRegistry, "pause"'),
            "unknown registry OtherRegistry",
        ),
        (lambda s: s.replace("initRegistry = ", "otherRegistry = "), "no RegistryList"),
        (
            lambda s: s.replace('\t\tGcRegistry:              "registry.k8s.io",\n', ""),
            "no default for GcRegistry",
        ),
    ],
)
def test_a_table_it_cannot_read_is_refused(edit: Callable[[str], str], message: str) -> None:
    source = edit(MANIFEST_GO)
    assert source != MANIFEST_GO
    with pytest.raises(E2EImageError, match=message):
        parse_manifest(source)
