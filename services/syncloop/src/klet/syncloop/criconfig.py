"""Pod spec → CRI sandbox and container configuration, as pure functions.

The labels and annotations are upstream's, so `crictl` and a restarted syncloop read
them back; the container's restart count and spec hash travel in annotations.
"""

from __future__ import annotations

import json

from klet.cri import labels as L
from klet.cri.types import ContainerConfig, PortMapping, SandboxConfig
from klet.model.types import JSON
from klet.syncloop import podspec


def sandbox_config(
    pod: JSON, *, attempt: int, pod_logs_dir: str, cgroup_parent: str
) -> SandboxConfig:
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
    hostname = spec.get("hostname") or name
    return SandboxConfig(
        name=name,
        namespace=namespace,
        uid=uid,
        attempt=attempt,
        hostname=hostname[:63],
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
    )


def _field_ref(pod: JSON, path: str, pod_ip: str) -> str:
    meta = podspec.meta(pod)
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", "default"),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod.get("spec", {}).get("nodeName", ""),
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", ""),
        "status.podIP": pod_ip,
    }
    return str(simple.get(path, ""))


def container_envs(pod: JSON, container: JSON, *, pod_ip: str) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for e in container.get("env") or []:
        if "value" in e:
            out.append((e["name"], str(e.get("value") or "")))
        elif (e.get("valueFrom") or {}).get("fieldRef"):
            out.append(
                (
                    e["name"],
                    _field_ref(pod, e["valueFrom"]["fieldRef"].get("fieldPath", ""), pod_ip),
                )
            )
        else:
            out.append((e["name"], ""))
    return tuple(out)


def container_config(
    pod: JSON, container: JSON, *, restart_count: int, image: str, pod_ip: str
) -> ContainerConfig:
    meta = podspec.meta(pod)
    name = container["name"]
    annotations = {
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
    return ContainerConfig(
        name=name,
        attempt=restart_count,
        image=image,
        command=tuple(container.get("command") or ()),
        args=tuple(container.get("args") or ()),
        working_dir=container.get("workingDir", ""),
        envs=container_envs(pod, container, pod_ip=pod_ip),
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
    )
