"""syncloop's start-up refusals of a cgroup driver that cannot work, on this host (no
systemd as PID 1) and a real containerd: `cgroupDriver: systemd` exits 1 naming the field
and PID 1; the default cgroupfs driver against a containerd whose runc has `SystemdCgroup
= true` exits 1 naming both drivers (containerd 1.6 answers CRI RuntimeConfig with
UNIMPLEMENTED, so the driver comes from its verbose Status), and the CRI client reads
`cgroupfs` from the dev stack's usual containerd. The working systemd driver is tested on
a node with systemd as PID 1 (tests/systemd)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.cgroups.systemd import pid1_is_systemd
from klet.cri import CRISettings, RuntimeClient
from klet.devstack.containerd import Containerd

from tests.harness.node import run_syncloop


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kcg-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(pid1_is_systemd(), reason="this host's PID 1 is systemd")
def test_systemd_driver_without_systemd_is_refused(short_dir: Path) -> None:
    config = short_dir / "kubelet.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "cgroupDriver: systemd\n"
    )
    res = run_syncloop(short_dir, "--config", str(config))
    assert res.returncode == 1, res.stderr
    comm = Path("/proc/1/comm").read_text().strip()
    assert f"syncloop: cgroupDriver: systemd: PID 1 is not systemd (it is {comm!r})" in res.stderr


def test_runtime_with_the_other_driver_is_refused(short_dir: Path) -> None:
    containerd = Containerd(short_dir / "ctd", systemd_cgroup=True)
    containerd.start()
    try:
        res = run_syncloop(short_dir, "--container-runtime-endpoint", containerd.endpoint)
    finally:
        containerd.stop()
    assert res.returncode == 1, res.stderr
    assert (
        "cgroupDriver: klet's is 'cgroupfs' but the container runtime's is 'systemd' "
        "(containerd: SystemdCgroup = true in its runc options); set both to the same driver"
    ) in res.stderr


def test_cri_client_reads_the_cgroupfs_driver(short_dir: Path) -> None:
    containerd = Containerd(short_dir / "ctd")
    containerd.start()

    async def driver() -> str:
        client = RuntimeClient(CRISettings(runtime_endpoint=containerd.endpoint))
        try:
            return await client.cgroup_driver()
        finally:
            await client.close()

    try:
        assert asyncio.run(driver()) == "cgroupfs"
    finally:
        containerd.stop()
