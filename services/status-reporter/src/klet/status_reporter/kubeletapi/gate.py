"""Authentication then authorization of one kubelet API request: `Gate.check` returns
None (go ahead) or the error answer, with upstream's statuses and bodies: 401
"Unauthorized" (no identity, or the TokenReview failed), 500 "Authorization error
(...)" (the SubjectAccessReview failed), 403 "Forbidden (user=..., ...)" (denied); and
klet's own 429 "Too Many Requests" when the review the request needs has no free slot
(`reviewslots.py`; upstream queues every review without bound).

It decides on the request head alone (method, path, headers, the TLS client
certificate): `server.py` calls it before reading any body, so a request that is not
allowed never gets its body read or buffered.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from klet.status_reporter.kubeletapi.attributes import (
    authorization_error_message,
    forbidden_message,
    request_attributes,
)
from klet.status_reporter.kubeletapi.authn import AuthenticationError, Authenticator
from klet.status_reporter.kubeletapi.authz import (
    AlwaysAllow,
    AuthorizationError,
    Authorizer,
    WebhookAuthorizer,
)
from klet.status_reporter.kubeletapi.deps import KubeletApiDeps
from klet.status_reporter.kubeletapi.reviewslots import ReviewSlots, ReviewsOverloaded

log = logging.getLogger(__name__)

TOO_MANY_REQUESTS = (429, "Too Many Requests")
"""The answer when the review a request needs has no free slot (the server adds
Retry-After)."""


class Gate:
    """Authentication + authorization of one request; returns None or an error answer."""

    def __init__(self, deps: KubeletApiDeps) -> None:
        s = deps.settings
        self._node = s.node_name
        self._fine_grained = s.fine_grained_authz
        self._metrics = deps.metrics
        self._authn = Authenticator(
            s.authn,
            deps.apiserver,
            slots=ReviewSlots(
                "TokenReview", concurrency=s.review_concurrency, queue=s.review_queue
            ),
            observer=deps.metrics,
            cache_observer=deps.metrics,
        )
        self._authz: Authorizer
        if s.authorization_mode == "AlwaysAllow":
            self._authz = AlwaysAllow()
        elif deps.apiserver is None:
            raise ValueError("authorization.mode: Webhook needs an apiserver (--kubeconfig)")
        else:
            self._authz = WebhookAuthorizer(
                s.authz,
                deps.apiserver,
                slots=ReviewSlots(
                    "SubjectAccessReview", concurrency=s.review_concurrency, queue=s.review_queue
                ),
                observer=deps.metrics,
            )

    async def check(
        self, method: str, path: str, headers: Mapping[str, str], peercert: Any
    ) -> tuple[int, str] | None:
        try:
            user = await self._authn.authenticate(headers, peercert)
        except AuthenticationError:
            user = None
        except ReviewsOverloaded as err:
            return self._overloaded(err)
        if user is None:
            return 401, "Unauthorized"
        attrs = request_attributes(
            user, method, path, node_name=self._node, fine_grained=self._fine_grained
        )
        try:
            allowed = await self._authz.allowed(attrs)
        except AuthorizationError as err:
            return 500, authorization_error_message(err.attrs)
        except ReviewsOverloaded as err:
            return self._overloaded(err)
        if not allowed:
            log.info(
                "forbidden",
                extra={
                    "user": user.name,
                    "verb": attrs[0].verb,
                    "path": path,
                    "subresources": [a.subresource for a in attrs],
                },
            )
            return 403, forbidden_message(attrs)
        return None

    def _overloaded(self, err: ReviewsOverloaded) -> tuple[int, str]:
        self._metrics.reviews_rejected.labels(review=err.review).inc()
        return TOO_MANY_REQUESTS
