"""ConfigMaps, Secrets and Services from the apiserver, for environment references, pull
secrets and service links; ServiceAccounts, for credential provider plugins given the
pod's service account token; RuntimeClasses, for the sandbox's runtime handler;
PersistentVolumeClaims, PersistentVolumes, CSIDrivers and VolumeAttachments, for the
volumes of claims and CSI drivers.

Cluster mode only: a standalone syncloop has no `KubeObjects` at all, and its callers
treat that as upstream treats a kubelet without an API client. The Node authorizer lets
the node GET a Secret or ConfigMap only while a pod bound to it refers to the object,
which is exactly when syncloop asks. Services are listed by namespace (the pod's, and
`default` for the master Service), which the node's RBAC role allows; a static pod whose
list fails starts without service variables (the control plane's own pods on a kubeadm
node start before there is an apiserver to list from).

`ApiObjects` keeps what it read for a few seconds (absent objects too), so one sync of
a pod whose containers share a ConfigMap reads it once, while an object created or
changed later is seen at the next retry. Upstream's default strategy watches each
referenced object instead; a short TTL gives the same outcome for container start,
the only place syncloop reads these objects, with no watch to keep per object. A new
pod reads its namespace's objects as the apiserver holds them now, not the cache
(`forget_cached` at its first volume set-up), as upstream refetches an object when a
new pod refers to it: the pods a rollout creates right after their ConfigMap changed
(`helm upgrade`) would otherwise get the old one from a read the pods they replace made
seconds before. What a new pod does not need afresh (other namespaces' objects,
CSIDrivers, RuntimeClasses, the Node) stays cached for its TTL: each new pod used to
drop every answer, so a burst of pods read the same CSIDriver once per pod (issue 42).
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

from klet.kube import KubeError
from klet.kube import NotFound as KubeNotFound
from klet.model.pod import is_static
from klet.model.types import JSON
from klet.syncloop.environment import envvars, servicelinks

DEFAULT_TTL_S = 5.0


class ObjectUnavailable(Exception):
    """An object could not be read for another reason than its absence (forbidden,
    apiserver down); the message says why, as the apiserver put it."""


class KubeObjects(Protocol):
    """What syncloop reads from the apiserver: one object by namespace and name."""

    async def get_secret(self, namespace: str, name: str) -> JSON | None:
        """The Secret, or None when it does not exist; raises `ObjectUnavailable`."""
        ...

    async def get_configmap(self, namespace: str, name: str) -> JSON | None:
        """The ConfigMap, or None when it does not exist; raises `ObjectUnavailable`."""
        ...

    async def list_services(self, namespace: str) -> list[JSON]:
        """The Services of `namespace`; raises `ObjectUnavailable`."""
        ...

    def forget_cached(self, namespace: str) -> None:
        """Drop the answers a new pod of `namespace` reads afresh (`FRESH_FOR_A_NEW_POD`):
        the next read of each asks the apiserver (a reader that keeps nothing has
        nothing to drop)."""
        ...


class Kube(Protocol):
    """The part of `klet.kube.KubeClient` used here."""

    async def get(self, path: str, **params: Any) -> Any: ...

    async def patch(self, path: str, body: Any, *, kind: str = "strategic") -> Any: ...


class ApiObjects:
    """`KubeObjects` over a `KubeClient`, with a TTL cache of answers."""

    def __init__(
        self,
        kube: Kube,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.ttl_s = ttl_s
        self.clock = clock
        self._cache: dict[tuple[str, str, str], tuple[float, JSON | None]] = {}

    async def get_secret(self, namespace: str, name: str) -> JSON | None:
        return await self._get("secrets", namespace, name)

    async def get_configmap(self, namespace: str, name: str) -> JSON | None:
        return await self._get("configmaps", namespace, name)

    async def list_services(self, namespace: str) -> list[JSON]:
        found = await self._get("services", namespace, "")
        return list((found or {}).get("items") or [])

    async def get_service_account(self, namespace: str, name: str) -> JSON | None:
        """For credential provider plugins with tokenAttributes (its UID and annotations)."""
        return await self._get("serviceaccounts", namespace, name)

    async def get_runtime_class(self, name: str) -> JSON | None:
        """The RuntimeClass `name` (cluster-scoped, node.k8s.io/v1), or None."""
        path = f"/apis/node.k8s.io/v1/runtimeclasses/{quote(name, safe='')}"
        return await self._fetch(("runtimeclasses", "", name), path)

    async def get_pvc(self, namespace: str, name: str) -> JSON | None:
        return await self._get("persistentvolumeclaims", namespace, name)

    async def get_pv(self, name: str) -> JSON | None:
        path = f"/api/v1/persistentvolumes/{quote(name, safe='')}"
        return await self._fetch(("persistentvolumes", "", name), path)

    async def get_csi_driver(self, name: str) -> JSON | None:
        """The CSIDriver object `name` (storage.k8s.io/v1), or None."""
        path = f"/apis/storage.k8s.io/v1/csidrivers/{quote(name, safe='')}"
        return await self._fetch(("csidrivers", "", name), path)

    async def get_volume_attachment(self, name: str) -> JSON | None:
        path = f"/apis/storage.k8s.io/v1/volumeattachments/{quote(name, safe='')}"
        return await self._fetch(("volumeattachments", "", name), path)

    async def get_node(self, name: str) -> JSON | None:
        path = f"/api/v1/nodes/{quote(name, safe='')}"
        return await self._fetch(("nodes", "", name), path)

    async def patch_pvc_status(self, namespace: str, name: str, patch: JSON) -> JSON | None:
        """A merge patch of the claim's status (the node may write its resize fields);
        the claim as patched (None when the answer is not an object); raises
        `ObjectUnavailable` (a stale `metadata.resourceVersion` in the patch too)."""
        path = (
            f"/api/v1/namespaces/{quote(namespace, safe='')}/persistentvolumeclaims/"
            f"{quote(name, safe='')}/status"
        )
        try:
            patched = await self.kube.patch(path, patch, kind="merge")
        except KubeError as err:
            raise ObjectUnavailable(str(err)) from err
        self._cache.pop(("persistentvolumeclaims", namespace, name), None)
        return patched if isinstance(patched, dict) else None

    def forget_cached(self, namespace: str) -> None:
        self._cache = {
            key: kept for key, kept in self._cache.items() if not _fresh_for(key, namespace)
        }

    async def _get(self, resource: str, namespace: str, name: str) -> JSON | None:
        """One object, or with an empty `name` the list of them."""
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/{resource}"
        if name:
            path += f"/{quote(name, safe='')}"
        return await self._fetch((resource, namespace, name), path)

    async def _fetch(self, key: tuple[str, str, str], path: str) -> JSON | None:
        now = self.clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            obj: JSON | None = await self.kube.get(path)
        except KubeNotFound:
            obj = None
        except KubeError as err:
            raise ObjectUnavailable(_apiserver_message(err, path)) from err
        self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[key] = (now + self.ttl_s, obj)
        return obj


FRESH_FOR_A_NEW_POD = frozenset(
    {"secrets", "configmaps", "persistentvolumeclaims", "serviceaccounts", "services"}
)
"""The kinds of the pod's own namespace that a new pod reads afresh, as upstream
refetches a Secret or ConfigMap when a pod that refers to it registers, GETs a claim
for each new pod and reads Services and ServiceAccounts from informers; the master
Services (`default`) are listed afresh too."""

FRESH_CLUSTER_WIDE = frozenset({"persistentvolumes", "volumeattachments"})
"""Cluster-scoped kinds a new pod reads afresh: its claim's PV (upstream GETs it with
the claim) and its volumes' attachments (a cached "not attached yet" would hold the
pod back for a TTL). CSIDrivers, RuntimeClasses and the Node stay cached for their TTL."""


def _fresh_for(key: tuple[str, str, str], namespace: str) -> bool:
    """Whether the cached answer `key` (resource, namespace, name) is dropped when a new
    pod of `namespace` is set up."""
    resource, ns, _name = key
    if resource in FRESH_CLUSTER_WIDE:
        return True
    if resource == "services" and ns == servicelinks.MASTER_NAMESPACE:
        return True
    return ns == namespace and resource in FRESH_FOR_A_NEW_POD


def _apiserver_message(err: KubeError, path: str) -> str:
    """The apiserver's own words (`secrets "x" is forbidden: ...`) without our prefix."""
    text = str(err)
    prefix = f"GET {path}: {err.status} "
    return text[len(prefix) :] if text.startswith(prefix) else text


def secret_data(secret: JSON) -> dict[str, str]:
    """A Secret's `data`, decoded (values are base64 in the API). Bytes that are not
    UTF-8 become lone surrogates, not replacement characters: nothing is lost, and
    `envvars` refuses to pass such a value on (see there)."""
    out: dict[str, str] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[str(key)] = base64.b64decode(str(value)).decode("utf-8", "surrogateescape")
        except (binascii.Error, ValueError):
            continue
    return out


async def env_sources(
    objects: KubeObjects | None, pod: JSON, container: JSON
) -> envvars.EnvSources | None:
    """Read what the container's environment refers to; None without an apiserver."""
    if objects is None:
        return None
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    config_map_names, secret_names = envvars.references(container)
    config_maps: dict[str, dict[str, str]] = {}
    secrets: dict[str, dict[str, str]] = {}
    failures: dict[tuple[str, str], str] = {}
    for name in config_map_names:
        try:
            cm = await objects.get_configmap(namespace, name)
        except ObjectUnavailable as err:
            failures[("configmap", name)] = str(err)
            continue
        if cm is not None:
            config_maps[name] = {str(k): str(v) for k, v in (cm.get("data") or {}).items()}
    for name in secret_names:
        try:
            secret = await objects.get_secret(namespace, name)
        except ObjectUnavailable as err:
            failures[("secret", name)] = str(err)
            continue
        if secret is not None:
            secrets[name] = secret_data(secret)
    service_env: list[tuple[str, str]] = []
    services_failure: str | None = None
    try:
        links = servicelinks.links_enabled(pod)
        service_env = servicelinks.service_env(
            servicelinks.visible_services(
                namespace,
                own=await objects.list_services(namespace) if links else [],
                master=await objects.list_services(servicelinks.MASTER_NAMESPACE),
                links=links,
            )
        )
    except ObjectUnavailable as err:
        # A static pod starts without the Services, as upstream's kubelet starts one
        # before its service lister has synced (a control-plane node's apiserver is one
        # of them); a pod from the apiserver waits for them.
        if not is_static(pod):
            services_failure = f"failed to list services: {err}"
    return envvars.EnvSources(
        config_maps=config_maps,
        secrets=secrets,
        failures=failures,
        service_env=tuple(service_env),
        services_failure=services_failure,
    )
