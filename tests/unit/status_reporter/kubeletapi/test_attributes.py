"""Authorization attributes of kubelet API requests: the verb from the HTTP method
(`create` on /exec, /attach, /portForward and /run whatever the method), the
nodes subresource(s) from the path (upstream's table, with and without the
KubeletFineGrainedAuthz fallbacks), the subpath rule, and the 403/500 wording."""

from __future__ import annotations

import pytest
from klet.status_reporter.kubeletapi.attributes import (
    ANONYMOUS,
    Attributes,
    User,
    authorization_error_message,
    forbidden_message,
    is_subpath,
    request_attributes,
    subresources_for,
    verb_for,
)


@pytest.mark.parametrize(
    ("method", "verb"),
    [
        ("GET", "get"),
        ("POST", "create"),
        ("PUT", "update"),
        ("PATCH", "patch"),
        ("DELETE", "delete"),
        ("HEAD", ""),
        ("OPTIONS", ""),
        ("get", "get"),
    ],
)
def test_verb_from_method(method: str, verb: str) -> None:
    assert verb_for(method) == verb
    assert verb_for(method, "/pods") == verb


@pytest.mark.parametrize(
    "path",
    [
        "/exec/ns/pod/c",
        "/exec/ns/pod/uid/c",
        "/attach/ns/pod/c",
        "/portForward/ns/pod",
        "/run/ns/pod/c",
        "/exec",
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST", "HEAD", "OPTIONS", "PUT"])
def test_acting_paths_are_create_whatever_the_method(path: str, method: str) -> None:
    # A WebSocket exec is an upgraded GET: `get nodes/proxy` must not be enough.
    assert verb_for(method, path) == "create"
    attrs = request_attributes(ANONYMOUS, method, path, node_name="n1")
    assert {a.verb for a in attrs} == {"create"}


@pytest.mark.parametrize("path", ["/execx/ns/pod/c", "/running", "/containerLogs/ns/p/c"])
def test_other_paths_keep_the_methods_verb(path: str) -> None:
    assert verb_for("GET", path) == "get"


@pytest.mark.parametrize(
    ("path", "fine", "coarse"),
    [
        ("/stats/summary", ("stats",), ("stats",)),
        ("/stats", ("stats",), ("stats",)),
        ("/metrics", ("metrics",), ("metrics",)),
        ("/metrics/cadvisor", ("metrics",), ("metrics",)),
        ("/metrics/probes", ("metrics",), ("metrics",)),
        ("/metrics/resource", ("metrics",), ("metrics",)),
        ("/metrics/slis", ("metrics",), ("metrics",)),
        ("/metricsx", ("proxy",), ("proxy",)),
        ("/logs/", ("log",), ("log",)),
        ("/logs/syslog", ("log",), ("log",)),
        ("/checkpoint/ns/pod/c", ("checkpoint",), ("checkpoint",)),
        ("/pods", ("pods", "proxy"), ("proxy",)),
        ("/pods/", ("pods", "proxy"), ("proxy",)),
        ("/runningpods/", ("pods", "proxy"), ("proxy",)),
        ("/healthz", ("healthz", "proxy"), ("proxy",)),
        ("/healthz/ping", ("healthz", "proxy"), ("proxy",)),
        ("/healthz/syncloop", ("healthz", "proxy"), ("proxy",)),
        ("/configz", ("configz", "proxy"), ("proxy",)),
        ("/why/ns/pod", ("proxy",), ("proxy",)),  # klet's own: nodes/proxy
        ("/exec/ns/pod/c", ("proxy",), ("proxy",)),
        ("/attach/ns/pod/c", ("proxy",), ("proxy",)),
        ("/portForward/ns/pod", ("proxy",), ("proxy",)),
        ("/containerLogs/ns/pod/c", ("proxy",), ("proxy",)),
        ("/run/ns/pod/c", ("proxy",), ("proxy",)),
        ("/spec/", ("proxy",), ("proxy",)),
        ("/", ("proxy",), ("proxy",)),
    ],
)
def test_subresources(path: str, fine: tuple[str, ...], coarse: tuple[str, ...]) -> None:
    assert subresources_for(path, fine_grained=True) == fine
    assert subresources_for(path, fine_grained=False) == coarse


def test_is_subpath_needs_a_separator() -> None:
    assert is_subpath("/stats", "/stats/")
    assert is_subpath("/stats/x", "/stats/")
    assert not is_subpath("/statsx", "/stats/")


def test_request_attributes_name_the_node() -> None:
    user = User("alice", ("devs",))
    attrs = request_attributes(user, "POST", "/pods", node_name="n1")
    assert attrs == [
        Attributes(user=user, verb="create", subresource="pods", name="n1", path="/pods"),
        Attributes(user=user, verb="create", subresource="proxy", name="n1", path="/pods"),
    ]
    assert all(a.resource == "nodes" and a.api_version == "v1" for a in attrs)


def test_messages_are_upstreams() -> None:
    attrs = request_attributes(ANONYMOUS, "GET", "/pods", node_name="n1")
    assert forbidden_message(attrs) == (
        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    )
    one = request_attributes(User("bob"), "POST", "/exec/a/b/c", node_name="n1")
    assert forbidden_message(one).endswith("subresource(s)=[proxy])\n")
    assert authorization_error_message(one[0]) == (
        "Authorization error (user=bob, verb=create, resource=nodes, subresource=proxy)"
    )
