"""rotateCertificates with a kubeconfig embedding its client certificate (kubeadm's
kubelet.conf): the store is seeded from the embedded pair when it has no valid current
one (klet.kube.rotation.seed_decision, seed_store), check_rotatable accepts it, and the
apiserver client presents the store's file (klet.kube.client, klet.kube.settings)."""

from __future__ import annotations

import asyncio
import base64
import datetime
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from klet.kube.certificates import CertStore, Issued
from klet.kube.client import KubeClient
from klet.kube.rotation import RotationRefused, check_rotatable, seed_decision, seed_store
from klet.kube.settings import KubeSettings

UTC = datetime.UTC
NOW = datetime.datetime.now(UTC).replace(microsecond=0)
HOUR = datetime.timedelta(hours=1)


def pair(cn: str, not_after: datetime.datetime, *, kind: str = "rsa") -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM), self-signed, RSA as kubeadm issues them."""
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if kind == "rsa"
        else ec.generate_private_key(ec.SECP256R1())
    )
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - 2 * HOUR)
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def embedding_kubeconfig(tmp_path: Path, key_pem: bytes, cert_pem: bytes) -> Path:
    path = tmp_path / "kubelet.conf"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://h:6443"}}],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "client-certificate-data": base64.b64encode(cert_pem).decode(),
                            "client-key-data": base64.b64encode(key_pem).decode(),
                        },
                    }
                ],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def issued(not_after: datetime.datetime) -> Issued:
    return Issued(
        path=Path("/pki/kubelet-client-current.pem"),
        subject="CN=system:node:n1",
        not_before=NOW - 2 * HOUR,
        not_after=not_after,
        written=NOW - 2 * HOUR,
    )


def test_seed_decision_keeps_a_valid_store_and_seeds_otherwise() -> None:
    assert seed_decision(issued(NOW + HOUR), None, NOW + HOUR, NOW) is False
    assert seed_decision(None, None, NOW + HOUR, NOW) is True
    assert seed_decision(issued(NOW - HOUR), None, NOW + HOUR, NOW) is True
    assert seed_decision(None, "key does not match", NOW + HOUR, NOW) is True
    with pytest.raises(RotationRefused, match="embedded one expired.*current one: none"):
        seed_decision(None, None, NOW - HOUR, NOW)
    with pytest.raises(RotationRefused, match="current one: expired"):
        seed_decision(issued(NOW - HOUR), None, NOW - HOUR, NOW)


def test_an_empty_store_is_seeded_from_the_embedded_rsa_pair(tmp_path: Path) -> None:
    key_pem, cert_pem = pair("system:node:n1", NOW + HOUR)
    kubeconfig = embedding_kubeconfig(tmp_path, key_pem, cert_pem)
    cert_dir = tmp_path / "pki"
    check_rotatable(kubeconfig, cert_dir)  # embedded: accepted
    seeded = asyncio.run(seed_store(kubeconfig, cert_dir, now=lambda: NOW))
    assert seeded is not None and seeded.subject == "CN=system:node:n1,O=system:nodes"
    store = CertStore(cert_dir)
    current = store.current()
    assert current is not None and current.not_after == seeded.not_after
    assert cert_pem in store.current_path.read_bytes()
    # Seeded once: a second start keeps the store's pair.
    assert asyncio.run(seed_store(kubeconfig, cert_dir, now=lambda: NOW)) is None


def test_a_valid_store_is_kept_and_an_expired_one_replaced(tmp_path: Path) -> None:
    cert_dir = tmp_path / "pki"
    store = CertStore(cert_dir)
    renewed_key, renewed_cert = pair("system:node:n1", NOW + 3 * HOUR, kind="ec")
    store.install(renewed_key, renewed_cert, now=NOW - HOUR)
    key_pem, cert_pem = pair("system:node:n1", NOW + HOUR)
    kubeconfig = embedding_kubeconfig(tmp_path, key_pem, cert_pem)
    assert asyncio.run(seed_store(kubeconfig, cert_dir, now=lambda: NOW)) is None
    assert renewed_cert in store.current_path.read_bytes()
    # Later, with the store's certificate expired (the node was off), the embedded pair
    # (still valid) seeds it again.
    later = NOW + 3 * HOUR + datetime.timedelta(minutes=1)
    key2, cert2 = pair("system:node:n1", later + HOUR)
    kubeconfig = embedding_kubeconfig(tmp_path, key2, cert2)
    seeded = asyncio.run(seed_store(kubeconfig, cert_dir, now=lambda: later))
    assert seeded is not None and cert2 in store.current_path.read_bytes()


def test_an_unusable_embedded_pair_is_named(tmp_path: Path) -> None:
    key_pem, _ = pair("system:node:n1", NOW + HOUR)
    _, other_cert = pair("system:node:n1", NOW + HOUR)
    kubeconfig = embedding_kubeconfig(tmp_path, key_pem, other_cert)
    with pytest.raises(RotationRefused, match="the embedded pair: .*not for the private key"):
        asyncio.run(seed_store(kubeconfig, tmp_path / "pki", now=lambda: NOW))
    expired_key, expired_cert = pair("system:node:n1", NOW - HOUR)
    kubeconfig = embedding_kubeconfig(tmp_path, expired_key, expired_cert)
    with pytest.raises(RotationRefused, match="no usable client certificate"):
        asyncio.run(seed_store(kubeconfig, tmp_path / "pki2", now=lambda: NOW))


def test_the_client_presents_the_store_instead_of_the_embedded_pair(tmp_path: Path) -> None:
    key_pem, cert_pem = pair("system:node:n1", NOW + HOUR)
    kubeconfig = embedding_kubeconfig(tmp_path, key_pem, cert_pem)
    store = tmp_path / "pki" / "kubelet-client-current.pem"
    rotated = KubeClient(KubeSettings(kubeconfig=kubeconfig, rotated_certificate=store))
    assert rotated._configuration.cert_file == str(store)
    assert rotated._configuration.key_file == str(store)
    plain = KubeClient(KubeSettings(kubeconfig=kubeconfig))
    embedded = plain._configuration.cert_file
    assert embedded is not None and embedded != str(store)
    assert Path(embedded).read_bytes() == cert_pem
