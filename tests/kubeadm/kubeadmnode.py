"""The first kubeadm node of tests/kubeadm, shared by the full test (test_kubeadm_init.py)
and the smoke (test_kubeadm_smoke.py): the namespace's network and overlays, the kubelet
as systemd would start it from the klet-kubelet package, kubectl with kubeadm's admin
kubeconfig, and kubeadm init up to its success.

Both modules run inside a private mount and network namespace (`unshare --mount --net`,
see test_kubeadm_init.py's docstring): the overlays over OVERLAID keep what kubeadm and
klet write away from the host, and the node's veth pair goes with the module (a second
module in the same namespace makes its own).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from klet.devstack import DevStack
from klet.syncloop.volumes.fs import mounts_under

from tests.harness.systemd_unit import exec_start_argv
from tests.harness.waiting import wait_for
from tools.kubeadm.images import Plan, prepare, push_images

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "packaging" / "kubelet"
NODE = "kadm1"
ADDRESS = "10.254.0.10"
# /usr/lib: kube-proxy's DaemonSet mounts /lib/modules (-> /usr/lib/modules), which this
# host lacks and containerd creates
OVERLAID = ("/etc", "/var/lib", "/var/log", "/run", "/usr/bin", "/usr/lib")
CACHE = Path(os.environ.get("KLET_CACHE", "/var/cache/klet"))


def isolated() -> bool:
    """This process's mount and network namespaces are not its parent's (unshare execs
    pytest, so the parent is the shell that ran it)."""
    own = [os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "net")]
    outer = [os.readlink(f"/proc/{os.getppid()}/ns/{n}") for n in ("mnt", "net")]
    return all(a != b for a, b in zip(own, outer, strict=True))


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def node_host(top: Path) -> Iterator[Path]:
    """The namespace's network (lo, a veth end with ADDRESS, a default route) and the
    overlays over OVERLAID, their upper directories under `top`; undone at the end."""
    run("ip", "link", "set", "lo", "up")
    # a veth pair, both ends here (this kernel has no dummy driver): kadm0 holds ADDRESS
    run("ip", "link", "add", "kadm0", "type", "veth", "peer", "name", "kadm1")
    mounted: list[str] = []
    try:
        run("ip", "addr", "add", f"{ADDRESS}/24", "dev", "kadm0")
        run("ip", "link", "set", "kadm1", "up")
        run("ip", "link", "set", "kadm0", "up")
        run("ip", "route", "add", "default", "dev", "kadm0")
        for i, point in enumerate(OVERLAID):
            upper, work = top / f"o{i}" / "upper", top / f"o{i}" / "work"
            upper.mkdir(parents=True)
            work.mkdir()
            options = f"lowerdir={point},upperdir={upper},workdir={work}"
            run("mount", "-t", "overlay", "overlay", "-o", options, point)
            mounted.append(point)
        # the package's files where it puts them; the node's name resolves, as kubeadm's
        # preflight asks (a 10 s DNS timeout otherwise)
        shutil.copy2(PKG / "kubelet", "/usr/bin/kubelet")
        with open("/etc/hosts", "a") as hosts:
            hosts.write(f"{ADDRESS} {NODE}\n")
        yield top
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        # deleting one end deletes the pair (unless the join test moved kadm1 away)
        subprocess.run(["ip", "link", "del", "kadm0"], capture_output=True, check=False)


def new_top() -> Path:
    return Path(tempfile.mkdtemp(prefix="klet-kubeadm-", dir="/tmp"))


def kubelet_argv() -> list[str]:
    """The ExecStart systemd would run now: the unit and kubeadm's drop-in with the env
    files as kubeadm wrote them."""

    def read(path: str) -> str | None:
        p = Path(path)
        return p.read_text() if p.exists() else None

    units = [(PKG / "kubelet.service").read_text(), (PKG / "10-kubeadm.conf").read_text()]
    return exec_start_argv(units, read)


def kubectl(binary: Path, *args: str, stdin: str | None = None) -> str:
    res = subprocess.run(
        [str(binary), "--kubeconfig", "/etc/kubernetes/admin.conf", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if res.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def stop(kubelet: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as `systemctl stop kubelet` sends it; SIGKILL to the group after 90 s."""
    if kubelet.poll() is not None:
        return
    kubelet.send_signal(signal.SIGTERM)
    try:
        kubelet.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(kubelet.pid, signal.SIGKILL)
        kubelet.wait()


def kubeadm_env() -> dict[str, str]:
    """klet's Python environment is this one (the package's /opt/klet), for kubeadm's
    `kubelet --version` and for the unit."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("KLET_")},
        "KLET_HOME": sys.prefix,
    }


def reset_leaves_nothing(kubeadm: Path, cri_socket: str, *, cleanup_tmp_dir: bool) -> None:
    """`kubeadm reset --force` over `cri_socket` (the kubelet stopped first, as systemd
    would) must pass and leave no file under kubeadm's, the kubelet's and etcd's
    directories and nothing mounted under /var/lib/kubelet. `cleanup_tmp_dir` also
    removes /etc/kubernetes/tmp (an upgrade's backups), which reset leaves unless asked."""
    extra = ["--cleanup-tmp-dir"] if cleanup_tmp_dir else []
    reset = subprocess.run(
        [str(kubeadm), "reset", "--force", *extra, "--cri-socket", cri_socket],
        env=kubeadm_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert reset.returncode == 0, reset.stdout + reset.stderr
    left = {
        d: sorted(str(p) for p in Path(d).rglob("*") if not p.is_dir())
        for d in ("/etc/kubernetes", "/var/lib/kubelet", "/var/lib/etcd")
    }
    assert left == {d: [] for d in left}
    assert mounts_under(Path("/var/lib/kubelet")) == []


@dataclass
class Initialized:
    """A node kubeadm init brought up: kubeadm, kubectl, the images' plan, the kubelet
    (systemd's part: the test stops it), the work directory with the logs."""

    kubeadm: Path
    kubectl: Path
    plan: Plan
    kubelet: subprocess.Popen[bytes]
    work: Path


def init(
    stack: DevStack,
    work: Path,
    *,
    skip_phases: tuple[str, ...],
    addons: bool,
    encryption_algorithm: str | None = None,
) -> Initialized:
    """Build and push kubeadm's images (kube-proxy's and coredns's only with `addons`),
    run `kubeadm init` (its keys of `encryption_algorithm`, else kubeadm's default
    RSA-2048) skipping `skip_phases`, start
    the kubelet once kubeadm's kubelet-start phase has written its files (when systemd,
    Restart=always, would have it running) and wait for init's success. On a failure the
    kubelet started is stopped and the assertion names both logs."""
    # kubeadm forces rotateCertificates: true with the kubelet.conf init writes (the node's
    # pair embedded): klet seeds --cert-dir's store from it, as upstream does
    kubeadm, config, plan, images = prepare(
        cache=CACHE,
        work=work,
        addons=addons,
        encryption_algorithm=encryption_algorithm,
        advertise_address=ADDRESS,
        node_name=NODE,
        cri_socket=stack.runtime_endpoint,
        cgroup_driver="cgroupfs",
    )
    push_images(images, stack.registry_address)
    init_log, kubelet_log = work / "kubeadm-init.log", work / "kubelet.log"
    argv = [str(kubeadm), "init", "--config", str(config), "--v=1"]
    if skip_phases:
        argv += ["--skip-phases", ",".join(skip_phases)]
    env = kubeadm_env()
    with init_log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    kubelet: subprocess.Popen[bytes] | None = None
    try:
        written = ("/var/lib/kubelet/config.yaml", "/var/lib/kubelet/kubeadm-flags.env")
        wait_for(
            lambda: all(Path(p).exists() for p in written) or proc.poll() is not None,
            timeout_s=180,
            what="kubeadm's kubelet-start phase",
        )
        assert proc.poll() is None, init_log.read_text()[-4000:]
        kubelet_cmd = kubelet_argv()
        assert kubelet_cmd[0] == "/usr/bin/kubelet"
        with kubelet_log.open("w") as out:
            kubelet = subprocess.Popen(
                kubelet_cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        try:
            code = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        text = init_log.read_text()
        assert code == 0, (
            f"kubeadm init exited {code}:\n{text[-5000:]}\n--- kubelet:\n"
            f"{kubelet_log.read_text()[-5000:]}"
        )
        assert "Your Kubernetes control-plane has initialized successfully!" in text
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if kubelet is not None:
            stop(kubelet)
        raise
    return Initialized(kubeadm, kubeadm.parent / "kubectl", plan, kubelet, work)
