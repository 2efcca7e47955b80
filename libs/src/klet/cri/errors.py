"""The CRI client's own exceptions, each raised `from` the gRPC error that caused it."""

from __future__ import annotations


class CRIError(Exception):
    """A CRI call failed; `code` is the gRPC status name."""

    def __init__(self, message: str, *, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class NotFound(CRIError):
    """The sandbox, container or image does not exist (any more)."""


class RuntimeUnavailable(CRIError):
    """The runtime did not answer: socket missing, refused, or the deadline passed."""


class EventsUnsupported(CRIError):
    """The runtime serves neither CRI GetContainerEvents nor containerd's events API."""
