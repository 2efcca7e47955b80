"""The shared pod validation (klet.model.podvalidation): each node-protecting rule of
upstream's ValidatePod reports a problem naming its field; a full pod as the apiserver
returns it has none (syncloop checks API pods too, so a false refusal would stop a pod
the cluster accepted); no input makes the checks raise; and the path-join guard refuses
every value that is not one safe path component."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from klet.model.podvalidation import (
    Problem,
    UnsafePathComponent,
    checked_component,
    is_valid_uid,
    pod_problems,
)


def full_pod() -> dict[str, Any]:
    """A pod as the apiserver stores it, using most fields the node reads."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "prod",
            "uid": "6b0d5f5e-3c1a-4f0e-9d51-0a3f1f6f2b11",
            "labels": {"app.kubernetes.io/name": "web", "tier": ""},
            "annotations": {"kubernetes.io/config.seen": "2024-01-01T00:00:00Z"},
        },
        "spec": {
            "nodeName": "node1",
            "serviceAccountName": "default",
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "terminationGracePeriodSeconds": 30,
            "activeDeadlineSeconds": 3600,
            "priority": 0,
            "hostname": "web-0",
            "subdomain": "web",
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "securityContext": {"fsGroup": 2000, "supplementalGroups": [3000]},
            "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["db.local"]}],
            "dnsConfig": {
                "nameservers": ["1.1.1.1"],
                "searches": ["svc.cluster.local."],
                "options": [{"name": "ndots", "value": "2"}],
            },
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {"operator": "Exists", "effect": "NoExecute"},
            ],
            "volumes": [
                {"name": "data", "emptyDir": {"sizeLimit": "1Gi", "medium": ""}},
                {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
                {
                    "name": "cfg",
                    "configMap": {
                        "name": "cfg",
                        "defaultMode": 0o644,
                        "items": [{"key": "app.conf", "path": "conf/app.conf", "mode": 0o600}],
                    },
                },
                {"name": "sec", "secret": {"secretName": "tls", "optional": True}},
                {
                    "name": "kube-api-access-x1",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {
                                "serviceAccountToken": {
                                    "expirationSeconds": 3607,
                                    "path": "token",
                                }
                            },
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
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                },
                {"name": "claim", "persistentVolumeClaim": {"claimName": "data"}},
            ],
            "initContainers": [{"name": "init", "image": "busybox:1.36"}],
            "containers": [
                {
                    "name": "app",
                    "image": "nginx:1.25",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["nginx"],
                    "args": ["-g", "daemon off;"],
                    "ports": [
                        {"name": "http", "containerPort": 80, "protocol": "TCP"},
                        {"name": "metrics", "containerPort": 9090, "hostPort": 9090},
                    ],
                    "env": [
                        {"name": "MODE", "value": "prod"},
                        {"name": "my.dotted-name", "value": "x"},
                        {
                            "name": "NODE",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                        },
                        {
                            "name": "MEM",
                            "valueFrom": {
                                "resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}
                            },
                        },
                    ],
                    "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "cfg"}}],
                    "resources": {
                        "limits": {"cpu": "500m", "memory": "128Mi", "example.com/gpu": "1"},
                        "requests": {"cpu": 0.25, "memory": 64 * 2**20},
                    },
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data", "subPath": "web/cache"},
                        {"name": "cfg", "mountPath": "/etc/app", "readOnly": True},
                        {"name": "host", "mountPath": "/host", "subPathExpr": "$(POD)"},
                        {"name": "sec", "mountPath": "/tls", "mountPropagation": "None"},
                    ],
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                        "periodSeconds": 10,
                        "successThreshold": 1,
                        "failureThreshold": 3,
                        "terminationGracePeriodSeconds": 5,
                    },
                    "readinessProbe": {"tcpSocket": {"port": 80}, "successThreshold": 3},
                    "startupProbe": {"grpc": {"port": 9090}},
                    "lifecycle": {
                        "preStop": {"exec": {"command": ["nginx", "-s", "quit"]}},
                        "postStart": {"sleep": {"seconds": 1}},
                    },
                    "securityContext": {
                        "runAsUser": 1000,
                        "allowPrivilegeEscalation": False,
                        "seccompProfile": {
                            "type": "Localhost",
                            "localhostProfile": "profiles/web.json",
                        },
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
        },
    }


def changed(path: str, value: Any) -> dict[str, Any]:
    """`full_pod()` with the dotted `path` set to `value` (None deletes it)."""
    doc = full_pod()
    target: Any = doc
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last: Any = int(keys[-1]) if isinstance(target, list) else keys[-1]
    if value is None:
        del target[last]
    else:
        target[last] = copy.deepcopy(value)
    return doc


def fields(problems: list[Problem]) -> list[str]:
    return [p.field for p in problems]


C = "spec.containers.0"
CF = "spec.containers[0]"
V = "spec.volumes"


def test_a_full_api_pod_is_valid() -> None:
    assert pod_problems(full_pod(), require_uid=True) == []


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        # identity: the UID and names become host path components
        ("metadata.uid", "../../etc", "metadata.uid"),
        ("metadata.uid", "a/b", "metadata.uid"),
        ("metadata.uid", "..", "metadata.uid"),
        ("metadata.uid", ".hidden", "metadata.uid"),
        ("metadata.uid", "x" * 129, "metadata.uid"),
        ("metadata.uid", 42, "metadata.uid"),
        ("metadata.uid", None, "metadata.uid"),  # required on the bus
        ("metadata.labels", {"app": "a b"}, "metadata.labels[app]"),
        ("metadata.labels", {"bad key!": "x"}, "metadata.labels[bad key!]"),
        ("metadata.annotations", {"a": "x" * (256 * 1024)}, "metadata.annotations"),
        # volumes
        (f"{V}.0.name", "../../..", f"{V}[0].name"),
        (f"{V}.0.name", "Data", f"{V}[0].name"),
        (f"{V}.1.name", "data", f"{V}[1].name"),  # duplicate
        (f"{V}.0", {"name": "data"}, f"{V}[0]"),  # no type
        (
            f"{V}.0",
            {"name": "data", "emptyDir": {}, "hostPath": {"path": "/x"}},
            f"{V}[0].hostPath",
        ),
        (f"{V}.0.emptyDir.sizeLimit", "lots", f"{V}[0].emptyDir.sizeLimit"),
        (f"{V}.0.emptyDir.sizeLimit", "-1Gi", f"{V}[0].emptyDir.sizeLimit"),
        (f"{V}.0.emptyDir.sizeLimit", "1e999999999", f"{V}[0].emptyDir.sizeLimit"),
        (f"{V}.0.emptyDir.sizeLimit", "99999999999999999E", f"{V}[0].emptyDir.sizeLimit"),
        (f"{V}.1.hostPath.path", "var/log", f"{V}[1].hostPath.path"),
        (f"{V}.1.hostPath.path", "/var/../etc", f"{V}[1].hostPath.path"),
        (f"{V}.1.hostPath.path", "", f"{V}[1].hostPath.path"),
        (f"{V}.1.hostPath.type", "Anything", f"{V}[1].hostPath.type"),
        (f"{V}.2.configMap.items.0.path", "../escape", f"{V}[2].configMap.items[0].path"),
        (f"{V}.2.configMap.items.0.path", "/abs", f"{V}[2].configMap.items[0].path"),
        (f"{V}.2.configMap.items.0.path", "..data", f"{V}[2].configMap.items[0].path"),
        (f"{V}.2.configMap.items.0.path", "", f"{V}[2].configMap.items[0].path"),
        (f"{V}.2.configMap.items.0.key", "a/b", f"{V}[2].configMap.items[0].key"),
        (f"{V}.2.configMap.items.0.mode", 0o1777, f"{V}[2].configMap.items[0].mode"),
        (f"{V}.2.configMap.defaultMode", -1, f"{V}[2].configMap.defaultMode"),
        (f"{V}.2.configMap.name", "", f"{V}[2].configMap.name"),
        (f"{V}.3.secret.secretName", None, f"{V}[3].secret.secretName"),
        (
            f"{V}.4.projected.sources.0.serviceAccountToken.path",
            "a/../../b",
            f"{V}[4].projected.sources[0].serviceAccountToken.path",
        ),
        (
            f"{V}.4.projected.sources.0.serviceAccountToken.expirationSeconds",
            60,
            f"{V}[4].projected.sources[0].serviceAccountToken.expirationSeconds",
        ),
        (
            f"{V}.4.projected.sources.1.configMap.items.0.path",
            "token",  # the token's path already
            f"{V}[4].projected.sources[1].configMap.items[0].path",
        ),
        (
            f"{V}.4.projected.sources.2.downwardAPI.items.0.path",
            "/etc/shadow",
            f"{V}[4].projected.sources[2].downwardAPI.items[0].path",
        ),
        (f"{V}.5.persistentVolumeClaim.claimName", "", f"{V}[5].persistentVolumeClaim.claimName"),
        # mounts
        (f"{C}.volumeMounts.0.subPath", "../../etc", f"{CF}.volumeMounts[0].subPath"),
        (f"{C}.volumeMounts.0.subPath", "/etc", f"{CF}.volumeMounts[0].subPath"),
        (f"{C}.volumeMounts.2.subPathExpr", "$(A)/../..", f"{CF}.volumeMounts[2].subPathExpr"),
        (f"{C}.volumeMounts.0.name", "nope", f"{CF}.volumeMounts[0].name"),
        (f"{C}.volumeMounts.1.mountPath", "/data", f"{CF}.volumeMounts[1].mountPath"),
        (f"{C}.volumeMounts.0.mountPath", "", f"{CF}.volumeMounts[0].mountPath"),
        (
            f"{C}.volumeMounts.3.mountPropagation",
            "Shared",
            f"{CF}.volumeMounts[3].mountPropagation",
        ),
        # containers and ports
        (f"{C}.name", "init", f"{CF}.name"),
        (f"{C}.imagePullPolicy", "Sometimes", f"{CF}.imagePullPolicy"),
        (f"{C}.ports.0.name", "HTTP", f"{CF}.ports[0].name"),
        (f"{C}.ports.0.name", "metrics", f"{CF}.ports[1].name"),  # the duplicate
        (f"{C}.ports.1.hostIP", "not-an-ip", f"{CF}.ports[1].hostIP"),
        (f"{C}.ports.0.containerPort", 2**70, f"{CF}.ports[0].containerPort"),
        (f"{C}.command", "nginx -g", f"{CF}.command"),
        # env
        (f"{C}.env.0.name", "", f"{CF}.env[0].name"),
        (f"{C}.env.0.name", "A=B", f"{CF}.env[0].name"),
        (f"{C}.env.0.name", "LINE\nBREAK", f"{CF}.env[0].name"),
        (f"{C}.env.2.value", "x", f"{CF}.env[2].valueFrom"),
        (f"{C}.envFrom.0.prefix", "=", f"{CF}.envFrom[0].prefix"),
        # resources
        (f"{C}.resources.limits.cpu", "lots", f"{CF}.resources.limits[cpu]"),
        (f"{C}.resources.limits.memory", "-1", f"{CF}.resources.limits[memory]"),
        (f"{C}.resources.requests.cpu", "2", f"{CF}.resources.requests[cpu]"),  # > limit
        (f"{C}.resources.requests.memory", [1], f"{CF}.resources.requests[memory]"),
        # probes and hooks
        (f"{C}.livenessProbe.periodSeconds", -1, f"{CF}.livenessProbe.periodSeconds"),
        (f"{C}.livenessProbe.successThreshold", 2, f"{CF}.livenessProbe.successThreshold"),
        (f"{C}.livenessProbe.timeoutSeconds", 2**40, f"{CF}.livenessProbe.timeoutSeconds"),
        (
            f"{C}.livenessProbe.terminationGracePeriodSeconds",
            0,
            f"{CF}.livenessProbe.terminationGracePeriodSeconds",
        ),
        (f"{C}.livenessProbe.httpGet.port", 0, f"{CF}.livenessProbe.httpGet.port"),
        (f"{C}.livenessProbe.httpGet.port", "8080", f"{CF}.livenessProbe.httpGet.port"),
        (f"{C}.livenessProbe.httpGet.scheme", "FTP", f"{CF}.livenessProbe.httpGet.scheme"),
        (f"{C}.readinessProbe", {"periodSeconds": 5}, f"{CF}.readinessProbe"),
        (
            f"{C}.readinessProbe",
            {"tcpSocket": {"port": 80}, "exec": {"command": ["true"]}},
            f"{CF}.readinessProbe.tcpSocket",
        ),
        (f"{C}.startupProbe.grpc.port", 70000, f"{CF}.startupProbe.grpc.port"),
        (
            f"{C}.lifecycle.preStop",
            {"exec": {"command": "x"}},
            f"{CF}.lifecycle.preStop.exec.command",
        ),
        # security
        (f"{C}.securityContext.runAsUser", -1, f"{CF}.securityContext.runAsUser"),
        (
            f"{C}.securityContext.seccompProfile.localhostProfile",
            "../../etc/x.json",
            f"{CF}.securityContext.seccompProfile.localhostProfile",
        ),
        ("spec.securityContext.fsGroup", 2**32, "spec.securityContext.fsGroup"),
        (
            "spec.securityContext.supplementalGroups",
            [-5],
            "spec.securityContext.supplementalGroups[0]",
        ),
        # pod-level
        ("spec.activeDeadlineSeconds", 0, "spec.activeDeadlineSeconds"),
        ("spec.terminationGracePeriodSeconds", 2**64, "spec.terminationGracePeriodSeconds"),
        ("spec.dnsPolicy", "Google", "spec.dnsPolicy"),
        ("spec.nodeName", "Node_1", "spec.nodeName"),
        ("spec.serviceAccountName", "a/b", "spec.serviceAccountName"),
        ("spec.hostname", "a.b", "spec.hostname"),
        ("spec.hostNetwork", "yes", "spec.hostNetwork"),
        ("spec.hostAliases.0.ip", "10.0.0.1\n6.6.6.6 evil", "spec.hostAliases[0].ip"),
        ("spec.hostAliases.0.hostnames", ["ok", "bad name"], "spec.hostAliases[0].hostnames[1]"),
        (
            "spec.dnsConfig.nameservers",
            ["1.1.1.1\nnameserver 6.6.6.6"],
            "spec.dnsConfig.nameservers[0]",
        ),
        ("spec.dnsConfig.searches", ["a b"], "spec.dnsConfig.searches[0]"),
        ("spec.dnsConfig.options.0.value", "2\noptions x", "spec.dnsConfig.options[0].value"),
        ("spec.tolerations.0.operator", "Maybe", "spec.tolerations[0].operator"),
        (
            "spec.securityContext.sysctls",
            [{"name": "../x", "value": "1"}],
            "spec.securityContext.sysctls[0].name",
        ),
    ],
)
def test_each_rule_names_its_field(path: str, value: Any, field: str) -> None:
    problems = pod_problems(changed(path, value), require_uid=True)
    assert field in fields(problems), problems
    # The message carries something an operator can act on, not just the field.
    assert all(p.message for p in problems)


def test_host_network_needs_matching_host_ports() -> None:
    doc = changed("spec.hostNetwork", True)
    doc["spec"]["containers"][0]["ports"][1]["hostPort"] = 9091
    assert fields(pod_problems(doc)) == ["spec.containers[0].ports[1].hostPort"]


def test_uid_is_optional_in_a_manifest_but_required_on_the_bus() -> None:
    doc = changed("metadata.uid", None)
    assert pod_problems(doc) == []
    assert fields(pod_problems(doc, require_uid=True)) == ["metadata.uid"]


@pytest.mark.parametrize(
    "uid", ["6b0d5f5e-3c1a-4f0e-9d51-0a3f1f6f2b11", "d41d8cd98f00b204e9800998ecf8427e", "a.b_c-1"]
)
def test_valid_uids(uid: str) -> None:
    assert is_valid_uid(uid)


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        [],
        "pod",
        {"metadata": [], "spec": "x"},
        {"metadata": {"name": 5, "labels": [1], "annotations": {"a": None}}, "spec": {}},
        {"spec": {"containers": [None, 1, {"name": {}, "ports": [None, {"containerPort": True}]}]}},
        {"spec": {"volumes": [{"name": "a", "projected": {"sources": [None, {"secret": 1}]}}]}},
        {"spec": {"containers": [{"resources": {"limits": {"cpu": None, 3: "1"}}}]}},
        {"spec": {"containers": [{"livenessProbe": {"httpGet": {"port": 1.5}}}]}},
        {"spec": {"dnsConfig": {"nameservers": "1.1.1.1", "searches": [None, 3]}}},
        {"spec": {"containers": [{"env": [{"valueFrom": {"fieldRef": "x", "secretKeyRef": 1}}]}]}},
    ],
)
def test_garbage_is_reported_never_raised(garbage: Any) -> None:
    assert pod_problems(garbage, require_uid=True)


def test_huge_integers_are_described_not_printed() -> None:
    (problem,) = pod_problems(changed("spec.terminationGracePeriodSeconds", 10**5000))
    assert "bit number" in problem.message and len(problem.message) < 200


@pytest.mark.parametrize("value", ["", ".", "..", "a/b", "../x", "a\0b", "x" * 256, 5])
def test_checked_component_refuses(value: Any) -> None:
    with pytest.raises(UnsafePathComponent):
        checked_component(value, what="volume name")


@pytest.mark.parametrize("value", ["data", "kubernetes.io~empty-dir", "..data", "a..b"])
def test_checked_component_accepts(value: str) -> None:
    assert checked_component(value, what="volume name") == value
