"""TLS bootstrap and the certificate requests it shares with rotation.

A node joined the kubeadm way has only a bootstrap kubeconfig (`--bootstrap-kubeconfig`,
a bootstrap token). Before a service that talks to the apiserver starts, as upstream's
kubelet does before anything else, `ensure_client_certificate`:

1. uses `--kubeconfig` as it is when it exists and its client certificate is valid now
   (or it authenticates otherwise, with a token);
2. else, when the certificate directory already holds a valid `kubelet-client-current.pem`
   (a restart after a bootstrap, or a kubeconfig lost), writes `--kubeconfig` for it;
3. else asks for one: a CertificateSigningRequest for the
   `kubernetes.io/kube-apiserver-client-kubelet` signer (`CN=system:node:<node>`,
   `O=system:nodes`) made with the bootstrap credentials, waits until it is approved and
   issued, installs key and certificate (klet.kube.certificates.CertStore) and writes
   `--kubeconfig`: the bootstrap kubeconfig's cluster, and `kubelet-client-current.pem`
   as client certificate and key, so a rotated certificate is used without rewriting it.

Several services do this at once on a new node (pod-source, syncloop, status-reporter,
each of any number of replicas): an exclusive lock on a file in the certificate
directory lets the first ask while the others wait and then find its result. The key of
a request is kept until the certificate arrives and the request's name follows from it,
so a service restarted while waiting finds its own request again instead of making
another.

Bad input ends the service with a message naming the cause (a wrong or expired token:
the apiserver's 401; an identity that may not ask: 403; a request denied or failed: its
condition's reason and message; a signer that does not answer within `wait_s`: the
request's name and state); the supervisor starts it again, which asks again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml
from cryptography import x509
from klet.kube.certificates import (
    CLIENT_SIGNER,
    CLIENT_USAGES,
    CertStore,
    NodeCertificateError,
    csr_name,
    issued_cert_pem,
    node_csr_pem,
)
from klet.kube.errors import Conflict, Forbidden, KubeError, Unavailable
from klet.model.types import JSON

__all__ = [
    "BootstrapError",
    "BootstrapSettings",
    "CertificateApi",
    "CertificateDenied",
    "CertificateRequestFailed",
    "cert_dir_lock",
    "ensure_client_certificate",
    "kubeconfig_certificate_expiry",
    "kubeconfig_client_certificate",
    "kubeconfig_embedded_pair",
    "request_certificate",
]

log = logging.getLogger(__name__)

CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
LOCK_NAME = ".kubelet-client.lock"
STILL_WAITING_EVERY_S = 60.0


class BootstrapError(Exception):
    """The node could not get a client certificate; the message says why."""


class CertificateRequestFailed(BootstrapError):
    """The CertificateSigningRequest was denied, failed or not issued in time."""


class CertificateDenied(CertificateRequestFailed):
    """The request was denied or failed: it will never be issued, so its key is dropped
    and the next attempt asks anew."""


class CertificateApi(Protocol):
    """The apiserver calls a certificate request makes (klet.kube.client.KubeClient)."""

    async def create(self, path: str, body: JSON) -> Any: ...

    async def get(self, path: str, **params: Any) -> Any: ...


@dataclass(frozen=True)
class BootstrapSettings:
    kubeconfig: Path  # --kubeconfig: used when valid, written otherwise
    bootstrap_kubeconfig: Path  # --bootstrap-kubeconfig
    cert_dir: Path  # --cert-dir
    node_name: str
    wait_s: float = 900.0  # how long to wait for the request to be approved and issued
    poll_s: float = 1.0


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _open_lock(cert_dir: Path, name: str) -> int:
    cert_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.open(cert_dir / name, os.O_RDWR | os.O_CREAT, 0o600)


@contextlib.asynccontextmanager
async def cert_dir_lock(cert_dir: Path, name: str = LOCK_NAME) -> AsyncIterator[None]:
    """Exclusive among every process using this lock file of the certificate directory
    (flock: released by the kernel when a holder dies)."""
    fd = await asyncio.to_thread(_open_lock, cert_dir, name)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


def _read_kubeconfig(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise BootstrapError(f"{path}: not a readable kubeconfig: {err}") from err
    if not isinstance(data, dict):
        raise BootstrapError(f"{path}: not a kubeconfig (not a mapping)")
    return data


def _named(config: dict[str, Any], kind: str, name: str, path: Path) -> dict[str, Any]:
    key = kind[:-1]
    for entry in config.get(kind) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key)
            if isinstance(value, dict):
                return value
    raise BootstrapError(f"{path}: no {key} named {name!r}")


def _current(config: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(cluster, user) of the current context."""
    context_name = config.get("current-context")
    if not context_name:
        raise BootstrapError(f"{path}: no current-context")
    context = _named(config, "contexts", str(context_name), path)
    cluster = _named(config, "clusters", str(context.get("cluster") or ""), path)
    user = _named(config, "users", str(context.get("user") or ""), path)
    return cluster, user


def _absolute(value: str, base: Path) -> str:
    return value if os.path.isabs(value) else str((base / value).resolve())


def kubeconfig_client_certificate(path: Path) -> Path | None:
    """The file the kubeconfig's current user names as client certificate; None when it
    embeds the certificate or uses none."""
    _, user = _current(_read_kubeconfig(path), path)
    if user.get("client-certificate-data") or not user.get("client-certificate"):
        return None
    return Path(_absolute(str(user["client-certificate"]), path.parent))


def kubeconfig_embedded_pair(path: Path) -> bytes | None:
    """The key and certificate PEM the kubeconfig's current user embeds
    (client-key-data, client-certificate-data: kubeadm's kubelet.conf), as one file's
    bytes; None when it embeds no certificate. BootstrapError naming the field when only
    one of the two is there or one is not base64."""
    _, user = _current(_read_kubeconfig(path), path)
    cert_b64, key_b64 = user.get("client-certificate-data"), user.get("client-key-data")
    if not cert_b64:
        return None
    if not key_b64:
        raise BootstrapError(f"{path}: client-certificate-data without client-key-data")
    try:
        cert, key = base64.b64decode(str(cert_b64)), base64.b64decode(str(key_b64))
    except ValueError as err:
        raise BootstrapError(f"{path}: client-certificate-data or client-key-data: {err}") from err
    return key.rstrip(b"\n") + b"\n" + cert


def kubeconfig_certificate_expiry(path: Path) -> datetime.datetime | None:
    """When the client certificate of the kubeconfig's current user expires; None when
    it authenticates without one (a token). BootstrapError when it cannot be read."""
    config = _read_kubeconfig(path)
    _, user = _current(config, path)
    if user.get("client-certificate-data"):
        try:
            pem = base64.b64decode(str(user["client-certificate-data"]))
        except ValueError as err:
            raise BootstrapError(f"{path}: client-certificate-data is not base64") from err
    elif user.get("client-certificate"):
        cert_path = Path(_absolute(str(user["client-certificate"]), path.parent))
        try:
            pem = cert_path.read_bytes()
        except OSError as err:
            raise BootstrapError(f"{path}: client-certificate {cert_path}: {err}") from err
    else:
        return None
    try:
        return x509.load_pem_x509_certificates(pem)[0].not_valid_after_utc
    except ValueError as err:
        raise BootstrapError(f"{path}: the client certificate is not PEM: {err}") from err


def _write_kubeconfig(s: BootstrapSettings, client_cert: Path) -> None:
    """--kubeconfig: the bootstrap kubeconfig's cluster, the node's certificate file."""
    bootstrap = _read_kubeconfig(s.bootstrap_kubeconfig)
    cluster, _ = _current(bootstrap, s.bootstrap_kubeconfig)
    cluster = dict(cluster)
    if cluster.get("certificate-authority"):
        base = s.bootstrap_kubeconfig.parent
        cluster["certificate-authority"] = _absolute(str(cluster["certificate-authority"]), base)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": cluster}],
        "contexts": [
            {
                "name": "default-context",
                "context": {
                    "cluster": "default-cluster",
                    "namespace": "default",
                    "user": "default-auth",
                },
            }
        ],
        "current-context": "default-context",
        "users": [
            {
                "name": "default-auth",
                "user": {"client-certificate": str(client_cert), "client-key": str(client_cert)},
            }
        ],
    }
    s.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    tmp = s.kubeconfig.with_name(f".{s.kubeconfig.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        yaml.safe_dump(config, out, sort_keys=False)
    os.replace(tmp, s.kubeconfig)


def _kubeconfig_usable(path: Path, now: datetime.datetime) -> bool:
    if not path.exists():
        return False
    try:
        expiry = kubeconfig_certificate_expiry(path)
    except BootstrapError as err:
        log.warning("kubeconfig not usable, bootstrapping", extra={"error": str(err)})
        return False
    if expiry is not None and expiry <= now:
        log.warning(
            "the kubeconfig's client certificate has expired, bootstrapping",
            extra={"kubeconfig": str(path), "expired": expiry.isoformat()},
        )
        return False
    return True


async def ensure_client_certificate(
    s: BootstrapSettings,
    connect: Callable[[Path], CertificateApi],
    *,
    now: Callable[[], datetime.datetime] = _utcnow,
) -> None:
    """Make --kubeconfig usable (see the module docstring); `connect` makes an apiserver
    client from a kubeconfig path."""
    store = CertStore(s.cert_dir)
    async with cert_dir_lock(s.cert_dir):
        if await asyncio.to_thread(_kubeconfig_usable, s.kubeconfig, now()):
            return
        try:
            current = await asyncio.to_thread(store.current)
        except NodeCertificateError as err:
            log.warning("current client certificate not usable", extra={"error": str(err)})
            current = None
        if current is not None and current.valid_at(now()):
            await asyncio.to_thread(_write_kubeconfig, s, store.current_path)
            log.info(
                "kubeconfig written for the current client certificate",
                extra={"kubeconfig": str(s.kubeconfig), "expires": current.not_after.isoformat()},
            )
            return
        key = await asyncio.to_thread(store.pending_key)
        csr = node_csr_pem(key, s.node_name)
        name = csr_name(csr)
        log.info(
            "requesting a client certificate with the bootstrap kubeconfig",
            extra={"csr": name, "bootstrap_kubeconfig": str(s.bootstrap_kubeconfig)},
        )
        client = connect(s.bootstrap_kubeconfig)
        try:
            cert = await request_certificate(
                client,
                csr_pem=csr,
                name=name,
                wait_s=s.wait_s,
                poll_s=s.poll_s,
                credentials=f"the bootstrap kubeconfig {s.bootstrap_kubeconfig}",
            )
        except CertificateDenied:
            await asyncio.to_thread(store.pending_key_path.unlink, missing_ok=True)
            raise
        finally:
            closing = getattr(client, "close", None)
            if closing is not None:
                await closing()
        issued = await asyncio.to_thread(store.install, key, cert, now=now())
        await asyncio.to_thread(_write_kubeconfig, s, store.current_path)
        log.info(
            "client certificate issued",
            extra={
                "csr": name,
                "subject": issued.subject,
                "expires": issued.not_after.isoformat(),
                "kubeconfig": str(s.kubeconfig),
            },
        )


def same_request(existing_b64: Any, csr_pem: bytes) -> bool:
    """Whether a CSR object's request is for the same key and subject as `csr_pem` (the
    bytes differ: every ECDSA signature does)."""
    try:
        theirs = x509.load_pem_x509_csr(base64.b64decode(str(existing_b64)))
    except ValueError:
        return False
    ours = x509.load_pem_x509_csr(csr_pem)
    return theirs.subject == ours.subject and theirs.public_key() == ours.public_key()


def _condition(csr: JSON, kind: str) -> JSON | None:
    for c in (csr.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == kind and c.get("status", "True") == "True":
            return c
    return None


async def request_certificate(
    client: CertificateApi,
    *,
    csr_pem: bytes,
    name: str,
    wait_s: float,
    poll_s: float = 1.0,
    credentials: str = "the node's credentials",
    signer: str = CLIENT_SIGNER,
    usages: tuple[str, ...] = CLIENT_USAGES,
) -> bytes:
    """Create the CertificateSigningRequest `name` (or find the one made before with the
    same request) and wait until it is issued; the certificate's PEM. BootstrapError
    when it cannot be made, CertificateRequestFailed when denied, failed or not issued
    within `wait_s`."""
    request_b64 = base64.b64encode(csr_pem).decode()
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": request_b64, "signerName": signer, "usages": list(usages)},
    }
    deadline = time.monotonic() + wait_s
    created = False
    last = "not created yet"
    next_note = time.monotonic() + STILL_WAITING_EVERY_S
    while True:
        try:
            if not created:
                try:
                    csr = await client.create(CSR_PATH, body)
                except Conflict:
                    csr = await client.get(f"{CSR_PATH}/{name}")
                    if not same_request((csr.get("spec") or {}).get("request"), csr_pem):
                        raise BootstrapError(
                            f"certificate signing request {name} exists for another key or subject"
                        ) from None
                created = True
            else:
                csr = await client.get(f"{CSR_PATH}/{name}")
        except Forbidden as err:
            what = (
                "refused its credentials (401 Unauthorized): the token is wrong or expired"
                if err.status == 401
                else "refused to let it create a CertificateSigningRequest (403 Forbidden)"
            )
            raise BootstrapError(f"the apiserver {what}: {credentials}: {err}") from err
        except Unavailable as err:
            last = f"apiserver unavailable: {err}"
        except KubeError as err:
            raise BootstrapError(f"certificate signing request {name}: {err}") from err
        else:
            for kind in ("Denied", "Failed"):
                c = _condition(csr, kind)
                if c is not None:
                    raise CertificateDenied(
                        f"certificate signing request {name} was {kind.lower()}: "
                        f"{c.get('reason', '')}: {c.get('message', '')}"
                    )
            certificate = (csr.get("status") or {}).get("certificate")
            if certificate:
                try:
                    return issued_cert_pem(str(certificate), f"certificate signing request {name}")
                except NodeCertificateError as err:
                    raise CertificateRequestFailed(str(err)) from err
            approved = _condition(csr, "Approved") is not None
            last = "approved, not issued yet" if approved else "not approved yet"
        if time.monotonic() >= deadline:
            raise CertificateRequestFailed(
                f"certificate signing request {name} not issued within {wait_s:.0f}s "
                f"({last}): are the CSR approving and signing controllers running, and may "
                f"the requester's group have its request approved?"
            )
        if time.monotonic() >= next_note:
            log.warning("still waiting for the certificate", extra={"csr": name, "state": last})
            next_note = time.monotonic() + STILL_WAITING_EVERY_S
        await asyncio.sleep(poll_s)
