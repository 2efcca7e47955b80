"""Pod spec → CRI sandbox and container configuration, as pure functions.

The labels and annotations are upstream's, so `crictl` and a restarted syncloop read
them back; the container's restart count and spec hash travel in annotations.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from klet.cri import labels as L
from klet.cri.types import (
    ContainerConfig,
    Device,
    DNSConfig,
    LinuxContainerSecurity,
    Mount,
    NamespaceMode,
    PortMapping,
    SandboxConfig,
)
from klet.model.types import JSON
from klet.syncloop.containers import security
from klet.syncloop.devices.allocation import DeviceRunOptions
from klet.syncloop.environment import dns, envvars
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.model import podspec, resources


def sandbox_config(
    pod: JSON,
    *,
    attempt: int,
    pod_logs_dir: str,
    cgroup_parent: str,
    cluster_domain: str = "",
    dns_config: DNSConfig | None = None,
) -> SandboxConfig:
    """Raises `dns.PodDNSError` when the pod's hostname cannot be formed (see dns.py)."""
    meta = podspec.meta(pod)
    spec = pod.get("spec", {})
    name, namespace, uid = (
        meta.get("name", ""),
        meta.get("namespace", "default"),
        meta.get("uid", ""),
    )
    ports = []
    for c in podspec.containers(pod):
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                ports.append(
                    PortMapping(
                        container_port=int(p["containerPort"]),
                        host_port=int(p["hostPort"]),
                        host_ip=str(p.get("hostIP", "")),
                        protocol=str(p.get("protocol", "TCP")),
                    )
                )
    annotations = {k: str(v) for k, v in (meta.get("annotations") or {}).items()}
    return SandboxConfig(
        name=name,
        namespace=namespace,
        uid=uid,
        attempt=attempt,
        # A host-network pod keeps the node's hostname (upstream sets none; runc refuses
        # a hostname without a private UTS namespace).
        hostname=""
        if spec.get("hostNetwork")
        else dns.kernel_hostname(pod, cluster_domain=cluster_domain),
        dns=dns_config,
        log_directory=f"{pod_logs_dir}/{podspec.pod_log_dir_name(pod)}",
        labels=L.sandbox_labels(
            name=name, namespace=namespace, uid=uid, pod_labels=meta.get("labels") or {}
        ),
        annotations=annotations,
        port_mappings=tuple(ports),
        cgroup_parent=cgroup_parent,
        host_network=bool(spec.get("hostNetwork")),
        host_pid=bool(spec.get("hostPID")),
        host_ipc=bool(spec.get("hostIPC")),
        security=security.sandbox_security(pod),
        sysctls=security.sysctls(pod),
    )


@dataclass(frozen=True)
class NodeContext:
    """What every container config needs to know about the node; fixed per process."""

    facts: NodeFacts = field(default_factory=NodeFacts)
    limits: resources.NodeLimits | None = None
    """cgroup-derived limits; None sends no resources (no cgroups per QoS)."""
    security: security.SecuritySettings = field(default_factory=security.SecuritySettings)


@dataclass(frozen=True)
class Instance:
    """One container instance about to be created, and what was learnt for it."""

    restart_count: int
    image: str
    """The pulled image's reference."""
    pod_ips: tuple[str, ...] = ()
    image_user: security.ImageUser | None = None
    """The image's user from ImageStatus; None when unknown."""
    mounts: tuple[Mount, ...] = ()
    devices: tuple[Device, ...] = ()
    """The container's volumeDevices (raw block volumes)."""
    env_sources: envvars.EnvSources | None = None
    """The ConfigMaps and Secrets the environment refers to; None without an apiserver."""
    pid_target: str = ""
    """An ephemeral container's target: the runtime ID of the container whose PID
    namespace it joins (its `targetContainerName`); empty for none."""
    allocated: DeviceRunOptions | None = None
    """What the device plugins' Allocate answered for the container's devices: envs
    (before the container's own, which win), mounts and device nodes (after the
    volumes'), annotations and CDI devices; None without device plugin resources."""
    dra_cdi_devices: tuple[str, ...] = ()
    """The fully qualified CDI device IDs (`vendor/class=name`) of the container's
    prepared ResourceClaim requests (`klet.syncloop.dra.cdi.container_cdi_devices`, as
    upstream's DRA manager GetResources): CRI `CDI_devices`, before the device plugins'.
    Upstream sends them in that field alone (no CDI annotations since 1.31)."""


def container_config(
    pod: JSON, container: JSON, *, instance: Instance, node: NodeContext
) -> ContainerConfig:
    """Raises `security.SecurityConfigError` when the security context cannot apply, and
    `envvars.EnvError` when the environment's ConfigMap/Secret references cannot."""
    restart_count, image, limits = instance.restart_count, instance.image, node.limits
    env = envvars.container_env(
        pod, container, pod_ips=instance.pod_ips, node=node.facts, sources=instance.env_sources
    )
    allocated = instance.allocated or DeviceRunOptions()
    env = [*allocated.envs, *env]  # upstream: the devices' first, the container's after
    values = dict(env)
    meta = podspec.meta(pod)
    name = container["name"]
    annotations = {
        **dict(allocated.annotations),
        L.CONTAINER_HASH: podspec.container_hash(container),
        L.CONTAINER_RESTART_COUNT: str(restart_count),
        L.TERMINATION_MESSAGE_PATH: container.get("terminationMessagePath", "/dev/termination-log"),
        L.TERMINATION_MESSAGE_POLICY: container.get("terminationMessagePolicy", "File"),
        L.POD_TERMINATION_GRACE_PERIOD: str(
            pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
        ),
    }
    if container.get("ports"):
        annotations[L.CONTAINER_PORTS] = json.dumps(container["ports"], separators=(",", ":"))
    lifecycle = container.get("lifecycle") or {}
    if lifecycle.get("preStop"):
        # Lets a pod whose spec is gone (removed while syncloop was down) still run it.
        annotations[L.CONTAINER_PRESTOP_HANDLER] = json.dumps(
            lifecycle["preStop"], separators=(",", ":")
        )
    return ContainerConfig(
        name=name,
        attempt=restart_count,
        image=image,
        command=tuple(envvars.expand_all(list(container.get("command") or ()), values)),
        args=tuple(envvars.expand_all(list(container.get("args") or ()), values)),
        working_dir=container.get("workingDir", ""),
        envs=tuple(env),
        labels=L.container_labels(
            pod_name=meta.get("name", ""),
            namespace=meta.get("namespace", "default"),
            uid=meta.get("uid", ""),
            container=name,
        ),
        annotations=annotations,
        log_path=f"{name}/{restart_count}.log",
        stdin=bool(container.get("stdin")),
        stdin_once=bool(container.get("stdinOnce")),
        tty=bool(container.get("tty")),
        resources=resources.container_resources(pod, container, limits) if limits else None,
        mounts=instance.mounts
        + tuple(
            Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.read_only)
            for m in allocated.mounts
        ),
        devices=instance.devices
        + tuple(
            Device(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in allocated.devices
        ),
        cdi_devices=instance.dra_cdi_devices + allocated.cdi_devices,
        stop_signal=str(lifecycle.get("stopSignal") or ""),
        security=_with_pid_target(
            security.container_security(
                pod, container, image=instance.image_user, settings=node.security
            ),
            instance.pid_target,
        ),
    )


def _with_pid_target(sc: LinuxContainerSecurity, target_id: str) -> LinuxContainerSecurity:
    """Join the target container's PID namespace (an ephemeral container naming a
    targetContainerName), as upstream does only where the pod's containers each have
    their own (no shareProcessNamespace, no hostPID)."""
    if not target_id or sc.namespaces.pid != NamespaceMode.CONTAINER:
        return sc
    ns = dataclasses.replace(sc.namespaces, pid=NamespaceMode.TARGET, target_id=target_id)
    return dataclasses.replace(sc, namespaces=ns)
