"""A node whose PID 1 is a real systemd: a container on a private dockerd.

The test hosts have no systemd, and the systemd cgroup driver and graceful node shutdown
need one (and its D-Bus, and logind). `SystemdNode` builds `klet-systemd-node:<version>`
with tools/image (Debian bookworm's systemd 252 and dbus, containerd 1.6 and runc, the
CNI plugins, what `klet up`'s private stack runs, and klet's wheels; the layers are cached
under $KLET_CACHE/image), starts a private dockerd (klet.devstack.Dockerd), loads the
image and runs it as systemd wants a container:

- every capability this host has (`--cap-add` each, unconfined seccomp and AppArmor,
  writable /proc/sys, every device), not `--privileged`: docker 20.10's privileged mode
  asks for capabilities this host's bounding set lacks (CAP_SYS_RESOURCE) and runc
  refuses ("unable to apply caps"), as the compose tier found;
- a tmpfs on /run and /run/lock, the host's /sys/fs/cgroup (cgroup v1 here: systemd then
  manages the container's own subtree, `/docker/<id>/...`);
- no network (`--network none`: its own namespace with loopback only; pods get their
  bridge inside it) and the stop signal SIGRTMIN+3 (systemd's halt), so `docker stop`
  powers the node off as a shutdown would;
- `/var/lib/klet-node` bound from a host directory, because containerd's overlay
  snapshots cannot live on the container's own overlay root.

`join` lets the node into a test control plane although it has no network:
`relay_in` has socat on the host listen on a Unix socket in the bound state directory
and connect each client to the apiserver, and a socat unit in the node listen on the
apiserver's loopback port and connect to that socket, so the node's kubeconfig names
the apiserver as the host's does (`https://127.0.0.1:<port>`, a name its certificate
holds). klet is ordered after that unit, so at a shutdown systemd stops klet before the
relay. `relay_out` is the other way round, for what the host calls in the node: the
kubelet API (the apiserver's logs and exec) and klet up's registry.

klet runs inside as a systemd service: `start_klet` writes the KubeletConfiguration and
runs `klet up` (its private Redis, registry with the busybox test images, containerd
whose runc follows `cgroupDriver`) with `systemd-run --unit klet`, static pods from
`manifests` (bound read-only at /etc/klet/manifests), the read-only port 10255. The test
reads the node through `docker exec` (`pods`, `systemctl`, `journal`) and the host's
view of the cgroup tree (`host_cgroup`). `stop` stops klet, powers the node off, and
stops dockerd.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from klet.testbed import Dockerd
from klet.testbed.cluster import ControlPlane

from tests.compose.test_compose import CAPABILITIES, bounding_set, capability_bits
from tests.harness.waiting import wait_for
from tools.image.__main__ import version

ROOT = Path(__file__).resolve().parents[2]
NODE_STATE = "/var/lib/klet-node"
MANIFESTS = "/etc/klet/manifests"
CONFIG = "/etc/klet/kubelet.yaml"
READ_ONLY_PORT = 10255
CGROUP_ROOT = Path("/sys/fs/cgroup")


def image_reference() -> str:
    return f"klet-systemd-node:{version()}"


def build_image(out_dir: Path) -> Path:
    """tools/image's systemd-node archive (cached layers; the workspace layer is rebuilt)."""
    res = subprocess.run(
        [sys.executable, "-m", "tools.image", "--out-dir", str(out_dir), "systemd-node"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if res.returncode != 0:
        raise RuntimeError(f"building the systemd node image failed:\n{res.stderr[-3000:]}")
    return out_dir / f"klet-systemd-node-{version()}.oci.tar"


def run_options() -> list[str]:
    """`docker run` options for systemd as PID 1 on this host (see the module docstring)."""
    caps = [f"--cap-add={CAPABILITIES[bit]}" for bit in capability_bits(bounding_set())]
    return [
        *caps,
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "apparmor=unconfined",
        "--security-opt",
        "systempaths=unconfined",
        "--device-cgroup-rule",
        "a *:* rwm",
        "--network",
        "none",
        "--tmpfs",
        "/run",
        "--tmpfs",
        "/run/lock",
        "--volume",
        f"{CGROUP_ROOT}:{CGROUP_ROOT}",
    ]


def _host_v1_hierarchies(mountinfo: Path = Path("/proc/self/mountinfo")) -> set[frozenset[str]]:
    """The controller sets of the cgroup v1 hierarchies mounted in this namespace
    ({"cpu", "cpuacct"}, {"memory"}, {"name=systemd"}, ...)."""
    subsystems = {
        line.split()[0]
        for line in Path("/proc/cgroups").read_text().splitlines()
        if line and not line.startswith("#")
    }
    found: set[frozenset[str]] = set()
    for line in mountinfo.read_text().splitlines():
        _, _, post = line.partition(" - ")
        fields = post.split()
        if len(fields) >= 3 and fields[0] == "cgroup":
            options = fields[2].split(",")
            found.add(frozenset(o for o in options if o in subsystems or o.startswith("name=")))
    return found


def release_foreign_hierarchies(
    proc_cgroup: Path = Path("/proc/self/cgroup"), *, tries: int = 5
) -> list[str]:
    """Give back the cgroup v1 hierarchies the node's systemd mounted and the host does not.

    systemd in the node container mounts every controller the kernel has (hugetlb,
    net_cls,net_prio, perf_event here, which the host leaves unmounted), and runc creates
    the node's cgroups in them. A v1 hierarchy lives on while it holds cgroups, so after
    the container is gone the host's processes still list it in /proc/<pid>/cgroup, and
    the host's containerd, which looks each listed hierarchy up among its own mounts,
    fails on it ("cannot find cgroup mount destination"): no container stats and no OOM
    events for every later test on this machine. So: mount each such hierarchy at a
    private directory, remove its (empty) cgroups deepest first, unmount; the kernel then
    drops it (removed cgroups may linger a moment while their state is released, so this
    is done again, up to `tries` times, while the hierarchy is still listed). Returns
    the cgroups that could not be removed (still in use)."""
    for _ in range(tries):
        left, foreign = _release_once(proc_cgroup)
        if left or not foreign:
            return left
        time.sleep(0.5)
    return []


def _release_once(proc_cgroup: Path) -> tuple[list[str], list[str]]:
    """One pass of release_foreign_hierarchies: (cgroups left, hierarchies found)."""
    mounted = _host_v1_hierarchies()
    left: list[str] = []
    foreign: list[str] = []
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, _ = line.split(":", 2)
        if not controllers or controllers.startswith("name="):
            continue
        if frozenset(controllers.split(",")) in mounted:
            continue
        foreign.append(controllers)
        target = Path(tempfile.mkdtemp(prefix="klet-hierarchy-"))
        try:
            subprocess.run(
                ["mount", "-t", "cgroup", "-o", controllers, "cgroup", str(target)],
                check=True,
                capture_output=True,
            )
        except subprocess.CalledProcessError:
            target.rmdir()
            continue
        try:
            for d in sorted(
                (p for p in target.rglob("*") if p.is_dir()),
                key=lambda p: len(p.parts),
                reverse=True,
            ):
                try:
                    d.rmdir()
                except OSError:
                    left.append(f"{controllers}:/{d.relative_to(target)}")
        finally:
            subprocess.run(["umount", str(target)], check=False, capture_output=True)
            target.rmdir()
    return left, foreign


class SystemdNode:
    """One node container (`name`) on a private dockerd under `dir`."""

    def __init__(self, dir: Path, *, name: str = "node") -> None:
        self.dir = dir
        self.name = name
        self.dockerd = Dockerd(dir / "docker")
        self.state = dir / "state"
        self.manifests = dir / "manifests"
        self.config_file = dir / "kubelet.yaml"
        self.timings: dict[str, float] = {}
        self._relays: list[subprocess.Popen[bytes]] = []
        self._klet_after: list[str] = []

    def start(self, archive: Path) -> None:
        began = time.monotonic()
        self.dockerd.start()
        self.dockerd.docker(["load", "--input", str(archive)], timeout_s=600)
        self.timings["load"] = time.monotonic() - began
        for d in (self.state, self.manifests):
            d.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text("")
        began = time.monotonic()
        self.dockerd.docker(
            [
                "run",
                "--detach",
                "--name",
                self.name,
                "--hostname",
                self.name,
                *run_options(),
                "--volume",
                f"{self.state}:{NODE_STATE}",
                "--volume",
                f"{self.manifests}:{MANIFESTS}:ro",
                "--volume",
                f"{self.config_file}:{CONFIG}:ro",
                image_reference(),
            ]
        )
        wait_for(self._booted, timeout_s=60, what="systemd in the node container running")
        self.timings["boot"] = time.monotonic() - began

    def _booted(self) -> bool:
        state = self.exec(["systemctl", "is-system-running"], check=False).stdout.strip()
        if state == "degraded":
            failed = self.exec(["systemctl", "--failed", "--no-legend"], check=False).stdout
            raise AssertionError(f"systemd in the node container is degraded:\n{failed}")
        return state == "running"

    def exec(
        self, argv: list[str], *, check: bool = True, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        res = self.dockerd.docker(["exec", self.name, *argv], check=False, timeout_s=timeout_s)
        if check and res.returncode != 0:
            raise AssertionError(
                f"in {self.name}: {' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}"
            )
        return res

    def _relay_socket(self, name: str) -> tuple[Path, str]:
        """A Unix socket path for relay `name`: on the host and as the node sees it."""
        (self.state / "relay").mkdir(exist_ok=True)
        return self.state / "relay" / f"{name}.sock", f"{NODE_STATE}/relay/{name}.sock"

    def relay_in(self, name: str, port: int) -> str:
        """Make the host's 127.0.0.1:`port` reachable in the node at the same address:
        socat on the host listens on a Unix socket in the bound state directory and
        connects to the port, a socat unit in the node listens on the port and connects
        to the socket. Returns the node's unit."""
        host, inside = self._relay_socket(name)
        self._relays.append(
            subprocess.Popen(
                ["socat", f"UNIX-LISTEN:{host},fork,mode=600", f"TCP:127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_for(host.exists, timeout_s=10, what=f"socat listening on {host}")
        unit = f"relay-{name}.service"
        self.exec(
            [
                "systemd-run",
                f"--unit={unit}",
                "socat",
                f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr",
                f"UNIX-CONNECT:{inside}",
            ]
        )
        return unit

    def relay_out(self, name: str, node_port: int, host_port: int) -> None:
        """Make the node's 127.0.0.1:`node_port` reachable on the host at
        127.0.0.1:`host_port` (the same relay, the other way round)."""
        host, inside = self._relay_socket(name)
        self.exec(
            [
                "systemd-run",
                f"--unit=relay-{name}.service",
                "socat",
                f"UNIX-LISTEN:{inside},fork,mode=600",
                f"TCP:127.0.0.1:{node_port}",
            ]
        )
        wait_for(host.exists, timeout_s=10, what=f"the node's socat listening on {host}")
        self._relays.append(
            subprocess.Popen(
                [
                    "socat",
                    f"TCP-LISTEN:{host_port},bind=127.0.0.1,fork,reuseaddr",
                    f"UNIX-CONNECT:{host}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def join(self, plane: ControlPlane) -> list[str]:
        """Relay `plane`'s apiserver into the node (see the module docstring) and return
        the flags `klet up` needs to join it as node `self.name`: the control plane's
        node flags, with the files they name copied into the node."""
        port = urlsplit(plane.server).port
        assert port is not None, plane.server
        self._klet_after.append(self.relay_in("apiserver", port))
        files = self.state / "join"
        files.mkdir(exist_ok=True)
        flags = []
        for i, flag in enumerate(plane.node_flags(self.name)):
            source = Path(flag)
            if flag.startswith("/") and source.is_file():
                shutil.copy(source, files / f"{i}-{source.name}")
                flag = f"{NODE_STATE}/join/{i}-{source.name}"
            flags.append(flag)
        return flags

    def start_klet(self, config: str, *extra: str) -> None:
        """Write the KubeletConfiguration and start `klet up` as the unit klet.service."""
        self.config_file.write_text(config)
        self.exec(
            [
                "systemd-run",
                "--unit=klet",
                "--property=KillMode=mixed",
                "--property=TimeoutStopSec=60",
                *(f"--property=After={unit}" for unit in self._klet_after),
                "/usr/local/bin/klet",
                "up",
                "--config",
                CONFIG,
                "--run-dir",
                f"{NODE_STATE}/run",
                "--pod-manifest-path",
                MANIFESTS,
                "--read-only-port",
                str(READ_ONLY_PORT),
                *extra,
            ]
        )

    def pods(self) -> list[dict[str, Any]]:
        """The read-only port's /pods ([] until klet answers)."""
        res = self.exec(
            [
                "python3",
                "-c",
                "import sys,urllib.request;"
                f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{READ_ONLY_PORT}/pods',"
                "timeout=5).read().decode())",
            ],
            check=False,
        )
        if res.returncode != 0:
            return []
        items = json.loads(res.stdout).get("items") or []
        return [p for p in items if isinstance(p, dict)]

    def unit_properties(self, unit: str, *names: str) -> dict[str, str]:
        out = self.exec(["systemctl", "show", unit, *(f"--property={n}" for n in names)]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def units(self, pattern: str) -> list[str]:
        """Loaded units matching `pattern` (any state)."""
        out = self.exec(
            ["systemctl", "list-units", "--all", "--plain", "--no-legend", pattern]
        ).stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def journal(self, unit: str = "klet") -> str:
        return self.exec(["journalctl", "--unit", unit, "--no-pager"], check=False).stdout

    def host_cgroup(self, controller: str, path: str) -> Path:
        """Where a cgroup path systemd reports (its `ControlGroup`, which includes the
        container's own `/docker/<id>` prefix here) is in the host's hierarchy."""
        return CGROUP_ROOT / controller / path.lstrip("/")

    def stop(self) -> None:
        """Stop klet (its stack stops the pods), power the node off, stop dockerd."""
        try:
            if self.dockerd.pid is not None:
                began = time.monotonic()
                self.exec(["systemctl", "stop", "klet"], check=False, timeout_s=120)
                self.timings["stop klet"] = time.monotonic() - began
                began = time.monotonic()
                self.dockerd.docker(["stop", "--time", "60", self.name], check=False, timeout_s=120)
                self.timings["power off"] = time.monotonic() - began
        finally:
            for relay in self._relays:
                relay.terminate()
                relay.wait(timeout=10)
            began = time.monotonic()
            self.dockerd.stop()
            shutil.rmtree(self.state, ignore_errors=True)
            self.timings["dockerd stop"] = time.monotonic() - began
            left = release_foreign_hierarchies()
            if left:
                print(f"systemd node stop: cgroups left in the node's hierarchies: {left}")
            print(
                "systemd node stop: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items())
            )
