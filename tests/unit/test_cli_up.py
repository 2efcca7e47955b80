"""`klet up` refuses to start a node without all five services, naming the missing ones,
and gives the three services that read the runtime their CRI proxy socket as runtime and
image endpoint (syncloop and pod-source keep theirs); it serves that proxy itself, bound
before the first service starts and closed after the last one stopped, and the proxy it
serves loads neither the CRI stubs nor the CRI client (issue 42: no interpreter of its
own, and little added to the supervisor's). The services' environment: no KLET_REDIS_URL,
MALLOC_ARENA_MAX=2, and PYTHONOPTIMIZE=2 only where the optimised bytecode is installed;
an operator's own values stand."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from klet.cli import up as up_module

from tests.harness.freshimports import loaded_after


def test_a_service_that_is_not_installed_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = up_module.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name in ("klet.eviction", "klet.image_gc") else real(name, *args)

    monkeypatch.setattr(up_module, "find_spec", find_spec)
    assert up_module.up(["--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert (
        "not installed: eviction (no module klet.eviction; its distribution is klet-eviction)"
        in err
    )
    assert "image-gc (no module klet.image_gc" in err
    assert not (tmp_path / "run").exists()  # nothing started


def test_readers_get_their_cri_proxy_socket(tmp_path: Path) -> None:
    for service in ("status-reporter", "eviction", "image-gc"):
        sock = f"unix://{tmp_path}/cri/{service}.sock"
        assert up_module._filtered_runtime_flags(service, tmp_path) == [
            "--container-runtime-endpoint",
            sock,
            "--image-service-endpoint",
            sock,
        ]
    for service in ("pod-source", "syncloop"):
        assert up_module._filtered_runtime_flags(service, tmp_path) == []


class FakeProxy:
    """The proxy `_main` serves: start makes its socket's file, stop records whether the
    services were all stopped by then; `fail` makes start refuse as a bind would."""

    services = ("status-reporter",)

    def __init__(self, sock: Path, children: list[up_module.Child], fail: bool = False) -> None:
        self.sock, self.children, self.fail = sock, children, fail
        self.events: list[str] = []

    async def start(self) -> None:
        self.events.append("start")
        if self.fail:
            raise OSError(f"CRI proxy: cannot bind {self.sock}")
        self.sock.write_text("")

    async def stop(self, grace_s: float = 5.0) -> None:
        running = [c.name for c in self.children if c.proc and c.proc.returncode is None]
        self.events.append(f"stop with {running} running")
        self.sock.unlink(missing_ok=True)


def test_the_proxy_serves_before_the_first_service_and_stops_after_the_last(
    tmp_path: Path,
) -> None:
    sock, seen = tmp_path / "status-reporter.sock", tmp_path / "seen"
    # A service that looks for its socket at start, then stops klet up (this process)
    # as an operator would, and runs until it is stopped itself.
    probe = (
        f"import os, signal, time; open({str(seen)!r}, 'w')"
        f".write(str(os.path.exists({str(sock)!r}))); "
        "os.kill(os.getppid(), signal.SIGTERM); time.sleep(60)"
    )
    children = [up_module.Child("status-reporter", [sys.executable, "-c", probe])]
    proxy = FakeProxy(sock, children)

    async def run() -> int:
        return await up_module._main(children, None, proxy)

    assert asyncio.run(run()) == 0
    assert seen.read_text() == "True"  # the socket was there when the service started
    assert proxy.events == ["start", "stop with [] running"]
    assert not sock.exists()


def test_a_proxy_that_cannot_bind_starts_no_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    children = [up_module.Child("status-reporter", [sys.executable, "-c", "pass"])]
    proxy = FakeProxy(tmp_path / "status-reporter.sock", children, fail=True)
    assert asyncio.run(up_module._main(children, None, proxy)) == 1
    assert children[0].proc is None
    assert proxy.events == ["start", "stop with [] running"]
    assert "klet up: CRI proxy: cannot bind" in capsys.readouterr().err


def test_the_proxy_loads_neither_the_cri_stubs_nor_the_client() -> None:
    """What serving it adds to the supervisor: gRPC and the allow-list, not cri_api's
    stubs, klet.cri.client or its retry library (a fresh interpreter tells)."""
    loaded = loaded_after(
        "import klet.cli.up, klet.cri.proxy", ["cri_api", "klet.cri.client", "tenacity", "grpc"]
    )
    assert loaded == ["grpc"]


def test_the_services_environment_drops_the_redis_url_and_holds_memory_down() -> None:
    env = up_module.service_environment(
        {"PATH": "/bin", "KLET_REDIS_URL": "redis://:pw@h:6379"}, optimized_bytecode=True
    )
    assert env == {"PATH": "/bin", "MALLOC_ARENA_MAX": "2", "PYTHONOPTIMIZE": "2"}


def test_no_optimisation_without_its_bytecode_and_the_operators_values_stand() -> None:
    plain = up_module.service_environment({"PATH": "/bin"}, optimized_bytecode=False)
    assert plain == {"PATH": "/bin", "MALLOC_ARENA_MAX": "2"}
    operator = {"MALLOC_ARENA_MAX": "4", "PYTHONOPTIMIZE": "0"}
    assert up_module.service_environment(operator, optimized_bytecode=True) == operator


def test_the_optimised_bytecode_is_found_where_make_setup_compiled_it() -> None:
    # tools/setup.sh compiles klet's sources and the venv at -o 2; the check reads both.
    assert up_module.optimized_bytecode()
