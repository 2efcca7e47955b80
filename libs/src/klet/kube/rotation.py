"""Client certificate rotation (`rotateCertificates: true`), as upstream's kubelet does it.

A root task of status-reporter's leader. At a random point between 70% and 90% of the
current certificate's lifetime (klet.kube.certificates.rotation_deadline) it asks for a
new one with a new key, through the certificates API with the node's own identity (a
CSR for the same signer and subject, which the approver passes for
`system:certificates.k8s.io:certificatesigningrequests:selfnodeclient`), and installs it
as the new `kubelet-client-current.pem`. Every apiserver client of every service names
that file in its kubeconfig, so each new connection presents the new certificate; each
client also drops its pooled connections when it sees the file change
(klet.kube.client), so nothing keeps authenticating with the old one. Nothing is
restarted: the Lease, the watches and the pods carry on.

The renewal runs under the certificate directory's lock (klet.kube.bootstrap) and
re-reads the file inside it, so two replicas (a leader handing over mid-renewal) renew
once. A request that is denied, fails or is not issued in time is logged (once per
cause) and asked again after `retry_s`; the current certificate stays in use until it
expires.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from klet.kube.bootstrap import (
    BootstrapError,
    CertificateApi,
    CertificateDenied,
    cert_dir_lock,
    kubeconfig_client_certificate,
    request_certificate,
)
from klet.kube.certificates import (
    CertStore,
    Issued,
    NodeCertificateError,
    csr_name,
    node_csr_pem,
    random_jitter,
    rotation_deadline,
)
from klet.obs import OnceLogger

__all__ = ["ClientCertificateRotation", "RotationRefused", "check_rotatable"]

log = logging.getLogger(__name__)

# The longest sleep between looks at the file: a renewal made by another replica, or a
# certificate replaced by hand, is noticed within it.
MAX_SLEEP_S = 60.0


class RotationRefused(ValueError):
    """rotateCertificates cannot work with this kubeconfig; the message says why."""


def check_rotatable(kubeconfig: Path, cert_dir: Path) -> None:
    """Refuse rotateCertificates unless the kubeconfig's client certificate is the
    certificate directory's current file (as --bootstrap-kubeconfig writes it): a
    certificate embedded in the kubeconfig, or kept elsewhere, would never be replaced."""
    current = CertStore(cert_dir).current_path
    try:
        named = kubeconfig_client_certificate(kubeconfig)
    except BootstrapError as err:
        raise RotationRefused(f"rotateCertificates: {err}") from err
    if named is None or named != current:
        raise RotationRefused(
            f"rotateCertificates: the kubeconfig {kubeconfig} must name {current} as its "
            f"client certificate and key (as --bootstrap-kubeconfig writes it), not "
            f"{named or 'embedded data or a token'}"
        )


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class ClientCertificateRotation:
    def __init__(
        self,
        *,
        store: CertStore,
        api: CertificateApi,
        node_name: str,
        wait_s: float = 300.0,
        retry_s: float = 30.0,
        poll_s: float = 1.0,
        now: Callable[[], datetime.datetime] = _utcnow,
        jitter: Callable[[], float] = random_jitter,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_issued: Callable[[Issued], None] | None = None,
    ) -> None:
        self.store = store
        self.api = api
        self.node_name = node_name
        self.wait_s = wait_s
        self.retry_s = retry_s
        self.poll_s = poll_s
        self.now = now
        self._jitter = jitter
        self._fraction = jitter()
        self._sleep = sleep
        self._on_issued = on_issued
        self._once = OnceLogger(log, level=logging.ERROR)

    async def run(self) -> None:
        while True:
            await self._sleep(await self.run_once())

    def deadline(self, issued: Issued) -> datetime.datetime:
        return rotation_deadline(issued.start, issued.not_after, jitter=self._fraction)

    async def run_once(self) -> float:
        """Renew when due; the seconds until the next look."""
        try:
            issued = await asyncio.to_thread(self.store.current)
        except NodeCertificateError as err:
            self._once.error(
                "read", "current client certificate not readable", cause=str(err), error=str(err)
            )
            return self.retry_s
        if issued is None:
            self._once.error(
                "read",
                "no current client certificate to rotate",
                cause=str(self.store.current_path),
                path=str(self.store.current_path),
            )
            return self.retry_s
        self._once.clear("read", "current client certificate readable again")
        if self._on_issued is not None:
            self._on_issued(issued)
        wait = (self.deadline(issued) - self.now()).total_seconds()
        if wait > 0:
            return min(wait, MAX_SLEEP_S)
        try:
            renewed = await self._renew()
        except (BootstrapError, NodeCertificateError) as err:
            self._once.error(
                "renew", "client certificate not renewed", cause=str(err), error=str(err)
            )
            return self.retry_s
        self._once.clear("renew", "client certificate renewed after failures")
        if renewed is not None:
            self._fraction = self._jitter()
            if self._on_issued is not None:
                self._on_issued(renewed)
            log.info(
                "client certificate rotated",
                extra={
                    "subject": renewed.subject,
                    "expires": renewed.not_after.isoformat(),
                    "next": self.deadline(renewed).isoformat(),
                },
            )
        return 0.0

    async def _renew(self) -> Issued | None:
        async with cert_dir_lock(self.store.cert_dir):
            issued = await asyncio.to_thread(self.store.current)
            if issued is not None and self.deadline(issued) > self.now():
                return None  # another process renewed it meanwhile
            key = await asyncio.to_thread(self.store.pending_key)
            csr = node_csr_pem(key, self.node_name)
            name = csr_name(csr, prefix="csr-")
            log.info("renewing the client certificate", extra={"csr": name})
            try:
                cert = await request_certificate(
                    self.api,
                    csr_pem=csr,
                    name=name,
                    wait_s=self.wait_s,
                    poll_s=self.poll_s,
                )
            except CertificateDenied:
                await asyncio.to_thread(self.store.pending_key_path.unlink, missing_ok=True)
                raise
            return await asyncio.to_thread(self.store.install, key, cert, now=self.now())
