"""The pod network of a dev stack: a private bridge CNI configuration.

containerd's CRI plugin reads the conflist written here (bridge + host-local IPAM +
portmap, plugins from Debian's containernetworking-plugins in /usr/lib/cni), so pods
get real IPs. Everything that names host-global state is derived from the stack's
directory: the bridge device, the network name (which the plugins use to tag their
iptables rules) and the /16 subnet, so two stacks on one machine neither collide nor
touch a system CNI setup. The IPAM store lives in the directory too.

``cleanup`` removes what the plugins leave on the host when containers are killed
without a CNI DEL (a crashed run, a forced stop): the bridge and the iptables rules and
chains tagged with this network's name.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import shlex
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

CNI_BIN_DIR = "/usr/lib/cni"
# The plugins shipped with Debian 12 (v1.1.1) speak CNI 0.1.0 through 1.0.0.
CNI_VERSION = "1.0.0"
_SUBNET_SECOND_OCTETS = range(200, 251)


def _used_ipv4_networks() -> set[ipaddress.IPv4Network]:
    """Networks the host routes already (each live stack's bridge holds one)."""
    nets: set[ipaddress.IPv4Network] = set()
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return nets
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        # /proc/net/route prints addresses as little-endian hex.
        dest = ipaddress.IPv4Address(int(fields[1], 16).to_bytes(4, "little"))
        mask = ipaddress.IPv4Address(int(fields[7], 16).to_bytes(4, "little"))
        try:
            nets.add(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
        except ValueError:
            continue
    return nets


def choose_subnet(key: str) -> ipaddress.IPv4Network:
    """A /16 in 10.200.0.0-10.250.0.0 picked by hashing ``key``, skipping routed ones."""
    start = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    used = _used_ipv4_networks()
    n = len(_SUBNET_SECOND_OCTETS)
    for i in range(n):
        octet = _SUBNET_SECOND_OCTETS[(start + i) % n]
        candidate = ipaddress.IPv4Network(f"10.{octet}.0.0/16")
        if not any(candidate.overlaps(u) for u in used if u.prefixlen > 0):
            return candidate
    return ipaddress.IPv4Network(f"10.{_SUBNET_SECOND_OCTETS[start % n]}.0.0/16")


class CniNetwork:
    """The bridge network of the stack rooted at ``dir`` (config in ``dir/net.d``)."""

    def __init__(self, dir: Path, *, subnet: ipaddress.IPv4Network | None = None) -> None:
        self.dir = dir
        key = str(dir.resolve())
        tag = hashlib.sha256(key.encode()).hexdigest()[:8]
        # Linux interface names are at most 15 bytes.
        self.bridge = f"kl{tag}"
        self.network_name = f"klet-{tag}"
        self.subnet = subnet if subnet is not None else choose_subnet(key)
        self.conf_dir = dir / "net.d"
        self.conflist_path = self.conf_dir / "10-klet.conflist"
        self.ipam_dir = dir / "ipam"

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return next(self.subnet.hosts())

    def conflist(self) -> dict[str, object]:
        return {
            "cniVersion": CNI_VERSION,
            "name": self.network_name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(self.subnet), "gateway": str(self.gateway)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.ipam_dir),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def write(self) -> Path:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.ipam_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.conflist_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.conflist(), indent=2) + "\n")
        # A rename, because containerd watches conf_dir and could read a half file.
        tmp.replace(self.conflist_path)
        return self.conflist_path

    def cleanup(self) -> None:
        """Remove this network's iptables rules and chains and its bridge (best effort)."""
        self._cleanup_iptables()
        if Path(f"/sys/class/net/{self.bridge}").exists():
            _run(["ip", "link", "delete", self.bridge])

    def _cleanup_iptables(self) -> None:
        if shutil.which("iptables") is None:
            return
        marker = f'name: "{self.network_name}"'
        for table in ("nat", "filter"):
            listing = _run(["iptables", "-w", "-t", table, "-S"])
            if listing is None:
                continue
            chains: set[str] = set()
            for line in listing.splitlines():
                if not line.startswith("-A ") or self.network_name not in line:
                    continue
                args = shlex.split(line)
                # bridge tags its rules 'name: "<net>" id: ...', portmap 'dnat name: ...'.
                if "--comment" not in args or marker not in args[args.index("--comment") + 1]:
                    continue
                if "-j" in args:
                    target = args[args.index("-j") + 1]
                    if target.startswith("CNI-") and not target.startswith("CNI-HOSTPORT"):
                        chains.add(target)
                _run(["iptables", "-w", "-t", table, "-D", *args[1:]])
            for chain in sorted(chains):
                _run(["iptables", "-w", "-t", table, "-F", chain])
                _run(["iptables", "-w", "-t", table, "-X", chain])


def _run(argv: list[str]) -> str | None:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cni cleanup command failed argv=%s error=%s", argv, exc)
        return None
    if res.returncode != 0:
        log.debug("cni cleanup command failed argv=%s stderr=%s", argv, res.stderr.strip())
        return None
    return res.stdout
