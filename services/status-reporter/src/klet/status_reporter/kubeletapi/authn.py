"""Who is asking: authentication of kubelet API requests, as upstream's kubelet does it.

In upstream's order, first match wins:

1. **x509 client certificate** (only when `authentication.x509.clientCAFile` is set):
   the TLS layer requests a client certificate and verifies it against the CA bundle;
   a verified certificate authenticates as user = subject CN, groups = subject O. A
   certificate without a CN does not authenticate. Trade-off: upstream verifies in the
   authenticator and answers 401 for a certificate from another CA; here OpenSSL
   verifies during the handshake, which fails the handshake instead — stricter, and
   OpenSSL's verification is the one we trust.
2. **Bearer token** (`authentication.webhook.enabled` and an apiserver to ask): a
   TokenReview, answers cached for `cacheTTL` (2 min), positive and negative alike, as
   upstream's delegating authenticator caches them; failed calls are not cached. A
   presented token that does not authenticate fails the request even when anonymous
   access is on (upstream's "invalid bearer token"). Reviews run in bounded slots
   (`reviewslots.py`): over them the request is refused, not queued. Negative answers
   are kept apart from positive ones, so a flood of random tokens, each cached as a
   failure, never pushes an authenticated client's entry out of the cache.
3. **Anonymous** (`authentication.anonymous.enabled`): system:anonymous in group
   system:unauthenticated.

Otherwise the request is unauthenticated: 401 "Unauthorized".

Each TokenReview sent is told to a `ReviewObserver` (upstream's
apiserver_delegated_authn_request_total and _duration_seconds): its HTTP status code
("201", "403", ...) or "<error>" when no answer came, and how long it took; and, with
x509 authentication on, each request's client certificate's time left before it
expires (apiserver_client_certificate_expiration_seconds, as upstream's x509
authenticator observes it per request). The token cache tells a `TokenCacheObserver`
what upstream's cached token authenticator records: each lookup, a hit or a miss, and
how long it took to answer (authentication_token_cache_request_total and
_request_duration_seconds, milliseconds as upstream), the lookups waiting on a miss and
the TokenReviews in flight (authentication_token_cache_active_fetch_count{blocked,
in_flight}), and each review's outcome (authentication_token_cache_fetch_total{ok,
error}).
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from klet.kube import KubeError
from klet.model.types import JSON
from klet.status_reporter.kubeletapi.attributes import ANONYMOUS, User
from klet.status_reporter.kubeletapi.reviewslots import ReviewSlots

log = logging.getLogger(__name__)

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"

K = TypeVar("K")
V = TypeVar("V")


class ApiServer(Protocol):
    """The one apiserver call the reviews need."""

    async def create(self, path: str, body: JSON) -> Any: ...


class ReviewObserver(Protocol):
    """Told of every review sent to the apiserver (status-reporter's metrics)."""

    def delegated_review(self, kind: str, code: str, seconds: float) -> None:
        """`kind` "authn" (TokenReview) or "authz" (SubjectAccessReview)."""

    def client_certificate(self, seconds_left: float) -> None:
        """A request presented a client certificate expiring in `seconds_left`."""


class TokenCacheObserver(Protocol):
    """Told of the token cache's lookups and fetches (status-reporter's metrics)."""

    def token_lookup(self, *, hit: bool, seconds: float) -> None: ...

    def token_fetches(self, status: str, delta: int) -> None:
        """`status` "blocked" (lookups waiting on a miss) or "in_flight" (reviews)."""

    def token_fetched(self, *, ok: bool) -> None: ...


class _NoTokenCacheObserver:
    def token_lookup(self, *, hit: bool, seconds: float) -> None:
        pass

    def token_fetches(self, status: str, delta: int) -> None:
        pass

    def token_fetched(self, *, ok: bool) -> None:
        pass


def seconds_left(cert: Mapping[str, Any], now: float) -> float | None:
    """Seconds until the certificate's notAfter (negative once past); None without one."""
    not_after = cert.get("notAfter")
    if not isinstance(not_after, str):
        return None
    try:
        return ssl.cert_time_to_seconds(not_after) - now
    except ValueError:
        return None


async def timed_review(
    apiserver: ApiServer, path: str, body: JSON, *, kind: str, observer: ReviewObserver | None
) -> Any:
    """POST the review, telling `observer` its status code and duration, as upstream's
    webhook clients record them (201 for a review the apiserver answered)."""
    started, code = time.perf_counter(), "201"
    try:
        return await apiserver.create(path, body)
    except KubeError as err:
        code = str(err.status) if err.status else "<error>"
        raise
    finally:
        if observer is not None:
            observer.delegated_review(kind, code, time.perf_counter() - started)


def _ms(seconds: float) -> float:
    """`seconds` cut to whole milliseconds (upstream's token cache latency)."""
    return int(seconds * 1000) / 1000


class AuthenticationError(Exception):
    """Authentication could not be decided (the apiserver failed): 401, not cached."""


class TTLCache(Generic[K, V]):
    """A small expiring map; `ttl_s` per entry; expired entries are dropped on access and
    the map is swept when it grows past `max_entries`."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_entries: int = 4096):
        self._clock = clock
        self._max = max_entries
        self._items: dict[K, tuple[float, V]] = {}

    def get(self, key: K) -> tuple[bool, V | None]:
        """(hit, value)."""
        item = self._items.get(key)
        if item is None:
            return False, None
        expires, value = item
        if self._clock() >= expires:
            del self._items[key]
            return False, None
        return True, value

    def put(self, key: K, value: V, ttl_s: float) -> None:
        if ttl_s <= 0:
            return
        now = self._clock()
        if len(self._items) >= self._max:
            self._items = {k: v for k, v in self._items.items() if v[0] > now}
            if len(self._items) >= self._max:
                self._items.pop(next(iter(self._items)))
        self._items[key] = (now + ttl_s, value)

    def __len__(self) -> int:
        return len(self._items)


def user_from_peercert(cert: Mapping[str, Any] | None) -> User | None:
    """The user of a verified client certificate (ssl's `getpeercert()` dict): CN and Os."""
    if not cert:
        return None
    cn = ""
    groups: list[str] = []
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and not cn:
                cn = str(value)
            elif key == "organizationName":
                groups.append(str(value))
    if not cn:
        return None
    return User(cn, tuple(groups))


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, if any (scheme case-blind)."""
    value = headers.get("authorization", "")
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def user_from_token_review(review: JSON) -> User | None:
    status = review.get("status") or {}
    if not status.get("authenticated"):
        return None
    u = status.get("user") or {}
    name = str(u.get("username", ""))
    if not name:
        return None
    extra = {str(k): tuple(str(x) for x in v or ()) for k, v in (u.get("extra") or {}).items()}
    return User(name, tuple(u.get("groups") or ()), str(u.get("uid", "")), extra)


@dataclass(frozen=True)
class AuthnSettings:
    """The `authentication` block of KubeletConfiguration, as far as requests need it."""

    x509: bool = False
    """A client CA is configured (clientCAFile), so verified client certs authenticate."""
    webhook: bool = True
    """authentication.webhook.enabled: bearer tokens via TokenReview."""
    webhook_cache_ttl_s: float = 120.0
    """authentication.webhook.cacheTTL, seconds."""
    anonymous: bool = False
    """authentication.anonymous.enabled."""


class Authenticator:
    """Request → User | None, per the module docstring."""

    def __init__(
        self,
        settings: AuthnSettings,
        apiserver: ApiServer | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        slots: ReviewSlots | None = None,
        observer: ReviewObserver | None = None,
        wall: Callable[[], float] = time.time,
        cache_observer: TokenCacheObserver | None = None,
    ) -> None:
        self.settings = settings
        self._stats: TokenCacheObserver = cache_observer or _NoTokenCacheObserver()
        self._apiserver = apiserver if settings.webhook else None
        self._slots = slots
        self._observer = observer
        self._wall = wall
        self._cache: TTLCache[str, User] = TTLCache(clock=clock)
        self._failures: TTLCache[str, None] = TTLCache(clock=clock)

    async def authenticate(
        self, headers: Mapping[str, str], peercert: Mapping[str, Any] | None
    ) -> User | None:
        """The user, or None (401). Raises AuthenticationError when the apiserver failed,
        ReviewsOverloaded when a TokenReview is needed and no slot is free."""
        if self.settings.x509:
            left = seconds_left(peercert, self._wall()) if peercert else None
            if left is not None and self._observer is not None:
                self._observer.client_certificate(left)
            user = user_from_peercert(peercert)
            if user is not None:
                return user
        token = bearer_token(headers)
        if token is not None and self._apiserver is not None:
            # A token that does not authenticate is a failure, not a reason to fall
            # through to anonymous.
            return await self._review(token)
        if self.settings.anonymous:
            return ANONYMOUS
        return None

    def _cached(self, key: str) -> tuple[bool, User | None]:
        hit, user = self._cache.get(key)
        if hit:
            return True, user
        return self._failures.get(key)[0], None

    async def _review(self, token: str) -> User | None:
        """The token's user from the cache or a TokenReview. Raises ReviewsOverloaded
        when no review slot is free."""
        started = time.perf_counter()
        key = hashlib.sha256(token.encode()).hexdigest()
        hit, cached = self._cached(key)
        if hit:
            self._stats.token_lookup(hit=True, seconds=_ms(time.perf_counter() - started))
            return cached
        self._stats.token_fetches("blocked", 1)
        try:
            if self._slots is None:
                return await self._ask(key, token)
            async with self._slots.hold():
                # Another request with the same token may have had the answer meanwhile.
                hit, cached = self._cached(key)
                if hit:
                    return cached
                return await self._ask(key, token)
        finally:
            self._stats.token_fetches("blocked", -1)
            self._stats.token_lookup(hit=False, seconds=_ms(time.perf_counter() - started))

    async def _ask(self, key: str, token: str) -> User | None:
        assert self._apiserver is not None
        body: JSON = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        self._stats.token_fetches("in_flight", 1)
        ok = False
        try:
            review = await timed_review(
                self._apiserver, TOKENREVIEWS, body, kind="authn", observer=self._observer
            )
            ok = True
        except KubeError as err:
            log.error("TokenReview failed", extra={"error": str(err)})
            raise AuthenticationError(str(err)) from err
        finally:
            self._stats.token_fetches("in_flight", -1)
            self._stats.token_fetched(ok=ok)
        user = user_from_token_review(review or {})
        if user is None:
            self._failures.put(key, None, self.settings.webhook_cache_ttl_s)
        else:
            self._cache.put(key, user, self.settings.webhook_cache_ttl_s)
        return user
