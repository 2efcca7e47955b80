"""configMap, secret, downwardAPI and projected volumes as upstream builds them: all keys
or the listed `items` with their modes, binaryData and Secret values decoded, `optional`
objects and keys, upstream's messages for a missing object or key and for an object
that cannot be read, no volume without an apiserver; downwardAPI labels/annotations as
sorted `key="value"` lines quoted as Go's %q, resourceFieldRef with divisor and node
capacity, errors aggregated; projected sources merged (the kube-api-access volume),
token file modes with fsGroup, unsupported sources; a configMap volume refreshed in
place when the object changes and left absent when it is missing; the token manager's
TokenRequest (bound to the pod), cache and refresh at 80 % of the lifetime or 24 h,
and its fallback to a still-valid token when a refresh fails."""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from klet.kube import Forbidden, NotFound, Unavailable
from klet.model.types import JSON
from klet.syncloop.environment.envvars import NodeFacts, format_map, go_quote
from klet.syncloop.environment.kubeobjects import ObjectUnavailable
from klet.syncloop.volumes import payloads
from klet.syncloop.volumes.atomic import FileProjection
from klet.syncloop.volumes.base import VolumeContext, VolumeError
from klet.syncloop.volumes.content import (
    ConfigMapPlugin,
    DownwardAPIPlugin,
    ProjectedPlugin,
    SecretPlugin,
)
from klet.syncloop.volumes.tokens import Token, TokenError, TokenManager, requires_refresh

NODE = NodeFacts(host_ips=("192.168.1.5",), cpu_millis=4000, memory_bytes=8 * 1024**3)


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


class FakeObjects:
    """ConfigMaps and Secrets by (namespace, name); `broken` names fail to be read."""

    def __init__(self) -> None:
        self.configmaps: dict[tuple[str, str], JSON] = {}
        self.secrets: dict[tuple[str, str], JSON] = {}
        self.broken: dict[str, str] = {}
        self.reads: list[tuple[str, str, str]] = []
        self.forgotten = 0

    def forget_cached(self, namespace: str) -> None:
        self.forgotten += 1

    async def get_configmap(self, namespace: str, name: str) -> JSON | None:
        self.reads.append(("configmap", namespace, name))
        if name in self.broken:
            raise ObjectUnavailable(self.broken[name])
        return self.configmaps.get((namespace, name))

    async def get_secret(self, namespace: str, name: str) -> JSON | None:
        self.reads.append(("secret", namespace, name))
        if name in self.broken:
            raise ObjectUnavailable(self.broken[name])
        return self.secrets.get((namespace, name))

    async def list_services(self, namespace: str) -> list[JSON]:
        return []


class FakeTokens:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def token(
        self, pod: JSON, *, service_account: str, audience: str, expiration_s: int
    ) -> tuple[str, float]:
        self.calls.append(
            {"sa": service_account, "audience": audience, "expiration_s": expiration_s}
        )
        return f"token-for-{service_account}", 1e10


def make_pod(**spec: Any) -> JSON:
    return {
        "metadata": {
            "name": "web",
            "namespace": "prod",
            "uid": "u-1",
            "labels": {"tier": "front", "app": "web"},
            "annotations": {"note": 'say "hi"\n\tbye', "a": "ü"},
        },
        "spec": {
            "serviceAccountName": "builder",
            "containers": [
                {"name": "main", "resources": {"limits": {"memory": "64Mi"}}},
            ],
            **spec,
        },
    }


def context(
    tmp_path: Path,
    *,
    pod: JSON | None = None,
    objects: FakeObjects | None = None,
    tokens: FakeTokens | None = None,
) -> VolumeContext:
    return VolumeContext(
        pod=pod or make_pod(),
        pod_dir=tmp_path / "pods" / "u-1",
        objects=objects,
        tokens=tokens,
        node=NODE,
        pod_ip="10.1.0.7",
    )


def as_text(payload: dict[str, FileProjection]) -> dict[str, tuple[str, str]]:
    return {k: (v.data.decode(), oct(v.mode)) for k, v in payload.items()}


@pytest.fixture
def objects() -> FakeObjects:
    found = FakeObjects()
    found.configmaps[("prod", "settings")] = {
        "data": {"level": "debug", "mode": "fast"},
        "binaryData": {"blob": b64(b"\x00\x01")},
    }
    found.secrets[("prod", "creds")] = {"data": {"user": b64("admin"), "key": b64(b"\xff\xfe")}}
    return found


# -- configMap and secret ------------------------------------------------------------


async def test_configmap_all_keys_with_default_mode(tmp_path: Path, objects: FakeObjects) -> None:
    volume = {"name": "cfg", "configMap": {"name": "settings", "defaultMode": 0o440}}
    payload = await ConfigMapPlugin().payload(volume, context(tmp_path, objects=objects))
    assert payload == {
        "level": FileProjection(b"debug", 0o440),
        "mode": FileProjection(b"fast", 0o440),
        "blob": FileProjection(b"\x00\x01", 0o440),
    }


async def test_configmap_items_paths_and_modes(tmp_path: Path, objects: FakeObjects) -> None:
    volume = {
        "name": "cfg",
        "configMap": {
            "name": "settings",
            "items": [
                {"key": "level", "path": "conf/level.txt", "mode": 0o400},
                {"key": "blob", "path": "bin"},
            ],
        },
    }
    payload = await ConfigMapPlugin().payload(volume, context(tmp_path, objects=objects))
    assert payload == {
        "conf/level.txt": FileProjection(b"debug", 0o400),
        "bin": FileProjection(b"\x00\x01", 0o644),  # the API's default mode
    }


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"name": "absent"}, 'configmap "absent" not found'),
        (
            {"name": "settings", "items": [{"key": "nope", "path": "x"}]},
            "configmap references non-existent config key: nope",
        ),
        ({"name": "broken"}, 'configmaps "broken" is forbidden: no'),
        # `optional` excuses absence, never an object that could not be read
        ({"name": "broken", "optional": True}, 'configmaps "broken" is forbidden: no'),
    ],
)
async def test_configmap_errors(
    tmp_path: Path, objects: FakeObjects, source: JSON, expected: str
) -> None:
    objects.broken["broken"] = 'configmaps "broken" is forbidden: no'
    with pytest.raises(VolumeError) as err:
        await ConfigMapPlugin().payload(
            {"name": "cfg", "configMap": source}, context(tmp_path, objects=objects)
        )
    assert str(err.value) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"name": "absent", "optional": True}, {}),
        (
            {
                "name": "settings",
                "optional": True,
                "items": [{"key": "nope", "path": "x"}, {"key": "mode", "path": "m"}],
            },
            {"m": ("fast", "0o644")},
        ),
    ],
)
async def test_configmap_optional(
    tmp_path: Path, objects: FakeObjects, source: JSON, expected: dict[str, Any]
) -> None:
    payload = await ConfigMapPlugin().payload(
        {"name": "cfg", "configMap": source}, context(tmp_path, objects=objects)
    )
    assert as_text(payload) == expected


async def test_secret_values_are_decoded(tmp_path: Path, objects: FakeObjects) -> None:
    volume = {
        "name": "s",
        "secret": {"secretName": "creds", "items": [{"key": "key", "path": "k"}]},
    }
    payload = await SecretPlugin().payload(volume, context(tmp_path, objects=objects))
    assert payload == {"k": FileProjection(b"\xff\xfe", 0o644)}
    volume = {"name": "s", "secret": {"secretName": "creds"}}
    payload = await SecretPlugin().payload(volume, context(tmp_path, objects=objects))
    assert payload["user"].data == b"admin"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"secretName": "absent"}, 'secret "absent" not found'),
        (
            {"secretName": "creds", "items": [{"key": "pw", "path": "pw"}]},
            "references non-existent secret key: pw",
        ),
    ],
)
async def test_secret_errors(
    tmp_path: Path, objects: FakeObjects, source: JSON, expected: str
) -> None:
    with pytest.raises(VolumeError) as err:
        await SecretPlugin().payload(
            {"name": "s", "secret": source}, context(tmp_path, objects=objects)
        )
    assert str(err.value) == expected


@pytest.mark.parametrize(
    ("plugin", "volume", "kind"),
    [
        (ConfigMapPlugin(), {"name": "v", "configMap": {"name": "x"}}, "configMap"),
        (SecretPlugin(), {"name": "v", "secret": {"secretName": "x"}}, "secret"),
        (ProjectedPlugin(), {"name": "v", "projected": {"sources": []}}, "projected"),
    ],
)
async def test_standalone_has_no_objects(
    tmp_path: Path, plugin: Any, volume: JSON, kind: str
) -> None:
    with pytest.raises(VolumeError) as err:
        await plugin.set_up(volume, context(tmp_path))
    assert str(err.value) == (f"cannot setup {kind} volume v because kube client is not configured")
    assert not (tmp_path / "pods").exists()


async def test_configmap_volume_refreshed_in_place(tmp_path: Path, objects: FakeObjects) -> None:
    plugin = ConfigMapPlugin()
    ctx = context(tmp_path, objects=objects)
    volume = {
        "name": "cfg",
        "configMap": {"name": "settings", "items": [{"key": "level", "path": "level"}]},
    }
    path = await plugin.set_up(volume, ctx)
    assert path == tmp_path / "pods/u-1/volumes/kubernetes.io~configmap/cfg"
    assert (path / "level").read_text() == "debug"
    # readable and traversable by any container user, writable by klet alone
    assert oct(os.stat(path).st_mode & 0o777) == "0o755"
    first = os.readlink(path / "..data")
    assert await plugin.set_up(volume, ctx) == path
    assert os.readlink(path / "..data") == first  # unchanged: not rewritten
    objects.configmaps[("prod", "settings")] = {"data": {"level": "info"}}
    await plugin.set_up(volume, ctx)
    assert (path / "level").read_text() == "info"
    assert os.readlink(path / "..data") != first
    await plugin.tear_down(path)
    assert not path.exists()


async def test_missing_configmap_leaves_no_directory(tmp_path: Path, objects: FakeObjects) -> None:
    with pytest.raises(VolumeError):
        await ConfigMapPlugin().set_up(
            {"name": "cfg", "configMap": {"name": "absent"}}, context(tmp_path, objects=objects)
        )
    assert not (tmp_path / "pods").exists()


async def test_fs_group_owns_the_configmap_volume(tmp_path: Path, objects: FakeObjects) -> None:
    pod = make_pod(securityContext={"fsGroup": 2345})
    volume = {"name": "cfg", "configMap": {"name": "settings", "defaultMode": 0o400}}
    path = await ConfigMapPlugin().set_up(volume, context(tmp_path, pod=pod, objects=objects))
    info = os.stat(path / "level")
    assert info.st_gid == 2345
    assert oct(info.st_mode & 0o777) == "0o440"
    objects.configmaps[("prod", "settings")] = {"data": {"level": "info"}}
    await ConfigMapPlugin().set_up(volume, context(tmp_path, pod=pod, objects=objects))
    assert os.stat(path / "level").st_gid == 2345  # the new payload too
    root = os.stat(path)
    assert root.st_gid == 2345 and root.st_mode & 0o2000  # setgid kept across syncs


# -- downwardAPI ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("plain", '"plain"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a\nb\tc\\", '"a\\nb\\tc\\\\"'),
        ("\x01\x7f", '"\\x01\\x7f"'),
        ("ü€", '"ü€"'),
        ("\u200b", '"\\u200b"'),
        ("", '""'),
    ],
)
def test_go_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted


def test_format_map_sorted_without_trailing_newline() -> None:
    assert format_map({"b": "2", "a": "1"}) == 'a="1"\nb="2"'
    assert format_map({}) == ""


async def test_downward_api_fields(tmp_path: Path) -> None:
    items = [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}, "mode": 0o400},
        {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
        {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
        {"path": "tier", "fieldRef": {"fieldPath": "metadata.labels['tier']"}},
        {"path": "none", "fieldRef": {"fieldPath": "metadata.labels['none']"}},
        {
            "path": "mem",
            "resourceFieldRef": {
                "containerName": "main",
                "resource": "limits.memory",
                "divisor": "1Mi",
            },
        },
        {
            "path": "cpu",
            "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu"},
        },
        {
            # as the apiserver returns an item given without a divisor
            "path": "mem_bytes",
            "resourceFieldRef": {
                "containerName": "main",
                "resource": "limits.memory",
                "divisor": "0",
            },
        },
    ]
    volume = {"name": "info", "downwardAPI": {"items": items}}
    payload = await DownwardAPIPlugin().payload(volume, context(tmp_path))
    assert as_text(payload) == {
        "labels": ('app="web"\ntier="front"', "0o644"),
        "annotations": ('a="ü"\nnote="say \\"hi\\"\\n\\tbye"', "0o644"),
        "name": ("web", "0o400"),
        "ns": ("prod", "0o644"),
        "uid": ("u-1", "0o644"),
        "tier": ("front", "0o644"),
        "none": ("", "0o644"),
        "mem": ("64", "0o644"),
        "cpu": ("4", "0o644"),  # no limit: the node's capacity
        "mem_bytes": (str(64 * 2**20), "0o644"),
    }


async def test_downward_api_errors_are_aggregated(tmp_path: Path) -> None:
    items = [
        {"path": "ip", "fieldRef": {"fieldPath": "status.podIP"}},
        {"path": "x", "resourceFieldRef": {"containerName": "other", "resource": "limits.cpu"}},
        {"path": "y", "resourceFieldRef": {"containerName": "main", "resource": "limits.gpu"}},
    ]
    with pytest.raises(VolumeError) as err:
        await DownwardAPIPlugin().payload(
            {"name": "info", "downwardAPI": {"items": items}}, context(tmp_path)
        )
    assert str(err.value) == (
        "[unsupported fieldPath: status.podIP, container other not found, "
        "unsupported container resource : limits.gpu]"
    )


# -- projected ------------------------------------------------------------------------

KUBE_API_ACCESS = {
    "name": "kube-api-access-x1",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    },
}


async def test_kube_api_access_volume(tmp_path: Path, objects: FakeObjects) -> None:
    objects.configmaps[("prod", "kube-root-ca.crt")] = {"data": {"ca.crt": "PEM"}}
    tokens = FakeTokens()
    payload = await ProjectedPlugin().payload(
        KUBE_API_ACCESS, context(tmp_path, objects=objects, tokens=tokens)
    )
    assert as_text(payload) == {
        "token": ("token-for-builder", "0o644"),
        "ca.crt": ("PEM", "0o644"),
        "namespace": ("prod", "0o644"),
    }
    assert tokens.calls == [{"sa": "builder", "audience": "", "expiration_s": 3607}]


async def test_token_mode_and_owner_with_fs_group_and_run_as_user(
    tmp_path: Path, objects: FakeObjects
) -> None:
    pod = make_pod(securityContext={"fsGroup": 3000, "runAsUser": 1000})
    volume = {
        "name": "t",
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "path": "t",
                        "audience": "vault",
                        "expirationSeconds": 600,
                    }
                }
            ]
        },
    }
    tokens = FakeTokens()
    payload = await ProjectedPlugin().payload(
        volume, context(tmp_path, pod=pod, objects=objects, tokens=tokens)
    )
    assert payload["t"].mode == 0o600 and payload["t"].fs_user == 1000
    assert tokens.calls == [{"sa": "builder", "audience": "vault", "expiration_s": 600}]


@pytest.mark.parametrize(
    ("containers", "pod_user", "expected"),
    [
        ([{"name": "a"}], 7, 7),
        ([{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": 7}}], 7, 7),
        ([{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": 8}}], 7, None),
        ([{"name": "a"}], None, None),
    ],
)
def test_fs_user(containers: list[JSON], pod_user: int | None, expected: int | None) -> None:
    sc = {} if pod_user is None else {"runAsUser": pod_user}
    assert payloads.fs_user({"spec": {"containers": containers, "securityContext": sc}}) == expected


async def test_projected_errors_from_every_source(tmp_path: Path, objects: FakeObjects) -> None:
    volume = {
        "name": "p",
        "projected": {
            "sources": [
                {"configMap": {"name": "absent"}},
                {"secret": {"name": "absent-too", "optional": True}},
                {"clusterTrustBundle": {"signerName": "x", "path": "b"}},
                {"secret": {"name": "creds", "items": [{"key": "nope", "path": "n"}]}},
            ]
        },
    }
    with pytest.raises(VolumeError) as err:
        await ProjectedPlugin().payload(
            volume, context(tmp_path, objects=objects, tokens=FakeTokens())
        )
    assert str(err.value) == (
        "[configmap \"absent\" not found, projected volume source 'clusterTrustBundle' is not "
        "supported by klet, references non-existent secret key: nope]"
    )


# -- tokens ---------------------------------------------------------------------------


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKube:
    """The TokenRequest endpoint: answers with a numbered token expiring after the
    requested lifetime, or raises the queued error."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.requests: list[tuple[str, JSON]] = []
        self.errors: list[Exception] = []

    async def create(self, path: str, body: JSON) -> Any:
        self.requests.append((path, body))
        if self.errors:
            raise self.errors.pop(0)
        lifetime = body["spec"]["expirationSeconds"]
        return {
            **body,
            "status": {
                "token": f"tok{len(self.requests)}",
                "expirationTimestamp": rfc3339(self.clock[0] + lifetime),
            },
        }


POD = {"metadata": {"name": "web", "namespace": "prod", "uid": "u-1"}}


def manager(clock: list[float], kube: FakeKube) -> TokenManager:
    return TokenManager(kube, clock=lambda: clock[0], jitter=lambda: 0.0)


async def test_token_request_is_bound_to_the_pod() -> None:
    clock = [1_700_000_000.0]
    kube = FakeKube(clock)
    token, expires = await manager(clock, kube).token(
        POD, service_account="builder", audience="", expiration_s=3607
    )
    assert (token, expires) == ("tok1", clock[0] + 3607)
    path, body = kube.requests[0]
    assert path == "/api/v1/namespaces/prod/serviceaccounts/builder/token"
    assert body == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 3607,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u-1"},
        },
    }
    await manager(clock, kube).token(POD, service_account="b", audience="vault", expiration_s=600)
    assert kube.requests[1][1]["spec"]["audiences"] == ["vault"]


async def test_token_with_the_service_account_uid_precondition() -> None:
    """Credential providers name the account's UID (upstream's precondition): it goes in
    the request's metadata, and a token for another UID is not served from the cache."""
    clock = [1_700_000_000.0]
    kube = FakeKube(clock)
    tokens = manager(clock, kube)
    first, _ = await tokens.token(
        POD, service_account="sa", audience="a", expiration_s=3600, service_account_uid="one"
    )
    assert kube.requests[0][1]["metadata"] == {"uid": "one"}
    again, _ = await tokens.token(
        POD, service_account="sa", audience="a", expiration_s=3600, service_account_uid="one"
    )
    other, _ = await tokens.token(
        POD, service_account="sa", audience="a", expiration_s=3600, service_account_uid="two"
    )
    assert again == first and other != first and len(kube.requests) == 2


async def test_token_cached_until_80_percent_of_its_lifetime() -> None:
    clock = [1_700_000_000.0]
    kube = FakeKube(clock)
    tokens = manager(clock, kube)

    async def get(expiration_s: int = 1000) -> str:
        token, _ = await tokens.token(
            POD, service_account="sa", audience="", expiration_s=expiration_s
        )
        return token

    assert await get() == "tok1"
    clock[0] += 799
    assert await get() == "tok1"
    assert await get(expiration_s=2000) == "tok2"  # another lifetime is another token
    clock[0] += 2
    assert await get() == "tok3"  # past 80 % of 1000 s
    assert len(kube.requests) == 3


@pytest.mark.parametrize(
    ("lifetime_s", "age_s", "jitter_s", "due"),
    [
        (3600, 0, 0, False),
        (3600, 2879, 0, False),
        (3600, 2881, 0, True),  # past 80 % of the lifetime
        (3600, 2875, 10, True),  # the jitter brings the refresh forward
        (7 * 86400, 86399, 0, False),  # a week-long token: the 24 h limit comes first
        (7 * 86400, 86401, 0, True),
        (3600, -60, 0, True),  # the clock went back before the issue time
    ],
)
def test_requires_refresh(lifetime_s: int, age_s: float, jitter_s: float, due: bool) -> None:
    issued = 1_700_000_000.0
    token = Token("t", expires_at=issued + lifetime_s, expiration_s=lifetime_s)
    assert requires_refresh(token, now=issued + age_s, jitter_s=jitter_s) is due


async def test_failed_refresh_serves_the_valid_token_then_fails_when_expired() -> None:
    clock = [1_700_000_000.0]
    kube = FakeKube(clock)
    tokens = manager(clock, kube)
    await tokens.token(POD, service_account="sa", audience="", expiration_s=1000)
    clock[0] += 900
    kube.errors.append(Unavailable("POST x: connection refused"))
    token, _ = await tokens.token(POD, service_account="sa", audience="", expiration_s=1000)
    assert token == "tok1"
    clock[0] += 200
    kube.errors.append(Unavailable("POST x: connection refused"))
    with pytest.raises(TokenError) as err:
        await tokens.token(POD, service_account="sa", audience="", expiration_s=1000)
    assert str(err.value) == "token expired and refresh failed: POST x: connection refused"


async def test_first_token_failure_message() -> None:
    clock = [1_700_000_000.0]
    kube = FakeKube(clock)
    path = "/api/v1/namespaces/prod/serviceaccounts/ghost/token"
    kube.errors.append(NotFound(f'POST {path}: 404 serviceaccounts "ghost" not found', status=404))
    kube.errors.append(Forbidden(f"POST {path}: 403 forbidden: no", status=403))
    tokens = manager(clock, kube)
    for expected in ('serviceaccounts "ghost" not found', "forbidden: no"):
        with pytest.raises(TokenError) as err:
            await tokens.token(POD, service_account="ghost", audience="", expiration_s=600)
        assert str(err.value) == f"failed to fetch token: {expected}"


async def test_forget_pod_drops_its_tokens() -> None:
    clock = [1_700_000_000.0]
    kube = FakeKube(clock)
    tokens = manager(clock, kube)
    await tokens.token(POD, service_account="sa", audience="", expiration_s=600)
    tokens.forget_pod("u-1")
    await tokens.token(POD, service_account="sa", audience="", expiration_s=600)
    assert len(kube.requests) == 2
