"""TLS of the kubelet API without sockets (tlsconfig.py): the default TLS 1.2 suites
are the ECDHE AEAD set, tlsCipherSuites and tlsMinVersion still win; the self-generated
certificate is kept until `renew_before` its expiry and then regenerated, an operator's
certificate never; `ServingTLS` builds a new context when a watched file changes (and
only then, at most every check interval), and keeps the old one when the change does
not load."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from klet.status_reporter.kubeletapi.tlsconfig import (
    DEFAULT_CIPHERS,
    RENEW_BEFORE,
    ServingTLS,
    TLSSettings,
    ensure_serving_cert,
    needs_renewal,
    server_context,
)
from klet.testbed.pki import CertificateAuthority

NOW = datetime.datetime(2026, 11, 25, 6, 0, tzinfo=datetime.UTC)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    crt, key = ensure_serving_cert(
        cert_file="", key_file="", cert_dir=tmp_path / "pki", host="n1", ips=(), now=NOW
    )
    return crt, key


def tls12_suites(ctx: ssl.SSLContext) -> set[str]:
    return {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}


def test_default_suites_are_ecdhe_aead(pair: tuple[Path, Path]) -> None:
    crt, key = pair
    ctx = server_context(cert_file=crt, key_file=key, client_ca_file=None)
    assert tls12_suites(ctx) == set(DEFAULT_CIPHERS)
    assert all(("GCM" in c or "CHACHA20" in c) and c.startswith("ECDHE-") for c in DEFAULT_CIPHERS)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    chosen = server_context(
        cert_file=crt,
        key_file=key,
        client_ca_file=None,
        min_version="VersionTLS13",
        cipher_suites=("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",),
    )
    assert tls12_suites(chosen) == {"ECDHE-RSA-AES256-GCM-SHA384"}
    assert chosen.minimum_version == ssl.TLSVersion.TLSv1_3
    with pytest.raises(ValueError, match="tlsCipherSuites: unsupported suite"):
        server_context(
            cert_file=crt, key_file=key, client_ca_file=None, cipher_suites=("TLS_RSA_WITH_RC4",)
        )


def test_renewal_window() -> None:
    expires = NOW + datetime.timedelta(days=100)
    assert not needs_renewal(expires, NOW, RENEW_BEFORE)
    assert not needs_renewal(
        expires, expires - RENEW_BEFORE - datetime.timedelta(seconds=1), RENEW_BEFORE
    )
    assert needs_renewal(expires, expires - RENEW_BEFORE, RENEW_BEFORE)
    assert needs_renewal(None, NOW, RENEW_BEFORE)  # unreadable: make a new one


def test_self_generated_certificate_is_regenerated_near_expiry(pair: tuple[Path, Path]) -> None:
    crt, key = pair
    first = x509.load_pem_x509_certificates(crt.read_bytes())[0]
    assert first.not_valid_after_utc == NOW + datetime.timedelta(days=365)
    later = NOW + datetime.timedelta(days=300)
    ensure_serving_cert(
        cert_file="", key_file="", cert_dir=crt.parent, host="n1", ips=(), now=later
    )
    assert x509.load_pem_x509_certificates(crt.read_bytes())[0] == first
    due = first.not_valid_after_utc - datetime.timedelta(days=29)
    ensure_serving_cert(cert_file="", key_file="", cert_dir=crt.parent, host="n1", ips=(), now=due)
    renewed = x509.load_pem_x509_certificates(crt.read_bytes())[0]
    assert renewed.serial_number != first.serial_number
    assert renewed.not_valid_after_utc == due + datetime.timedelta(days=365)


def test_an_operators_certificate_is_never_regenerated(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca", "ca")
    pair = ca.issue("n1", server=True, name="serving")
    before = pair.cert.read_bytes()
    tls = ServingTLS(
        TLSSettings(cert_file=str(pair.cert), key_file=str(pair.key), check_interval_s=0),
        clock=lambda: NOW + datetime.timedelta(days=20 * 365),
    )
    tls.load()
    assert not tls._due()
    assert pair.cert.read_bytes() == before


async def test_reload_only_on_change_and_at_most_every_interval(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca", "ca")
    pair = ca.issue("n1", server=True, name="serving")
    mono = [0.0]
    tls = ServingTLS(
        TLSSettings(
            cert_file=str(pair.cert),
            key_file=str(pair.key),
            client_ca_file=ca.cert_path,
            check_interval_s=10,
        ),
        monotonic=lambda: mono[0],
    )
    first = tls.load()
    mono[0] = 20
    assert await tls.current() is first  # nothing changed
    ca.issue("n1", server=True, name="serving")
    mono[0] = 25
    assert await tls.current() is first  # changed, but checked 5 s ago
    mono[0] = 31
    second = await tls.current()
    assert second is not first
    ca.cert_path.write_bytes(ca.cert_pem + b"\n")  # the client CA file changed
    mono[0] = 50
    third = await tls.current()
    assert third is not second
    pair.key.write_bytes(b"garbage")  # a change that does not load
    mono[0] = 70
    assert await tls.current() is third
