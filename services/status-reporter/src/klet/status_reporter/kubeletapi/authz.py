"""May they: authorization of kubelet API requests (`authorization.mode`).

- `AlwaysAllow`: every authenticated request is allowed.
- `Webhook`: a SubjectAccessReview per attribute set (user, groups, uid, extra and the
  `nodes/<subresource>` resource attributes of `attributes.py`), answers cached as
  upstream's webhook authorizer caches them: allowed for `cacheAuthorizedTTL` (5 min),
  denied for `cacheUnauthorizedTTL` (30 s); a failed call is not cached and becomes a
  500 "Authorization error". A request is allowed when any of its attribute sets is
  (the fine-grained subresource first, then its `proxy` fallback). Reviews run in
  bounded slots of their own (`reviewslots.py`), apart from the TokenReviews. Each
  SubjectAccessReview sent is told to the observer (upstream's
  apiserver_delegated_authz_request_total and _duration_seconds; authn.timed_review).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from klet.kube import KubeError
from klet.model.types import JSON
from klet.status_reporter.kubeletapi.attributes import Attributes
from klet.status_reporter.kubeletapi.authn import ApiServer, ReviewObserver, TTLCache, timed_review
from klet.status_reporter.kubeletapi.reviewslots import ReviewSlots

log = logging.getLogger(__name__)

SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class AuthorizationError(Exception):
    """The authorizer could not decide (the apiserver failed); carries the attributes."""

    def __init__(self, message: str, attrs: Attributes) -> None:
        super().__init__(message)
        self.attrs = attrs


class Authorizer(Protocol):
    async def allowed(self, attrs: list[Attributes]) -> bool:
        """Whether any of `attrs` is allowed. Raises AuthorizationError, or
        ReviewsOverloaded when a review is needed and no slot is free."""
        ...


class AlwaysAllow:
    async def allowed(self, attrs: list[Attributes]) -> bool:
        return True


@dataclass(frozen=True)
class AuthzSettings:
    """`authorization.webhook` of KubeletConfiguration."""

    cache_authorized_ttl_s: float = 300.0
    cache_unauthorized_ttl_s: float = 30.0


def review_body(attrs: Attributes) -> JSON:
    """The SubjectAccessReview for one attribute set."""
    spec: JSON = {
        "user": attrs.user.name,
        "groups": list(attrs.user.groups),
        "resourceAttributes": {
            "verb": attrs.verb,
            "group": "",
            "version": attrs.api_version,
            "resource": attrs.resource,
            "subresource": attrs.subresource,
            "name": attrs.name,
        },
    }
    if attrs.user.uid:
        spec["uid"] = attrs.user.uid
    if attrs.user.extra:
        spec["extra"] = {k: list(v) for k, v in attrs.user.extra.items()}
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": spec,
    }


class WebhookAuthorizer:
    def __init__(
        self,
        settings: AuthzSettings,
        apiserver: ApiServer,
        *,
        clock: Callable[[], float] = time.monotonic,
        slots: ReviewSlots | None = None,
        observer: ReviewObserver | None = None,
    ) -> None:
        self.settings = settings
        self._apiserver = apiserver
        self._slots = slots
        self._observer = observer
        self._cache: TTLCache[str, bool] = TTLCache(clock=clock)

    async def allowed(self, attrs: list[Attributes]) -> bool:
        for a in attrs:
            if await self._one(a):
                return True
        return False

    async def _one(self, attrs: Attributes) -> bool:
        body = review_body(attrs)
        key = json.dumps(body["spec"], sort_keys=True)
        hit, cached = self._cache.get(key)
        if hit:
            return bool(cached)
        if self._slots is None:
            return await self._ask(key, body, attrs)
        async with self._slots.hold():
            hit, cached = self._cache.get(key)
            if hit:
                return bool(cached)
            return await self._ask(key, body, attrs)

    async def _ask(self, key: str, body: JSON, attrs: Attributes) -> bool:
        try:
            review = await timed_review(
                self._apiserver, SUBJECTACCESSREVIEWS, body, kind="authz", observer=self._observer
            )
        except KubeError as err:
            log.error(
                "SubjectAccessReview failed",
                extra={
                    "user": attrs.user.name,
                    "subresource": attrs.subresource,
                    "error": str(err),
                },
            )
            raise AuthorizationError(str(err), attrs) from err
        status = (review or {}).get("status") or {}
        allowed = bool(status.get("allowed")) and not status.get("denied")
        ttl = (
            self.settings.cache_authorized_ttl_s
            if allowed
            else self.settings.cache_unauthorized_ttl_s
        )
        self._cache.put(key, allowed, ttl)
        return allowed
