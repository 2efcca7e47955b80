"""The pod network of a dev stack: a private bridge CNI configuration.

containerd's CRI plugin reads the conflist written here (bridge + host-local IPAM +
portmap, plugins from Debian's containernetworking-plugins in /usr/lib/cni), so pods
get real IPs. Everything that names host-global state is derived from the stack's
directory: the bridge device and the network name (which the plugins use to tag their
iptables rules). The /16 subnet is claimed (``claim_subnet``): a hash of the directory
picks where to start, and a claim file per subnet under /run/klet-devstack/subnets,
taken under a lock, makes sure two stacks on one machine (several test sessions, or a
test's second containerd beside the session's) never get the same one, even before
either has a pod and so a routed bridge. A claim whose owner directory is gone is stale
and taken over. The IPAM store lives in the directory too.

``cleanup`` removes what the plugins leave on the host when containers are killed
without a CNI DEL (a crashed run, a forced stop): the bridge and the iptables rules and
chains tagged with this network's name.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

CNI_BIN_DIR = "/usr/lib/cni"
# The plugins shipped with Debian 12 (v1.1.1) speak CNI 0.1.0 through 1.0.0.
CNI_VERSION = "1.0.0"
_SUBNET_SECOND_OCTETS = range(200, 251)
# Host-global like the bridges themselves; under /run, so a reboot forgets them.
SUBNET_CLAIMS_DIR = Path("/run/klet-devstack/subnets")


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


def _candidates(key: str) -> list[ipaddress.IPv4Network]:
    """Every subnet of the range, starting at the one ``key`` hashes to."""
    start = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    n = len(_SUBNET_SECOND_OCTETS)
    return [
        ipaddress.IPv4Network(f"10.{_SUBNET_SECOND_OCTETS[(start + i) % n]}.0.0/16")
        for i in range(n)
    ]


def _routed(candidate: ipaddress.IPv4Network, used: set[ipaddress.IPv4Network]) -> bool:
    return any(candidate.overlaps(u) for u in used if u.prefixlen > 0)


def choose_subnet(key: str) -> ipaddress.IPv4Network:
    """A /16 in 10.200.0.0-10.250.0.0 picked by hashing ``key``, skipping routed ones.

    Only what the host routes is seen: two stacks whose bridges are not up yet can get
    the same one. ``claim_subnet`` is the collision-free choice."""
    used = _used_ipv4_networks()
    candidates = _candidates(key)
    return next((c for c in candidates if not _routed(c, used)), candidates[0])


@contextmanager
def _claims_locked(claims_dir: Path) -> Iterator[None]:
    claims_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(claims_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _claim_file(claims_dir: Path, subnet: ipaddress.IPv4Network) -> Path:
    return claims_dir / str(subnet.network_address)


def claim_subnet(
    owner: Path,
    *,
    claims_dir: Path = SUBNET_CLAIMS_DIR,
    routed: set[ipaddress.IPv4Network] | None = None,
) -> ipaddress.IPv4Network:
    """A /16 in 10.200.0.0-10.250.0.0 that no other live owner holds and the host does
    not route (``routed``, default: the host's routing table), claimed for the
    directory ``owner`` until ``release_subnet``.

    The search starts at the subnet ``owner``'s path hashes to; the owner's own claim is
    returned again. A claim whose owner directory no longer exists is taken over.
    Raises RuntimeError when every subnet of the range is taken."""
    key = str(owner.resolve())
    used = _used_ipv4_networks() if routed is None else routed
    with _claims_locked(claims_dir):
        free: ipaddress.IPv4Network | None = None
        for candidate in _candidates(key):
            path = _claim_file(claims_dir, candidate)
            try:
                holder = path.read_text()
            except FileNotFoundError:
                holder = ""
            if holder == key:
                return candidate
            if holder and Path(holder).exists():
                continue
            if free is None and not _routed(candidate, used):
                free = candidate
        if free is None:
            raise RuntimeError(
                f"no free subnet among 10.{_SUBNET_SECOND_OCTETS[0]}-"
                f"{_SUBNET_SECOND_OCTETS[-1]}.0.0/16: see {claims_dir}"
            )
        path = _claim_file(claims_dir, free)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(key)
        tmp.replace(path)
        return free


def release_subnet(owner: Path, *, claims_dir: Path = SUBNET_CLAIMS_DIR) -> None:
    """Drop ``owner``'s claims (none is fine)."""
    key = str(owner.resolve())
    if not claims_dir.is_dir():
        return
    with _claims_locked(claims_dir):
        for path in claims_dir.iterdir():
            if path.name.startswith("."):
                continue
            try:
                if path.read_text() == key:
                    path.unlink()
            except FileNotFoundError:
                continue


class CniNetwork:
    """The bridge network of the stack rooted at ``dir`` (config in ``dir/net.d``).

    Without a fixed ``subnet`` one is claimed for ``dir`` when first needed (``write``,
    at containerd's start) and released by ``cleanup`` (at its stop)."""

    def __init__(
        self,
        dir: Path,
        *,
        subnet: ipaddress.IPv4Network | None = None,
        claims_dir: Path = SUBNET_CLAIMS_DIR,
    ) -> None:
        self.dir = dir
        key = str(dir.resolve())
        tag = hashlib.sha256(key.encode()).hexdigest()[:8]
        # Linux interface names are at most 15 bytes.
        self.bridge = f"kl{tag}"
        self.network_name = f"klet-{tag}"
        self.fixed_subnet = subnet
        self.claims_dir = claims_dir
        self._claimed: ipaddress.IPv4Network | None = None
        self.conf_dir = dir / "net.d"
        self.conflist_path = self.conf_dir / "10-klet.conflist"
        self.ipam_dir = dir / "ipam"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        if self.fixed_subnet is not None:
            return self.fixed_subnet
        if self._claimed is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._claimed = claim_subnet(self.dir, claims_dir=self.claims_dir)
        return self._claimed

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
        """Remove this network's iptables rules and chains and its bridge (best effort),
        and release its subnet."""
        self._cleanup_iptables()
        if Path(f"/sys/class/net/{self.bridge}").exists():
            _run(["ip", "link", "delete", self.bridge])
        if self.fixed_subnet is None:
            release_subnet(self.dir, claims_dir=self.claims_dir)
            self._claimed = None

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
