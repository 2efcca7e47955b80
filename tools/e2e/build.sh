#!/usr/bin/env bash
# Build Kubernetes' end-to-end suite and what runs beside it, from the Go module
# k8s.io/kubernetes at the version go.mod requires (the same as tools/cluster):
#
#   e2e.test   `go test -c k8s.io/kubernetes/test/e2e`: the suite, run against a cluster
#   ginkgo     the ginkgo CLI at the version the suite links (parallel runs, reports)
#   agnhost    test/images/agnhost, the binary of registry.k8s.io/e2e-test-images/agnhost
#   nnp        test/images/nonewprivs, the binary of .../e2e-test-images/nonewprivs
#
# agnhost and nnp are packed into test images by `python -m tools.e2e.images`. All four
# are static (CGO off) and go to a cache keyed by version, outside the repository:
#   ${KLET_CACHE:-/var/cache/klet}/e2e/<k8s version>/bin/{e2e.test,ginkgo,agnhost,nnp}
# with the Go module/build caches shared with tools/cluster in ${KLET_CACHE}/go/{mod,build}.
# Idempotent: when the binaries exist and report the right versions it does nothing. The
# last line printed on stdout is the bin directory; all progress goes to stderr.
#
# Cost, measured on 2 cores shared with other builds (load average ~10), with the module
# cache and tools/cluster's kube-apiserver packages already in GOCACHE: the first build
# took 398 s (e2e.test 386 s: ~520 packages compiled for the first time, agnhost 7 s,
# ginkgo 4 s, nnp <1 s; `go mod tidy` for this module 2 s once the modules were
# downloaded); a rebuild of e2e.test from a warm GOCACHE 8 s; the cached check 0.1 s.
# e2e.test is 99 MB, agnhost 54 MB, ginkgo 11 MB, nnp 1.6 MB (stripped).
#
# Usage: build.sh [--check] [NAME...]
#   --check  only report; exit 1 if a build would be needed
#   NAME     build (or check) only these of e2e.test ginkgo agnhost nnp (default: all);
#            `python -m tools.e2e.images` asks for agnhost and nnp alone
set -euo pipefail

all=(e2e.test ginkgo agnhost nnp)
only_check=false
wanted=()
for arg in "$@"; do
    case "$arg" in
        --check) only_check=true ;;
        e2e.test|ginkgo|agnhost|nnp) wanted+=("$arg") ;;
        *) echo "usage: $0 [--check] [${all[*]}]" >&2; exit 2 ;;
    esac
done
[[ ${#wanted[@]} -gt 0 ]] || wanted=("${all[@]}")
want() { [[ " ${wanted[*]} " == *" $1 "* ]]; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KLET_CACHE:-/var/cache/klet}"
jobs="${KLET_BUILD_JOBS:-2}"

log() { printf 'build.sh: %s\n' "$*" >&2; }

modver() {  # modver MODULE GO.MOD -> the required version (inside or outside a require block)
    awk -v m="$1" '!/=>/ { if ($1 == "require") { $1 = "" ; $0 = $0 } } !/=>/ && $1 == m { print $2; exit }' "$2"
}
k8s_version="$(modver k8s.io/kubernetes "$here/go.mod")"
ginkgo_version="$(modver github.com/onsi/ginkgo/v2 "$here/go.mod")"
[[ "$k8s_version" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || { log "cannot read k8s.io/kubernetes version from go.mod"; exit 1; }
k8s_minor="${BASH_REMATCH[1]}"
[[ "$ginkgo_version" =~ ^v2\.[0-9]+\.[0-9]+$ ]] || { log "cannot read the ginkgo version from go.mod"; exit 1; }

go="$(command -v go || true)"
[[ -n "$go" ]] || go=/usr/local/go/bin/go

bin="$cache/e2e/${k8s_version}/bin"
mod="$cache/go/mod/k8s.io/kubernetes@${k8s_version}"

# The images' versions are upstream's own VERSION files, read from the module source.
image_version() {  # image_version DIR -> test/images/DIR/VERSION, or nothing
    cat "$mod/test/images/$1/VERSION" 2>/dev/null || true
}

# Each output is read into a variable first: with pipefail, `cmd | grep -q` fails at
# random when grep exits on its match before cmd has written everything (SIGPIPE).
check_one() {  # check_one NAME: the binary is there and reports the expected version
    local out
    [[ -x "$bin/$1" ]] || return 1
    case "$1" in
        e2e.test)
            out=$("$bin/e2e.test" --version 2>/dev/null) || return 1
            grep -qx "${k8s_version}" <<<"$out" ;;
        ginkgo)
            out=$("$bin/ginkgo" version 2>/dev/null) || return 1
            grep -qx "Ginkgo Version ${ginkgo_version#v}" <<<"$out" ;;
        agnhost)
            out=$("$bin/agnhost" --version 2>/dev/null) || return 1
            grep -qx "app version $(image_version agnhost)" <<<"$out" ;;
        nnp)
            out=$("$bin/nnp" 2>/dev/null) || return 1
            grep -q "^Effective uid: " <<<"$out" ;;
    esac
}
check() {
    local b
    for b in "${wanted[@]}"; do check_one "$b" || return 1; done
}

if check; then
    log "cached: ${wanted[*]} (${k8s_version}, ginkgo ${ginkgo_version})"
    echo "$bin"
    exit 0
fi
if $only_check; then
    log "not built yet: ${bin}"
    exit 1
fi

[[ -x "$go" ]] || { log "no Go toolchain (looked on PATH and at /usr/local/go/bin/go)"; exit 1; }

mkdir -p "$bin" "$cache/go/mod" "$cache/go/build"
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build"
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

# One build at a time per cache (parallel test sessions may all call this script).
exec 9>"$cache/e2e/.build.lock"
flock 9
if check; then
    log "built by a concurrent run"
    echo "$bin"
    exit 0
fi

# Commit and date of the release for `version` output, from the proxy's .info file.
info_file="$(cd "$here" && "$go" mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p')"
info="$(cat "$info_file" 2>/dev/null || true)"
git_commit="$(printf '%s' "$info" | sed -n 's/.*"Hash":"\([0-9a-f]\{40\}\)".*/\1/p')"
build_date="$(printf '%s' "$info" | sed -n 's/.*"Time":"\([0-9T:-]*\)[^"]*".*/\1Z/p')"

# The suite compares its own version with the server's and picks version-dependent
# behaviour from it: stamp it as tools/cluster stamps kube-apiserver.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X ${pkg}.gitVersion=${k8s_version}"
    ldflags+=" -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${k8s_minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean"
    ldflags+=" -X ${pkg}.gitCommit=${git_commit}"
    if [[ -n "$build_date" ]]; then ldflags+=" -X ${pkg}.buildDate=${build_date}"; fi
done

build() {  # build NAME PACKAGE GO-ARGS... : `go GO-ARGS -o ... PACKAGE` into $bin/NAME
    local name="$1" package="$2"; shift 2
    if ! want "$name" || check_one "$name"; then return 0; fi
    local began=$SECONDS
    log "building ${name} (-p ${jobs})"
    (cd "$here" && "$go" "$@" -o "$bin/.${name}.tmp" "$package")
    mv -f "$bin/.${name}.tmp" "$bin/${name}"
    log "built ${name} in $((SECONDS - began)) s"
}

start=$SECONDS
# -trimpath keeps module-cache paths out of the binaries (reproducible, no host paths).
build agnhost k8s.io/kubernetes/test/images/agnhost \
    build -p "$jobs" -trimpath -ldflags "-s -w -X main.Version=$(image_version agnhost)"
build nnp k8s.io/kubernetes/test/images/nonewprivs build -p "$jobs" -trimpath -ldflags "-s -w"
build ginkgo github.com/onsi/ginkgo/v2/ginkgo build -p "$jobs" -trimpath -ldflags "-s -w"
build e2e.test k8s.io/kubernetes/test/e2e test -c -p "$jobs" -trimpath -ldflags "$ldflags"

check || { log "built binaries do not report the expected versions"; exit 1; }
log "built in $((SECONDS - start)) s"
echo "$bin"
