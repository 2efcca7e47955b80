"""The kubelet-managed /etc/hosts: upstream's generated content (header, localhost and
IPv6 entries, the pod IPs with hostname and subdomain FQDN, the HostAliases section),
the host-network copy of the node's file, which containers get the mount (a pod IP is
known, the container does not mount /etc/hosts itself), the file written under
`<root>/pods/<uid>/etc-hosts` with mode 0644, errors as HostsFileError, and PodSyncer
mounting it into every container, waiting in CreateContainerConfigError when it cannot be
made, and removing it with the pod.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from klet.cri.types import Mount
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.environment import etchosts
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.environment.etchosts import HostsFileError
from klet.syncloop.pods.syncpod import PodSyncer
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import RecordedEvents, pod, wire

LOCALHOST = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "fe00::0\tip6-mcastprefix\n"
    "fe00::1\tip6-allnodes\n"
    "fe00::2\tip6-allrouters\n"
)
ALIASES = [
    {"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]},
    {"ip": "10.1.2.4", "hostnames": ["baz.remote"]},
]
ALIAS_SECTION = (
    "\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n10.1.2.4\tbaz.remote\n"
)


@pytest.mark.parametrize(
    ("ips", "domain", "aliases", "expected"),
    [
        (("10.88.0.7",), "", [], LOCALHOST + "10.88.0.7\tweb\n"),
        (
            ("10.88.0.7",),
            "db.ns1.svc.cluster.local",
            [],
            LOCALHOST + "10.88.0.7\tweb.db.ns1.svc.cluster.local\tweb\n",
        ),
        (
            ("10.88.0.7", "fd00::7"),
            "db.ns1.svc.cluster.local",
            ALIASES,
            LOCALHOST
            + "10.88.0.7\tweb.db.ns1.svc.cluster.local\tweb\n"
            + "fd00::7\tweb.db.ns1.svc.cluster.local\tweb\n"
            + ALIAS_SECTION,
        ),
        ((), "", ALIASES, LOCALHOST + ALIAS_SECTION),
    ],
)
def test_managed_content(
    ips: tuple[str, ...], domain: str, aliases: list[Any], expected: str
) -> None:
    content = etchosts.managed_content(ips, hostname="web", domain=domain, host_aliases=aliases)
    assert content == "# Kubernetes-managed hosts file.\n" + expected


def test_host_network_content_copies_the_node_file() -> None:
    node = "127.0.0.1 localhost\n192.168.5.5 node1\n"
    assert (
        etchosts.host_network_content(node, host_aliases=[])
        == "# Kubernetes-managed hosts file (host network).\n" + node
    )
    assert etchosts.host_network_content(node, host_aliases=ALIASES).endswith(node + ALIAS_SECTION)


@pytest.mark.parametrize(
    ("mounts", "ips", "wanted"),
    [
        ([], ("10.88.0.7",), True),
        ([{"name": "v", "mountPath": "/etc/hostsx"}], ("10.88.0.7",), True),
        ([{"name": "v", "mountPath": "/etc/hosts"}], ("10.88.0.7",), False),
        ([], (), False),  # no pod IP yet: the runtime's own file stays
    ],
)
def test_wants_hosts_file(mounts: list[Any], ips: tuple[str, ...], wanted: bool) -> None:
    assert etchosts.wants_hosts_file({"name": "c", "volumeMounts": mounts}, ips) is wanted


@pytest.mark.parametrize(
    ("host_network", "pod_ip", "expected"),
    [
        (False, "10.88.0.7", ("10.88.0.7",)),
        (False, "", ()),
        (True, "", ("10.0.0.5",)),  # a host-network pod has the node's addresses
    ],
)
def test_reported_pod_ips(host_network: bool, pod_ip: str, expected: tuple[str, ...]) -> None:
    p = pod("app", hostNetwork=host_network)
    assert etchosts.reported_pod_ips(p, pod_ip=pod_ip, node_ips=("10.0.0.5",)) == expected


def test_hosts_mount_writes_the_file(tmp_path: Path) -> None:
    p = pod("app", hostname="web", subdomain="db", hostAliases=ALIASES)
    mounts = etchosts.hosts_mount(
        tmp_path,
        p,
        p["spec"]["containers"][0],
        sandbox_id="s1",
        pod_ip="10.88.0.7",
        node_ips=("10.0.0.5",),
        cluster_domain="cluster.local",
    )
    path = tmp_path / "pods" / "u1" / "etc-hosts"
    assert mounts == (Mount(container_path="/etc/hosts", host_path=str(path)),)
    assert path.read_text() == (
        "# Kubernetes-managed hosts file.\n"
        + LOCALHOST
        + "10.88.0.7\tweb.db.default.svc.cluster.local\tweb\n"
        + ALIAS_SECTION
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    etchosts.remove_hosts_file(tmp_path, "u1")
    assert not path.exists()
    etchosts.remove_hosts_file(tmp_path, "u1")  # already gone: fine


@pytest.mark.parametrize(
    ("written_for", "exists", "expected"),
    [
        (None, False, True),  # a new pod
        ("s1", True, False),  # the same sandbox: never again, whatever runs in it
        ("s0", True, True),  # a new sandbox (a new IP): its own file
        (None, True, True),  # no record (written by an older klet)
        ("s1", False, True),  # the file went missing
    ],
)
def test_the_file_is_written_once_per_sandbox(
    written_for: str | None, exists: bool, expected: bool
) -> None:
    assert (
        etchosts.needs_writing(written_for=written_for, sandbox_id="s1", exists=exists) is expected
    )


def test_later_containers_of_a_sandbox_get_the_file_as_it_is(tmp_path: Path) -> None:
    p = pod("app", "side", hostname="web")
    kw: dict[str, Any] = {"pod_ip": "10.88.0.7", "node_ips": (), "cluster_domain": ""}
    [first] = etchosts.hosts_mount(tmp_path, p, p["spec"]["containers"][0], sandbox_id="s1", **kw)
    path = Path(first.host_path)
    with path.open("a") as f:  # what a running container may add to its /etc/hosts
        f.write("10.9.9.9\tadded-by-app\n")
    before = path.stat()
    for c in p["spec"]["containers"]:  # another container, a restart: same sandbox
        [again] = etchosts.hosts_mount(tmp_path, p, c, sandbox_id="s1", **kw)
        assert again == first
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert path.read_text().endswith("10.9.9.9\tadded-by-app\n")
    # a new sandbox with a new IP: a new file, renamed into place (not refilled in place)
    kw["pod_ip"] = "10.88.0.8"
    etchosts.hosts_mount(tmp_path, p, p["spec"]["containers"][0], sandbox_id="s2", **kw)
    assert path.stat().st_ino != before.st_ino
    assert "10.88.0.8\tweb\n" in path.read_text() and "added-by-app" not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    etchosts.remove_hosts_file(tmp_path, "u1")
    assert list((tmp_path / "pods" / "u1").iterdir()) == []


def test_hosts_mount_for_a_host_network_pod(tmp_path: Path) -> None:
    node = tmp_path / "node-hosts"
    node.write_text("192.168.5.5\tnode1\n")
    p = pod("app", hostNetwork=True, hostAliases=ALIASES[:1])
    [mount] = etchosts.hosts_mount(
        tmp_path,
        p,
        p["spec"]["containers"][0],
        sandbox_id="s1",
        pod_ip="",
        node_ips=("192.168.5.5",),
        cluster_domain="",
        node_hosts_file=str(node),
    )
    assert Path(mount.host_path).read_text() == (
        "# Kubernetes-managed hosts file (host network).\n192.168.5.5\tnode1\n"
        "\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"
    )


def test_hosts_mount_skips_what_does_not_want_one(tmp_path: Path) -> None:
    p = pod("app")
    own = {"name": "app", "volumeMounts": [{"name": "h", "mountPath": "/etc/hosts"}]}
    kw: dict[str, Any] = {"node_ips": ("10.0.0.5",), "cluster_domain": "", "sandbox_id": "s1"}
    assert etchosts.hosts_mount(tmp_path, p, own, pod_ip="10.88.0.7", **kw) == ()
    assert etchosts.hosts_mount(tmp_path, p, p["spec"]["containers"][0], pod_ip="", **kw) == ()
    assert not (tmp_path / "pods").exists()


def test_hosts_mount_errors(tmp_path: Path) -> None:
    p = pod("app", hostNetwork=True)
    missing = tmp_path / "no-hosts"
    with pytest.raises(HostsFileError) as err:
        etchosts.hosts_mount(
            tmp_path,
            p,
            p["spec"]["containers"][0],
            sandbox_id="s1",
            pod_ip="",
            node_ips=("10.0.0.5",),
            cluster_domain="",
            node_hosts_file=str(missing),
        )
    assert str(err.value) == f"open {missing}: no such file or directory"
    bad = pod("app", hostname="Bad_Name")
    with pytest.raises(HostsFileError, match='pod Hostname "Bad_Name" is not a valid DNS label'):
        etchosts.hosts_mount(
            tmp_path,
            bad,
            bad["spec"]["containers"][0],
            sandbox_id="s1",
            pod_ip="10.88.0.7",
            node_ips=(),
            cluster_domain="",
        )


# -- through PodSyncer on the fake runtime ----------------------------------------------------


def _syncer(tmp_path: Path) -> tuple[PodSyncer, FakeRuntimeService, RecordedEvents]:
    cri = FakeRuntimeService()
    cri.add_image("registry.klet.test/busybox:1.36", 1_000_000)
    events = RecordedEvents()
    sync = SyncSettings(
        pod_logs_dir=tmp_path / "logs",
        root_dir=tmp_path / "root",
        node=NodeFacts(host_ips=("10.0.0.5",)),
    )
    syncer = wire(tmp_path, cri, events=events, sync=sync).controller.syncer
    return syncer, cri, events


def _mounts(cri: FakeRuntimeService, name: str) -> dict[str, str]:
    [c] = [c for c in cri.containers.values() if c.config.name == name]
    return {m.container_path: m.host_path for m in c.config.mounts}


async def test_every_container_gets_the_file(tmp_path: Path) -> None:
    syncer, cri, _ = _syncer(tmp_path)
    p = pod("app", "side", hostname="web")
    await syncer.sync(p, await syncer.runtime.get("u1"))
    [sandbox] = cri.sandboxes.values()
    path = tmp_path / "root" / "pods" / "u1" / "etc-hosts"
    assert _mounts(cri, "app")["/etc/hosts"] == str(path)
    assert _mounts(cri, "side")["/etc/hosts"] == str(path)
    assert f"{sandbox.ip}\tweb\n" in path.read_text()
    # the pod's removal takes the file with it
    current = await syncer.runtime.get("u1")
    await syncer.kill_pod(p, current, grace_override=None, remove=True)
    assert not path.exists()


async def test_a_container_waits_when_the_file_cannot_be_made(
    tmp_path: Path,
) -> None:
    syncer, cri, events = _syncer(tmp_path)
    # a file where the pod directory should be: the hosts file cannot be written
    (tmp_path / "root" / "pods").mkdir(parents=True)
    (tmp_path / "root" / "pods" / "u1").write_text("")
    result = await syncer.sync(pod("app"), await syncer.runtime.get("u1"))
    reason, message = result.waiting["app"]
    assert reason == "CreateContainerConfigError"
    assert message.startswith(f"open {tmp_path / 'root' / 'pods' / 'u1'}")
    assert events.message("Failed") == f"Error: {message}"
    assert not [c for c in cri.containers.values() if c.config.name == "app"]
