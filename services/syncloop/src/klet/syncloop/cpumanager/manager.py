"""The CPU manager: the policy's state, its file, admission, the containers' cpusets.

syncloop owns it because syncloop creates the containers. It is the topology manager's
first hint provider and allocator, as upstream's: at admission the topology manager
asks each container's (or, scope pod, the pod's) NUMA hints (`topology_hints`,
`pod_topology_hints`), merges them with the other managers', and then has the CPU
manager take the container's exclusive CPUs on the merged hint (`allocate`, under
every topology policy; policy none gives no hint). The state is written to
`<root-dir>/cpu_manager_state` before the answer is given, so a container is never
created on CPUs the file does not record. A pod refused after some of its containers
got CPUs keeps them until the next release, as upstream's. Container creation reads
the container's cpuset (`cpuset_of`: its own CPUs, else the shared pool) into the CRI
config. The leader's root task (`run`, every cpuManagerReconcilePeriod) releases the
CPUs of pods that are no longer active, once every source is ready (a restarted
syncloop does not yet know every pod), and sends UpdateContainerResources with the
new cpuset to each running container whose cpuset changed since it was last applied:
shared-pool containers follow the pool as it shrinks and grows, as upstream's
reconcileState does.

After a restart the state file is read back and checked against the node (upstream's
validateState): the re-admitted pods find their CPUs held and keep them, and the first
reconcile sends each running container its cpuset once more, which changes nothing
and restarts nothing. A state file that does not verify, or was written for another
policy, stops syncloop at start with upstream's message: as upstream, the node must
be drained and the file deleted.

The assignments stay in this process: the PodResources API, served by syncloop too
(klet.syncloop.podresources), reads them from the manager.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from klet.config.kubelet import KubeletConfiguration
from klet.cri.types import LinuxResources
from klet.model.cpuset import CPUSet, format_cpus, parse_cpus
from klet.model.pod import is_pod_level_set
from klet.model.types import JSON, ContainerID
from klet.model.units import parse_quantity
from klet.syncloop.cpumanager import state as statefile
from klet.syncloop.cpumanager.policy import (
    NONE,
    AdmissionError,
    NonePolicy,
    PolicyError,
    StaticPolicy,
    guaranteed_cpus,
    parse_options,
    reserved_count,
    reuse,
)
from klet.syncloop.cpumanager.state import CPUState, StateError
from klet.syncloop.cpumanager.topology import SYS_CPU, TopologyError, discover
from klet.syncloop.topologymanager.hints import ProviderHints, TopologyHint

log = logging.getLogger(__name__)


class CPUManagerError(RuntimeError):
    """The CPU manager cannot start; syncloop refuses to start with this message."""


class CPUSetUpdater(Protocol):
    async def update_container_resources(
        self, container_id: ContainerID, resources: LinuxResources
    ) -> None: ...


class CPUObserver(Protocol):
    """Where upstream's CPU manager series are kept (metrics.CPUManagerMetrics)."""

    def pinning(self, *, requested: int, failed: int) -> None: ...

    def pool(
        self, *, shared_millicores: int, exclusive: int, per_numa: Mapping[int, int]
    ) -> None: ...

    def aligned(self, boundary: str, *, failed: bool, amount: int = 1) -> None:
        """An allocation aligned on `boundary` (or not: `failed`); amount 0 makes the
        series exist."""


class _NoObserver:
    def pinning(self, *, requested: int, failed: int) -> None:
        pass

    def pool(self, *, shared_millicores: int, exclusive: int, per_numa: Mapping[int, int]) -> None:
        pass

    def aligned(self, boundary: str, *, failed: bool, amount: int = 1) -> None:
        pass


ALIGNED_PHYSICAL_CPU = "physical_cpu"
ALIGNED_UNCORE_CACHE = "uncore_cache"
"""upstream's `boundary` values of the aligned-allocation counters the CPU manager keeps."""


Running = Callable[[str], Awaitable[Sequence[tuple[str, ContainerID]]]]
"""The running containers of a pod: (name, container ID) each."""


class CPUManager:
    def __init__(
        self,
        policy: StaticPolicy | NonePolicy,
        root_dir: Path,
        *,
        disable_quota: bool = False,
        observer: CPUObserver | None = None,
    ) -> None:
        self.policy = policy
        self.observer: CPUObserver = observer or _NoObserver()
        self.disable_quota = disable_quota
        """DisableCPUQuotaWithExclusiveCPUs: no CFS quota where a container has CPUs of its own."""
        self.path = root_dir / statefile.STATE_FILE
        self.state = CPUState(policy=policy.name)
        self._applied: dict[tuple[str, str], CPUSet] = {}
        self._reuse: dict[str, CPUSet] = {}
        """The CPUs the admitted pod's next containers may take again (its init
        containers'), by pod UID: upstream's cpusToReuse."""
        self.loaded = False

    def check(self) -> None:
        """What `load` checks, keeping and writing nothing (syncloop's start, before it
        leads: a standby must read the file again when it takes over)."""
        CPUManager(self.policy, self.path.parent)._read()

    def _ensure(self) -> None:
        if not self.loaded:
            self.load()

    # -- start and the file
    def load(self) -> None:
        """Read the state file back (a missing one starts empty), check it against this
        node and write it; raises CPUManagerError with upstream's message."""
        self._read()
        self.save()
        self.loaded = True
        self._observe_pool()
        if isinstance(self.policy, StaticPolicy):  # the series upstream's static policy makes
            self.observer.aligned(ALIGNED_PHYSICAL_CPU, failed=True, amount=0)
            self.observer.aligned(ALIGNED_PHYSICAL_CPU, failed=False, amount=0)
            self.observer.aligned(ALIGNED_UNCORE_CACHE, failed=False, amount=0)
        self._applied = {}
        log.info(
            "cpu manager started",
            extra={
                "policy": self.policy.name,
                "shared": format_cpus(self.state.default),
                "reserved": format_cpus(getattr(self.policy, "reserved", frozenset())),
            },
        )

    def _read(self) -> None:
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            blob = None
        except OSError as err:
            raise CPUManagerError(f"reading {self.path}: {err.strerror}") from err
        try:
            if blob is not None:
                self.state = statefile.decode(blob, policy=self.policy.name)
        except StateError as err:
            raise CPUManagerError(
                f"could not restore state from checkpoint: {err}, please drain this node and "
                f"delete the CPU manager checkpoint file {json.dumps(str(self.path))} before "
                "restarting "
                "Kubelet"
            ) from err
        try:
            self.state = self.policy.start(self.state)
        except PolicyError as err:
            raise CPUManagerError(
                f"start cpu manager error: {err} (static policy invalid state, please drain "
                f"node and remove policy state file {self.path})"
            ) from err

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(statefile.encode(self.state))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    # -- admission: hints and allocation (the topology manager's provider and allocator)
    def topology_hints(self, pod: JSON, container: JSON) -> ProviderHints | None:
        """The container's CPU hints (upstream's GetTopologyHints); None: no preference."""
        self._ensure()
        hints = self.policy.container_hints(
            self.state, pod, container, reusable=self._reusable(pod)
        )
        return None if hints is None else {"cpu": hints}

    def pod_topology_hints(self, pod: JSON) -> ProviderHints | None:
        """The pod's CPU hints (upstream's GetPodTopologyHints); None: no preference."""
        self._ensure()
        hints = self.policy.pod_hints(self.state, pod, reusable=self._reusable(pod))
        return None if hints is None else {"cpu": hints}

    def _reusable(self, pod: JSON) -> CPUSet:
        return self._reuse.get(str((pod.get("metadata") or {}).get("uid") or ""), frozenset())

    def allocate(self, pod: JSON, container: JSON, hint: TopologyHint) -> tuple[str, str] | None:
        """Take the container's exclusive CPUs, those of the hint's NUMA nodes first, and
        write the state file before answering: None, or (reason, message) refusing the
        pod (upstream's Allocate, which the topology manager's admit handler calls)."""
        self._ensure()
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        pinning = (
            isinstance(self.policy, StaticPolicy)
            and guaranteed_cpus(pod, container) > 0
            and not is_pod_level_set(pod)
        )
        try:
            new, cpus = self.policy.allocate(
                self.state, pod, container, reusable=self._reusable(pod), numa=hint.affinity
            )
        except AdmissionError as err:
            self.observer.pinning(requested=1, failed=1)
            if self._full_pcpus_only():
                self.observer.aligned(ALIGNED_PHYSICAL_CPU, failed=True)
            log.info(
                "pod refused: its exclusive CPUs cannot be had",
                extra={
                    "pod": uid,
                    "container": container.get("name"),
                    "reason": err.reason,
                    "error": err.message,
                },
            )
            return err.reason, err.message
        if pinning:
            self.observer.pinning(requested=1, failed=0)
            if self._full_pcpus_only():
                self.observer.aligned(ALIGNED_PHYSICAL_CPU, failed=False)
        # as upstream's cpusToReuse: only the pod being admitted keeps an entry
        self._reuse = {uid: reuse(self._reusable(pod), pod, container, cpus)}
        if new != self.state:
            self.state = new
            self.save()
            self._observe_pool()
        return None

    def _full_pcpus_only(self) -> bool:
        return isinstance(self.policy, StaticPolicy) and self.policy.options.full_pcpus_only

    def _observe_pool(self) -> None:
        """The shared pool and exclusive CPU gauges (upstream's static policy sets them;
        the none policy leaves them at 0)."""
        if not isinstance(self.policy, StaticPolicy):
            return
        exclusive = {
            c for cs in self.state.assignments.values() for cpus in cs.values() for c in cpus
        }
        topo = self.policy.topology
        per_numa = {i.numa: 0 for i in topo.details.values()}
        for cpu in exclusive:
            per_numa[topo.details[cpu].numa] += 1
        self.observer.pool(
            shared_millicores=len(self.policy.available(self.state)) * 1000,
            exclusive=len(exclusive),
            per_numa=per_numa,
        )

    def exclusive(self, uid: str, name: str) -> CPUSet:
        """The container's exclusive CPUs (empty: it runs in the shared pool)."""
        return self.state.assignments.get(uid, {}).get(name, frozenset())

    def unlimited_quota(self, uid: str, name: str | None = None) -> bool:
        """Whether the container (the pod, without `name`) runs without a CFS quota:
        DisableCPUQuotaWithExclusiveCPUs on, and it holds exclusive CPUs."""
        if not self.disable_quota:
            return False
        held = self.state.assignments.get(uid, {})
        return bool(held.get(name)) if name is not None else any(held.values())

    def allocatable(self) -> CPUSet:
        """The CPUs exclusive assignments come from (empty under the none policy)."""
        return self.policy.allocatable()

    def cpuset_of(self, pod: JSON, container: JSON) -> str:
        """The cpuset.cpus for the container's CRI config; "" sets none (none policy)."""
        self._ensure()
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        name = str(container.get("name") or "")
        return format_cpus(self.state.assignments.get(uid, {}).get(name, self.state.default))

    def release(self, active: Mapping[str, JSON]) -> None:
        """Give back the CPUs of pods that are not active and of containers no longer in
        their pod's spec (upstream's removeStaleState)."""
        self._ensure()
        new = self.state
        for uid, containers in self.state.assignments.items():
            pod = active.get(uid)
            names = _container_names(pod) if pod is not None else set()
            for name in containers:
                if name not in names:
                    new = self.policy.remove(new, uid, name)
                    log.info("exclusive CPUs released", extra={"pod": uid, "container": name})
        if new != self.state:
            self.state = new
            self.save()
            self._observe_pool()
        self._applied = {k: v for k, v in self._applied.items() if k[0] in active}

    async def reconcile(
        self, active: Mapping[str, JSON], running: Running, cri: CPUSetUpdater
    ) -> int:
        """Send each running container of the active pods the cpuset it should have, when
        it differs from the one last sent; returns how many were updated."""
        if isinstance(self.policy, NonePolicy):
            return 0
        updated = 0
        for uid in sorted(active):
            try:
                containers = await running(uid)
            except Exception as err:  # noqa: BLE001 - the runtime may be away; next round
                log.debug(
                    "cpu reconcile: runtime not listed", extra={"pod": uid, "error": str(err)}
                )
                continue
            for name, cid in containers:
                cpus = self.state.assignments.get(uid, {}).get(name, self.state.default)
                if not cpus or self._applied.get((uid, cid)) == cpus:
                    continue
                try:
                    await cri.update_container_resources(
                        cid, LinuxResources(cpuset_cpus=format_cpus(cpus))
                    )
                except Exception as err:  # noqa: BLE001 - retried at the next period
                    log.warning(
                        "cpu reconcile: cpuset not updated",
                        extra={"pod": uid, "container": name, "error": str(err)},
                    )
                    continue
                self._applied[(uid, cid)] = cpus
                updated += 1
        return updated


def _container_names(pod: JSON) -> set[str]:
    spec: JSON = pod.get("spec") or {}
    return {
        str(c.get("name"))
        for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    }


async def run(
    manager: CPUManager,
    *,
    active: Callable[[], Mapping[str, JSON] | None],
    running: Running,
    cri: CPUSetUpdater,
    period_s: float,
) -> None:
    """The leader's root task: release and reconcile every `period_s`.
    `active` gives the active pods by UID, or None while not every source is ready.
    It reads the state file first: this replica may be taking over from another."""
    manager.load()
    while True:
        pods = active()
        if pods is not None:
            manager.release(pods)
            await manager.reconcile(pods, running, cri)
        await asyncio.sleep(period_s)


def create_manager(
    cfg: KubeletConfiguration,
    root_dir: Path,
    *,
    observer: CPUObserver | None = None,
    sys_cpu: Path = SYS_CPU,
) -> CPUManager:
    """The manager cpuManagerPolicy asks for, over this node's topology; raises
    CPUManagerError naming the field (upstream's kubelet does not start either)."""
    if cfg.cpu_manager_policy in ("", NONE):
        return CPUManager(NonePolicy(), root_dir, observer=observer)
    try:
        options = parse_options(
            cfg.cpu_manager_policy_options,
            alpha=cfg.feature_gates.get("CPUManagerPolicyAlphaOptions", False),
            beta=cfg.feature_gates.get("CPUManagerPolicyBetaOptions", True),
        )
    except PolicyError as err:
        raise CPUManagerError(f"cpuManagerPolicyOptions: {err}") from err
    try:
        topology = discover(sys_cpu)
    except TopologyError as err:
        raise CPUManagerError(f"cpuManagerPolicy: static: {err}") from err
    explicit = parse_cpus(cfg.reserved_system_cpus)
    try:
        if explicit:
            count = len(explicit)
        else:
            count = reserved_count(
                _milli(cfg.kube_reserved.get("cpu")), _milli(cfg.system_reserved.get("cpu"))
            )
        policy = StaticPolicy.create(topology, count=count, explicit=explicit, options=options)
    except PolicyError as err:
        raise CPUManagerError(f"cpuManagerPolicy: static: new static policy error: {err}") from err
    return CPUManager(
        policy,
        root_dir,
        disable_quota=cfg.feature_gates.get("DisableCPUQuotaWithExclusiveCPUs", True),
        observer=observer,
    )


def _milli(quantity: str | None) -> int:
    return math.ceil(parse_quantity(quantity) * 1000) if quantity else 0
