"""A private containerd (1.6, Debian's) serving CRI v1 on a socket of its own.

Its configuration is containerd 1.6's (version 2); given CDI spec directories it is
containerd v2's instead (version 3, CDI on), which the DRA tier's containerd v2 build
runs (tests/harness/dra.py): one writer, so the two stacks differ only where the
versions do.

Everything containerd and its shims write goes under the stack's directory: root,
state (with the pods' network namespaces, via ``netns_mounts_under_state_dir``), the
runc state root, the CNI configuration and IPAM store, and the registry host
configuration. The one exception is containerd 1.6's hard-coded shim socket directory
``/run/containerd/s``, whose entries are hashed with our socket address and so never
collide with a system instance.

Settings this host needs (see HOST_NOTES.md): ``restrict_oom_score_adj`` because
negative oom_score_adj is refused, cgroupfs rather than systemd cgroups (there is no
systemd here; ``systemd_cgroup`` turns runc's ``SystemdCgroup`` on where there is, as in
the systemd tests' node container), huge page limits passed on to runc where the host
has hugetlb (not here), CNI plugins from ``/usr/lib/cni``, and a ``hosts.toml`` per
registry host name so that ``registry.klet.test/...`` is pulled over plain HTTP from
the local registry.

Stopping must leave nothing behind: containerd's shims outlive it on purpose (that is
how real nodes survive a containerd restart), so ``stop`` first kills every task
through ctr, then SIGTERMs containerd, then kills any shim still serving our socket
with its container processes, unmounts whatever remains mounted under the directory and
removes the network's bridge and iptables rules. ``start`` runs the same clean-up for a
previous run of the same directory that did not stop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from klet.cgroups.fs import hugetlb_available
from klet.devstack.cni import CNI_BIN_DIR, CniNetwork
from klet.devstack.images import PAUSE_IMAGE, TEST_REGISTRY_HOST
from klet.devstack.procs import ManagedProcess, Pidfile, StartError, kill_pid, read_cmdline

log = logging.getLogger(__name__)

CONTAINERD_BINARY = "/usr/bin/containerd"
CTR_BINARY = "/usr/bin/ctr"
TEST_HANDLER = "test-handler"
"""The second runtime handler (RuntimeClass tests; upstream e2e's preconfigured one)."""
# The kernel's limit on sun_path, including the terminating NUL.
UNIX_PATH_MAX = 108
_DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
)
_DISABLED_PLUGINS_V2 = (
    *_DISABLED_PLUGINS,
    "io.containerd.snapshotter.v1.erofs",
    # NRI off, so nothing touches the host's /var/run/nri.
    "io.containerd.nri.v1.nri",
)
_MNT_DETACH = 2


class ContainerdError(RuntimeError):
    """A ctr command against the private containerd failed."""


def _q(value: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(value)


class Containerd:
    """One containerd under ``dir``; ``registry_host_map`` maps image registry host
    names to the ``host:port`` of a plain-HTTP registry serving them."""

    binary: str = CONTAINERD_BINARY
    """The daemon to run: Debian's 1.6; a subclass with another configuration format may
    run another build (the DRA tier's containerd v2, tests/harness/dra.py)."""

    def __init__(
        self,
        dir: Path,
        registry_host_map: Mapping[str, str] | None = None,
        sandbox_image: str = PAUSE_IMAGE,
        *,
        log_level: str = "info",
        root_size_bytes: int | None = None,
        socket_dir: Path | None = None,
        systemd_cgroup: bool = False,
        cdi_spec_dirs: tuple[Path, ...] | None = None,
        binary: str | None = None,
    ) -> None:
        """``binary``: the daemon to run instead of the class's (a containerd v2 built by
        tools/dra/build-containerd.sh, with ``cdi_spec_dirs``). ``cdi_spec_dirs``: None
        writes containerd 1.6's configuration (version 2, no CDI); directories write
        containerd v2's (version 3: the CRI plugin split into runtime and images, CDI on
        reading those directories alone, NRI and erofs off), for a ``binary`` that is a
        containerd v2 (the DRA tier's).
        ``systemd_cgroup``: runc's ``SystemdCgroup`` option (containers in systemd
        scopes, for a node with ``cgroupDriver: systemd``; needs systemd as PID 1).
        ``root_size_bytes``: put containerd's root (images, snapshots) on a tmpfs of
        that size, mounted at start and unmounted at stop, so that tests fill the image
        filesystem for real (image GC thresholds); None keeps it on the host's disk.
        ``socket_dir``: where the sockets go (default ``dir``); a directory of their own
        is what a containerized agent mounts, without containerd's root and state (and
        every container's rootfs and network namespace mounted below them)."""
        # Absolute, because the socket path goes into the config and the mount sweep
        # compares against /proc/self/mountinfo.
        self.dir = dir.resolve()
        if binary is not None:
            self.binary = binary
        self.registry_host_map = dict(registry_host_map or {})
        self.sandbox_image = sandbox_image
        self.log_level = log_level
        self.root_size_bytes = root_size_bytes
        self.systemd_cgroup = systemd_cgroup
        self.cdi_spec_dirs = (
            tuple(d.resolve() for d in cdi_spec_dirs) if cdi_spec_dirs is not None else None
        )
        self.socket_dir = socket_dir.resolve() if socket_dir is not None else self.dir
        self.socket = self.socket_dir / "containerd.sock"
        self.ttrpc_socket = self.socket_dir / "containerd.sock.ttrpc"
        self.config_path = dir / "config.toml"
        self.root = dir / "root"
        self.state = dir / "state"
        self.runc_root = dir / "runc"
        self.test_handler_root = dir / TEST_HANDLER  # runc's state under TEST_HANDLER
        self.certs_dir = dir / "certs.d"
        self.network = CniNetwork(dir / "cni")
        self._proc: ManagedProcess | None = None

    @classmethod
    def for_registry(
        cls,
        dir: Path,
        registry_address: str,
        *,
        sandbox_image: str = PAUSE_IMAGE,
        log_level: str = "info",
        root_size_bytes: int | None = None,
        socket_dir: Path | None = None,
        systemd_cgroup: bool = False,
        cdi_spec_dirs: tuple[Path, ...] | None = None,
        binary: str | None = None,
    ) -> Containerd:
        """A containerd that pulls ``registry.klet.test/...`` (and ``registry_address``
        itself) over plain HTTP from the registry at ``registry_address``; ``binary`` and
        ``cdi_spec_dirs`` as for the constructor."""
        hosts = {TEST_REGISTRY_HOST: registry_address, registry_address: registry_address}
        return cls(
            dir,
            hosts,
            sandbox_image,
            log_level=log_level,
            root_size_bytes=root_size_bytes,
            socket_dir=socket_dir,
            systemd_cgroup=systemd_cgroup,
            cdi_spec_dirs=cdi_spec_dirs,
            binary=binary,
        )

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive

    # -- configuration -----------------------------------------------------------

    def config_toml(self) -> str:
        if self.cdi_spec_dirs is not None:
            return self._config_head(3, _DISABLED_PLUGINS_V2) + self._cri_v3(self.cdi_spec_dirs)
        return self._config_head(2, _DISABLED_PLUGINS) + self._cri_v2()

    def _config_head(self, version: int, disabled_plugins: tuple[str, ...]) -> str:
        """What both configuration versions say alike: the private root, state and
        sockets, no debug or metrics listener, and the opt plugin's directory."""
        disabled = ", ".join(_q(p) for p in disabled_plugins)
        return f"""\
version = {version}
root = {_q(str(self.root))}
state = {_q(str(self.state))}
oom_score = 0
disabled_plugins = [{disabled}]

[grpc]
  address = {_q(str(self.socket))}

[ttrpc]
  address = {_q(str(self.ttrpc_socket))}

[debug]
  address = ""
  level = {_q(self.log_level)}

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {_q(str(self.dir / "opt"))}
"""

    def _cri_v2(self) -> str:
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        systemd = "true" if self.systemd_cgroup else "false"
        return f"""
  {cri}]
    sandbox_image = {_q(self.sandbox_image)}
    # This host refuses negative oom_score_adj; without this every sandbox fails.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_tls_streaming = false
    disable_tcp_service = true
    # Huge page limits reach runc where the host has hugetlb (containerd drops them by
    # default), as upstream's node e2e configuration has it. Not on these hosts, which
    # leave it unmounted: containerd 1.6 takes the empty directory for the controller
    # and runc then refuses every container that has a limit (upstream's kubelet sends
    # them whatever the host).
    disable_hugetlb_controller = {"false" if hugetlb_available() else "true"}

  {cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

  {cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

  {cri}.containerd.runtimes.runc.options]
    SystemdCgroup = {systemd}
    Root = {_q(str(self.runc_root))}

  # A second runtime handler, for RuntimeClass: the one upstream's e2e suite expects
  # a node to have preconfigured (PreconfiguredRuntimeClassHandler). It is runc with a
  # state directory of its own, so which handler ran a container can be read back.
  # (crun, Debian's other OCI runtime, refuses this host's hybrid cgroup layout.)
  {cri}.containerd.runtimes.{TEST_HANDLER}]
    runtime_type = "io.containerd.runc.v2"

  {cri}.containerd.runtimes.{TEST_HANDLER}.options]
    SystemdCgroup = {systemd}
    Root = {_q(str(self.test_handler_root))}

  {cri}.cni]
    bin_dir = {_q(CNI_BIN_DIR)}
    conf_dir = {_q(str(self.network.conf_dir))}
    max_conf_num = 1

  {cri}.registry]
    config_path = {_q(str(self.certs_dir))}
"""

    def _cri_v3(self, cdi_spec_dirs: tuple[Path, ...]) -> str:
        runtime = '[plugins."io.containerd.cri.v1.runtime"'
        images = '[plugins."io.containerd.cri.v1.images"'
        cdi_dirs = ", ".join(_q(str(d)) for d in cdi_spec_dirs)
        systemd = "true" if self.systemd_cgroup else "false"
        return f"""
  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_tls_streaming = false
    disable_tcp_service = true

  {images}]
    snapshotter = "overlayfs"

  {images}.pinned_images]
    sandbox = {_q(self.sandbox_image)}

  {images}.registry]
    config_path = {_q(str(self.certs_dir))}

  {runtime}]
    # This host refuses negative oom_score_adj (HOST_NOTES); without it every sandbox fails.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    disable_hugetlb_controller = {"false" if hugetlb_available() else "true"}
    enable_cdi = true
    cdi_spec_dirs = [{cdi_dirs}]

  {runtime}.containerd]
    default_runtime_name = "runc"

  {runtime}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

  {runtime}.containerd.runtimes.runc.options]
    SystemdCgroup = {systemd}
    Root = {_q(str(self.runc_root))}

  {runtime}.containerd.runtimes.{TEST_HANDLER}]
    runtime_type = "io.containerd.runc.v2"

  {runtime}.containerd.runtimes.{TEST_HANDLER}.options]
    SystemdCgroup = {systemd}
    Root = {_q(str(self.test_handler_root))}

  {runtime}.cni]
    bin_dirs = [{_q(CNI_BIN_DIR)}]
    conf_dir = {_q(str(self.network.conf_dir))}
    max_conf_num = 1
"""

    def write_config(self) -> None:
        for path in (self.socket, self.ttrpc_socket):
            if len(os.fsencode(str(path))) >= UNIX_PATH_MAX:
                raise StartError(
                    f"socket path {path} is {len(str(path))} bytes, over the kernel's "
                    f"limit of {UNIX_PATH_MAX - 1}: use a shorter directory"
                )
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_toml())
        for host, address in self.registry_host_map.items():
            host_dir = self.certs_dir / host
            host_dir.mkdir(parents=True, exist_ok=True)
            server = f"http://{address}"
            (host_dir / "hosts.toml").write_text(
                f"server = {_q(server)}\n\n"
                f"[host.{_q(server)}]\n"
                f'  capabilities = ["pull", "resolve"]\n'
            )
        self.network.write()

    # -- lifecycle ---------------------------------------------------------------

    def start(self, *, timeout_s: float = 30.0) -> None:
        self.cleanup_leftovers()
        self.write_config()
        if self.root_size_bytes is not None:
            self._mount_small_root(self.root_size_bytes)
        self._spawn(timeout_s=timeout_s)

    def crash(self) -> None:
        """SIGKILL containerd alone, as a crash would: the shims and the containers they
        run keep running (soak tests restart it with ``recover``)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None

    def recover(self, *, timeout_s: float = 30.0) -> None:
        """Start containerd again on the state a ``crash`` left, without ``start``'s
        clean-up, so it re-adopts the running shims as a restarted daemon does."""
        if self.alive:
            return
        for path in (self.socket, self.ttrpc_socket):
            path.unlink(missing_ok=True)
        self._spawn(timeout_s=timeout_s)

    def _spawn(self, *, timeout_s: float) -> None:
        env = dict(os.environ)
        # containerd finds runc and containerd-shim-runc-v2 through PATH.
        env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        proc = ManagedProcess(
            "containerd",
            [self.binary, "--config", str(self.config_path)],
            dir=self.dir,
            env=env,
        )
        proc.start()
        self._proc = proc
        try:
            proc.wait_ready(self._ready, timeout_s, f"ctr version on {self.socket}")
        except StartError:
            self.stop()
            raise

    def _ready(self) -> bool:
        if not self.socket.exists():
            return False
        return self._ctr_ok(["version"], timeout_s=5.0)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Kill every container, stop containerd, and clean the host up after it."""
        if self.alive:
            self._kill_all_tasks()
        if self._proc is not None:
            self._proc.stop(timeout_s)
            self._proc = None
        self._kill_shims()
        self._unmount_all()
        self.network.cleanup()

    def cleanup_leftovers(self) -> None:
        """Stop what a previous run of this directory left running or mounted."""
        Pidfile(self.dir / "containerd.pid").stop_leftover()
        self._kill_shims()
        self._unmount_all()
        self.network.cleanup()
        for path in (self.socket, self.ttrpc_socket):
            path.unlink(missing_ok=True)

    def _mount_small_root(self, size: int) -> None:
        # The clean-up sweep (stop, or the next start) unmounts it with everything else
        # under the directory, deepest first, so the overlay mounts inside go before it.
        self.root.mkdir(parents=True, exist_ok=True)
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        options = f"size={size},mode=0711".encode()
        if libc.mount(b"tmpfs", os.fsencode(str(self.root)), b"tmpfs", 0, options) != 0:
            err = ctypes.get_errno()
            raise StartError(f"cannot mount a tmpfs on {self.root}: {os.strerror(err)}")

    # -- ctr ---------------------------------------------------------------------

    def ctr(
        self, args: list[str], *, namespace: str | None = "k8s.io", timeout_s: float = 120.0
    ) -> str:
        """Run ctr against this containerd; raise ContainerdError on failure."""
        argv = [CTR_BINARY, "--address", str(self.socket)]
        if namespace is not None:
            argv += ["--namespace", namespace]
        argv += args
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ContainerdError(f"{' '.join(argv)}: {exc}") from exc
        if res.returncode != 0:
            raise ContainerdError(
                f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()[-2000:]}"
            )
        return res.stdout

    def _ctr_ok(self, args: list[str], *, timeout_s: float) -> bool:
        try:
            self.ctr(args, namespace=None, timeout_s=timeout_s)
        except ContainerdError:
            return False
        return True

    def import_image(self, oci_archive_path: Path) -> None:
        """Import an OCI archive into the CRI namespace (k8s.io), unpacked."""
        self.ctr(["images", "import", "--all-platforms", str(oci_archive_path)])

    def list_images(self) -> list[str]:
        return self.ctr(["images", "ls", "-q"]).split()

    # -- clean-up ----------------------------------------------------------------

    def _kill_all_tasks(self) -> None:
        """SIGKILL each task's init process, then delete the tasks once stopped. Not
        `tasks delete --force`: that kills through runc's `kill --all`, which freezes
        the container's cgroup first, and with runc's systemd cgroup driver in a
        container (the systemd tier's node) the freeze never completes and ctr hangs
        until its timeout. A task whose init dies goes with its PID namespace."""
        try:
            namespaces = self.ctr(["namespaces", "ls", "-q"], namespace=None, timeout_s=10).split()
            for ns in namespaces:
                tasks = self.ctr(["tasks", "ls", "-q"], namespace=ns, timeout_s=10).split()
                if not tasks:
                    continue
                log.info("killing leftover tasks namespace=%s count=%d", ns, len(tasks))
                for task in tasks:
                    try:
                        kill = ["tasks", "kill", "--signal", "SIGKILL", task]
                        self.ctr(kill, namespace=ns, timeout_s=10)
                    except ContainerdError as exc:
                        log.warning("could not kill task %s: %s", task, exc)
                deadline = time.monotonic() + 10.0
                while tasks and time.monotonic() < deadline:
                    listing = self.ctr(["tasks", "ls"], namespace=ns, timeout_s=10)
                    stopped = {
                        fields[0]
                        for fields in (line.split() for line in listing.splitlines()[1:])
                        if fields and fields[-1] == "STOPPED"
                    }
                    listed = set(listing.split())
                    # containerd's CRI plugin deletes the tasks that exited itself.
                    tasks = [t for t in tasks if t in listed]
                    for task in [t for t in tasks if t in stopped]:
                        tasks.remove(task)
                        try:
                            self.ctr(["tasks", "delete", task], namespace=ns, timeout_s=10)
                        except ContainerdError as exc:
                            if "not found" not in str(exc):  # CRI was first after all
                                raise
                    if tasks:
                        time.sleep(0.2)
        except ContainerdError as exc:
            # The shim sweep after containerd stops catches whatever this missed.
            log.warning("could not kill tasks through ctr: %s", exc)

    def _shim_pids(self) -> list[int]:
        address = str(self.socket)
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            argv = read_cmdline(int(entry.name))
            if not argv or "containerd-shim" not in os.path.basename(argv[0]):
                continue
            if "-address" in argv and argv[argv.index("-address") + 1 :][:1] == [address]:
                pids.append(int(entry.name))
        return pids

    def _kill_shims(self) -> None:
        shims = self._shim_pids()
        if not shims:
            return
        children = _children_map()
        for shim in shims:
            victims = _descendants(shim, children)
            log.warning("killing leftover shim pid=%d with %d processes", shim, len(victims))
            # Container processes first: a shim that dies first orphans them to init.
            for pid in reversed(victims):
                kill_pid(pid, timeout_s=0.5)
            kill_pid(shim, timeout_s=2.0)

    def _unmount_all(self) -> None:
        unmount_under(self.dir)


def unmount_under(dir: Path) -> None:
    """Detach every mount below `dir` (not `dir` itself), deepest first."""
    prefix = str(dir.resolve()) + "/"
    targets = [m for m in _mount_points() if m.startswith(prefix)]
    if not targets:
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    # Deepest first, and for equal depth the most recent mount first.
    for target in sorted(reversed(targets), key=lambda m: m.count("/"), reverse=True):
        if libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            log.warning("umount failed target=%s error=%s", target, os.strerror(err))


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            # mountinfo escapes space, tab, newline and backslash as octal.
            points.append(fields[4].encode().decode("unicode_escape"))
    return points


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _descendants(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    """All descendants of ``pid``, parents before children."""
    out: list[int] = []
    queue = list(children.get(pid, []))
    while queue:
        p = queue.pop(0)
        out.append(p)
        queue.extend(children.get(p, []))
    return out
