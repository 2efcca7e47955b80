"""gRPC status codes as grpc-go names them, which is how upstream's metrics and messages
spell them (`grpc_status_code="DeadlineExceeded"`, `code = Unavailable`): Python's
`grpc.StatusCode` names are upper snake case, and grpc-go spells CANCELLED `Canceled`.
One place for the CSI client's and the DRA client's metrics and the health probe's text.
"""

from __future__ import annotations

_GO_CODES = {"OK": "OK", "CANCELLED": "Canceled"}


def go_code(name: str) -> str:
    """grpc-go's name of a status code given by its Python name (`DEADLINE_EXCEEDED` ->
    `DeadlineExceeded`, `CANCELLED` -> `Canceled`)."""
    return _GO_CODES.get(name) or "".join(p.capitalize() for p in name.split("_"))
