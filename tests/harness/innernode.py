"""The host side of a klet node whose services run as pods (the Helm chart's way).

A klet deployed into a cluster runs its five services as pods on some node ("host"),
and they manage a node of their own ("inner") with its own container runtime. This
prepares what that inner node needs on the machine, apart from every other klet node:

- containerd B: a second private containerd (``DevStack.extra_containerd``) with its own
  root, state, CNI network and subnet (claimed, so it never collides with the stack's or
  another session's), pulling from the dev stack's registry; its sockets in a directory
  of their own, which is what the pods mount;
- root dir B, made a shared mount (``mount --bind D D && mount --make-rshared D``): the
  services' pods mount it with ``mountPropagation: Bidirectional``, which the runtime
  refuses on a private mount, and the volumes the inner syncloop mounts there must reach
  containerd B on the host;
- pod logs dir B, run dir B (gRPC sockets, leader slots, port files; the Redis socket
  directory inside it), the bus directory (ACL file and password files);
- the inner node's kubelet ports (10250 API, healthz, read-only), free ports.

``separate`` asserts that no two klet nodes share a runtime, a root dir or a port. On
exit containerd B is stopped (every task it runs killed), what stays mounted under the
directory is unmounted and the directory removed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from klet.devstack import Containerd, DevStack, free_port

from tests.harness.node import KletNode


@dataclass(frozen=True)
class InnerHost:
    """Paths and ports of the inner node, as the host sees them (same-path mounts)."""

    name: str
    dir: Path
    containerd: Containerd
    root_dir: Path
    logs_dir: Path
    run_dir: Path
    bus_dir: Path
    port: int
    healthz_port: int
    read_only_port: int

    @property
    def runtime_endpoint(self) -> str:
        return self.containerd.endpoint

    @property
    def socket_dir(self) -> Path:
        return self.containerd.socket_dir

    @property
    def redis_socket_dir(self) -> Path:
        return self.run_dir / "redis"

    @property
    def ports(self) -> set[int]:
        return {self.port, self.healthz_port, self.read_only_port}


def _host_ports(node: KletNode) -> set[int]:
    return {node.read_only_port, node.healthz_port, node.kubelet_port, *node.ports.values()}


def _nested(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def separate(inner: InnerHost, host: KletNode, stack: DevStack) -> None:
    """Fail unless the inner node shares no runtime, root dir, run dir or port with the
    host node (or the stack's containerd, which every process-based node uses)."""
    assert inner.runtime_endpoint != stack.runtime_endpoint, "inner node on the stack's runtime"
    assert stack.containerd is not None
    assert not _nested(inner.containerd.dir, stack.containerd.dir)
    assert not _nested(inner.root_dir, host.root_dir), (inner.root_dir, host.root_dir)
    assert not _nested(inner.run_dir, host.dir / "run"), (inner.run_dir, host.dir)
    shared = inner.ports & _host_ports(host)
    assert not shared, f"inner and host node share ports {shared}"
    assert len(inner.ports) == 3, f"inner node ports collide: {inner.ports}"
    assert inner.containerd.network.subnet != stack.containerd.network.subnet


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@contextmanager
def inner_host(stack: DevStack, *, name: str) -> Iterator[InnerHost]:
    """Containerd B started, the directories made, root dir B a shared mount."""
    # Short: containerd's socket path must stay under 108 bytes.
    dir = Path(tempfile.mkdtemp(prefix="klet-in-", dir="/tmp"))
    containerd = stack.extra_containerd(dir / "containerd", socket_dir=dir / "cri")
    root = dir / "root"
    try:
        for sub in ("root", "logs", "run/redis", "bus/secrets"):
            (dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(dir / "bus", 0o700)
        _run("mount", "--bind", str(root), str(root))
        _run("mount", "--make-rshared", str(root))
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port())
        port, healthz, read_only = sorted(ports)
        yield InnerHost(
            name=name,
            dir=dir,
            containerd=containerd,
            root_dir=root,
            logs_dir=dir / "logs",
            run_dir=dir / "run",
            bus_dir=dir / "bus",
            port=port,
            healthz_port=healthz,
            read_only_port=read_only,
        )
    finally:
        containerd.stop()
        subprocess.run(["umount", "--recursive", "--lazy", str(root)], capture_output=True)
        if not os.environ.get("KLET_KEEP_DEVSTACK"):
            shutil.rmtree(dir, ignore_errors=True)
