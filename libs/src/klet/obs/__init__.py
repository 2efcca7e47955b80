"""klet.obs: logging, metrics, health endpoints and task supervision shared by the services.

Libraries log through `logging.getLogger(__name__)` with `extra=` fields; entry points
call `configure_logging`, build a registry with `new_registry`, serve
`create_health_app(...)` with `serve_service_port` (`serve_http` plus the port files of
klet.portfiles) and run everything under `run_supervised`.
"""

from klet.obs.health import HealthCheck, create_health_app, get_app, serve_http
from klet.obs.logs import (
    JsonFormatter,
    OnceLogger,
    TextFormatter,
    configure_logging,
    level_for_verbosity,
    log_once_per_change,
)
from klet.obs.metrics import CONTENT_TYPE, LEADER_METRIC, leader_metric, new_registry, render
from klet.obs.serviceport import ServicePort, serve_service_port
from klet.obs.supervise import RootTaskFailed, run_supervised

__all__ = [
    "CONTENT_TYPE",
    "LEADER_METRIC",
    "HealthCheck",
    "JsonFormatter",
    "OnceLogger",
    "RootTaskFailed",
    "ServicePort",
    "TextFormatter",
    "configure_logging",
    "create_health_app",
    "get_app",
    "leader_metric",
    "level_for_verbosity",
    "log_once_per_change",
    "new_registry",
    "render",
    "run_supervised",
    "serve_http",
    "serve_service_port",
]
