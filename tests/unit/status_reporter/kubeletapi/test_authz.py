"""Authorization of kubelet API requests: the SubjectAccessReview sent (user, groups,
uid, extra, nodes/<subresource> of this node), allowed answers cached 5 min and denied
ones 30 s, the proxy fallback of fine-grained attributes, failures surfacing as
AuthorizationError without being cached, and reviews in bounded slots (one over them
refused with ReviewsOverloaded, a waiter finding the answer another review cached); each
review sent counted and timed by its answer's status code
(apiserver_delegated_authz_request_total / _duration_seconds)."""

from __future__ import annotations

import asyncio

import pytest
from klet.status_reporter.kubeletapi.attributes import User, request_attributes
from klet.status_reporter.kubeletapi.authz import (
    AlwaysAllow,
    AuthorizationError,
    AuthzSettings,
    WebhookAuthorizer,
    review_body,
)
from klet.status_reporter.kubeletapi.reviewslots import ReviewSlots, ReviewsOverloaded
from klet.status_reporter.metrics.instruments import KubeletApiMetrics
from klet.testbed.fakes.kubeletapi import FakeApiServer
from prometheus_client import CollectorRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_review_body() -> None:
    user = User("alice", ("a", "b"), "uid-1", {"scopes": ("x",)})
    [attrs] = request_attributes(user, "POST", "/exec/ns/p/c", node_name="n1")
    assert review_body(attrs) == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "alice",
            "groups": ["a", "b"],
            "uid": "uid-1",
            "extra": {"scopes": ["x"]},
            "resourceAttributes": {
                "verb": "create",
                "group": "",
                "version": "v1",
                "resource": "nodes",
                "subresource": "proxy",
                "name": "n1",
            },
        },
    }


async def test_always_allow() -> None:
    assert await AlwaysAllow().allowed(request_attributes(User("x"), "GET", "/", node_name="n"))


async def test_fine_grained_falls_back_to_proxy() -> None:
    api = FakeApiServer()
    authz = WebhookAuthorizer(AuthzSettings(), api)
    attrs = request_attributes(User("mon"), "GET", "/pods", node_name="n1")
    assert not await authz.allowed(attrs)
    api.allowed.add(("mon", "get", "proxy"))
    api.reviews.clear()
    authz = WebhookAuthorizer(AuthzSettings(), api)
    assert await authz.allowed(attrs)
    assert [b["spec"]["resourceAttributes"]["subresource"] for _, b in api.reviews] == [
        "pods",
        "proxy",
    ]


async def test_answers_are_cached_for_their_ttls() -> None:
    clock = Clock()
    api = FakeApiServer()
    api.allowed.add(("ok", "get", "stats"))
    authz = WebhookAuthorizer(AuthzSettings(300, 30), api, clock=clock)
    yes = request_attributes(User("ok"), "GET", "/stats/summary", node_name="n1")
    no = request_attributes(User("no"), "GET", "/stats/summary", node_name="n1")
    assert await authz.allowed(yes) and not await authz.allowed(no)
    assert len(api.reviews) == 2
    clock.now = 29
    await authz.allowed(yes)
    await authz.allowed(no)
    assert len(api.reviews) == 2
    clock.now = 30  # the denial expired, the approval did not
    await authz.allowed(yes)
    await authz.allowed(no)
    assert len(api.reviews) == 3
    clock.now = 300
    await authz.allowed(yes)
    assert len(api.reviews) == 4


async def test_failures_raise_and_are_not_cached() -> None:
    api = FakeApiServer()
    authz = WebhookAuthorizer(AuthzSettings(), api)
    attrs = request_attributes(User("x"), "GET", "/metrics", node_name="n1")
    api.fail = True
    with pytest.raises(AuthorizationError) as err:
        await authz.allowed(attrs)
    assert err.value.attrs.subresource == "metrics"
    api.fail = False
    api.allowed.add(("x", "get", "metrics"))
    assert await authz.allowed(attrs)


async def test_reviews_run_in_bounded_slots() -> None:
    api = FakeApiServer()
    api.allowed.add(("ok", "get", "stats"))
    api.hold = asyncio.Event()
    slots = ReviewSlots("SubjectAccessReview", concurrency=1, queue=1)
    authz = WebhookAuthorizer(AuthzSettings(), api, slots=slots)
    yes = request_attributes(User("ok"), "GET", "/stats/summary", node_name="n1")
    first, second = (asyncio.create_task(authz.allowed(yes)) for _ in range(2))
    for _ in range(5):
        await asyncio.sleep(0)
    assert (api.waiting, slots.waiting) == (1, 1)
    other = request_attributes(User("other"), "GET", "/stats/summary", node_name="n1")
    with pytest.raises(ReviewsOverloaded):
        await authz.allowed(other)
    api.hold.set()
    assert await first and await second
    assert len(api.reviews) == 1  # the waiter found the answer cached


async def test_each_review_sent_is_counted_by_its_status_code() -> None:
    registry = CollectorRegistry()
    api = FakeApiServer()
    authz = WebhookAuthorizer(
        AuthzSettings(), api, observer=KubeletApiMetrics(registry, refusals=())
    )
    api.allowed.add(("x", "get", "metrics"))
    attrs = request_attributes(User("x"), "GET", "/metrics", node_name="n1")
    assert await authz.allowed(attrs)
    assert await authz.allowed(attrs)  # cached: none sent
    api.fail = True
    with pytest.raises(AuthorizationError):
        await authz.allowed(request_attributes(User("y"), "GET", "/pods", node_name="n1"))

    def value(name: str, code: str) -> float | None:
        return registry.get_sample_value(f"apiserver_delegated_authz_{name}", {"code": code})

    assert value("request_total", "201") == 1
    assert value("request_total", "<error>") == 1
    assert value("request_duration_seconds_count", "201") == 1
