"""Benchmark: pod start and deletion with PVC and CSI volumes, klet beside the upstream kubelet.

Run as root with ``make bench-volumes`` (``.venv/bin/python bench/volumes.py``). Both
agents join one real control plane (``klet.testbed.cluster.ControlPlane`` with
kube-controller-manager and kube-scheduler: the PV binder, the PV/PVC protection and
ephemeral-volume controllers) as two nodes, each on a containerd of its own (the
kubelet kills every pod its runtime has that it does not know):

- klet: ``klet up`` (bench/memory.py's agent: private root, cert and log dirs) with
  ``ControlPlane.node_flags`` (node kubeconfig, serving certificate, client CA);
- upstream: the kubelet v1.34 of ``tools/cluster/build.sh --with-kubelet``, with
  bench/compare.py's KubeletConfiguration plus the same node flags.

Both nodes get the host's address as ``--node-ip`` (the kubelet refuses a loopback one).

CSI: one csi-mock per node (the storage e2e suite's mock driver, tools/csi), registered
through that node's ``<root-dir>/plugins_registry`` by upstream's csi-node-driver-registrar
v2.13.0 beside it (tools/csi builds it from its release sources; without them the bench
stops before starting anything, naming the directory), with its own driver name,
CSIDriver object (no attach, pod info on mount, Persistent and Ephemeral), StorageClass
(Immediate binding) and csi-provisioner. Two driver names, not one: csi-mock keeps its
volumes in the memory of one process, so a claim must be provisioned by the provisioner of
the very mock that the node publishes through, and two provisioners of one driver name
would both act on every claim of its class.

Each round (``VOLUMES_ROUNDS``, default 30) runs every workload on one agent, then on the
other, which one first alternating by round, so machine noise hits both; an untimed
warm-up round comes first (``VOLUMES_WARMUP``, 1). A round's claims are made before its
first pod and deleted (and their PVs gone) after its last, all untimed. The workloads, one
pod each (bench/run.py's busybox ``sleep`` that exits on SIGTERM, the volume mounted at
/data, ``spec.nodeName`` set to the agent's node, terminationGracePeriodSeconds 30):

1. ``emptyDir``: the baseline;
2. ``PVC``: a claim of the node's StorageClass, provisioned and Bound before the pod is
   created (untimed), so what is timed is the node's part: claim and PV lookup,
   NodeStageVolume, NodePublishVolume;
3. ``inline CSI``: an inline ephemeral CSI volume of the node's driver (NodePublishVolume
   only, no stage).

Timed per pod: the API POST of the pod -> a watch event shows it Running with its
container ready; the API DELETE (graceful) -> the watch's DELETED event (the agent stops
the container, unpublishes and unstages, and deletes the object with grace 0); the
agent's CPU-seconds from the POST until the object is gone (klet: klet up and all its
children, the five services and Redis; upstream: the kubelet process). For the CSI pods
also when csi-mock logged each Node call's return (its ``gRPCCall`` lines, -v=3) after
the POST or the DELETE. The watch runs in a thread of this process, on a connection of
its own, and stamps each event when it arrives. Over all timed rounds: each agent's
CPU-seconds, in all and per process.

Everything it starts (control plane, containerds, registry, Redis, both agents, the CSI
processes) is stopped by PID on exit, error, Ctrl-C or SIGTERM; then what is mounted under
the run dir is unmounted, the kubelet's cgroup root removed, its sysctls restored, and the
run dir (a short one under /tmp) removed unless ``--keep``.

Prints one table (medians, p95 when a row has 20 samples or more, else the max, and the
ratio klet/upstream of the medians), writes ``bench/results/volumes-latest.json`` (every
sample, with the watch's event trace) and, with ``--readme``, replaces the measured table
in bench/README.md between the volumes markers.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import functools
import http.client
import json
import platform
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from klet.devstack import BUSYBOX_IMAGE, DevStack, ManagedProcess  # noqa: E402
from klet.devstack.containerd import Containerd, unmount_under  # noqa: E402
from klet.devstack.procs import read_cmdline  # noqa: E402
from klet.testbed.cluster import ControlPlane  # noqa: E402
from klet.testbed.pki import CertPair  # noqa: E402

from bench import common, compare  # noqa: E402
from bench.compare import (  # noqa: E402
    CLK_TCK,
    Agent,
    Row,
    UpstreamAgent,
    Workloads,
    env_int,
    kubelet_binary,
    make_cgroup_root,
    read_sysctls,
    remove_cgroups,
    restore_sysctls,
    second_containerd,
)
from bench.memory import MemoryAgent, control_plane_bin, process_name  # noqa: E402
from bench.run import COMMAND, machine, pod_ready  # noqa: E402
from tests.harness.csi import csi_binaries, release_sources_missing  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "volumes-latest.json"
README = ROOT / "bench" / "README.md"
README_BEGIN = "<!-- volumes:begin -->"
README_END = "<!-- volumes:end -->"
NAMESPACE = "bench-vol"
# The kubelet's pods' cgroup root (klet's are under /kubepods); removed at the end.
CGROUP_ROOT = "/klet-bench-volumes"
GRACE_S = 30  # > 0: a pod deleted with grace 0 would leave the API at once, agent or not
POD_TIMEOUT_S = 120.0
SETUP_TIMEOUT_S = 180.0
P95_MIN_SAMPLES = 20
KINDS = ("emptydir", "pvc", "inline")
KIND_LABELS = {"emptydir": "emptyDir", "pvc": "PVC (bound)", "inline": "inline CSI"}
# The CSI Node calls timed per kind, after the POST and after the DELETE.
CSI_AFTER_CREATE = {
    "pvc": ("NodeStageVolume", "NodePublishVolume"),
    "inline": ("NodePublishVolume",),
}
CSI_AFTER_DELETE = {
    "pvc": ("NodeUnpublishVolume", "NodeUnstageVolume"),
    "inline": ("NodeUnpublishVolume",),
}


# -- the apiserver: requests and a pod watch -------------------------------------------------


class Api:
    """Plain HTTPS requests to the apiserver as an admin client certificate, over one
    kept-alive connection (a TLS handshake per request would land inside the timings)."""

    def __init__(self, cp: ControlPlane, cert: CertPair) -> None:
        self.port = cp.port
        self.ctx = ssl.create_default_context(cafile=str(cp.ca_file))
        self.ctx.load_cert_chain(str(cert.cert), str(cert.key))
        self._conn: http.client.HTTPSConnection | None = None

    def connect(self, timeout_s: float | None = 30.0) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self.ctx, timeout=timeout_s
        )

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, decoded JSON body); one retry on a fresh connection if the kept one
        was closed by the server."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = self.connect()
            try:
                self._conn.request(method, path, body=data, headers=headers)
                resp = self._conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
                continue
            return resp.status, json.loads(raw) if raw else None
        raise AssertionError("unreachable")

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, out = self.call(method, path, body)
        if status >= 300:
            raise OSError(f"{method} {path}: {status} {out}")
        return out

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


Event = tuple[float, str, dict[str, Any]]  # (perf_counter at arrival, type, pod)


class PodWatch:
    """A watch of the namespace's pods in a thread; every event stamped on arrival.

    If the stream ends (the apiserver's watch timeout, an error) it lists again and
    resumes from there, noting pods that went meanwhile as DELETED at that time."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.events: dict[str, list[Event]] = {}
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._conn: http.client.HTTPSConnection | None = None
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=10)

    def _add(self, t: float, kind: str, pod: dict[str, Any]) -> None:
        with self.cond:
            self.events.setdefault(pod["metadata"]["name"], []).append((t, kind, pod))
            self.cond.notify_all()

    def _relist(self, known: set[str]) -> str:
        conn = self.api.connect()
        try:
            conn.request("GET", self.path, headers={"Accept": "application/json"})
            listed = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        t = time.perf_counter()
        names = set()
        for pod in listed.get("items") or []:
            names.add(pod["metadata"]["name"])
            self._add(t, "LISTED", pod)
        for gone in known - names:
            self._add(t, "DELETED", {"metadata": {"name": gone}})
        return str(listed["metadata"]["resourceVersion"])

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self.cond:
                    known = {n for n, evs in self.events.items() if evs[-1][1] != "DELETED"}
                rv = self._relist(known)
                self._conn = conn = self.api.connect(timeout_s=None)
                conn.request(
                    "GET",
                    f"{self.path}?watch=1&resourceVersion={rv}&timeoutSeconds=3600",
                    headers={"Accept": "application/json"},
                )
                resp = conn.getresponse()
                for line in resp:
                    t = time.perf_counter()
                    ev = json.loads(line)
                    if ev.get("type") == "ERROR":  # e.g. 410 Gone: list again
                        break
                    self._add(t, str(ev["type"]), ev["object"])
                conn.close()
        except (OSError, ValueError, http.client.HTTPException) as err:
            if not self._stop.is_set():
                with self.cond:
                    self.error = err
                    self.cond.notify_all()

    def wait(
        self,
        name: str,
        pred: Callable[[str, dict[str, Any]], bool],
        *,
        since: float,
        timeout_s: float = POD_TIMEOUT_S,
    ) -> float:
        """The arrival time of the first event of ``name`` at or after ``since`` that
        satisfies ``pred``; TimeoutError when none came in time."""
        deadline = time.perf_counter() + timeout_s
        seen = 0
        with self.cond:
            while True:
                evs = self.events.get(name, [])
                for t, kind, pod in evs[seen:]:
                    if t >= since and pred(kind, pod):
                        return t
                seen = len(evs)
                if self.error is not None:
                    raise OSError(f"pod watch failed: {self.error!r}")
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {name}")
                self.cond.wait(left)

    def trace(self, name: str, since: float) -> list[list[Any]]:
        """The events of ``name`` since ``since``: [seconds after, type, phase, ready]."""
        with self.cond:
            evs = list(self.events.get(name, []))
        return [
            [round(t - since, 4), kind, pod.get("status", {}).get("phase"), pod_ready(pod)]
            for t, kind, pod in evs
            if t >= since
        ]


# -- csi-mock's log --------------------------------------------------------------------------


def csi_calls(log_text: str, *, year: int) -> list[tuple[float, str]]:
    """(wall-clock time, method) of every CSI call a csi-mock -v=3 log records; klog's
    header (``I1127 14:36:06.701515 ...``) is the host's local time, without the year."""
    out = []
    for line in log_text.splitlines():
        _, sep, rest = line.partition('gRPCCall: {"Method":"')
        if not sep or len(line) < 21:
            continue
        stamp = dt.datetime.strptime(f"{year}{line[1:21]}", "%Y%m%d %H:%M:%S.%f")
        out.append((stamp.timestamp(), rest.partition('"')[0].rsplit("/", 1)[-1]))
    return out


def first_after(calls: Sequence[tuple[float, str]], method: str, t: float) -> float | None:
    """Seconds from wall time ``t`` to the first ``method`` call logged after it."""
    return next((c - t for c, m in calls if m == method and c >= t), None)


# -- the nodes ----------------------------------------------------------------------------------


class KletNode(MemoryAgent):
    """``klet up`` joined to the plane (bench/memory.py's agent with the node flags)."""


class KubeletNode(UpstreamAgent):
    """bench/compare's kubelet with the node flags, its pods under a cgroup root of this
    bench's own."""

    def __init__(
        self, dir: Path, node_name: str, endpoint: str, binary: Path, extra: Sequence[str]
    ) -> None:
        super().__init__(dir, node_name, endpoint, binary)
        self.extra = list(extra)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "cgroupRoot": CGROUP_ROOT}

    def argv(self) -> list[str]:
        return [*super().argv(), *self.extra]


@dataclasses.dataclass
class Node:
    """One agent under test with its CSI driver, StorageClass and provisioner."""

    agent: Agent
    driver: str
    mock: ManagedProcess | None = None
    registrar: ManagedProcess | None = None
    provisioner: ManagedProcess | None = None

    @property
    def side(self) -> str:
        return self.agent.name

    @property
    def root_dir(self) -> Path:
        return self.agent.dir / "root"


def host_ip() -> str:
    """The address this host routes from (the interface of the default route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        # No packet is sent: connect only picks the route (to a TEST-NET-3 address).
        s.connect(("203.0.113.1", 9))
        return str(s.getsockname()[0])


def csi_objects(driver: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": driver},
            "spec": {
                "attachRequired": False,
                "podInfoOnMount": True,
                "volumeLifecycleModes": ["Persistent", "Ephemeral"],
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": driver},
            "provisioner": driver,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        },
    ]


def start_csi(node: Node, cp: ControlPlane, binaries: Mapping[str, Path], dir: Path) -> None:
    """csi-mock, csi-node-driver-registrar registering it with the node's plugin watcher,
    and its provisioner."""
    registry = node.root_dir / "plugins_registry"
    registry.mkdir(parents=True, exist_ok=True)
    sock = dir / "csi.sock"  # keep ``dir`` short: a unix socket's path fits in 108 bytes
    # -v=3: one ``gRPCCall`` line per CSI call in its log, which csi_calls reads. Not
    # tests.harness.csi.MockDriver: a ManagedProcess is in the clean-up list (by PID) from
    # before it is spawned, so an interrupt while it starts leaves nothing running.
    node.mock = ManagedProcess(
        "csi-mock",
        [
            str(binaries["csi-mock"]),
            f"--endpoint=unix://{sock}",
            f"--drivername={node.driver}",
            "-v=3",
            "--disable-attach",
            "--node-expand-required",
        ],
        dir=dir,
    )
    node.mock.start()
    node.mock.wait_ready(sock.is_socket, 30, f"{sock}")
    node.registrar = ManagedProcess(
        "csi-node-driver-registrar",
        [
            str(binaries["csi-node-driver-registrar"]),
            f"--csi-address={sock}",
            f"--kubelet-registration-path={sock}",
            f"--plugin-registration-path={registry}",
            "--v=2",
        ],
        dir=dir,
    )
    node.registrar.start()
    node.provisioner = ManagedProcess(
        "csi-provisioner",
        [
            str(binaries["csi-provisioner"]),
            f"--csi-address={sock}",
            f"--kubeconfig={cp.admin_kubeconfig}",
            "--v=2",
            "--timeout=30s",
            "--worker-threads=2",
        ],
        dir=dir,
    )
    node.provisioner.start()


def poll(
    check: Callable[[], bool],
    what: str,
    *,
    timeout_s: float = SETUP_TIMEOUT_S,
    interval_s: float = 0.2,
) -> None:
    deadline = time.perf_counter() + timeout_s
    while True:
        try:
            if check():
                return
        except (OSError, ValueError, KeyError):
            pass
        if time.perf_counter() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def node_ready(api: Api, name: str) -> bool:
    status, node = api.call("GET", f"/api/v1/nodes/{name}")
    return status == 200 and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node["status"].get("conditions") or []
    )


def csinode_has(api: Api, name: str, driver: str) -> bool:
    status, csinode = api.call("GET", f"/apis/storage.k8s.io/v1/csinodes/{name}")
    return status == 200 and any(d["name"] == driver for d in csinode["spec"].get("drivers") or [])


# -- the workloads ------------------------------------------------------------------------------


def pod_object(name: str, node: str, volume: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": GRACE_S,
            "volumes": [{"name": "data", **volume}],
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "command": list(COMMAND),
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
        },
    }


def claim_object(name: str, storage_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": "1Mi"}},
        },
    }


def volume_of(kind: str, node: Node, claim: str) -> dict[str, Any]:
    if kind == "emptydir":
        return {"emptyDir": {}}
    if kind == "pvc":
        return {"persistentVolumeClaim": {"claimName": claim}}
    return {"csi": {"driver": node.driver}}


PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CLAIMS = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"


def cpu_seconds(before: Mapping[int, int], after: Mapping[int, int]) -> float:
    """CPU between two readings; processes that came or went count where both exist."""
    return sum(after[p] - before[p] for p in before.keys() & after.keys()) / CLK_TCK


def by_process(
    agent: Agent, before: Mapping[int, int], after: Mapping[int, int]
) -> dict[str, float]:
    """CPU-seconds between two readings per process of the agent, by what it runs."""
    root = agent.proc.pid if agent.proc is not None else None
    out: dict[str, float] = {}
    for pid in before.keys() & after.keys():
        argv = read_cmdline(pid) or []
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            comm = "?"
        # klet up is the root of klet's tree; the kubelet is named by its comm.
        name = process_name(argv, comm, is_root=pid == root and isinstance(agent, MemoryAgent))
        out[name] = out.get(name, 0.0) + (after[pid] - before[pid]) / CLK_TCK
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def cycle(
    api: Api, watch: PodWatch, node: Node, kind: str, name: str, claim: str
) -> dict[str, Any]:
    """One pod of ``kind`` on ``node``: created, Running+ready, deleted, gone."""
    pod = pod_object(name, node.agent.node_name, volume_of(kind, node, claim))
    cpu0 = node.agent.pids()
    wall0 = time.time()
    t0 = time.perf_counter()
    api.ok("POST", PODS, pod)
    t_ready = watch.wait(name, lambda k, p: k != "DELETED" and pod_ready(p), since=t0)
    wall1 = time.time()
    t1 = time.perf_counter()
    api.ok("DELETE", f"{PODS}/{name}")
    t_gone = watch.wait(name, lambda k, p: k == "DELETED", since=t1)
    cpu1 = node.agent.pids()
    out: dict[str, Any] = {
        "name": name,
        "start": t_ready - t0,
        "delete": t_gone - t1,
        "cpu_s": cpu_seconds(cpu0, cpu1),
        "cpu_by_process": by_process(node.agent, cpu0, cpu1),
        "trace": watch.trace(name, t0),
    }
    if node.mock is not None and kind in CSI_AFTER_CREATE:
        calls = csi_calls(node.mock.log_path.read_text(errors="replace"), year=dt.date.today().year)
        out["csi"] = {m: first_after(calls, m, wall0) for m in CSI_AFTER_CREATE[kind]}
        out["csi"].update({m: first_after(calls, m, wall1) for m in CSI_AFTER_DELETE[kind]})
    return out


def force_delete(api: Api, name: str) -> None:
    api.call("DELETE", f"{PODS}/{name}", {"gracePeriodSeconds": 0})


def make_claims(api: Api, claims: Mapping[str, Node]) -> None:
    """Create the claims and wait until each is Bound (untimed)."""
    for claim, node in claims.items():
        api.ok("POST", CLAIMS, claim_object(claim, node.driver))
    for claim in claims:
        poll(functools.partial(claim_bound, api, claim), f"claim {claim} Bound")


def claim_bound(api: Api, claim: str) -> bool:
    return bool(api.ok("GET", f"{CLAIMS}/{claim}")["status"].get("phase") == "Bound")


def drop_claims(api: Api, claims: Sequence[str]) -> None:
    """Delete the claims; wait until they and their PVs are gone (untimed)."""
    for claim in claims:
        api.call("DELETE", f"{CLAIMS}/{claim}")

    def gone() -> bool:
        pvs = api.ok("GET", "/api/v1/persistentvolumes")["items"]
        bound = {(pv["spec"].get("claimRef") or {}).get("name") for pv in pvs}
        left = [c for c in claims if api.call("GET", f"{CLAIMS}/{c}")[0] != 404]
        return not left and not bound & set(claims)

    poll(gone, f"claims {', '.join(claims)} and their PVs gone")


@dataclasses.dataclass
class Config:
    rounds: int
    warmup: int

    @classmethod
    def from_env(cls) -> Config:
        return cls(rounds=env_int("VOLUMES_ROUNDS", 30), warmup=env_int("VOLUMES_WARMUP", 1))


Samples = dict[str, dict[str, list[float]]]  # measurement -> side -> samples


def record(samples: Samples, key: str, side: str, value: float) -> None:
    samples.setdefault(key, {}).setdefault(side, []).append(value)


def run_round(
    api: Api,
    watch: PodWatch,
    nodes: Sequence[Node],
    r: int,
    *,
    timed: bool,
    samples: Samples,
    details: list[dict[str, Any]],
) -> None:
    """One pod of each kind per node; the round's claims made first, dropped after (an
    interrupt skips the drop: the whole plane goes at clean-up)."""
    tag = f"r{r}" if timed else f"w{r}"
    claims = {f"{n.side}-{tag}": n for n in nodes}
    make_claims(api, claims)
    # Who goes first alternates from round to round, so neither always follows the
    # other's deletion (still settling in the apiserver and the controllers).
    order = list(nodes) if r % 2 == 0 else list(reversed(nodes))
    for kind in KINDS:
        for node in order:
            name = f"{node.side}-{kind}-{tag}"
            try:
                res = cycle(api, watch, node, kind, name, f"{node.side}-{tag}")
            except (TimeoutError, OSError, http.client.HTTPException) as err:
                print(f"  {node.side:<8} {kind:<8} {name}: FAILED {err}", flush=True)
                force_delete(api, name)
                if timed:
                    record(samples, "failures", node.side, 1.0)
                continue
            report(node.side, kind, res, timed=timed)
            if timed:
                details.append({"side": node.side, "kind": kind, **res})
                record(samples, f"{kind}_start", node.side, res["start"])
                record(samples, f"{kind}_delete", node.side, res["delete"])
                record(samples, f"{kind}_cpu", node.side, res["cpu_s"])
                for method, v in res.get("csi", {}).items():
                    if v is not None:
                        record(samples, f"{kind}_{method}", node.side, v)
    drop_claims(api, list(claims))


def report(side: str, kind: str, res: Mapping[str, Any], *, timed: bool) -> None:
    csi = res.get("csi", {})
    steps = " ".join(
        f"{m.removeprefix('Node')} {'-' if v is None else f'{v:.3f}s'}" for m, v in csi.items()
    )
    print(
        f"  {side:<8} {kind:<8} running {res['start']:.3f}s, gone {res['delete']:.3f}s, "
        f"CPU {res['cpu_s']:.2f}s{'  (CSI: ' + steps + ')' if steps else ''}"
        f"{'' if timed else '  [warm-up]'}",
        flush=True,
    )


# -- the table -------------------------------------------------------------------------------


def table_rows(samples: Samples) -> list[Row]:
    def row(label: str, key: str, unit: str = "s") -> Row:
        s = samples.get(key, {})
        return Row(label, unit, s.get("klet", []), s.get("kubelet", []))

    rows = []
    for kind in KINDS:
        k = KIND_LABELS[kind]
        rows.append(row(f"{k}: created -> Running+ready", f"{kind}_start"))
        rows += [
            row(f"{k}: created -> {m} returned", f"{kind}_{m}")
            for m in CSI_AFTER_CREATE.get(kind, ())
        ]
        rows.append(row(f"{k}: deleted -> gone from the API", f"{kind}_delete"))
        rows += [
            row(f"{k}: deleted -> {m} returned", f"{kind}_{m}")
            for m in CSI_AFTER_DELETE.get(kind, ())
        ]
        rows.append(row(f"{k}: agent CPU, created -> gone", f"{kind}_cpu", "cpu-s"))
    rows.append(row("agent CPU over all timed rounds", "run_cpu", "cpu-s"))
    rows.append(row("the same, per second of the timed rounds", "run_cores", "cores"))
    if samples.get("failures"):
        rows.append(row("pods that failed (timed out, see the log)", "failures", "count"))
    return rows


def markdown_table(rows: Sequence[Row]) -> str:
    return compare.markdown_table(rows, q=95, min_samples=P95_MIN_SAMPLES)


def text_table(rows: Sequence[Row]) -> str:
    return compare.text_table(rows, q=95, min_samples=P95_MIN_SAMPLES)


def replace_section(text: str, section: str) -> str:
    return compare.replace_section(text, section, begin=README_BEGIN, end_marker=README_END)


def readme_section(res: dict[str, Any], rows: Sequence[Row]) -> str:
    mach, cfg = res["machine"], res["config"]
    return "\n".join(
        [
            f"Measured {res['date']} on `{mach['host']}`: {mach['nproc']} cores, kernel "
            f"{mach['kernel']}, containerd {res['runtime_version']} (one instance per agent), klet "
            f"commit `{mach['commit']}`"
            f"{' (uncommitted changes)' if mach['worktree_dirty'] else ''}, "
            f"{res['kubelet_version']}, csi-mock and csi-provisioner of tools/csi; load average "
            f"{res['load_before']} before, {res['load_after']} after (shared machine); "
            f"{res['run_seconds'] / 60:.0f} min in all.",
            "",
            f"Configuration: `VOLUMES_ROUNDS={cfg['rounds']} VOLUMES_WARMUP={cfg['warmup']}`. "
            "Reproduce with `make bench-volumes` (same variables).",
            "",
            markdown_table(rows),
            "",
            "Agent CPU-seconds in the timed rounds by process: "
            + "; ".join(
                f"{side}: " + ", ".join(f"{k} {v:.1f}" for k, v in procs.items())
                for side, procs in res["cpu_by_process"].items()
            )
            + ".",
            "",
            "Per pod, created -> gone, median CPU-seconds by process (all kinds; first / last "
            "third of the timed pods): "
            + "; ".join(
                f"{side}: " + ", ".join(f"{k} {v}" for k, v in procs.items())
                for side, procs in per_pod_by_process(res["pods"]).items()
            )
            + ".",
        ]
    )


def per_pod_by_process(pods: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Each side's median CPU-seconds per pod by process over the timed pods, with the
    medians of the first and the last third beside it: a process whose cost per pod
    grows with the pods a node has run shows there."""
    out: dict[str, dict[str, str]] = {}
    for side in dict.fromkeys(p["side"] for p in pods):
        mine = [p.get("cpu_by_process") or {} for p in pods if p["side"] == side]
        third = max(1, len(mine) // 3)
        names = sorted({k for m in mine for k in m}, key=lambda k: -sum(m.get(k, 0) for m in mine))

        def med(of: Sequence[Mapping[str, float]], name: str) -> float:
            return statistics.median(m.get(name, 0.0) for m in of)

        out[side] = {
            n: f"{med(mine, n):.3f} ({med(mine[:third], n):.3f} / {med(mine[-third:], n):.3f})"
            for n in names
        }
    return out


# -- the run ----------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument(
        "--readme",
        action="store_true",
        help="write the table into bench/README.md between the volumes markers",
    )
    common.add_keep_and_output(p, RESULTS, keep_help="keep the run dir (logs, configs)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if (code := common.begin(root_for="it starts containerd and the kubelet")) is not None:
        return code
    cfg = Config.from_env()
    binary, kubelet_version = kubelet_binary()
    bin_dir = control_plane_bin()
    if (missing := release_sources_missing()) is not None:
        print(f"bench: csi-node-driver-registrar: {missing}", file=sys.stderr)
        return 2
    binaries = csi_binaries(["csi-mock", "csi-provisioner", "csi-node-driver-registrar"])
    began = time.perf_counter()
    run_id = uuid.uuid4().hex[:6]
    run_dir = Path(tempfile.mkdtemp(prefix="kvol-", dir="/tmp"))  # short: socket paths
    stack = DevStack(run_dir / "s")
    cp = ControlPlane(run_dir / "cp", bin_dir, controllers=True)
    runner = asyncio.Runner()
    w = Workloads(runner)
    upstream_cd: Containerd | None = None
    nodes: list[Node] = []
    api: Api | None = None
    watch: PodWatch | None = None
    cgroups: list[Path] = []
    sysctls = read_sysctls()
    load_before = common.load()
    at_start = machine()
    samples: Samples = {}
    details: list[dict[str, Any]] = []
    per_process: dict[str, dict[str, float]] = {}
    failed: Exception | None = None
    version_text = "?"
    try:
        print(
            f"bench: control plane, devstack and a second containerd in {run_dir} ...", flush=True
        )
        cp.start()
        stack.start()
        upstream_cd = second_containerd(stack, run_dir / "c2")
        ip = host_ip()
        kn, un = f"volk{run_id}", f"volu{run_id}"
        klet = KletNode(run_dir / "klet", kn, stack.runtime_endpoint, cp.node_flags(kn, ip))
        kube = KubeletNode(
            run_dir / "kube", un, upstream_cd.endpoint, binary, cp.node_flags(un, ip)
        )
        for a in (klet, kube):  # "image present" for both
            runner.run(w.cri(a).pull_image(BUSYBOX_IMAGE))
        version = runner.run(w.cri(klet).version())
        version_text = version.runtime_version
        cgroups = make_cgroup_root(CGROUP_ROOT)
        api = Api(
            cp, cp.ca.issue("klet-bench", ["system:masters"], client=True, name="client-klet-bench")
        )
        cp.prepare_namespace(NAMESPACE)
        cp.apply(
            [
                o
                for d in (f"bench-k{run_id}.csi.klet.test", f"bench-u{run_id}.csi.klet.test")
                for o in csi_objects(d)
            ]
        )
        for agent, driver in (
            (klet, f"bench-k{run_id}.csi.klet.test"),
            (kube, f"bench-u{run_id}.csi.klet.test"),
        ):
            print(
                f"bench: starting {agent.name} (node {agent.node_name}, {ip}, driver {driver})",
                flush=True,
            )
            node = Node(agent, driver)
            nodes.append(node)  # before it starts: the clean-up stops what was started
            agent.start()
            start_csi(node, cp, binaries, run_dir / f"csi-{agent.name}")
        for node in nodes:
            name = node.agent.node_name
            poll(functools.partial(node_ready, api, name), f"node {name} Ready")
            poll(
                functools.partial(csinode_has, api, name, node.driver),
                f"{node.driver} in the CSINode of {name}",
            )
        watch = PodWatch(api, NAMESPACE)
        watch.start()
        for r in range(cfg.warmup):
            print(f"bench: warm-up round {r + 1}/{cfg.warmup}", flush=True)
            run_round(api, watch, nodes, r, timed=False, samples=samples, details=details)
        before = {n.side: n.agent.pids() for n in nodes}
        t_rounds = time.perf_counter()
        for r in range(cfg.rounds):
            print(f"bench: round {r + 1}/{cfg.rounds}", flush=True)
            run_round(api, watch, nodes, r, timed=True, samples=samples, details=details)
        rounds_s = time.perf_counter() - t_rounds
        for n in nodes:
            after = n.agent.pids()
            used = cpu_seconds(before[n.side], after)
            record(samples, "run_cpu", n.side, used)
            record(samples, "run_cores", n.side, used / rounds_s)
            per_process[n.side] = by_process(n.agent, before[n.side], after)
            print(
                f"bench: {n.side} CPU-seconds in the {rounds_s:.0f} s of timed rounds: "
                + ", ".join(f"{k} {v:.2f}" for k, v in per_process[n.side].items()),
                flush=True,
            )
    except Exception as err:  # noqa: BLE001 - the table of what was measured still counts
        failed = err
        traceback.print_exc()
        print(f"bench: FAILED: {err!r}", file=sys.stderr)
    finally:
        with common.cleaning_up():
            csi_counts = {n.side: count_calls(n) for n in nodes}
            cleanup(
                Started(nodes, w, stack, upstream_cd, cp, api, watch),
                cgroups,
                sysctls,
                run_dir,
                args.keep,
            )
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": dataclasses.asdict(cfg),
        "machine": {**at_start, "host": platform.node()},
        "commit_at_end": machine()["commit"],
        "runtime_version": version_text,
        "kubelet_version": kubelet_version,
        "load_before": load_before,
        "load_after": common.load(),
        "csi_calls": csi_counts,
        "cpu_by_process": per_process,
        "samples": samples,
        "pods": details,
        "units": "seconds, CPU-seconds",
        "error": repr(failed) if failed else None,
        "run_seconds": time.perf_counter() - began,
    }
    rows = table_rows(samples)
    common.write_results(args.output, res)
    print()
    print(text_table(rows))
    print(f"results: {args.output}")
    if args.readme and failed is None:
        README.write_text(replace_section(README.read_text(), readme_section(res, rows)))
        print(f"table written to {README}")
    return 1 if failed is not None or samples.get("failures") else 0


def count_calls(node: Node) -> dict[str, int]:
    """How many calls of each CSI method the node's csi-mock served in the whole run."""
    if node.mock is None or not node.mock.log_path.exists():
        return {}
    out: dict[str, int] = {}
    for _, method in csi_calls(
        node.mock.log_path.read_text(errors="replace"), year=dt.date.today().year
    ):
        out[method] = out.get(method, 0) + 1
    return out


@dataclasses.dataclass
class Started:
    """What the run started, for the clean-up."""

    nodes: Sequence[Node]
    w: Workloads
    stack: DevStack
    upstream_cd: Containerd | None
    cp: ControlPlane
    api: Api | None
    watch: PodWatch | None


def cleanup(
    s: Started, cgroups: Sequence[Path], sysctls: Mapping[str, str], run_dir: Path, keep: bool
) -> None:
    """Every step is attempted even if an earlier one fails."""
    steps: list[common.Step] = []
    if s.watch is not None:
        steps.append(("stop the pod watch", s.watch.stop))
    if s.api is not None:
        steps.append(("close the API connection", s.api.close))
    for n in s.nodes:
        steps.append((f"stop {n.side}", n.agent.stop))
    for n in s.nodes:
        if n.provisioner is not None:
            steps.append((f"stop {n.side}'s csi-provisioner", n.provisioner.stop))
        if n.registrar is not None:  # SIGTERM: it removes its registration socket
            steps.append((f"stop {n.side}'s csi-node-driver-registrar", n.registrar.stop))
        if n.mock is not None:
            steps.append((f"stop {n.side}'s csi-mock", n.mock.stop))
    for c in list(s.w.clients.values()):
        steps.append(("close CRI client", functools.partial(s.w.runner.run, c.close())))
    steps.append(("close event loop", s.w.runner.close))
    if s.upstream_cd is not None:
        steps.append(("stop the kubelet's containerd", s.upstream_cd.stop))
    steps.append(("stop devstack", s.stack.stop))
    steps.append(("stop control plane", s.cp.stop))
    steps.append(("unmount under the run dir", lambda: unmount_under(run_dir)))
    steps.append(("remove the kubelet's cgroups", lambda: remove_cgroups(cgroups)))
    steps.append(("restore sysctls", lambda: restore_sysctls(sysctls)))
    common.run_steps(steps, run_dir=run_dir, keep=keep)


if __name__ == "__main__":
    common.entry(main)
