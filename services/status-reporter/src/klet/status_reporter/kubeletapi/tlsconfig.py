"""TLS of the kubelet API: the serving certificate, the client-certificate request, the
cipher suites, and reloading all of it while the server runs.

- Serving certificate: with `serverTLSBootstrap`, `<certDir>/kubelet-server-current.pem`
  (key and certificate), which status-reporter's leader gets from the certificates API
  (klet.kube.rotation); until the first is issued every connection is refused, as
  upstream's listener has no certificate to offer. Else `tlsCertFile`/`tlsPrivateKeyFile`
  when set; otherwise, as
  upstream, `<certDir>/kubelet.crt` and `kubelet.key`, generated on first start and
  reused while readable and not about to expire. Like upstream's self-signed pair it is
  a leaf signed by a throw-away CA `<node>-ca@<unix time>`, both in kubelet.crt (leaf
  first), so a client can pin the CA; SANs are the node name (DNS, or IP if it is one)
  and the node IPs, validity one year, key ECDSA P-256 (the key type upstream's
  rotation uses).
- Client certificates are requested, and verified against the client CA bundle
  (`authentication.x509.clientCAFile`), only when one is configured; they are
  optional, so token and anonymous requests still connect.
- `tlsMinVersion` (VersionTLS12, VersionTLS13; default 1.2) and `tlsCipherSuites`
  (upstream's Go names of the TLS 1.2 ECDHE AEAD suites, which map one to one onto
  OpenSSL's) are honoured; an unknown name is a ValueError naming the field. Without
  `tlsCipherSuites`, TLS 1.2 offers only the ECDHE AEAD suites (AES-GCM and
  ChaCha20-Poly1305, forward secret): Python's default list still admits CBC suites
  and finite-field DHE, which the CIS kubelet benchmark (4.2.13) asks to leave out.
  TLS 1.3 suites are OpenSSL's, all AEAD.
- `ServingTLS` keeps the current SSLContext for the listener, which takes it for every
  new handshake. At most every `check_interval_s` it compares the certificate, key and
  client CA files with what it loaded (device, inode, mtime, size: a file replaced by
  rename or rewritten in place both show) and builds a new context when one changed, so
  a rotated certificate or CA bundle is served without a restart; established
  connections keep the context they shook hands with. A change that does not load (a
  key written before its certificate, mid-rotation) keeps the old context, is logged
  once, and is retried at the next check. The pair klet generated itself (no
  tlsCertFile) is regenerated `renew_before` ahead of its expiry.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from klet.obs import OnceLogger

log = logging.getLogger(__name__)

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
DEFAULT_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
)
"""The TLS 1.2 suites offered when tlsCipherSuites is not set: ECDHE key exchange with
an AEAD cipher, nothing else."""
VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)
"""A self-generated certificate is replaced this long before it expires."""

Clock = Callable[[], datetime.datetime]


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(n for n in names if n):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def generate_self_signed(
    host: str,
    ips: Sequence[str],
    *,
    now: datetime.datetime | None = None,
    validity: datetime.timedelta = VALIDITY,
) -> tuple[bytes, bytes]:
    """(PEM of leaf + CA certificate, PEM of the leaf's key) for `host` and `ips`, valid
    from `now` (default: the wall clock) for `validity`."""
    now = now if now is not None else _utcnow()
    stamp = int(now.timestamp())
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{host}-ca@{stamp}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + validity)
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
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{host}@{stamp}")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + validity)
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


def not_after(cert_file: Path) -> datetime.datetime | None:
    """The expiry of the first certificate in `cert_file`, None when it does not load."""
    try:
        return x509.load_pem_x509_certificate(cert_file.read_bytes()).not_valid_after_utc
    except (OSError, ValueError, TypeError):
        return None


def needs_renewal(
    expires: datetime.datetime | None, now: datetime.datetime, renew_before: datetime.timedelta
) -> bool:
    """Whether a self-generated certificate expiring at `expires` must be replaced."""
    return expires is None or now >= expires - renew_before


def _usable(
    cert_file: Path, key_file: Path, now: datetime.datetime, renew: datetime.timedelta
) -> bool:
    try:
        serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    return not needs_renewal(not_after(cert_file), now, renew)


def ensure_serving_cert(
    *,
    cert_file: str,
    key_file: str,
    cert_dir: Path,
    host: str,
    ips: Sequence[str],
    now: datetime.datetime | None = None,
    renew_before: datetime.timedelta = RENEW_BEFORE,
) -> tuple[Path, Path]:
    """The serving certificate and key paths, generating the self-signed pair when there
    is none, it does not load, or it expires within `renew_before` of `now`."""
    if cert_file and key_file:
        return Path(cert_file), Path(key_file)
    now = now if now is not None else _utcnow()
    crt, key = cert_dir / "kubelet.crt", cert_dir / "kubelet.key"
    if _usable(crt, key, now, renew_before):
        return crt, key
    cert_dir.mkdir(parents=True, exist_ok=True)
    certs, key_pem = generate_self_signed(host, ips, now=now)
    log.info(
        "generated a self-signed serving certificate",
        extra={"certificate": str(crt), "not_after": (now + VALIDITY).isoformat()},
    )
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
    else:
        ctx.set_ciphers(":".join(DEFAULT_CIPHERS))
    ctx.load_cert_chain(str(cert_file), str(key_file))
    if client_ca_file is not None:
        ctx.load_verify_locations(cafile=str(client_ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


@dataclass(frozen=True)
class TLSSettings:
    """What `ServingTLS` builds its contexts from (KubeletConfiguration names)."""

    cert_file: str = ""
    """[tlsCertFile]; "" = the self-generated pair in cert_dir."""
    key_file: str = ""
    """[tlsPrivateKeyFile]."""
    cert_dir: Path = Path("/var/lib/kubelet/pki")
    host: str = ""
    """The node name, SAN of the self-generated certificate."""
    ips: tuple[str, ...] = ()
    client_ca_file: Path | None = None
    min_version: str = ""
    cipher_suites: tuple[str, ...] = ()
    check_interval_s: float = 10.0
    """How often, at most, the files are looked at again (on a new connection)."""
    renew_before: datetime.timedelta = RENEW_BEFORE
    issued_by_api: bool = False
    """[serverTLSBootstrap]: `cert_file` (key and certificate in one file) comes from a
    CSR (klet.kube.rotation); until it exists there is nothing to serve with."""


_Stamp = tuple[tuple[int, int, int, int] | None, ...]


def _stamp(paths: Sequence[Path]) -> _Stamp:
    out: list[tuple[int, int, int, int] | None] = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            out.append(None)
            continue
        out.append((st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class ServingTLS:
    """The listener's current SSLContext, rebuilt when its files change (module
    docstring). `load()` once at start (raises like `server_context`), then
    `await current()` per connection."""

    def __init__(
        self,
        settings: TLSSettings,
        *,
        clock: Clock = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._monotonic = monotonic
        self._context: ssl.SSLContext | None = None
        self._files: tuple[Path, ...] = ()
        self._stamp: _Stamp = ()
        self._expires: datetime.datetime | None = None
        self._checked = 0.0
        self._lock = asyncio.Lock()
        self._once = OnceLogger(log, level=logging.WARNING)

    @property
    def self_signed(self) -> bool:
        return not (self.settings.cert_file and self.settings.key_file)

    @property
    def cert_path(self) -> Path | None:
        return self._files[0] if self._files else None

    def load(self) -> ssl.SSLContext:
        """(Re)build the context from the files, generating or renewing the self-signed
        pair first when klet owns it. Raises OSError, ssl.SSLError, ValueError."""
        s = self.settings
        cert, key = ensure_serving_cert(
            cert_file=s.cert_file,
            key_file=s.key_file,
            cert_dir=s.cert_dir,
            host=s.host,
            ips=s.ips,
            now=self._clock(),
            renew_before=s.renew_before,
        )
        files = (cert, key, *([s.client_ca_file] if s.client_ca_file is not None else []))
        stamp = _stamp(files)
        context = server_context(
            cert_file=cert,
            key_file=key,
            client_ca_file=s.client_ca_file,
            min_version=s.min_version,
            cipher_suites=s.cipher_suites,
        )
        self._files, self._stamp, self._context = files, stamp, context
        self._expires = not_after(cert) if self.self_signed else None
        self._checked = self._monotonic()
        return context

    def _due(self) -> bool:
        if self._stamp != _stamp(self._files):
            return True
        return (
            self.self_signed
            and not self.settings.issued_by_api
            and needs_renewal(self._expires, self._clock(), self.settings.renew_before)
        )

    def load_at_start(self) -> None:
        """`load`, except that a certificate still to be issued by the certificates API
        (`issued_by_api`) is waited for: no context yet, each connection refused."""
        if self.settings.issued_by_api and not Path(self.settings.cert_file).exists():
            log.warning(
                "kubelet API: no serving certificate yet, connections are refused until "
                "the node's kubelet-serving certificate signing request is approved and "
                "issued (serverTLSBootstrap)",
                extra={"certificate": self.settings.cert_file},
            )
            return
        self.load()

    async def current(self) -> ssl.SSLContext:
        """The context for a new handshake, reloaded first when a file changed or the
        self-generated certificate is due. FileNotFoundError while a certificate from
        the certificates API is still to come (the connection is refused)."""
        if self._context is None:
            cert = self.settings.cert_file
            if self.settings.issued_by_api and not await asyncio.to_thread(os.path.exists, cert):
                raise FileNotFoundError(
                    f"no serving certificate yet at {self.settings.cert_file} "
                    "(serverTLSBootstrap: waiting for its CSR to be approved)"
                )
            await asyncio.to_thread(self.load)
            log.info(
                "kubelet API: serving certificate loaded",
                extra={"files": [str(f) for f in self._files]},
            )
        elif self._monotonic() - self._checked >= self.settings.check_interval_s:
            async with self._lock:
                if self._monotonic() - self._checked >= self.settings.check_interval_s:
                    await self._reload()
        assert self._context is not None
        return self._context

    async def _reload(self) -> None:
        self._checked = self._monotonic()
        if not self._due():
            return
        try:
            await asyncio.to_thread(self.load)
        except (OSError, ssl.SSLError, ValueError) as err:
            self._once.error(
                "reload",
                f"kubelet API: keeping the previous TLS certificate, the changed files "
                f"do not load: {err}",
                files=[str(f) for f in self._files],
            )
            return
        self._once.clear("reload")
        log.info(
            "kubelet API: serving the reloaded TLS files",
            extra={"files": [str(f) for f in self._files]},
        )
