"""The images `kubeadm init` runs as static pods, built offline from the control plane the
project already builds and pushed to the dev registry.

kubeadm names its images `<imageRepository>/<name>:<tag>`; with `imageRepository`
pointing at the dev registry (`registry.klet.test/kubeadm`, which the node's containerd
maps to the test registry) a node needs no internet. What kubeadm asks for is read from
`kubeadm config images list` itself, not repeated here, so a kubeadm that wants another
tag than what is built fails here naming both instead of serving a binary under a tag it
is not.

Provided: kube-apiserver, kube-controller-manager and kube-scheduler (tools/cluster's
binaries, tag = their version), etcd (tools/cluster's etcd; kubeadm v1.34.4 defaults to
etcd 3.6.5-0 and the project builds 3.6.16, so the image is tagged `3.6.16-0` and the
ClusterConfiguration names it with `etcd.local.imageTag`, see kubeadm_config()), and
pause (the dev stack's pause image under kubeadm's name and tag), and the addons kubeadm's
addon phase deploys, kube-proxy and coredns (tools/kubeadm/addons.py builds them from
source), so `kubeadm init` runs every phase.

Shape: the static binary at `/usr/local/bin/<name>` on the static base of tools/csi
(passwd, group, /tmp), PATH set, no entrypoint: kubeadm's manifests give `command:
[kube-apiserver, ...]`, resolved through the image's PATH as with upstream's images.
kube-proxy's also carries iptables (addons.iptables_entries); coredns's binary is
`/coredns`, the entrypoint, as upstream's image has it (kubeadm gives only its args).

    python -m tools.kubeadm.images [--registry 127.0.0.1:PORT] [--host H]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from klet.devstack.images import (
    TEST_REGISTRY_HOST,
    BuiltImage,
    ImageError,
    build,
    push,
    standard_images,
)

from tools.csi.images import STATIC_GROUP, STATIC_PASSWD, static_base_entries
from tools.e2e.images import packed
from tools.e2e.layers import Entry, LayerError, cached_layer, file_digest
from tools.image.layers import LayerCache
from tools.image.oci import ImageConfig, Layer
from tools.kubeadm.addons import (
    ADDON_IMAGES,
    AddonBuildError,
    build_addon_binaries,
    iptables_entries,
)

BUILD_SH = Path(__file__).resolve().parents[1] / "cluster" / "build.sh"
REPOSITORY = "kubeadm"  # under the registry host: <host>/kubeadm/<name>
BINARY_IMAGES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
# kubeadm phases init skips: none, every image kubeadm lists is built here
SKIPPED_PHASES: tuple[str, ...] = ()
# the phases a control plane without addons skips (tests/kubeadm's smoke, in make test:
# it needs no addon built, CoreDNS's build being minutes cold)
ADDON_PHASES = ("addon/kube-proxy", "addon/coredns")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # iptables: usr/sbin


class KubeadmImageError(RuntimeError):
    """The images could not be built, or do not match what kubeadm asks for."""


def parse_images_list(text: str, repository: str) -> dict[str, str]:
    """`kubeadm config images list` output -> name -> tag, for images under `repository`.
    An image elsewhere (imageRepository not applied) is an error naming it."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        head, sep, tag = line.rpartition(":")
        prefix, _, name = head.rpartition("/")
        if not sep or prefix != repository:
            raise KubeadmImageError(f"kubeadm asks for {line!r}, not under {repository}")
        found[name] = tag
    return found


def etcd_tag(version_output: str) -> str:
    """The image tag for `etcd --version` output, kubeadm's form `<version>-0`."""
    m = re.search(r"^etcd Version: (\d+\.\d+\.\d+)$", version_output, re.M)
    if m is None:
        raise KubeadmImageError(f"cannot read etcd's version from {version_output!r}")
    return f"{m.group(1)}-0"


@dataclass(frozen=True)
class Plan:
    """What to build: name -> (binary, tag); pause's tag."""

    binaries: dict[str, tuple[Path, str]]
    pause_tag: str


def plan(
    wanted: Mapping[str, str], built: Mapping[str, tuple[Path, str]], *, addons: bool = True
) -> Plan:
    """Match kubeadm's images (`wanted`, name -> tag) with the built binaries (name ->
    (path, the tag it deserves)). A differing tag fails naming both; a name not built
    fails too. Without `addons` (init skipping ADDON_PHASES) kube-proxy's and coredns's
    images are left out of the plan, though kubeadm lists them."""
    binaries: dict[str, tuple[Path, str]] = {}
    for name in (*BINARY_IMAGES, *(ADDON_IMAGES if addons else ())):
        if name not in wanted:
            raise KubeadmImageError(f"kubeadm does not list {name}")
        if name not in built:
            raise KubeadmImageError(f"kubeadm asks for {name}, which was not built")
        path, tag = built[name]
        if wanted[name] != tag:
            where = "tools/kubeadm/addons.py" if name in ADDON_IMAGES else "tools/cluster"
            raise KubeadmImageError(
                f"kubeadm asks for {name}:{wanted[name]}, {where} builds {name} {tag}"
            )
        binaries[name] = (path, tag)
    if "pause" not in wanted:
        raise KubeadmImageError("kubeadm does not list pause")
    unknown = sorted(set(wanted) - set(BINARY_IMAGES) - set(ADDON_IMAGES) - {"pause"})
    if unknown:
        raise KubeadmImageError(f"kubeadm asks for images nothing here provides: {unknown}")
    return Plan(binaries=binaries, pause_tag=wanted["pause"])


def kubeadm_config(
    *,
    advertise_address: str,
    node_name: str,
    cri_socket: str,
    etcd_image_tag: str,
    image_repository: str,
    kubernetes_version: str,
    cgroup_driver: str,
    patches_dir: str | None = None,
    encryption_algorithm: str | None = None,
) -> str:
    """The kubeadm v1beta4 InitConfiguration (with kubeadm's `patches` directory when
    given) + ClusterConfiguration (with `encryptionAlgorithm` when given: ECDSA-P256 keys
    cost a loaded machine far less than the default RSA-2048) + KubeletConfiguration +
    KubeProxyConfiguration for a node whose images come from `image_repository` (JSON
    documents are YAML).

    kube-proxy's `conntrack.maxPerCore: 0` leaves `nf_conntrack_max` as it is (upstream's
    documented meaning of 0): a node in a network namespace other than the host's (the
    kubeadm test's) has that sysctl read-only, and kube-proxy exits when writing it fails.
    """
    init: dict[str, object] = {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "InitConfiguration",
        "localAPIEndpoint": {"advertiseAddress": advertise_address, "bindPort": 6443},
        "nodeRegistration": {"name": node_name, "criSocket": cri_socket},
    }
    if patches_dir is not None:
        init["patches"] = {"directory": patches_dir}
    cluster: dict[str, object] = {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "ClusterConfiguration",
        "kubernetesVersion": kubernetes_version,
        "imageRepository": image_repository,
        "etcd": {"local": {"imageTag": etcd_image_tag}},
    }
    if encryption_algorithm is not None:
        cluster["encryptionAlgorithm"] = encryption_algorithm
    docs = [
        init,
        cluster,
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": cgroup_driver,
        },
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "conntrack": {"maxPerCore": 0},
        },
    ]
    return "---\n".join(json.dumps(d, indent=1) + "\n" for d in docs)


def build_binaries(*, cache: Path, addons: bool = True) -> tuple[dict[str, tuple[Path, str]], Path]:
    """tools/cluster/build.sh --with-kubeadm (and the addons unless not `addons`): name ->
    (binary, image tag), and kubeadm."""
    env = {**os.environ, "KLET_CACHE": str(cache)}
    res = subprocess.run(
        ["bash", str(BUILD_SH), "--with-kubeadm"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if res.returncode != 0:
        raise KubeadmImageError(f"{BUILD_SH} exited {res.returncode}:\n{res.stderr[-3000:]}")
    bin_dir = Path(res.stdout.strip().splitlines()[-1])
    k8s_version = subprocess.run(
        [str(bin_dir / "kubeadm"), "version", "-o", "short"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    etcd_out = subprocess.run(
        [str(bin_dir / "etcd"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    built = {n: (bin_dir / n, k8s_version) for n in BINARY_IMAGES if n != "etcd"}
    built["etcd"] = (bin_dir / "etcd", etcd_tag(etcd_out))
    if not addons:
        return built, bin_dir / "kubeadm"
    try:
        built.update(build_addon_binaries(cache=cache))
    except (AddonBuildError, OSError) as err:
        raise KubeadmImageError(f"kubeadm's addons: {err}") from err
    return built, bin_dir / "kubeadm"


def kubeadm_images(kubeadm: Path, config: Path, repository: str) -> dict[str, str]:
    """What `kubeadm config images list --config` asks for, name -> tag."""
    res = subprocess.run(
        [str(kubeadm), "config", "images", "list", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise KubeadmImageError(f"kubeadm config images list: {res.stderr.strip()}")
    return parse_images_list(res.stdout, repository)


def binary_entries(name: str, binary: Path) -> list[Entry]:
    """The image's own layer: the binary where kubeadm's manifest runs it from (coredns
    at `/coredns`, its entrypoint), with kube-proxy the iptables it runs."""
    if name == "coredns":
        return [Entry("coredns", mode=0o755, source=binary)]
    entries = [Entry(f"usr/local/bin/{name}", mode=0o755, source=binary)]
    if name == "kube-proxy":
        entries += iptables_entries()
    return entries


def image_config(name: str, tag: str) -> ImageConfig:
    """coredns's entrypoint is its binary (kubeadm passes only `-conf ...`); the others
    have none (kubeadm's manifests give the command)."""
    entrypoint = ["/coredns"] if name == "coredns" else []
    return ImageConfig(
        entrypoint=entrypoint,
        cmd=[],
        env={"PATH": PATH},
        labels={"org.opencontainers.image.version": tag},
    )


@dataclass(frozen=True)
class KubeadmImage:
    """One built image and where it goes."""

    name: str
    tag: str
    reference: str  # <host>/kubeadm/<name>:<tag>
    image: BuiltImage

    @property
    def repository(self) -> str:
        return f"{REPOSITORY}/{self.name}"


def build_images(p: Plan, *, cache: Path, host: str = TEST_REGISTRY_HOST) -> list[KubeadmImage]:
    """The images of `p`: each binary on the static base, and the dev stack's pause."""
    layers = LayerCache(cache / "kubeadm" / "images")
    base: Layer = cached_layer(
        layers,
        "kubeadm-static-base",
        inputs={"passwd": STATIC_PASSWD, "group": STATIC_GROUP},
        entries=static_base_entries,
    )
    out = []
    for name, (binary, tag) in sorted(p.binaries.items()):
        inputs: dict[str, object] = {"name": name, "binary": file_digest(binary)}
        if name == "kube-proxy":  # the iptables copied in: a host upgrade rebuilds it
            inputs["iptables"] = [
                (e.path, e.linkname or (file_digest(e.source) if e.source else ""))
                for e in iptables_entries()
            ]
        layer = cached_layer(
            layers,
            f"kubeadm-{name}",
            inputs=inputs,
            entries=partial(binary_entries, name, binary),
        )
        reference = f"{host}/{REPOSITORY}/{name}:{tag}"
        config = image_config(name, tag)
        what = "static base: passwd, group, /tmp (tools/csi/images.py)"
        image = packed(reference, [base, layer], config, [what, f"{name} {tag}"])
        out.append(KubeadmImage(name, tag, reference, image))
    pause_spec = dataclasses.replace(
        standard_images()["pause"], name=f"{host}/{REPOSITORY}/pause", tag=p.pause_tag
    )
    out.append(KubeadmImage("pause", p.pause_tag, pause_spec.reference, build(pause_spec)))
    return out


def push_images(images: Iterable[KubeadmImage], registry: str) -> dict[str, str]:
    """Push each image to the plain-HTTP registry `registry` (host:port) as
    kubeadm/<name>:<tag>. Reference -> manifest digest."""
    return {
        img.reference: push(
            img.image, registry, repository=img.repository, tag=img.tag, timeout_s=120
        )
        for img in images
    }


def prepare(
    *,
    cache: Path,
    work: Path,
    host: str = TEST_REGISTRY_HOST,
    addons: bool = True,
    **config: Any,
) -> tuple[Path, Path, Plan, list[KubeadmImage]]:
    """Build kubeadm and the binaries, write kubeadm's config (`config` are
    kubeadm_config()'s arguments but the tags and repository) to `work`/kubeadm.yaml, check
    it against `kubeadm config images list` and build the images: (kubeadm, config, plan,
    images). Without `addons`, for an init that skips ADDON_PHASES, kube-proxy and
    coredns are neither built nor imaged."""
    built, kubeadm = build_binaries(cache=cache, addons=addons)
    repository = f"{host}/{REPOSITORY}"
    path = work / "kubeadm.yaml"
    path.write_text(
        kubeadm_config(
            etcd_image_tag=built["etcd"][1],
            image_repository=repository,
            kubernetes_version=built["kube-apiserver"][1],
            **config,
        )
    )
    p = plan(kubeadm_images(kubeadm, path, repository), built, addons=addons)
    return kubeadm, path, p, build_images(p, cache=cache, host=host)


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m tools.kubeadm.images", description=doc[:80])
    parser.add_argument("--registry", help="host:port of a plain-HTTP registry to push to")
    parser.add_argument("--host", default=TEST_REGISTRY_HOST)
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("KLET_CACHE", "/var/cache/klet")),
    )
    parser.add_argument("--work", type=Path, default=Path("."), help="where kubeadm.yaml goes")
    args = parser.parse_args(argv)
    try:
        _, config, p, images = prepare(
            cache=args.cache_dir,
            work=args.work,
            host=args.host,
            advertise_address="10.0.0.1",
            node_name="node",
            cgroup_driver="cgroupfs",
            cri_socket="unix:///run/containerd/containerd.sock",
        )
        digests = push_images(images, args.registry) if args.registry else {}
    except (KubeadmImageError, LayerError, ImageError, OSError) as err:
        print(f"kubeadm images: {err}", file=sys.stderr)
        return 1
    for img in images:
        record = {"reference": img.reference, "digest": img.image.manifest_digest}
        if img.reference in digests:
            record["pushed"] = args.registry
        print(json.dumps(record))
    print(f"kubeadm images: config {config}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
