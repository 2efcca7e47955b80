#!/usr/bin/env bash
# Build the real control plane used by the cluster tests: kube-apiserver, kubectl,
# kube-controller-manager and kube-scheduler from the Go module k8s.io/kubernetes (see
# go.mod here) and etcd from go.etcd.io/etcd/server/v3 (see etcd/go.mod), through the Go
# module proxy. With --with-kubelet also the upstream kubelet (for benchmarks against it;
# no test needs it, so it is built only on request); with --with-kubeadm kubeadm (the
# kubeadm tier, tests/kubeadm: `make kubeadm-binary`), also on request.
#
# Binaries go to a cache keyed by version, outside the repository:
#   ${KLET_CACHE:-/var/cache/klet}/control-plane/<k8s>-etcd<etcd>/bin/{kube-apiserver,...}
# and the Go module/build caches to ${KLET_CACHE}/go/{mod,build}, so fresh clones on the
# same machine reuse them. Idempotent: each binary that exists and reports the right
# version is kept; only the missing or stale ones are built. The last line printed on
# stdout is the bin directory; all progress goes to stderr.
#
# Timings on 2 cores: a cold build of kube-apiserver, kubectl and etcd (empty module and
# build caches) took 6 min (3.6 GB of caches). Adding kube-controller-manager and
# kube-scheduler to a GOCACHE warm from those took 132 s + 15 s (64 s of CPU, on a busy
# machine: their 381 packages beyond the apiserver's 2150), so they add an estimated
# 1.5-2.5 min to a cold build; kubelet (100 packages more) 26 s here. Relinking one
# binary with a warm GOCACHE takes about 10-15 s; the cached check 0.3 s.
#
# kubeadm (cmd/kubeadm) adds k8s.io/kube-proxy, k8s.io/system-validators and coredns's
# corefile-migration to the module graph (they are in go.mod/go.sum through its `tool`
# line); with a GOCACHE warm from the control plane it links in about a minute.
#
# Usage: build.sh [--check] [--with-kubelet] [--with-kubeadm]
#   --check         only report; exit 1 if a build would be needed
#   --with-kubelet  also build (or check) kubelet
#   --with-kubeadm  also build (or check) kubeadm
set -euo pipefail

only_check=false
with_kubelet=false
with_kubeadm=false
for arg in "$@"; do
    case "$arg" in
        --check) only_check=true ;;
        --with-kubelet) with_kubelet=true ;;
        --with-kubeadm) with_kubeadm=true ;;
        *) echo "usage: $0 [--check] [--with-kubelet] [--with-kubeadm]" >&2; exit 2 ;;
    esac
done

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

# The binaries from k8s.io/kubernetes (cmd/<name>); etcd is built from its own module.
k8s_cmds=(kube-apiserver kubectl kube-controller-manager kube-scheduler)
if $with_kubelet; then k8s_cmds+=(kubelet); fi
if $with_kubeadm; then k8s_cmds+=(kubeadm); fi
wanted=("${k8s_cmds[@]}" etcd)

# Each version is read into a variable first: with pipefail, `cmd | grep -q` fails at
# random when grep exits on its match before cmd has written everything (SIGPIPE).
version_ok() {  # version_ok NAME: the binary exists and reports the wanted version
    local name="$1" out
    [[ -x "$bin/$name" ]] || return 1
    case "$name" in
        kubectl)
            out=$("$bin/kubectl" version --client -o json 2>/dev/null) || return 1
            grep -q "\"gitVersion\": \"${k8s_version}\"" <<<"$out" ;;
        kubeadm)
            out=$("$bin/kubeadm" version -o short 2>/dev/null) || return 1
            grep -qx "${k8s_version}" <<<"$out" ;;
        etcd)
            out=$("$bin/etcd" --version 2>/dev/null) || return 1
            grep -qx "etcd Version: ${etcd_version#v}" <<<"$out" ;;
        *)
            out=$("$bin/$name" --version 2>/dev/null) || return 1
            grep -qx "Kubernetes ${k8s_version}" <<<"$out" ;;
    esac
}

missing=()
find_missing() {  # sets `missing` to the wanted binaries that are absent or stale
    missing=()
    local name
    for name in "${wanted[@]}"; do
        version_ok "$name" || missing+=("$name")
    done
}

find_missing
if ((${#missing[@]} == 0)); then
    log "cached: ${k8s_cmds[*]} ${k8s_version}, etcd ${etcd_version}"
    echo "$bin"
    exit 0
fi
if $only_check; then
    log "not built yet in ${bin}: ${missing[*]}"
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
find_missing
if ((${#missing[@]} == 0)); then
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
for cmd in "${missing[@]}"; do
    t0=$SECONDS
    if [[ "$cmd" == etcd ]]; then
        log "building etcd ${etcd_version} (-p ${jobs})"
        (cd "$here/etcd" && "$go" build -p "$jobs" -trimpath -ldflags "-s -w" \
            -o "$bin/.etcd.tmp" go.etcd.io/etcd/server/v3)
    else
        log "building ${cmd} ${k8s_version} (-p ${jobs})"
        (cd "$here" && "$go" build -p "$jobs" -trimpath -ldflags "$ldflags" \
            -o "$bin/.${cmd}.tmp" "k8s.io/kubernetes/cmd/${cmd}")
    fi
    mv -f "$bin/.${cmd}.tmp" "$bin/${cmd}"
    log "built ${cmd} in $((SECONDS - t0)) s"
done

find_missing
if ((${#missing[@]} > 0)); then
    log "built binaries do not report the expected versions: ${missing[*]}"
    exit 1
fi
log "built in $((SECONDS - start)) s"
echo "$bin"
