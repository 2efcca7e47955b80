"""tools/kubeadm/addons.py's decisions: the versions come from its go.mod files (kube-proxy
at the k8s.io/kubernetes it requires, CoreDNS at what kubeadm v1.34.4 pins), the versions
the built binaries report are read into kubeadm's tags, kube-proxy is stamped with its
version, and `ldd` output gives the shared libraries iptables needs in the image."""

from __future__ import annotations

import pytest

from tools.kubeadm.addons import (
    COREDNS_MODULE,
    IPTABLES_NAMES,
    KUBE_PROXY_MODULE,
    AddonBuildError,
    coredns_tag,
    kube_proxy_ldflags,
    kube_proxy_tag,
    required_version,
    shared_libraries,
)


def test_the_versions_are_those_the_go_mod_files_require() -> None:
    proxy = (KUBE_PROXY_MODULE / "go.mod").read_text()
    assert required_version(proxy, "k8s.io/kubernetes") == "v1.34.4"
    assert "tool k8s.io/kubernetes/cmd/kube-proxy" in proxy
    coredns = (COREDNS_MODULE / "go.mod").read_text()
    # kubeadm v1.34.4's constants.CoreDNSVersion
    assert required_version(coredns, "github.com/coredns/coredns") == "v1.12.1"
    text = "module m\n\nrequire (\n\tk8s.io/api v0.0.0\n)\n\n"
    text += "replace k8s.io/api => k8s.io/api v0.34.4\n"
    assert required_version(text, "k8s.io/api") == "v0.0.0"
    assert required_version("require a.b/c v1.2.3\n", "a.b/c") == "v1.2.3"
    with pytest.raises(AddonBuildError, match="does not require x.y/z"):
        required_version(text, "x.y/z")


def test_reported_versions_become_kubeadm_tags() -> None:
    assert coredns_tag("CoreDNS-1.12.1\nlinux/amd64, go1.26.8, \n") == "v1.12.1"
    assert kube_proxy_tag("Kubernetes v1.34.4\n") == "v1.34.4"
    with pytest.raises(AddonBuildError, match="CoreDNS's version"):
        coredns_tag("Kubernetes v1.34.4")
    with pytest.raises(AddonBuildError, match="kube-proxy's version"):
        kube_proxy_tag("Kubernetes v0.0.0-master+$Format:%H$")


def test_kube_proxy_is_stamped_with_its_version() -> None:
    flags = kube_proxy_ldflags("v1.34.4")
    assert "-X k8s.io/component-base/version.gitVersion=v1.34.4" in flags
    assert "-X k8s.io/component-base/version.gitMinor=34" in flags
    with pytest.raises(AddonBuildError):
        kube_proxy_ldflags("1.34")


def test_ldd_output_names_the_libraries_and_the_loader() -> None:
    out = (
        "/usr/sbin/xtables-nft-multi:\n"
        "\tlinux-vdso.so.1 (0x00007fc532b28000)\n"
        "\tlibxtables.so.12 => /lib/x86_64-linux-gnu/libxtables.so.12 (0x00007fc532a62000)\n"
        "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fc532845000)\n"
        "\t/lib64/ld-linux-x86-64.so.2 (0x00007fc532b2a000)\n"
        "/usr/lib/x86_64-linux-gnu/xtables/libxt_mark.so:\n"
        "\tlibxtables.so.12 => /lib/x86_64-linux-gnu/libxtables.so.12 (0x1)\n"
    )
    assert shared_libraries(out) == {
        "/lib/x86_64-linux-gnu/libxtables.so.12",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
    }
    with pytest.raises(AddonBuildError, match="libgone.so.1, not found"):
        shared_libraries(out + "\tlibgone.so.1 => not found\n")
    # what kube-proxy's iptables mode and its --cleanup run
    assert {"iptables", "iptables-save", "iptables-restore", "ip6tables-restore"} <= set(
        IPTABLES_NAMES
    )
