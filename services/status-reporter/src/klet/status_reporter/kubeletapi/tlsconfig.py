"""TLS of the kubelet API: the serving certificate and the client-certificate request.

- Serving certificate: `tlsCertFile`/`tlsPrivateKeyFile` when set; otherwise, as
  upstream, `<certDir>/kubelet.crt` and `kubelet.key`, generated on first start and
  reused while readable and unexpired. Like upstream's self-signed pair it is a leaf
  signed by a throw-away CA `<node>-ca@<unix time>`, both in kubelet.crt (leaf first),
  so a client can pin the CA; SANs are the node name (DNS, or IP if it is one) and the
  node IPs, validity one year, key ECDSA P-256 (the key type upstream's rotation uses).
- Client certificates are requested, and verified against the client CA bundle
  (`authentication.x509.clientCAFile`), only when one is configured; they are
  optional, so token and anonymous requests still connect.
- `tlsMinVersion` (VersionTLS12, VersionTLS13; default 1.2) and `tlsCipherSuites`
  (upstream's Go names of the TLS 1.2 ECDHE AEAD suites, which map one to one onto
  OpenSSL's) are honoured; an unknown name is a ValueError naming the field.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_TLS_VERSIONS = {
    "": ssl.TLSVersion.TLSv1_2,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}
_CIPHERS = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
VALIDITY = datetime.timedelta(days=365)


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(n for n in names if n):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def generate_self_signed(host: str, ips: Sequence[str]) -> tuple[bytes, bytes]:
    """(PEM of leaf + CA certificate, PEM of the leaf's key) for `host` and `ips`."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{host}-ca@{int(time.time())}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{host}@{int(time.time())}")])
        )
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(_san([host, *ips]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certs = leaf.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(
        serialization.Encoding.PEM
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certs, key_pem


def _usable(cert_file: Path, key_file: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    return cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC)


def ensure_serving_cert(
    *, cert_file: str, key_file: str, cert_dir: Path, host: str, ips: Sequence[str]
) -> tuple[Path, Path]:
    """The serving certificate and key paths, generating the self-signed pair if needed."""
    if cert_file and key_file:
        return Path(cert_file), Path(key_file)
    crt, key = cert_dir / "kubelet.crt", cert_dir / "kubelet.key"
    if _usable(crt, key):
        return crt, key
    cert_dir.mkdir(parents=True, exist_ok=True)
    certs, key_pem = generate_self_signed(host, ips)
    _write(key, key_pem, 0o600)
    _write(crt, certs, 0o644)
    return crt, key


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def server_context(
    *,
    cert_file: Path,
    key_file: Path,
    client_ca_file: Path | None,
    min_version: str = "",
    cipher_suites: Sequence[str] = (),
) -> ssl.SSLContext:
    """The SSLContext of the kubelet API. Raises ValueError for a bad TLS setting and
    OSError/ssl.SSLError for unreadable certificate files."""
    if min_version not in _TLS_VERSIONS:
        raise ValueError(
            f"tlsMinVersion: unsupported value {min_version!r} "
            f"(one of {', '.join(k for k in _TLS_VERSIONS if k)})"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _TLS_VERSIONS[min_version]
    if cipher_suites:
        unknown = [c for c in cipher_suites if c not in _CIPHERS]
        if unknown:
            raise ValueError(f"tlsCipherSuites: unsupported suite(s) {', '.join(unknown)}")
        ctx.set_ciphers(":".join(dict.fromkeys(_CIPHERS[c] for c in cipher_suites)))
    ctx.load_cert_chain(str(cert_file), str(key_file))
    if client_ca_file is not None:
        ctx.load_verify_locations(cafile=str(client_ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
