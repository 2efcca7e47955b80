"""tools/csi/build.sh and the release sources of the five components the Go module proxy
refuses (hostpathplugin, csi-node-driver-registrar, csi-attacher,
csi-external-health-monitor-controller, livenessprobe): what it says when they are not
there or not what SHA256SUMS pins.

Covers: a KLET_CSI_SRC that does not exist fails (exit 1) naming the directory, each
component and how to supply them; an archive missing from a source directory fails
naming the file, its repository and tag; one whose SHA256SUMS line is missing fails
saying so; an archive whose bytes differ from its pin fails naming both digests and is
not unpacked; an archive without vendor/ is refused; in each case the components that do
not need those sources are not touched and nothing is built. Each run has a fresh
KLET_CACHE, so it stops before any Go build: the module takes about a second. A
successful build from the real sources is proven by tests/integration/test_csi_images.py
(`make test-csi`), where each binary, imaged, runs on containerd.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.harness.csi import BUILD_SH

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FROM_SOURCE = {
    "hostpathplugin": "csi-driver-host-path-v1.16.1",
    "csi-node-driver-registrar": "node-driver-registrar-v2.13.0",
    "csi-attacher": "external-attacher-v4.8.0",
    "csi-external-health-monitor-controller": "external-health-monitor-v0.12.1",
    "livenessprobe": "livenessprobe-v2.15.0",
}


def run(tmp_path: Path, src: Path, *names: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KLET_CACHE": str(tmp_path / "cache"), "KLET_CSI_SRC": str(src)}
    return subprocess.run(
        ["bash", str(BUILD_SH), *names], capture_output=True, text=True, env=env, check=False
    )


def archive(path: Path, *, vendor: bool = True) -> str:
    """A small tar.gz shaped like a release archive (<name>/go.mod, vendor/modules.txt);
    its SHA-256."""
    top = path.name.removesuffix(".tar.gz")
    files = {f"{top}/go.mod": b"module example.com/x\n"}
    if vendor:
        files[f"{top}/vendor/modules.txt"] = b"# none\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buf.getvalue(), mtime=0))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_absent_sources_name_the_directory_and_each_component(tmp_path: Path) -> None:
    src = tmp_path / "no-such-dir"
    res = run(tmp_path, src, *FROM_SOURCE)
    assert res.returncode == 1
    assert res.stdout == ""
    for name in FROM_SOURCE:
        assert f"{name}: no release sources: {src} does not exist" in res.stderr
    assert "KLET_CSI_SRC" in res.stderr
    assert "not built: " + " ".join(FROM_SOURCE) in res.stderr
    assert not (tmp_path / "cache/csi/src").exists()


def test_missing_archive_is_named_with_its_repository_and_tag(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "SHA256SUMS").write_text("")
    res = run(tmp_path, src, "csi-attacher")
    assert res.returncode == 1
    assert (
        f"csi-attacher: missing {src}/external-attacher-v4.8.0.tar.gz "
        "(github.com/kubernetes-csi/external-attacher at tag v4.8.0)"
    ) in res.stderr


def test_archive_without_a_pin_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    archive(src / "livenessprobe-v2.15.0.tar.gz")
    (src / "SHA256SUMS").write_text(f"{'0' * 64}  something-else.tar.gz\n")
    res = run(tmp_path, src, "livenessprobe")
    assert res.returncode == 1
    assert f"{src}/SHA256SUMS has no line for livenessprobe-v2.15.0.tar.gz" in res.stderr


def test_archive_that_differs_from_its_pin_is_not_unpacked(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    got = archive(src / "csi-driver-host-path-v1.16.1.tar.gz")
    pinned = hashlib.sha256(b"the real archive").hexdigest()
    (src / "SHA256SUMS").write_text(f"{pinned}  csi-driver-host-path-v1.16.1.tar.gz\n")
    res = run(tmp_path, src, "hostpathplugin")
    assert res.returncode == 1
    assert f"has SHA-256 {got}, SHA256SUMS pins {pinned}: refusing to build it" in res.stderr
    assert not (tmp_path / "cache/csi/src/csi-driver-host-path-v1.16.1").exists()


def test_archive_without_vendor_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    digest = archive(src / "node-driver-registrar-v2.13.0.tar.gz", vendor=False)
    (src / "SHA256SUMS").write_text(f"{digest}  node-driver-registrar-v2.13.0.tar.gz\n")
    res = run(tmp_path, src, "csi-node-driver-registrar")
    assert res.returncode == 1
    assert "node-driver-registrar-v2.13.0.tar.gz carries no vendor/ directory" in res.stderr
    assert not (tmp_path / "cache/csi/src/node-driver-registrar-v2.13.0").exists()
    assert "building csi-node-driver-registrar" not in res.stderr
