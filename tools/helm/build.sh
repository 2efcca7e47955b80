#!/usr/bin/env bash
# Build a pinned helm from the Go module proxy: helm.sh/helm/v4 (the helm the tests render
# and install the chart with) or helm.sh/helm/v3 (only to prove the chart lints on Helm 3),
# each from its own Go module here (v4/go.mod, v3/go.mod: one source of truth for the
# version). Why not a release tarball from get.helm.sh or a PyPI wheel: the Go module
# proxy is the registry the project already builds its control plane from (tools/cluster),
# and the checksum database verifies every module it fetches.
#
# The binary goes to a cache keyed by version, outside the repository:
#   ${KLET_CACHE:-/var/cache/klet}/helm/<version>/helm
# with the Go module/build caches shared with tools/cluster (${KLET_CACHE}/go/{mod,build}).
# Idempotent: when the binary exists and `helm version` reports the pinned version it does
# nothing. The last line printed on stdout is the binary's path; progress goes to stderr.
#
# Usage: build.sh [--check] v4|v3   (--check: only report; exit 1 if a build would be needed)
set -euo pipefail

only_check=false
if [[ "${1:-}" == --check ]]; then only_check=true; shift; fi
major="${1:-}"
[[ "$major" == v3 || "$major" == v4 ]] || { echo "usage: $0 [--check] v4|v3" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/$major"
cache="${KLET_CACHE:-/var/cache/klet}"
jobs="${KLET_BUILD_JOBS:-2}"

log() { printf 'helm/build.sh: %s\n' "$*" >&2; }

modver() {  # modver MODULE GO.MOD -> the required version (inside or outside a require block)
    awk -v m="$1" '!/=>/ { if ($1 == "require") { $1 = "" ; $0 = $0 } } !/=>/ && $1 == m { print $2; exit }' "$2"
}
helm_module="helm.sh/helm/${major}"
version="$(modver "$helm_module" "$mod/go.mod")"
[[ "$version" =~ ^${major}\.[0-9]+\.[0-9]+$ ]] || { log "cannot read ${helm_module} version from ${mod}/go.mod"; exit 1; }

dir="$cache/helm/${version}"
bin="$dir/helm"

# The version is read into a variable first: with pipefail, `cmd | grep -q` fails at
# random when grep exits on its match before cmd has written everything (SIGPIPE).
check() {
    [[ -x "$bin" ]] || return 1
    local out
    out=$(HELM_CONFIG_HOME=/nonexistent "$bin" version --template '{{.Version}}' 2>/dev/null) || return 1
    [[ "$out" == "$version" ]]
}

if check; then
    log "cached: helm ${version}"
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
exec 9>"$cache/helm/.build.lock"
flock 9
if check; then
    log "built by a concurrent run"
    echo "$bin"
    exit 0
fi

# What helm's own Makefile sets: the version `helm version` prints (otherwise "v4.3"
# with no patch), a clean tree, and the commit when the proxy recorded it.
info_file="$(cd "$mod" && "$go" mod download -json "$helm_module" | sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p')"
info="$(cat "$info_file" 2>/dev/null || true)"
git_commit="$(printf '%s' "$info" | sed -n 's/.*"Hash":"\([0-9a-f]\{40\}\)".*/\1/p')"
pkg="${helm_module}/internal/version"
ldflags="-s -w -X ${pkg}.version=${version} -X ${pkg}.gitTreeState=clean -X ${pkg}.gitCommit=${git_commit}"
if [[ "$major" == v3 ]]; then
    # Helm 3 takes the Kubernetes version it assumes for `template` and `lint` (the
    # chart's kubeVersion is checked against it) from ldflags, as its Makefile does from
    # the client-go it links: client-go v0.M.N is Kubernetes 1.M. Helm 4 reads the
    # binary's module information at run time instead.
    client_go="$(modver k8s.io/client-go "$mod/go.mod")"
    [[ "$client_go" =~ ^v0\.([0-9]+)\.[0-9]+$ ]] || { log "cannot read k8s.io/client-go version from ${mod}/go.mod"; exit 1; }
    for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        ldflags+=" -X ${p}.k8sVersionMajor=1 -X ${p}.k8sVersionMinor=${BASH_REMATCH[1]}"
    done
fi

start=$SECONDS
log "building helm ${version} (-p ${jobs})"
(cd "$mod" && "$go" build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$dir/.helm.tmp" "${helm_module}/cmd/helm")
mv -f "$dir/.helm.tmp" "$bin"

check || { log "the built helm does not report ${version}"; exit 1; }
log "built in $((SECONDS - start)) s"
echo "$bin"
