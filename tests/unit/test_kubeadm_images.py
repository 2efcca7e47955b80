"""tools/kubeadm/images.py's decisions: what `kubeadm config images list` asks for is read
back under the configured repository, matched with the binaries the project builds (a
differing tag fails naming both, the addons are left out by name, anything else fails),
and the config names the etcd tag and kubeadm's patches directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.kubeadm.images import (
    KubeadmImageError,
    etcd_tag,
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
}


def test_the_list_matches_the_built_binaries_and_leaves_the_addons_out() -> None:
    p = plan(parse_images_list(LISTED, REPO), BUILT)
    assert p.binaries == BUILT
    assert p.pause_tag == "3.10.1"
    assert p.left_out == ("coredns", "kube-proxy")


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
    init, cluster, kubelet = (json.loads(d) for d in text.split("---\n"))
    assert init["patches"] == {"directory": "/p"}
    assert init["nodeRegistration"] == {"name": "n1", "criSocket": "unix:///c.sock"}
    assert cluster["imageRepository"] == REPO
    assert cluster["etcd"] == {"local": {"imageTag": "3.6.16-0"}}
    assert kubelet["kind"] == "KubeletConfiguration"
    assert kubelet["cgroupDriver"] == "cgroupfs"
