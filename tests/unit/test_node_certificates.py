"""The node's client certificate: the files (klet.kube.certificates), TLS bootstrap and
the CSR flow (klet.kube.bootstrap), and rotation (klet.kube.rotation), against a fake
certificates API that signs with a real CA key (`FakeSigner`)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import math
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from klet.kube import Conflict, Forbidden, NotFound, Unavailable
from klet.kube.bootstrap import (
    BootstrapError,
    BootstrapSettings,
    CertificateRequestFailed,
    ensure_client_certificate,
    kubeconfig_client_certificate,
    request_certificate,
)
from klet.kube.certificates import (
    CertStore,
    NodeCertificateError,
    csr_name,
    new_key_pem,
    node_csr_pem,
    rotation_deadline,
)
from klet.kube.rotation import (
    CertificateRotation,
    RotationRefused,
    check_rotatable,
    serving_kind,
)
from klet.model.types import JSON

UTC = datetime.UTC
# Now: the renewal counts from when a certificate's file was written (its mtime).
T0 = datetime.datetime.now(UTC).replace(microsecond=0)
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


class FakeSigner:
    """The certificates API as the approver and signer answer: a created CSR is approved
    and issued at once (`mode` "issue"), left pending ("pending"), or denied ("deny");
    `fail` raises an error on create."""

    def __init__(self, *, ttl: datetime.timedelta = datetime.timedelta(hours=1)) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-ca")])
        self.ttl = ttl
        self.mode = "issue"
        self.fail: Exception | None = None
        self.csrs: dict[str, JSON] = {}
        self.created: list[str] = []
        self.now = T0

    def _sign(self, request_b64: str) -> str:
        csr = x509.load_pem_x509_csr(base64.b64decode(request_b64))
        cert = (
            x509.CertificateBuilder()
            .subject_name(csr.subject)
            .issuer_name(self.name)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - datetime.timedelta(minutes=5))
            .not_valid_after(self.now + self.ttl)
            .sign(self.key, hashes.SHA256())
        )
        return base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode()

    def _settle(self, csr: JSON) -> JSON:
        denied = any(c["type"] == "Denied" for c in csr["status"].get("conditions") or [])
        if denied:
            return csr  # for ever
        if self.mode == "issue" and not csr["status"].get("certificate"):
            csr["status"] = {
                "conditions": [{"type": "Approved", "status": "True"}],
                "certificate": self._sign(csr["spec"]["request"]),
            }
        elif self.mode == "deny":
            csr["status"] = {
                "conditions": [
                    {"type": "Denied", "status": "True", "reason": "Nope", "message": "not you"}
                ]
            }
        return csr

    async def create(self, path: str, body: JSON) -> Any:
        assert path == CSRS
        if self.fail is not None:
            raise self.fail
        name = body["metadata"]["name"]
        if name in self.csrs:
            raise Conflict("exists", status=409)
        assert body["spec"]["signerName"] in (
            "kubernetes.io/kube-apiserver-client-kubelet",
            "kubernetes.io/kubelet-serving",
        )
        self.created.append(name)
        self.csrs[name] = {**body, "status": {}}
        return self._settle(self.csrs[name])

    async def get(self, path: str, **params: Any) -> Any:
        name = path.rsplit("/", 1)[1]
        if name not in self.csrs:
            raise NotFound(name, status=404)
        return self._settle(self.csrs[name])


def subject_of(store: CertStore) -> str:
    issued = store.current()
    assert issued is not None
    return issued.subject


def bootstrap_kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "bootstrap.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": "https://h:6443", "certificate-authority": "ca.crt"},
                    }
                ],
                "users": [{"name": "b", "user": {"token": "abcdef.0123456789abcdef"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "b"}}],
                "current-context": "x",
            }
        )
    )
    return path


def settings(tmp_path: Path) -> BootstrapSettings:
    return BootstrapSettings(
        kubeconfig=tmp_path / "node" / "kubelet.conf",
        bootstrap_kubeconfig=bootstrap_kubeconfig(tmp_path),
        cert_dir=tmp_path / "pki",
        node_name="n1",
        wait_s=5.0,
        poll_s=0.01,
    )


def test_rotation_deadline_and_where_the_lifetime_starts(tmp_path: Path) -> None:
    start, end = T0, T0 + datetime.timedelta(hours=10)
    assert rotation_deadline(start, end, jitter=0.0) == T0 + datetime.timedelta(hours=7)
    assert rotation_deadline(start, end, jitter=1.0) == T0 + datetime.timedelta(hours=9)
    assert rotation_deadline(start, end, jitter=7.0) == T0 + datetime.timedelta(hours=9)


def test_store_keeps_a_pending_key_and_installs_atomically(tmp_path: Path) -> None:
    store = CertStore(tmp_path / "pki")
    key = store.pending_key()
    assert store.pending_key() == key  # kept across restarts: the same request
    assert stat.S_IMODE(store.pending_key_path.stat().st_mode) == 0o600
    signer = FakeSigner()
    cert = base64.b64decode(signer._sign(base64.b64encode(node_csr_pem(key, "n1")).decode()))
    issued = store.install(key, cert, now=T0)
    assert issued.path == store.current_path and store.current_path.is_symlink()
    assert os.readlink(store.current_path) == f"kubelet-client-{T0:%Y-%m-%d-%H-%M-%S}.pem"
    assert stat.S_IMODE((store.cert_dir / os.readlink(store.current_path)).stat().st_mode) == 0o600
    assert issued.subject == "CN=system:node:n1,O=system:nodes"
    assert not store.pending_key_path.exists()
    # the signer backdates notBefore by five minutes; renewal counts from the issue
    assert issued.not_before == T0 - datetime.timedelta(minutes=5)
    assert issued.start == issued.written >= T0 > issued.not_before
    with pytest.raises(NodeCertificateError, match="not for the private key"):
        store.install(new_key_pem(), cert, now=T0 + datetime.timedelta(seconds=1))


def test_csr_name_follows_the_key() -> None:
    key = new_key_pem()
    assert csr_name(node_csr_pem(key, "n1")) == csr_name(node_csr_pem(key, "n1"))
    assert csr_name(node_csr_pem(key, "n1")) != csr_name(node_csr_pem(new_key_pem(), "n1"))
    assert csr_name(node_csr_pem(key, "n1")).startswith("node-csr-")


async def test_bootstrap_requests_installs_and_writes_the_kubeconfig(tmp_path: Path) -> None:
    s, signer = settings(tmp_path), FakeSigner()
    await ensure_client_certificate(s, lambda path: signer)
    store = CertStore(s.cert_dir)
    assert subject_of(store) == "CN=system:node:n1,O=system:nodes"
    assert kubeconfig_client_certificate(s.kubeconfig) == store.current_path
    config = yaml.safe_load(s.kubeconfig.read_text())
    assert config["clusters"][0]["cluster"] == {
        "server": "https://h:6443",
        "certificate-authority": str(tmp_path / "ca.crt"),  # made absolute
    }
    check_rotatable(s.kubeconfig, s.cert_dir)
    # used as it is while valid: nothing asked again
    await ensure_client_certificate(s, lambda path: signer)
    assert len(signer.created) == 1
    # a lost kubeconfig is written again for the current certificate, nothing asked
    s.kubeconfig.unlink()
    await ensure_client_certificate(s, lambda path: signer)
    assert len(signer.created) == 1 and s.kubeconfig.exists()


async def test_an_expired_kubeconfig_is_bootstrapped_again(tmp_path: Path) -> None:
    s, signer = settings(tmp_path), FakeSigner()
    await ensure_client_certificate(s, lambda path: signer)
    later = T0 + datetime.timedelta(hours=2)  # past the hour the signer gave
    signer.now = later
    await ensure_client_certificate(s, lambda path: signer, now=lambda: later)
    assert len(signer.created) == 2


async def test_a_restart_while_waiting_finds_its_own_request(tmp_path: Path) -> None:
    s, signer = dataclasses.replace(settings(tmp_path), wait_s=0.2), FakeSigner()
    signer.mode = "pending"
    with pytest.raises(
        CertificateRequestFailed, match=r"not issued within 0s \(not approved yet\)"
    ):
        await ensure_client_certificate(s, lambda path: signer)
    signer.mode = "issue"
    await ensure_client_certificate(s, lambda path: signer)  # 409 on create, then read
    assert len(signer.created) == 1
    assert subject_of(CertStore(s.cert_dir)) == "CN=system:node:n1,O=system:nodes"


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (Forbidden("401", status=401), r"refused its credentials \(401 Unauthorized\): the token"),
        (Forbidden("403", status=403), r"refused to let it create a CertificateSigningRequest"),
    ],
)
async def test_refused_credentials_are_named(tmp_path: Path, error: Exception, text: str) -> None:
    s, signer = settings(tmp_path), FakeSigner()
    signer.fail = error
    with pytest.raises(BootstrapError, match=text) as info:
        await ensure_client_certificate(s, lambda path: signer)
    assert str(s.bootstrap_kubeconfig) in str(info.value)
    assert not s.kubeconfig.exists()


async def test_a_denied_request_names_its_reason(tmp_path: Path) -> None:
    signer = FakeSigner()
    signer.mode = "deny"
    csr = node_csr_pem(new_key_pem(), "n1")
    with pytest.raises(CertificateRequestFailed, match="was denied: Nope: not you"):
        await request_certificate(signer, csr_pem=csr, name=csr_name(csr), wait_s=1)


async def test_a_denied_bootstrap_asks_anew_with_another_key(tmp_path: Path) -> None:
    s, signer = settings(tmp_path), FakeSigner()
    signer.mode = "deny"
    with pytest.raises(CertificateRequestFailed, match="denied"):
        await ensure_client_certificate(s, lambda path: signer)
    assert not CertStore(s.cert_dir).pending_key_path.exists()
    signer.mode = "issue"
    await ensure_client_certificate(s, lambda path: signer)
    assert len(signer.created) == 2 and s.kubeconfig.exists()


async def test_an_unavailable_apiserver_is_waited_out(tmp_path: Path) -> None:
    signer = FakeSigner()
    real_create = signer.create
    calls = 0

    async def flaky(path: str, body: JSON) -> Any:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise Unavailable("connection refused")
        return await real_create(path, body)

    signer.create = flaky  # type: ignore[method-assign]
    csr = node_csr_pem(new_key_pem(), "n1")
    pem = await request_certificate(signer, csr_pem=csr, name="c1", wait_s=5, poll_s=0.01)
    assert b"BEGIN CERTIFICATE" in pem and calls == 3


async def test_rotation_renews_when_due_and_keeps_the_old_one_on_failure(tmp_path: Path) -> None:
    s, signer = settings(tmp_path), FakeSigner()
    await ensure_client_certificate(s, lambda path: signer)
    store = CertStore(s.cert_dir)
    first = store.current()
    assert first is not None
    clock = [first.start]
    failures: list[None] = []
    lived: list[float] = []
    rotation = CertificateRotation(
        store=store,
        api=signer,
        node_name="n1",
        poll_s=0.01,
        wait_s=1,
        now=lambda: clock[0],
        jitter=lambda: 0.5,
        on_renew_failed=lambda: failures.append(None),
        on_rotated=lived.append,
    )
    wait = await rotation.run_once()
    assert 0 < wait <= 60  # not due: looks again within a minute
    due = rotation.deadline(first)
    assert due == first.start + (first.not_after - first.start) * 0.8
    clock[0] = due
    signer.mode = "deny"
    assert await rotation.run_once() == rotation.retry_s
    assert store.current() == first  # the old one stays in use
    assert len(failures) == 1  # told, for kubelet_*_expiration_renew_errors
    assert lived == []  # nothing replaced yet
    signer.mode = "issue"
    signer.now = due
    await asyncio.sleep(0.01)  # a new file gets a later mtime
    assert await rotation.run_once() == 0.0
    second = store.current()
    assert second is not None and second.not_after > first.not_after
    assert second.subject == first.subject
    # told how long the replaced one lived, from its notBefore (the rotation histogram)
    assert lived == [(due - first.not_before).total_seconds()]
    assert len(signer.created) == 3  # bootstrap, denied renewal, renewal (new key each)


def test_rotation_is_refused_for_a_kubeconfig_it_could_not_update(tmp_path: Path) -> None:
    s = settings(tmp_path)
    s.kubeconfig.parent.mkdir(parents=True)
    s.kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://h"}}],
                "users": [
                    {
                        "name": "u",
                        "user": {"client-certificate": "/elsewhere/c.pem", "client-key": "k"},
                    },
                    {"name": "t", "user": {"token": "abc"}},
                ],
                "contexts": [
                    {"name": "x", "context": {"cluster": "c", "user": "u"}},
                    {"name": "y", "context": {"cluster": "c", "user": "t"}},
                ],
                "current-context": "x",
            }
        )
    )
    with pytest.raises(RotationRefused, match="must name .*kubelet-client-current.pem.*c.pem"):
        check_rotatable(s.kubeconfig, s.cert_dir)
    config = yaml.safe_load(s.kubeconfig.read_text())
    config["current-context"] = "y"
    s.kubeconfig.write_text(yaml.safe_dump(config))
    with pytest.raises(RotationRefused, match="not a token or no client certificate"):
        check_rotatable(s.kubeconfig, s.cert_dir)


async def test_the_serving_certificate_is_asked_for_at_start_with_the_node_names(
    tmp_path: Path,
) -> None:
    signer = FakeSigner()
    signer.mode = "pending"  # no built-in approver passes kubelet-serving requests
    kind = serving_kind("n1", ["10.0.0.21", "fd00::21", "10.0.0.21"])
    assert (kind.dns_names, kind.ips) == (("n1",), ("10.0.0.21", "fd00::21"))
    assert serving_kind("10.0.0.9", ["10.0.0.21"]).dns_names == ()
    store = CertStore(tmp_path / "pki", prefix=kind.prefix)
    rotation = CertificateRotation(
        store=store, api=signer, node_name="n1", kind=kind, wait_s=0.05, poll_s=0.01
    )
    assert await rotation.run_once() == rotation.retry_s  # asked, not issued yet
    [name] = signer.created
    body = signer.csrs[name]
    assert name.startswith("csr-serving-")
    assert body["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
    assert body["spec"]["usages"] == ["digital signature", "server auth"]
    csr = x509.load_pem_x509_csr(base64.b64decode(body["spec"]["request"]))
    sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["n1"]
    assert [str(i) for i in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.21", "fd00::21"]
    signer.mode = "issue"  # an operator approves it
    assert await rotation.run_once() == 0.0
    assert signer.created == [name]  # the same request, found again
    issued = store.current()
    assert issued is not None and store.current_path.name == "kubelet-server-current.pem"
    assert issued.subject == "CN=system:node:n1,O=system:nodes"


@pytest.mark.parametrize(
    ("extra", "flags", "problem"),
    [
        ({}, [], "serverTLSBootstrap: needs --kubeconfig"),
        ({"tlsCertFile": "/c.crt"}, ["--kubeconfig", "/k"], "would not be used: set one"),
        ({}, ["--bootstrap-kubeconfig", "/b"], "needs --kubeconfig: the path"),
    ],
)
def test_certificate_settings_that_cannot_work_are_refused(
    tmp_path: Path, extra: dict[str, Any], flags: list[str], problem: str
) -> None:
    from klet.config import ConfigError, load_settings

    file = tmp_path / "kubelet.yaml"
    body = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "serverTLSBootstrap": "--bootstrap-kubeconfig" not in flags,
        **extra,
    }
    file.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError) as info:
        load_settings(
            ["--config", str(file), *flags], env={}, service="status-reporter", hostname="n"
        )
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_certificate_ttl_gauges_and_renewal_error_counters_are_upstreams() -> None:
    from klet.status_reporter.metrics.instruments import CertificateMetrics
    from prometheus_client import CollectorRegistry, generate_latest

    registry, now = CollectorRegistry(), [1000.0]
    metrics = CertificateMetrics(registry, clock=lambda: now[0])
    client_ttl = "kubelet_certificate_manager_client_ttl_seconds"
    server_ttl = "kubelet_certificate_manager_server_ttl_seconds"
    rotation_count = "kubelet_certificate_manager_server_rotation_seconds_count"
    assert registry.get_sample_value(client_ttl) is None  # not rotated: not served
    assert registry.get_sample_value(rotation_count) is None
    metrics.rotating("client")
    metrics.rotating("server")
    # rotated but none read yet (a serving certificate not issued): +Inf, as upstream's
    assert registry.get_sample_value(client_ttl) == math.inf
    assert registry.get_sample_value(server_ttl) == math.inf
    assert registry.get_sample_value(rotation_count) == 0
    metrics.issued("client", 1600.5)
    metrics.issued("server", 1030.0)
    assert registry.get_sample_value(client_ttl) == 600  # whole seconds, as upstream's
    now[0] = 1060.0
    assert registry.get_sample_value(server_ttl) == -30
    metrics.issued("server", 2060.0)  # renewed
    metrics.rotated("server", 5000.0)  # the old one had lived 5000 s
    metrics.rotated("client", 5000.0)  # upstream times the serving certificate's only
    assert registry.get_sample_value(server_ttl) == 1000
    assert registry.get_sample_value(rotation_count) == 1
    bucket = "kubelet_certificate_manager_server_rotation_seconds_bucket"
    assert registry.get_sample_value(bucket, {"le": "3600.0"}) == 0
    assert registry.get_sample_value(bucket, {"le": "14400.0"}) == 1
    assert "kubelet_certificate_manager_client_rotation_seconds" not in str(
        generate_latest(registry)
    )
    # the renewal failure counters, under upstream's names (no `_total`), from 0
    client_errors = "kubelet_certificate_manager_client_expiration_renew_errors"
    assert registry.get_sample_value(client_errors) == 0
    metrics.renew_failed("client")
    metrics.renew_failed("client")
    assert registry.get_sample_value(client_errors) == 2
    assert registry.get_sample_value("kubelet_server_expiration_renew_errors") == 0
    page = generate_latest(registry).decode()
    assert f"\n{client_errors} 2.0\n" in page and f"{client_errors}_total" not in page


async def test_the_rotated_certificates_series_are_served_from_the_wiring_on(
    tmp_path: Path,
) -> None:
    """status-reporter's cluster wiring makes each rotated certificate's series exist
    (TTL +Inf, errors 0) before its first look, as upstream registers them at start,
    and only for the certificates it rotates."""
    from types import SimpleNamespace

    from klet.status_reporter.cluster.managers import _certificates
    from klet.status_reporter.metrics.instruments import CertificateMetrics
    from prometheus_client import CollectorRegistry

    s = settings(tmp_path)
    await ensure_client_certificate(s, lambda path: FakeSigner())
    klet = SimpleNamespace(kubeconfig=s.kubeconfig, cert_dir=s.cert_dir, node_name="n1")
    registry = CollectorRegistry()
    metrics = CertificateMetrics(registry)
    kubelet = SimpleNamespace(rotate_certificates=True, server_tls_bootstrap=False)
    tasks = _certificates(FakeSigner(), kubelet, klet, ("10.0.0.1",), metrics)  # type: ignore[arg-type]
    assert list(tasks) == ["client-certificate"]
    assert registry.get_sample_value("kubelet_certificate_manager_client_ttl_seconds") == math.inf
    assert registry.get_sample_value("kubelet_certificate_manager_server_ttl_seconds") is None
    kubelet = SimpleNamespace(rotate_certificates=True, server_tls_bootstrap=True)
    tasks = _certificates(FakeSigner(), kubelet, klet, ("10.0.0.1",), metrics)  # type: ignore[arg-type]
    assert list(tasks) == ["client-certificate", "serving-certificate"]
    assert registry.get_sample_value("kubelet_certificate_manager_server_ttl_seconds") == math.inf
    assert registry.get_sample_value("kubelet_server_expiration_renew_errors") == 0
    # the serving rotation tells the metrics how long a replaced certificate lived
    tasks["serving-certificate"]._on_rotated(120.0)
    count = "kubelet_certificate_manager_server_rotation_seconds_count"
    assert registry.get_sample_value(count) == 1
