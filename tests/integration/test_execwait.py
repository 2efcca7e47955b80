"""Why a container stopped moments after its start read "exit code 2", against real runc.

runc's init waits, as PID 1 of the container's PID namespace, until `runc start` lets
it exec the command. A SIGTERM that reaches it before the exec is caught by its Go
runtime, which cannot die of it (the kernel ignores a default-action signal on a
namespace's init) and exits 2: a code the command never returned. This file shows that
on real runc, that execwait tells the waiting init from the command (`runc:[2:INIT]`),
and that a stop which waits with `wait_for_exec` reaches the command, which then exits
as it chose to (143 from its TERM trap).

The runc part runs in a child process that makes itself a child subreaper, so it can
read the exit status of the container's process (runc detaches it). test_cri_client.py
shows that containerd gives the PID execwait reads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import asyncio, ctypes, json, os, subprocess, sys
from klet.syncloop.containers import execwait

ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
root, bundle = sys.argv[1], sys.argv[2]
runc = ["runc", "--root", root]


def create(name):
    subprocess.run(runc + ["create", "--bundle", bundle, name], stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    state = subprocess.run(runc + ["state", name], capture_output=True, check=True).stdout
    return json.loads(state)["pid"]


def kill_and_reap(name, pid):
    subprocess.run(runc + ["kill", name, "TERM"], check=True)
    _, status = os.waitpid(pid, 0)
    subprocess.run(runc + ["delete", "--force", name], check=True)
    return os.waitstatus_to_exitcode(status)


out = {}
pid = create("early")
out["early_comm"] = execwait.read_comm(pid)
out["early_exit"] = kill_and_reap("early", pid)

pid = create("late")


class Pids:
    async def container_pid(self, container_id):
        return pid


async def stop_after_exec():
    async def start_later():
        await asyncio.sleep(0.3)
        await asyncio.to_thread(subprocess.run, runc + ["start", "late"], check=True)

    starter = asyncio.create_task(start_later())
    execd = await execwait.wait_for_exec(Pids(), "late", limit_s=10)
    await starter
    return execd


out["late_waited"] = asyncio.run(stop_after_exec())
out["late_comm"] = execwait.read_comm(pid)
out["late_exit"] = kill_and_reap("late", pid)
print(json.dumps(out))
"""


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    if shutil.which("runc") is None:
        pytest.fail("runc is not installed (tools/setup.sh installs it)")
    busybox = shutil.which("busybox")
    assert busybox is not None, "busybox-static is not installed"
    rootfs = tmp_path / "bundle" / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy(busybox, rootfs / "bin" / "busybox")
    for applet in ("sh", "sleep"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    for d in ("proc", "dev", "sys", "tmp"):
        (rootfs / d).mkdir()
    subprocess.run(["runc", "spec"], cwd=rootfs.parent, check=True)
    spec_file = rootfs.parent / "config.json"
    spec = json.loads(spec_file.read_text())
    spec["process"]["terminal"] = False
    # PID 1 ignores a SIGTERM it has no handler for: the command traps it.
    spec["process"]["args"] = ["/bin/sh", "-c", "trap 'exit 143' TERM; sleep 60 & wait"]
    spec_file.write_text(json.dumps(spec))
    return rootfs.parent


def test_a_stop_before_the_exec_exits_2_and_waiting_for_the_exec_reaches_the_command(
    bundle: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "runc-root"), str(bundle)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # The defect: SIGTERM on the waiting init, "exit code 2".
    assert out["early_comm"] == "runc:[2:INIT]"
    assert out["early_exit"] == 2
    # The fix: the stop waits for the exec, the command gets the signal.
    assert out["late_waited"] is True
    assert out["late_comm"] == "sh"
    assert out["late_exit"] == 143
