"""`klet up` as an operator runs it: it starts its own Redis, registry and containerd, runs
the example static pods, each service's lines tagged with its name and in klog's text
form, restarts a service that dies (and says so), and on SIGTERM stops everything it
started, leaving no process behind. Its Redis is a root-only unix socket, each service
has a user of its own, and no password shows on any command line (/proc/<pid>/cmdline is
readable by every local user), also when the password of an external Redis came in
KLET_REDIS_URL."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from klet.devstack import DevStack, Pidfile, RedisServer, free_port
from klet.devstack.redis_server import redis_command

from tests.harness.node import RELISTS, fetch, sample_value
from tests.harness.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    )


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def assert_no_secret_on_command_lines(pids: list[int], endpoints: dict[str, Any]) -> None:
    """The private Redis is a root-only unix socket with a user per service; no process
    of `klet up` carries a password on its command line, only password file paths."""
    url = endpoints["redis_url"]
    sock = Path(url.removeprefix("unix://"))
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    secrets_dir = Path(endpoints["redis_admin_password_file"]).parent
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    passwords = {p.read_text().strip() for p in secrets_dir.rglob("*") if p.is_file()}
    assert len(passwords) >= 4, "no per-service password files"
    users = set()
    for pid in pids:
        if not alive(pid):
            continue  # a service between restarts
        argv = cmdline(pid)
        for password in passwords:
            assert not any(password in arg for arg in argv), f"a password on pid {pid}'s argv"
        if "--redis-username" in argv:
            users.add(argv[len(argv) - 1 - argv[::-1].index("--redis-username") + 1])
            assert "--redis-password-file" in argv
    assert len(users) >= 3, f"services do not have users of their own: {users}"


def assert_readers_reach_the_runtime_through_the_proxy(
    run_dir: Path, pids: dict[str, int], log: str
) -> None:
    """status-reporter, eviction and image-gc run with their CRI proxy socket as runtime
    and image endpoint (the last of each flag wins); each socket is 0600, RunPodSandbox
    on status-reporter's is refused by name, and while the pod ran no service was
    refused a call (what they do needs nothing beyond their lists)."""
    for service in ("status-reporter", "eviction", "image-gc"):
        argv = cmdline(pids[service])
        sock = run_dir / "cri" / f"{service}.sock"
        for flag in ("--container-runtime-endpoint", "--image-service-endpoint"):
            last = len(argv) - 1 - argv[::-1].index(flag)
            assert argv[last + 1] == f"unix://{sock}", (service, flag, argv)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    # syncloop, which runs the pods, talks to the runtime itself.
    assert not any("/cri/" in arg for arg in cmdline(pids["syncloop"]))

    async def run_pod_sandbox() -> grpc.StatusCode:
        target = f"unix://{run_dir / 'cri' / 'status-reporter.sock'}"
        async with grpc.aio.insecure_channel(target) as channel:
            call = channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox", None, None)
            try:
                await call(b"", timeout=10)
            except grpc.aio.AioRpcError as err:
                assert "RunPodSandbox" in (err.details() or "")
                return err.code()
        return grpc.StatusCode.OK

    assert asyncio.run(run_pod_sandbox()) == grpc.StatusCode.PERMISSION_DENIED
    assert "refused CRI call" not in log, "a service was refused a CRI call it makes"


def test_klet_up_runs_examples_supervises_and_stops_cleanly() -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="klet-up-", dir="/tmp"))
    ro_port, healthz_port = free_port(), free_port()
    out = (run_dir / "up.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "klet.cli.main",
            "up",
            "--run-dir",
            str(run_dir),
            "--pod-manifest-path",
            str(ROOT / "examples" / "static-pods"),
            "--read-only-port",
            str(ro_port),
            "--healthz-port",
            str(healthz_port),
            "--hostname-override",
            "upnode",
            # relisting every second (as with no runtime events): the test counts relists
            "--evented-pleg-relist-period",
            "1s",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log = run_dir / "up.log"
    try:

        def pods() -> dict[str, dict]:  # type: ignore[type-arg]
            with urllib.request.urlopen(f"http://127.0.0.1:{ro_port}/pods", timeout=2) as r:
                return {p["metadata"]["name"]: p for p in json.load(r)["items"]}

        wait_for(
            lambda: pods().get("web-upnode", {}).get("status", {}).get("phase") == "Running",
            timeout_s=60,
            what="the example web pod Running",
        )
        text = log.read_text()
        for service in ("pod-source", "syncloop", "status-reporter"):
            # tagged with the service's name, then klog's text line
            klog = r'[IWEF]\d{4} [\d:.]{15} +\d+ \S+:\d+\] ".*"'
            tagged = rf'^{service} *\| {klog} service="{service}"'
            assert re.search(tagged, text, re.M), f"no tagged klog line from {service}"
        pids = {m[0]: int(m[1]) for m in re.findall(r"started (\S+) \(pid (\d+)\)", text)}
        assert set(pids) >= {"pod-source", "syncloop", "status-reporter"}
        # Two glibc malloc arenas per service, not one per thread (gRPC's and asyncio's).
        environ = Path(f"/proc/{pids['syncloop']}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_ARENA_MAX=2" in environ
        # Docstrings not loaded: make setup compiled the optimised bytecode.
        assert b"PYTHONOPTIMIZE=2" in environ
        web_ids = [c["containerID"] for c in pods()["web-upnode"]["status"]["containerStatuses"]]

        assert_readers_reach_the_runtime_through_the_proxy(run_dir, pids, log.read_text())

        os.kill(pids["syncloop"], signal.SIGKILL)
        wait_for(
            lambda: "restarted syncloop" in log.read_text(), timeout_s=20, what="syncloop restarted"
        )
        assert re.search(r"syncloop exited with code -9 .* restarting", log.read_text())
        # The restarted syncloop (same port) adopts the pod: three of its relists pass
        # and no container was replaced.
        port = re.search(r"syncloop: private /healthz /metrics on 127\.0\.0\.1:(\d+)", text)
        assert port is not None, "klet up did not say where syncloop's /metrics is"

        def relists() -> float:
            page = fetch(f"http://127.0.0.1:{port[1]}/metrics")
            return sample_value(page, RELISTS) or 0.0

        wait_for(relists, timeout_s=20, what="the restarted syncloop relisting")
        seen = relists()
        wait_for(lambda: relists() >= seen + 3, timeout_s=15, what="three more relists")
        assert [
            c["containerID"] for c in pods()["web-upnode"]["status"]["containerStatuses"]
        ] == web_ids

        endpoints = json.loads((run_dir / "endpoints.json").read_text())
        assert endpoints["runtime_endpoint"].startswith(f"unix://{run_dir}")
        crictl = subprocess.run(
            [sys.executable, "-m", "klet.cli.main", "crictl", "--run-dir", str(run_dir), "pods"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "web-upnode" in crictl.stdout
        children = [int(m) for m in re.findall(r"pid (\d+)\)", log.read_text())]
        assert_no_secret_on_command_lines([proc.pid, *children], endpoints)
        recorded = [Pidfile(p).read() for p in (run_dir / "stack").glob("*/*.pid")]
        daemon_pids = [r[0] for r in recorded if r is not None]
        assert daemon_pids, "no pid files of the private daemons"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        out.close()
    assert code == 0, log.read_text()[-3000:]
    for pid in children + daemon_pids:
        assert not alive(pid), f"pid {pid} still running after klet up stopped"
    leftovers = subprocess.run(
        ["pgrep", "-f", str(run_dir)], capture_output=True, text=True
    ).stdout.split()
    assert not leftovers, f"processes still naming {run_dir}: {leftovers}"
    shutil.rmtree(run_dir, ignore_errors=True)


def test_external_redis_password_in_the_environment_stays_off_command_lines(
    redis_server: RedisServer, devstack: DevStack, tmp_path: Path
) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="klet-up-", dir="/tmp"))
    # One user for every service, as an operator's simple set-up would have it.
    cred = redis_server.credentials("extnode", "pod-source")
    admin = redis_server.admin
    sock = redis_server.url.removeprefix("unix://")
    env = dict(os.environ, KLET_REDIS_URL=f"unix://{cred.username}:{cred.password}@{sock}")
    log = run_dir / "up.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "klet.cli.main",
                "up",
                "--run-dir",
                str(run_dir),
                "--container-runtime-endpoint",
                devstack.runtime_endpoint,
                "--hostname-override",
                "extnode",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        wait_for(
            lambda: "started image-gc" in log.read_text(), timeout_s=30, what="image-gc started"
        )
        started = re.findall(r"started (\S+) \(pid (\d+)\)", log.read_text())
        pids = [int(pid) for name, pid in started if name != "cri-proxy"]
        assert pids, "klet up named no service pid"
        password_file = run_dir / "secrets" / "redis-password"
        assert password_file.read_text().strip() == cred.password
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
        for pid in pids:
            argv = cmdline(pid)
            # A service that exited (and was restarted) leaves no argv: say why it went.
            assert argv, f"service pid {pid} is gone; klet up's log:\n{log.read_text()}"
            assert not any(cred.password in arg for arg in argv), f"password on {pid}'s argv"
            assert argv[argv.index("--redis-password-file") + 1] == str(password_file)
            assert argv[argv.index("--redis-url") + 1] == f"unix://{sock}"
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert not any(e.startswith(b"KLET_REDIS_URL=") for e in environ)
        # pod-source did connect with it: its lease is on the bus.
        wait_for(
            lambda: (
                not redis_command(
                    Path(sock), "KEYS", "klet:extnode:lease:pod-source*", auth=admin
                ).startswith(b"*0")
            ),
            timeout_s=30,
            what="pod-source's lease on the external Redis",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]
    shutil.rmtree(run_dir, ignore_errors=True)
