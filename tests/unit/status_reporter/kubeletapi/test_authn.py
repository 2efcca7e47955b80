"""Authentication of kubelet API requests: client certificates (CN and O), bearer tokens
through TokenReview with the cacheTTL cache (positive and negative, errors never
cached, rejected tokens never evicting accepted ones), reviews in bounded slots (a
review over them refused, a cached answer needing none, a waiter finding the answer
another review cached), anonymous only when enabled and never for a rejected token, and
401 otherwise; each TokenReview sent is counted and timed by its answer's status code
(apiserver_delegated_authn_request_total / _duration_seconds: "201", "<error>" without an
answer, the code of a refusal), a cached answer sending none; each request's client
certificate's time left observed (apiserver_client_certificate_expiration_seconds); the
token cache's lookups (hit, miss), blocked lookups and reviews in flight, and reviews' outcomes
(authentication_token_cache_*)."""

from __future__ import annotations

import asyncio

import pytest
from klet.kube import Forbidden
from klet.model.types import JSON
from klet.status_reporter.kubeletapi.attributes import ANONYMOUS, User
from klet.status_reporter.kubeletapi.authn import (
    TOKENREVIEWS,
    AuthenticationError,
    Authenticator,
    AuthnSettings,
    TTLCache,
    bearer_token,
    timed_review,
    user_from_peercert,
)
from klet.status_reporter.kubeletapi.reviewslots import ReviewSlots, ReviewsOverloaded
from klet.status_reporter.metrics.instruments import KubeletApiMetrics
from klet.testbed.fakes.kubeletapi import FakeApiServer
from prometheus_client import CollectorRegistry

CERT = {
    "subject": (
        (("organizationName", "system:masters"),),
        (("organizationName", "devs"),),
        (("commonName", "alice"),),
    )
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_user_from_peercert() -> None:
    assert user_from_peercert(CERT) == User("alice", ("system:masters", "devs"))
    assert user_from_peercert({"subject": ((("organizationName", "x"),),)}) is None
    assert user_from_peercert(None) is None
    assert user_from_peercert({}) is None


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer ", None),
        ("", None),
    ],
)
def test_bearer_token(header: str, token: str | None) -> None:
    assert bearer_token({"authorization": header} if header else {}) == token


def test_ttl_cache_expires_and_stays_bounded() -> None:
    clock = Clock()
    cache: TTLCache[str, int] = TTLCache(clock=clock, max_entries=2)
    cache.put("a", 1, 10)
    assert cache.get("a") == (True, 1)
    clock.now += 10
    assert cache.get("a") == (False, None)
    cache.put("zero", 1, 0)
    assert cache.get("zero") == (False, None)
    for key in "bcd":
        cache.put(key, 1, 100)
    assert len(cache) == 2 and cache.get("d") == (True, 1)


async def test_client_certificate_wins_when_the_ca_is_configured() -> None:
    authn = Authenticator(AuthnSettings(x509=True), FakeApiServer())
    assert await authn.authenticate({}, CERT) == User("alice", ("system:masters", "devs"))
    no_ca = Authenticator(AuthnSettings(x509=False), FakeApiServer())
    assert await no_ca.authenticate({}, CERT) is None


async def test_token_review_and_its_cache() -> None:
    clock = Clock()
    api = FakeApiServer()
    api.tokens["good"] = {"username": "sa", "uid": "u1", "groups": ["g"], "extra": {"k": ["v"]}}
    authn = Authenticator(AuthnSettings(webhook_cache_ttl_s=120), api, clock=clock)
    user = await authn.authenticate({"authorization": "Bearer good"}, None)
    assert user == User("sa", ("g",), "u1", {"k": ("v",)})
    assert api.reviews[0][1]["spec"] == {"token": "good"}
    assert await authn.authenticate({"authorization": "Bearer bad"}, None) is None
    await authn.authenticate({"authorization": "Bearer good"}, None)
    await authn.authenticate({"authorization": "Bearer bad"}, None)
    assert len(api.reviews) == 2  # both answers cached
    clock.now += 120
    await authn.authenticate({"authorization": "Bearer good"}, None)
    assert len(api.reviews) == 3


async def test_apiserver_errors_are_not_cached() -> None:
    api = FakeApiServer()
    api.tokens["t"] = {"username": "sa"}
    authn = Authenticator(AuthnSettings(), api)
    api.fail = True
    with pytest.raises(AuthenticationError):
        await authn.authenticate({"authorization": "Bearer t"}, None)
    api.fail = False
    assert await authn.authenticate({"authorization": "Bearer t"}, None) == User("sa")


async def test_anonymous_only_when_enabled_and_not_for_a_bad_token() -> None:
    api = FakeApiServer()
    on = Authenticator(AuthnSettings(anonymous=True), api)
    assert await on.authenticate({}, None) == ANONYMOUS
    assert await on.authenticate({"authorization": "Bearer nope"}, None) is None
    off = Authenticator(AuthnSettings(anonymous=False), api)
    assert await off.authenticate({}, None) is None


async def test_tokens_ignored_without_webhook_or_apiserver() -> None:
    api = FakeApiServer()
    api.tokens["t"] = {"username": "sa"}
    disabled = Authenticator(AuthnSettings(webhook=False, anonymous=True), api)
    assert await disabled.authenticate({"authorization": "Bearer t"}, None) == ANONYMOUS
    standalone = Authenticator(AuthnSettings(webhook=True), None)
    assert await standalone.authenticate({"authorization": "Bearer t"}, None) is None
    assert api.reviews == []


async def test_rejected_tokens_never_push_accepted_ones_out_of_the_cache() -> None:
    api = FakeApiServer()
    api.tokens["good"] = {"username": "sa"}
    authn = Authenticator(AuthnSettings(), api)
    assert await authn.authenticate({"authorization": "Bearer good"}, None) == User("sa")
    for i in range(5000):  # more than a cache holds, each one reviewed once
        assert await authn.authenticate({"authorization": f"Bearer random-{i}"}, None) is None
    reviews = len(api.reviews)
    assert await authn.authenticate({"authorization": "Bearer good"}, None) == User("sa")
    assert len(api.reviews) == reviews  # still cached


async def test_token_reviews_run_in_bounded_slots() -> None:
    api = FakeApiServer()
    api.tokens["good"] = {"username": "sa"}
    api.hold = asyncio.Event()
    slots = ReviewSlots("TokenReview", concurrency=2, queue=2)
    authn = Authenticator(AuthnSettings(), api, slots=slots)

    def ask(token: str) -> asyncio.Task[User | None]:
        return asyncio.create_task(authn.authenticate({"authorization": f"Bearer {token}"}, None))

    first = [ask("good"), ask("good"), ask("good"), ask("x")]
    for _ in range(5):
        await asyncio.sleep(0)
    assert (api.waiting, slots.waiting) == (2, 2)
    with pytest.raises(ReviewsOverloaded):
        await authn.authenticate({"authorization": "Bearer y"}, None)
    api.hold.set()
    assert await asyncio.gather(*first) == [User("sa"), User("sa"), User("sa"), None]
    # Two reviews of "good" were in flight at once; the third waited and found the
    # answer cached.
    assert [b["spec"]["token"] for _, b in api.reviews] == ["good", "good", "x"]
    # Every slot busy and the queue full: a cached answer needs neither.
    api.hold = asyncio.Event()
    busy = [ask("p"), ask("q"), ask("r"), ask("s")]
    for _ in range(5):
        await asyncio.sleep(0)
    assert slots.waiting == 2
    assert await authn.authenticate({"authorization": "Bearer good"}, None) == User("sa")
    api.hold.set()
    await asyncio.gather(*busy)


async def test_each_token_review_is_counted_by_its_status_code() -> None:
    registry = CollectorRegistry()
    metrics = KubeletApiMetrics(registry, refusals=())
    api = FakeApiServer()
    api.tokens["good"] = {"username": "sa"}
    authn = Authenticator(AuthnSettings(), api, observer=metrics)
    await authn.authenticate({"authorization": "Bearer good"}, None)
    await authn.authenticate({"authorization": "Bearer good"}, None)  # cached: none sent
    await authn.authenticate({"authorization": "Bearer bad"}, None)  # answered: 201 too
    api.fail = True
    with pytest.raises(AuthenticationError):
        await authn.authenticate({"authorization": "Bearer other"}, None)

    class Refusing:
        async def create(self, path: str, body: JSON) -> JSON:
            raise Forbidden("tokenreviews is forbidden", status=403)

    with pytest.raises(Forbidden):
        await timed_review(Refusing(), TOKENREVIEWS, {}, kind="authn", observer=metrics)

    def value(name: str, code: str) -> float | None:
        return registry.get_sample_value(f"apiserver_delegated_authn_{name}", {"code": code})

    assert value("request_total", "201") == 2
    assert value("request_total", "<error>") == 1
    assert value("request_total", "403") == 1
    assert value("request_duration_seconds_count", "201") == 2
    assert (
        registry.get_sample_value("apiserver_delegated_authz_request_total", {"code": "201"})
        is None
    )


async def test_a_client_certificates_time_left_is_observed_per_request() -> None:
    registry = CollectorRegistry()
    metrics = KubeletApiMetrics(registry, refusals=())
    now = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    authn = Authenticator(AuthnSettings(x509=True), None, observer=metrics, wall=lambda: now)
    cert = {**CERT, "notAfter": "Jan 16 08:00:00 2027 GMT"}  # a day left
    assert await authn.authenticate({}, cert) == User("alice", ("system:masters", "devs"))
    await authn.authenticate({}, cert)
    await authn.authenticate({}, None)  # no certificate: nothing observed
    get = registry.get_sample_value
    assert get("apiserver_client_certificate_expiration_seconds_count") == 2
    assert get("apiserver_client_certificate_expiration_seconds_sum") == 2 * 86400
    bucket = "apiserver_client_certificate_expiration_seconds_bucket"
    assert get(bucket, {"le": "43200.0"}) == 0
    assert get(bucket, {"le": "86400.0"}) == 2
    off = Authenticator(AuthnSettings(), None, observer=metrics, wall=lambda: now)
    await off.authenticate({}, cert)  # x509 off: the certificate is not read
    assert get("apiserver_client_certificate_expiration_seconds_count") == 2


async def test_the_token_cache_counts_lookups_and_fetches() -> None:
    registry = CollectorRegistry()
    metrics = KubeletApiMetrics(registry, refusals=())
    api = FakeApiServer()
    api.tokens["good"] = {"username": "sa"}
    api.hold = asyncio.Event()
    authn = Authenticator(
        AuthnSettings(),
        api,
        slots=ReviewSlots("TokenReview", concurrency=1, queue=2),
        cache_observer=metrics,
    )

    def value(name: str, status: str) -> float | None:
        return registry.get_sample_value(f"authentication_token_cache_{name}", {"status": status})

    def ask() -> asyncio.Task[User | None]:
        return asyncio.create_task(authn.authenticate({"authorization": "Bearer good"}, None))

    assert (value("active_fetch_count", "blocked"), value("active_fetch_count", "in_flight")) == (
        0,
        0,
    )
    waiting = [ask(), ask()]  # one reviews, the other waits for its slot
    for _ in range(5):
        await asyncio.sleep(0)
    assert value("active_fetch_count", "blocked") == 2
    assert value("active_fetch_count", "in_flight") == 1
    api.hold.set()
    assert await asyncio.gather(*waiting) == [User("sa"), User("sa")]
    await authn.authenticate({"authorization": "Bearer good"}, None)  # cached
    api.fail = True
    with pytest.raises(AuthenticationError):
        await authn.authenticate({"authorization": "Bearer other"}, None)
    assert (value("request_total", "miss"), value("request_total", "hit")) == (3, 1)
    assert value("request_duration_seconds_count", "miss") == 3
    assert (value("fetch_total", "ok"), value("fetch_total", "error")) == (1, 1)
    assert (value("active_fetch_count", "blocked"), value("active_fetch_count", "in_flight")) == (
        0,
        0,
    )
