"""`klet up`: the whole agent on one machine, for development and demos.

It validates the flags once (the services get the same ones), starts what is missing —
a private Redis, and unless a runtime endpoint is configured a private containerd with
a local registry holding the test images (klet.devstack) — then runs every installed
service as its own process (`python -m klet.<service>`), prefixes each output line with
the service's name as `docker compose up` does, restarts a service that dies (with a
capped back-off, each restart logged), and on SIGINT/SIGTERM stops the services and then
the private components, leaving no process behind. Private state lives under
`--run-dir`; `endpoints.json` there tells other commands (`klet crictl`) where it is.
Each service's private port is its default (10260-10264, a free one when taken), or
with `--service-port=0` one the kernel picks, published under `<run-dir>/ports/`.

status-reporter, eviction and image-gc never get the runtime's socket: their runtime
endpoint is `<run-dir>/cri/<service>.sock`, served by the CRI allow-list proxy
(klet.cri.proxy), which passes each only the CRI calls klet.cri.allowlist grants it.
The proxy runs inside this supervisor, on its event loop, bound before the first service
starts and closed after the last one stopped, not as a child of its own: a whole
interpreter for it cost about 20 MB PSS at idle (issue 42), while in here it adds gRPC
alone (it forwards raw bytes: no CRI stubs, no client). What that trades: the proxy is
no longer restarted on its own; it holds no state and a grpc.aio server does not exit
while its process lives, so the failure that remains is this process dying, which ends
the node anyway (systemd, or the operator, restarts `klet up` whole). The supervisor
only waits on its children, so forwarding on its loop delays a restart by at most the
handling of calls in flight. gRPC's threads are safe beside the children it starts:
subprocess forks and execs in C, running no Python and no gRPC in the child. Compose
and the chart keep the proxy a container of its own (`klet cri-proxy`): there the
confinement is the point, and it costs the same interpreter as a process would.

The private Redis is safe by default (klet.devstack.redis_server): a unix socket in a
0700 directory, no unauthenticated user, and one ACL user per service (klet.bus.acl).
Each child gets its own user and the path of its own password file, never a password:
every local user can read a process's command line in /proc/<pid>/cmdline. For an
external Redis whose password came in KLET_REDIS_URL, the children get the URL without
it and the password in a 0600 file under `<run-dir>/secrets` (and no KLET_REDIS_URL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.util import cache_from_source, find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from klet.cli import sdnotify
from klet.config import (
    ConfigError,
    RedisAuth,
    build_parser,
    load_settings,
)
from klet.config.gates import enabled
from klet.config.kubelet import KubeletConfiguration
from klet.cri.allowlist import FILTERED_SERVICES
from klet.devstack.procs import free_port
from klet.devstack.redis_server import RedisServer, write_secret
from klet.model.layout import DEFAULT_SERVICE_PORTS, REDIS_DIR, cri_proxy_socket, port_files_dir

if TYPE_CHECKING:
    from klet.cri.proxy import CRIProxy
    from klet.devstack.stack import DevStack


class Proxy(Protocol):
    """What the supervisor needs of the CRI proxy it serves (klet.cri.proxy.CRIProxy)."""

    @property
    def services(self) -> tuple[str, ...]: ...

    async def start(self) -> None: ...

    async def stop(self, grace_s: float = ...) -> None: ...


log = logging.getLogger("klet.up")

START_ORDER = ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc")


def optimized_bytecode() -> bool:
    """Whether the optimised (``opt-2``) bytecode is installed beside the sources: for
    this module and for redis-py, which every service imports (`make setup` compiles it
    for the venv and klet's own sources)."""
    spec = find_spec("redis")
    return all(
        Path(cache_from_source(src, optimization=2)).is_file()
        for src in (__file__, spec.origin if spec and spec.origin else "")
        if src
    )


def service_environment(environ: Mapping[str, str], *, optimized_bytecode: bool) -> dict[str, str]:
    """The services' environment: ours, without KLET_REDIS_URL (the URL, and so any
    password in it, reaches the children as a flag without it), with two settings that
    hold their memory down. A value the operator set stands.

    - MALLOC_ARENA_MAX=2: glibc gives every thread that allocates a malloc arena of its
      own (gRPC's event-engine threads, asyncio's executor); two in all hold a service's
      memory in fewer, fuller heaps, about 3 MB less resident over the five (issue 15).
      The image sets the same.
    - PYTHONOPTIMIZE=2 where the optimised bytecode is installed: the services then load
      no docstrings (redis-py's command modules and the Kubernetes client's carry
      megabytes of them), 3-4 MB less resident per service, about 15 over the five
      (issue 42). It also drops `assert` statements: klet's narrow types only, none
      carries behaviour, and nothing at run time reads a docstring. Without that
      bytecode each service would compile its imports at every start where
      PYTHONDONTWRITEBYTECODE is set, which costs more than it saves, so it is left
      unset. The image does not set it yet: its layers carry the plain bytecode only.
    """
    env = {k: v for k, v in environ.items() if k != "KLET_REDIS_URL"}
    env.setdefault("MALLOC_ARENA_MAX", "2")
    if optimized_bytecode:
        env.setdefault("PYTHONOPTIMIZE", "2")
    return env


def _module(service: str) -> str:
    return f"klet.{service.replace('-', '_')}"


def _given(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = 0.0
    pump: asyncio.Task[None] | None = field(default=None, repr=False)


def _emit(name: str, line: str) -> None:
    sys.stdout.write(f"{name:<16}| {line}\n")
    sys.stdout.flush()


async def _pump(child: Child) -> None:
    assert child.proc is not None and child.proc.stdout is not None
    while True:
        raw = await child.proc.stdout.readline()
        if not raw:
            return
        _emit(child.name, raw.decode(errors="replace").rstrip("\n"))


async def _start(child: Child) -> None:
    child.proc = await asyncio.create_subprocess_exec(
        *child.argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        env=child.env,
    )
    child.started_at = time.monotonic()
    child.pump = asyncio.create_task(_pump(child), name=f"pump-{child.name}")


async def _stop(child: Child, timeout_s: float = 20.0) -> None:
    proc = child.proc
    if proc is None or proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(timeout_s):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
    if child.pump is not None:
        await asyncio.gather(child.pump, return_exceptions=True)


async def _supervise(
    children: list[Child], stop: asyncio.Event, started: asyncio.Event | None = None
) -> None:
    for child in children:
        await _start(child)
        _emit("klet", f"started {child.name} (pid {child.proc.pid if child.proc else '?'})")
    if started is not None:
        started.set()
    while not stop.is_set():
        waits = {asyncio.ensure_future(c.proc.wait()): c for c in children if c.proc is not None}
        stopper = asyncio.ensure_future(stop.wait())
        done, _pending = await asyncio.wait([*waits, stopper], return_when=asyncio.FIRST_COMPLETED)
        for fut in [*waits, stopper]:
            if fut not in done:
                fut.cancel()
        if stop.is_set():
            break
        for fut in done:
            exited = waits.get(fut)
            if exited is None:
                continue
            child = exited
            code = fut.result()
            if child.pump is not None:
                await asyncio.gather(child.pump, return_exceptions=True)
            ran = time.monotonic() - child.started_at
            child.restarts = 0 if ran > 60 else child.restarts + 1
            delay = min(30.0, 0.5 * 2 ** min(child.restarts, 6))
            _emit(
                "klet",
                f"{child.name} exited with code {code} after {ran:.1f}s; "
                f"restarting in {delay:.1f}s (restart #{child.restarts})",
            )
            try:
                async with asyncio.timeout(delay):
                    await stop.wait()
            except TimeoutError:
                await _start(child)
                _emit(
                    "klet", f"restarted {child.name} (pid {child.proc.pid if child.proc else '?'})"
                )
    for child in reversed(children):
        await _stop(child)
        _emit("klet", f"stopped {child.name}")


def _external_redis_flags(auth: RedisAuth, url: str, run_dir: Path) -> list[str]:
    """The bus flags every child gets for a Redis `klet up` did not start: the URL
    without credentials, and a password that came inside KLET_REDIS_URL as a file."""
    flags = ["--redis-url", url]
    if auth.username:
        flags += ["--redis-username", auth.username]
    if auth.password and auth.password_file is None:
        path = run_dir / "secrets" / "redis-password"
        write_secret(path, auth.password)
        flags += ["--redis-password-file", str(path)]
    return flags


def _filtered_runtime_flags(service: str, run_dir: Path) -> list[str]:
    """A reading service's runtime and image endpoints: its socket of the CRI proxy
    (after the user's flags, so they win over any endpoint given there)."""
    if service not in FILTERED_SERVICES:
        return []
    endpoint = f"unix://{cri_proxy_socket(run_dir, service)}"
    return ["--container-runtime-endpoint", endpoint, "--image-service-endpoint", endpoint]


def _cri_proxy(runtime_endpoint: str, image_endpoint: str, run_dir: Path) -> CRIProxy:
    """The CRI allow-list proxy this process serves in front of the runtime the services
    use: one socket per reading service, `<run-dir>/cri/<service>.sock`."""
    from klet.cri.proxy import CRIProxy  # gRPC: loaded when a node is started, not before

    return CRIProxy(
        runtime_endpoint=runtime_endpoint,
        image_endpoint=image_endpoint,
        sockets={s: cri_proxy_socket(run_dir, s) for s in FILTERED_SERVICES},
    )


def up(argv: list[str], *, system: bool = False) -> int:
    """Run the node. `system`: as the machine's kubelet (the `kubelet` entry point,
    klet.cli.kubelet): the configured runtime endpoint and upstream's directories, never
    the private containerd or klet up's run-dir defaults, and systemd's notify protocol
    (klet.cli.sdnotify)."""
    logging.basicConfig(
        level=logging.INFO, format="klet            | %(message)s", stream=sys.stdout
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per registry request is noise
    try:
        settings = load_settings(argv, env=os.environ, service="up")
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    if settings.klet.service_port_file is not None:
        print(
            "klet up: --service-port-file (KLET_SERVICE_PORT_FILE) is one replica's own; "
            "the services of klet up publish their ports under <run-dir>/ports/",
            file=sys.stderr,
        )
        return 2
    try:
        watchdog = enabled(settings.kubelet.feature_gates, "SystemdWatchdog")
        systemd = _systemd(watchdog=watchdog) if system else None
    except ValueError as err:
        print(f"kubelet: {err}", file=sys.stderr)
        return 2
    # A service is installed when `python -m klet.<service>` can find it (without
    # reading every distribution's metadata for the klet.services entry points); the
    # node needs all five, so one missing is named, not skipped.
    missing = [s for s in START_ORDER if find_spec(_module(s)) is None]
    if missing:
        print(
            "klet up: not installed: "
            + ", ".join(
                f"{s} (no module {_module(s)}; its distribution is klet-{s})" for s in missing
            ),
            file=sys.stderr,
        )
        return 2
    run_dir = Path(settings.klet.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    accepted = {a for action in build_parser("up")._actions for a in action.option_strings}
    extra: list[str] = []
    default_endpoint = KubeletConfiguration().container_runtime_endpoint
    own_runtime = (
        not system
        and not _given(argv, "--container-runtime-endpoint")
        and settings.kubelet.container_runtime_endpoint == default_endpoint
    )
    own_redis = not _given(argv, "--redis-url") and "KLET_REDIS_URL" not in os.environ
    stack: DevStack | None = None  # the image builder and containerd: imported only if used
    redis: RedisServer | None = None
    redis_url = settings.klet.redis_url  # without credentials (load_settings took them out)
    redis_flags: dict[str, list[str]] = {}  # per service, when the Redis is ours
    admin_password_file: Path | None = None
    runtime_endpoint = settings.kubelet.container_runtime_endpoint
    try:
        if own_runtime:
            _emit(
                "klet", f"starting private Redis, registry and containerd under {run_dir / 'stack'}"
            )
            from klet.devstack.stack import DevStack

            # The private containerd follows the configured cgroup driver, which
            # syncloop checks against the runtime's at start.
            stack = DevStack(
                run_dir / "stack",
                systemd_cgroup=settings.kubelet.cgroup_driver == "systemd",
            )
            stack.start()
            runtime_endpoint = stack.runtime_endpoint
            extra += ["--container-runtime-endpoint", runtime_endpoint]
            if own_redis:
                redis = stack.redis
        elif own_redis:
            _emit("klet", f"starting private Redis under {run_dir / REDIS_DIR}")
            redis = RedisServer(run_dir / REDIS_DIR)
            redis.start()
        if redis is not None:
            redis_url = redis.url
            admin_password_file = redis.admin.password_file
            node = settings.klet.node_name
            redis_flags = {name: redis.service_flags(node, name) for name in START_ORDER}
        else:
            extra += _external_redis_flags(settings.klet.redis_auth, redis_url, run_dir)
        if not system and not _given(argv, "--root-dir"):
            extra += ["--root-dir", str(run_dir / "root")]
        if not system and "--pod-logs-dir" in accepted and not _given(argv, "--pod-logs-dir"):
            extra += ["--pod-logs-dir", str(run_dir / "logs" / "pods")]
        if not _given(argv, "--run-dir"):
            extra += ["--run-dir", str(run_dir)]
        (run_dir / "endpoints.json").write_text(
            json.dumps(
                {
                    "redis_url": redis_url,
                    "redis_admin_password_file": (
                        str(admin_password_file) if admin_password_file else None
                    ),
                    "runtime_endpoint": runtime_endpoint,
                    "registry": stack.registry_address if stack else None,
                    "pid": os.getpid(),
                },
                indent=2,
            )
        )
        child_env = service_environment(os.environ, optimized_bytecode=optimized_bytecode())
        proxy = _cri_proxy(runtime_endpoint, settings.kubelet.image_service_endpoint, run_dir)
        children: list[Child] = []
        # --service-port=0: every service on a port the kernel picks (published under
        # <run-dir>/ports/); otherwise each on its own default, or a free one if taken.
        any_port = settings.klet.service_port == 0
        for name in START_ORDER:
            port = 0 if any_port else DEFAULT_SERVICE_PORTS[name]
            if port and not _port_free(port):
                port = free_port()
            children.append(
                Child(
                    name,
                    [
                        sys.executable,
                        "-m",
                        _module(name),
                        *argv,
                        *extra,
                        *redis_flags.get(name, []),
                        *_filtered_runtime_flags(name, run_dir),
                        "--service-port",
                        str(port),
                    ],
                    env=child_env,
                )
            )
            where = (
                f"127.0.0.1:{port}" if port else f"a free port, see {port_files_dir(run_dir, name)}"
            )
            _emit("klet", f"{name}: private /healthz /metrics on {where}")
        return asyncio.run(_main(children, systemd, proxy))
    finally:
        if stack is not None:
            _emit("klet", "stopping private containerd, registry and Redis")
            stack.stop()
        elif redis is not None:
            redis.stop()


def _systemd(*, watchdog: bool) -> tuple[str, float | None] | None:
    """The notify socket and, with `watchdog` (the SystemdWatchdog gate), the watchdog
    period (raises ValueError naming a bad WATCHDOG_USEC)."""
    address = sdnotify.notify_address(os.environ)
    if address is None:
        return None
    period = sdnotify.watchdog_period(os.environ, os.getpid()) if watchdog else None
    return address, period


async def _main(
    children: list[Child],
    systemd: tuple[str, float | None] | None = None,
    proxy: Proxy | None = None,
) -> int:
    """Serve `proxy` (bound before any child starts, so a reading service finds its
    socket), supervise `children` until SIGINT/SIGTERM, stop them, then the proxy."""
    if proxy is not None:
        try:
            await proxy.start()
        except OSError as err:
            print(f"klet up: {err}", file=sys.stderr)
            await proxy.stop(0)
            return 1
        _emit("klet", f"serving the CRI proxy's sockets for {', '.join(proxy.services)}")
    try:
        return await _run(children, systemd)
    finally:
        if proxy is not None:
            await proxy.stop()
            _emit("klet", "stopped the CRI proxy")


async def _run(children: list[Child], systemd: tuple[str, float | None] | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    notifier = None
    started = asyncio.Event()
    if systemd is not None:
        address, period = systemd

        def running() -> bool:
            return all(c.proc is not None and c.proc.returncode is None for c in children)

        async def notify() -> None:
            await started.wait()  # every service is started before READY=1, as upstream
            sdnotify.send(address, "READY=1")
            if period is not None:
                await sdnotify.run_watchdog(address=address, period=period, healthy=running)

        notifier = asyncio.create_task(notify(), name="sd-notify")
    try:
        await _supervise(children, stop, started)
    finally:
        if notifier is not None:
            notifier.cancel()
            await asyncio.gather(notifier, return_exceptions=True)
    return 0
