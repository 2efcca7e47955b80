"""Sets up a pod's volumes before its containers start and removes them with the pod.

For every volume of the pod spec the first plugin that `handles` it makes it ready
under `<root-dir>/pods/<uid>/volumes/<plugin dir>/<name>`; the result maps each volume
name to the host path its volumeMounts bind into containers. A volume that fails (or
that no plugin serves: iSCSI, RBD, ...) is reported by name with its cause and
the others still get set up, so the caller can report every problem at once and retry.
Set-up first makes the pod directory (0750, root's: `poddirs`), before anything else
of the pod is written below it.

Removal walks what is on disk rather than the spec: the spec of a removed pod may be
gone (deleted while syncloop was down), and a directory left by a crash is removed the
same way. A plugin removes its own volumes (it knows what it mounted); a directory no
plugin claims is removed by `fs.remove_tree`, which unmounts first and never deletes
inside a mounted filesystem.

Each set-up and tear-down of a volume by its plugin is told to `operations` (upstream's
storage_operation_duration_seconds): a set-up as `volume_mount` when the volume was not
ready yet or is of a type whose content is refreshed at each sync (configMap, secret,
downwardAPI, projected: upstream remounts those), a tear-down as `volume_unmount`.

Each set-up that succeeds there is also told to `totals` (upstream's
volume_operation_total_seconds, operation `overall_volume_mount`) with the seconds since
the pod's volume was first asked for: the end-to-end time, failed attempts and their
retries included, as upstream measures from the mount request its desired state of the
world keeps for the pod's volume. Like upstream's, that request time stays until the
pod's volumes are torn down, so a remount of a refreshed type is timed from it too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from klet.cri import CRIError
from klet.cri import labels as L
from klet.model import layout
from klet.model.podvalidation import checked_component
from klet.model.types import JSON
from klet.syncloop.criprotocols import RuntimeReader
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.volumes import fs, poddirs
from klet.syncloop.volumes.base import (
    Block,
    ObjectReader,
    TokenIssuer,
    VolumeContext,
    VolumeError,
    VolumePlugin,
    volume_type,
)
from klet.syncloop.volumes.subpath import SUBPATHS_DIR

log = logging.getLogger(__name__)

ORPHAN_CLEANUP_PERIOD_S = 30.0
"""How often pod directories no pod owns any more are looked for, seconds."""

VOLUME_MOUNT = "volume_mount"
VOLUME_UNMOUNT = "volume_unmount"

StorageOperation = Callable[[str, str, bool, float], None]
"""Told of each volume operation: (upstream's operation name, VOLUME_MOUNT or
VOLUME_UNMOUNT; upstream's plugin name; whether it succeeded; seconds it took)."""

OVERALL_VOLUME_MOUNT = "overall_volume_mount"

OperationTotal = Callable[[str, str, float], None]
"""Told of each volume operation's end-to-end time: (upstream's operation name,
OVERALL_VOLUME_MOUNT; upstream's plugin name; seconds since it was first asked for)."""

REMOUNTED = frozenset({"configMap", "secret", "downwardAPI", "projected"})
"""Volume types whose set-up at every sync writes their content again (upstream's
plugins that require a remount), so each counts as an operation."""


@dataclass(frozen=True)
class PodVolumes:
    """The outcome of setting up a pod's volumes."""

    paths: dict[str, Path] = field(default_factory=dict)
    """Volume name → host path, for the volumes that are ready."""
    failures: dict[str, str] = field(default_factory=dict)
    """Volume name → why it could not be set up (the FailedMount cause)."""
    devices: dict[str, Block] = field(default_factory=dict)
    """Volume name → device node, for the raw block volumes that are ready."""


def unsupported_message(volume: JSON) -> str:
    kind = volume_type(volume)
    if not kind:
        return "unsupported volume type: the volume names no source"
    return f'unsupported volume type "{kind}": klet does not implement this volume type'


class VolumeManager:
    """Per-pod set-up and tear-down of volumes through a list of plugins."""

    def __init__(
        self,
        plugins: Iterable[VolumePlugin],
        *,
        root_dir: Path,
        node: NodeFacts,
        objects: ObjectReader | None = None,
        tokens: TokenIssuer | None = None,
        counts: Callable[[Mapping[tuple[str, str], int]], None] | None = None,
        operations: StorageOperation | None = None,
        totals: OperationTotal | None = None,
        orphans: Callable[[int, int], None] | None = None,
    ) -> None:
        self.plugins: list[VolumePlugin] = list(plugins)
        self.counts = counts
        self.operations = operations
        self.totals = totals
        self.orphans = orphans
        """Told after each orphan sweep: (orphaned pod directories found, those that could
        not be removed), upstream's kubelet_orphan_pod_cleaned_volumes and _errors."""
        # pod UID -> volume name -> (upstream plugin name, set up): the volume manager's
        # desired and actual states, for volume_manager_total_volumes.
        self._states: dict[str, dict[str, tuple[str, bool]]] = {}
        # pod UID -> volume name -> when its set-up was first asked for (monotonic), the
        # start of volume_operation_total_seconds; kept until the pod's tear-down.
        self._requested: dict[str, dict[str, float]] = {}
        self.root_dir = root_dir
        self.node = node
        self.objects = objects
        self.tokens = tokens
        # One pod's set-up and tear-down never overlap (the pod worker and the orphan
        # clean-up may both reach a pod that is going away).
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    def pods_dir(self) -> Path:
        return layout.pods_dir(self.root_dir)

    def pod_dir(self, uid: str) -> Path:
        return layout.pod_dir(self.root_dir, checked_component(uid, what="pod UID"))

    def plugin_for(self, volume: JSON) -> VolumePlugin | None:
        return next((p for p in self.plugins if p.handles(volume)), None)

    async def set_up(self, pod: JSON, *, pod_ip: str) -> PodVolumes:
        """Make every volume of the pod ready (again: this also refreshes content)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            raise ValueError("a pod without a UID has no pod directory")
        if uid not in self._locks and self.objects is not None:
            # A pod not set up before (since start or its tear-down) reads its
            # ConfigMaps and Secrets as they are now, not as another pod read them
            # seconds ago (see kubeobjects).
            namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
            self.objects.forget_cached(namespace)
        ctx = VolumeContext(
            pod=pod,
            pod_dir=self.pod_dir(uid),
            objects=self.objects,
            tokens=self.tokens,
            node=self.node,
            pod_ip=pod_ip,
        )
        async with self._lock(uid):
            try:
                await asyncio.to_thread(poddirs.ensure_pod_dir, self.root_dir, uid)
            except OSError as err:
                return _every_volume_failed(pod, f"pod directory not ready: {_os_message(err)}")
            return await self._set_up(pod, ctx)

    async def _set_up(self, pod: JSON, ctx: VolumeContext) -> PodVolumes:
        result = PodVolumes()
        uid = str(pod["metadata"]["uid"])
        states: dict[str, tuple[str, bool]] = {}
        before = self._states.get(uid, {})
        requested = self._requested.setdefault(uid, {})
        for volume in _volumes(pod):
            name = str(volume.get("name") or "")
            plugin = self.plugin_for(volume)
            if plugin is None:
                result.failures[name] = unsupported_message(volume)
                continue
            started = time.monotonic()
            asked = requested.setdefault(name, started)
            await self._set_up_one(volume, ctx, plugin, result)
            plugin_name = _plugin_name(plugin, volume, uid)
            if plugin_name:
                ready = name in result.paths or name in result.devices
                states[name] = (plugin_name, ready)
                was_ready = before.get(name, ("", False))[1]
                if not was_ready or volume_type(volume) in REMOUNTED:
                    self._mounted(plugin_name, ready, started=started, asked=asked)
        if self._states.get(uid) != states:  # most syncs of a running pod change nothing
            self._states[uid] = states
            self._report_counts()
        return result

    def _mounted(self, plugin_name: str, ready: bool, *, started: float, asked: float) -> None:
        """Tell `operations` of a set-up, and `totals` of one that succeeded."""
        now = time.monotonic()
        if self.operations is not None:
            self.operations(VOLUME_MOUNT, plugin_name, ready, now - started)
        if ready and self.totals is not None:
            self.totals(OVERALL_VOLUME_MOUNT, plugin_name, now - asked)

    def _report_counts(self) -> None:
        if self.counts is None:
            return
        totals: dict[tuple[str, str], int] = {}
        for states in self._states.values():
            for plugin_name, ready in states.values():
                for state, counted in ((DESIRED, True), (ACTUAL, ready)):
                    if counted:
                        key = (plugin_name, state)
                        totals[key] = totals.get(key, 0) + 1
        self.counts(totals)

    async def _set_up_one(
        self, volume: JSON, ctx: VolumeContext, plugin: VolumePlugin, result: PodVolumes
    ) -> None:
        name = str(volume.get("name") or "")
        try:
            ready = await plugin.set_up(volume, ctx)
        except VolumeError as err:
            result.failures[name] = str(err)
        except OSError as err:
            result.failures[name] = _os_message(err)
        else:
            if isinstance(ready, Block):
                result.devices[name] = ready
            else:
                result.paths[name] = ready

    async def tear_down(self, uid: str) -> list[str]:
        """Remove all the pod's volumes and then its directory's `volumes` part.

        Returns the problems (empty when everything is gone); what could not be
        removed stays for a later attempt (`clean_orphans`)."""
        if not uid or "/" in uid or uid in (".", ".."):
            return [f"invalid pod UID {uid!r}"]
        async with self._lock(uid):
            problems = await self._tear_down(uid)
        if not problems:
            self._locks.pop(uid, None)
            self._requested.pop(uid, None)
            for plugin in self.plugins:
                if isinstance(plugin, NamesPlugins):
                    plugin.forget_pod(uid)
            if self._states.pop(uid, None) is not None:
                self._report_counts()
        return problems

    async def _tear_down(self, uid: str) -> list[str]:
        volumes_dir = self.pod_dir(uid) / "volumes"
        # The containers' subPath bind mounts go first, as upstream: they pin the volumes.
        problems = await fs.remove_tree(self.pod_dir(uid) / SUBPATHS_DIR)
        if problems:  # nothing of a volume is removed while a subPath of it is mounted
            log.warning("pod subPath mounts not removed", extra={"uid": uid, "problems": problems})
            return problems
        by_dir: dict[str, Callable[[Path], Awaitable[None]]] = {}
        for p in self.plugins:
            by_dir[p.dir_name] = p.tear_down
            if isinstance(p, OwnsMoreDirs):
                by_dir.update(p.more_dirs())
        known = self._states.get(uid, {})
        for plugin_dir in _subdirs(volumes_dir):
            tear_down = by_dir.get(plugin_dir.name)
            for path in _subdirs(plugin_dir, include_files=True):
                started = time.monotonic()
                succeeded = True
                try:
                    if tear_down is not None:
                        await tear_down(path)
                    else:
                        problems += await fs.remove_tree(path)
                except (OSError, fs.MountError, VolumeError) as err:
                    problems.append(f"{path}: {err}")
                    succeeded = False
                if tear_down is not None:
                    self._unmounted(known, plugin_dir.name, path.name, succeeded, started)
        if not problems and not await asyncio.to_thread(_remove_emptied, volumes_dir):
            # something the walk above did not remove is left: the careful way
            problems += await fs.remove_tree(volumes_dir)
        if problems:
            log.warning("pod volumes not removed", extra={"uid": uid, "problems": problems})
        return problems

    def _unmounted(
        self,
        known: Mapping[str, tuple[str, bool]],
        plugin_dir: str,
        name: str,
        succeeded: bool,
        started: float,
    ) -> None:
        """Tell `operations` of a tear-down, by the plugin name the set-up knew or else
        the one the directory spells (`kubernetes.io~empty-dir`)."""
        if self.operations is None:
            return
        plugin_name = known[name][0] if name in known else plugin_dir.replace("~", "/")
        self.operations(VOLUME_UNMOUNT, plugin_name, succeeded, time.monotonic() - started)

    async def clean_orphans(self, *, keep: Collection[str]) -> list[str]:
        """Remove the directory of every pod under `<root-dir>/pods` not in `keep`.

        For the pods left by a crash: call only once every pod source has delivered
        its first full snapshot, with `keep` holding the desired pods and the pods the
        runtime still has a sandbox for. Returns the UIDs whose directory is gone."""
        removed: list[str] = []
        found = 0
        for pod_dir in _subdirs(self.pods_dir()):
            uid = pod_dir.name
            if uid in keep:
                continue
            found += 1
            problems = await self.tear_down(uid)
            if not problems:
                problems = await fs.remove_tree(pod_dir)
            if problems:
                log.warning("orphaned pod directory kept", extra={"uid": uid, "problems": problems})
                continue
            log.info("removed orphaned pod directory", extra={"uid": uid})
            removed.append(uid)
        if self.orphans is not None:
            self.orphans(found, found - len(removed))
        return removed

    async def sweep(self) -> None:
        """Let each plugin that keeps node-wide state for pods' volumes (a CSI volume's
        staging) release what no pod directory uses any more."""
        for plugin in self.plugins:
            if isinstance(plugin, Sweeper):
                await plugin.sweep()

    async def run_orphan_cleanup(
        self,
        *,
        cri: RuntimeReader,
        ready: Callable[[], bool],
        desired: Callable[[], Collection[str]],
        period_s: float = ORPHAN_CLEANUP_PERIOD_S,
    ) -> None:
        """Root task: remove pod directories left behind (a crash, a failed tear-down).

        Waits until every pod source has delivered its first full snapshot (`ready`);
        then, every `period_s`, keeps the desired pods and every pod the runtime still
        has a sandbox for, and removes the rest."""
        while True:
            if ready():
                try:
                    sandboxes = await cri.list_pod_sandboxes()
                except CRIError as err:
                    log.warning("orphaned pod directories not checked", extra={"error": str(err)})
                else:
                    keep = {s.labels.get(L.POD_UID, "") for s in sandboxes} | set(desired())
                    await self.clean_orphans(keep=keep)
                    await self.sweep()
                await asyncio.sleep(period_s)
            else:
                await asyncio.sleep(1.0)


DESIRED = "desired_state_of_world"
ACTUAL = "actual_state_of_world"

# volume type -> upstream's plugin name, for the types whose plugin the spec decides
_PLUGIN_NAMES = {
    "emptyDir": "kubernetes.io/empty-dir",
    "hostPath": "kubernetes.io/host-path",
    "configMap": "kubernetes.io/configmap",
    "secret": "kubernetes.io/secret",
    "downwardAPI": "kubernetes.io/downward-api",
    "projected": "kubernetes.io/projected",
    "nfs": "kubernetes.io/nfs",
}


@runtime_checkable
class NamesPlugins(Protocol):
    """A plugin whose upstream plugin name depends on what the volume resolved to (a
    claim's PV, a CSI driver); None while it is not known."""

    def plugin_name(self, pod_uid: str, volume: JSON) -> str | None: ...

    def forget_pod(self, pod_uid: str) -> None:
        """The pod's volumes are gone: drop what was kept about them."""
        ...


def _plugin_name(plugin: VolumePlugin, volume: JSON, uid: str) -> str | None:
    """Upstream's name of the plugin serving `volume` (`kubernetes.io/csi:<driver>` for a
    CSI volume); None for a claim not resolved yet, which upstream's desired state of the
    world leaves out as well."""
    if isinstance(plugin, NamesPlugins):
        return plugin.plugin_name(uid, volume)
    return _PLUGIN_NAMES.get(volume_type(volume))


@runtime_checkable
class OwnsMoreDirs(Protocol):
    """A plugin that keeps some of its volumes under other plugin directories (a block
    device `local` PV under `kubernetes.io~local-volume`)."""

    def more_dirs(self) -> Mapping[str, Callable[[Path], Awaitable[None]]]:
        """Plugin directory name -> how a volume there is torn down."""
        ...


@runtime_checkable
class Sweeper(Protocol):
    """A plugin with node-wide state to release once no pod uses it."""

    async def sweep(self) -> None: ...


def _volumes(pod: JSON) -> list[JSON]:
    return list((pod.get("spec") or {}).get("volumes") or [])


def _every_volume_failed(pod: JSON, cause: str) -> PodVolumes:
    """Each volume fails with `cause`; a pod without volumes fails under the name of
    its directory, so the caller still reports it and retries."""
    names = [str(v.get("name") or "") for v in _volumes(pod)] or ["pod directory"]
    return PodVolumes(failures=dict.fromkeys(names, cause))


def _remove_emptied(volumes_dir: Path) -> bool:
    """Remove a pod's `volumes` directory whose volumes are all torn down: each plugin
    directory, then itself, by rmdir alone, which removes nothing but an empty directory
    and refuses a mount point (EBUSY); no read of the mount table (issue 42: it was one
    per pod). False when something is left (a stray file, a mount): the caller then
    removes the rest with `fs.remove_tree`."""
    try:
        for plugin_dir in _subdirs(volumes_dir):
            os.rmdir(plugin_dir)
        os.rmdir(volumes_dir)
    except FileNotFoundError:
        return not os.path.lexists(volumes_dir)
    except OSError:
        return False
    return True


def _subdirs(path: Path, *, include_files: bool = False) -> list[Path]:
    try:
        entries = list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(Path(e.path) for e in entries if include_files or e.is_dir(follow_symlinks=False))


def _os_message(err: OSError) -> str:
    where = f" {err.filename}" if err.filename else ""
    return f"{err.strerror or err}{':' if where else ''}{where}"
