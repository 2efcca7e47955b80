"""The kubelet's authenticated HTTPS API (upstream's --port, 10250): endpoints, auth,
log streaming, stats and the exec/attach/portForward streaming proxy.

Entry points: `build_kubelet_api_deps(settings, ...)` and `serve_kubelet_api(deps)`,
a root task of the status-reporter; `create_app(deps)` for in-process tests.
"""

from klet.status_reporter.kubeletapi.app import create_app
from klet.status_reporter.kubeletapi.deps import (
    KubeletApiDeps,
    KubeletApiSettings,
    build_kubelet_api_deps,
)
from klet.status_reporter.kubeletapi.server import serve_kubelet_api

__all__ = [
    "KubeletApiDeps",
    "KubeletApiSettings",
    "build_kubelet_api_deps",
    "create_app",
    "serve_kubelet_api",
]
