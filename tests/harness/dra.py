"""Upstream's DRA test driver (k8s.io/kubernetes test/e2e/dra/test-driver) for the DRA tests.

`dra_test_driver_binary()` builds it with tools/dra/build.sh (cached after the first
build). `DRATestDriver.start` runs its `kubelet-plugin` mode for one node against the
harness's apiserver: it publishes a ResourceSlice of fake devices for the node,
registers through the node's `<root-dir>/plugins_registry/` (its DRAPlugin socket in
`<root-dir>/plugins/<driver>/`) and writes a CDI spec per prepared claim request into
`cdi_dir`. `stop()` sends SIGTERM: the driver removes its sockets.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dra_test_driver_binary() -> Path:
    """The built driver (tools/dra/build.sh: about 15 s the first time, cached after)."""
    out = subprocess.run(
        ["bash", str(ROOT / "tools" / "dra" / "build.sh")],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class DRATestDriver:
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(
        cls,
        binary: Path,
        *,
        kubeconfig: Path,
        driver: str,
        node: str,
        root_dir: Path,
        cdi_dir: Path,
        log: Path,
        num_devices: int = 2,
    ) -> DRATestDriver:
        # The driver makes only the parent of its socket directory (its deployments mount
        # the socket directory from the host with DirectoryOrCreate); the registry is the
        # watcher's.
        (root_dir / "plugins" / driver).mkdir(parents=True, exist_ok=True)
        (root_dir / "plugins_registry").mkdir(parents=True, exist_ok=True)
        argv = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--drivername={driver}",
            "-v=6",  # 6: its gRPC server logs each request (upstream's GRPCVerbosity)
            "kubelet-plugin",
            f"--node-name={node}",
            f"--plugin-registration-path={root_dir / 'plugins_registry'}",
            f"--datadir={root_dir / 'plugins'}",
            f"--cdi-dir={cdi_dir}",
            f"--num-devices={num_devices}",
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        return cls(proc, log)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def text(self) -> str:
        return self.log.read_text(errors="replace")
