"""A small certificate authority for the test control plane.

The cluster tests need what a kubeadm cluster has in /etc/kubernetes/pki: a CA that the
apiserver trusts for client certificates (admin, nodes, the apiserver's own kubelet
client) and that signs serving certificates (the apiserver's, klet's 10250 API). This
module issues them with ``cryptography``; it is for tests and the dev stack only, so keys
are EC P-256 (fast to generate, accepted everywhere Kubernetes takes a key), certificates
live a year and nothing is revoked.

Files are PEM; private keys are written 0600 before any byte of them reaches disk.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
DEFAULT_VALIDITY = datetime.timedelta(days=365)
# Issued certificates start this far in the past, so a peer whose clock lags a little
# does not reject a certificate made a moment ago.
BACKDATE = datetime.timedelta(hours=1)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class CertPair(NamedTuple):
    """Paths of a PEM certificate and its PEM private key."""

    cert: Path
    key: Path


def new_private_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write ``key`` as unencrypted PKCS#8 PEM, mode 0600 (also when ``path`` existed)."""
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def load_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: not an EC private key")
    return key


def write_key_pair(private_path: Path, public_path: Path) -> CertPair:
    """A fresh key pair as PEM files (the apiserver's service-account signing keys).

    Returns ``(public_path, private_path)`` as a CertPair (``cert`` is the public key).
    """
    key = new_private_key()
    write_private_key(private_path, key)
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return CertPair(public_path, private_path)


def file_stem(common_name: str) -> str:
    """A file name for a certificate from its subject: ``system:node:n1`` -> ``system-node-n1``."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", common_name).strip("-.")
    return stem or "cert"


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class CertificateAuthority:
    """A CA whose certificate and key live in ``dir`` (``ca.crt``, ``ca.key``).

    ``create`` makes a new one, ``load`` opens an existing directory. ``issue`` writes a
    leaf certificate and key next to them.
    """

    def __init__(self, dir: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.dir = dir
        self.certificate = cert
        self._key = key

    @property
    def cert_path(self) -> Path:
        return self.dir / CA_CERT_FILE

    @property
    def key_path(self) -> Path:
        return self.dir / CA_KEY_FILE

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def create(
        cls, dir: Path, name: str, *, validity: datetime.timedelta = DEFAULT_VALIDITY * 10
    ) -> CertificateAuthority:
        """A new self-signed CA named ``name`` (its CN), written to ``dir``."""
        dir.mkdir(parents=True, exist_ok=True)
        key = new_private_key()
        subject = _name(name)
        now = _now()
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256())
        )
        write_private_key(dir / CA_KEY_FILE, key)
        (dir / CA_CERT_FILE).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(dir, cert, key)

    @classmethod
    def load(cls, dir: Path) -> CertificateAuthority:
        """The CA previously created in ``dir``."""
        cert = x509.load_pem_x509_certificate((dir / CA_CERT_FILE).read_bytes())
        return cls(dir, cert, load_private_key(dir / CA_KEY_FILE))

    @classmethod
    def open(cls, dir: Path, name: str) -> CertificateAuthority:
        """``load`` if ``dir`` holds a CA, else ``create`` one."""
        if (dir / CA_CERT_FILE).exists() and (dir / CA_KEY_FILE).exists():
            return cls.load(dir)
        return cls.create(dir, name)

    def issue(
        self,
        common_name: str,
        organizations: Sequence[str] = (),
        *,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str | IPAddress] = (),
        client: bool = False,
        server: bool = False,
        name: str | None = None,
        validity: datetime.timedelta = DEFAULT_VALIDITY,
    ) -> CertPair:
        """Issue a certificate for ``CN=common_name, O=organizations`` signed by this CA.

        ``client``/``server`` select the extended key usages (at least one is required);
        ``dns_names`` and ``ip_addresses`` become the subject alternative names. The
        files are ``<name>.crt`` and ``<name>.key`` in the CA's directory, ``name``
        defaulting to a file-safe form of the common name; existing files are replaced.
        """
        if not (client or server):
            raise ValueError("a certificate needs client=True, server=True or both")
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        key = new_private_key()
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(min(now + validity, self.certificate.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())

        stem = name or file_stem(common_name)
        pair = CertPair(self.dir / f"{stem}.crt", self.dir / f"{stem}.key")
        write_private_key(pair.key, key)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair
