"""How to reach the apiserver, and the watch event type: the part of klet.kube that
does not import the `kubernetes` package.

A service imports `KubeClient` (klet.kube.client, which loads `kubernetes`, about 25 MB
resident) only in cluster mode; standalone it needs no more than `kube_settings` saying
there is no apiserver, the errors, and these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from klet.model.types import JSON

__all__ = [
    "CLIENT_GO_DEFAULT_QPS",
    "ApiSettings",
    "KubeSettings",
    "WatchEvent",
    "client_qps",
    "kube_settings",
    "rotated_certificate",
]


@dataclass(frozen=True)
class KubeSettings:
    """How to reach the apiserver; `qps`/`burst` are kubeAPIQPS/kubeAPIBurst."""

    kubeconfig: Path
    qps: float = 50.0
    burst: int = 100
    timeout_s: float = 30.0
    user_agent: str = "klet"
    # rotateCertificates: the store's current pair (--cert-dir's kubelet-client-
    # current.pem), which the client presents instead of a client certificate the
    # kubeconfig embeds (kubeadm's kubelet.conf); the store is seeded from it
    # (klet.kube.rotation.seed_store) and renewed. None: the kubeconfig's own.
    rotated_certificate: Path | None = None


class _ApiLimits(Protocol):
    @property
    def kube_api_qps(self) -> int: ...

    @property
    def kube_api_burst(self) -> int: ...

    @property
    def rotate_certificates(self) -> bool: ...


class _ApiTarget(Protocol):
    @property
    def kubeconfig(self) -> Path | None: ...

    @property
    def cert_dir(self) -> Path: ...


class ApiSettings(Protocol):
    """The part of the settings tree (klet.config.Settings) that says how to reach the
    apiserver; services pass their whole settings."""

    @property
    def kubelet(self) -> _ApiLimits: ...

    @property
    def klet(self) -> _ApiTarget: ...


def kube_settings(settings: ApiSettings, *, user_agent: str = "klet") -> KubeSettings | None:
    """The apiserver connection every service uses (--kubeconfig, kubeAPIQPS,
    kubeAPIBurst, and with rotateCertificates the --cert-dir store's current pair);
    None in standalone mode."""
    if settings.klet.kubeconfig is None:
        return None
    return KubeSettings(
        kubeconfig=Path(settings.klet.kubeconfig),
        qps=client_qps(settings.kubelet.kube_api_qps),
        burst=settings.kubelet.kube_api_burst,
        user_agent=user_agent,
        rotated_certificate=rotated_certificate(settings),
    )


CLIENT_GO_DEFAULT_QPS = 5.0
"""client-go's rest.DefaultQPS: what a client configured with QPS 0 gets."""


def client_qps(kube_api_qps: int) -> float:
    """The client's limit for kubeAPIQPS: the value itself, but 0 is client-go's default
    of 5, as upstream's kubelet hands kubeAPIQPS to client-go unchanged (its config
    defaults only an absent value to 50; an explicit 0 reaches rest.Config.QPS, which
    client-go replaces with DefaultQPS). Never unlimited: validation refuses a
    negative value."""
    return float(kube_api_qps) if kube_api_qps > 0 else CLIENT_GO_DEFAULT_QPS


def rotated_certificate(settings: ApiSettings) -> Path | None:
    """KubeSettings.rotated_certificate: with rotateCertificates, the store's current
    file (klet.kube.certificates.CertStore's name for it)."""
    if not settings.kubelet.rotate_certificates:
        return None
    return Path(settings.klet.cert_dir) / "kubelet-client-current.pem"


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
    object: JSON
