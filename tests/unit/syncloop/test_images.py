"""ImagePuller against FakeRuntimeService, and the apiserver objects it reads.

Covers credentials (pod pull secrets tried before node credentials, each in turn until
one works, no anonymous retry once credentials matched, anonymous when none match, the
FailedToRetrieveImagePullSecret warning for a secret that cannot be read, with or
without an apiserver, credential provider plugins' credentials after all the others),
pull policies and names (IfNotPresent/Never/Always, the `:latest`
default, InvalidImageName), the back-off message carrying the last error, pacing
(registryPullQPS token bucket failing with "pull QPS exceeded", serialized and bounded
parallel pulls), upstream's event texts, node docker config files re-read when they
change, and ApiObjects' TTL cache and error mapping.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from klet.cri import NotFound
from klet.cri.types import AuthConfig, SandboxConfig
from klet.kube import Forbidden
from klet.kube import NotFound as KubeNotFound
from klet.model.flowcontrol import Backoff, TokenBucket
from klet.model.types import JSON
from klet.syncloop.containers.images import (
    QPS_EXCEEDED,
    ImagePuller,
    NodeCredentials,
    PullCredentials,
    go_duration,
    pull_parallelism,
)
from klet.syncloop.environment.kubeobjects import ApiObjects, ObjectUnavailable, env_sources
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import RecordedEvents

REGISTRY = "private.klet.test:5000"
IMAGE = f"{REGISTRY}/app:1"
SANDBOX = SandboxConfig(
    name="p", namespace="ns", uid="u1", attempt=0, hostname="p", log_directory="/tmp"
)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


class Objects:
    """An in-memory `KubeObjects`: secrets by (namespace, name); `locked` names are
    forbidden."""

    def __init__(
        self, secrets: dict[tuple[str, str], JSON], locked: frozenset[str] = frozenset()
    ) -> None:
        self.secrets = secrets
        self.locked = locked
        self.reads: list[str] = []

    async def get_secret(self, namespace: str, name: str) -> JSON | None:
        self.reads.append(name)
        if name in self.locked:
            raise ObjectUnavailable(f'secrets "{name}" is forbidden')
        return self.secrets.get((namespace, name))

    async def get_configmap(self, namespace: str, name: str) -> JSON | None:
        return None

    def forget_cached(self, namespace: str) -> None:
        pass  # keeps no answers: every read is the current object

    async def list_services(self, namespace: str) -> list[JSON]:
        return []


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def pull_secret(user: str, password: str, location: str = REGISTRY) -> JSON:
    config = {"auths": {location: {"auth": b64(f"{user}:{password}")}}}
    return {
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": b64(json.dumps(config))},
    }


def pod(image: str = IMAGE, *, secrets: list[str] = (), policy: str | None = None) -> JSON:  # type: ignore[assignment]
    container: JSON = {"name": "app", "image": image}
    if policy:
        container["imagePullPolicy"] = policy
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {
            "containers": [container],
            "imagePullSecrets": [{"name": s} for s in secrets],
        },
    }


class Plugins:
    """A `PluginCredentials` giving fixed credentials and recording what it was asked."""

    def __init__(self, *creds: AuthConfig) -> None:
        self.creds = list(creds)
        self.asked: list[str] = []
        self.pods: list[JSON | None] = []

    async def lookup(self, repository: str, pod: JSON | None = None) -> list[AuthConfig]:
        self.asked.append(repository)
        self.pods.append(pod)
        return list(self.creds)


class World:
    def __init__(
        self,
        *,
        objects: Objects | None = None,
        node: dict[str, AuthConfig] | None = None,
        parallel: int | None = 1,
        rate: TokenBucket | None = None,
        plugins: Plugins | None = None,
    ) -> None:
        self.clock = Clock()
        self.cri = FakeRuntimeService()
        self.cri.require_auth(REGISTRY, "alice", "wonderland")
        self.events = RecordedEvents()
        self.puller = ImagePuller(
            self.cri,
            self.events,
            parallel=parallel,
            backoff=Backoff(),
            clock=self.clock,
            rate=rate,
            credentials=PullCredentials(
                node=lambda: dict(node or {}), objects=objects, plugins=plugins
            ),
        )

    async def ensure(self, p: JSON) -> Any:
        return await self.puller.ensure(p, p["spec"]["containers"][0], SANDBOX)

    def pulls(self) -> list[tuple[str, ...]]:
        return [c[1:] for c in self.cri.calls_of("PullImage")]


GOOD = AuthConfig(username="alice", password="wonderland")
BAD = AuthConfig(username="mallory", password="guess")


async def test_pod_secrets_are_tried_in_turn_before_the_node_credentials() -> None:
    objects = Objects(
        {
            ("ns", "wrong"): pull_secret("mallory", "x"),
            ("ns", "right"): pull_secret("alice", "wonderland"),
        }
    )
    w = World(objects=objects, node={REGISTRY: BAD})
    outcome = await w.ensure(pod(secrets=["wrong", "right"]))
    assert outcome.image_ref is not None and outcome.waiting is None
    assert w.pulls() == [(IMAGE, "mallory"), (IMAGE, "alice")]
    assert w.events.reasons() == ["Pulling", "Pulled"]


async def test_plugin_credentials_come_after_the_secrets_and_the_node() -> None:
    objects = Objects({("ns", "wrong"): pull_secret("mallory", "x")})
    plugins = Plugins(GOOD)
    w = World(objects=objects, node={REGISTRY: BAD}, plugins=plugins)
    outcome = await w.ensure(pod(secrets=["wrong"]))
    assert outcome.image_ref is not None
    assert w.pulls() == [(IMAGE, "mallory"), (IMAGE, "mallory"), (IMAGE, "alice")]
    assert plugins.asked == [f"{REGISTRY}/app"]  # the repository: no tag
    # the pulling pod, whose service account a provider with tokenAttributes uses
    assert [(p or {}).get("metadata", {}).get("namespace") for p in plugins.pods] == ["ns"]


async def test_plugin_credentials_alone() -> None:
    w = World(plugins=Plugins(GOOD))
    assert (await w.ensure(pod())).image_ref is not None
    assert w.pulls() == [(IMAGE, "alice")]


async def test_node_credentials_when_the_pod_has_no_secrets() -> None:
    w = World(node={REGISTRY: GOOD})
    assert (await w.ensure(pod())).image_ref is not None
    assert w.pulls() == [(IMAGE, "alice")]


async def test_no_anonymous_retry_once_credentials_matched() -> None:
    w = World(node={REGISTRY: BAD, f"{REGISTRY}/app": BAD})
    outcome = await w.ensure(pod())
    assert outcome.waiting is not None and outcome.waiting[0] == "ErrImagePull"
    assert w.pulls() == [(IMAGE, "mallory"), (IMAGE, "mallory")]
    # the same error twice is printed once, as upstream's aggregate does
    assert outcome.waiting[1].startswith(f'failed to pull and unpack image "{IMAGE}"')
    assert w.events.reasons() == ["Pulling", "Failed", "Failed"]
    assert w.events.records[1][2] == f'Failed to pull image "{IMAGE}": {outcome.waiting[1]}'
    assert w.events.records[2][2] == "Error: ErrImagePull"


async def test_image_without_matching_credentials_is_pulled_anonymously() -> None:
    w = World(node={"elsewhere.io": GOOD})
    w.cri.add_image("registry.klet.test/busybox:1.36")
    assert (await w.ensure(pod("registry.klet.test/busybox:1.36", policy="Always"))).image_ref
    assert w.pulls() == [("registry.klet.test/busybox:1.36", "")]


@pytest.mark.parametrize(
    ("objects", "names", "missing"),
    [
        (None, ["creds"], "creds"),  # standalone: there is no apiserver to read it from
        (Objects({}), ["gone", "also"], "gone, also"),
        (Objects({}, locked=frozenset({"creds"})), ["creds"], "creds"),
        (
            Objects(
                {("ns", "creds"): {"type": "kubernetes.io/dockercfg", "data": {".dockercfg": "!"}}}
            ),
            ["creds"],
            "creds",
        ),
    ],
)
async def test_unreadable_pull_secrets_warn_and_the_pull_goes_on(
    objects: Objects | None, names: list[str], missing: str
) -> None:
    w = World(objects=objects, node={REGISTRY: GOOD})
    assert (await w.ensure(pod(secrets=names))).image_ref is not None
    assert w.events.reasons() == ["FailedToRetrieveImagePullSecret", "Pulling", "Pulled"]
    assert w.events.message("FailedToRetrieveImagePullSecret") == (
        f"Unable to retrieve some image pull secrets ({missing}); "
        "attempting to pull the image may not succeed."
    )


async def test_secrets_of_other_types_are_ignored_without_a_warning() -> None:
    objects = Objects({("ns", "opaque"): {"type": "Opaque", "data": {"k": b64("v")}}})
    w = World(objects=objects, node={REGISTRY: GOOD})
    assert (await w.ensure(pod(secrets=["opaque", ""]))).image_ref is not None
    assert "FailedToRetrieveImagePullSecret" not in w.events.reasons()
    assert objects.reads == ["opaque"]  # an empty name is skipped, as upstream


async def test_present_image_is_neither_pulled_nor_its_secrets_read() -> None:
    objects = Objects({})
    w = World(objects=objects)
    w.cri.add_image(IMAGE)
    assert (await w.ensure(pod(secrets=["creds"]))).image_ref is not None
    assert w.pulls() == [] and objects.reads == []
    assert w.events.triples() == [
        ("Normal", "Pulled", f'Container image "{IMAGE}" already present on machine')
    ]


async def test_image_without_tag_is_pulled_as_latest() -> None:
    w = World()
    outcome = await w.ensure(pod("registry.klet.test/tool"))  # :latest → policy Always
    assert outcome.image_ref is not None
    assert w.pulls() == [("registry.klet.test/tool:latest", "")]
    assert w.events.message("Pulling") == 'Pulling image "registry.klet.test/tool"'


async def test_invalid_image_name() -> None:
    w = World()
    outcome = await w.ensure(pod("bad image"))
    message = (
        'Failed to apply default image tag "bad image": '
        'couldn\'t parse image name "bad image": invalid reference format'
    )
    assert outcome.waiting == ("InvalidImageName", message)
    assert w.events.triples() == [
        ("Warning", "InspectFailed", message),
        ("Warning", "Failed", "Error: InvalidImageName"),
    ]
    assert w.pulls() == []


async def test_never_policy_with_a_missing_image() -> None:
    w = World()
    outcome = await w.ensure(pod(policy="Never"))
    message = f'Container image "{IMAGE}" is not present with pull policy of Never'
    assert outcome.waiting == ("ErrImageNeverPull", message)
    assert w.events.reasons() == ["ErrImageNeverPull", "Failed"] and w.pulls() == []


async def test_back_off_message_carries_the_last_pull_error() -> None:
    w = World()
    w.cri.fail_pull(IMAGE, NotFound("PullImage: NOT_FOUND: manifest unknown", code="NOT_FOUND"))
    first = await w.ensure(pod())
    assert first.waiting == ("ErrImagePull", "manifest unknown")
    assert first.wake_at == pytest.approx(w.clock() + 10)
    w.clock.t += 3
    second = await w.ensure(pod())
    assert second.waiting == (
        "ImagePullBackOff",
        f'Back-off pulling image "{IMAGE}": ErrImagePull: manifest unknown',
    )
    assert w.events.triples()[-2:] == [
        ("Normal", "BackOff", f'Back-off pulling image "{IMAGE}"'),
        ("Warning", "Failed", "Error: ImagePullBackOff"),
    ]
    assert len(w.pulls()) == 1


async def test_a_longer_back_off_is_shown_as_image_pull_back_off_in_between() -> None:
    w = World()
    w.cri.fail_pull(IMAGE, NotFound("PullImage: NOT_FOUND: manifest unknown", code="NOT_FOUND"))
    await w.ensure(pod())
    w.clock.t += 10
    second = await w.ensure(pod())  # the 10 s back-off is over: pulls, fails again
    assert second.waiting is not None and second.waiting[0] == "ErrImagePull"
    # the next delay is 20 s, but the pod is synced again after 10 s, as upstream's
    # worker does after a failed sync, and then shows the back-off
    assert second.wake_at == pytest.approx(w.clock() + 10)
    w.clock.t += 10
    third = await w.ensure(pod())
    assert third.waiting is not None and third.waiting[0] == "ImagePullBackOff"
    assert third.wake_at == pytest.approx(w.clock() + 10)
    assert len(w.pulls()) == 2


async def test_registry_unavailable_gets_upstream_reason() -> None:
    w = World()
    w.cri.fail_pull(
        IMAGE, NotFound("PullImage: UNKNOWN: RegistryUnavailable: no route", code="UNKNOWN")
    )
    outcome = await w.ensure(pod())
    assert outcome.waiting == (
        "RegistryUnavailable",
        f"image pull failed for {IMAGE} because the registry is unavailable: no route",
    )


async def test_pull_qps_exceeded_fails_the_pull_at_once() -> None:
    w = World(node={REGISTRY: GOOD}, rate=TokenBucket(1.0, 2, now=Clock().t))
    for uid in ("a", "b"):
        p = pod()
        p["metadata"]["uid"] = uid
        assert (await w.ensure(p)).image_ref is not None
        w.cri.images.clear()
    third = pod()
    third["metadata"]["uid"] = "c"
    outcome = await w.ensure(third)
    assert outcome.waiting == ("ErrImagePull", QPS_EXCEEDED)
    assert len(w.pulls()) == 2  # the third never reached the runtime
    w.clock.t += 1.0
    fourth = pod()
    fourth["metadata"]["uid"] = "d"
    assert (await w.ensure(fourth)).image_ref is not None


@pytest.mark.parametrize(
    ("serialize", "max_parallel", "parallel"),
    [(True, None, 1), (True, 1, 1), (False, 3, 3), (False, None, None)],
)
def test_pull_parallelism(serialize: bool, max_parallel: int | None, parallel: int | None) -> None:
    assert pull_parallelism(serialize=serialize, max_parallel=max_parallel) == parallel


@pytest.mark.parametrize(("parallel", "peak"), [(1, 1), (2, 2), (None, 4)])
async def test_concurrent_pulls_are_bounded(parallel: int | None, peak: int) -> None:
    w = World(parallel=parallel)
    release = asyncio.Event()
    running = [0]
    seen = [0]

    async def hold() -> None:
        running[0] += 1
        seen[0] = max(seen[0], running[0])
        await release.wait()
        running[0] -= 1

    w.cri.hooks["PullImage"] = hold
    pods = []
    for i in range(4):
        p = pod(f"registry.klet.test/img{i}:1")
        p["metadata"]["uid"] = f"u{i}"
        pods.append(p)
    tasks = [asyncio.create_task(w.ensure(p)) for p in pods]
    for _ in range(20):
        await asyncio.sleep(0)
    assert seen[0] == peak
    release.set()
    outcomes = await asyncio.gather(*tasks)
    assert all(o.image_ref for o in outcomes) and seen[0] == peak


async def test_pulled_event_has_upstream_wording() -> None:
    w = World(node={REGISTRY: GOOD})
    await w.ensure(pod())
    message = w.events.message("Pulled")
    assert message.startswith(f'Successfully pulled image "{IMAGE}" in ')
    assert " including waiting). Image size: 0 bytes." in message


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.0004, "0s"),
        (0.313, "313ms"),
        (1.5946, "1.594s"),
        (2.0, "2s"),
        (61.5, "1m1.5s"),
        (3600.25, "1h0m0.25s"),
    ],
)
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_node_credentials_are_reread_when_a_file_changes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    creds = NodeCredentials(root, cwd=tmp_path / "cwd", home=tmp_path / "home")
    assert creds() == {}
    (root / "config.json").write_text(json.dumps({"auths": {REGISTRY: {"auth": b64("a:b")}}}))
    assert creds() == {REGISTRY: AuthConfig(username="a", password="b")}
    (root / "config.json").write_text(json.dumps({"auths": {REGISTRY: {"auth": b64("c:dd")}}}))
    assert creds() == {REGISTRY: AuthConfig(username="c", password="dd")}


class Kube:
    """A fake apiserver for ApiObjects: objects by path; `forbidden` paths answer 403."""

    def __init__(self, objects: dict[str, JSON], forbidden: frozenset[str] = frozenset()) -> None:
        self.objects = objects
        self.forbidden = forbidden
        self.gets: list[str] = []

    async def get(self, path: str, **params: Any) -> Any:
        self.gets.append(path)
        if path in self.forbidden:
            raise Forbidden(f'GET {path}: 403 secrets "x" is forbidden: nope', status=403)
        if path not in self.objects:
            raise KubeNotFound(f"GET {path}: 404 not found", status=404)
        return self.objects[path]


CM_PATH = "/api/v1/namespaces/ns/configmaps/cm"
SECRET_PATH = "/api/v1/namespaces/ns/secrets/s"


async def test_api_objects_cache_answers_for_the_ttl() -> None:
    now = [0.0]
    kube = Kube({CM_PATH: {"data": {"k": "v"}}})
    objects = ApiObjects(kube, ttl_s=5.0, clock=lambda: now[0])
    assert await objects.get_configmap("ns", "cm") == {"data": {"k": "v"}}
    assert await objects.get_configmap("ns", "gone") is None
    assert await objects.get_configmap("ns", "cm") is not None
    assert await objects.get_configmap("ns", "gone") is None
    assert len(kube.gets) == 2
    kube.objects["/api/v1/namespaces/ns/configmaps/gone"] = {"data": {}}
    now[0] = 5.5
    assert await objects.get_configmap("ns", "gone") == {"data": {}}
    assert len(kube.gets) == 3


async def test_api_objects_forget_cached_makes_the_next_read_ask_again() -> None:
    kube = Kube({CM_PATH: {"data": {"k": "old"}}})
    objects = ApiObjects(kube, ttl_s=5.0, clock=lambda: 0.0)
    assert await objects.get_configmap("ns", "cm") == {"data": {"k": "old"}}
    kube.objects[CM_PATH] = {"data": {"k": "new"}}
    assert await objects.get_configmap("ns", "cm") == {"data": {"k": "old"}}  # within the TTL
    objects.forget_cached("ns")
    assert await objects.get_configmap("ns", "cm") == {"data": {"k": "new"}}
    assert len(kube.gets) == 2


async def test_a_new_pod_drops_its_namespaces_objects_and_keeps_the_rest() -> None:
    """Issue 42: a new pod's first volume set-up drops the cached answers it must read
    afresh (its namespace's Secrets, ConfigMaps, claims, Services and ServiceAccounts,
    the master Services, PVs, VolumeAttachments) and keeps the rest for the TTL: other
    namespaces' objects, CSIDrivers, RuntimeClasses, the Node. It used to drop all."""
    kube = Kube({})
    objects = ApiObjects(kube, ttl_s=5.0, clock=lambda: 0.0)

    async def read_everything() -> None:
        for ns in ("ns", "other"):
            await objects.get_configmap(ns, "cm")
            await objects.get_secret(ns, "s")
            await objects.get_pvc(ns, "claim")
            await objects.get_service_account(ns, "sa")
            await objects.list_services(ns)
        await objects.list_services("default")
        await objects.get_pv("pv1")
        await objects.get_volume_attachment("va1")
        await objects.get_csi_driver("drv")
        await objects.get_runtime_class("rc")
        await objects.get_node("node1")

    await read_everything()
    kube.gets.clear()
    objects.forget_cached("ns")
    await read_everything()
    assert sorted(kube.gets) == sorted(
        [
            "/api/v1/namespaces/ns/configmaps/cm",
            "/api/v1/namespaces/ns/secrets/s",
            "/api/v1/namespaces/ns/persistentvolumeclaims/claim",
            "/api/v1/namespaces/ns/serviceaccounts/sa",
            "/api/v1/namespaces/ns/services",
            "/api/v1/namespaces/default/services",
            "/api/v1/persistentvolumes/pv1",
            "/apis/storage.k8s.io/v1/volumeattachments/va1",
        ]
    )


async def test_api_objects_report_other_errors_in_the_apiservers_words() -> None:
    objects = ApiObjects(Kube({}, forbidden=frozenset({SECRET_PATH})))
    with pytest.raises(ObjectUnavailable) as err:
        await objects.get_secret("ns", "s")
    assert str(err.value) == 'secrets "x" is forbidden: nope'


async def test_env_sources_read_and_decode_the_referenced_objects() -> None:
    kube = Kube(
        {
            CM_PATH: {"data": {"level": "debug"}},
            SECRET_PATH: {"data": {"user": b64("admin")}},
        },
        forbidden=frozenset({"/api/v1/namespaces/ns/secrets/locked"}),
    )
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "locked"}}],
        "env": [
            {"name": "U", "valueFrom": {"secretKeyRef": {"name": "s", "key": "user"}}},
            {"name": "G", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}},
        ],
    }
    sources = await env_sources(ApiObjects(kube), {"metadata": {"namespace": "ns"}}, container)
    assert sources is not None
    assert sources.config_maps == {"cm": {"level": "debug"}}
    assert sources.secrets == {"s": {"user": "admin"}}
    assert sources.failures == {("secret", "locked"): 'secrets "x" is forbidden: nope'}
    assert await env_sources(None, {}, container) is None
