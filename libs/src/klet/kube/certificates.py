"""The node's client certificate on disk, and the requests for new ones.

Files in the certificate directory (`--cert-dir`), as upstream's kubelet keeps them, so
an operator's tooling finds them where it looks:

- `kubelet-client-<YYYY-MM-DD-HH-MM-SS>.pem`: a private key and the certificate issued
  for it, PEM, 0600, one file per issue;
- `kubelet-client-current.pem`: a symlink to the newest of those, swapped atomically
  (rename over it), which the kubeconfig names as both client-certificate and
  client-key, so every client that opens a new connection presents the newest;
- `kubelet-client.key.tmp`: the private key of a request not yet issued, kept across
  restarts so that a restarted service asks again with the same key, and so under the
  same CSR name (`csr_name`), finding the request it made before instead of making
  another.

Keys are ECDSA P-256, as upstream's kubelet makes them. The pure parts (what to ask
for, when a certificate is due for renewal) are functions of their inputs and the time.
`cryptography` does the X.509 work; nothing here talks to the apiserver.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import ipaddress
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

__all__ = [
    "CLIENT_SIGNER",
    "CLIENT_USAGES",
    "SERVING_SIGNER",
    "SERVING_USAGES",
    "CertStore",
    "Issued",
    "NodeCertificateError",
    "csr_name",
    "new_key_pem",
    "node_csr_pem",
    "rotation_deadline",
]

CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
CLIENT_USAGES = ("digital signature", "client auth")
SERVING_SIGNER = "kubernetes.io/kubelet-serving"
SERVING_USAGES = ("digital signature", "server auth")
NODE_GROUP = "system:nodes"
# Renewal falls at a random point between these fractions of the certificate's lifetime
# (upstream's kubelet: 70-90%), so a fleet issued at once does not renew at once.
ROTATE_FROM, ROTATE_TO = 0.7, 0.9


class NodeCertificateError(Exception):
    """A certificate or key on disk, or one the signer issued, is not usable; the
    message names the file or the request."""


@dataclass(frozen=True)
class Issued:
    """A usable certificate and where it is."""

    path: Path
    subject: str  # RFC 4514, e.g. "O=system:nodes,CN=system:node:n1"
    not_before: datetime.datetime
    not_after: datetime.datetime
    written: datetime.datetime  # when its file was written (about when it was issued)

    def valid_at(self, now: datetime.datetime) -> bool:
        return self.not_before <= now < self.not_after

    @property
    def start(self) -> datetime.datetime:
        """Where its lifetime counts from for renewal: notBefore, or when it was written
        if later. The signer backdates notBefore by five minutes for clock skew; upstream
        counts from notBefore, which for a certificate issued for two minutes or less
        puts the renewal before its issue: renewed as soon as it arrives, again and
        again. For a certificate of days or more the two are the same."""
        return max(self.not_before, self.written)


def new_key_pem() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(pem: bytes, where: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except ValueError as err:
        raise NodeCertificateError(f"{where}: not a PEM private key: {err}") from err
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise NodeCertificateError(f"{where}: not an ECDSA private key")
    return key


def _load_any_key(pem: bytes, where: str) -> ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey:
    """An ECDSA key (klet's own requests) or an RSA key (a pair kubeadm issued and
    embedded in kubelet.conf, seeding the store); any other kind is refused by name."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except ValueError as err:
        raise NodeCertificateError(f"{where}: not a PEM private key: {err}") from err
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise NodeCertificateError(f"{where}: not an ECDSA or RSA private key")
    return key


def node_csr_pem(
    key_pem: bytes, node_name: str, *, dns_names: Sequence[str] = (), ips: Sequence[str] = ()
) -> bytes:
    """A PKCS#10 request for `CN=system:node:<node>, O=system:nodes`, signed by the key;
    with subject alternative names when given (a serving certificate's)."""
    key = _load_key(key_pem, "request key")
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, NODE_GROUP),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
        ]
    )
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dict.fromkeys(dns_names)]
    names += [x509.IPAddress(ipaddress.ip_address(i)) for i in dict.fromkeys(ips)]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def csr_name(csr_pem: bytes, *, prefix: str = "node-csr-") -> str:
    """A name fixed by the request's public key and subject: the same key asks under the
    same name, so a restart finds its earlier request (409 on create, then read it)."""
    request = x509.load_pem_x509_csr(csr_pem)
    public = request.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = hashlib.sha256(public + request.subject.public_bytes()).digest()
    return prefix + base64.urlsafe_b64encode(digest).decode().rstrip("=")[:40]


def rotation_deadline(
    start: datetime.datetime, not_after: datetime.datetime, *, jitter: float
) -> datetime.datetime:
    """When to renew: `jitter` (0..1) of the way between 70% and 90% of the lifetime
    from `start` (`Issued.start`) to expiry."""
    fraction = ROTATE_FROM + (ROTATE_TO - ROTATE_FROM) * min(max(jitter, 0.0), 1.0)
    return start + (not_after - start) * fraction


def random_jitter() -> float:
    return random.random()  # noqa: S311 - spreading renewals, not a secret


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class CertStore:
    """The client certificate files of one certificate directory."""

    def __init__(self, cert_dir: Path, *, prefix: str = "kubelet-client") -> None:
        self.cert_dir = cert_dir
        self.prefix = prefix

    @property
    def current_path(self) -> Path:
        return self.cert_dir / f"{self.prefix}-current.pem"

    @property
    def pending_key_path(self) -> Path:
        return self.cert_dir / f"{self.prefix}.key.tmp"

    def current(self) -> Issued | None:
        """The current certificate, None when there is none; NodeCertificateError when
        the file is there but unusable (its key does not match, not PEM)."""
        if not self.current_path.exists():
            return None
        return load_issued(self.current_path)

    def pending_key(self) -> bytes:
        """The key of the request in progress, made (and kept) when there is none."""
        path = self.pending_key_path
        if path.exists():
            pem = path.read_bytes()
            _load_key(pem, str(path))
            return pem
        self.cert_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = new_key_pem()
        _write_private(path, pem)
        return pem

    def install(self, key_pem: bytes, cert_pem: bytes, *, now: datetime.datetime) -> Issued:
        """Write the pair as a new dated file and point `-current.pem` at it; the key of
        the finished request is removed."""
        self.cert_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = now.strftime("%Y-%m-%d-%H-%M-%S")
        dated = self.cert_dir / f"{self.prefix}-{stamp}.pem"
        _write_private(dated, key_pem + cert_pem)
        issued = load_issued(dated)  # refuse a certificate that is not for the key
        link = self.cert_dir / f".{self.prefix}-current.{os.getpid()}.tmp"
        link.unlink(missing_ok=True)
        link.symlink_to(dated.name)
        os.replace(link, self.current_path)
        self.pending_key_path.unlink(missing_ok=True)
        return dataclasses.replace(issued, path=self.current_path)


def load_issued(path: Path) -> Issued:
    """A key-and-certificate PEM file; NodeCertificateError naming the file when it is
    not one, or when the certificate is not for the key."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise NodeCertificateError(f"{path}: {err.strerror or err}") from err
    key = _load_any_key(data, str(path))
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as err:
        raise NodeCertificateError(f"{path}: no PEM certificate: {err}") from err
    cert = certs[0]
    mine = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    theirs = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if mine != theirs:
        raise NodeCertificateError(f"{path}: the certificate is not for the private key in it")
    written = datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.UTC)
    return Issued(
        path=path,
        subject=cert.subject.rfc4514_string(),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        written=written,
    )


def issued_cert_pem(certificate_b64: str, where: str) -> bytes:
    """The PEM of a CSR's `status.certificate` (base64 in the API's JSON)."""
    try:
        pem = base64.b64decode(certificate_b64, validate=True)
        x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise NodeCertificateError(f"{where}: the issued certificate is not PEM: {err}") from err
    return pem
