"""`klet up`: the whole agent on one machine, for development and demos.

It validates the flags once (the services get the same ones), starts what is missing —
a private Redis, and unless a runtime endpoint is configured a private containerd with
a local registry holding the test images (klet.devstack) — then runs every installed
service as its own process (`python -m klet.<service>`), prefixes each output line with
the service's name as `docker compose up` does, restarts a service that dies (with a
capped back-off, each restart logged), and on SIGINT/SIGTERM stops the services and then
the private components, leaving no process behind. Private state lives under
`--run-dir`; `endpoints.json` there tells other commands (`klet crictl`) where it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

from klet.config import DEFAULT_SERVICE_PORTS, ConfigError, build_parser, load_settings
from klet.config.kubelet import KubeletConfiguration
from klet.devstack import DevStack, RedisServer, free_port

log = logging.getLogger("klet.up")

START_ORDER = ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc")


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
    )
    child.started_at = time.monotonic()
    child.pump = asyncio.create_task(_pump(child), name=f"pump-{child.name}")


async def _stop(child: Child, timeout_s: float = 20.0) -> None:
    proc = child.proc
    if proc is None or proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
    if child.pump is not None:
        await asyncio.gather(child.pump, return_exceptions=True)


async def _supervise(children: list[Child], stop: asyncio.Event) -> None:
    for child in children:
        await _start(child)
        _emit("klet", f"started {child.name} (pid {child.proc.pid if child.proc else '?'})")
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
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                await _start(child)
                _emit(
                    "klet", f"restarted {child.name} (pid {child.proc.pid if child.proc else '?'})"
                )
    for child in reversed(children):
        await _stop(child)
        _emit("klet", f"stopped {child.name}")


def up(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, format="klet            | %(message)s", stream=sys.stdout
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per registry request is noise
    try:
        settings = load_settings(argv, env=os.environ, service="up")
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    run_dir = Path(settings.klet.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    accepted = {a for action in build_parser("up")._actions for a in action.option_strings}
    extra: list[str] = []
    default_endpoint = KubeletConfiguration().container_runtime_endpoint
    own_runtime = (
        not _given(argv, "--container-runtime-endpoint")
        and settings.kubelet.container_runtime_endpoint == default_endpoint
    )
    own_redis = not _given(argv, "--redis-url") and "KLET_REDIS_URL" not in os.environ
    stack: DevStack | None = None
    redis: RedisServer | None = None
    redis_url = settings.klet.redis_url
    runtime_endpoint = settings.kubelet.container_runtime_endpoint
    try:
        if own_runtime:
            _emit(
                "klet", f"starting private Redis, registry and containerd under {run_dir / 'stack'}"
            )
            stack = DevStack(run_dir / "stack")
            stack.start()
            runtime_endpoint = stack.runtime_endpoint
            extra += ["--container-runtime-endpoint", runtime_endpoint]
            if own_redis:
                redis_url = stack.redis_url
        elif own_redis:
            _emit("klet", f"starting private Redis under {run_dir / 'redis'}")
            redis = RedisServer(run_dir / "redis")
            redis.start()
            redis_url = redis.url
        if own_redis:
            extra += ["--redis-url", redis_url]
        if not _given(argv, "--root-dir"):
            extra += ["--root-dir", str(run_dir / "root")]
        if "--pod-logs-dir" in accepted and not _given(argv, "--pod-logs-dir"):
            extra += ["--pod-logs-dir", str(run_dir / "logs" / "pods")]
        if not _given(argv, "--run-dir"):
            extra += ["--run-dir", str(run_dir)]
        (run_dir / "endpoints.json").write_text(
            json.dumps(
                {
                    "redis_url": redis_url,
                    "runtime_endpoint": runtime_endpoint,
                    "registry": stack.registry_address if stack else None,
                    "pid": os.getpid(),
                },
                indent=2,
            )
        )
        installed = {ep.name for ep in entry_points(group="klet.services")}
        children = []
        for name in [s for s in START_ORDER if s in installed]:
            port = DEFAULT_SERVICE_PORTS[name]
            if not _port_free(port):
                port = free_port()
            children.append(
                Child(
                    name,
                    [
                        sys.executable,
                        "-m",
                        f"klet.{name.replace('-', '_')}",
                        *argv,
                        *extra,
                        "--service-port",
                        str(port),
                    ],
                )
            )
            _emit("klet", f"{name}: private /healthz /metrics on 127.0.0.1:{port}")
        return asyncio.run(_main(children))
    finally:
        if stack is not None:
            _emit("klet", "stopping private containerd, registry and Redis")
            stack.stop()
        if redis is not None:
            redis.stop()


async def _main(children: list[Child]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await _supervise(children, stop)
    return 0
