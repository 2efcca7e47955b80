"""A pod using a DRA driver's device through a ResourceClaimTemplate on a klet node of
the full control plane: the objects, waits and reads the two pod-path tests share.

tests/cluster/test_dra_pods.py runs the pod on containerd v2 with CDI on and also reads
the device's environment in the container (`make test-dra`); `make test`'s DRA smoke
(tests/cluster/test_controllers.py) runs it on the devstack's containerd 1.6, which has
no CDI. Both need the same DeviceClass, template and two-container pod, the same wait
for Running (with what the apiserver and syncloop say when it times out), the same
PodResources read and the same wait for the deleted pod to leave the apiserver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
from klet.model.podresources import SOCKET_DIR, SOCKET_NAME
from klet.rpc.gen.klet.podresources.v1 import api_pb2 as pb
from klet.rpc.gen.klet.podresources.v1 import api_pb2_grpc as pb_grpc
from klet.testbed.cluster import ControlPlane

from tests.harness.dra import until
from tests.harness.node import KletNode

REQUEST = "req-0"


def kget(cp: ControlPlane, *args: str) -> Any:
    """`kubectl get <args> -o json`; None when kubectl fails (the object is not there)."""
    res = cp.kubectl("get", *args, "-o", "json")
    return json.loads(res.stdout) if res.returncode == 0 else None


def apply(cp: ControlPlane, obj: dict[str, Any]) -> None:
    cp.kubectl("apply", "-f", "-", input=json.dumps(obj), check=True)


def claim_pod_objects(
    driver: str,
    *,
    template: str,
    pod: str,
    namespace: str,
    node: str,
    image: str,
    pull_policy: str = "Never",
) -> list[dict[str, Any]]:
    """A DeviceClass named `driver` selecting its devices, a ResourceClaimTemplate
    `template` asking for one device of it (request `req-0`), and a host-network pod
    `pod` bound to `node` by nodeSelector (the scheduler still places it) whose
    container `user` names the template's claim `dev` and whose container `other` names
    none; both sleep in `image`, pulled as `pull_policy` says (the DRA tier's containerd
    has it imported and no registry)."""
    container = {"image": image, "imagePullPolicy": pull_policy, "command": ["sleep", "3600"]}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": template, "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": REQUEST, "exactly": {"deviceClassName": driver}}]
                    }
                }
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "hostNetwork": True,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
                "containers": [
                    {**container, "name": "user", "resources": {"claims": [{"name": "dev"}]}},
                    {**container, "name": "other"},
                ],
            },
        },
    ]


def diagnosis(cp: ControlPlane, node: KletNode, pod_name: str, namespace: str) -> str:
    """What the apiserver and syncloop say about the pod, for a failure's message."""
    pod = kget(cp, "pod", pod_name, "-n", namespace) or {}
    events = cp.kubectl("get", "events", "-n", namespace, "-o", "wide").stdout
    claims = cp.kubectl("get", "resourceclaims", "-n", namespace, "-o", "yaml").stdout
    lines = [line for line in node.log("syncloop").splitlines() if "WARN" in line or "rror" in line]
    return (
        f"pod status {json.dumps(pod.get('status'))}\nspec.nodeName "
        f"{pod.get('spec', {}).get('nodeName')}\nevents:\n{events}\nclaims:\n{claims}\n"
        f"syncloop:\n" + "\n".join(lines[-30:])
    )


async def running_pod(
    cp: ControlPlane, node: KletNode, pod_name: str, namespace: str, *, timeout_s: float = 120
) -> dict[str, Any]:
    """The pod once its phase is Running; AssertionError with `diagnosis` after
    `timeout_s`."""

    def running() -> dict[str, Any] | None:
        pod = kget(cp, "pod", pod_name, "-n", namespace)
        return pod if pod and pod["status"].get("phase") == "Running" else None

    try:
        return await until(running, what=f"pod {pod_name} Running", timeout_s=timeout_s)
    except AssertionError as err:
        raise AssertionError(f"{err}: {diagnosis(cp, node, pod_name, namespace)}") from err


def pod_claim(cp: ControlPlane, pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's one generated ResourceClaim (from `status.resourceClaimStatuses`) and
    its one allocation result (driver, pool, device, request)."""
    [status] = pod["status"]["resourceClaimStatuses"]
    claim = kget(
        cp, "resourceclaim", status["resourceClaimName"], "-n", pod["metadata"]["namespace"]
    )
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return claim, result


async def listed_claims(root_dir: Path, pod_name: str) -> dict[str, list[Any]]:
    """The PodResources API's List (klet's socket, the generated v1 client): each
    container of the pod with its dynamic resources as (claim name, claim namespace,
    [(driver, pool, device, [CDI device IDs])])."""
    socket = root_dir / SOCKET_DIR / SOCKET_NAME
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        listed = await stub.List(pb.ListPodResourcesRequest(), timeout=10)
    [pod] = [p for p in listed.pod_resources if p.name == pod_name]
    return {
        c.name: [
            (
                d.claim_name,
                d.claim_namespace,
                [
                    (r.driver_name, r.pool_name, r.device_name, [x.name for x in r.cdi_devices])
                    for r in d.claim_resources
                ],
            )
            for d in c.dynamic_resources
        ]
        for c in pod.containers
    }


async def deleted(
    cp: ControlPlane, pod_name: str, namespace: str, *, timeout_s: float = 90
) -> None:
    """Delete the pod and wait until it is gone from the apiserver (klet reports it
    terminated only after its claims are unprepared)."""
    cp.kubectl("delete", "pod", pod_name, "-n", namespace, "--wait=false", check=True)
    await until(
        lambda: kget(cp, "pod", pod_name, "-n", namespace) is None or None,
        what=f"pod {pod_name} gone from the apiserver",
        timeout_s=timeout_s,
    )


def clean_up(cp: ControlPlane, *, driver: str, template: str, pod: str, namespace: str) -> None:
    """Remove what `claim_pod_objects` made (the pod forced), whatever is still there."""
    cp.kubectl("delete", "pod", pod, "-n", namespace, "--ignore-not-found",
               "--grace-period=0", "--force")  # fmt: skip
    cp.kubectl("delete", "resourceclaimtemplate", template, "-n", namespace, "--ignore-not-found")
    cp.kubectl("delete", "deviceclass", driver, "--ignore-not-found")
