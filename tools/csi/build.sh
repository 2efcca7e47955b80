#!/usr/bin/env bash
# Build the CSI components that Kubernetes' storage e2e suite deploys (v1.34.4's
# test/e2e/testing-manifests/storage-csi/: the hostpath driver's StatefulSet and the mock
# driver's), at the versions those manifests name, from their Go modules, plus two tools
# to test a node against them:
#
#   name                       from                                                dir
#   csi-provisioner            kubernetes-csi/external-provisioner/v5@v5.1.0        provisioner
#   csi-resizer                kubernetes-csi/external-resizer@v1.13.1              resizer
#   csi-snapshotter            kubernetes-csi/external-snapshotter/v8@v8.3.0        snapshotter
#   snapshot-controller        (same module; the cluster's, not deployed by e2e)    snapshotter
#   csi-sanity                 kubernetes-csi/csi-test/v5@v5.3.1 (test tool)        sanity
#   csi-mock                   k8s.io/kubernetes@v1.34.4's e2e mock CSI driver      mock
#   hostpathplugin             kubernetes-csi/csi-driver-host-path v1.16.1          @ source
#   csi-node-driver-registrar  kubernetes-csi/node-driver-registrar v2.13.0         @ source
#   csi-attacher               kubernetes-csi/external-attacher v4.8.0              @ source
#   csi-external-health-monitor-controller
#                              kubernetes-csi/external-health-monitor v0.12.1       @ source
#   livenessprobe              kubernetes-csi/livenessprobe v2.15.0                 @ source
#
# The rows with a dir are built from a module of the project's own in tools/csi/<dir>/ (go.mod + go.sum:
# the one source of the version, and the pin of every module's hash) that requires the
# upstream module and repeats the replace directives of upstream's go.mod, so the
# dependency set is upstream's; the binary is a `tool` of that module. Why not inside the
# downloaded module with upstream's vendor/: a module download carries vendor/modules.txt
# and nothing else of vendor/. Why one module per component: their k8s.io pins differ
# (v0.31 for the provisioner, v0.32 for the resizer, v0.33 for the snapshotter). The
# checksum database does not list external-resizer v1.13.1: its go.sum line pins it.
# External-snapshotter's own go.mod replaces its client module with ./client, which its
# download does not carry: the published client/v8 v8.2.0 (what it requires) stands in;
# client/v8 v8.3.0 is not served.
#
# The Go module proxy these machines reach refuses (403) every version of
# csi-driver-host-path, node-driver-registrar, external-attacher, external-health-monitor
# and livenessprobe. Their rows (`@<archive>`) are built from their release sources
# instead: `<archive>-<tag>.tar.gz`, the upstream tree at the tag with its committed
# vendor/, in ../shared/third_party/kubernetes-csi beside the repository (or the directory
# $KLET_CSI_SRC names), pinned by the SHA256SUMS there. Each archive is checked against
# that file, unpacked once into ${KLET_CACHE}/csi/src/<archive>-<tag> (a stable path, so
# the build cache serves a rebuild) and built there with -mod=vendor and GOPROXY=off.
# Sources absent, or an archive that does not match its pin: the error names the file and
# says how to supply it; the other components are still built. livenessprobe has no
# --version flag (upstream's -X main.version sets nothing in it): its build writes the
# version to `<binary>.version`, which stands in for the check.
#
# Binaries are static (CGO off, -trimpath, -s -w, `main.version` stamped as upstream's
# release-tools do) and cached by version outside the repository:
#   ${KLET_CACHE:-/var/cache/klet}/csi/<name>/<version>/<name>
# with the Go module/build caches shared with tools/cluster and tools/e2e
# (${KLET_CACHE}/go/{mod,build}). Idempotent: a binary that exists and reports its version
# is not rebuilt, and a run that builds nothing prints nothing on stderr. stdout gets one
# line per wanted component that is there, `<name> <path>`; progress and errors go to
# stderr. Exits 1 when any wanted component could not be built (the others are built).
#
# Cost (2 cores, shared): about 6.5 min cold for the module-built set plus minutes for the
# five from source, 1 min for csi-mock and csi-sanity alone, well under a second cached;
# the details are in tools/csi/README.md.
#
# Usage: build.sh [--check] [--skip-absent-sources] [--all | NAME...]
#   --check  only report; exit 1 if a build would be needed
#   --all    every row (the default)
#   NAME     build (or check) only these
#   --skip-absent-sources
#            when the release sources' directory does not exist, leave out the
#            components built from it, saying so, instead of failing (`make test`'s
#            background build: the test that needs them then skips with the reason)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KLET_CACHE:-/var/cache/klet}"
jobs="${KLET_BUILD_JOBS:-2}"

# name | dir under tools/csi, or @<archive> of the release sources | upstream module |
# package | version when dir is @
table="\
csi-provisioner|provisioner|github.com/kubernetes-csi/external-provisioner/v5|github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner|
csi-resizer|resizer|github.com/kubernetes-csi/external-resizer|github.com/kubernetes-csi/external-resizer/cmd/csi-resizer|
csi-snapshotter|snapshotter|github.com/kubernetes-csi/external-snapshotter/v8|github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter|
snapshot-controller|snapshotter|github.com/kubernetes-csi/external-snapshotter/v8|github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller|
csi-sanity|sanity|github.com/kubernetes-csi/csi-test/v5|github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity|
csi-mock|mock|k8s.io/kubernetes|klet.dev/tools/csi/mock|
hostpathplugin|@csi-driver-host-path|github.com/kubernetes-csi/csi-driver-host-path|./cmd/hostpathplugin|v1.16.1
csi-node-driver-registrar|@node-driver-registrar|github.com/kubernetes-csi/node-driver-registrar|./cmd/csi-node-driver-registrar|v2.13.0
csi-attacher|@external-attacher|github.com/kubernetes-csi/external-attacher|./cmd/csi-attacher|v4.8.0
csi-external-health-monitor-controller|@external-health-monitor|github.com/kubernetes-csi/external-health-monitor|./cmd/csi-external-health-monitor-controller|v0.12.1
livenessprobe|@livenessprobe|github.com/kubernetes-csi/livenessprobe|./cmd/livenessprobe|v2.15.0"

log() { printf 'csi/build.sh: %s\n' "$*" >&2; }

only_check=false
all=false
skip_absent=false
wanted=()
for arg in "$@"; do
    case "$arg" in
        --check) only_check=true ;;
        --all) all=true ;;
        --skip-absent-sources) skip_absent=true ;;
        -*) log "usage: $0 [--check] [--skip-absent-sources] [--all | NAME...]"; exit 2 ;;
        *)
            grep -q "^${arg}|" <<<"$table" || { log "unknown component ${arg}"; exit 2; }
            wanted+=("$arg") ;;
    esac
done
if $all || [[ ${#wanted[@]} -eq 0 ]]; then
    mapfile -t wanted < <(cut -d'|' -f1 <<<"$table")
fi

# The release sources of the components the proxy refuses: ../shared/third_party/
# kubernetes-csi beside the repository (a clone's ../shared), or $KLET_CSI_SRC.
src="${KLET_CSI_SRC:-$(cd "$here/../.." && pwd)/../shared/third_party/kubernetes-csi}"
supply="put the release archive there with its SHA256SUMS line (see ../shared/third_party/README.md: the upstream tree at the tag with its committed vendor/), or point KLET_CSI_SRC at a directory that holds them"
if $skip_absent && [[ ! -d "$src" ]]; then
    kept=()
    for name in "${wanted[@]}"; do
        if grep -q "^${name}|@" <<<"$table"; then
            log "${name}: left out: no release sources: ${src} does not exist; ${supply}"
        else
            kept+=("$name")
        fi
    done
    wanted=("${kept[@]}")
    [[ ${#wanted[@]} -gt 0 ]] || exit 0
fi

modver() {  # modver MODULE GO.MOD -> the required version (inside or outside a require block)
    awk -v m="$1" '!/=>/ { if ($1 == "require") { $1 = "" ; $0 = $0 } } !/=>/ && $1 == m { print $2; exit }' "$2"
}
row() {  # row NAME -> sets dir module package version
    local fixed
    IFS='|' read -r _ dir module package fixed < <(grep "^$1|" <<<"$table")
    if [[ "$dir" == @* ]]; then version="$fixed"; else version="$(modver "$module" "$here/$dir/go.mod")"; fi
    # A component with code of ours (csi-mock's main.go): its version carries the code's
    # digest, so a changed main.go is a new version, built again, not a stale cache hit.
    if [[ "$dir" != @* && -f "$here/$dir/main.go" ]]; then
        version="${version}-klet.$(cat "$here/$dir/main.go" "$here/$dir/go.sum" | sha256sum | cut -c1-12)"
    fi
}
binary() { printf '%s/csi/%s/%s/%s' "$cache" "$1" "$2" "$1"; }

# The version is read into a variable first: with pipefail, `cmd | grep -q` fails at
# random when grep exits on its match before cmd has written everything (SIGPIPE).
check_one() {  # check_one NAME: the binary is there and reports its version
    local out bin
    row "$1"
    [[ -n "$version" ]] || return 1
    bin="$(binary "$1" "$version")"
    [[ -x "$bin" ]] || return 1
    # livenessprobe has no --version flag (nor a main.version: upstream's -X sets nothing
    # there), so its build leaves the version beside the binary instead.
    if [[ "$1" == livenessprobe ]]; then [[ "$(cat "$bin.version" 2>/dev/null)" == "$version" ]]; return; fi
    out=$("$bin" --version 2>/dev/null) || return 1
    [[ " ${out//$'\n'/ } " == *" ${version} "* ]]
}

report() {  # the stdout lines for the wanted components that are built
    local name
    for name in "${wanted[@]}"; do
        if check_one "$name"; then echo "$name $(binary "$name" "$version")"; fi
    done
}

missing=()
for name in "${wanted[@]}"; do check_one "$name" || missing+=("$name"); done
if [[ ${#missing[@]} -eq 0 ]]; then
    report
    exit 0
fi
if $only_check; then
    log "not built yet: ${missing[*]}"
    report
    exit 1
fi

go="$(command -v go || true)"
[[ -n "$go" ]] || go=/usr/local/go/bin/go
[[ -x "$go" ]] || { log "no Go toolchain (looked on PATH and at /usr/local/go/bin/go)"; exit 1; }

mkdir -p "$cache/csi" "$cache/go/mod" "$cache/go/build"
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOWORK=off
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

# One build at a time per cache (parallel test sessions may all call this script).
exec 9>"$cache/csi/.build.lock"
flock 9


# unpack_src NAME: verify <archive>-<version>.tar.gz against $src/SHA256SUMS and unpack it
# once into $cache/csi/src/<archive>-<version> (a stable path, so Go's build cache hits
# on a rebuild); sets srcdir.
unpack_src() {
    local archive="${dir#@}-${version}" want got
    srcdir="$cache/csi/src/$archive"
    if [[ ! -d "$src" ]]; then
        log "${1}: no release sources: ${src} does not exist; ${supply}"
        return 1
    fi
    if [[ ! -f "$src/$archive.tar.gz" ]]; then
        log "${1}: missing ${src}/${archive}.tar.gz (${module} at tag ${version}); ${supply}"
        return 1
    fi
    want=$(awk -v f="$archive.tar.gz" '$2 == f || $2 == "*" f { print $1 }' "$src/SHA256SUMS" 2>/dev/null)
    if [[ -z "$want" ]]; then
        log "${1}: ${src}/SHA256SUMS has no line for ${archive}.tar.gz; ${supply}"
        return 1
    fi
    if [[ -f "$srcdir/.sha256" && "$(cat "$srcdir/.sha256")" == "$want" ]]; then return 0; fi
    got=$(sha256sum "$src/$archive.tar.gz" | cut -d' ' -f1)
    if [[ "$got" != "$want" ]]; then
        log "${1}: ${src}/${archive}.tar.gz has SHA-256 ${got}, SHA256SUMS pins ${want}: refusing to build it"
        return 1
    fi
    rm -rf "$srcdir" "$srcdir.tmp"
    mkdir -p "$srcdir.tmp"
    tar -xzf "$src/$archive.tar.gz" -C "$srcdir.tmp" --strip-components=1 --no-same-owner
    [[ -f "$srcdir.tmp/vendor/modules.txt" ]] || {
        log "${1}: ${archive}.tar.gz carries no vendor/ directory; ${supply}"
        rm -rf "$srcdir.tmp"; return 1
    }
    echo "$want" >"$srcdir.tmp/.sha256"
    mv "$srcdir.tmp" "$srcdir"
}

build_one() {  # build_one NAME
    local name="$1" dest tmp began=$SECONDS errfile err
    row "$name"
    if [[ -z "$version" ]]; then
        log "${name}: tools/csi/${dir}/go.mod does not require ${module}"
        return 1
    fi
    dest="$(binary "$name" "$version")"
    tmp="$(dirname "$dest")/.${name}.tmp"
    mkdir -p "$(dirname "$dest")"
    # csi-sanity names its variable VERSION; the others (and upstream's Makefiles) main.version.
    local var=main.version
    if [[ "$name" == csi-sanity ]]; then var=main.VERSION; fi
    local workdir="$here/$dir" flags="$GOFLAGS"
    if [[ "$dir" == @* ]]; then
        unpack_src "$name" || return 1
        # Upstream's own tree and its committed vendor/: nothing from the module proxy.
        workdir="$srcdir" flags="-mod=vendor -buildvcs=false"
    fi
    local proxy="${GOPROXY:-}"
    [[ "$dir" == @* ]] && proxy=off
    log "building ${name} ${version} (${module}, -p ${jobs})"
    errfile="$(mktemp)"
    if ! (cd "$workdir" && GOFLAGS="$flags" GOPROXY="$proxy" "$go" build -p "$jobs" -trimpath \
            -ldflags "-s -w -X ${var}=${version}" -o "$tmp" "$package") 2>"$errfile"; then
        log "building ${name} failed:"
        if grep -qE '403 Forbidden|404 Not Found|410 Gone|not available' "$errfile"; then
            log "the Go module proxy refused a module that tools/csi/${dir}/go.sum names:"
        fi
        tail -n 20 "$errfile" >&2
        rm -f "$errfile" "$tmp"
        return 1
    fi
    rm -f "$errfile"
    mv -f "$tmp" "$dest"
    if [[ "$name" == livenessprobe ]]; then echo "$version" >"$dest.version"; fi
    check_one "$name" || { log "${dest} does not report version ${version}"; return 1; }
    log "built ${name} in $((SECONDS - began)) s"
}

start=$SECONDS
failed=()
for name in "${missing[@]}"; do
    if check_one "$name"; then continue; fi  # built by a concurrent run meanwhile
    build_one "$name" || failed+=("$name")
done
log "done in $((SECONDS - start)) s"
report
if [[ ${#failed[@]} -gt 0 ]]; then
    log "not built: ${failed[*]}"
    exit 1
fi
