#!/usr/bin/env bash
# Build the klet-kubelet Debian package: the layout the upstream kubelet packages install,
# with klet's entry point as the kubelet.
#
#   /usr/bin/kubelet                                      packaging/kubelet/kubelet
#   /lib/systemd/system/kubelet.service                   packaging/kubelet/kubelet.service
#   /etc/systemd/system/kubelet.service.d/10-kubeadm.conf packaging/kubelet/10-kubeadm.conf
#
# /usr/bin/kubelet runs `python -m klet.cli.kubelet` from klet's environment (/opt/klet, or
# $KLET_HOME), which this package does not carry: install klet there first, e.g.
#   uv venv /opt/klet && uv build --all-packages --wheel --out-dir W \
#     && uv pip install --python /opt/klet/bin/python W/*.whl
#
# Usage: build.sh [OUT_DIR]   (default .cache/package); prints the .deb's path last.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-$here/.cache/package}"
src="$here/packaging/kubelet"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/libs/pyproject.toml" | head -1)"
k8s="$(sed -n 's/^KUBERNETES_VERSION = "v\(.*\)"$/\1/p' "$here/libs/src/klet/config/gatelist.py")"
[[ -n "$version" && -n "$k8s" ]] || { echo "build.sh: cannot read the versions" >&2; exit 1; }
arch="$(dpkg --print-architecture)"

root="$out/root"
rm -rf "$root"
install -D -m 0755 "$src/kubelet" "$root/usr/bin/kubelet"
install -D -m 0644 "$src/kubelet.service" "$root/lib/systemd/system/kubelet.service"
install -D -m 0644 "$src/10-kubeadm.conf" \
    "$root/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
mkdir -p "$root/DEBIAN"
cat >"$root/DEBIAN/control" <<CONTROL
Package: klet-kubelet
Version: ${version}+k8s${k8s}
Architecture: ${arch}
Maintainer: klet <klet@localhost>
Provides: kubelet (= ${k8s})
Conflicts: kubelet
Replaces: kubelet
Depends: iptables, iproute2, mount
Section: admin
Priority: optional
Description: klet as the Kubernetes node agent (kubelet ${k8s})
 /usr/bin/kubelet and the kubelet systemd unit with kubeadm's drop-in, running klet
 (from /opt/klet) in place of the upstream kubelet.
CONTROL
printf '/etc/systemd/system/kubelet.service.d/10-kubeadm.conf\n' >"$root/DEBIAN/conffiles"
deb="$out/klet-kubelet_${version}+k8s${k8s}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >&2
echo "$deb"
