"""The kubelet's authenticated HTTPS API (upstream's --port, 10250): endpoints, auth,
log streaming, stats and the exec/attach/portForward streaming proxy.

Entry points: `build_kubelet_api_deps(settings, ...)` here, then
`klet.status_reporter.kubeletapi.server.serve_kubelet_api(deps)`, a root task of the
status-reporter; `klet.status_reporter.kubeletapi.app.create_app(deps)` for in-process
tests. The server and the app are not imported by this package: they load FastAPI and
cryptography (about 30 MB resident), which a status-reporter without the API on --port
(standalone without serving certificates, or `enableServer: false`) never needs.
"""

from klet.status_reporter.kubeletapi.deps import (
    HistoryLookup,
    KubeletApiDeps,
    KubeletApiSettings,
    build_kubelet_api_deps,
)

__all__ = [
    "HistoryLookup",
    "KubeletApiDeps",
    "KubeletApiSettings",
    "build_kubelet_api_deps",
]
