"""Environment variables and $(VAR) expansion as upstream: defined references expand,
undefined ones stay as written, $$ escapes, an unclosed reference is literal; env
entries see only the entries before them; fieldRef and resourceFieldRef sources
(labels/annotations by key, pod and host IPs, limits with divisors and node-capacity
fallback); ConfigMap/Secret key references and envFrom (prefixes, optional objects and
keys, envFrom before env and taking part in expansion) and upstream's messages when a
reference cannot be resolved, with or without an apiserver; a Secret value that is
not UTF-8 kept exactly when read and refused by name (the CRI takes UTF-8 strings)
rather than silently altered."""

from __future__ import annotations

import base64

import pytest
from cri_api.v1.api_pb2 import KeyValue
from klet.syncloop.environment.envvars import (
    EnvError,
    EnvSources,
    NodeFacts,
    container_env,
    expand,
    references,
)
from klet.syncloop.environment.kubeobjects import secret_data

ENV = {"A": "1", "B": "two", "EMPTY": ""}


@pytest.mark.parametrize(
    ("text", "out"),
    [
        ("$(A)", "1"),
        ("x$(A)y$(B)z", "x1ytwoz"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$1"),
        ("$(A", "$(A"),
        ("cost $5", "cost $5"),
        ("$", "$"),
        ("$(EMPTY)-", "-"),
        ("$()", "$()"),
        ("", ""),
    ],
)
def test_expand(text: str, out: str) -> None:
    assert expand(text, ENV.get) == out


NODE = NodeFacts(host_ips=("192.168.1.5",), cpu_millis=4000, memory_bytes=8 * 1024**3)
POD = {
    "metadata": {
        "name": "web",
        "namespace": "prod",
        "uid": "u-1",
        "labels": {"app": "w"},
        "annotations": {"team": "core"},
    },
    "spec": {"nodeName": "n1", "serviceAccountName": "sa"},
}


def env_of(*variables: dict, resources: dict | None = None) -> dict[str, str]:  # type: ignore[type-arg]
    container = {"name": "c", "env": list(variables), "resources": resources or {}}
    return dict(container_env(POD, container, pod_ips=("10.1.0.7",), node=NODE))


def test_entries_see_only_earlier_entries() -> None:
    env = env_of(
        {"name": "X", "value": "$(Y)-x"},
        {"name": "Y", "value": "y"},
        {"name": "Z", "value": "$(Y)$(X)"},
    )
    assert env == {"X": "$(Y)-x", "Y": "y", "Z": "y$(Y)-x"}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "web"),
        ("metadata.namespace", "prod"),
        ("metadata.uid", "u-1"),
        ("metadata.labels['app']", "w"),
        ("metadata.annotations['team']", "core"),
        ("metadata.labels['nope']", ""),
        ("spec.nodeName", "n1"),
        ("spec.serviceAccountName", "sa"),
        ("status.podIP", "10.1.0.7"),
        ("status.podIPs", "10.1.0.7"),
        ("status.hostIP", "192.168.1.5"),
        ("status.hostIPs", "192.168.1.5"),
    ],
)
def test_field_refs(path: str, value: str) -> None:
    assert env_of({"name": "V", "valueFrom": {"fieldRef": {"fieldPath": path}}}) == {"V": value}


@pytest.mark.parametrize(
    ("resource", "divisor", "resources", "value"),
    [
        ("limits.cpu", None, {"limits": {"cpu": "500m"}}, "1"),
        ("limits.cpu", "1m", {"limits": {"cpu": "500m"}}, "500"),
        # the apiserver's default: the zero Quantity, read as 1
        ("limits.cpu", "0", {"limits": {"cpu": "1250m"}}, "2"),
        ("requests.memory", "0", {"requests": {"memory": "32Mi"}}, "33554432"),
        ("limits.memory", "1Mi", {"limits": {"memory": "128Mi"}}, "128"),
        ("requests.memory", None, {"limits": {"memory": "1Ki"}}, "1024"),
        ("limits.cpu", None, {}, "4"),
        ("limits.memory", "1Gi", {}, "8"),
    ],
)
def test_resource_field_refs(
    resource: str, divisor: str | None, resources: dict, value: str
) -> None:  # type: ignore[type-arg]
    ref: dict[str, str] = {"resource": resource}
    if divisor:
        ref["divisor"] = divisor
    assert env_of({"name": "R", "valueFrom": {"resourceFieldRef": ref}}, resources=resources) == {
        "R": value
    }


SOURCES = EnvSources(
    config_maps={"cm": {"level": "debug", "mode": "fast"}, "other": {"level": "info"}},
    secrets={"creds": {"user": "admin", "pass": "s3cret"}},
    failures={("configmap", "locked"): 'configmaps "locked" is forbidden: no'},
)


def cm_ref(name: str, key: str, **extra: object) -> dict:  # type: ignore[type-arg]
    return {"configMapKeyRef": {"name": name, "key": key, **extra}}


def secret_ref(name: str, key: str, **extra: object) -> dict:  # type: ignore[type-arg]
    return {"secretKeyRef": {"name": name, "key": key, **extra}}


def resolve(
    env: list[dict] | None = None,  # type: ignore[type-arg]
    env_from: list[dict] | None = None,  # type: ignore[type-arg]
    sources: EnvSources | None = SOURCES,
) -> list[tuple[str, str]]:
    container = {"name": "c", "env": env or [], "envFrom": env_from or []}
    return container_env(POD, container, pod_ips=(), node=NODE, sources=sources)


@pytest.mark.parametrize(
    ("env", "env_from", "expected"),
    [
        # key references, present and optional-absent
        ([{"name": "L", "valueFrom": cm_ref("cm", "level")}], [], [("L", "debug")]),
        ([{"name": "U", "valueFrom": secret_ref("creds", "user")}], [], [("U", "admin")]),
        ([{"name": "X", "valueFrom": cm_ref("gone", "k", optional=True)}], [], []),
        ([{"name": "X", "valueFrom": cm_ref("cm", "nokey", optional=True)}], [], []),
        ([{"name": "X", "valueFrom": secret_ref("gone", "k", optional=True)}], [], []),
        ([{"name": "X", "valueFrom": secret_ref("creds", "nokey", optional=True)}], [], []),
        # envFrom: every key, sorted, with the prefix; a later source wins
        ([], [{"configMapRef": {"name": "cm"}}], [("level", "debug"), ("mode", "fast")]),
        (
            [],
            [{"configMapRef": {"name": "cm"}, "prefix": "APP_"}, {"secretRef": {"name": "creds"}}],
            [("APP_level", "debug"), ("APP_mode", "fast"), ("pass", "s3cret"), ("user", "admin")],
        ),
        (
            [],
            [{"configMapRef": {"name": "cm"}}, {"configMapRef": {"name": "other"}}],
            [("level", "info"), ("mode", "fast")],
        ),
        ([], [{"configMapRef": {"name": "gone", "optional": True}}], []),
        ([], [{"secretRef": {"name": "gone", "optional": True}}], []),
        # env overrides envFrom, keeping the variable's place; env expands envFrom's values
        (
            [{"name": "level", "value": "trace"}, {"name": "M", "value": "$(mode)-$(level)"}],
            [{"configMapRef": {"name": "cm"}}],
            [("level", "trace"), ("mode", "fast"), ("M", "fast-trace")],
        ),
        # a value from a ConfigMap is not expanded itself
        (
            [{"name": "A", "value": "a"}, {"name": "B", "valueFrom": cm_ref("raw", "v")}],
            [],
            None,
        ),
    ],
)
def test_configmap_and_secret_references(
    env: list[dict],  # type: ignore[type-arg]
    env_from: list[dict],  # type: ignore[type-arg]
    expected: list[tuple[str, str]] | None,
) -> None:
    if expected is None:
        raw = EnvSources(config_maps={"raw": {"v": "$(A)"}})
        assert resolve(env, env_from, raw) == [("A", "a"), ("B", "$(A)")]
    else:
        assert resolve(env, env_from) == expected


@pytest.mark.parametrize(
    ("env", "env_from", "message"),
    [
        ([{"name": "X", "valueFrom": cm_ref("gone", "k")}], [], 'configmap "gone" not found'),
        ([{"name": "X", "valueFrom": secret_ref("gone", "k")}], [], 'secret "gone" not found'),
        (
            [{"name": "X", "valueFrom": cm_ref("cm", "nokey")}],
            [],
            "couldn't find key nokey in ConfigMap prod/cm",
        ),
        (
            [{"name": "X", "valueFrom": secret_ref("creds", "nokey")}],
            [],
            "couldn't find key nokey in Secret prod/creds",
        ),
        ([], [{"configMapRef": {"name": "gone"}}], 'configmap "gone" not found'),
        ([], [{"secretRef": {"name": "gone"}}], 'secret "gone" not found'),
        # only absence is excused by `optional`, not an object that cannot be read
        (
            [{"name": "X", "valueFrom": cm_ref("locked", "k", optional=True)}],
            [],
            'configmaps "locked" is forbidden: no',
        ),
        # envFrom is resolved before env, so its failure is the one reported
        (
            [{"name": "X", "valueFrom": secret_ref("gone", "k")}],
            [{"configMapRef": {"name": "missing"}}],
            'configmap "missing" not found',
        ),
    ],
)
def test_unresolvable_references_fail_with_upstream_messages(
    env: list[dict],  # type: ignore[type-arg]
    env_from: list[dict],  # type: ignore[type-arg]
    message: str,
) -> None:
    with pytest.raises(EnvError) as err:
        resolve(env, env_from)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("env", "env_from", "message"),
    [
        (
            [{"name": "X", "valueFrom": cm_ref("cm", "k", optional=True)}],
            [],
            "couldn't get configMap prod/cm, no kubeClient defined",
        ),
        (
            [{"name": "X", "valueFrom": secret_ref("s", "k")}],
            [],
            "couldn't get secret prod/s, no kubeClient defined",
        ),
        ([], [{"secretRef": {"name": "s"}}], "couldn't get secret prod/s, no kubeClient defined"),
    ],
)
def test_references_without_an_apiserver_fail_even_when_optional(
    env: list[dict],  # type: ignore[type-arg]
    env_from: list[dict],  # type: ignore[type-arg]
    message: str,
) -> None:
    with pytest.raises(EnvError) as err:
        resolve(env, env_from, sources=None)
    assert str(err.value) == message


def test_a_container_without_references_needs_no_apiserver() -> None:
    assert resolve([{"name": "P", "value": "plain"}], sources=None) == [("P", "plain")]


def test_references_lists_each_object_once_in_order() -> None:
    container = {
        "envFrom": [{"secretRef": {"name": "s1"}}, {"configMapRef": {"name": "c1"}}],
        "env": [
            {"name": "A", "valueFrom": cm_ref("c2", "k")},
            {"name": "B", "valueFrom": cm_ref("c1", "k")},
            {"name": "C", "valueFrom": secret_ref("s2", "k")},
            {"name": "D", "value": "x"},
        ],
    }
    assert references(container) == (["c1", "c2"], ["s1", "s2"])


# -- Secret values that are not UTF-8 (issue 11) ------------------------------------------

BINARY = b"\xff\x00key\x80"


def binary_sources() -> EnvSources:
    """A Secret as read from the apiserver, through the real decoding of its `data`."""
    data = {
        "bin": base64.b64encode(BINARY).decode(),
        "text": base64.b64encode("grüße".encode()).decode(),
    }
    return EnvSources(secrets={"mixed": secret_data({"data": data})})


def test_secret_data_keeps_bytes_that_are_not_utf8() -> None:
    decoded = binary_sources().secrets["mixed"]
    assert decoded["bin"].encode("utf-8", "surrogateescape") == BINARY  # not U+FFFD
    assert decoded["text"] == "grüße"


@pytest.mark.parametrize(
    ("env", "env_from", "message"),
    [
        (
            [{"name": "TOKEN", "valueFrom": secret_ref("mixed", "bin")}],
            [],
            "environment variable TOKEN: key bin of Secret prod/mixed is not valid UTF-8",
        ),
        (
            [],
            [{"secretRef": {"name": "mixed"}, "prefix": "S_"}],
            "environment variable S_bin: key bin of Secret prod/mixed is not valid UTF-8",
        ),
    ],
)
def test_a_secret_value_that_is_not_utf8_is_refused_not_altered(
    env: list[dict],  # type: ignore[type-arg]
    env_from: list[dict],  # type: ignore[type-arg]
    message: str,
) -> None:
    with pytest.raises(EnvError) as err:
        resolve(env, env_from, binary_sources())
    assert str(err.value).startswith(message)
    assert "mount the Secret as a volume" in str(err.value)


def test_utf8_secret_values_pass_unchanged_and_reach_the_cri() -> None:
    env = resolve([{"name": "T", "valueFrom": secret_ref("mixed", "text")}], [], binary_sources())
    assert env == [("T", "grüße")]
    assert KeyValue(key="T", value=env[0][1]).SerializeToString()  # a valid proto string
