#!/usr/bin/env bash
# Build upstream's sample device plugin (k8s.io/kubernetes/test/images/sample-device-plugin,
# the image the e2e device-plugin specs deploy) from the published k8s.io/kubernetes
# module that go.mod here requires, pinned by go.sum, as tools/csi builds csi-mock.
#
# The plugin serves two fake devices of `example.com/resource` and both registration
# paths upstream's stub has: a Register on /var/lib/kubelet/device-plugins/kubelet.sock
# (a fixed path), or, with REGISTER_CONTROL_FILE set, none there: it then waits for a
# kubelet's plugin watcher to find its socket (PLUGIN_SOCK_DIR) and ask GetInfo.
#
# The binary is static (CGO off, -trimpath, -s -w) and cached outside the repository by
# the module's version and go.sum's digest (the binary has no --version to check):
#   ${KLET_CACHE:-/var/cache/klet}/deviceplugin/<k8s version>-<digest>/sample-device-plugin
# with the Go module/build caches shared with tools/cluster and tools/csi. Idempotent:
# a binary that is there is kept. The last stdout line is its path; progress and errors
# go to stderr.
#
# Cost (2 cores, shared): 24 s with the Go build cache warm from the control plane's
# build (the link, mostly), under a second cached.
#
# Usage: build.sh [--check]   (--check: only report; exit 1 if a build would be needed)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gobuild_name=deviceplugin/build.sh
# shellcheck source=../gobuild.sh
source "$here/../gobuild.sh"

gobuild_args "$@"

version="$(gobuild_version "$here/go.mod" k8s.io/kubernetes '^v1\.[0-9]+\.[0-9]+$')"
digest="$(sha256sum "$here/go.sum" | cut -c1-12)"
dest="$cache/deviceplugin/${version}-${digest}/sample-device-plugin"

if [[ -x "$dest" ]]; then echo "$dest"; exit 0; fi
if $only_check; then log "not built yet: $dest"; exit 1; fi

gobuild_env

mkdir -p "$(dirname "$dest")"

# One build at a time per cache (parallel test sessions may all call this script).
exec 9>"$cache/deviceplugin/.build.lock"
flock 9
if [[ -x "$dest" ]]; then echo "$dest"; exit 0; fi  # built by a concurrent run meanwhile

began=$SECONDS
log "building sample-device-plugin ${version} (-p ${jobs})"
tmp="$dest.tmp"
(cd "$here" && "$go" build -p "$jobs" -trimpath -ldflags "-s -w" -o "$tmp" \
    k8s.io/kubernetes/test/images/sample-device-plugin) || { rm -f "$tmp"; log "build failed"; exit 1; }
mv -f "$tmp" "$dest"
log "built sample-device-plugin in $((SECONDS - began)) s"
echo "$dest"
