"""The node layout (klet.model.layout): gRPC sockets under the run directory (each
server's in a directory of its own) and the Redis socket,
the per-service ports (unset = the default, 0 = any free port) and the replicas' port
files, each service's lease slots in a directory of its own, pod directories under the
root directory, pod cgroups by QoS class (and every candidate for a reader that does not
know the class), and pod log directory names read both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.model.layout import (
    DEFAULT_SERVICE_PORTS,
    EVICTION,
    GRPC_SERVERS,
    IMAGE_GC,
    SYNCLOOP,
    grpc_socket,
    grpc_socket_dir,
    holder_slot,
    kubepods,
    leader_slot,
    lease_slots_dir,
    node_cgroups,
    pod_cgroup,
    pod_cgroup_candidates,
    pod_dir,
    pod_log_dir_name,
    pod_log_dir_uid,
    pods_dir,
    port_file,
    port_files_dir,
    redis_socket,
    replica_name,
    resolve_service_port,
)


@pytest.mark.parametrize(
    ("service", "want"),
    [
        (SYNCLOOP, "/run/klet/grpc/syncloop/syncloop.sock"),
        (IMAGE_GC, "/run/klet/grpc/image-gc/image-gc.sock"),
        (EVICTION, "/run/klet/grpc/eviction/eviction.sock"),
    ],
)
def test_each_grpc_socket_lives_in_a_directory_of_its_servers_own(service: str, want: str) -> None:
    assert grpc_socket(Path("/run/klet"), service) == Path(want)
    assert grpc_socket(Path("/run/klet"), service).parent == grpc_socket_dir(
        Path("/run/klet"), service
    )


def test_no_two_servers_share_a_socket_directory() -> None:
    """A deployment mounts a client the directories of the sockets it calls: no
    directory may hold another server's socket (image-gc would reach PodControl)."""
    dirs = {grpc_socket_dir(Path("/run/klet"), s) for s in GRPC_SERVERS}
    assert len(dirs) == len(GRPC_SERVERS) == 3
    assert all(d.parent == Path("/run/klet/grpc") for d in dirs)


def test_redis_socket() -> None:
    assert redis_socket(Path("/run/klet")) == Path("/run/klet/redis/redis.sock")


def test_service_ports() -> None:
    assert dict(DEFAULT_SERVICE_PORTS) == {
        "pod-source": 10260,
        "syncloop": 10261,
        "status-reporter": 10262,
        "eviction": 10263,
        "image-gc": 10264,
    }


def test_resolve_service_port() -> None:
    assert resolve_service_port("eviction", None) == 10263
    assert resolve_service_port("eviction", 0) == 0  # any free port, not the default
    assert resolve_service_port("eviction", 7000) == 7000
    with pytest.raises(KeyError):
        resolve_service_port("kube-proxy", None)


def test_port_files_per_service_and_replica() -> None:
    run = Path("/run/klet")
    assert port_files_dir(run, "syncloop") == Path("/run/klet/ports/syncloop")
    assert replica_name("node-a", 812, "ab12") == "node-a-812-ab12"
    assert replica_name("../x y", 1, "t") == "_x_y-1-t"  # a file name, never a path
    assert replica_name("", 1, "t") == "host-1-t"
    assert port_file(run, "syncloop", "node-a-812") == Path(
        "/run/klet/ports/syncloop/node-a-812.json"
    )


def test_each_service_has_its_own_lease_slots_directory() -> None:
    """A deployment mounts `leases/<service>` for that service alone, so both of its
    slots are in it and no two services share one."""
    run = Path("/run/klet")
    dirs = {lease_slots_dir(run, s) for s in DEFAULT_SERVICE_PORTS}
    assert len(dirs) == len(DEFAULT_SERVICE_PORTS)
    assert holder_slot(run, "eviction") == Path("/run/klet/leases/eviction/holder")
    assert leader_slot(run, "eviction") == Path("/run/klet/leases/eviction/leader")
    for service in DEFAULT_SERVICE_PORTS:
        own = lease_slots_dir(run, service)
        assert own == run / "leases" / service
        assert holder_slot(run, service).parent == leader_slot(run, service).parent == own


def test_pod_dirs_under_the_root_dir() -> None:
    assert pods_dir(Path("/var/lib/kubelet")) == Path("/var/lib/kubelet/pods")
    assert pod_dir(Path("/var/lib/kubelet"), "u1") == Path("/var/lib/kubelet/pods/u1")


@pytest.mark.parametrize(
    ("qos", "want"),
    [
        ("Guaranteed", "/kubepods/podu1"),
        ("Burstable", "/kubepods/burstable/podu1"),
        ("BestEffort", "/kubepods/besteffort/podu1"),
    ],
)
def test_pod_cgroup_by_qos(qos: str, want: str) -> None:
    assert pod_cgroup("u1", qos, "/") == want
    assert pod_cgroup("u1", qos, "") == want
    assert pod_cgroup("u1", qos, "/node-a/") == "/node-a" + want
    assert want in pod_cgroup_candidates("u1", "/")
    assert "/node-a" + want in pod_cgroup_candidates("u1", "/node-a")


@pytest.mark.parametrize("root", ["/", "/a/b"])
def test_pod_cgroup_candidates_cover_exactly_the_qos_classes(root: str) -> None:
    assert pod_cgroup_candidates("u1", root) == tuple(
        pod_cgroup("u1", q, root) for q in ("Guaranteed", "Burstable", "BestEffort")
    )


def test_node_cgroups_under_the_cgroup_root() -> None:
    assert node_cgroups("/") == ("/kubepods", "/kubepods/burstable", "/kubepods/besteffort")
    assert node_cgroups("/t1")[0] == kubepods("/t1") == "/t1/kubepods"


def test_pod_log_dir_name_round_trips() -> None:
    name = pod_log_dir_name("kube-system", "dns-node1", "0b5c7d2e-1111")
    assert name == "kube-system_dns-node1_0b5c7d2e-1111"
    assert pod_log_dir_uid(name) == "0b5c7d2e-1111"


@pytest.mark.parametrize(
    ("name", "uid"),
    [
        ("default_web-node1_0b5c7d2e-1111-2222-3333-4444", "0b5c7d2e-1111-2222-3333-4444"),
        ("kube-system_dns_abc", "abc"),
        ("nounderscore", ""),
        ("a_b", ""),
        ("a_b_c_d", ""),
        ("a__c", ""),
    ],
)
def test_pod_log_dir_uid(name: str, uid: str) -> None:
    assert pod_log_dir_uid(name) == uid
