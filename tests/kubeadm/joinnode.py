"""A second node for tests/kubeadm: `kubeadm join` with klet as its kubelet, in a mount and
network namespace of its own (`unshare --mount --net`, started by the test, which moves
one end of its veth pair in here).

The namespace is cloned from the first node's, so the node's directories (/etc/kubernetes,
/var/lib/kubelet, /var/lib/etcd, /run/klet, /var/log/pods, /var/log/containers) get a
tmpfs each: the first node's files are not seen and nothing is left. The node has its own
dev stack (containerd, registry with the test images, kubeadm's pause image and its
kube-proxy image, built by tools/kubeadm/images.py from the binary the first node's test
built, so the kube-proxy DaemonSet's pod runs here too) and starts the kubelet as systemd
would once kubeadm join has written its files, like the first node. It prints `JOINED
<exit code>` (then kubeadm's output) and keeps the node running until its stdin closes;
then it stops the kubelet and the stack.

    python -m tests.kubeadm.joinnode KUBEADM JOIN_COMMAND_FILE PAUSE_IMAGE NODE ADDRESS \
        KUBE_PROXY_BINARY KUBE_PROXY_TAG CACHE
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from klet.devstack import DevStack

from tests.harness.systemd_unit import exec_start_argv
from tests.kubeadm.kubeadmnode import stop
from tools.kubeadm.images import Plan, build_images, push_images

PKG = Path(__file__).resolve().parents[2] / "packaging" / "kubelet"
VETH = "kadm1"
NODE_DIRS = (
    "/etc/kubernetes",
    "/var/lib/kubelet",
    "/var/lib/etcd",
    "/run/klet",
    "/var/log/pods",
    "/var/log/containers",
)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _read(path: str) -> str | None:
    p = Path(path)
    return p.read_text() if p.exists() else None


def main(argv: list[str]) -> int:
    kubeadm, join_file, pause_ref, node, address, proxy_binary, proxy_tag, cache = argv
    deadline = time.monotonic() + 30
    while subprocess.run(["ip", "link", "show", VETH], capture_output=True).returncode:
        if time.monotonic() > deadline:
            print(f"JOINED none: no {VETH} moved into this namespace", flush=True)
            return 1
        time.sleep(0.1)
    _run("ip", "link", "set", "lo", "up")
    _run("ip", "addr", "add", f"{address}/24", "dev", VETH)
    _run("ip", "link", "set", VETH, "up")
    _run("ip", "route", "add", "default", "dev", VETH)
    for d in NODE_DIRS:
        os.makedirs(d, exist_ok=True)
        _run("mount", "-t", "tmpfs", "tmpfs", d)
    with open("/etc/hosts", "a") as hosts:
        hosts.write(f"{address} {node}\n")
    top = Path(tempfile.mkdtemp(prefix="klet-kubeadm-join-", dir="/tmp"))
    stack = DevStack(top / "stack")
    kubelet: subprocess.Popen[bytes] | None = None
    try:
        stack.start()
        images = build_images(
            Plan(
                binaries={"kube-proxy": (Path(proxy_binary), proxy_tag)},
                pause_tag=pause_ref.rpartition(":")[2],
            ),
            cache=Path(cache),
        )
        push_images(images, stack.registry_address)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("KLET_")},
            "KLET_HOME": sys.prefix,
        }
        join_args = Path(join_file).read_text().split()[2:]  # after "kubeadm join"
        log = top / "join.log"
        with log.open("w") as out:
            join = subprocess.Popen(
                [kubeadm, "join", *join_args, "--cri-socket", stack.runtime_endpoint,
                 "--node-name", node],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            )  # fmt: skip
        written = ("/var/lib/kubelet/config.yaml", "/var/lib/kubelet/kubeadm-flags.env")
        while join.poll() is None and not all(Path(p).exists() for p in written):
            time.sleep(0.2)
        units = [(PKG / "kubelet.service").read_text(), (PKG / "10-kubeadm.conf").read_text()]
        with (top / "kubelet.log").open("w") as out:
            kubelet = subprocess.Popen(
                exec_start_argv(units, _read),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )  # fmt: skip
        try:
            code = join.wait(timeout=300)
        except subprocess.TimeoutExpired:
            join.kill()
            code = join.wait()
        print(f"JOINED {code}", flush=True)
        print(log.read_text()[-3000:], flush=True)
        if code != 0:
            print((top / "kubelet.log").read_text()[-4000:], flush=True)
        sys.stdin.read()
        return 0
    finally:
        if kubelet is not None:
            stop(kubelet)
        stack.stop()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
