#!/usr/bin/env bash
# Build the pinned metrics-server (sigs.k8s.io/metrics-server, the aggregated API behind
# `kubectl top`) from the Go module proxy, through the one Go module here (go.mod: one
# source of truth for the version), as tools/cluster builds the control plane. The
# cluster test tests/cluster/test_kubectl_top.py runs it against klet's /metrics/resource.
#
# The binary goes to a cache keyed by version, outside the repository:
#   ${KLET_CACHE:-/var/cache/klet}/metrics-server/<version>/metrics-server
# with the Go module/build caches shared with tools/cluster (${KLET_CACHE}/go/{mod,build}).
# Idempotent: when the binary exists and `--version` reports the pinned version it does
# nothing. The last line printed on stdout is the binary's path; progress goes to stderr.
#
# Measured on 2 cores with empty module and build caches: 867 s of wall time while a CI
# run kept the load average at 10-11 (6 min 11 s user + 66 s system CPU, so about 4 min
# on a quiet machine; 0.34 GB of modules, 1.5 GB of build cache). With the shared caches
# holding only the other tools' modules: 5 min 5 s user CPU (little is shared: v0.8.0
# links the k8s.io v0.33 libraries, the control plane v0.34). Relinking with a warm
# GOCACHE 17 s; the cached check 0.2 s.
#
# Usage: build.sh [--check]   (--check: only report; exit 1 if a build would be needed)
set -euo pipefail

only_check=false
case "${1:-}" in
    "") ;;
    --check) only_check=true ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KLET_CACHE:-/var/cache/klet}"
jobs="${KLET_BUILD_JOBS:-2}"
module=sigs.k8s.io/metrics-server

log() { printf 'metrics-server/build.sh: %s\n' "$*" >&2; }

modver() {  # modver MODULE GO.MOD -> the required version (inside or outside a require block)
    awk -v m="$1" '!/=>/ { if ($1 == "require") { $1 = "" ; $0 = $0 } } !/=>/ && $1 == m { print $2; exit }' "$2"
}
version="$(modver "$module" "$here/go.mod")"
[[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "cannot read ${module} version from ${here}/go.mod"; exit 1; }

dir="$cache/metrics-server/${version}"
bin="$dir/metrics-server"

# The version is read into a variable first: with pipefail, `cmd | grep -q` fails at
# random when grep exits on its match before cmd has written everything (SIGPIPE).
check() {
    [[ -x "$bin" ]] || return 1
    local out
    out=$("$bin" --version 2>/dev/null) || return 1
    [[ "$out" == "$version" ]]
}

if check; then
    log "cached: metrics-server ${version}"
    echo "$bin"
    exit 0
fi
if $only_check; then
    log "not built yet: ${bin}"
    exit 1
fi

go="$(command -v go || true)"
[[ -n "$go" ]] || go=/usr/local/go/bin/go
[[ -x "$go" ]] || { log "no Go toolchain (looked on PATH and at /usr/local/go/bin/go)"; exit 1; }

mkdir -p "$dir" "$cache/go/mod" "$cache/go/build"
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build"
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

# One build at a time per cache (parallel test sessions may all call this script).
exec 9>"$cache/metrics-server/.build.lock"
flock 9
if check; then
    log "built by a concurrent run"
    echo "$bin"
    exit 0
fi

# What metrics-server's own Makefile sets: the version `--version` prints (client-go's
# version package, otherwise "v0.0.0-master"), and the commit when the proxy recorded it.
info_file="$(cd "$here" && "$go" mod download -json "$module" | sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p')"
info="$(cat "$info_file" 2>/dev/null || true)"
git_commit="$(printf '%s' "$info" | sed -n 's/.*"Hash":"\([0-9a-f]\{40\}\)".*/\1/p')"
pkg=k8s.io/client-go/pkg/version
ldflags="-s -w -X ${pkg}.gitVersion=${version} -X ${pkg}.gitCommit=${git_commit}"

start=$SECONDS
log "building metrics-server ${version} (-p ${jobs})"
(cd "$here" && "$go" build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$dir/.metrics-server.tmp" "${module}/cmd/metrics-server")
mv -f "$dir/.metrics-server.tmp" "$bin"

check || { log "the built metrics-server does not report ${version}"; exit 1; }
log "built in $((SECONDS - start)) s"
echo "$bin"
