"""CSI components for tests: the binaries of tools/csi/build.sh and a csi-mock driver
run as a host process on a socket of its own.

`csi_binaries(names)` builds what is missing (csi-mock and csi-sanity take seconds once
tools/e2e's k8s.io packages are compiled) and returns name -> path (the sidecars'
cold build takes minutes: `make csi-binaries`, before `make test-csi`).
`Registrar.start` runs upstream's node-driver-registrar for a driver (csi-mock has no
registration of its own: the registrar runs beside it, as in the suite's CSI Mock pods).
`MockDriver.start` runs csi-mock with `-v=3`, so its log holds one JSON `gRPCCall:` line
per CSI call it served, which `grpc_methods()` reads.
`release_sources_missing` says why the components built from release sources cannot be
built here (their directory is absent), for a test to skip with that reason.
`start_hostpathplugin` runs upstream's csi-hostpath driver as a host process (restartable
on its state directory); `grpc_calls` counts the calls its log shows.
`start_sidecar` runs a controller sidecar (csi-provisioner, csi-snapshotter) beside a
driver; `print_log_tails` shows the end of each process's log after a test.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket as unix
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klet.testbed.cluster import ControlPlane

from tests.harness.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "tools" / "csi" / "build.sh"


def stop_process(proc: subprocess.Popen[bytes], *, grace_s: float = 10.0) -> None:
    """SIGTERM `proc` (a sidecar or controller the harness started), SIGKILL it after
    `grace_s` if it has not exited, and reap it; nothing when it has exited already."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def apply(cp: ControlPlane, obj: dict[str, Any], ns: str = "") -> None:
    """kubectl apply `obj` (in namespace `ns` when given)."""
    args = ["-n", ns] if ns else []
    cp.kubectl("apply", *args, "-f", "-", input=json.dumps(obj), check=True)


def kget(cp: ControlPlane, *args: str) -> Any:
    """kubectl get `args` as JSON."""
    return json.loads(cp.kubectl("get", *args, "-o", "json", check=True).stdout)


def csinode_has_driver(cp: ControlPlane, node: str, driver: str) -> bool:
    """Whether the CSINode of `node` lists `driver` (its registration reached the node)."""
    res = cp.kubectl("get", "csinode", node, "-o", "json")
    if res.returncode != 0:
        return False
    drivers = json.loads(res.stdout).get("spec", {}).get("drivers") or []
    return any(d["name"] == driver for d in drivers)


def persistent_driver_and_class(driver: str, storage_class: str) -> list[dict[str, Any]]:
    """The CSIDriver `driver` (no attach, persistent volumes only) and the StorageClass
    `storage_class` provisioning from it (reclaim Delete, bound at once), as the
    csi-hostpath tests apply them."""
    return [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": driver},
            "spec": {"attachRequired": False, "volumeLifecycleModes": ["Persistent"]},
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": storage_class},
            "provisioner": driver,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        },
    ]


@contextlib.contextmanager
def namespace(cp: ControlPlane, prefix: str) -> Iterator[str]:
    """A fresh namespace `<prefix>-<6 hex>` whose default ServiceAccount exists (pods
    are refused before it), deleted without waiting afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", name, check=True)
    wait_for(
        lambda: cp.kubectl("get", "serviceaccount", "default", "-n", name).returncode == 0,
        timeout_s=60,
        what="the default ServiceAccount",
    )
    try:
        yield name
    finally:
        cp.kubectl("delete", "namespace", name, "--wait=false")


def release_sources_missing() -> str | None:
    """Why the components built from release sources (hostpathplugin,
    csi-node-driver-registrar, ...) cannot be built here, as tools/csi/build.sh says it,
    or None when their directory exists ($KLET_CSI_SRC, else ../shared/third_party/
    kubernetes-csi beside the repository). A wrong or missing archive inside it is not
    this: build.sh fails on it, and so does the test."""
    src = Path(
        os.environ.get("KLET_CSI_SRC") or REPO.parent / "shared" / "third_party" / "kubernetes-csi"
    )
    if src.is_dir():
        return None
    return (
        f"no CSI release sources: {src} does not exist; put the release archives there with "
        "their SHA256SUMS (see ../shared/third_party/README.md: each upstream tree at its tag "
        "with its committed vendor/), or point KLET_CSI_SRC at a directory that holds them"
    )


def csi_binaries(names: Sequence[str]) -> dict[str, Path]:
    """Build (when not cached) and return the components `names`; AssertionError with
    build.sh's stderr when it fails."""
    res = subprocess.run(
        ["bash", str(BUILD_SH), *names], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, f"{BUILD_SH} exited {res.returncode}:\n{res.stderr[-3000:]}"
    paths = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    return {name: Path(paths[name]) for name in names}


@dataclass
class MockDriver:
    """A running csi-mock: its process, socket and log."""

    proc: subprocess.Popen[bytes]
    name: str
    socket: Path
    log: Path

    @classmethod
    def start(
        cls, binary: Path, workdir: Path, *, name: str, args: Sequence[str] = ()
    ) -> MockDriver:
        """csi-mock serving driver `name` on `<workdir>/csi.sock` (keep `workdir` short:
        a unix socket's path must fit in 108 bytes), once the socket is there."""
        socket = workdir / "csi.sock"
        log = workdir / "mock.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(binary), f"--endpoint=unix://{socket}", f"--drivername={name}", "-v=3", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
        driver = cls(proc=proc, name=name, socket=socket, log=log)
        wait_for(
            lambda: socket.is_socket() or proc.poll() is not None,
            timeout_s=10,
            what=f"{socket} to appear",
        )
        if proc.poll() is not None:
            raise AssertionError(f"csi-mock exited {proc.returncode}: {log.read_text()}")
        return driver

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def grpc_methods(self) -> list[str]:
        """The CSI methods the driver served, in order (its `gRPCCall:` log lines)."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            _, sep, rest = line.partition('gRPCCall: {"Method":"')
            if sep:
                out.append(rest.partition('"')[0])
        return out


@dataclass
class Registrar:
    """A running csi-node-driver-registrar (upstream's, built from its release sources by
    tools/csi/build.sh): it asks the driver on `csi_socket` for its name and serves the
    kubelet plugin registration API at `<registry>/<driver name>-reg.sock`."""

    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, binary: Path, *, csi_socket: Path, registry: Path, log: Path) -> Registrar:
        registry.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(binary),
                    f"--csi-address={csi_socket}",
                    f"--kubelet-registration-path={csi_socket}",
                    f"--plugin-registration-path={registry}",
                    "--v=5",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return cls(proc=proc, log=log)

    def stop(self) -> None:
        """SIGTERM, as the kubelet's pod stop: the registrar removes its socket."""
        stop_process(self.proc)

    def info_requests(self) -> int:
        """How many GetInfo calls the node's plugin watcher made on the socket (the
        registrar logs each as "Received GetInfo call")."""
        return self.log.read_text(errors="replace").count("Received GetInfo call")

    def registrations(self) -> int:
        """How many times the node told the registrar it registered the driver
        (NotifyRegistrationStatus with PluginRegistered true; told false, the registrar
        exits 1, as upstream's does so that its container's restart tries again)."""
        return self.log.read_text(errors="replace").count("PluginRegistered:true")


def start_hostpathplugin(
    binary: Path, *, socket: Path, driver: str, node: str, state: Path, log: Path
) -> subprocess.Popen[bytes]:
    """hostpathplugin (upstream's csi-hostpath driver) serving `driver` for `node` on
    `socket` with its volumes and state.json in `state`, logging at `--v=5` (one
    `GRPC call: <method>` line per call) appended to `log`; returns once the socket is
    there. A restart on the same `state` finds the volumes it had (its state.json)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--endpoint=unix://{socket}",
                f"--drivername={driver}",
                f"--nodeid={node}",
                f"--statedir={state}",
                "--enable-topology=false",
                "--v=5",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_for(
        lambda: proc.poll() is not None or (socket.is_socket() and _connects(socket)),
        timeout_s=30,
        what="hostpathplugin's socket",
    )
    if proc.poll() is not None:
        raise AssertionError(f"hostpathplugin exited {proc.returncode}: {log.read_text()[-3000:]}")
    return proc


def start_sidecar(
    binary: Path, *, socket: Path, kubeconfig: Path, log: Path, args: Sequence[str] = ("-v=5",)
) -> subprocess.Popen[bytes]:
    """A CSI controller sidecar (csi-provisioner, csi-snapshotter, ...) for the driver on
    `socket`, talking to the apiserver as `kubeconfig`, with `args`, its output in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(binary), f"--csi-address={socket}", f"--kubeconfig={kubeconfig}", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def print_log_tails(logs: Sequence[Path], lines: int = 25) -> None:
    """The last `lines` lines of each log, for pytest's captured output of a failure."""
    for log in logs:
        text = log.read_text(errors="replace").splitlines() if log.exists() else []
        print(f"--- {log.name}\n" + "\n".join(text[-lines:]))


def _connects(socket: Path) -> bool:
    """Whether a process listens on unix socket `socket` (a killed driver leaves its
    socket file behind)."""
    with unix.socket(unix.AF_UNIX, unix.SOCK_STREAM) as s:
        try:
            s.connect(str(socket))
        except OSError:
            return False
    return True


def grpc_calls(log: Path, method: str) -> int:
    """How many `GRPC call:` lines for `method` (e.g. "NodePublishVolume") hostpathplugin
    wrote to `log`."""
    return sum(
        1
        for line in log.read_text(errors="replace").splitlines()
        if "GRPC call" in line and f"/{method}" in line
    )
