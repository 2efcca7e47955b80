#!/usr/bin/env bash
# Build the DRA tier's CDI-capable container runtime: containerd v2 (cmd/containerd and
# cmd/containerd-shim-runc-v2) from the Go module github.com/containerd/containerd/v2 at
# the version containerd/go.mod here requires, pinned by containerd/go.sum.
#
# Why: Debian's containerd 1.6.20 (what every other tier runs) has no CDI support, so a
# CRI ContainerConfig.CDI_devices entry does nothing there. containerd v2's CRI plugin has
# `enable_cdi` on by default and reads CDI specs from `cdi_spec_dirs`; the harness
# (tests/harness/dra.py) starts it with a private config whose cdi_spec_dirs is the run's
# CDI directory, beside (never instead of) the default containerd. runc stays Debian's
# (1.1.5: measured, it runs v2's containers).
#
# Build as upstream's Makefile builds a static binary, without cgo: CGO_ENABLED=0 (the
# Makefile's SHIM_CGO_ENABLED for the shim; the daemon's cgo is only for btrfs, so the
# tag no_btrfs), tags urfave_cli_no_docs osusergo netgo static_build no_btrfs, the shim
# also no_grpc; -trimpath, -s -w, version.Version stamped. The shim sits beside the
# daemon: containerd v2 looks a shim up on PATH and then next to its own executable.
#
# Cached by version and go.sum's digest outside the repository:
#   ${KLET_CACHE:-/var/cache/klet}/dra/containerd-<version>-<digest>/{containerd,containerd-shim-runc-v2}
# with the Go module/build caches shared with the other builds (${KLET_CACHE}/go/{mod,build}).
# Idempotent: binaries that are there are kept. The last stdout line is the bin directory;
# progress and errors go to stderr.
#
# Cost (2 cores, shared, load 12-30, measured 2026-11-29): downloading the module graph
# 56 s (go mod tidy), then both binaries 380 s with a Go build cache warm only from the
# other builds' shared modules; cached, under a second.
#
# Usage: build-containerd.sh [--check]   (--check: only report; exit 1 if a build is needed)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gobuild_name=dra/build-containerd.sh
# shellcheck source=../gobuild.sh
source "$here/../gobuild.sh"

gobuild_args "$@"

module=github.com/containerd/containerd/v2
version="$(gobuild_version "$here/containerd/go.mod" "$module" '^v2\.[0-9]+\.[0-9]+$')"
digest="$(sha256sum "$here/containerd/go.sum" | cut -c1-12)"
bin="$cache/dra/containerd-${version}-${digest}"

built() { [[ -x "$bin/containerd" && -x "$bin/containerd-shim-runc-v2" ]]; }
if built; then echo "$bin"; exit 0; fi
if $only_check; then log "not built yet: $bin"; exit 1; fi

gobuild_env

mkdir -p "$bin"
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

exec 9>"$cache/dra/.build-containerd.lock"
flock 9
if built; then echo "$bin"; exit 0; fi  # built by a concurrent run meanwhile

tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs"
ldflags="-s -w -X $module/version.Version=$version -X $module/version.Package=$module"
began=$SECONDS
log "building containerd ${version} (-p ${jobs})"
(cd "$here/containerd" &&
    "$go" build -p "$jobs" -trimpath -tags "$tags" -ldflags "$ldflags" \
        -o "$bin/containerd.tmp" "$module/cmd/containerd" &&
    "$go" build -p "$jobs" -trimpath -tags "$tags no_grpc" -ldflags "$ldflags" \
        -o "$bin/containerd-shim-runc-v2.tmp" "$module/cmd/containerd-shim-runc-v2") ||
    { rm -f "$bin"/*.tmp; log "build failed"; exit 1; }
mv -f "$bin/containerd-shim-runc-v2.tmp" "$bin/containerd-shim-runc-v2"
mv -f "$bin/containerd.tmp" "$bin/containerd"
log "built containerd and containerd-shim-runc-v2 ${version} in $((SECONDS - began)) s"
echo "$bin"
