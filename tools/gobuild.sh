# Sourced (not run) by the cached Go builds of upstream test binaries:
# tools/deviceplugin/build.sh, tools/dra/build.sh, tools/dra/build-containerd.sh.
# Each of them reads one module's version from its go.mod, keys a cache directory by that
# version and go.sum's digest, and builds with the module/build caches every klet Go build
# shares (${KLET_CACHE:-/var/cache/klet}/go/{mod,build}); what they share is here so the
# three cannot drift apart (one cache layout, one --check meaning, one Go environment).
#
# After `source`: $cache, $jobs, log(); then
#   gobuild_args "$@"                       sets $only_check from [--check] or exits 2
#   gobuild_version GOMOD MODULE REGEX      prints MODULE's required version, or exits 1
#   gobuild_env                             sets $go and exports the shared Go environment
# The caller sets $gobuild_name (its name in log lines) before sourcing, and GOPROXY
# itself where its default differs (the environment's GOPROXY always wins).

cache="${KLET_CACHE:-/var/cache/klet}"
jobs="${KLET_BUILD_JOBS:-2}"
log() { printf '%s: %s\n' "$gobuild_name" "$*" >&2; }

gobuild_args() {
    only_check=false
    local arg
    for arg in "$@"; do
        case "$arg" in
            --check) only_check=true ;;
            *) log "usage: $0 [--check]"; exit 2 ;;
        esac
    done
}

gobuild_version() {
    local gomod="$1" module="$2" pattern="$3" found
    found="$(awk -v m="$module" '!/=>/ { if ($1 == "require") { $1 = "" ; $0 = $0 } } !/=>/ && $1 == m { print $2; exit }' "$gomod")"
    [[ "$found" =~ $pattern ]] || { log "cannot read the $module version from $(basename "$(dirname "$gomod")")/go.mod"; exit 1; }
    printf '%s\n' "$found"
}

gobuild_env() {
    go="$(command -v go || true)"
    [[ -n "$go" ]] || go=/usr/local/go/bin/go
    [[ -x "$go" ]] || { log "no Go toolchain (looked on PATH and at /usr/local/go/bin/go)"; exit 1; }
    mkdir -p "$cache/go/mod" "$cache/go/build"
    export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOWORK=off
    export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
}
