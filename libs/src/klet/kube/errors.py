"""The apiserver client's own exceptions, each carrying the HTTP status and reason."""

from __future__ import annotations


class KubeError(Exception):
    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class Unavailable(KubeError):
    """The apiserver did not answer (connection refused, timeout, 5xx, 429)."""


class NotFound(KubeError):
    """404."""


class Conflict(KubeError):
    """409: already exists, or a resourceVersion / UID precondition failed."""


class Forbidden(KubeError):
    """403 (and 401): the identity may not do this."""


class Invalid(KubeError):
    """400 / 422: the request was refused as malformed or invalid."""


class Gone(KubeError):
    """410: the resourceVersion of a watch or list is too old; relist."""


def for_status(status: int, message: str, reason: str = "") -> KubeError:
    if status == 404:
        return NotFound(message, status=status, reason=reason)
    if status == 409:
        return Conflict(message, status=status, reason=reason)
    if status in (401, 403):
        return Forbidden(message, status=status, reason=reason)
    if status == 410:
        return Gone(message, status=status, reason=reason)
    if status in (400, 422):
        return Invalid(message, status=status, reason=reason)
    if status == 429 or status >= 500 or status == 0:
        return Unavailable(message, status=status, reason=reason)
    return KubeError(message, status=status, reason=reason)
