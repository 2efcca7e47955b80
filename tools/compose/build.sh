#!/usr/bin/env bash
# Build the pinned Compose v2 (github.com/docker/compose/v2, the `docker compose` CLI
# plugin) from the Go module proxy, through the one Go module here (go.mod: one source of
# truth for the version), as tools/cluster builds the control plane. Debian bookworm
# packages only Compose 1.29 (docker-compose, Python) and no v2 plugin; the compose tier
# runs docker-compose.yml under both (tests/compose, `make test-compose-v2`).
#
# The binary goes to a cache keyed by version, outside the repository:
#   ${KLET_CACHE:-/var/cache/klet}/compose/<version>/docker-compose
# with the Go module/build caches shared with tools/cluster (${KLET_CACHE}/go/{mod,build}).
# It runs standalone (`docker-compose ...`) or, linked or copied into a docker CLI plugin
# directory (~/.docker/cli-plugins/, or $DOCKER_CONFIG/cli-plugins/, as the tests do), as
# `docker compose ...`; Debian's docker 20.10 client runs plugins.
# Idempotent: when the binary exists and `version --short` reports the pinned version it
# does nothing. The last line printed on stdout is the binary's path; progress goes to
# stderr.
#
# Measured on 2 cores with empty module and build caches: 449 s of wall time (21 s of it
# downloads) while other builds kept the load average at 10-25; 258 s user + 46 s system
# CPU, so about 2.5 min on a quiet machine; 0.5 GB of modules, 0.9 GB of build cache.
# With the caches already holding tools/cluster's, tools/helm's and tools/metrics-server's
# packages: 146 s (197 s user + 32 s system CPU; little is shared). The cached check 0.05 s.
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
module=github.com/docker/compose/v2

log() { printf 'compose/build.sh: %s\n' "$*" >&2; }

modver() {  # modver MODULE GO.MOD -> the required version (inside or outside a require block)
    awk -v m="$1" '!/=>/ { if ($1 == "require") { $1 = "" ; $0 = $0 } } !/=>/ && $1 == m { print $2; exit }' "$2"
}
version="$(modver "$module" "$here/go.mod")"
[[ "$version" =~ ^v2\.[0-9]+\.[0-9]+$ ]] || { log "cannot read ${module} version from ${here}/go.mod"; exit 1; }

dir="$cache/compose/${version}"
bin="$dir/docker-compose"

# The version is read into a variable first: with pipefail, `cmd | grep -q` fails at
# random when grep exits on its match before cmd has written everything (SIGPIPE).
check() {
    [[ -x "$bin" ]] || return 1
    local out
    out=$(DOCKER_CONFIG=/nonexistent "$bin" version --short 2>/dev/null) || return 1
    [[ "v$out" == "$version" ]]
}

if check; then
    log "cached: compose ${version}"
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
exec 9>"$cache/compose/.build.lock"
flock 9
if check; then
    log "built by a concurrent run"
    echo "$bin"
    exit 0
fi

# What compose's own Makefile sets: the version `docker compose version` prints
# (otherwise "dev"). No build tags: its e2e tag only serves its own test suite.
ldflags="-s -w -X ${module}/internal.Version=${version}"

start=$SECONDS
log "building compose ${version} (-p ${jobs})"
(cd "$here" && "$go" build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$dir/.docker-compose.tmp" "${module}/cmd")
mv -f "$dir/.docker-compose.tmp" "$bin"

check || { log "the built compose does not report ${version}"; exit 1; }
log "built in $((SECONDS - start)) s"
echo "$bin"
