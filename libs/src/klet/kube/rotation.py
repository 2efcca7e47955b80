"""Certificate rotation, as upstream's kubelet does it: the client certificate
(`rotateCertificates: true`) and the serving certificate of the kubelet API
(`serverTLSBootstrap: true`).

Root tasks of status-reporter's leader. At a random point between 70% and 90% of the
current certificate's lifetime (klet.kube.certificates.rotation_deadline) one asks for a
new one with a new key, through the certificates API with the node's own identity (a
CSR for `CN=system:node:<node>, O=system:nodes`), and installs it as the new
`<prefix>-current.pem` of the certificate directory:

- the client certificate (`kubelet-client-current.pem`, signer
  `kubernetes.io/kube-apiserver-client-kubelet`), which the approver passes for
  `system:certificates.k8s.io:certificatesigningrequests:selfnodeclient`. Every
  apiserver client of every service names that file in its kubeconfig, so each new
  connection presents the new certificate; each client also drops its pooled
  connections when it sees the file change (klet.kube.client), so nothing keeps
  authenticating with the old one;
- the serving certificate (`kubelet-server-current.pem`, signer
  `kubernetes.io/kubelet-serving`, with the node name and node IPs as subject
  alternative names), which no built-in approver passes: an operator or an approver of
  their choice approves it, as on a kubeadm cluster. The first one is asked for at
  start; until it is issued the kubelet API has no certificate to serve
  (kubeletapi.tlsconfig), and every replica's listener picks up each new file.

Nothing is restarted: the Lease, the watches and the pods carry on.

A renewal runs under the certificate directory's lock (klet.kube.bootstrap) and re-reads
the file inside it, so two replicas (a leader handing over mid-renewal) renew once. A
request that is denied, fails or is not issued in time is logged (once per cause) and
asked again after `retry_s` (a denied one with a new key); the current certificate
stays in use until it expires.

Hooks tell an observer (status-reporter's certificate metrics) what each look read
(`on_issued`: the current certificate), each failed renewal (`on_renew_failed`) and
each certificate this process replaced (`on_rotated`: the seconds the old one lived).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from klet.kube.bootstrap import (
    BootstrapError,
    CertificateApi,
    CertificateDenied,
    cert_dir_lock,
    kubeconfig_client_certificate,
    kubeconfig_embedded_pair,
    request_certificate,
)
from klet.kube.certificates import (
    CLIENT_SIGNER,
    CLIENT_USAGES,
    SERVING_SIGNER,
    SERVING_USAGES,
    CertStore,
    Issued,
    NodeCertificateError,
    csr_name,
    node_csr_pem,
    random_jitter,
    rotation_deadline,
)
from klet.obs import OnceLogger

__all__ = [
    "CLIENT",
    "CertificateKind",
    "CertificateRotation",
    "RotationRefused",
    "check_rotatable",
    "seed_decision",
    "seed_store",
    "serving_kind",
]

log = logging.getLogger(__name__)

# The longest sleep between looks at the file: a renewal made by another replica, or a
# certificate replaced by hand, is noticed within it.
MAX_SLEEP_S = 60.0


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class RotationRefused(ValueError):
    """rotateCertificates cannot work with this kubeconfig; the message says why."""


def check_rotatable(kubeconfig: Path, cert_dir: Path) -> None:
    """Refuse rotateCertificates unless the kubeconfig's client certificate is the
    certificate directory's current file (as --bootstrap-kubeconfig writes it) or is
    embedded in it (kubeadm's kubelet.conf: the store is seeded from it at start,
    seed_store, and every client presents the store's pair, klet.kube.settings). A
    certificate kept in a file elsewhere, or a token, is refused: the client would go on
    presenting that file or token, never the renewed certificate."""
    current = CertStore(cert_dir).current_path
    try:
        named = kubeconfig_client_certificate(kubeconfig)
        embedded = kubeconfig_embedded_pair(kubeconfig)
    except BootstrapError as err:
        raise RotationRefused(f"rotateCertificates: {err}") from err
    if embedded is None and named != current:
        raise RotationRefused(
            f"rotateCertificates: the kubeconfig {kubeconfig} must name {current} as its "
            f"client certificate and key (as --bootstrap-kubeconfig writes it) or embed "
            f"them (client-certificate-data, client-key-data), not "
            f"{named or 'a token or no client certificate'}"
        )


def seed_decision(
    current: Issued | None,
    current_error: str | None,
    embedded_not_after: datetime.datetime,
    now: datetime.datetime,
) -> bool:
    """Whether the store takes the kubeconfig's embedded pair (True) or keeps its
    current one (False), as upstream's certificate manager starts: the store's pair
    while it has not expired, else the embedded (bootstrap) pair. RotationRefused when
    neither is usable, naming both causes."""
    if current is not None and current.valid_at(now):
        return False
    if embedded_not_after > now:
        return True
    store = current_error or (
        f"expired {current.not_after.isoformat()}" if current is not None else "none"
    )
    raise RotationRefused(
        f"rotateCertificates: no usable client certificate: the kubeconfig's embedded one "
        f"expired {embedded_not_after.isoformat()}, the store's current one: {store}"
    )


def _seed_store(kubeconfig: Path, cert_dir: Path, now: datetime.datetime) -> Issued | None:
    pair = kubeconfig_embedded_pair(kubeconfig)
    if pair is None:
        return None
    try:
        not_after = x509.load_pem_x509_certificates(pair)[0].not_valid_after_utc
    except ValueError as err:
        raise RotationRefused(f"{kubeconfig}: client-certificate-data is not PEM: {err}") from err
    store = CertStore(cert_dir)
    try:
        current, error = store.current(), None
    except NodeCertificateError as err:
        current, error = None, str(err)
    if not seed_decision(current, error, not_after, now):
        return None
    cert_start = pair.index(b"-----BEGIN CERTIFICATE-----")
    try:
        return store.install(pair[:cert_start], pair[cert_start:], now=now)
    except NodeCertificateError as err:
        raise RotationRefused(f"{kubeconfig}: the embedded pair: {err}") from err


async def seed_store(
    kubeconfig: Path, cert_dir: Path, *, now: Callable[[], datetime.datetime] = _utcnow
) -> Issued | None:
    """With rotateCertificates and a kubeconfig embedding its client certificate: make
    the embedded pair the store's `kubelet-client-current.pem` when the store has no
    valid current pair (seed_decision), under the certificate directory's lock, as
    upstream's certificate manager fills its store from the bootstrap pair. The pair
    installed, or None (nothing embedded, or the store's pair kept). RotationRefused
    when nothing usable is there; BootstrapError when the kubeconfig is unreadable."""
    if await asyncio.to_thread(kubeconfig_embedded_pair, kubeconfig) is None:
        return None  # nothing to seed: the certificate directory is not touched
    async with cert_dir_lock(cert_dir):
        issued = await asyncio.to_thread(_seed_store, kubeconfig, cert_dir, now())
    if issued is not None:
        log.info(
            "client certificate store seeded from the kubeconfig's embedded certificate",
            extra={
                "kubeconfig": str(kubeconfig),
                "subject": issued.subject,
                "expires": issued.not_after.isoformat(),
            },
        )
    return issued


@dataclass(frozen=True)
class CertificateKind:
    """Which certificate a rotation keeps."""

    what: str  # "client certificate", for logs
    prefix: str  # its files in the certificate directory (CertStore)
    signer: str
    usages: tuple[str, ...]
    csr_prefix: str  # of the CSR names
    request_when_missing: bool  # ask for a first one (bootstrap made the client's)
    dns_names: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()


CLIENT = CertificateKind(
    what="client certificate",
    prefix="kubelet-client",
    signer=CLIENT_SIGNER,
    usages=CLIENT_USAGES,
    csr_prefix="csr-",
    request_when_missing=False,
)


def serving_kind(node_name: str, node_ips: Sequence[str]) -> CertificateKind:
    """The kubelet API's certificate: the node name (a DNS name, or an IP if it is one)
    and the node IPs as subject alternative names, as upstream's kubelet asks for it."""
    dns: tuple[str, ...] = (node_name,)
    ips: tuple[str, ...] = tuple(node_ips)
    try:
        ipaddress.ip_address(node_name)
        dns, ips = (), (node_name, *node_ips)
    except ValueError:
        pass
    return CertificateKind(
        what="serving certificate",
        prefix="kubelet-server",
        signer=SERVING_SIGNER,
        usages=SERVING_USAGES,
        csr_prefix="csr-serving-",
        request_when_missing=True,
        dns_names=dns,
        ips=tuple(dict.fromkeys(ips)),
    )


class CertificateRotation:
    def __init__(
        self,
        *,
        store: CertStore,
        api: CertificateApi,
        node_name: str,
        kind: CertificateKind = CLIENT,
        wait_s: float = 300.0,
        retry_s: float = 30.0,
        poll_s: float = 1.0,
        now: Callable[[], datetime.datetime] = _utcnow,
        jitter: Callable[[], float] = random_jitter,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_issued: Callable[[Issued], None] | None = None,
        on_renew_failed: Callable[[], None] | None = None,
        on_rotated: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.api = api
        self.node_name = node_name
        self.kind = kind
        self.wait_s = wait_s
        self.retry_s = retry_s
        self.poll_s = poll_s
        self.now = now
        self._jitter = jitter
        self._fraction = jitter()
        self._sleep = sleep
        self._on_issued = on_issued
        self._on_renew_failed = on_renew_failed
        self._on_rotated = on_rotated
        self._once = OnceLogger(log, level=logging.ERROR)

    async def run(self) -> None:
        while True:
            await self._sleep(await self.run_once())

    def deadline(self, issued: Issued) -> datetime.datetime:
        return rotation_deadline(issued.start, issued.not_after, jitter=self._fraction)

    async def run_once(self) -> float:
        """Renew when due; the seconds until the next look."""
        what = self.kind.what
        try:
            issued = await asyncio.to_thread(self.store.current)
        except NodeCertificateError as err:
            self._once.error("read", f"current {what} not readable", cause=str(err), error=str(err))
            if not self.kind.request_when_missing:
                return self.retry_s
            issued = None  # ask for a usable one
        if issued is None and not self.kind.request_when_missing:
            self._once.error(
                "read",
                f"no current {what} to rotate",
                cause=str(self.store.current_path),
                path=str(self.store.current_path),
            )
            return self.retry_s
        if issued is not None:
            self._once.clear("read", f"current {what} readable again")
            if self._on_issued is not None:
                self._on_issued(issued)
            wait = (self.deadline(issued) - self.now()).total_seconds()
            if wait > 0:
                return min(wait, MAX_SLEEP_S)
        try:
            renewed = await self._renew()
        except (BootstrapError, NodeCertificateError) as err:
            self._once.error("renew", f"{what} not renewed", cause=str(err), error=str(err))
            if self._on_renew_failed is not None:
                self._on_renew_failed()
            return self.retry_s
        self._once.clear("renew", f"{what} renewed after failures")
        if renewed is not None:
            self._fraction = self._jitter()
            if self._on_issued is not None:
                self._on_issued(renewed)
            if issued is not None and self._on_rotated is not None:
                # how long the replaced one lived, from its notBefore, as upstream's
                # certificate manager observes a rotation
                self._on_rotated((self.now() - issued.not_before).total_seconds())
            log.info(
                f"{what} rotated" if issued is not None else f"{what} issued",
                extra={
                    "subject": renewed.subject,
                    "expires": renewed.not_after.isoformat(),
                    "next": self.deadline(renewed).isoformat(),
                },
            )
        return 0.0

    async def _current_or_none(self) -> Issued | None:
        try:
            return await asyncio.to_thread(self.store.current)
        except NodeCertificateError:
            return None

    async def _renew(self) -> Issued | None:
        """Ask for a new certificate and install it. The lock (one per kind of
        certificate) covers reading and writing the files, not the wait for approval: a
        serving certificate may wait for an operator for hours, and nothing else may
        wait for that."""
        kind = self.kind
        lock = f".{kind.prefix}.lock"
        async with cert_dir_lock(self.store.cert_dir, lock):
            issued = await self._current_or_none()
            if issued is not None and self.deadline(issued) > self.now():
                return None  # another process renewed it meanwhile
            key = await asyncio.to_thread(self.store.pending_key)
        csr = node_csr_pem(key, self.node_name, dns_names=kind.dns_names, ips=kind.ips)
        name = csr_name(csr, prefix=kind.csr_prefix)
        log.info(f"requesting a {kind.what}", extra={"csr": name, "signer": kind.signer})
        try:
            cert = await request_certificate(
                self.api,
                csr_pem=csr,
                name=name,
                wait_s=self.wait_s,
                poll_s=self.poll_s,
                signer=kind.signer,
                usages=kind.usages,
            )
        except CertificateDenied:
            async with cert_dir_lock(self.store.cert_dir, lock):
                await asyncio.to_thread(self._drop_pending, key)
            raise
        async with cert_dir_lock(self.store.cert_dir, lock):
            return await asyncio.to_thread(self.store.install, key, cert, now=self.now())

    def _drop_pending(self, key: bytes) -> None:
        """Forget the key of a denied request (unless another process replaced it)."""
        path = self.store.pending_key_path
        if path.exists() and path.read_bytes() == key:
            path.unlink()
