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
cache="${KLET_CACHE:-/var/cache/klet}"
jobs="${KLET_BUILD_JOBS:-2}"
log() { printf 'deviceplugin/build.sh: %s\n' "$*" >&2; }

only_check=false
for arg in "$@"; do
    case "$arg" in
        --check) only_check=true ;;
        *) log "usage: $0 [--check]"; exit 2 ;;
    esac
done

version="$(awk '!/=>/ { if ($1 == "require") { $1 = "" ; $0 = $0 } } !/=>/ && $1 == "k8s.io/kubernetes" { print $2; exit }' "$here/go.mod")"
[[ "$version" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { log "cannot read the k8s.io/kubernetes version from go.mod"; exit 1; }
digest="$(sha256sum "$here/go.sum" | cut -c1-12)"
dest="$cache/deviceplugin/${version}-${digest}/sample-device-plugin"

if [[ -x "$dest" ]]; then echo "$dest"; exit 0; fi
if $only_check; then log "not built yet: $dest"; exit 1; fi

go="$(command -v go || true)"
[[ -n "$go" ]] || go=/usr/local/go/bin/go
[[ -x "$go" ]] || { log "no Go toolchain (looked on PATH and at /usr/local/go/bin/go)"; exit 1; }

mkdir -p "$(dirname "$dest")" "$cache/go/mod" "$cache/go/build"
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOWORK=off
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

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
