"""The machine facts a node reports and admits pods against: CPUs, memory, disk, huge
pages, identity, OS.

Upstream gets these from cAdvisor; we read the same kernel files directly (each read is
a few small files). status-reporter reads them for every Node status update, syncloop
once at start for pod admission; both through this one reader, so the allocatable a pod
is admitted against is the one the Node reports. The parsers are pure functions so the
formats are tested without a host; `read_machine` touches /proc, /sys, /etc and statvfs,
`mem_total_bytes` only /proc/meminfo (for syncloop, which needs no more).
A file that cannot be read gives an empty value rather than an error: a container
without /sys/class/dmi still reports a Node, only without that field, as upstream does.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from klet.model.node import MachineInfo

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


def mem_total_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The machine's MemTotal in bytes; 0 when it cannot be read."""
    return parse_meminfo(_read(meminfo))


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
        memory_bytes=mem_total_bytes(fs_root / "proc/meminfo"),
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
