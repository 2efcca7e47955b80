"""Content volumes on a real apiserver, observed inside the container and on the node.

A ConfigMap volume shows the object's keys as files; `kubectl apply` of a changed
ConfigMap reaches the running container within the sync period (the node runs with a
10 s syncFrequency) without a restart; on the node the volume has upstream's atomic
layout (`..data` → a timestamped directory, keys linked through `..data`) and the
mount is read-only. A Secret volume is a tmpfs of its own (in the container's
/proc/mounts and on the node), files carry defaultMode or the item's mode, a value that
is not UTF-8 is written byte for byte, an unprivileged host user cannot read a file
even when its mode is 0644 (the pod directory is 0750), and the volume is unmounted
and removed with the pod. A projected volume shows the pod's labels through the downward API
(updated when the labels change) next to a ConfigMap key. The `kube-api-access-*`
volume the ServiceAccount admission plugin injects holds a token that the apiserver
accepts (TokenReview as admin, and a request made from the node with the token and
the CA certificate from the volume) and that is bound to the pod, plus the namespace
and the cluster CA; nobody on the host can read that token. A pod whose ConfigMap does
not exist stays ContainerCreating with upstream's FailedMount event on the apiserver and
starts once the ConfigMap is created.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.syncloop.volumes import fs
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

NODE = "kletvol1"
IMAGE = "registry.klet.test/busybox:1.36"
OBJECTS = (
    ("configmap", "vol-cfg"),
    ("configmap", "vol-proj"),
    ("configmap", "vol-late"),
    ("secret", "vol-secret"),
)
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
BLOB = b"\x00\xff\xfe binary \x80"
NOBODY = 65534


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("volnode")
    try:
        with cluster_node(
            control_plane, devstack, base, name=NODE, extra_flags=["--sync-frequency", "10s"]
        ) as kletnode:
            yield kletnode
    finally:
        for kind, name in OBJECTS:
            control_plane.kubectl("delete", kind, name, "--ignore-not-found")
        # The node stopped with pods still set up: their tmpfs volumes stay mounted (as
        # they would for a restarted kubelet); unmount them so the directory can go.
        for point in fs.mounts_under(base):
            subprocess.run(["umount", point], check=False)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def pod(
    name: str,
    *,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sleep", "100000"],
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        },
    }


def configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": data,
    }


def get_pod(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    r = cp.kubectl("get", "pod", name, "-o", "json")
    return json.loads(r.stdout) if r.returncode == 0 else None


def running(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    p = get_pod(cp, name)
    statuses = (p or {}).get("status", {}).get("containerStatuses", [])
    return p if statuses and all("running" in c["state"] for c in statuses) else None


def start(cp: ControlPlane, *objects: dict[str, Any]) -> dict[str, Any]:
    """Apply the objects (the pod last) and wait until the pod runs."""
    cp.apply(list(objects))
    name = objects[-1]["metadata"]["name"]
    found = wait_for(lambda: running(cp, name), timeout_s=60, what=f"{name} Running")
    assert found is not None
    return found


def exec_out(cp: ControlPlane, name: str, *argv: str) -> str:
    r = cp.kubectl("exec", name, "--", *argv)
    assert r.returncode == 0, f"exec {argv}: {r.stderr}"
    return r.stdout


def volume_dir(node: KletNode, uid: str, plugin: str, volume: str) -> Path:
    return node.root_dir / "pods" / uid / "volumes" / plugin / volume


def refused_to_nobody(node: KletNode, path: Path) -> bool:
    """Whether an unprivileged host user (nobody, no groups) is refused `path`. The root
    directory is opened to everyone first, as an operator may have it, so what refuses
    is what klet made below it."""
    os.chmod(node.root_dir, 0o755)
    r = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "cat"]
        + [str(path.relative_to(node.root_dir))],
        cwd=node.root_dir,
        capture_output=True,
        check=False,
        timeout=30,
    )
    return r.returncode != 0 and b"Permission denied" in r.stderr


def container_id(p: dict[str, Any]) -> str:
    return str(p["status"]["containerStatuses"][0]["containerID"])


def test_configmap_volume_layout_and_update_in_place(
    node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane
    p = start(
        cp,
        configmap("vol-cfg", {"greeting": "hello", "level": "debug"}),
        pod(
            "cm-vol",
            volumes=[{"name": "cfg", "configMap": {"name": "vol-cfg"}}],
            mounts=[{"name": "cfg", "mountPath": "/etc/cfg"}],
        ),
    )
    assert exec_out(cp, "cm-vol", "cat", "/etc/cfg/greeting") == "hello"
    assert exec_out(cp, "cm-vol", "cat", "/etc/cfg/level") == "debug"
    # Read-only whatever the volumeMount says, as upstream mounts configMap volumes.
    r = cp.kubectl("exec", "cm-vol", "--", "sh", "-c", "echo x > /etc/cfg/new")
    assert r.returncode != 0

    host = volume_dir(node, p["metadata"]["uid"], "kubernetes.io~configmap", "cfg")
    data = os.readlink(host / "..data")
    assert data.startswith("..") and (host / data).is_dir()
    assert os.readlink(host / "greeting") == "..data/greeting"
    assert (host / data / "greeting").read_text() == "hello"
    assert fs.fs_type(host) is None  # on the node's disk, like upstream's configMap volumes

    cp.apply([configmap("vol-cfg", {"greeting": "bonjour"})])
    wait_for(
        lambda: cp.kubectl("exec", "cm-vol", "--", "cat", "/etc/cfg/greeting").stdout == "bonjour",
        timeout_s=60,
        what="the changed ConfigMap inside the running container",
    )
    r = cp.kubectl("exec", "cm-vol", "--", "ls", "/etc/cfg")
    assert r.stdout.split() == ["greeting"]  # the removed key is gone
    new_data = os.readlink(host / "..data")
    assert new_data != data and not (host / data).exists()  # swapped; old payload removed
    after = get_pod(cp, "cm-vol")
    assert after is not None
    assert container_id(after) == container_id(p)  # the same container: no restart
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0


def test_secret_volume_on_tmpfs(node: KletNode, control_plane: ControlPlane) -> None:
    cp = control_plane
    p = start(
        cp,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "vol-secret", "namespace": "default"},
            "type": "Opaque",
            "data": {"password": b64("s3cret"), "blob": base64.b64encode(BLOB).decode()},
        },
        pod(
            "secret-vol",
            volumes=[
                {
                    "name": "creds",
                    "secret": {
                        "secretName": "vol-secret",
                        "defaultMode": 0o400,
                        "items": [
                            {"key": "password", "path": "password"},
                            {"key": "blob", "path": "blob", "mode": 0o644},
                        ],
                    },
                }
            ],
            mounts=[{"name": "creds", "mountPath": "/etc/creds"}],
        ),
    )
    assert exec_out(cp, "secret-vol", "cat", "/etc/creds/password") == "s3cret"
    mounts = exec_out(cp, "secret-vol", "cat", "/proc/mounts").splitlines()
    entry = next(line.split() for line in mounts if line.split()[1] == "/etc/creds")
    assert entry[2] == "tmpfs" and "ro" in entry[3].split(",")

    host = volume_dir(node, p["metadata"]["uid"], "kubernetes.io~secret", "creds")
    assert fs.fs_type(host) == "tmpfs"  # never on the node's disk
    assert oct(os.stat(host / "password").st_mode & 0o777) == "0o400"
    assert oct(os.stat(host / "blob").st_mode & 0o777) == "0o644"
    assert (host / "blob").read_bytes() == BLOB
    assert refused_to_nobody(node, host / "blob")

    r = cp.kubectl("delete", "pod", "secret-vol", "--wait=true", timeout_s=60)
    assert r.returncode == 0, r.stderr
    wait_for(
        lambda: not os.path.lexists(host) and not fs.mounts_under(host.parent),
        timeout_s=30,
        what="the secret volume unmounted and removed",
    )


def test_projected_downward_api_labels_follow_the_pod(
    node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane
    start(
        cp,
        configmap("vol-proj", {"color": "blue"}),
        pod(
            "proj-vol",
            labels={"app": "proj", "tier": "front"},
            volumes=[
                {
                    "name": "info",
                    "projected": {
                        "sources": [
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "labels",
                                            "fieldRef": {"fieldPath": "metadata.labels"},
                                        },
                                        {
                                            "path": "name",
                                            "fieldRef": {"fieldPath": "metadata.name"},
                                        },
                                    ]
                                }
                            },
                            {
                                "configMap": {
                                    "name": "vol-proj",
                                    "items": [{"key": "color", "path": "conf/color"}],
                                }
                            },
                        ]
                    },
                }
            ],
            mounts=[{"name": "info", "mountPath": "/etc/info"}],
        ),
    )
    assert exec_out(cp, "proj-vol", "cat", "/etc/info/labels") == 'app="proj"\ntier="front"'
    assert exec_out(cp, "proj-vol", "cat", "/etc/info/name") == "proj-vol"
    assert exec_out(cp, "proj-vol", "cat", "/etc/info/conf/color") == "blue"

    r = cp.kubectl("label", "pod", "proj-vol", "tier=back", "--overwrite")
    assert r.returncode == 0, r.stderr
    wait_for(
        lambda: (
            cp.kubectl("exec", "proj-vol", "--", "cat", "/etc/info/labels").stdout
            == 'app="proj"\ntier="back"'
        ),
        timeout_s=60,
        what="the new label in the downward API file",
    )


def test_kube_api_access_token_is_accepted_and_bound(
    node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane
    p = start(cp, pod("sa-vol", volumes=[], mounts=[]))
    injected = [v["name"] for v in p["spec"]["volumes"]]
    access = next(n for n in injected if n.startswith("kube-api-access-"))
    assert exec_out(cp, "sa-vol", "cat", f"{SA_DIR}/namespace") == "default"
    assert exec_out(cp, "sa-vol", "cat", f"{SA_DIR}/ca.crt") == cp.ca.cert_pem.decode()
    token = exec_out(cp, "sa-vol", "cat", f"{SA_DIR}/token")

    review = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    }
    r = cp.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review))
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)["status"]
    assert status["authenticated"] is True
    user = status["user"]
    assert user["username"] == "system:serviceaccount:default:default"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["sa-vol"]
    assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [p["metadata"]["uid"]]

    # An in-cluster client's view: the token and CA straight from the volume on the node.
    host = volume_dir(node, p["metadata"]["uid"], "kubernetes.io~projected", access)
    assert fs.fs_type(host) == "tmpfs"
    assert refused_to_nobody(node, host / "token")
    ctx = ssl.create_default_context(cafile=str(host / "ca.crt"))
    request = urllib.request.Request(
        cp.server + "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        data=json.dumps(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        ).encode(),
        headers={
            "Authorization": f"Bearer {(host / 'token').read_text()}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, context=ctx, timeout=10) as resp:
        me = json.load(resp)
    assert me["status"]["userInfo"]["username"] == "system:serviceaccount:default:default"


def test_missing_configmap_failed_mount_then_started(
    node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane
    cp.apply(
        [
            pod(
                "late-vol",
                volumes=[{"name": "cfg", "configMap": {"name": "vol-late"}}],
                mounts=[{"name": "cfg", "mountPath": "/etc/cfg"}],
            )
        ]
    )

    def failed_mount() -> dict[str, Any] | None:
        r = cp.kubectl(
            "get", "events", "-o", "json",
            "--field-selector", "involvedObject.name=late-vol,reason=FailedMount",
        )  # fmt: skip
        items = json.loads(r.stdout).get("items", []) if r.returncode == 0 else []
        return items[0] if items else None

    event = wait_for(failed_mount, timeout_s=60, what="a FailedMount event on the apiserver")
    assert event["type"] == "Warning"
    assert event["message"] == (
        'MountVolume.SetUp failed for volume "cfg" : configmap "vol-late" not found'
    )
    p = get_pod(cp, "late-vol")
    assert p is not None and p["status"]["phase"] == "Pending"
    waiting = p["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ContainerCreating"

    cp.apply([configmap("vol-late", {"k": "arrived"})])
    wait_for(lambda: running(cp, "late-vol"), timeout_s=60, what="late-vol Running")
    assert exec_out(cp, "late-vol", "cat", "/etc/cfg/k") == "arrived"
