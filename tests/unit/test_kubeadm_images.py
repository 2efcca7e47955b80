"""tools/kubeadm/images.py's decisions: what `kubeadm config images list` asks for is read
back under the configured repository, matched with the binaries the project builds (a
differing tag fails naming both, an image not built fails naming it, the addons
included), the config names the etcd tag, kubeadm's patches directory and kube-proxy's
conntrack left alone, without the addons (the smoke's init) the plan leaves them
out, and each image's shape (coredns's entrypoint, kube-proxy's
iptables)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.kubeadm.images import (
    ADDON_PHASES,
    SKIPPED_PHASES,
    KubeadmImageError,
    binary_entries,
    etcd_tag,
    image_config,
    kubeadm_config,
    parse_images_list,
    plan,
)

REPO = "registry.klet.test/kubeadm"
LISTED = f"""\
{REPO}/kube-apiserver:v1.34.4
{REPO}/kube-controller-manager:v1.34.4
{REPO}/kube-scheduler:v1.34.4
{REPO}/kube-proxy:v1.34.4
{REPO}/coredns:v1.12.1
{REPO}/pause:3.10.1
{REPO}/etcd:3.6.16-0
"""
BUILT = {
    "kube-apiserver": (Path("/b/kube-apiserver"), "v1.34.4"),
    "kube-controller-manager": (Path("/b/kube-controller-manager"), "v1.34.4"),
    "kube-scheduler": (Path("/b/kube-scheduler"), "v1.34.4"),
    "etcd": (Path("/b/etcd"), "3.6.16-0"),
    "kube-proxy": (Path("/a/kube-proxy"), "v1.34.4"),
    "coredns": (Path("/a/coredns"), "v1.12.1"),
}


def test_the_list_matches_the_built_binaries_addons_included() -> None:
    p = plan(parse_images_list(LISTED, REPO), BUILT)
    assert p.binaries == BUILT
    assert p.pause_tag == "3.10.1"
    assert SKIPPED_PHASES == ()


def test_without_addons_the_plan_leaves_kube_proxy_and_coredns_out() -> None:
    """The smoke's init skips ADDON_PHASES: the addons need not be built, and are not
    imaged even when they were."""
    wanted = parse_images_list(LISTED, REPO)
    core = {k: v for k, v in BUILT.items() if k not in ("kube-proxy", "coredns")}
    assert plan(wanted, core, addons=False).binaries == core
    assert plan(wanted, BUILT, addons=False).binaries == core
    assert ADDON_PHASES == ("addon/kube-proxy", "addon/coredns")
    with pytest.raises(KubeadmImageError, match="etcd, which was not built"):
        plan(wanted, {k: v for k, v in core.items() if k != "etcd"}, addons=False)


def test_an_addon_not_built_or_at_another_version_fails_naming_it() -> None:
    wanted = parse_images_list(LISTED, REPO)
    with pytest.raises(KubeadmImageError, match="coredns, which was not built"):
        plan(wanted, {k: v for k, v in BUILT.items() if k != "coredns"})
    wanted["coredns"] = "v1.11.3"
    with pytest.raises(
        KubeadmImageError, match="coredns:v1.11.3, tools/kubeadm/addons.py builds coredns v1.12.1"
    ):
        plan(wanted, BUILT)


def test_coredns_runs_its_binary_as_entrypoint_the_others_by_command() -> None:
    assert [e.path for e in binary_entries("coredns", Path("/a/coredns"))] == ["coredns"]
    assert image_config("coredns", "v1.12.1").entrypoint == ["/coredns"]
    assert image_config("kube-scheduler", "v1.34.4").entrypoint == []
    # kubeadm's commands by name from /usr/local/bin; kube-proxy's iptables in /usr/sbin
    assert {"/usr/local/bin", "/usr/sbin"} <= set(
        image_config("kube-proxy", "v1.34.4").env["PATH"].split(":")
    )


def test_a_tag_kubeadm_asks_for_that_is_not_built_fails_naming_both() -> None:
    wanted = parse_images_list(LISTED.replace("etcd:3.6.16-0", "etcd:3.6.5-0"), REPO)
    with pytest.raises(KubeadmImageError, match="etcd:3.6.5-0, tools/cluster builds etcd 3.6.16-0"):
        plan(wanted, BUILT)


def test_an_image_outside_the_repository_or_unknown_fails() -> None:
    with pytest.raises(KubeadmImageError, match="registry.k8s.io/pause:3.10.1"):
        parse_images_list("registry.k8s.io/pause:3.10.1\n", REPO)
    wanted = parse_images_list(LISTED + f"{REPO}/something:1\n", REPO)
    with pytest.raises(KubeadmImageError, match="something"):
        plan(wanted, BUILT)


def test_etcd_tag_and_config() -> None:
    assert etcd_tag("etcd Version: 3.6.16\nGit SHA: x\n") == "3.6.16-0"
    with pytest.raises(KubeadmImageError):
        etcd_tag("nothing")
    text = kubeadm_config(
        advertise_address="10.0.0.1",
        node_name="n1",
        cri_socket="unix:///c.sock",
        etcd_image_tag="3.6.16-0",
        image_repository=REPO,
        kubernetes_version="v1.34.4",
        cgroup_driver="cgroupfs",
        patches_dir="/p",
    )
    init, cluster, kubelet, proxy = (json.loads(d) for d in text.split("---\n"))
    assert init["patches"] == {"directory": "/p"}
    assert init["nodeRegistration"] == {"name": "n1", "criSocket": "unix:///c.sock"}
    assert cluster["imageRepository"] == REPO
    assert cluster["etcd"] == {"local": {"imageTag": "3.6.16-0"}}
    assert kubelet["kind"] == "KubeletConfiguration"
    assert kubelet["cgroupDriver"] == "cgroupfs"
    assert proxy["kind"] == "KubeProxyConfiguration"
    assert proxy["conntrack"] == {"maxPerCore": 0}
