"""The machine facts a Node reports: CPUs, memory, disk, huge pages, identity, OS, addresses.

Upstream gets these from cAdvisor; we read the same kernel files directly, once per
status update (each read is a few small files). The parsers are pure functions so the
formats are tested without a host; `read_machine` is the adapter that touches /proc,
/sys, /etc and statvfs. A file that cannot be read gives an empty value rather than an
error: a container without /sys/class/dmi still reports a Node, only without that field,
as upstream does.

Node address detection when --node-ip is not given follows upstream's intent (the
address other nodes would reach us on): the source address of the default route, else a
non-loopback address the node name resolves to, else 127.0.0.1 (logged once; a node on
loopback is only useful on a single-machine test cluster).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import platform
import socket
from pathlib import Path

from klet.status_reporter.capacity import MachineInfo

log = logging.getLogger(__name__)

__all__ = ["MachineInfo", "detect_node_ips", "read_machine"]

# platform.machine() → GOARCH, the spelling of the kubernetes.io/arch label.
_GO_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "armv6l": "arm",
    "i386": "386",
    "i686": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}


def go_arch(machine: str) -> str:
    """The GOARCH name of a `uname -m` machine ("x86_64" → "amd64"); unknown ones as-is."""
    return _GO_ARCH.get(machine.lower(), machine.lower())


def parse_meminfo(text: str) -> int:
    """MemTotal of /proc/meminfo in bytes (the kernel's "kB" are KiB); 0 when absent."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemTotal":
            parts = rest.split()
            if parts and parts[0].isdigit():
                unit = parts[1].lower() if len(parts) > 1 else ""
                return int(parts[0]) * (1024 if unit == "kb" else 1)
    return 0


def parse_os_release(text: str) -> str:
    """PRETTY_NAME of an os-release file, unquoted; "Linux" when absent (as upstream)."""
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == "PRETTY_NAME":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            return value or "Linux"
    return "Linux"


def parse_hugepage_dir(name: str) -> int | None:
    """Page size in bytes of a /sys/kernel/mm/hugepages entry ("hugepages-2048kB")."""
    prefix, _, size = name.partition("-")
    if prefix != "hugepages" or not size.endswith("kB") or not size[:-2].isdigit():
        return None
    return int(size[:-2]) * 1024


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _hugepages(root: Path) -> dict[int, int]:
    out: dict[int, int] = {}
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return out
    for entry in entries:
        size = parse_hugepage_dir(entry.name)
        count = _read(entry / "nr_hugepages")
        if size is not None and count.isdigit():
            out[size] = size * int(count)
    return out


def _disk_bytes(path: Path) -> int:
    """Capacity of the filesystem holding `path` (its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return 0
    return st.f_blocks * st.f_frsize


def read_machine(root_dir: Path, *, fs_root: Path = Path("/")) -> MachineInfo:
    """Read the machine's facts; `root_dir` is the kubelet root (ephemeral storage).

    `fs_root` prefixes every host path (tests point it at a fake tree).
    """
    uname = os.uname()
    return MachineInfo(
        cpus=os.cpu_count() or 1,
        memory_bytes=parse_meminfo(_read(fs_root / "proc/meminfo")),
        ephemeral_storage_bytes=_disk_bytes(root_dir),
        hugepages=_hugepages(fs_root / "sys/kernel/mm/hugepages"),
        machine_id=_read(fs_root / "etc/machine-id"),
        system_uuid=_read(fs_root / "sys/class/dmi/id/product_uuid"),
        boot_id=_read(fs_root / "proc/sys/kernel/random/boot_id"),
        kernel_version=uname.release,
        os_image=parse_os_release(
            _read(fs_root / "etc/os-release") or _read(fs_root / "usr/lib/os-release")
        ),
        architecture=go_arch(platform.machine()),
    )


def _usable(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return not (addr.is_loopback or addr.is_link_local or addr.is_unspecified)


def _default_route_ip() -> str | None:
    # A UDP "connect" sends nothing; it only asks the kernel which source address the
    # default route would use.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            ip = str(sock.getsockname()[0])
        except OSError:
            return None
    return ip if _usable(ip) else None


def _resolved_ip(name: str) -> str | None:
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for info in infos:
        ip = str(info[4][0])
        if _usable(ip):
            return ip
    return None


def detect_node_ips(node_ips: tuple[str, ...], node_name: str) -> tuple[str, ...]:
    """The node's InternalIPs: --node-ip when given, else detected (see module docstring)."""
    if node_ips:
        return node_ips
    ip = _default_route_ip() or _resolved_ip(node_name) or _resolved_ip(socket.gethostname())
    if ip is None:
        log.warning("no routable node address found; reporting 127.0.0.1 (set --node-ip)")
        return ("127.0.0.1",)
    return (ip,)
