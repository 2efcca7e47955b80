"""How a kubelet API request is labelled in upstream's `kubelet_http_requests_total`,
`kubelet_http_requests_duration_seconds` and `kubelet_http_inflight_requests`.

Upstream's server labels each request before anything else looks at it (its ServeHTTP
wraps the authentication filter too, so a 401 is counted as well): `method` is the
verb when it is one of HTTP's eight, else "other"; `path` is the request's root
(`/metrics/<x>` keeps two parts, any other path its first) when the server installed a
handler under that root, else "other", so a client cannot grow the label set;
`long_running` says whether that root is exec, attach, portforward or debug. Upstream
compares the lower-case "portforward" with the bucket "portForward", so a port-forward
is labelled not long-running; klet keeps that, as dashboards were built on it.

Which roots count depends on what the server installs: with enableDebuggingHandlers the
debugging endpoints (configz, logs, debug, checkpoint with its gate), without them the
paths that answer "Debug endpoints are disabled." (and pprof). These are pure decisions;
`server.py` times and counts each request with them.
"""

from __future__ import annotations

METHODS = frozenset(("OPTIONS", "GET", "HEAD", "POST", "PUT", "DELETE", "TRACE", "CONNECT"))
LONG_RUNNING = frozenset(("exec", "attach", "portforward", "debug"))

_ALWAYS = (
    "healthz",
    "pods",
    "stats",
    "metrics",
    "metrics/cadvisor",
    "metrics/probes",
    "metrics/resource",
)
_STREAMS = ("run", "exec", "attach", "portForward", "containerLogs", "runningpods", "logs")


def path_buckets(*, debugging: bool, checkpoint: bool) -> frozenset[str]:
    """The roots upstream's read-write server labels by name, for its settings."""
    if not debugging:
        return frozenset((*_ALWAYS, *_STREAMS, "pprof"))
    extra = ("configz", "debug", *(("checkpoint",) if checkpoint else ()))
    return frozenset((*_ALWAYS, *_STREAMS, *extra))


def root_path(path: str) -> str:
    """`metrics/<x>` for a path under /metrics/, else the path's first part."""
    parts = path.removeprefix("/").split("/", 2)
    if parts[0] == "metrics" and len(parts) > 1:
        return f"metrics/{parts[1]}"
    return parts[0]


def request_labels(method: str, path: str, buckets: frozenset[str]) -> tuple[str, str, str]:
    """(method, path, long_running) as upstream labels a request."""
    root = root_path(path)
    bucket = root if root in buckets else "other"
    return (
        method if method in METHODS else "other",
        bucket,
        "true" if bucket in LONG_RUNNING else "false",
    )
