"""kubeadm's addons, kube-proxy and CoreDNS: their binaries built from source offline and
what their images hold beside the binary.

kubeadm v1.34.4's addon phase deploys a kube-proxy DaemonSet (image
`<imageRepository>/kube-proxy:<kubernetes version>`, command `/usr/local/bin/kube-proxy`)
and a CoreDNS Deployment (`<imageRepository>/coredns:v1.12.1`, the `CoreDNSVersion` its
constants pin, run with its args only: the image's entrypoint is `/coredns`). Both are
built here from Go modules of their own, kube-proxy/ (cmd/kube-proxy of k8s.io/kubernetes,
staging modules replaced as tools/cluster does) and coredns/ (github.com/coredns/coredns),
into `$KLET_CACHE/kubeadm-addons/<k8s>-coredns<version>/bin`; a binary that is there and
reports its version is kept. The versions are those the go.mod files require, one source
of truth, and images.py checks them against `kubeadm config images list`.

kube-proxy's iptables mode runs `iptables`, `iptables-save` and `iptables-restore` (and the
ip6tables ones). Upstream's image carries Debian's iptables; so does this one, copied
from the build machine: `xtables-nft-multi` (the nf_tables backend, Debian 12's default)
under the names kube-proxy runs, the shared libraries it and its extension modules load,
and the extensions' directory. kube-proxy v1.34 clears conntrack entries through netlink
itself, so no `conntrack` binary is needed.

    python -m tools.kubeadm.addons   (`make kubeadm-addons`; prints the bin directory)
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

from tools.e2e.layers import Entry

HERE = Path(__file__).resolve().parent
KUBE_PROXY_MODULE = HERE / "kube-proxy"
COREDNS_MODULE = HERE / "coredns"
ADDON_IMAGES = ("kube-proxy", "coredns")

XTABLES = Path("/usr/sbin/xtables-nft-multi")
XTABLES_EXTENSIONS = Path("/usr/lib/x86_64-linux-gnu/xtables")
# the names kube-proxy's iptables mode (and its --cleanup) run, each the multi-call binary
IPTABLES_NAMES = tuple(
    f"{family}{suffix}"
    for family in ("iptables", "ip6tables")
    for suffix in ("", "-save", "-restore", "-nft", "-nft-save", "-nft-restore")
)


class AddonBuildError(RuntimeError):
    """An addon binary could not be built, or does not report the expected version."""


def required_version(gomod: str, module: str) -> str:
    """The version `gomod` (a go.mod's text) requires of `module` (not a replace line)."""
    for line in gomod.splitlines():
        if "=>" in line:
            continue
        words = line.split()
        if words[:1] == ["require"]:
            words = words[1:]
        if len(words) >= 2 and words[0] == module:
            return words[1]
    raise AddonBuildError(f"go.mod does not require {module}")


def coredns_tag(version_output: str) -> str:
    """`coredns -version` output (`CoreDNS-1.12.1` first) -> kubeadm's tag `v1.12.1`."""
    m = re.search(r"^CoreDNS-(\d+\.\d+\.\d+)$", version_output, re.M)
    if m is None:
        raise AddonBuildError(f"cannot read CoreDNS's version from {version_output!r}")
    return f"v{m.group(1)}"


def kube_proxy_tag(version_output: str) -> str:
    """`kube-proxy --version` output (`Kubernetes v1.34.4`) -> the tag `v1.34.4`."""
    m = re.search(r"^Kubernetes (v\d+\.\d+\.\d+)$", version_output, re.M)
    if m is None:
        raise AddonBuildError(f"cannot read kube-proxy's version from {version_output!r}")
    return m.group(1)


def kube_proxy_ldflags(k8s_version: str) -> str:
    """Link flags stamping `k8s_version` where `kube-proxy --version` reads it."""
    m = re.fullmatch(r"v1\.(\d+)\.\d+", k8s_version)
    if m is None:
        raise AddonBuildError(f"not a v1 Kubernetes version: {k8s_version!r}")
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={k8s_version}",
            f"-X {pkg}.gitMajor=1",
            f"-X {pkg}.gitMinor={m.group(1)}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _versions() -> tuple[str, str]:
    k8s = required_version((KUBE_PROXY_MODULE / "go.mod").read_text(), "k8s.io/kubernetes")
    coredns = required_version(
        (COREDNS_MODULE / "go.mod").read_text(), "github.com/coredns/coredns"
    )
    return k8s, coredns


def _reported(binary: Path, name: str) -> str | None:
    """The tag `binary` reports, or None when it is absent or does not run."""
    if not binary.exists():
        return None
    flag = "-version" if name == "coredns" else "--version"
    res = subprocess.run([str(binary), flag], capture_output=True, text=True, check=False)
    try:
        if name == "coredns":
            return coredns_tag(res.stdout)
        return kube_proxy_tag(res.stdout)
    except AddonBuildError:
        return None


def build_addon_binaries(*, cache: Path) -> dict[str, tuple[Path, str]]:
    """kube-proxy and coredns built (or found built) in the cache: name -> (binary, tag).
    Cold on 2 cores with the control plane's build cache warm: kube-proxy ~80 s, CoreDNS
    (its ~60 plugins, a cold module cache) several minutes."""
    k8s, coredns = _versions()
    bin_dir = cache / "kubeadm-addons" / f"{k8s}-coredns{coredns.removeprefix('v')}" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    wanted = {"kube-proxy": k8s, "coredns": coredns}
    jobs = os.environ.get("KLET_BUILD_JOBS", "2")
    env = {
        **os.environ,
        "GOMODCACHE": str(cache / "go" / "mod"),
        "GOCACHE": str(cache / "go" / "build"),
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=readonly -buildvcs=false",
        "CGO_ENABLED": "0",
    }
    builds = {
        "kube-proxy": (
            KUBE_PROXY_MODULE,
            "k8s.io/kubernetes/cmd/kube-proxy",
            kube_proxy_ldflags(k8s),
        ),
        "coredns": (COREDNS_MODULE, "github.com/coredns/coredns", "-s -w"),
    }
    go = shutil.which("go") or "/usr/local/go/bin/go"
    with (bin_dir.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per cache at a time
        for name, (module, package, ldflags) in builds.items():
            binary = bin_dir / name
            if _reported(binary, name) == wanted[name]:
                continue
            tmp = bin_dir / f".{name}.tmp"
            argv = [
                go,
                "build",
                "-p",
                jobs,
                "-trimpath",
                "-ldflags",
                ldflags,
                "-o",
                str(tmp),
                package,
            ]
            res = subprocess.run(
                argv, cwd=module, env=env, capture_output=True, text=True, check=False
            )
            if res.returncode != 0:
                raise AddonBuildError(f"building {name} in {module}:\n{res.stderr[-3000:]}")
            tmp.replace(binary)
            got = _reported(binary, name)
            if got != wanted[name]:
                raise AddonBuildError(f"{binary} reports {got!r}, go.mod requires {wanted[name]}")
    return {name: (bin_dir / name, tag) for name, tag in wanted.items()}


def shared_libraries(ldd_output: str) -> set[str]:
    """The absolute paths `ldd` output names (`libc.so.6 => /lib/.../libc.so.6 (0x..)` and
    the loader's `/lib64/ld-linux-x86-64.so.2 (0x..)`); vdso lines and the `file:`
    headers of several files name none. A library not found is an error naming it."""
    found: set[str] = set()
    for line in ldd_output.splitlines():
        words = line.split()
        if "=>" in words:
            target = " ".join(words[words.index("=>") + 1 :])
            if target == "not found":
                raise AddonBuildError(f"iptables needs {words[0]}, not found on this machine")
            if target.startswith("/"):
                found.add(target.split()[0])
        elif words and words[0].startswith("/") and not line.endswith(":"):
            found.add(words[0])
    return found


def iptables_entries(xtables: Path = XTABLES, extensions: Path = XTABLES_EXTENSIONS) -> list[Entry]:
    """The build machine's iptables (nf_tables backend) as layer entries: the multi-call
    binary in usr/sbin under IPTABLES_NAMES, its extension modules, and every shared
    library they load at the path the loader looks for it (the file the link resolves to,
    copied under the link's name)."""
    modules = sorted(extensions.glob("*.so"))
    if not xtables.exists() or not modules:
        raise AddonBuildError(
            f"kube-proxy's image needs Debian's iptables: {xtables} or {extensions}/*.so missing"
        )
    res = subprocess.run(
        ["ldd", str(xtables), *map(str, modules)], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise AddonBuildError(f"ldd {xtables}: {res.stderr.strip()}")
    entries = [Entry("usr/sbin/xtables-nft-multi", mode=0o755, source=xtables)]
    entries += [
        Entry(f"usr/sbin/{n}", tarfile.SYMTYPE, 0o777, linkname="xtables-nft-multi")
        for n in IPTABLES_NAMES
    ]
    entries += [Entry(str(m).lstrip("/"), mode=0o644, source=m) for m in modules]
    entries += _library_entries(shared_libraries(res.stdout))
    protocols = Path("/etc/protocols")
    if protocols.exists():
        entries.append(Entry("etc/protocols", source=protocols))
    return entries


def _library_entries(paths: Iterable[str]) -> list[Entry]:
    return [
        Entry(p.lstrip("/"), mode=0o755, source=Path(os.path.realpath(p))) for p in sorted(paths)
    ]


def main() -> int:
    """`make kubeadm-addons`: build (or find built) both binaries; print where they are."""
    cache = Path(os.environ.get("KLET_CACHE", "/var/cache/klet"))
    try:
        built = build_addon_binaries(cache=cache)
    except (AddonBuildError, OSError) as err:
        print(f"kubeadm addons: {err}", file=sys.stderr)
        return 1
    for name, (_, tag) in built.items():
        print(f"kubeadm addons: {name} {tag}", file=sys.stderr)
    print(built["coredns"][0].parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
