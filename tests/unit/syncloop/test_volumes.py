"""The volume framework without mounting anything: hostPath type checks (upstream's
messages) on temporary files, emptyDir directory modes and tmpfs sizes, subPath and
subPathExpr checks, volumeMounts → CRI mounts (read-only, propagation, SELinux
relabelling, unknown volumes), the mount table parser, safe removal (the table read
once per removal, again only after an unmount; a tmpfs content volume's later syncs
read none), the manager with
fake plugins (unsupported types, failures, tear-down, orphaned pod directories), its
volume_manager_total_volumes, storage_operation_duration_seconds and
volume_operation_total_seconds (a mount's end-to-end time from the first attempt, told
only on success), and PodSyncer's FailedMount handling on the fake runtime."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from klet.cri.types import Device, Mount, MountPropagation
from klet.model.types import JSON
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.metrics import storage_operations, volume_counts, volume_operation_totals
from klet.syncloop.volumes import fs, mounts
from klet.syncloop.volumes.base import Block, VolumeContext, VolumeError, volume_type
from klet.syncloop.volumes.content import DownwardAPIPlugin, ProjectedPlugin, SecretPlugin
from klet.syncloop.volumes.emptydir import EmptyDirPlugin, directory_mode, tmpfs_size
from klet.syncloop.volumes.hostpath import HostPathPlugin, check_type
from klet.syncloop.volumes.manager import VolumeManager
from klet.syncloop.volumes.mounts import MountConfigError
from klet.syncloop.volumes.subpath import SubPathMounter
from prometheus_client import CollectorRegistry

from .helpers import pod
from .test_subpath import RecordingBinder
from .test_syncpod import World

# -- hostPath -----------------------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    sock.close()
    os.mkfifo(tmp_path / "fifo")
    return {
        "dir": str(tmp_path / "dir"),
        "file": str(tmp_path / "file"),
        "sock": str(tmp_path / "sock"),
        "fifo": str(tmp_path / "fifo"),
        "missing": str(tmp_path / "missing"),
        "null": "/dev/null",
    }


NOT_A = "hostPath type check failed: {p} is not a "


@pytest.mark.parametrize(
    ("what", "path_type", "error"),
    [
        ("missing", "", None),
        ("dir", "Directory", None),
        ("file", "File", None),
        ("sock", "Socket", None),
        ("null", "CharDevice", None),
        ("dir", "DirectoryOrCreate", None),
        ("file", "FileOrCreate", None),
        ("file", "Directory", NOT_A + "directory, it's a File"),
        ("dir", "File", NOT_A + "file, it's a Directory"),
        ("dir", "FileOrCreate", NOT_A + "file, it's a Directory"),
        ("file", "DirectoryOrCreate", NOT_A + "directory, it's a File"),
        ("file", "Socket", NOT_A + "socket file, it's a File"),
        ("dir", "CharDevice", NOT_A + "character device, it's a Directory"),
        ("null", "BlockDevice", NOT_A + "block device, it's a CharDevice"),
        ("missing", "Directory", "hostPath {p} doesn't exist"),
        ("missing", "File", "hostPath {p} doesn't exist"),
        ("missing", "BlockDevice", "hostPath {p} doesn't exist"),
        (
            "fifo",
            "File",
            "hostPath type check failed, {p} is not a file, unable to determine its type: "
            "only recognise file, directory, socket, block device and character device",
        ),
        ("dir", "Pipe", "Pipe is an invalid volume type"),
    ],
)
def test_host_path_type_checks(
    host: dict[str, str], what: str, path_type: str, error: str | None
) -> None:
    if error is None:
        check_type(host[what], path_type=path_type)
    else:
        with pytest.raises(VolumeError) as err:
            check_type(host[what], path_type=path_type)
        assert str(err.value) == error.format(p=host[what])


def test_host_path_or_create_makes_what_is_missing(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        check_type(str(tmp_path / "a" / "b"), path_type="DirectoryOrCreate")
        check_type(str(tmp_path / "f"), path_type="FileOrCreate")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o755
    assert (tmp_path / "f").is_file() and (tmp_path / "f").read_text() == ""
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644
    with pytest.raises(VolumeError, match=r"^open .*/f/x: not a directory$"):
        check_type(str(tmp_path / "f" / "x"), path_type="FileOrCreate")


def test_host_path_is_checked_and_created_on_the_host_seen_from_a_pod(tmp_path: Path) -> None:
    """A syncloop in a pod (hostPID) reaches the host's files under /proc/1/root: the
    *OrCreate types create there, not in its own container, and a path its container
    has but the host lacks does not exist; messages name the pod's path."""
    host = tmp_path / "host"  # stands for /proc/1/root: another root than ours
    host.mkdir()
    wanted = tmp_path / "data" / "dir"
    check_type(str(wanted), path_type="DirectoryOrCreate", host_root=host)
    assert (host / wanted.relative_to("/")).is_dir()
    assert not wanted.exists()
    check_type(str(wanted), path_type="Directory", host_root=host)
    here_only = tmp_path / "here-only"
    here_only.mkdir()
    with pytest.raises(VolumeError, match=f"^hostPath {here_only} doesn't exist$"):
        check_type(str(here_only), path_type="Directory", host_root=host)
    (host / wanted.relative_to("/") / "f").write_text("")
    with pytest.raises(VolumeError, match=f"^hostPath type check failed: {wanted}/f is not a"):
        check_type(str(wanted / "f"), path_type="Directory", host_root=host)


async def test_host_path_plugin_returns_the_path_itself(tmp_path: Path) -> None:
    plugin = HostPathPlugin()
    volume = {"name": "h", "hostPath": {"path": str(tmp_path / "new"), "type": "DirectoryOrCreate"}}
    assert plugin.handles(volume) and not plugin.handles({"name": "e", "emptyDir": {}})
    assert await plugin.set_up(volume, ctx(tmp_path)) == tmp_path / "new"
    assert (tmp_path / "new").is_dir()
    assert not (tmp_path / "pods").exists()  # nothing under the pod directory


# -- emptyDir -----------------------------------------------------------------------------


def ctx(tmp_path: Path, p: JSON | None = None, *, memory: int = 8 << 30) -> VolumeContext:
    return VolumeContext(
        pod=p or pod("app"),
        pod_dir=tmp_path / "pods" / "u1",
        objects=None,
        tokens=None,
        node=NodeFacts(memory_bytes=memory),
        pod_ip="10.0.0.9",
    )


def limited(*limits: str | None) -> JSON:
    p = pod(*[f"c{i}" for i in range(len(limits))])
    for c, limit in zip(p["spec"]["containers"], limits, strict=True):
        if limit is not None:
            c["resources"] = {"limits": {"memory": limit}}
    return p


GI = 1 << 30


@pytest.mark.parametrize(
    ("p", "size_limit", "node", "expected"),
    [
        (limited(None), None, 8 * GI, 8 * GI),  # the node's memory
        (limited(None), "1Gi", 8 * GI, GI),  # sizeLimit below it
        (limited(None), "16Gi", 8 * GI, 8 * GI),  # never above the node
        (limited("2Gi", "1Gi"), None, 8 * GI, 3 * GI),  # every container limited: the sum
        (limited("2Gi", None), None, 8 * GI, 8 * GI),  # one unlimited: no pod limit
        (limited("2Gi"), "1Gi", 8 * GI, GI),
        (limited("2Gi"), "4Gi", 8 * GI, 2 * GI),  # the pod limit wins over a larger sizeLimit
        (limited(None), "0", 8 * GI, 8 * GI),  # zero: unset
        (limited(None), "64Mi", 0, 64 << 20),  # node memory unknown
        (limited(None), None, 0, 0),  # nothing known: the kernel's default
    ],
)
def test_tmpfs_size_is_the_smallest_limit(
    p: JSON, size_limit: str | None, node: int, expected: int
) -> None:
    source = {"medium": "Memory", **({"sizeLimit": size_limit} if size_limit else {})}
    assert tmpfs_size(p, source, node_memory_bytes=node) == expected


def test_tmpfs_size_rejects_a_bad_quantity() -> None:
    with pytest.raises(VolumeError, match="invalid sizeLimit"):
        tmpfs_size(pod("a"), {"sizeLimit": "lots"}, node_memory_bytes=GI)


def test_empty_dir_mode() -> None:
    assert directory_mode({}) == 0o777
    assert directory_mode({"stickyBit": True}) == 0o1777


async def test_empty_dir_on_disk_is_world_writable_and_idempotent(tmp_path: Path) -> None:
    plugin = EmptyDirPlugin()
    volume = {"name": "scratch", "emptyDir": {}}
    path = await plugin.set_up(volume, ctx(tmp_path))
    assert path == tmp_path / "pods/u1/volumes/kubernetes.io~empty-dir/scratch"
    assert stat.S_IMODE(path.stat().st_mode) == 0o777
    (path / "kept").write_text("data")
    assert await plugin.set_up(volume, ctx(tmp_path)) == path
    assert (path / "kept").read_text() == "data"
    await plugin.tear_down(path)
    assert not path.exists()


async def test_empty_dir_with_fs_group_gets_the_group_and_setgid(tmp_path: Path) -> None:
    p = pod("app", securityContext={"fsGroup": 4321})
    path = await EmptyDirPlugin().set_up({"name": "g", "emptyDir": {}}, ctx(tmp_path, p))
    st = path.stat()
    assert st.st_gid == 4321 and stat.S_IMODE(st.st_mode) == 0o2777


async def test_empty_dir_refuses_other_media(tmp_path: Path) -> None:
    with pytest.raises(VolumeError, match='unsupported storage medium "HugePages"'):
        await EmptyDirPlugin().set_up(
            {"name": "h", "emptyDir": {"medium": "HugePages"}}, ctx(tmp_path)
        )


# -- subPath, subPathExpr, propagation ----------------------------------------------------


@pytest.mark.parametrize(
    ("sub_path", "error"),
    [
        ("a", None),
        ("a/b/c", None),
        ("a..b/..c", None),
        ("/etc", "error SubPath `/etc` must not be an absolute path"),
        ("..", "unable to provision SubPath `..`: must not contain '..'"),
        ("a/../../b", "unable to provision SubPath `a/../../b`: must not contain '..'"),
    ],
)
def test_subpath_validation(sub_path: str, error: str | None) -> None:
    if error is None:
        mounts.validate_subpath(sub_path)
    else:
        with pytest.raises(MountConfigError) as err:
            mounts.validate_subpath(sub_path)
        assert str(err.value) == error


@pytest.mark.parametrize(
    ("expr", "env", "result"),
    [
        ("$(POD)/logs", {"POD": "web"}, "web/logs"),
        ("$(A)-$(B)", {"A": "1", "B": "2"}, "1-2"),
        ("$$(A)", {"A": "1"}, "$(A)"),
        ("plain", {}, "plain"),
        ("$(B)/$(A)", {}, "missing value for A, B"),
        ("$(A)", {"A": ""}, "missing value for A"),
    ],
)
def test_subpath_expr_expansion(expr: str, env: dict[str, str], result: str) -> None:
    if result.startswith("missing"):
        with pytest.raises(MountConfigError) as err:
            mounts.expand_subpath_expr(expr, env=env)
        assert str(err.value) == result
    else:
        assert mounts.expand_subpath_expr(expr, env=env) == result


def test_subpath_failures_name_the_mount_the_container_and_the_subpath(tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "escape").symlink_to(tmp_path)
    (tmp_path / "pod").mkdir()
    mounter = SubPathMounter(tmp_path / "pod", RecordingBinder())
    with pytest.raises(MountConfigError) as err:
        mounts.prepare_subpath(
            volume, sub_path="escape/x", mounter=mounter, mount_name="v", container="c", index=0
        )
    assert str(err.value) == (
        'failed to prepare subPath for volumeMount "v" of container "c": subPath `escape/x`: '
        f"'escape/x' resolves to {tmp_path}/x, outside the volume"
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (None, MountPropagation.PRIVATE),
        ("None", MountPropagation.PRIVATE),
        ("HostToContainer", MountPropagation.HOST_TO_CONTAINER),
        ("Bidirectional", MountPropagation.BIDIRECTIONAL),
    ],
)
def test_propagation_mapping(mode: str | None, expected: MountPropagation) -> None:
    assert mounts.propagation(mode) == expected


def test_unknown_propagation_is_refused() -> None:
    with pytest.raises(MountConfigError, match='invalid MountPropagation mode: "Sideways"'):
        mounts.propagation("Sideways")


def volume_pod(tmp_path: Path, *mount_specs: JSON, privileged: bool = False) -> JSON:
    p = pod("app", inits=("setup",))
    p["spec"]["volumes"] = [
        {"name": "data", "emptyDir": {}},
        {"name": "host", "hostPath": {"path": str(tmp_path)}},
        {"name": "config", "configMap": {"name": "cm"}},
    ]
    app = p["spec"]["containers"][0]
    app["volumeMounts"] = list(mount_specs)
    if privileged:
        app["securityContext"] = {"privileged": True}
    return p


def build(
    tmp_path: Path,
    p: JSON,
    env: dict[str, str] | None = None,
    binder: RecordingBinder | None = None,
) -> tuple[Mount, ...]:
    volumes = {"data": tmp_path / "data", "host": tmp_path, "config": tmp_path / "config"}
    for path in volumes.values():
        path.mkdir(exist_ok=True)
    (tmp_path / "pod").mkdir(exist_ok=True)
    return mounts.container_mounts(
        p,
        p["spec"]["containers"][0],
        volumes=volumes,
        env=(env or {}).items(),
        subpaths=SubPathMounter(tmp_path / "pod", binder or RecordingBinder()),
    )


def test_container_mounts(tmp_path: Path) -> None:
    p = volume_pod(
        tmp_path,
        {"name": "data", "mountPath": "/data"},
        {"name": "data", "mountPath": "/ro", "readOnly": True},
        {"name": "config", "mountPath": "/etc/app"},
        {"name": "host", "mountPath": "relative/x", "mountPropagation": "HostToContainer"},
        {"name": "data", "mountPath": "/logs", "subPathExpr": "logs/$(POD_NAME)"},
    )
    binder = RecordingBinder()
    got = build(tmp_path, p, {"POD_NAME": "web"}, binder)
    target = tmp_path / "pod" / "volume-subpaths" / "data" / "app" / "4"
    assert got == (
        Mount("/data", str(tmp_path / "data"), selinux_relabel=True),
        Mount("/ro", str(tmp_path / "data"), readonly=True, selinux_relabel=True),
        Mount("/etc/app", str(tmp_path / "config"), readonly=True, selinux_relabel=True),
        Mount("/relative/x", str(tmp_path), propagation=MountPropagation.HOST_TO_CONTAINER),
        Mount("/logs", str(target), selinux_relabel=True),
    )
    assert (tmp_path / "data" / "logs" / "web").is_dir()
    # the runtime gets the bind mount of the opened directory, not the volume's path
    assert binder.bound == {target: str(tmp_path / "data" / "logs" / "web")}


def test_unknown_volume_is_a_config_error(tmp_path: Path) -> None:
    p = volume_pod(tmp_path, {"name": "nope", "mountPath": "/x"})
    with pytest.raises(MountConfigError) as err:
        build(tmp_path, p)
    assert str(err.value) == 'cannot find volume "nope" to mount into container "app"'


def test_bidirectional_needs_a_privileged_container(tmp_path: Path) -> None:
    spec = {"name": "host", "mountPath": "/h", "mountPropagation": "Bidirectional"}
    with pytest.raises(MountConfigError) as err:
        build(tmp_path, volume_pod(tmp_path, spec))
    assert str(err.value) == (
        "spec.containers[0].volumeMounts[0].mountPropagation: Forbidden: Bidirectional mount "
        "propagation is available only to privileged containers"
    )
    [m] = build(tmp_path, volume_pod(tmp_path, spec, privileged=True))
    assert m.propagation == MountPropagation.BIDIRECTIONAL


def test_recursive_read_only(tmp_path: Path) -> None:
    spec: dict[str, Any] = {"name": "data", "mountPath": "/d", "readOnly": True}
    [m] = build(tmp_path, volume_pod(tmp_path, {**spec, "recursiveReadOnly": "IfPossible"}))
    assert m.readonly
    with pytest.raises(MountConfigError, match="but it is not supported by the runtime"):
        build(tmp_path, volume_pod(tmp_path, {**spec, "recursiveReadOnly": "Enabled"}))


def test_subpath_errors_surface(tmp_path: Path) -> None:
    def with_mount(**fields: str) -> JSON:
        return volume_pod(tmp_path, {"name": "data", "mountPath": "/x", **fields})

    with pytest.raises(MountConfigError, match="missing value for NODE"):
        build(tmp_path, with_mount(subPathExpr="$(NODE)"))
    with pytest.raises(MountConfigError, match="must not contain '..'"):
        build(tmp_path, with_mount(subPath="../x"))
    with pytest.raises(MountConfigError, match="must not contain '..'"):
        build(tmp_path, with_mount(subPathExpr="$(D)"), {"D": "a/.."})


# -- the mount table and safe removal ------------------------------------------------------


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/mem rw - tmpfs tmpfs rw
31 22 0:41 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/mem/inner rw - tmpfs tmpfs rw
32 22 0:42 / /var/lib/kubelet/pods/u10/a\\040b rw - tmpfs tmpfs rw
33 22 0:43 / /mnt/with\\134slash rw shared:2 master:1 - nfs srv:/x rw
"""  # fmt: skip


def test_parse_mountinfo_unescapes_and_skips_optional_fields() -> None:
    table = fs.parse_mountinfo(MOUNTINFO)
    assert table[0] == ("/", "ext4")
    assert ("/var/lib/kubelet/pods/u10/a b", "tmpfs") in table
    assert ("/mnt/with\\slash", "nfs") in table


def test_mounts_under_lists_deepest_first_and_only_below() -> None:
    table = fs.parse_mountinfo(MOUNTINFO)
    base = "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/mem"
    assert fs.mounts_under(Path("/var/lib/kubelet/pods/u1"), table) == [f"{base}/inner", base]
    assert fs.mounts_under(Path("/var/lib/kubelet/pods/u"), table) == []


def test_mounts_naming_a_path_parse_only_its_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fs, "read_mountinfo", lambda: MOUNTINFO)
    everything = fs.parse_mountinfo(MOUNTINFO)
    assert fs.mounts() == everything
    # an escaped name is looked for as mountinfo prints it
    assert fs.mounts("/var/lib/kubelet/pods/u10/a b") == [
        ("/var/lib/kubelet/pods/u10/a b", "tmpfs")
    ]
    assert fs.mounts("/mnt/with\\slash") == [("/mnt/with\\slash", "nfs")]
    for top in ("/var/lib/kubelet/pods/u1", "/var/lib/kubelet/pods", "/"):
        assert fs.mounts_under(Path(top)) == fs.mounts_under(Path(top), everything)
    base = "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/mem"
    assert fs.fs_type(Path(base)) == "tmpfs"
    assert fs.fs_type(Path("/var/lib/kubelet/pods/u1")) is None


class MountTable:
    """/proc/self/mountinfo as `fs` reads it: counts the reads; `unmount` takes the last
    mount at a point away (a stacked one stays), as umount(8) does."""

    def __init__(self, points: list[str]) -> None:
        self.points = list(points)
        self.reads = 0
        self.unmounted: list[str] = []

    def read(self) -> str:
        self.reads += 1
        return "".join(
            f"{40 + i} 22 0:{40 + i} / {fs._escape(p)} rw - tmpfs tmpfs rw\n"
            for i, p in enumerate(self.points)
        )

    async def unmount(self, path: Path) -> None:
        self.unmounted.append(str(path))
        last = len(self.points) - 1 - self.points[::-1].index(str(path))
        del self.points[last]


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> MountTable:
    t = MountTable([])
    monkeypatch.setattr(fs, "read_mountinfo", t.read)
    monkeypatch.setattr(fs, "unmount", t.unmount)
    return t


async def test_remove_tree_reads_the_mount_table_once_when_nothing_is_mounted(
    tmp_path: Path, table: MountTable
) -> None:
    """Issue 42: every volume of a pod torn down read the whole table twice."""
    tree = tmp_path / "volumes" / "kubernetes.io~empty-dir" / "data"
    tree.mkdir(parents=True)
    (tree / "f").write_text("x")
    table.points = [str(tmp_path / "elsewhere")]
    assert await fs.remove_tree(tree) == []
    assert not tree.exists()
    assert table.reads == 1
    assert await fs.remove_tree(tree) == []  # gone: no read at all
    assert table.reads == 1


async def test_remove_tree_reads_again_after_unmounting(tmp_path: Path, table: MountTable) -> None:
    tree = tmp_path / "vol"
    (tree / "inner").mkdir(parents=True)
    table.points = [str(tree), str(tree / "inner")]
    assert await fs.remove_tree(tree) == []
    assert table.unmounted == [str(tree / "inner"), str(tree)]
    assert table.reads == 2
    assert not tree.exists()


async def test_remove_tree_keeps_what_a_stacked_mount_still_holds(
    tmp_path: Path, table: MountTable
) -> None:
    tree = tmp_path / "vol"
    tree.mkdir()
    (tree / "content").write_text("on the lower tmpfs")
    table.points = [str(tree), str(tree)]  # mounted twice at one point
    problems = await fs.remove_tree(tree)
    assert problems == [f"{tree} is still a mount point: not removed"]
    assert table.reads == 2
    assert (tree / "content").read_text() == "on the lower tmpfs"


def test_likely_mount_point_compares_devices_without_the_table(
    tmp_path: Path, table: MountTable
) -> None:
    (tmp_path / "dir").mkdir()
    assert not fs.likely_mount_point(tmp_path / "dir")
    assert not fs.likely_mount_point(tmp_path / "missing")
    assert fs.likely_mount_point(Path("/proc"))  # procfs, another device than /
    assert table.reads == 0


async def test_a_tmpfs_content_volume_already_mounted_is_not_looked_up_again(
    tmp_path: Path, table: MountTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A downwardAPI, projected or secret volume's set-up at every sync of a running pod:
    its tmpfs is there (the directory's device is not its parent's), so no mount and no
    read of the mount table."""
    mounted: list[Path] = []

    async def mount_tmpfs(path: Path, *, options: tuple[str, ...] = ()) -> None:
        mounted.append(path)

    monkeypatch.setattr(fs, "mount_tmpfs", mount_tmpfs)
    here = {"mounted": False}
    monkeypatch.setattr(fs, "likely_mount_point", lambda path: here["mounted"])
    plugin = DownwardAPIPlugin()
    context = ctx(tmp_path, pod(), memory=1 << 30)
    items = [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
    volume = {"name": "info", "downwardAPI": {"items": items}}
    await plugin.set_up(volume, context)
    assert len(mounted) == 1  # the first sync mounts
    here["mounted"] = True
    for _ in range(3):
        await plugin.set_up(volume, context)
    assert len(mounted) == 1
    assert table.reads == 0


async def _a_downward_api_volume_on_a_fake_tmpfs(
    tmp_path: Path, table: MountTable, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A downwardAPI volume set up on a pretend tmpfs: the table lists its directory and
    `likely_mount_point` says so; unmounting it takes what the tmpfs held away."""
    monkeypatch.setattr(fs, "mount_tmpfs", lambda path, *, options=(): asyncio.sleep(0))
    monkeypatch.setattr(fs, "likely_mount_point", lambda path: str(path) in table.points)
    items = [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
    path = await DownwardAPIPlugin().set_up(
        {"name": "info", "downwardAPI": {"items": items}}, ctx(tmp_path, pod(), memory=1 << 30)
    )
    table.points.append(str(path))
    umount = table.unmount

    async def unmount(point: Path) -> None:
        if any(p.startswith(f"{point}/") for p in table.points):
            raise fs.MountError(f"umount {point} failed: exit status 32: target is busy")
        await umount(point)
        for entry in os.scandir(point):  # the tmpfs' content goes with it
            if entry.is_dir(follow_symlinks=False) and not entry.is_symlink():
                for inner in os.scandir(entry.path):
                    os.unlink(inner.path)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)

    monkeypatch.setattr(fs, "unmount", unmount)
    return path


@pytest.mark.parametrize("plugin", [DownwardAPIPlugin, ProjectedPlugin, SecretPlugin])
async def test_a_tmpfs_content_volume_goes_without_reading_the_mount_table(
    tmp_path: Path,
    table: MountTable,
    monkeypatch: pytest.MonkeyPatch,
    plugin: type[DownwardAPIPlugin | ProjectedPlugin | SecretPlugin],
) -> None:
    """Issue 42's count: a secret, projected (every pod's kube-api-access) or downwardAPI
    volume's tear-down unmounts its own tmpfs and rmdirs the directory: no read of the
    mount table (two before)."""
    path = await _a_downward_api_volume_on_a_fake_tmpfs(tmp_path, table, monkeypatch)
    await plugin().tear_down(path)
    assert table.unmounted == [str(path)]
    assert not path.exists()
    assert table.reads == 0


async def test_a_mount_below_a_tmpfs_content_volume_is_removed_the_careful_way(
    tmp_path: Path, table: MountTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """umount refuses a tmpfs with a mount below it: the tear-down falls back to the
    mount table, unmounting deepest first, and removes the rest."""
    path = await _a_downward_api_volume_on_a_fake_tmpfs(tmp_path, table, monkeypatch)
    (path / "inner").mkdir()
    table.points.append(str(path / "inner"))
    await DownwardAPIPlugin().tear_down(path)
    assert table.unmounted == [str(path / "inner"), str(path)]
    assert not path.exists()
    assert table.reads == 2


async def test_remove_tree_deletes_plain_directories_and_not_symlink_targets(
    tmp_path: Path,
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "precious").write_text("keep")
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    (tree / "link").symlink_to(target)
    assert await fs.remove_tree(tree) == []
    assert not tree.exists()
    assert (target / "precious").read_text() == "keep"
    assert await fs.remove_tree(tree) == []  # already gone


# -- the manager with fake plugins --------------------------------------------------------


class FakePlugin:
    """Sets up a directory per volume of kind `fake`; fails when the volume says so."""

    dir_name = "klet.test~fake"

    def __init__(self) -> None:
        self.torn_down: list[Path] = []

    def handles(self, volume: JSON) -> bool:
        return "fake" in volume

    async def set_up(self, volume: JSON, ctx: VolumeContext) -> Path | Block:
        if volume["fake"].get("device"):
            return Block(Path(volume["fake"]["device"]))
        fail = volume["fake"].get("fail")
        if fail == "volume":
            raise VolumeError("the fake volume refuses")
        if fail == "os":
            raise PermissionError(13, "Permission denied", "/somewhere")
        path = ctx.volume_dir(self, volume["name"])
        path.mkdir(parents=True, exist_ok=True)
        (path / "content").write_text(volume["name"])
        return path

    async def tear_down(self, path: Path) -> None:
        self.torn_down.append(path)
        assert await fs.remove_tree(path) == []


def manager(tmp_path: Path) -> tuple[VolumeManager, FakePlugin]:
    plugin = FakePlugin()
    return VolumeManager([plugin], root_dir=tmp_path, node=NodeFacts()), plugin


def with_volumes(*volumes: JSON, uid: str = "u1") -> JSON:
    p = pod("app", uid=uid)
    p["spec"]["volumes"] = list(volumes)
    return p


async def test_manager_sets_up_every_volume_and_reports_each_failure(tmp_path: Path) -> None:
    m, _ = manager(tmp_path)
    p = with_volumes(
        {"name": "a", "fake": {}},
        {"name": "b", "fake": {"fail": "volume"}},
        {"name": "c", "fake": {"fail": "os"}},
        {"name": "claim", "persistentVolumeClaim": {"claimName": "x"}},
        {"name": "csi", "csi": {"driver": "d"}},
        {"name": "eph", "ephemeral": {"volumeClaimTemplate": {}}},
        {"name": "empty"},
    )
    got = await m.set_up(p, pod_ip="10.0.0.1")
    assert got.paths == {"a": tmp_path / "pods/u1/volumes/klet.test~fake/a"}
    assert got.failures == {
        "b": "the fake volume refuses",
        "c": "Permission denied: /somewhere",
        "claim": 'unsupported volume type "persistentVolumeClaim": '
        "klet does not implement this volume type",
        "csi": 'unsupported volume type "csi": klet does not implement this volume type',
        "eph": 'unsupported volume type "ephemeral": klet does not implement this volume type',
        "empty": "unsupported volume type: the volume names no source",
    }


async def test_a_block_volume_is_a_device_for_volume_devices_only(tmp_path: Path) -> None:
    m, _ = manager(tmp_path)
    p = with_volumes({"name": "raw", "fake": {"device": "/dev/loop7"}}, {"name": "fs", "fake": {}})
    got = await m.set_up(p, pod_ip="10.0.0.1")
    assert got.devices == {"raw": Block(Path("/dev/loop7"))} and set(got.paths) == {"fs"}
    container = {"name": "db", "volumeDevices": [{"name": "raw", "devicePath": "/dev/xvda"}]}
    assert mounts.container_devices(container, devices=got.devices, volumes=got.paths) == (
        Device(container_path="/dev/xvda", host_path="/dev/loop7", permissions="mrw"),
    )
    wrong = {"name": "db", "volumeDevices": [{"name": "fs", "devicePath": "/dev/xvda"}]}
    with pytest.raises(MountConfigError, match='"fs" has volumeMode Filesystem, but is specified'):
        mounts.container_devices(wrong, devices=got.devices, volumes=got.paths)
    missing = {"name": "db", "volumeDevices": [{"name": "nope", "devicePath": "/dev/x"}]}
    with pytest.raises(MountConfigError, match='cannot find volume "nope" to use as a device'):
        mounts.container_devices(missing, devices=got.devices, volumes=got.paths)
    mounted = {"name": "db", "volumeMounts": [{"name": "raw", "mountPath": "/raw"}]}
    with pytest.raises(MountConfigError, match='"raw" has volumeMode Block, but is specified'):
        mounts.container_mounts(
            p, mounted, volumes=got.paths, env=(), subpaths=None, devices=got.devices
        )


def empty_dir_and_host_path(tmp_path: Path, **metrics: Any) -> VolumeManager:
    """A VolumeManager of the emptyDir and hostPath plugins rooted at `tmp_path`, with
    the metrics given (`counts`, `operations`, `totals`)."""
    return VolumeManager(
        [EmptyDirPlugin(), HostPathPlugin()], root_dir=tmp_path, node=NodeFacts(), **metrics
    )


async def test_a_pods_tear_down_reads_the_mount_table_once_per_removal(
    tmp_path: Path, table: MountTable
) -> None:
    """Issue 42's count: a pod with two on-disk volumes torn down reads the table once
    per volume (it read each twice, and its `volumes` directory twice more: emptied, that
    goes by rmdir), and nothing for the subPath directory it never had."""
    m = empty_dir_and_host_path(tmp_path)
    p = with_volumes({"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}})
    result = await m.set_up(p, pod_ip="")
    assert set(result.paths) == {"a", "b"} and table.reads == 0
    assert await m.tear_down("u1") == []
    assert table.reads == 2
    assert not (tmp_path / "pods" / "u1" / "volumes").exists()


async def test_what_the_volume_walk_leaves_is_removed_the_careful_way(
    tmp_path: Path, table: MountTable
) -> None:
    """A stray file beside the plugin directories keeps rmdir from removing `volumes`:
    fs.remove_tree (one more read of the table) removes it."""
    m = empty_dir_and_host_path(tmp_path)
    await m.set_up(with_volumes({"name": "a", "emptyDir": {}}), pod_ip="")
    volumes = tmp_path / "pods" / "u1" / "volumes"
    (volumes / "stray").write_text("x")
    assert await m.tear_down("u1") == []
    assert table.reads == 2
    assert not volumes.exists()


async def test_volume_manager_total_volumes(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    m = empty_dir_and_host_path(tmp_path, counts=volume_counts(registry))
    p = with_volumes(
        {"name": "a", "emptyDir": {}},
        {"name": "b", "emptyDir": {}},
        {"name": "gone", "hostPath": {"path": str(tmp_path / "nope"), "type": "Directory"}},
    )
    await m.set_up(p, pod_ip="10.0.0.1")

    def value(plugin: str, state: str) -> float | None:
        labels = {"plugin_name": plugin, "state": state}
        return registry.get_sample_value("volume_manager_total_volumes", labels)

    assert value("kubernetes.io/empty-dir", "desired_state_of_world") == 2
    assert value("kubernetes.io/empty-dir", "actual_state_of_world") == 2
    assert value("kubernetes.io/host-path", "desired_state_of_world") == 1
    assert value("kubernetes.io/host-path", "actual_state_of_world") is None  # not set up
    assert await m.tear_down("u1") == []
    assert value("kubernetes.io/empty-dir", "desired_state_of_world") is None


async def test_storage_operations_are_timed_as_upstream_names_them(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    m = empty_dir_and_host_path(tmp_path, operations=storage_operations(registry))
    p = with_volumes(
        {"name": "a", "emptyDir": {}},
        {"name": "gone", "hostPath": {"path": str(tmp_path / "nope"), "type": "Directory"}},
    )

    def count(plugin: str, operation: str, status: str) -> float | None:
        labels = {
            "volume_plugin": plugin,
            "operation_name": operation,
            "status": status,
            "migrated": "false",
        }
        return registry.get_sample_value("storage_operation_duration_seconds_count", labels)

    await m.set_up(p, pod_ip="10.0.0.1")
    await m.set_up(p, pod_ip="10.0.0.1")  # the emptyDir is ready: no second mount
    assert count("kubernetes.io/empty-dir", "volume_mount", "success") == 1
    # the hostPath that fails is tried, and counted, at each sync until it is ready
    assert count("kubernetes.io/host-path", "volume_mount", "fail-unknown") == 2
    assert await m.tear_down("u1") == []
    assert count("kubernetes.io/empty-dir", "volume_unmount", "success") == 1


async def test_a_mounts_end_to_end_time_runs_from_its_first_attempt(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    m = empty_dir_and_host_path(
        tmp_path, operations=storage_operations(registry), totals=volume_operation_totals(registry)
    )
    late = tmp_path / "late"
    p = with_volumes(
        {"name": "a", "emptyDir": {}},
        {"name": "late", "hostPath": {"path": str(late), "type": "Directory"}},
    )

    def total(plugin: str, what: str) -> float | None:
        labels = {"plugin_name": plugin, "operation_name": "overall_volume_mount"}
        return registry.get_sample_value(f"volume_operation_total_seconds_{what}", labels)

    await m.set_up(p, pod_ip="10.0.0.1")
    assert total("kubernetes.io/empty-dir", "count") == 1
    assert total("kubernetes.io/host-path", "count") is None  # failed: not told
    await asyncio.sleep(0.3)
    late.mkdir()
    await m.set_up(p, pod_ip="10.0.0.1")
    assert total("kubernetes.io/empty-dir", "count") == 1  # ready: no second mount
    assert total("kubernetes.io/host-path", "count") == 1
    # from the first, failed attempt: at least the 0.3 s slept before the retry
    waited = total("kubernetes.io/host-path", "sum")
    assert waited is not None and waited >= 0.3
    labels = {
        "plugin_name": "kubernetes.io/host-path",
        "operation_name": "overall_volume_mount",
        "le": "0.25",
    }
    assert registry.get_sample_value("volume_operation_total_seconds_bucket", labels) == 0
    assert await m.tear_down("u1") == []


def test_volume_type() -> None:
    assert volume_type({"name": "x", "secret": {}}) == "secret"
    assert volume_type({"name": "x"}) == ""


async def test_tear_down_uses_the_plugin_and_removes_unclaimed_directories(
    tmp_path: Path,
) -> None:
    m, plugin = manager(tmp_path)
    await m.set_up(with_volumes({"name": "a", "fake": {}}), pod_ip="")
    stray = tmp_path / "pods/u1/volumes/kubernetes.io~gone/old"
    stray.mkdir(parents=True)
    (stray / "f").write_text("x")
    (tmp_path / "pods/u1/containers").mkdir()  # not the volumes' business
    assert await m.tear_down("u1") == []
    assert plugin.torn_down == [tmp_path / "pods/u1/volumes/klet.test~fake/a"]
    assert not (tmp_path / "pods/u1/volumes").exists()
    assert (tmp_path / "pods/u1/containers").exists()
    assert await m.tear_down("u1") == []  # nothing left: nothing to do
    assert await m.tear_down("../etc") == ["invalid pod UID '../etc'"]


async def test_clean_orphans_keeps_the_pods_that_are_wanted_or_running(tmp_path: Path) -> None:
    m, _ = manager(tmp_path)
    for uid in ("keep", "gone"):
        await m.set_up(with_volumes({"name": "a", "fake": {}}, uid=uid), pod_ip="")
    (tmp_path / "pods/gone/etc-hosts").write_text("x")
    assert await m.clean_orphans(keep={"keep"}) == ["gone"]
    assert sorted(p.name for p in (tmp_path / "pods").iterdir()) == ["keep"]
    assert (tmp_path / "pods/keep/volumes/klet.test~fake/a/content").exists()


# -- PodSyncer: FailedMount, mounts in the container config ------------------------------


@pytest.fixture
def w(tmp_path: Path) -> World:
    world = World(tmp_path)
    world.syncer.volumes = VolumeManager(
        [EmptyDirPlugin(), HostPathPlugin()], root_dir=tmp_path / "root", node=NodeFacts()
    )
    return world


async def test_a_volume_that_fails_keeps_the_pod_creating_and_retries(
    w: World, tmp_path: Path
) -> None:
    missing = tmp_path / "later"
    p = pod("app")
    p["spec"]["volumes"] = [
        {"name": "data", "emptyDir": {}},
        {"name": "conf", "hostPath": {"path": str(missing), "type": "File"}},
    ]
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "conf", "mountPath": "/conf"}]
    result = await w.sync(p)
    assert result.waiting == {"app": ("ContainerCreating", "")}
    assert result.wake_at is not None and result.wake_at <= w.clock() + 10
    # As upstream, no sandbox is made before the volumes are there.
    assert w.cri.sandboxes == {} and w.cri.containers == {}
    [event] = w.events.of("FailedMount")
    assert (event.type, event.field_path) == ("Warning", "")
    assert event.message == (
        f'MountVolume.SetUp failed for volume "conf" : hostPath {missing} doesn\'t exist'
    )
    missing.write_text("now")
    result = await w.sync(p)
    assert result.waiting == {} and w.live() == ["app"]
    [m] = [m for m in w.latest("app").config.mounts if m.container_path == "/conf"]
    assert m.host_path == str(missing)


async def test_an_unknown_volume_mount_is_a_config_error(w: World) -> None:
    p = pod("app")
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "nope", "mountPath": "/x"}]
    result = await w.sync(p)
    reason, message = result.waiting["app"]
    assert reason == "CreateContainerConfigError"
    assert message == 'cannot find volume "nope" to mount into container "app"'
    assert [e.message for e in w.events.of("Failed")] == [f"Error: {message}"]


async def test_removing_the_pod_removes_its_volumes(w: World, tmp_path: Path) -> None:
    p = pod("app")
    p["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    await w.sync(p)
    volume = tmp_path / "root/pods/u1/volumes/kubernetes.io~empty-dir/data"
    [m] = [m for m in w.latest("app").config.mounts if m.container_path == "/data"]
    assert m.host_path == str(volume) and volume.is_dir()
    await w.syncer.kill_pod(p, await w.runtime.get("u1"), grace_override=None, remove=True)
    assert not (tmp_path / "root/pods/u1/volumes").exists()


async def test_a_new_pod_reads_its_objects_afresh_not_from_the_cache(tmp_path: Path) -> None:
    """The first set-up of a pod (and of a pod set up again after its tear-down) drops
    what the reader keeps of the pod's namespace; later set-ups of the same pod use it."""

    class Reader:
        def __init__(self) -> None:
            self.forgotten = 0
            self.namespaces: list[str] = []

        async def get_secret(self, namespace: str, name: str) -> JSON | None:
            return None

        async def get_configmap(self, namespace: str, name: str) -> JSON | None:
            return None

        async def list_services(self, namespace: str) -> list[JSON]:
            return []

        def forget_cached(self, namespace: str) -> None:
            self.forgotten += 1
            self.namespaces.append(namespace)

    reader = Reader()
    m = VolumeManager([FakePlugin()], root_dir=tmp_path, node=NodeFacts(), objects=reader)
    first = with_volumes({"name": "a", "fake": {}}, uid="u1")
    await m.set_up(first, pod_ip="10.0.0.1")
    assert reader.forgotten == 1
    await m.set_up(first, pod_ip="10.0.0.1")
    assert reader.forgotten == 1
    await m.set_up(with_volumes({"name": "a", "fake": {}}, uid="u2"), pod_ip="10.0.0.2")
    assert reader.forgotten == 2
    assert await m.tear_down("u1") == []
    await m.set_up(first, pod_ip="10.0.0.1")
    assert reader.forgotten == 3
    assert reader.namespaces == ["default"] * 3  # the pods' namespace (see test_images)
