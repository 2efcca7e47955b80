"""The one image the [DRA] e2e specs deploy, for `make conformance-dra`.

Upstream's DRA specs (test/e2e/dra/utils/deploy.go) run the test driver's kubelet plugin
inside e2e.test itself. What they deploy on the node is only a socket proxy: a ReplicaSet
of test/e2e/testing-manifests/dra/dra-test-driver-proxy.yaml, one privileged pod per node
with the node's `<root-dir>/plugins/<driver>`, `<root-dir>/plugins_registry` and
`/var/run/cdi` as hostPath volumes. e2e.test execs `/hostpathplugin --endpoint=<socket>
--proxy-endpoint=tcp://:<port>` in it for the registration and the DRA sockets and
reaches that port through the apiserver's port-forward, and writes the CDI specs of the
claims it prepares with `sh`, `mkdir`, `mv` and `rm` through exec.

The manifest names `registry.k8s.io/sig-storage/hostpathplugin:v1.7.3`. The Go module
proxy refuses csi-driver-host-path at every version (HOST_NOTES), and the only source this
project has is v1.16.1's release tree, which tools/csi builds and images for the CSI Mock
specs (whose manifests name v1.16.1). Its proxy mode is the same code path as v1.7.3's
(the `-endpoint` and `-proxy-endpoint` flags, one TCP listener forwarding each connection
to the unix socket), and the image has the shell and coreutils the specs exec. So the image
under the manifest's tag is tools/csi's hostpathplugin image with v1.16.1's binary, as
RESULTS.md of the run says. Any other image in that manifest is
refused by name: nothing here provides it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tools.csi.images import BUILD_SH, CSIImageError, Plan, manifest_images

PROXY_MANIFEST = "test/e2e/testing-manifests/dra/dra-test-driver-proxy.yaml"
PROXY_IMAGE = "hostpathplugin"


def build_proxy_binary(*, cache: Path) -> dict[str, tuple[Path, str]]:
    """tools/csi/build.sh of hostpathplugin alone (cached after its first build): name ->
    (binary, version), as tools.csi.images.build_binaries gives them."""
    res = subprocess.run(
        ["bash", str(BUILD_SH), PROXY_IMAGE],
        capture_output=True,
        text=True,
        env={**os.environ, "KLET_CACHE": str(cache)},
        check=False,
    )
    if res.returncode != 0:
        raise CSIImageError(
            f"{BUILD_SH} {PROXY_IMAGE} exited {res.returncode}:\n{res.stderr[-3000:]}"
        )
    built: dict[str, tuple[Path, str]] = {}
    for line in res.stdout.splitlines():
        name, _, path = line.partition(" ")
        built[name] = (Path(path), Path(path).parent.name)  # .../<name>/<version>/<name>
    return built


def read_proxy_manifest(module_dir: Path) -> dict[str, str]:
    """The sig-storage images (name -> tag) the DRA proxy manifest of the k8s.io/kubernetes
    module in `module_dir` names."""
    path = module_dir / PROXY_MANIFEST
    try:
        return manifest_images([path.read_text()])
    except OSError as err:
        raise CSIImageError(f"the DRA proxy manifest {path}: {err}") from err


def proxy_plan(wanted: Mapping[str, str], built: Mapping[str, tuple[Path, str]]) -> Plan:
    """The image plan for the DRA proxy manifest's images `wanted` (name -> tag): the
    hostpathplugin tools/csi built (`built`: name -> (binary, version)) under the tag the
    manifest names. Anything else the manifest names, or hostpathplugin not built, is a
    CSIImageError naming it."""
    others = sorted(set(wanted) - {PROXY_IMAGE})
    if others:
        raise CSIImageError(
            f"{PROXY_MANIFEST} names images nothing here provides: "
            + ", ".join(f"{n}:{wanted[n]}" for n in others)
        )
    if PROXY_IMAGE not in wanted:
        raise CSIImageError(f"{PROXY_MANIFEST} names no {PROXY_IMAGE} image")
    if PROXY_IMAGE not in built:
        raise CSIImageError(f"tools/csi/build.sh did not build {PROXY_IMAGE}")
    binary, _version = built[PROXY_IMAGE]
    return Plan(images={PROXY_IMAGE: (binary, wanted[PROXY_IMAGE])}, missing={})
