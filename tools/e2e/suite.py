"""The suite's own image table: test/utils/image/manifest.go of k8s.io/kubernetes.

The e2e suite names each image as a registry (a field of its `RegistryList`, with a
default such as registry.k8s.io/e2e-test-images), a name and a tag, and lets a
KUBE_TEST_REPO_LIST YAML file replace any registry. This module reads that table from
the module source rather than repeating it, so a new Kubernetes version brings its own
tags, and says what the repo list must hold to serve the public registries from one
local host. Pure: the caller reads the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

# RegistryList fields the repo list leaves alone: a registry meant not to exist, and the
# ones that need credentials the tests bring themselves.
NOT_MIRRORED = frozenset({"invalidRegistry", "gcAuthenticatedRegistry", "privateRegistry"})
# The ImageIDs of manifest.go that tools/e2e/images.py provides.
PROVIDED = ("Agnhost", "BusyBox", "Nonewprivs", "Pause")


class E2EImageError(RuntimeError):
    """The suite's image table could not be read, or an image could not be built."""


@dataclass(frozen=True)
class SuiteImage:
    """One image as the suite names it: `<registry of registry_key>/<name>:<tag>`."""

    image_id: str  # the ImageID constant in manifest.go, e.g. Agnhost
    registry_key: str  # the RegistryList YAML key, e.g. promoterE2eRegistry
    name: str
    tag: str


@dataclass(frozen=True)
class SuiteManifest:
    """What manifest.go says: the images by ImageID, the default registry of each key."""

    images: dict[str, SuiteImage]
    registries: dict[str, str]  # YAML key -> default, e.g. gcRegistry -> registry.k8s.io

    def mirror(self, host: str) -> dict[str, str]:
        """The KUBE_TEST_REPO_LIST mapping that serves every public registry from `host`:
        `registry.k8s.io/e2e-test-images` becomes `<host>/e2e-test-images`."""
        mapped = {}
        for key, default in sorted(self.registries.items()):
            if key in NOT_MIRRORED:
                continue
            _, _, path = default.partition("/")
            mapped[key] = f"{host}/{path}" if path else host
        return mapped

    def reference(self, image_id: str, host: str) -> str:
        """Where the suite pulls `image_id` from once its repo list is mirror(`host`)."""
        image = self.images[image_id]
        return f"{self.mirror(host)[image.registry_key]}/{image.name}:{image.tag}"


_FIELD = re.compile(r"^\s*(\w+)\s+string\s+`yaml:\"(\w+)\"`", re.M)
_DEFAULT = re.compile(r"^\s*(\w+):\s+\"([^\"]+)\",", re.M)
_CONFIG = re.compile(r"configs\[(\w+)\] = Config\{list\.(\w+), \"([^\"]+)\", \"([^\"]+)\"\}")


def parse_manifest(source: str) -> SuiteManifest:
    """Read the image table of test/utils/image/manifest.go (its `RegistryList` struct,
    the `initRegistry` defaults and the `configs[...] = Config{...}` lines)."""
    keys = dict(_FIELD.findall(source))
    start = source.find("initRegistry = RegistryList{")
    end = source.find("\n\t}", start)
    if not keys or start < 0 or end < 0:
        raise E2EImageError("manifest.go: no RegistryList struct or initRegistry block")
    defaults = dict(_DEFAULT.findall(source[start:end]))
    registries: dict[str, str] = {}
    for field, key in keys.items():
        if field not in defaults:
            raise E2EImageError(f"manifest.go: initRegistry has no default for {field}")
        registries[key] = defaults[field]
    images: dict[str, SuiteImage] = {}
    for image_id, field, name, tag in _CONFIG.findall(source):
        if field not in keys:
            raise E2EImageError(f"manifest.go: {image_id} uses unknown registry {field}")
        images[image_id] = SuiteImage(image_id, keys[field], name, tag)
    if missing := [i for i in PROVIDED if i not in images]:
        raise E2EImageError(f"manifest.go: no entry for {', '.join(missing)}")
    return SuiteManifest(images=images, registries=registries)


def repo_list_yaml(suite: SuiteManifest, host: str) -> str:
    """The KUBE_TEST_REPO_LIST file content that makes the suite pull from `host`."""
    return yaml.safe_dump(suite.mirror(host), sort_keys=True)
