"""The private dockerd of the compose tests (klet.devstack.Dockerd) leaves the host alone.

It answers on its own socket only, keeps its images under its own data root, changes
neither iptables (the FORWARD policy and rule count) nor ip_forward, and on stop leaves
no container, process or mount behind; the system socket /var/run/docker.sock is
never created by it."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from klet.devstack.containerd import _mount_points
from klet.devstack.procs import pid_alive
from klet.testbed import Dockerd


def iptables_rules() -> str:
    return subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout


def test_private_dockerd_starts_runs_and_leaves_nothing(tmp_path: Path) -> None:
    rules = iptables_rules()
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    system_socket_existed = Path("/var/run/docker.sock").exists()
    dockerd = Dockerd(tmp_path / "docker")
    dockerd.start()
    try:
        pid = dockerd.pid
        assert pid is not None and pid_alive(pid)
        assert Path(dockerd.pidfile).read_text().strip() == str(pid)
        info = dockerd.docker(["info", "--format", "{{.DockerRootDir}} {{.Driver}}"])
        assert info.stdout.split() == [str(dockerd.data_root), "overlay2"]
        # A container on the host network runs, as the compose services do.
        rootfs = tmp_path / "busybox.tar"
        with tarfile.open(rootfs, "w") as tar:
            tar.add("/bin/busybox", arcname="bin/busybox")
        dockerd.docker(["import", str(rootfs), "klet-busybox:test"])
        run = dockerd.docker(
            ["run", "--rm", "--network", "host", "klet-busybox:test", "/bin/busybox", "hostname"]
        )
        assert run.stdout.strip() == subprocess.check_output(["hostname"], text=True).strip()
        assert iptables_rules() == rules
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forwarding
        assert Path("/var/run/docker.sock").exists() == system_socket_existed
    finally:
        dockerd.stop()
    assert not pid_alive(pid)
    assert not dockerd.socket.exists()
    assert not [m for m in _mount_points() if m.startswith(str(dockerd.dir) + "/")]
