"""The Node's addresses, and the machine facts it reports (read by `klet.cgroups.machine`,
which syncloop's pod admission shares, re-exported here for this service).

Node address detection when --node-ip is not given follows upstream's intent (the
address other nodes would reach us on): the source address of the default route, else a
non-loopback address the node name resolves to, else 127.0.0.1 (logged once; a node on
loopback is only useful on a single-machine test cluster).
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from klet.cgroups.machine import (
    go_arch,
    parse_hugepage_dir,
    parse_meminfo,
    parse_os_release,
    read_machine,
)
from klet.model.node import MachineInfo

log = logging.getLogger(__name__)

__all__ = [
    "MachineInfo",
    "detect_node_ips",
    "go_arch",
    "parse_hugepage_dir",
    "parse_meminfo",
    "parse_os_release",
    "read_machine",
]


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
