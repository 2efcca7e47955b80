"""docker-compose.yml and .env.example agree: the five services run `klet run <service>`
from one shared block (host network, restart policy, stop grace period, Redis's group,
the same flags, a health check through `klet healthcheck`), each with its own Redis user
and its own password file, mounted alone; each gets exactly the privileges, PID
namespace, kubeconfig and mounts of `confinement` (the table the compose tier checks the
running containers against): only syncloop privileged and in the host's PID namespace,
the others with every capability dropped but eviction's DAC_READ_SEARCH, no new
privileges and a read-only root filesystem, the kubeconfig for pod-source, syncloop and
status-reporter only, and of the kubernetes dir pod-source gets only the static pod
directory and the kubeconfig file (/dev/null standalone); the runtime socket for
syncloop and the `cri-proxy` container alone, which serves status-reporter, eviction and
image-gc each in a volume of its own (their runtime and image endpoint). The bus-acl
step may only chown; the Redis has no network, no persistence, no capability, a user of
its own, a read-only root filesystem, its three bus files and no password of a service,
and is healthy once the function library is loaded. Every variable the compose file
reads is documented in .env.example with the same default; the default image tags are
this version's; replicas of a service take any free port (0, overridable per service)
and each keeps its port file for its health check outside the shared bind mounts. The
file uses only keys both Compose v2 and Debian's 1.29 take without a warning."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from klet.bus.acl import SERVICES
from klet.model.layout import (
    EVICTION,
    GRPC_SERVERS,
    IMAGE_GC,
    SYNCLOOP,
    grpc_socket_dir,
    lease_slots_dir,
)

from tools.image.__main__ import version

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
# ${NAME}, ${NAME:-default}, ${NAME:?message}
VARIABLE = re.compile(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}")


def compose(overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose file as docker-compose reads it with .env.example, a node name and
    `overrides` (`${X:-default}` is the default when X is empty, as in Compose)."""
    env = {**documented(), "KLET_NODE_NAME": "node-a", **(overrides or {})}

    def value(m: re.Match[str]) -> str:
        if m.group(2) == ":-" and not env[m.group(1)]:
            return m.group(3)
        return env[m.group(1)]

    text = VARIABLE.sub(value, COMPOSE.read_text())
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


def documented() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            out[name] = value
    return out


STANDALONE_KUBECONFIG = "/dev/null"
"""What pod-source mounts in place of the kubeconfig when KLET_KUBECONFIG is empty."""


def test_every_variable_is_documented_with_its_default() -> None:
    """Each `${X:-default}` has .env.example's default, but pod-source's kubeconfig
    mount, whose default stands in for the empty (standalone) kubeconfig: .env.example
    says so."""
    env = documented()
    used = VARIABLE.findall(COMPOSE.read_text())
    assert {name for name, _, _ in used} == set(env)
    assert ("KLET_KUBECONFIG", ":-", STANDALONE_KUBECONFIG) in used
    assert STANDALONE_KUBECONFIG in ENV_EXAMPLE.read_text()
    for name, kind, default in used:
        if (name, default) == ("KLET_KUBECONFIG", STANDALONE_KUBECONFIG):
            continue
        if kind == ":-":
            assert env[name] == default, f"{name}: .env.example {env[name]!r}, compose {default!r}"
    required = {name for name, kind, _ in used if kind == ":?"}
    assert required == {"KLET_NODE_NAME"}
    assert env["KLET_NODE_NAME"] == ""


def test_keys_both_compose_versions_take() -> None:
    """No top-level `version:` (v2 warns that it is obsolete) or `name:` (1.29 refuses
    it), only the Compose Specification's top-level keys and `x-` extensions; no service
    pins its replicas or its name (`scale:`, `deploy.replicas`, `container_name`): the
    replicas are `--scale`'s, and a fixed name would stop it."""
    file = compose()
    spec = {"services", "networks", "volumes", "secrets", "configs"}
    assert {key for key in file if not key.startswith("x-")} <= spec
    for name, service in file["services"].items():
        assert not {"scale", "deploy", "container_name"} & set(service), name


def test_default_images_are_this_version() -> None:
    env = documented()
    assert env["KLET_IMAGE"] == f"klet:{version()}"
    assert env["KLET_REDIS_IMAGE"] == f"klet-redis:{version()}"


@dataclass(frozen=True)
class Confinement:
    """What one service container of docker-compose.yml gets."""

    privileged: bool
    capabilities: frozenset[str]  # added to an empty set (cap_drop ALL); privileged: all
    host_pid: bool
    kubeconfig: bool  # --kubeconfig, for the services that call the apiserver
    mounts: dict[str, bool]  # target -> writable


def confinement(service: str, env: dict[str, str]) -> Confinement:
    """The expected confinement of `service` with the compose variables `env`."""
    root = env["KLET_ROOT_DIR"]
    run = env["KLET_RUN_DIR"]
    common = {
        env["KLET_CONFIG_DIR"]: False,
        env["KLET_REDIS_SOCKET_DIR"]: False,
        "/etc/klet/bus/password": False,
        # Of the run dir: its own lease and leader slots, and its own port files.
        (own_leases := f"{run}/leases/{service}"): True,
        (own_ports := f"{run}/ports/{service}"): True,
    }
    # The gRPC sockets, a directory per server: its own writable, those it calls
    # read-only (eviction: syncloop's and image-gc's); image-gc's holds no other's.
    grpc = {
        f"{run}/grpc/eviction": True,
        f"{run}/grpc/syncloop": False,
        f"{run}/grpc/image-gc": False,
    }
    kubernetes = {env["KLET_KUBERNETES_DIR"]: False}
    # pod-source: of the kubernetes dir, what it reads alone.
    manifests = {
        env["KLET_STATIC_POD_PATH"]: False,
        (env["KLET_KUBECONFIG"] or STANDALONE_KUBECONFIG): False,
    }
    # No runtime socket: they reach the runtime through the CRI proxy, whose socket for
    # each is in a volume of that reader's alone, at /run/klet-cri.
    readers = {
        "/run/klet-cri": False,
        root: False,
        env["KLET_POD_LOGS_DIR"]: False,
        env["KLET_IMAGE_FS_DIR"]: False,
        env["KLET_CGROUP_ROOT"]: False,
    }
    none: frozenset[str] = frozenset()
    return {
        "pod-source": Confinement(False, none, False, True, {**common, **manifests}),
        "syncloop": Confinement(
            True,
            none,
            True,
            True,
            {
                **{k: v for k, v in common.items() if k not in (own_leases, own_ports)},
                run: True,  # all of it: privileged, a mount would not confine it
                **kubernetes,
                root: True,
                env["KLET_POD_LOGS_DIR"]: True,
                env["KLET_RUNTIME_SOCKET_DIR"]: True,
                env["KLET_CGROUP_ROOT"]: True,
                env["KLET_RESOLV_CONF"]: False,
            },
        ),
        "status-reporter": Confinement(
            False,
            none,
            False,
            True,
            {
                **common,
                **kubernetes,
                **readers,
                env["KLET_CERT_DIR"]: True,
                f"{run}/ports": False,  # every service's port files, read
            },
        ),
        "eviction": Confinement(
            False, frozenset({"DAC_READ_SEARCH"}), False, False, {**common, **readers, **grpc}
        ),
        "image-gc": Confinement(
            False,
            none,
            False,
            False,
            {
                **common,
                f"{run}/grpc/image-gc": True,
                env["KLET_POD_LOGS_DIR"]: True,
                env["KLET_IMAGE_FS_DIR"]: False,
                "/run/klet-cri": False,
            },
        ),
    }[service]


def volume_targets(spec: dict[str, Any]) -> dict[str, bool]:
    """A compose service's volumes: target -> writable."""
    out = {}
    for volume in spec["volumes"]:
        if isinstance(volume, dict):
            out[volume["target"]] = not volume.get("read_only", False)
        else:
            parts = volume.split(":")
            out[parts[1]] = parts[2:] != ["ro"]
    return out


def variables() -> dict[str, str]:
    return {**documented(), "KLET_NODE_NAME": "node-a"}


@pytest.mark.parametrize("service", SERVICES)
def test_service_runs_from_the_shared_block(service: str) -> None:
    spec = compose()["services"][service]
    assert spec["entrypoint"] == ["klet", "run", service]
    assert spec["healthcheck"]["test"] == ["CMD", "klet", "healthcheck", service]
    for key, value in {"network_mode": "host", "restart": "unless-stopped"}.items():
        assert spec[key] == value, key
    assert "init" not in spec  # a no-op with pid: host; the comment says why
    assert spec["stop_grace_period"]
    assert spec["group_add"] == ["6379"]  # Redis's group: its socket is 0660
    assert spec["environment"]["KLET_REDIS_USERNAME"] == f"klet-{service}@node-a"
    assert spec["environment"]["KLET_REDIS_PASSWORD_FILE"] == "/etc/klet/bus/password"


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_gets_only_what_it_uses(service: str) -> None:
    env = variables()
    spec = compose()["services"][service]
    want = confinement(service, env)
    assert spec.get("privileged", False) is want.privileged
    assert (spec.get("pid") == "host") is want.host_pid
    if not want.privileged:
        assert spec["cap_drop"] == ["ALL"]
        assert frozenset(spec.get("cap_add", [])) == want.capabilities
        assert spec["security_opt"] == ["no-new-privileges:true"]
        assert spec["read_only"] is True
        assert spec["tmpfs"] == ["/tmp"]  # the private port file
    assert volume_targets(spec) == want.mounts
    kubeconfig = [a for a in spec["command"] if a.startswith("--kubeconfig")]
    assert bool(kubeconfig) is want.kubeconfig

    def common(argv: list[str]) -> list[str]:
        endpoints = ("--kubeconfig", "--container-runtime-endpoint", "--image-service-endpoint")
        return [a for a in argv if not a.startswith(endpoints)]

    assert common(spec["command"]) == common(compose()["services"]["eviction"]["command"])
    endpoints = [a for a in spec["command"] if a.startswith(("--container-runtime", "--image-s"))]
    if service in ("status-reporter", "eviction", "image-gc"):
        proxied = "unix:///run/klet-cri/cri.sock"
        assert f"cri-{service}:/run/klet-cri:ro" in spec["volumes"]
        assert endpoints == [
            f"--container-runtime-endpoint={proxied}",
            f"--image-service-endpoint={proxied}",
        ]
        assert spec["depends_on"]["cri-proxy"]["condition"] == "service_healthy"
    else:
        assert endpoints == [
            f"--container-runtime-endpoint={env['KLET_CONTAINER_RUNTIME_ENDPOINT']}"
        ]


@pytest.mark.parametrize("kubeconfig", ["", "/etc/kubernetes/kubelet.conf"])
def test_pod_source_mounts_the_static_pod_directory_and_the_kubeconfig_alone(
    kubeconfig: str,
) -> None:
    """Not the whole kubernetes dir (a control-plane node keeps the cluster CA's key and
    the admin kubeconfigs there): the static pod directory and the kubeconfig file, each
    read-only, at their own paths; standalone, /dev/null in the kubeconfig's place and
    an empty --kubeconfig. syncloop and status-reporter still mount the directory."""
    file = compose({"KLET_KUBECONFIG": kubeconfig})
    spec = file["services"]["pod-source"]
    env = {**variables(), "KLET_KUBECONFIG": kubeconfig}
    manifests = env["KLET_STATIC_POD_PATH"]
    assert manifests == "/etc/kubernetes/manifests"  # upstream's kubeadm default
    mounts = volume_targets(spec)
    assert mounts == confinement("pod-source", env).mounts
    assert mounts[manifests] is False
    assert mounts[kubeconfig or STANDALONE_KUBECONFIG] is False
    assert env["KLET_KUBERNETES_DIR"] not in mounts
    mounted = kubeconfig or STANDALONE_KUBECONFIG
    assert f"{mounted}:{mounted}:ro" in spec["volumes"]
    assert f"--kubeconfig={kubeconfig}" in spec["command"]
    for service in ("syncloop", "status-reporter"):
        volumes = volume_targets(file["services"][service])
        assert volumes[env["KLET_KUBERNETES_DIR"]] is False, service


def test_each_service_mounts_only_its_part_of_the_run_dir() -> None:
    """The run dir is not shared whole: every service writes its own lease slots'
    directory and its own port files' directory alone (none can lock another's leader
    slot or plant another's port file); each gRPC server's socket directory is in its
    own container (writable) and, read-only, in its callers' (eviction calls syncloop's
    and image-gc's): image-gc sees only its own, so it cannot call KillPod; pod-source and
    status-reporter see none, so neither can call KillPod, FreeSpace or DryRun; status-reporter
    reads every service's port files read-only; syncloop, privileged, mounts it all."""
    run = variables()["KLET_RUN_DIR"]
    parts = {
        service: {
            target.removeprefix(run): rw
            for target, rw in volume_targets(compose()["services"][service]).items()
            if target == run or target.startswith(f"{run}/")
        }
        for service in SERVICES
    }
    redis = variables()["KLET_REDIS_SOCKET_DIR"].removeprefix(run)
    assert parts == {
        "pod-source": {"/leases/pod-source": True, "/ports/pod-source": True, redis: False},
        "syncloop": {"": True, redis: False},
        "status-reporter": {
            "/leases/status-reporter": True,
            "/ports": False,
            "/ports/status-reporter": True,
            redis: False,
        },
        "eviction": {
            "/leases/eviction": True,
            "/grpc/eviction": True,
            "/grpc/syncloop": False,
            "/grpc/image-gc": False,
            "/ports/eviction": True,
            redis: False,
        },
        "image-gc": {
            "/leases/image-gc": True,
            "/grpc/image-gc": True,
            "/ports/image-gc": True,
            redis: False,
        },
    }
    # Each server's socket where it serves it (klet.model.layout), in a writable mount
    # of its own (syncloop's: the run dir); each one eviction calls in a mount of its.
    for server in GRPC_SERVERS:
        own = grpc_socket_dir(Path(run), server).as_posix().removeprefix(run)
        assert parts[server].get(own, parts[server].get("")) is True, server
    for called in (SYNCLOOP, IMAGE_GC):
        assert grpc_socket_dir(Path(run), called).as_posix().removeprefix(run) in parts[EVICTION]
    # Each service's slots where it looks for them (klet.model.layout), in its mount.
    for service in SERVICES:
        slots = lease_slots_dir(Path(run), service).as_posix().removeprefix(run)
        assert any(slots == p or slots.startswith(f"{p}/") for p in parts[service]), service


def test_only_syncloop_and_the_cri_proxy_mount_the_runtime_socket() -> None:
    """Whoever can call CRI can start a privileged container: the readers reach it
    through `cri-proxy` (klet.cri.proxy), which has no network, no capability, no new
    privileges, a read-only root filesystem, and mounts the runtime's socket directory
    read-only and one volume per reader, where it serves that reader, nothing else; no
    service mounts another's volume."""
    env = variables()
    runtime = env["KLET_RUNTIME_SOCKET_DIR"]
    for service in SERVICES:
        assert (runtime in volume_targets(compose()["services"][service])) is (
            service == "syncloop"
        ), service
    proxy = compose()["services"]["cri-proxy"]
    assert proxy["entrypoint"] == ["klet", "cri-proxy"]
    readers = ("status-reporter", "eviction", "image-gc")
    assert proxy["command"] == [
        f"--container-runtime-endpoint={env['KLET_CONTAINER_RUNTIME_ENDPOINT']}",
        *(f"--socket={s}=/run/klet-cri/{s}/cri.sock" for s in readers),
    ]
    assert proxy["network_mode"] == "none"
    assert proxy["cap_drop"] == ["ALL"] and "cap_add" not in proxy
    assert proxy["security_opt"] == ["no-new-privileges:true"]
    assert proxy["read_only"] is True
    assert volume_targets(proxy) == {
        runtime: False,
        **{f"/run/klet-cri/{s}": True for s in readers},
    }
    assert proxy["healthcheck"]["test"] == ["CMD", "test", "-S", "/run/klet-cri/image-gc/cri.sock"]
    assert set(compose()["volumes"]) == {f"cri-{s}" for s in readers}
    for service in SERVICES:
        named = {
            v.split(":")[0]
            for v in compose()["services"][service]["volumes"]
            if isinstance(v, str) and v.startswith("cri-")
        }
        assert named == ({f"cri-{service}"} if service in readers else set()), service


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_mounts_its_own_password_alone(service: str) -> None:
    spec = compose()["services"][service]
    bus = documented()["KLET_BUS_DIR"]
    sources = {
        v.split(":")[0]: v.split(":")[1]
        for v in spec["volumes"]
        if isinstance(v, str) and v.startswith(bus)
    }
    assert sources == {f"{bus}/secrets/node-a/{service}": "/etc/klet/bus/password"}


def test_same_path_binds() -> None:
    """A path a service hands to the runtime must mean the same thing on the host: every
    bind is at its own path, but the password file (read by the service alone)."""
    for service in SERVICES:
        for volume in compose()["services"][service]["volumes"]:
            if isinstance(volume, dict):
                assert volume["source"] == volume["target"], service
            elif volume.startswith("cri-"):
                continue  # a CRI proxy socket's volume: nothing the runtime is handed
            elif not volume.split(":")[1] == "/etc/klet/bus/password":
                source, target = volume.split(":")[:2]
                assert source == target, f"{service}: {volume} is not a same-path bind"
    root = compose()["services"]["syncloop"]["volumes"]
    (shared,) = [v for v in root if isinstance(v, dict)]
    assert shared["bind"]["propagation"] == "rshared"
    for service in ("status-reporter", "eviction"):
        (seen,) = [v for v in compose()["services"][service]["volumes"] if isinstance(v, dict)]
        assert (seen["bind"]["propagation"], seen["read_only"]) == ("rslave", True), service


def test_bus_acl_may_only_chown() -> None:
    spec = compose()["services"]["bus-acl"]
    assert spec["network_mode"] == "none"
    assert (spec["cap_drop"], spec["cap_add"]) == (["ALL"], ["CHOWN"])
    assert spec["security_opt"] == ["no-new-privileges:true"]
    script = spec["entrypoint"][2]
    assert "--admin-password-file=" in script and "--functions-file=" in script


def test_redis_has_no_network_no_persistence_and_no_privilege() -> None:
    redis = compose()["services"]["redis"]
    bus = documented()["KLET_BUS_DIR"]
    assert redis["network_mode"] == "none"
    assert "ports" not in redis
    argv = redis["command"]
    assert argv[argv.index("--port") + 1] == "0"
    assert argv[argv.index("--unixsocketperm") + 1] == "660"
    assert argv[argv.index("--save") + 1] == ""
    assert argv[argv.index("--appendonly") + 1] == "no"
    assert argv[argv.index("--maxmemory") + 1] == "256mb"
    assert argv[argv.index("--maxmemory-policy") + 1] == "noeviction"
    assert redis["depends_on"]["bus-acl"]["condition"] == "service_completed_successfully"
    assert redis["user"] == "6379:6379"
    assert redis["cap_drop"] == ["ALL"] and "cap_add" not in redis
    assert redis["read_only"] is True
    assert redis["security_opt"] == ["no-new-privileges:true"]
    assert volume_targets(redis) == {
        documented()["KLET_REDIS_SOCKET_DIR"]: True,
        f"{bus}/users.acl": False,
        f"{bus}/functions.lua": False,
        f"{bus}/admin-password": False,
    }
    assert redis["healthcheck"]["test"] == ["CMD", "klet-redis-check"]
    env = redis["environment"]
    assert env["KLET_REDIS_ADMIN_PASSWORD_FILE"] == f"{bus}/admin-password"
    assert env["KLET_REDIS_FUNCTIONS_FILE"] == f"{bus}/functions.lua"
    assert env["KLET_REDIS_SOCKET"] == argv[argv.index("--unixsocket") + 1]


PORT_VARIABLES = {
    "pod-source": "KLET_POD_SOURCE_PORT",
    "syncloop": "KLET_SYNCLOOP_PORT",
    "status-reporter": "KLET_STATUS_REPORTER_PORT",
    "eviction": "KLET_EVICTION_PORT",
    "image-gc": "KLET_IMAGE_GC_PORT",
}


@pytest.mark.parametrize("service", SERVICES)
def test_replicas_take_any_free_port_and_check_their_own(service: str) -> None:
    """`up --scale` must not collide on the host network: port 0 by default (still
    overridable per service), and a port file each replica keeps to itself."""
    text = COMPOSE.read_text()
    assert f"KLET_SERVICE_PORT: ${{{PORT_VARIABLES[service]}:-0}}" in text
    assert documented()[PORT_VARIABLES[service]] == "0"
    spec = compose()["services"][service]
    assert str(spec["environment"]["KLET_SERVICE_PORT"]) == "0"
    port_file = spec["environment"]["KLET_SERVICE_PORT_FILE"]
    assert port_file.startswith("/")
    targets = [v["target"] if isinstance(v, dict) else v.split(":")[1] for v in spec["volumes"]]
    for target in targets:
        shared = Path(target)
        assert shared != Path(port_file) and shared not in Path(port_file).parents, (
            f"{service}: {port_file} is under the bind mount {target}: replicas would share it"
        )
    assert "container_name" not in spec  # a fixed name would refuse a second replica
    assert "ports" not in spec  # host network: nothing to publish, nothing to collide


def test_the_certificate_directory_is_status_reporters_alone() -> None:
    """--cert-dir (the serving certificate's private key) is mounted by status-reporter
    only, and lies under no path another service mounts: eviction reads the root dir
    with DAC_READ_SEARCH, so a cert dir inside it (upstream's <root>/pki) is readable
    there."""
    env = variables()
    cert_dir = Path(env["KLET_CERT_DIR"])
    for service in SERVICES:
        spec = compose()["services"][service]
        flags = [f for f in spec["command"] if f.startswith("--cert-dir=")]
        assert flags == [f"--cert-dir={cert_dir}"], service
        targets = volume_targets(spec)
        if service == "status-reporter":
            assert targets[str(cert_dir)] is True
            continue
        for target in targets:
            assert not cert_dir.is_relative_to(target), (service, target)
