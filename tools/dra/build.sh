#!/usr/bin/env bash
# Build upstream's DRA test driver (k8s.io/kubernetes/test/e2e/dra/test-driver, the
# driver the [DRA] e2e specs deploy) from the published k8s.io/kubernetes module that
# go.mod here requires, pinned by go.sum, as tools/deviceplugin builds the sample device
# plugin.
#
# Its `kubelet-plugin` mode is a DRA driver's node half: it publishes a ResourceSlice of
# fake devices for --node-name (so it needs an apiserver: --kubeconfig), registers
# through the plugin watcher (--plugin-registration-path, its DRAPlugin socket under
# --datadir/<driver>), and on NodePrepareResources reads each claim from the apiserver
# and writes a CDI spec per claim request into --cdi-dir, removed again by
# NodeUnprepareResources.
#
# The binary is static (CGO off, -trimpath, -s -w) and cached outside the repository by
# the module's version and go.sum's digest:
#   ${KLET_CACHE:-/var/cache/klet}/dra/<k8s version>-<digest>/dra-test-driver
# with the Go module/build caches shared with tools/cluster, tools/csi and
# tools/deviceplugin (GOPROXY=off: every module it needs is there once the control
# plane and e2e.test are built). Idempotent: a binary that is there is kept. The last
# stdout line is its path; progress and errors go to stderr.
#
# Cost (2 cores, shared): 15 s with the Go build cache warm from the control plane's and
# e2e.test's builds, under a second cached.
#
# Usage: build.sh [--check]   (--check: only report; exit 1 if a build would be needed)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gobuild_name=dra/build.sh
# shellcheck source=../gobuild.sh
source "$here/../gobuild.sh"

gobuild_args "$@"

version="$(gobuild_version "$here/go.mod" k8s.io/kubernetes '^v1\.[0-9]+\.[0-9]+$')"
digest="$(sha256sum "$here/go.sum" | cut -c1-12)"
dest="$cache/dra/${version}-${digest}/dra-test-driver"

if [[ -x "$dest" ]]; then echo "$dest"; exit 0; fi
if $only_check; then log "not built yet: $dest"; exit 1; fi

gobuild_env

mkdir -p "$(dirname "$dest")"
export GOPROXY="${GOPROXY:-off}"

# One build at a time per cache (parallel test sessions may all call this script).
exec 9>"$cache/dra/.build.lock"
flock 9
if [[ -x "$dest" ]]; then echo "$dest"; exit 0; fi  # built by a concurrent run meanwhile

began=$SECONDS
log "building dra-test-driver ${version} (-p ${jobs})"
tmp="$dest.tmp"
(cd "$here" && "$go" build -p "$jobs" -trimpath -ldflags "-s -w" -o "$tmp" \
    k8s.io/kubernetes/test/e2e/dra/test-driver) || { rm -f "$tmp"; log "build failed"; exit 1; }
mv -f "$tmp" "$dest"
log "built dra-test-driver in $((SECONDS - began)) s"
echo "$dest"
