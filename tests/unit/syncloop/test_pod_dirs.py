"""Pod directories keep other host users out (issue 11, file permissions).

`<root-dir>`, `pods/` and `pods/<uid>` are made 0750 and root's whatever the umask;
wider ones left by an older klet are narrowed, a symlink in their place is refused,
also one swapped in right after klet made the directory (nothing outside is changed
through it).
Through the real volume manager and plugins (Secret and projected service-account
token on their own tmpfs, as in production), an unprivileged host user (`nobody`,
through setpriv) is refused the pod directory, a Secret file and a token file, while
root reads them and the files keep the modes the spec asks for. The root directory is
made 0755 beforehand (as a distribution's /var/lib/kubelet may be, which klet leaves
alone) and the child starts in it, so the directories klet makes below it are what
refuses.

Root is needed to change user and to mount the tmpfs.
"""

from __future__ import annotations

import base64
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.model.types import JSON
from klet.syncloop.volumes import poddirs
from klet.syncloop.volumes.content import ProjectedPlugin, SecretPlugin
from klet.syncloop.volumes.emptydir import EmptyDirPlugin
from klet.syncloop.volumes.manager import VolumeManager

from .test_content_volumes import NODE, FakeObjects, FakeTokens

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: setpriv and tmpfs")

NOBODY = 65534
SECRET = b"\x00\xffs3cr3t\x80"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask() -> Iterator[None]:
    """A common umask (022): what makes mkdir's directories world-readable by default."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def as_nobody(root_dir: Path, *argv: str) -> subprocess.CompletedProcess[bytes]:
    """Run `argv` as nobody (no groups) from inside `root_dir`."""
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        cwd=root_dir,
        capture_output=True,
        check=False,
        timeout=30,
    )


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_pod_dir_is_0750_and_roots_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    root_dir = tmp_path / "kubelet"
    old = os.umask(mask)
    try:
        path = poddirs.ensure_pod_dir(root_dir, "u1")
    finally:
        os.umask(old)
    assert path == root_dir / "pods" / "u1"
    for d in (root_dir, root_dir / "pods", path):
        info = os.lstat(d)
        assert (oct(stat.S_IMODE(info.st_mode)), info.st_uid, info.st_gid) == ("0o750", 0, 0), d


def test_wider_pod_dirs_are_narrowed_and_the_root_dir_is_left(tmp_path: Path) -> None:
    root_dir = tmp_path / "kubelet"
    (root_dir / "pods" / "u1").mkdir(parents=True)
    os.chmod(root_dir, 0o755)  # the operator's choice
    os.chmod(root_dir / "pods", 0o755)
    os.chmod(root_dir / "pods" / "u1", 0o777)
    os.chown(root_dir / "pods" / "u1", 1000, 1000)
    poddirs.ensure_pod_dir(root_dir, "u1")
    assert mode(root_dir) == 0o755
    assert mode(root_dir / "pods") == 0o750
    info = os.lstat(root_dir / "pods" / "u1")
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o750, 0, 0)


def test_a_symlink_in_place_of_a_pod_dir_is_refused(tmp_path: Path) -> None:
    root_dir = tmp_path / "kubelet"
    (root_dir / "pods").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir(mode=0o755)
    os.symlink(tmp_path / "elsewhere", root_dir / "pods" / "u1")
    with pytest.raises(poddirs.PodDirError, match=r"pods/u1: exists and is not a directory"):
        poddirs.ensure_pod_dir(root_dir, "u1")
    assert mode(tmp_path / "elsewhere") == 0o755  # not chmodded through the link


@pytest.mark.parametrize("victim", ["pods", "u1"])
def test_a_symlink_swapped_in_after_mkdir_is_refused_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: str
) -> None:
    """Whoever can write beside the directory replaces it with a link to a host directory
    between klet's mkdir and its mode change: the host directory keeps its owner and
    mode, and the pod directory is refused naming the path."""
    root_dir = tmp_path / "kubelet"
    root_dir.mkdir()
    outside = tmp_path / "host-dir"
    outside.mkdir()
    os.chmod(outside, 0o700)
    os.chown(outside, 1000, 1000)
    real_mkdir = os.mkdir
    swapped: list[str] = []

    def mkdir_then_swap(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        if os.path.basename(path) == victim:
            os.rmdir(path, dir_fd=dir_fd)
            os.symlink(outside, path, dir_fd=dir_fd)
            swapped.append(path)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    with pytest.raises(poddirs.PodDirError, match=f"{victim}: exists and is not a directory"):
        poddirs.ensure_pod_dir(root_dir, "u1")
    monkeypatch.undo()
    assert swapped, "the swap did not happen"
    info = os.stat(outside)
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o700, 1000, 1000)


@pytest.mark.parametrize("uid", ["", ".", "..", "a/b"])
def test_an_unusable_uid_is_refused(tmp_path: Path, uid: str) -> None:
    with pytest.raises(poddirs.PodDirError, match="invalid pod UID"):
        poddirs.ensure_pod_dir(tmp_path, uid)


def secret_pod(**security: object) -> JSON:
    return {
        "metadata": {"name": "web", "namespace": "prod", "uid": "u-1"},
        "spec": {
            "serviceAccountName": "builder",
            "securityContext": dict(security),
            "containers": [{"name": "main"}],
            "volumes": [
                {"name": "creds", "secret": {"secretName": "db"}},
                {
                    "name": "token",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}
                        ]
                    },
                },
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }


async def set_up(root_dir: Path, pod: JSON) -> VolumeManager:
    objects = FakeObjects()
    objects.secrets[("prod", "db")] = {"data": {"password": base64.b64encode(SECRET).decode()}}
    manager = VolumeManager(
        [EmptyDirPlugin(), SecretPlugin(), ProjectedPlugin()],
        root_dir=root_dir,
        node=NODE,
        objects=objects,
        tokens=FakeTokens(),
    )
    outcome = await manager.set_up(pod, pod_ip="10.1.0.7")
    assert outcome.failures == {}
    return manager


@pytest.mark.parametrize(
    ("security", "file_modes"),
    [
        ({}, {"creds/password": 0o644, "token/token": 0o644}),  # any container user reads
        ({"fsGroup": 2000}, {"creds/password": 0o644, "token/token": 0o640}),
    ],
)
async def test_nobody_on_the_host_reads_a_pods_secret_or_token(
    tmp_path: Path, umask: None, security: dict[str, int], file_modes: dict[str, int]
) -> None:
    root_dir = tmp_path / "kubelet"
    root_dir.mkdir()
    os.chmod(root_dir, 0o755)
    manager = await set_up(root_dir, secret_pod(**security))
    try:
        pod_dir = root_dir / "pods" / "u-1"
        volumes = pod_dir / "volumes"
        files = {
            "creds/password": volumes / "kubernetes.io~secret" / "creds" / "password",
            "token/token": volumes / "kubernetes.io~projected" / "token" / "token",
        }
        # root (the runtime) reads the exact bytes; the files keep the spec's modes
        assert files["creds/password"].read_bytes() == SECRET
        assert files["token/token"].read_text() == "token-for-builder"
        assert {k: mode(p.resolve()) for k, p in files.items()} == file_modes
        if "fsGroup" in security:
            assert os.stat(files["token/token"]).st_gid == 2000
        assert mode(root_dir) == 0o755
        for d in (root_dir / "pods", pod_dir):
            assert mode(d) == 0o750
        # the volume roots: read-only content for any container user, a shared emptyDir
        assert mode(volumes / "kubernetes.io~secret" / "creds") & 0o777 == 0o755
        assert mode(volumes / "kubernetes.io~empty-dir" / "scratch") & 0o777 == 0o777

        for rel in (files["creds/password"], files["token/token"]):
            refused = as_nobody(root_dir, "cat", str(rel.relative_to(root_dir)))
            assert refused.returncode != 0 and b"Permission denied" in refused.stderr, rel
            assert SECRET not in refused.stdout
        listing = as_nobody(root_dir, "ls", "pods/u-1")
        assert listing.returncode != 0 and b"Permission denied" in listing.stderr
        # the check itself works: nobody reads what is meant to be public
        (root_dir / "public").write_text("hi")
        assert as_nobody(root_dir, "cat", "public").stdout == b"hi"
    finally:
        assert await manager.tear_down("u-1") == []
