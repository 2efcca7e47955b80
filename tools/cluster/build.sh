#!/usr/bin/env bash
# Build the real control plane used by the cluster tests: kube-apiserver and kubectl from
# the Go module k8s.io/kubernetes (see go.mod here) and etcd from go.etcd.io/etcd/server/v3
# (see etcd/go.mod), through the Go module proxy.
#
# Binaries go to a cache keyed by version, outside the repository:
#   ${KLET_CACHE:-/var/cache/klet}/control-plane/<k8s>-etcd<etcd>/bin/{kube-apiserver,kubectl,etcd}
# and the Go module/build caches to ${KLET_CACHE}/go/{mod,build}, so fresh clones on the
# same machine reuse them. Idempotent: when the three binaries exist and report the right
# versions it does nothing. The last line printed on stdout is the bin directory; all
# progress goes to stderr.
#
# A cold build (empty module and build caches) took 6 min on 2 cores (3.6 GB of caches);
# relinking with a warm GOCACHE about 10 s; the cached check 0.1 s.
#
# Usage: build.sh [--check]   (--check: only report; exit 1 if a build would be needed)
set -euo pipefail

only_check=false
case "${1:-}" in
    --check) only_check=true ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KLET_CACHE:-/var/cache/klet}"
jobs="${KLET_BUILD_JOBS:-2}"

log() { printf 'build.sh: %s\n' "$*" >&2; }

# The versions come from the go.mod files: one source of truth.
modver() {  # modver MODULE GO.MOD -> the required version (inside or outside a require block)
    awk -v m="$1" '!/=>/ { if ($1 == "require") { $1 = "" ; $0 = $0 } } !/=>/ && $1 == m { print $2; exit }' "$2"
}
k8s_version="$(modver k8s.io/kubernetes "$here/go.mod")"
etcd_version="$(modver go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")"
[[ "$k8s_version" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || { log "cannot read k8s.io/kubernetes version from go.mod"; exit 1; }
k8s_minor="${BASH_REMATCH[1]}"
[[ "$etcd_version" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || { log "cannot read etcd version from etcd/go.mod"; exit 1; }

bin="$cache/control-plane/${k8s_version}-etcd${etcd_version#v}/bin"

# Each version is read into a variable first: with pipefail, `cmd | grep -q` fails at
# random when grep exits on its match before cmd has written everything (SIGPIPE).
check() {
    [[ -x "$bin/kube-apiserver" && -x "$bin/kubectl" && -x "$bin/etcd" ]] || return 1
    local out
    out=$("$bin/kube-apiserver" --version 2>/dev/null) || return 1
    grep -qx "Kubernetes ${k8s_version}" <<<"$out" || return 1
    out=$("$bin/kubectl" version --client -o json 2>/dev/null) || return 1
    grep -q "\"gitVersion\": \"${k8s_version}\"" <<<"$out" || return 1
    out=$("$bin/etcd" --version 2>/dev/null) || return 1
    grep -qx "etcd Version: ${etcd_version#v}" <<<"$out" || return 1
}

if check; then
    log "cached: kube-apiserver/kubectl ${k8s_version}, etcd ${etcd_version}"
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

mkdir -p "$bin" "$cache/go/mod" "$cache/go/build"
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build"
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

# One build at a time per cache (parallel test sessions may all call this script).
exec 9>"$cache/control-plane/.build.lock"
flock 9
if check; then
    log "built by a concurrent run"
    echo "$bin"
    exit 0
fi

# Commit and date of the release for `version` output, from the proxy's .info file
# (Time always; the commit only when the proxy recorded the VCS origin).
info_file="$(cd "$here" && "$go" mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p')"
info="$(cat "$info_file" 2>/dev/null || true)"
git_commit="$(printf '%s' "$info" | sed -n 's/.*"Hash":"\([0-9a-f]\{40\}\)".*/\1/p')"
build_date="$(printf '%s' "$info" | sed -n 's/.*"Time":"\([0-9T:-]*\)[^"]*".*/\1Z/p')"

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X ${pkg}.gitVersion=${k8s_version}"
    ldflags+=" -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${k8s_minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean"
    ldflags+=" -X ${pkg}.gitCommit=${git_commit}"  # empty rather than "$Format:%H$"
    if [[ -n "$build_date" ]]; then ldflags+=" -X ${pkg}.buildDate=${build_date}"; fi
done

start=$SECONDS
for cmd in kube-apiserver kubectl; do
    log "building ${cmd} ${k8s_version} (-p ${jobs})"
    (cd "$here" && "$go" build -p "$jobs" -trimpath -ldflags "$ldflags" \
        -o "$bin/.${cmd}.tmp" "k8s.io/kubernetes/cmd/${cmd}")
    mv -f "$bin/.${cmd}.tmp" "$bin/${cmd}"
done
log "building etcd ${etcd_version} (-p ${jobs})"
(cd "$here/etcd" && "$go" build -p "$jobs" -trimpath -ldflags "-s -w" \
    -o "$bin/.etcd.tmp" go.etcd.io/etcd/server/v3)
mv -f "$bin/.etcd.tmp" "$bin/etcd"

check || { log "built binaries do not report the expected versions"; exit 1; }
log "built in $((SECONDS - start)) s"
echo "$bin"
