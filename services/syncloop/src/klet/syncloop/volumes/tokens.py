"""Service-account tokens for projected volumes, from the TokenRequest API.

A token is requested for the pod's service account with `boundObjectRef` naming the pod
(kind Pod, name, UID): the Node authorizer lets a node create tokens only for pods
bound to it and only bound to them, and a bound token stops being valid when the pod
is deleted. Tokens are kept per (namespace, service account, audience, expiration,
pod UID), as upstream's token manager keys them, and requested again once older than
80 % of their lifetime or 24 hours (each check with up to 10 s of random jitter, so
the pods of a node do not all refresh at the same second). When a refresh fails and
the old token has not expired yet, the old one is served and the failure logged.

The lifetime counts from the `expirationTimestamp` the apiserver answered with and the
`expirationSeconds` it was asked for. The apiserver may extend the JWT's own expiry
(`--service-account-extend-token-expiration`, for the 3607 s tokens of the
kube-api-access volume) but still reports the requested lifetime, so the refresh
happens at 80 % of what was asked, as upstream.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

from klet.kube import KubeError
from klet.model.types import JSON

log = logging.getLogger(__name__)

MAX_TTL_S = 24 * 3600.0
MAX_JITTER_S = 10.0
REFRESH_AT = 0.8


class TokenError(Exception):
    """No valid token could be had; the message is upstream's."""


class Kube(Protocol):
    """The part of `klet.kube.KubeClient` used here."""

    async def create(self, path: str, body: JSON) -> Any: ...


@dataclass(frozen=True)
class Token:
    token: str
    expires_at: float  # seconds since the epoch
    expiration_s: int  # the lifetime asked for

    @property
    def issued_at(self) -> float:
        return self.expires_at - self.expiration_s


def requires_refresh(token: Token, *, now: float, jitter_s: float = 0.0) -> bool:
    """Whether `token` is due for renewal at `now` (upstream's rule)."""
    if now > token.issued_at + MAX_TTL_S - jitter_s:
        return True
    if now > token.expires_at - token.expiration_s * (1 - REFRESH_AT) - jitter_s:
        return True
    return now < token.issued_at  # the clock went back past the issue time


def parse_time(value: str) -> float:
    """An RFC 3339 timestamp as the apiserver writes it (`2025-01-31T12:00:00Z`)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def token_request(
    pod: JSON, *, audience: str, expiration_s: int, service_account_uid: str = ""
) -> JSON:
    meta = pod.get("metadata") or {}
    spec: JSON = {
        "expirationSeconds": expiration_s,
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
        },
    }
    if audience:  # none: the apiserver's own audiences
        spec["audiences"] = [audience]
    request: JSON = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    if service_account_uid:  # a precondition: not for a re-created account of that name
        request["metadata"] = {"uid": service_account_uid}
    return request


Key = tuple[str, str, str, int, str, str]


class TokenManager:
    """`TokenIssuer` over the apiserver, with upstream's cache and refresh rules."""

    def __init__(
        self,
        kube: Kube,
        *,
        clock: Callable[[], float] = time.time,
        jitter: Callable[[], float] = lambda: random.uniform(0.0, MAX_JITTER_S),
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.jitter = jitter
        self._cache: dict[Key, Token] = {}

    async def token(
        self,
        pod: JSON,
        *,
        service_account: str,
        audience: str,
        expiration_s: int,
        service_account_uid: str = "",
    ) -> tuple[str, float]:
        """A token bound to `pod`; with `service_account_uid` (credential providers, as
        upstream) the apiserver refuses it for another account of the same name, and it
        is cached apart."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        key: Key = (
            namespace,
            service_account,
            audience,
            expiration_s,
            str(meta.get("uid", "")),
            service_account_uid,
        )
        cached = self._cache.get(key)
        now = self.clock()
        if cached is not None and not requires_refresh(cached, now=now, jitter_s=self.jitter()):
            return cached.token, cached.expires_at
        path = (
            f"/api/v1/namespaces/{quote(namespace, safe='')}"
            f"/serviceaccounts/{quote(service_account, safe='')}/token"
        )
        body = token_request(
            pod,
            audience=audience,
            expiration_s=expiration_s,
            service_account_uid=service_account_uid,
        )
        try:
            answer = await self.kube.create(path, body)
            status = (answer or {}).get("status") or {}
            fresh = Token(
                token=str(status["token"]),
                expires_at=parse_time(str(status["expirationTimestamp"])),
                expiration_s=int(
                    ((answer or {}).get("spec") or {}).get("expirationSeconds") or expiration_s
                ),
            )
        except (KubeError, KeyError, ValueError) as err:
            reason = _message(err, path)
            if cached is None:
                raise TokenError(f"failed to fetch token: {reason}") from err
            if now > cached.expires_at:
                raise TokenError(f"token expired and refresh failed: {reason}") from err
            log.warning(
                "couldn't update token, serving the cached one",
                extra={"namespace": namespace, "service_account": service_account, "error": reason},
            )
            return cached.token, cached.expires_at
        # Tokens of pods whose volumes were never torn down expire; drop them here
        # (upstream's minutely clean-up) rather than keep them for ever.
        self._cache = {k: t for k, t in self._cache.items() if t.expires_at >= now}
        self._cache[key] = fresh
        return fresh.token, fresh.expires_at

    def forget_pod(self, uid: str) -> None:
        """Drop the tokens bound to pod `uid` (its volumes are gone)."""
        self._cache = {k: t for k, t in self._cache.items() if k[4] != uid}


def _message(err: Exception, path: str) -> str:
    """The apiserver's words (`serviceaccounts "x" not found`) without our request prefix."""
    if isinstance(err, KubeError):
        text = str(err)
        prefix = f"POST {path}: {err.status} "
        return text[len(prefix) :] if text.startswith(prefix) else text
    return f"malformed TokenRequest answer: {err}"
