"""The real docker-compose.yml on a private dockerd, in cluster mode: restarting,
killing, scaling or stopping any part of the deployment never touches the pods.

Under each Compose implementation KLET_COMPOSE_CLIS names (comma-separated; default
`1.29`, which `make test` runs; `make test-compose-v2` runs `v2`, `make test-compose`
both): Debian's docker-compose 1.29 (Python), and Compose v2 as current Docker runs it,
`docker compose` with the plugin built by tools/compose/build.sh (`make
compose-v2-binary`; a cold build takes minutes, so a missing one fails at once). Each
gets a deployment of its own; the images are built once.

Builds `klet:<version>` and `klet-redis:<version>` with tools/image, starts a private
dockerd (klet.testbed.Dockerd), `docker load`s both, makes the test's root dir a
shared mount, and runs docker-compose.yml with an env file that points every path at
the test's directories, the devstack's containerd and a node kubeconfig of the cluster
harness's real kube-apiserver. Two static pods run: `hooked` (a liveness probe, and a
postStart hook that appends a line to a hostPath file, so a re-run hook shows) and
`plain`. First, each running container is checked against the compose file's
table of what it may use (capabilities, PID namespace, user, mounts, its own bus
password only, the kubeconfig only where the apiserver is called): only syncloop is
privileged. After each disruption — `restart` of each service, `kill -s KILL` of each
service container, `up --scale syncloop=2` and `--scale status-reporter=2` then SIGKILL
of the leader, `stop redis` for 30 s then `start`, `down` then `up` — the pods' sandbox
and container IDs and attempts (from CRI) are unchanged, the hook ran once, the agent
reports both pods Running again, the apiserver holds one `Started` and no `Killing`
Event per pod, and the Node never reported anything but Ready. A container that dies
while the leader is being replaced has its exit reported afterwards.
Then a configuration file with an invalid field, and no configuration file at all, make
the restarted service exit with an error naming the field or the file (docker restarts
it, unless-stopped), while Redis, the other services and the pods carry on; with the
good file back it is healthy again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.devstack import DevStack, free_port
from klet.model.layout import (
    EVICTION,
    GRPC_SERVERS,
    IMAGE_GC,
    SYNCLOOP,
    grpc_socket,
    grpc_socket_dir,
    holder_slot,
    leader_slot,
)
from klet.testbed import Dockerd
from klet.testbed.cluster import ControlPlane
from klet.testbed.dockerd import DOCKER_BINARY

from tests.harness.node import fetch
from tests.harness.nodewatch import NodeWatch
from tests.harness.procfs import status_field
from tests.harness.waiting import wait_for
from tests.integration.conftest import remove_node_pods
from tests.unit.test_compose_file import confinement
from tools.image.__main__ import version

pytestmark = [pytest.mark.compose, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc")
BUSYBOX = "registry.klet.test/busybox:1.36"
SLEEPER = "trap 'exit 0' TERM; sleep 100000 & wait"
WATCHED = ("hooked", "plain")
"""The static pods no disruption may touch."""
COMPOSE_BUILD_SCRIPT = ROOT / "tools" / "compose" / "build.sh"
CLIS = ("1.29", "v2")
"""The Compose implementations the tier runs under (KLET_COMPOSE_CLIS picks)."""


def selected_clis() -> list[str]:
    names = os.environ.get("KLET_COMPOSE_CLIS", "1.29").split(",")
    unknown = [n for n in names if n not in CLIS]
    if unknown:
        raise ValueError(f"KLET_COMPOSE_CLIS: unknown {unknown} (known: {', '.join(CLIS)})")
    return names


@dataclass(frozen=True)
class ComposeCli:
    """One Compose implementation: the command before its subcommand, and what it adds
    to the daemon's environment."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]


def compose_cli(name: str, dir: Path) -> ComposeCli:
    if name == "1.29":
        return ComposeCli("docker-compose", ("docker-compose",), {})
    res = subprocess.run(
        ["bash", str(COMPOSE_BUILD_SCRIPT), "--check"], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.fail(
            "Compose v2 is not built yet and a cold build takes minutes: run "
            f"`make compose-v2-binary` first ({res.stderr.strip()})",
            pytrace=False,
        )
    # As current Docker installs it: a docker CLI plugin, found in DOCKER_CONFIG's
    # cli-plugins directory (Debian's docker 20.10 client runs it as `docker compose`).
    plugins = dir / "docker-config" / "cli-plugins"
    plugins.mkdir(parents=True)
    (plugins / "docker-compose").symlink_to(res.stdout.strip().splitlines()[-1])
    return ComposeCli(
        "docker compose", (DOCKER_BINARY, "compose"), {"DOCKER_CONFIG": str(plugins.parent)}
    )


def hooked_pod(hook_file: Path) -> str:
    # No hostPath `type`: syncloop would check the path inside its own container, where
    # the test's directory is not mounted (the runtime, on the host, mounts it).
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: hooked}}
spec:
  terminationGracePeriodSeconds: 2
  volumes:
    - name: hook
      hostPath: {{path: {hook_file.parent}}}
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "{SLEEPER}"]
      volumeMounts: [{{name: hook, mountPath: /hook}}]
      lifecycle:
        postStart:
          exec: {{command: ["sh", "-c", "echo started >> /hook/{hook_file.name}"]}}
      livenessProbe:
        exec: {{command: ["true"]}}
        periodSeconds: 1
        failureThreshold: 1
"""


def victim_pod(name: str, die_file: Path) -> str:
    """A pod whose container exits 3 once `die_file` exists (restartPolicy Never)."""
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  volumes:
    - name: hook
      hostPath: {{path: {die_file.parent}}}
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "while [ ! -e /hook/{die_file.name} ]; do sleep 0.1; done; exit 3"]
      volumeMounts: [{{name: hook, mountPath: /hook}}]
"""


PLAIN_POD = f"""
apiVersion: v1
kind: Pod
metadata: {{name: plain}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "{SLEEPER}"]
"""


# Capability numbers (linux/capability.h) and the names docker's cap_add takes: the
# ones docker 20.10 knows (it refuses PERFMON, BPF and CHECKPOINT_RESTORE, and its
# privileged mode does not ask for them).
CAPABILITIES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
    "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
    "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
    "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
    "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ"
).split()


def privileged_override(dir: Path) -> Path | None:
    """A compose override for a host whose capability bounding set lacks some of the
    kernel's capabilities (this test host lacks CAP_SYS_RESOURCE): docker 20.10's
    `privileged` asks runc for every capability the kernel knows and fails with "unable
    to apply caps: operation not permitted". The override gives syncloop, the one
    privileged service, every capability the host has, unconfined, instead; None on a
    host that has them all."""
    have = [CAPABILITIES[bit] for bit in capability_bits(bounding_set())]
    if len(have) == min(cap_last_cap() + 1, len(CAPABILITIES)):
        return None
    service = {
        "privileged": False,
        "cap_add": have,
        "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    }
    path = dir / "unprivileged.yml"
    path.write_text(json.dumps({"services": {"syncloop": service}}, indent=2))
    return path


def cap_last_cap() -> int:
    return int(Path("/proc/sys/kernel/cap_last_cap").read_text())


def bounding_set() -> int:
    """This process's capability bounding set, as a mask (the host's: the test runs as
    root on the host)."""
    return int(status_field("self", "CapBnd"), 16)


def capability_bits(mask: int) -> list[int]:
    return [bit for bit in range(min(cap_last_cap() + 1, len(CAPABILITIES))) if mask >> bit & 1]


def config_yaml(*, manifests: Path, read_only_port: int, extra: str = "") -> str:
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {manifests}
fileCheckFrequency: 1s
readOnlyPort: {read_only_port}
healthzPort: {free_port()}
port: {free_port()}
{extra}"""


@dataclass
class Deployment:
    cli: ComposeCli
    dockerd: Dockerd
    stack: DevStack
    plane: ControlPlane
    env_file: Path
    project: str
    node: str
    read_only_port: int
    config_file: Path
    manifests: Path
    run_dir: Path
    hook_file: Path
    good_config: str
    override: Path | None
    watch: NodeWatch
    env: dict[str, str]

    def compose(self, *args: str, check: bool = True, timeout_s: float = 300) -> str:
        res = subprocess.run(
            [
                *self.cli.argv,
                "--file",
                str(ROOT / "docker-compose.yml"),
                *(["--file", str(self.override)] if self.override else []),
                "--env-file",
                str(self.env_file),
                "--project-name",
                self.project,
                *args,
            ],
            env={**self.dockerd.env, **self.cli.env},
            cwd=self.env_file.parent,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check:
            assert res.returncode == 0, f"{self.cli.name} {' '.join(args)}:\n{res.stderr[-3000:]}"
        return res.stdout + res.stderr

    def containers(self, service: str) -> list[dict[str, Any]]:
        """`docker inspect` of each of the service's containers (one per replica), stopped
        ones too, found by the labels both Compose implementations put on them: a docker
        CLI call, where `ps` of Compose 1.29 takes a second of Python on a busy machine,
        and the waits call this for every service each round."""
        ids = self.dockerd.docker(
            [
                "ps",
                "--all",
                "--quiet",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                "--filter",
                f"label=com.docker.compose.service={service}",
            ]
        ).stdout.split()
        if not ids:
            raise LookupError(f"no container of {service}")
        found = json.loads(self.dockerd.docker(["inspect", *ids]).stdout)
        assert isinstance(found, list)
        return [dict(c) for c in found]

    def container(self, service: str) -> dict[str, Any]:
        """`docker inspect` of the service's one container."""
        (found,) = self.containers(service)
        return found

    def healthy(self, *services: str) -> bool:
        return all(
            c["State"].get("Health", {}).get("Status") == "healthy"
            for s in services
            for c in self.containers(s)
        )

    def passes_its_check(self, *services: str) -> bool:
        """Whether each of the services' containers runs and passes its health check now:
        the test command docker's healthcheck has for it (from `docker inspect`), run in
        the container with `docker exec` as docker runs it. Docker's own status says so
        only at its next check, up to the compose file's interval (10 s) later: the
        disruptions in the middle of a test wait for this, and each test still ends on
        docker's status (`healthy`)."""
        for c in (c for service in services for c in self.containers(service)):
            if not c["State"]["Running"] or c["State"]["Restarting"]:
                return False
            kind, *argv = c["Config"]["Healthcheck"]["Test"]
            assert kind == "CMD", c["Config"]["Healthcheck"]
            res = self.dockerd.docker(["exec", c["Id"], *argv], timeout_s=60, check=False)
            if res.returncode != 0:
                return False
        return True

    def wait_passing(self, *services: str, timeout_s: float, what: str) -> None:
        """Wait until the services pass their health checks (`passes_its_check`), polling
        every second (each try is a `docker exec` per container)."""
        wait_for(
            partial(self.passes_its_check, *services), timeout_s=timeout_s, what=what, interval_s=1
        )

    def restarted_passing(self, service: str, started_at: str) -> bool:
        """Whether the service's container started again since `started_at` and passes its
        health check."""
        started = self.container(service)["State"]["StartedAt"]
        return started != started_at and self.passes_its_check(service)

    def refused(self, service: str, expected: str) -> str | None:
        """The service's log once it exited (or is being restarted) with `expected` in it."""
        c = self.container(service)
        state = c["State"]
        read = self.dockerd.docker(["logs", c["Id"]])
        logs = read.stdout + read.stderr
        if expected in logs and (state["Restarting"] or state["ExitCode"] == 1):
            return logs
        return None

    def pods(self) -> dict[str, dict[str, Any]]:
        body = fetch(f"http://127.0.0.1:{self.read_only_port}/pods", timeout_s=5)
        return {p["metadata"]["name"]: p for p in json.loads(body)["items"]}

    def all_running(self) -> bool:
        pods = self.pods()
        names = [f"{pod}-{self.node}" for pod in WATCHED]
        return all(
            n in pods
            and pods[n]["status"].get("phase") == "Running"
            and all(c["ready"] for c in pods[n]["status"].get("containerStatuses", []))
            for n in names
        )

    def runtime(self) -> dict[str, tuple[str, str, int, str]]:
        """(pod, container) -> (sandbox ID, container ID, attempt, state) of the watched
        pods, from CRI."""

        async def go() -> dict[str, tuple[str, str, int, str]]:
            cri = RuntimeClient(
                CRISettings(runtime_endpoint=self.stack.runtime_endpoint, timeout_s=10)
            )
            try:
                out: dict[str, tuple[str, str, int, str]] = {}
                watched = {f"{pod}-{self.node}" for pod in WATCHED}
                for c in await cri.list_containers():
                    pod = c.labels.get(L.POD_NAME, "")
                    if pod in watched:
                        out[f"{pod}/{c.name}"] = (c.sandbox_id, c.id, c.attempt, c.state.value)
                return out
            finally:
                await cri.close()

        return asyncio.run(go())

    def hook_runs(self) -> int:
        return len(self.hook_file.read_text().splitlines())

    def event_reasons(self) -> dict[str, Counter[str]]:
        """Mirror pod name -> how many Events of each reason the apiserver holds for it."""
        body = json.loads(self.plane.get("/api/v1/namespaces/default/events"))
        out: dict[str, Counter[str]] = {}
        for event in body["items"]:
            name = event["involvedObject"].get("name", "")
            if name.endswith(f"-{self.node}"):
                out.setdefault(name, Counter())[event["reason"]] += event.get("count") or 1
        return out

    def mirror_status(self, pod: str) -> dict[str, Any]:
        body = self.plane.get(f"/api/v1/namespaces/default/pods/{pod}-{self.node}")
        status: dict[str, Any] = json.loads(body).get("status", {})
        return status

    def leader_pid(self, service: str) -> int | None:
        """The host PID of the service's lease holder: the process holding the
        exclusive lock on its leader slot file (/proc/locks names it in this, the
        host's, PID namespace; the holder ID in the file carries the PID in the
        container's own, which is not the host's for status-reporter); None when no
        live process holds it."""
        try:
            st = leader_slot(self.run_dir, service).stat()
        except FileNotFoundError:
            return None
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 1234 00:2e:5678 0 EOF"; a waiter's line has "->"
            if fields[1:4] == ["FLOCK", "ADVISORY", "WRITE"] and fields[5] == inode:
                return int(fields[4])
        return None


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of the two OCI archives, built once for every implementation."""
    began = time.monotonic()
    images = tmp_path_factory.mktemp("image")
    res = subprocess.run(
        [sys.executable, "-m", "tools.image", "--out-dir", str(images)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    print(f"images built in {time.monotonic() - began:.0f}s")
    return images


@pytest.fixture(scope="module", params=selected_clis(), ids=lambda name: f"compose-{name}")
def deployment(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    images: Path,
    devstack: DevStack,
    control_plane: ControlPlane,
) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("compose")
    began = time.monotonic()
    cli = compose_cli(request.param, tmp)
    dockerd = Dockerd(tmp / "docker")
    dockerd.start()
    root = tmp / "root"
    root.mkdir()
    node = f"compose-{uuid.uuid4().hex[:6]}"
    deployment = None
    try:
        for name in (f"klet-{version()}", f"klet-redis-{version()}"):
            dockerd.docker(["load", "--input", str(images / f"{name}.oci.tar")], timeout_s=300)
        print(f"images loaded after {time.monotonic() - began:.0f}s")
        # rshared binds need a shared mount on the host side.
        mount("--bind", str(root), str(root))
        mount("--make-rshared", str(root))
        kubernetes = tmp / "kubernetes"
        manifests = kubernetes / "manifests"
        manifests.mkdir(parents=True)
        config_dir = tmp / "config"
        config_dir.mkdir()
        read_only_port = free_port()
        good = config_yaml(manifests=manifests, read_only_port=read_only_port)
        (config_dir / "kubelet-config.yaml").write_text(good)
        hook_dir = tmp / "hook"
        hook_dir.mkdir()
        hook_file = hook_dir / "runs"
        hook_file.touch()
        # Cluster mode: the node's own credentials (system:node:<node>), inside the
        # read-only kubernetes dir as on a real node.
        kubeconfig = kubernetes / "kubelet.conf"
        shutil.copy(control_plane.node_kubeconfig(node), kubeconfig)
        assert devstack.containerd is not None
        env = {
            "KLET_NODE_NAME": node,
            "KLET_IMAGE": f"klet:{version()}",
            "KLET_REDIS_IMAGE": f"klet-redis:{version()}",
            "KLET_CONFIG_DIR": str(config_dir),
            "KLET_CONFIG_NAME": "kubelet-config.yaml",
            "KLET_KUBERNETES_DIR": str(kubernetes),
            "KLET_STATIC_POD_PATH": str(manifests),
            "KLET_KUBECONFIG": str(kubeconfig),
            "KLET_ROOT_DIR": str(root),
            "KLET_CERT_DIR": str(tmp / "pki"),
            "KLET_POD_LOGS_DIR": str(tmp / "logs"),
            "KLET_CONTAINER_RUNTIME_ENDPOINT": devstack.runtime_endpoint,
            "KLET_RUNTIME_SOCKET_DIR": str(devstack.containerd.socket.parent),
            "KLET_IMAGE_FS_DIR": str(devstack.containerd.root),
            "KLET_RUN_DIR": str(tmp / "run"),
            "KLET_REDIS_SOCKET_DIR": str(tmp / "run" / "redis"),
            "KLET_BUS_DIR": str(tmp / "bus"),
            "KLET_REDIS_UID": "6379",
            "KLET_REDIS_GID": "6379",
            "KLET_CGROUP_ROOT": "/sys/fs/cgroup",
            "KLET_RESOLV_CONF": "/etc/resolv.conf",
            # Each replica's private port is picked by the kernel (the compose default).
            **{f"KLET_{s.upper().replace('-', '_')}_PORT": "0" for s in SERVICES},
            "KLET_STOP_GRACE_PERIOD": "30s",
            "KLET_LOG_FORMAT": "text",
        }
        env_file = tmp / "compose.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        deployment = Deployment(
            cli=cli,
            dockerd=dockerd,
            stack=devstack,
            plane=control_plane,
            env_file=env_file,
            project=node,
            node=node,
            read_only_port=read_only_port,
            config_file=config_dir / "kubelet-config.yaml",
            manifests=manifests,
            run_dir=tmp / "run",
            hook_file=hook_file,
            good_config=good,
            override=privileged_override(tmp),
            watch=NodeWatch(control_plane, node),
            env=env,
        )
        deployment.watch.thread.start()
        deployment.compose("up", "--detach")
        deployment.wait_passing(*SERVICES, timeout_s=240, what="every service healthy")
        print(f"services healthy after {time.monotonic() - began:.0f}s")
        (manifests / "hooked.yaml").write_text(hooked_pod(hook_file))
        (manifests / "plain.yaml").write_text(PLAIN_POD)
        wait_for(deployment.all_running, timeout_s=90, what="both pods Running")
        wait_for(
            lambda: deployment.watch.ready_seen, timeout_s=60, what="the Node registered Ready"
        )
        wait_for(
            lambda: all(
                deployment.event_reasons().get(f"{pod}-{node}", {}).get("Started") == 1
                for pod in WATCHED
            ),
            timeout_s=60,
            what="a Started Event of each pod in the apiserver",
        )
        wait_for(
            lambda: deployment.healthy(*SERVICES),
            timeout_s=60,
            interval_s=1,
            what="docker's healthy",
        )
        print(f"pods running after {time.monotonic() - began:.0f}s")
        yield deployment
    finally:
        if deployment is not None:
            deployment.watch.stopping.set()
            logs = deployment.compose("logs", "--no-color", "--tail", "40", check=False)
            print(logs[-20000:])
            deployment.compose("down", "--timeout", "5", check=False)
        dockerd.stop()
        asyncio.run(remove_node_pods(devstack.runtime_endpoint, node))
        subprocess.run(["umount", "--recursive", "--lazy", str(root)], capture_output=True)
        control_plane.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={node}",
            "--grace-period=0",
            "--force",
            "--ignore-not-found",
        )
        control_plane.kubectl("delete", "node", node, "--ignore-not-found")


def assert_untouched(
    d: Deployment, before: dict[str, tuple[str, str, int, str]], what: str
) -> None:
    """The pods still run the same containers in the same sandboxes, the hook ran once,
    and the agent reports both pods Running again."""
    wait_for(d.all_running, timeout_s=60, what=f"both pods reported Running after {what}")
    assert d.runtime() == before, what
    assert d.hook_runs() == 1, f"postStart hook re-ran after {what}"
    pods = d.pods()
    for name in WATCHED:
        for status in pods[f"{name}-{d.node}"]["status"].get("containerStatuses", []):
            assert status["restartCount"] == 0, f"{what}: {status}"
    reasons = d.event_reasons()
    for name in WATCHED:
        seen = reasons.get(f"{name}-{d.node}", Counter())
        assert seen["Started"] == 1 and seen["Killing"] == 0, f"{what}: {name} Events {seen}"
    assert not d.watch.flaps, f"the Node left Ready by {what}: {d.watch.flaps}"


def exec_in(d: Deployment, service: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` in the service's container, with its user, capabilities and mounts."""
    return subprocess.run(
        ["docker", "exec", d.container(service)["Id"], *argv],
        env=d.dockerd.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_file_reads_without_a_warning(deployment: Deployment) -> None:
    """Both implementations take the file (with the test's override) as it is: v2 warns
    where 1.29 keeps quiet (a `version:` key, for one), and a warning is a change that
    the next Compose may refuse."""
    assert deployment.compose("config", "--quiet").strip() == ""


def test_each_container_has_only_what_it_uses(deployment: Deployment) -> None:
    """The running containers as the kernel and docker see them match the compose
    file's table (tests/unit/test_compose_file.confinement): effective capabilities
    (all of the host's for syncloop, DAC_READ_SEARCH for eviction, none for the others
    and Redis), no new privileges, the PID namespace, the user, a read-only root
    filesystem, every mount and whether it is writable, the kubeconfig flag; each
    service sees its own bus password and no other, Redis sees no service's; writes
    outside a container's writable mounts fail; pod-source sees of the kubernetes dir
    only the static pod directory and the kubeconfig file; of the run dir, each gRPC
    socket is only where it is served or called (eviction: all three, read-only but
    its own; image-gc: its own, not syncloop's PodControl; syncloop's all of it), and
    each service writes only its own port files' directory."""
    d = deployment
    host_pid_ns = os.readlink("/proc/self/ns/pid")
    bus = Path(d.env["KLET_BUS_DIR"])
    for service in SERVICES:
        want = confinement(service, d.env)
        c = d.container(service)
        pid = c["State"]["Pid"]
        effective = int(status_field(pid, "CapEff"), 16)
        if want.privileged:
            # Every capability of the host that docker knows (privileged_override).
            assert capability_bits(effective) == capability_bits(bounding_set()), service
        else:
            names = {CAPABILITIES[bit] for bit in capability_bits(effective)}
            assert names == want.capabilities, service
            assert status_field(pid, "NoNewPrivs") == "1", service
            assert c["HostConfig"]["ReadonlyRootfs"] is True, service
        assert status_field(pid, "Uid").split()[1] == "0", service  # root, its caps dropped
        assert (os.readlink(f"/proc/{pid}/ns/pid") == host_pid_ns) is want.host_pid, service
        assert {m["Destination"]: m["RW"] for m in c["Mounts"]} == want.mounts, service
        assert any(a.startswith("--kubeconfig=/") for a in c["Args"]) is want.kubeconfig
        seen = Path(f"/proc/{pid}/root")
        own = bus / "secrets" / d.node / service
        assert (seen / "etc/klet/bus/password").read_text() == own.read_text(), service
        assert not (seen / bus.relative_to("/")).exists(), f"{service} sees the bus dir"

    redis = d.container("redis")
    pid = redis["State"]["Pid"]  # docker's init; redis-server runs under it, as it does
    assert status_field(pid, "Uid").split()[1] == "6379"
    assert int(status_field(pid, "CapEff"), 16) == 0
    assert status_field(pid, "NoNewPrivs") == "1"
    assert redis["HostConfig"]["ReadonlyRootfs"] is True
    assert os.readlink(f"/proc/{pid}/ns/pid") != host_pid_ns
    assert not (Path(f"/proc/{pid}/root") / bus.relative_to("/") / "secrets").exists()

    # What the mounts mean: status-reporter writes its serving certificate and nothing
    # else of the root dir; a confined service writes nothing in its own image.
    root = d.env["KLET_ROOT_DIR"]
    denied = exec_in(d, "status-reporter", "touch", f"{root}/probe")
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr
    cert_dir = d.env["KLET_CERT_DIR"]
    allowed = exec_in(d, "status-reporter", "touch", f"{cert_dir}/probe")
    assert allowed.returncode == 0, allowed.stderr
    Path(cert_dir, "probe").unlink()
    # The serving key is status-reporter's alone: eviction, which reads the root dir
    # with DAC_READ_SEARCH, finds no certificate directory there or anywhere.
    for service in ("pod-source", "syncloop", "eviction", "image-gc"):
        seen = exec_in(d, service, "ls", cert_dir)
        assert seen.returncode != 0, f"{service} sees the certificate directory"
    for service in ("pod-source", "eviction", "image-gc"):
        denied = exec_in(d, service, "touch", "/etc/probe")
        assert "Read-only file system" in denied.stderr, service
    hidden = exec_in(d, "pod-source", "ls", root)
    assert hidden.returncode != 0, "pod-source sees the root dir"
    # Of the kubernetes dir pod-source sees the static pod directory and the kubeconfig
    # file alone: a file beside them (a control-plane node's CA key, admin.conf) is
    # syncloop's to see, not pod-source's.
    kubernetes = Path(d.env["KLET_KUBERNETES_DIR"])
    beside = kubernetes / "admin.conf"
    beside.write_text("not pod-source's\n")
    try:
        assert exec_in(d, "syncloop", "test", "-f", str(beside)).returncode == 0
        assert exec_in(d, "pod-source", "test", "-e", str(beside)).returncode != 0
        listed = exec_in(d, "pod-source", "ls", "-A", str(kubernetes))
        assert sorted(listed.stdout.split()) == ["kubelet.conf", "manifests"], listed
        for path in (d.env["KLET_KUBECONFIG"], d.env["KLET_STATIC_POD_PATH"] + "/plain.yaml"):
            assert exec_in(d, "pod-source", "test", "-f", path).returncode == 0, path
    finally:
        beside.unlink()

    # Of the run dir: each gRPC socket is in its server's container and in its callers'
    # alone: eviction sees syncloop's PodControl and image-gc's GarbageCollector (and
    # cannot plant a socket in their directories), image-gc sees its own and not
    # syncloop's, pod-source and status-reporter (on the network) see none; each service
    # writes only its own port files' directory (status-reporter reads the others') and
    # sees only its own lease slots.
    run = d.env["KLET_RUN_DIR"]
    reaches = {
        "eviction": {SYNCLOOP, IMAGE_GC, EVICTION},
        "image-gc": {IMAGE_GC},
        "pod-source": set(),
        "status-reporter": set(),
    }
    for service, servers in reaches.items():
        for server in GRPC_SERVERS:
            sock = grpc_socket(Path(run), server)
            probe = exec_in(d, service, "test", "-S", str(sock))
            assert (probe.returncode == 0) is (server in servers), (service, str(sock))
        if not servers:
            probe = exec_in(d, service, "ls", f"{run}/grpc")
            assert probe.returncode != 0 and "No such file" in probe.stderr, (service, probe)
    for server in (SYNCLOOP, IMAGE_GC):
        planted = exec_in(d, "eviction", "touch", f"{grpc_socket_dir(Path(run), server)}/x")
        assert "Read-only file system" in planted.stderr, (server, planted)
    listed = exec_in(d, "image-gc", "ls", "-A", f"{run}/grpc")
    assert listed.stdout.split() == [IMAGE_GC], listed
    for service in ("pod-source", "status-reporter", "eviction", "image-gc"):
        own = exec_in(d, service, "touch", f"{run}/ports/{service}/probe.tmp")
        assert own.returncode == 0, (service, own.stderr)
        Path(run, "ports", service, "probe.tmp").unlink()
        planted = exec_in(d, service, "touch", f"{run}/ports/syncloop/planted.json")
        assert planted.returncode != 0, f"{service} plants a port file of syncloop's"
        slot = exec_in(d, service, "test", "-f", str(holder_slot(Path(run), service)))
        assert slot.returncode == 0, (service, slot.stderr)
        # Its own lease slots alone: no other service's directory is in its container.
        for other in ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc"):
            if other != service:
                seen = exec_in(d, service, "ls", f"{run}/leases/{other}")
                assert seen.returncode != 0 and "No such file" in seen.stderr, (service, other)
    listed = exec_in(d, "status-reporter", "ls", f"{run}/ports/syncloop")
    assert listed.returncode == 0 and listed.stdout.strip(), listed
    for service in ("pod-source", "eviction", "image-gc"):
        seen = exec_in(d, service, "ls", f"{run}/ports/syncloop")
        assert seen.returncode != 0, f"{service} sees syncloop's port files"


# Run inside status-reporter's container: two raw calls on its CRI proxy socket (an empty
# request is a valid empty message of either), printing each one's status code.
CRI_PROBE = """
import sys, grpc
target = sys.argv[1]
with grpc.insecure_channel(target) as channel:
    for method in ("ListContainers", "CreateContainer"):
        call = channel.unary_unary(f"/runtime.v1.RuntimeService/{method}")
        try:
            call(b"", timeout=20)
            print(method, "OK")
        except grpc.RpcError as err:
            print(method, err.code().name, err.details())
"""


def test_readers_reach_the_runtime_only_through_the_cri_allow_list(
    deployment: Deployment,
) -> None:
    """The runtime's socket is syncloop's and cri-proxy's alone: status-reporter,
    eviction, image-gc and pod-source do not see it. Each reader sees one proxy socket,
    its own (/run/klet-cri holds cri.sock alone: no reader can reach another's, with its
    other rights). status-reporter's connection lists the node's containers (`klet
    crictl ps` inside its container shows the watched pods) and is refused
    CreateContainer with PERMISSION_DENIED naming it; the proxy's own container runs with
    no capability, no new privileges, no network namespace of the host and a read-only
    root filesystem."""
    d = deployment
    runtime_socket = d.env["KLET_CONTAINER_RUNTIME_ENDPOINT"].removeprefix("unix://")
    for service in ("pod-source", "status-reporter", "eviction", "image-gc"):
        seen = exec_in(d, service, "test", "-e", runtime_socket)
        assert seen.returncode != 0, f"{service} sees the runtime socket {runtime_socket}"
    assert exec_in(d, "syncloop", "test", "-S", runtime_socket).returncode == 0
    for service in ("status-reporter", "eviction", "image-gc"):
        seen = exec_in(d, service, "ls", "-A", "/run/klet-cri")
        assert seen.stdout.split() == ["cri.sock"], (service, seen.stdout, seen.stderr)
    endpoint = "unix:///run/klet-cri/cri.sock"
    listed = exec_in(d, "status-reporter", "klet", "crictl", "--runtime-endpoint", endpoint, "ps")
    assert listed.returncode == 0, listed.stderr
    for name in WATCHED:
        assert name in listed.stdout, listed.stdout
    probe = exec_in(d, "status-reporter", "python3", "-c", CRI_PROBE, endpoint)
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.splitlines()
    assert lines[0] == "ListContainers OK", probe.stdout
    assert lines[1].startswith("CreateContainer PERMISSION_DENIED "), probe.stdout
    assert "/runtime.v1.RuntimeService/CreateContainer" in lines[1], probe.stdout

    proxy = d.container("cri-proxy")
    pid = proxy["State"]["Pid"]
    assert int(status_field(pid, "CapEff"), 16) == 0
    assert status_field(pid, "NoNewPrivs") == "1"
    assert proxy["HostConfig"]["ReadonlyRootfs"] is True
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")


def test_pods_survive_every_disruption(deployment: Deployment) -> None:
    d = deployment
    before = d.runtime()
    assert len(before) == 2 and all(state == "CONTAINER_RUNNING" for *_, state in before.values())
    assert d.hook_runs() == 1

    for service in SERVICES:
        began = time.monotonic()
        started = d.container(service)["State"]["StartedAt"]
        d.compose("restart", service)
        assert d.container(service)["State"]["StartedAt"] != started
        d.wait_passing(service, timeout_s=90, what=f"{service} healthy again")
        assert_untouched(d, before, f"{d.cli.name} restart {service}")
        print(f"restart {service}: {time.monotonic() - began:.1f}s")

    for service in SERVICES:
        began = time.monotonic()
        container = d.container(service)
        subprocess.run(["kill", "-s", "KILL", str(container["State"]["Pid"])], check=True)
        # restart: unless-stopped brings it back.
        wait_for(
            partial(d.restarted_passing, service, container["State"]["StartedAt"]),
            timeout_s=90,
            interval_s=1,
            what=f"{service} restarted by docker and healthy",
        )
        assert_untouched(d, before, f"kill -s KILL of {service}")
        print(f"kill {service}: {time.monotonic() - began:.1f}s")

    began = time.monotonic()
    d.compose("stop", "redis")
    time.sleep(30)
    assert d.runtime() == before, "Redis down 30 s"
    d.compose("start", "redis")
    assert_untouched(d, before, "Redis stopped 30 s and started empty")
    print(f"redis stop 30 s + start: {time.monotonic() - began:.1f}s")

    began = time.monotonic()
    d.compose("down", "--timeout", "30")
    assert not d.compose("ps", "-q").strip()
    time.sleep(3)
    assert d.runtime() == before, f"the pods run on after {d.cli.name} down"
    d.compose("up", "--detach")
    d.wait_passing(*SERVICES, timeout_s=180, what="every service healthy after up")
    assert_untouched(d, before, f"{d.cli.name} down, then up")
    wait_for(
        lambda: d.healthy(*SERVICES), timeout_s=60, interval_s=1, what="docker's healthy after up"
    )
    print(f"down + up: {time.monotonic() - began:.1f}s")


@pytest.mark.parametrize("service", ["syncloop", "status-reporter"])
def test_scaled_service_loses_its_leader(deployment: Deployment, service: str) -> None:
    """Two replicas; SIGKILL of the lease holder: the standby takes over, and a container
    that exits while the leader is being replaced has its exit reported afterwards."""
    d = deployment
    try:
        scaled_leader_killed(d, service)
    except BaseException:
        # Leave the module's deployment as the next test expects it (one replica of
        # each service, no victim pod), so one failure does not fail the others too.
        d.compose("up", "--detach", "--no-recreate", "--scale", f"{service}=1", check=False)
        (d.manifests / f"victim-{service}.yaml").unlink(missing_ok=True)
        with contextlib.suppress(AssertionError):
            wait_for(
                partial(d.healthy, *SERVICES), timeout_s=120, interval_s=1, what="healthy again"
            )
        raise


def scaled_leader_killed(d: Deployment, service: str) -> None:
    before = d.runtime()
    victim = f"victim-{service}"
    die_file = d.hook_file.parent / f"die-{service}"
    (d.manifests / f"{victim}.yaml").write_text(victim_pod(victim, die_file))
    wait_for(
        lambda: d.pods().get(f"{victim}-{d.node}", {}).get("status", {}).get("phase") == "Running",
        timeout_s=90,
        what=f"{victim} Running",
    )

    d.compose("up", "--detach", "--no-recreate", "--scale", f"{service}=2")
    wait_for(
        lambda: len(d.containers(service)) == 2 and d.passes_its_check(service),
        timeout_s=120,
        interval_s=1,
        what=f"two healthy {service} replicas",
    )
    replicas = {c["State"]["Pid"] for c in d.containers(service)}
    leader = wait_for(lambda: d.leader_pid(service), timeout_s=60, what=f"a {service} lease holder")
    # The holder is one of the replicas' main process, or runs under its init.
    parent = next(
        int(line.split()[1])
        for line in Path(f"/proc/{leader}/status").read_text().splitlines()
        if line.startswith("PPid:")
    )
    assert {leader, parent} & replicas, f"{service} leader {leader} is not a replica's"
    print(f"{service}: leader {leader} under {Path(f'/proc/{parent}/comm').read_text().strip()}")

    killed = time.monotonic()
    os.kill(leader, signal.SIGKILL)
    die_file.touch()
    successor = wait_for(
        lambda: (pid := d.leader_pid(service)) is not None and pid != leader and pid,
        timeout_s=60,
        what=f"another {service} replica holding the lease",
    )
    print(f"{service}: lease held by {successor} {time.monotonic() - killed:.1f}s after the kill")

    def exit_reported() -> bool:
        mirror = d.mirror_status(victim)
        states = [c.get("state", {}) for c in mirror.get("containerStatuses", [])]
        return mirror.get("phase") == "Failed" and any(
            s.get("terminated", {}).get("exitCode") == 3 for s in states
        )

    wait_for(exit_reported, timeout_s=90, what=f"{victim}'s exit in the apiserver")
    print(f"{service}: exit reported {time.monotonic() - killed:.1f}s after the kill")
    assert_untouched(d, before, f"SIGKILL of the {service} leader with a standby running")

    # docker brings the killed replica back (unless-stopped); then back to one replica.
    wait_for(
        lambda: len(d.containers(service)) == 2 and d.passes_its_check(service),
        timeout_s=120,
        interval_s=1,
        what=f"both {service} replicas healthy again",
    )
    d.compose("up", "--detach", "--no-recreate", "--scale", f"{service}=1")
    wait_for(
        lambda: d.healthy(service), timeout_s=120, interval_s=1, what=f"{service} at one replica"
    )
    (d.manifests / f"{victim}.yaml").unlink()
    wait_for(lambda: f"{victim}-{d.node}" not in d.pods(), timeout_s=60, what=f"{victim} removed")
    assert_untouched(d, before, f"{service} scaled back to one replica")


def test_bad_config_stops_only_the_service_restarted_with_it(deployment: Deployment) -> None:
    d = deployment
    before = d.runtime()
    for what, expected in (
        ("a negative maxPods", "maxPods: must not be negative"),
        ("no config file", "cannot read: No such file or directory"),
    ):
        if what == "no config file":
            d.config_file.unlink()
        else:
            d.config_file.write_text(d.good_config + "maxPods: -3\n")
        try:
            d.compose("restart", "eviction")
            logs = wait_for(
                partial(d.refused, "eviction", expected),
                timeout_s=60,
                what=f"eviction to exit naming the problem ({what})",
            )
            assert "eviction: invalid configuration" in logs
            assert str(d.config_file) in logs
            # The others, Redis and the pods carry on.
            assert d.healthy("redis", "pod-source", "syncloop", "status-reporter", "image-gc")
            time.sleep(3)
            assert d.runtime() == before
            assert d.all_running()
        finally:
            d.config_file.write_text(d.good_config)
        wait_for(
            partial(d.healthy, "eviction"),
            timeout_s=180,
            interval_s=1,
            what="eviction back with a good config",
        )
        assert_untouched(d, before, f"{what}, then the good config file")
