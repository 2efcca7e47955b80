"""What the kubelet API needs, as protocols of the calls it makes, and its settings.

`KubeletApiDeps` is built once by `build_kubelet_api_deps(settings, ...)` from the
service's settings tree and the clients the service already has: its pod view, a CRI
`RuntimeClient`, its metrics registry and (cluster mode) a `KubeClient`. Unit tests
build it directly with fakes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from klet.cgroups import CgroupFS
from klet.config import Settings
from klet.cri.types import ContainerStatusInfo
from klet.model.types import JSON, ContainerID, SandboxID
from klet.stats import CgroupReader, HostReader, StatsRuntime
from klet.status_reporter.kubeletapi.authn import ApiServer, AuthnSettings
from klet.status_reporter.kubeletapi.authz import AuthzSettings
from klet.status_reporter.kubeletapi.checkpoint import CheckpointRuntime
from klet.status_reporter.kubeletapi.connlimits import REFUSALS
from klet.status_reporter.kubeletapi.healthchecks import Check, SliMetrics, SyncloopCheck
from klet.status_reporter.kubeletapi.logstream import FollowPolicy
from klet.status_reporter.kubeletapi.lookup import RuntimeLister
from klet.status_reporter.kubeletapi.stats import VolumeSource
from klet.status_reporter.metrics.instruments import HttpRequestMetrics, KubeletApiMetrics
from prometheus_client import CollectorRegistry

FINE_GRAINED_GATE = "KubeletFineGrainedAuthz"
CHECKPOINT_GATE = "ContainerCheckpoint"
PSI_GATE = "KubeletPSI"
# With serverTLSBootstrap: klet.kube.rotation's serving certificate file in the cert dir
# (named here so that a standalone process does not load `cryptography` for it).
SERVING_FILE = "kubelet-server-current.pem"


class PodView(Protocol):
    """The node's pods as a v1 PodList (the status-reporter's pod cache)."""

    def pod_list(self) -> JSON: ...


class HistoryLookup(Protocol):
    """A pod's history by namespace and name (or UID): its story as JSON, None when none
    is kept. Raises klet.bus.BusError."""

    async def __call__(self, namespace: str, name: str) -> JSON | None: ...


class MetricsPages(Protocol):
    """`/metrics` and `/metrics/probes` as served (klet.status_reporter.metrics.nodemetrics)."""

    async def metrics(self) -> bytes: ...

    async def probes(self) -> bytes: ...


class StreamingRuntime(Protocol):
    """CRI calls behind exec, attach, portForward and run."""

    async def exec(
        self,
        container_id: ContainerID,
        cmd: list[str],
        *,
        tty: bool = False,
        stdin: bool = False,
        stdout: bool = True,
        stderr: bool = True,
    ) -> str: ...

    async def attach(
        self,
        container_id: ContainerID,
        *,
        tty: bool = False,
        stdin: bool = False,
        stdout: bool = True,
        stderr: bool = True,
    ) -> str: ...

    async def port_forward(self, sandbox_id: SandboxID, ports: list[int] | None = None) -> str: ...

    async def exec_sync(
        self, container_id: ContainerID, cmd: list[str], *, timeout_s: int
    ) -> tuple[int, bytes, bytes]: ...


class LogRuntime(Protocol):
    async def container_status(self, container_id: ContainerID) -> ContainerStatusInfo: ...


class KubeletRuntime(
    CheckpointRuntime, RuntimeLister, StreamingRuntime, LogRuntime, StatsRuntime, Protocol
):
    """Everything the kubelet API asks the runtime (klet.cri.RuntimeClient conforms)."""


@dataclass(frozen=True)
class KubeletApiSettings:
    """The KubeletConfiguration and flag values the kubelet API reads (upstream names in
    the field docs)."""

    node_name: str
    address: str = "0.0.0.0"
    """[address] bind address."""
    port: int = 10250
    """[port]; 0 picks a free port (tests)."""
    tls_cert_file: str = ""
    """[tlsCertFile]; "" = self-signed in cert_dir."""
    tls_private_key_file: str = ""
    """[tlsPrivateKeyFile]."""
    server_tls_bootstrap: bool = False
    """[serverTLSBootstrap]: the certificate comes from the certificates API into
    <cert_dir>/kubelet-server-current.pem (tls_cert_file and tls_private_key_file)."""
    tls_min_version: str = ""
    """[tlsMinVersion]."""
    tls_cipher_suites: tuple[str, ...] = ()
    """[tlsCipherSuites]."""
    cert_dir: Path = Path("/var/lib/kubelet/pki")
    """[--cert-dir] where the self-signed pair lives."""
    node_ips: tuple[str, ...] = ()
    """[--node-ip] extra SANs of the self-signed certificate."""
    client_ca_file: Path | None = None
    """[authentication.x509.clientCAFile]."""
    authn: AuthnSettings = field(default_factory=AuthnSettings)
    authorization_mode: str = "Webhook"
    """[authorization.mode]: Webhook or AlwaysAllow."""
    authz: AuthzSettings = field(default_factory=AuthzSettings)
    fine_grained_authz: bool = True
    """[featureGates.KubeletFineGrainedAuthz], on by default as upstream since 1.33."""
    container_checkpoint: bool = True
    """[featureGates.ContainerCheckpoint], on by default as upstream since 1.30: serves
    POST /checkpoint/{namespace}/{pod}/{container}."""
    psi: bool = True
    """[featureGates.KubeletPSI], on by default as upstream since 1.34: pressure stall
    information in /stats/summary and /metrics/cadvisor where the kernel has it."""
    enable_debugging_handlers: bool = True
    """[enableDebuggingHandlers]: off → 405 on logs, exec, attach, portForward, run,
    runningpods and configz."""
    pod_logs_dir: Path = Path("/var/log/pods")
    """[podLogsDir]."""
    enable_system_log_handler: bool = True
    """[enableSystemLogHandler]: off → 405 on /logs/."""
    node_log_dir: Path = Path("/var/log")
    """The directory /logs/ serves: upstream's nodeLogDir, fixed (tests point it
    elsewhere)."""
    root_dir: Path = Path("/var/lib/kubelet")
    """[--root-dir]: the node filesystem of /stats/summary."""
    cgroup_root: str = "/"
    """[cgroupRoot]: pod cgroups are read under `<cgroupRoot>/kubepods`."""
    streaming_idle_timeout_s: float = 4 * 3600.0
    """[streamingConnectionIdleTimeout], seconds."""
    idle_timeout_s: float = 90.0
    """Keep-alive idle timeout between requests, seconds (upstream's IdleTimeout)."""
    max_header_bytes: int = 64 << 10
    """Largest request head, bytes; a larger one is answered 431 and closed. Upstream's
    MaxHeaderBytes is 1 MiB, which every connection with an unfinished head could make
    the server buffer before a credential is checked; 64 KiB holds any real head (a
    bearer token is a few KiB, the apiserver's proxy headers less)."""
    # Limits of the listener (klet's own; see server.py, connlimits.py, reviewslots.py).
    header_timeout_s: float = 10.0
    """A request head must be complete this many seconds after the TLS handshake (a
    connection no request authenticated on yet) or after its first byte (the next
    request of a kept-alive connection): a deadline, not an idle timeout."""
    body_timeout_s: float = 60.0
    """An authorized request's body must be complete this many seconds after its head."""
    max_body_bytes: int = 1 << 20
    """Largest request body, bytes; the API takes none larger."""
    handshake_timeout_s: float = 10.0
    """The TLS handshake must be complete within this many seconds."""
    max_connections: int = 1024
    """Connections held at once, all clients together (0: no cap). Each costs under
    100 KiB of memory (TLS state and buffers) while idle."""
    max_connections_per_client: int = 512
    """Connections held at once by one client address (IPv6: one /64; 0: no cap). The
    apiserver is one client: every `kubectl logs -f`, exec and port-forward to this node
    through it holds one of these."""
    max_unauthenticated_connections: int = 128
    """Connections held at once on which no request was let through yet (the TLS
    handshake, the first request head and its review), all clients together (0: no
    cap). When full, a newcomer takes the place of the oldest one of the client holding
    the most, if that client holds more than the newcomer's (connlimits.py)."""
    max_unauthenticated_per_client: int = 32
    """Unauthenticated connections held at once by one client address (0: no cap)."""
    review_concurrency: int = 4
    """TokenReviews run at once, and as many SubjectAccessReviews; the API's apiserver
    client has a pool of twice this many threads of its own."""
    review_queue: int = 64
    """TokenReviews (and, apart, SubjectAccessReviews) that may wait for a slot; a
    request needing one more is answered 429 with Retry-After."""
    tls_reload_interval_s: float = 10.0
    """How often, at most, the certificate, key and client CA files are checked for
    changes (on a new connection)."""
    runtime_request_timeout_s: float = 120.0
    """[runtimeRequestTimeout]: how long /run waits for the command, seconds."""
    configz: JSON = field(default_factory=dict)
    """The KubeletConfiguration in upstream JSON form, for /configz."""

    @property
    def review_threads(self) -> int:
        """The threads of the API's own apiserver client: one per review slot."""
        return 2 * self.review_concurrency

    @classmethod
    def from_settings(cls, settings: Settings) -> KubeletApiSettings:
        k, klet = settings.kubelet, settings.klet
        auth = k.authentication
        return cls(
            node_name=klet.node_name,
            address=k.address,
            port=k.port,
            tls_cert_file=str(klet.cert_dir / SERVING_FILE)
            if k.server_tls_bootstrap
            else k.tls_cert_file,
            tls_private_key_file=str(klet.cert_dir / SERVING_FILE)
            if k.server_tls_bootstrap
            else k.tls_private_key_file,
            server_tls_bootstrap=k.server_tls_bootstrap,
            tls_min_version=k.tls_min_version,
            tls_cipher_suites=tuple(k.tls_cipher_suites),
            cert_dir=klet.cert_dir,
            node_ips=klet.node_ips,
            client_ca_file=settings.client_ca_file,
            authn=AuthnSettings(
                x509=settings.client_ca_file is not None,
                webhook=auth.webhook.enabled,
                webhook_cache_ttl_s=auth.webhook.cache_ttl,
                anonymous=auth.anonymous.enabled,
            ),
            authorization_mode=k.authorization.mode,
            authz=AuthzSettings(
                cache_authorized_ttl_s=k.authorization.webhook.cache_authorized_ttl,
                cache_unauthorized_ttl_s=k.authorization.webhook.cache_unauthorized_ttl,
            ),
            fine_grained_authz=k.feature_gates.get(FINE_GRAINED_GATE, True),
            container_checkpoint=k.feature_gates.get(CHECKPOINT_GATE, True),
            psi=k.feature_gates.get(PSI_GATE, True),
            enable_debugging_handlers=k.enable_debugging_handlers,
            pod_logs_dir=Path(k.pod_logs_dir),
            enable_system_log_handler=k.enable_system_log_handler,
            root_dir=klet.root_dir,
            cgroup_root=k.cgroup_root or "/",
            streaming_idle_timeout_s=k.streaming_connection_idle_timeout,
            runtime_request_timeout_s=k.runtime_request_timeout,
            configz={"kubeletconfig": k.to_upstream()},
        )


@dataclass(frozen=True)
class KubeletApiDeps:
    """Everything the kubelet API (port 10250) uses."""

    settings: KubeletApiSettings
    pods: PodView
    runtime: KubeletRuntime
    registry: CollectorRegistry
    cgroups: CgroupReader
    metrics: KubeletApiMetrics
    """The listener's refusals, on `registry` (`kubelet_api_metrics(registry)`)."""
    syncloop: Check
    """The `syncloop` check of /healthz (healthchecks.SyncloopCheck over the run dir's
    port files)."""
    apiserver: ApiServer | None = None
    """For TokenReview and SubjectAccessReview; None in standalone mode."""
    follow: FollowPolicy = field(default_factory=FollowPolicy)
    volumes: VolumeSource | None = None
    """The pods' measured CSI volumes, for /stats/summary; None: none reported."""
    node_metrics: MetricsPages | None = None
    """Every service's metrics (nodemetrics.NodeMetrics); None: `registry` alone."""
    history: HistoryLookup | None = None
    """A pod's history (`klet.bus.history.pod_story` on the node's bus), for /why."""
    slis: SliMetrics = field(default_factory=SliMetrics)
    """The registry of /metrics/slis, where /healthz records its checks."""


def host_reader(deps: KubeletApiDeps) -> HostReader:
    """The host reads behind /stats/summary and /metrics/cadvisor."""
    return host_reader_of(deps.settings, deps.cgroups)


def host_reader_of(s: KubeletApiSettings, cgroups: CgroupReader) -> HostReader:
    """The host reads of `s`'s node over `cgroups`. Per-cgroup PSI is read from the
    cgroup v2 hierarchy when that is what `cgroups` reads; a v1 host's cgroups have none
    (the node's /proc/pressure is read either way)."""
    unified = cgroups.root if isinstance(cgroups, CgroupFS) and cgroups.version == 2 else None
    return HostReader(
        cgroups=cgroups,
        root_dir=s.root_dir,
        pod_logs_dir=s.pod_logs_dir,
        cgroup_root=s.cgroup_root,
        psi=s.psi,
        unified=unified,
    )


def kubelet_api_metrics(
    registry: CollectorRegistry, http: HttpRequestMetrics | None = None
) -> KubeletApiMetrics:
    """The listener's metrics, registered on `registry`; `http`: the request metrics
    the read-only port shares (new ones on `registry` when not given)."""
    return KubeletApiMetrics(registry, refusals=REFUSALS, http=http)


def build_kubelet_api_deps(
    settings: Settings,
    *,
    pods: PodView,
    runtime: KubeletRuntime,
    registry: CollectorRegistry,
    apiserver: ApiServer | None,
    cgroups: CgroupReader | None = None,
    volumes: VolumeSource | None = None,
    node_metrics: MetricsPages | None = None,
    history: HistoryLookup | None = None,
    slis: SliMetrics | None = None,
    syncloop: Check | None = None,
    http: HttpRequestMetrics | None = None,
) -> KubeletApiDeps:
    """The kubelet API's dependencies. Raises ValueError when authorization.mode is
    Webhook and there is no apiserver to ask (upstream refuses to start the same way).
    `slis` and `syncloop`: those the read-only port and 10248 share (new ones if not
    given)."""
    api_settings = KubeletApiSettings.from_settings(settings)
    if api_settings.authorization_mode == "Webhook" and apiserver is None:
        raise ValueError(
            "authorization.mode: Webhook needs an apiserver (--kubeconfig); "
            "use AlwaysAllow in standalone mode"
        )
    return KubeletApiDeps(
        settings=api_settings,
        pods=pods,
        runtime=runtime,
        registry=registry,
        cgroups=cgroups if cgroups is not None else CgroupFS(),
        metrics=kubelet_api_metrics(registry, http),
        syncloop=syncloop or SyncloopCheck(run_dir=Path(settings.klet.run_dir)),
        apiserver=apiserver,
        volumes=volumes,
        node_metrics=node_metrics,
        history=history,
        slis=slis or SliMetrics(),
    )
