"""klet.wiring: every service's shared set-up, built once, and kept from coming back.

Covers: `service_base` builds the bus, the node's tables as the named service sees
them, the lease (the one `LEASE_TTL_MS`, or a test's shorter one; under a test's holder
ID, or this process's replica slot in the run directory), the registry (with the
process series when asked), the private port and the path of the service's own gRPC
socket; a test's bus and registry are used as
given, and a service's Deps reads them from its base. `runtime_client` builds a CRI
client on the configured endpoints whose calls are counted in the registry. And no
service's wiring.py repeats any of it: none builds a bus, a node bus, a lease, a
registry, a private port or a CRI client itself, and none writes a lease TTL (the scan
is shown to catch an offender).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from klet.bus import Bus
from klet.model.layout import DEFAULT_SERVICE_PORTS
from klet.obs.runtimeops import RuntimeOperationMetrics
from klet.wiring import (
    LEASE_TTL_MS,
    BaseOverrides,
    OnServiceBase,
    runtime_client,
    service_base,
)
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[2]
WIRING_FILES = sorted(ROOT.glob("services/*/src/klet/*/wiring.py"))


@dataclass(frozen=True)
class Auth:
    username: str = ""
    password: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None


@dataclass(frozen=True)
class Klet:
    run_dir: Path
    node_name: str = "node-a"
    redis_url: str = "redis://127.0.0.1:1"  # never reached: nothing here talks to it
    redis_auth: Auth = Auth()
    service_bind_address: str = "127.0.0.1"
    service_port: int | None = None
    service_port_file: Path | None = None


@dataclass(frozen=True)
class Runtime:
    container_runtime_endpoint: str = "unix:///run/containerd/containerd.sock"
    image_service_endpoint: str = ""
    runtime_request_timeout: float = 120.0


async def test_the_base_is_the_named_services(tmp_path: Path) -> None:
    base = service_base("syncloop", Klet(tmp_path), BaseOverrides(lease_holder="h1"))
    try:
        assert base.node_bus.bus is base.bus
        assert base.node_bus.service == "syncloop"
        assert base.bus.key("desired") == base.node_bus.desired.key
        assert base.bus.key("x") == "klet:node-a:x"
        assert (base.lease.holder, base.lease.ttl_ms) == ("h1", LEASE_TTL_MS)
        assert base.lease.key == base.bus.key("lease:syncloop")
        assert base.port.service == "syncloop"
        assert base.port.port == DEFAULT_SERVICE_PORTS["syncloop"]
        assert base.port.run_dir == tmp_path
        assert base.grpc_socket == tmp_path / "grpc" / "syncloop" / "syncloop.sock"
        names = {m.name for m in base.registry.collect()}
        assert not any(n.startswith(("process_", "python_")) for n in names)
    finally:
        await base.bus.close()


async def test_a_tests_bus_registry_and_ttl_are_used(tmp_path: Path) -> None:
    bus = Bus.from_url("redis://127.0.0.1:1", "node-b")
    registry = CollectorRegistry()
    base = service_base(
        "image-gc",
        Klet(tmp_path),
        BaseOverrides(bus=bus, registry=registry, lease_holder="h2"),
        lease_ttl_ms=900,
    )
    try:
        assert base.bus is bus and base.registry is registry
        assert base.lease.ttl_ms == 900
        assert base.lease.key == bus.key("lease:image-gc")
    finally:
        await bus.close()


async def test_process_series_when_asked(tmp_path: Path) -> None:
    base = service_base(
        "pod-source", Klet(tmp_path), BaseOverrides(lease_holder="h3"), process_metrics=True
    )
    try:
        names = {m.name for m in base.registry.collect()}
        assert "python_info" in names
    finally:
        await base.bus.close()


async def test_without_a_holder_the_lease_takes_the_replica_slot(tmp_path: Path) -> None:
    base = service_base("eviction", Klet(tmp_path))
    try:
        slot = tmp_path / "leases" / "eviction" / "holder"
        assert slot.read_text().strip() == base.lease.holder
        assert base.lease.leader_slot is not None
        assert base.lease.ttl_ms == LEASE_TTL_MS
    finally:
        await base.bus.close()


@dataclass(frozen=True)
class Deps(OnServiceBase):
    own: str


async def test_a_deps_reads_its_shared_parts_from_the_base(tmp_path: Path) -> None:
    base = service_base("eviction", Klet(tmp_path), BaseOverrides(lease_holder="h4"))
    try:
        deps = Deps(base=base, own="x")
        assert (deps.bus, deps.node_bus, deps.registry) == (
            base.bus,
            base.node_bus,
            base.registry,
        )
        assert (deps.lease, deps.service_port, deps.own) == (base.lease, base.port, "x")
    finally:
        await base.bus.close()


async def test_the_runtime_client_uses_the_endpoints_and_counts_its_calls() -> None:
    registry = CollectorRegistry()
    client = runtime_client(Runtime(), registry, image_endpoint="unix:///run/images.sock")
    try:
        assert client.settings.runtime_endpoint == "unix:///run/containerd/containerd.sock"
        assert client.settings.image_endpoint == "unix:///run/images.sock"
        assert client.settings.timeout_s == 120.0
        assert isinstance(client.observer, RuntimeOperationMetrics)
        client.observer.observe("Version", 0.01, failed=False)
        assert (
            registry.get_sample_value(
                "kubelet_runtime_operations_total", {"operation_type": "version"}
            )
            == 1
        )
    finally:
        await client.close()


# What a service's wiring must not do itself: the calls klet.wiring makes for it.
SHARED_CALLS = frozenset(
    {
        "Bus.from_url",
        "NodeBus.of",
        "service_lease",
        "ServicePort.of",
        "new_registry",
        "CollectorRegistry",
        "RuntimeClient",
        "RuntimeOperationMetrics",
    }
)


def repeated_setup(source: str) -> list[str]:
    """What in `source` (a wiring.py) repeats klet.wiring's set-up: a shared call, a
    lease taken (`.lease(...)`), a lease TTL constant (its own or klet.wiring's), or
    the TTL's number."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in SHARED_CALLS:
                found.append(f"line {node.lineno}: calls {name}")
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "lease":
                found.append(f"line {node.lineno}: takes a lease ({name})")
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            # A constant's name (a test's override field, `lease_ttl_ms`, is not one).
            if name.isupper() and "LEASE" in name and "TTL" in name:
                found.append(f"line {node.lineno}: names a lease TTL constant ({name})")
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if node.value in (LEASE_TTL_MS, LEASE_TTL_MS / 1000):
                found.append(f"line {node.lineno}: the lease TTL's number ({node.value})")
    return found


def test_five_wiring_files_are_scanned() -> None:
    assert len(WIRING_FILES) == 5, WIRING_FILES


def test_no_wiring_repeats_the_shared_setup() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in WIRING_FILES
        if (found := repeated_setup(path.read_text()))
    }
    assert not offenders, f"build these through klet.wiring.service_base: {offenders}"


def test_the_scan_catches_a_repeat() -> None:
    """The scan itself: each kind of repeat is found (the test above can fail)."""
    source = (
        "LEASE_TTL_MS = 15_000\n"
        "bus = Bus.from_url(url, node)\n"
        "lease = bus.lease('syncloop', holder, ttl_ms=15.0 * 1000)\n"
        "registry = CollectorRegistry()\n"
    )
    found = repeated_setup(source)
    assert any("names a lease TTL constant" in f for f in found)
    assert any("calls Bus.from_url" in f for f in found)
    assert any("takes a lease" in f for f in found)
    assert any("calls CollectorRegistry" in f for f in found)
    assert any("number (15000)" in f for f in found)
    assert any("number (15.0)" in f for f in found)
