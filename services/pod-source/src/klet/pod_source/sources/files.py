"""The static-pod directory source (`staticPodPath`, `--pod-manifest-path`).

Reads one Pod per file from a directory (or the single file the path names), every
fileCheckFrequency, and earlier when inotify reports a change. Rules, as upstream:

- Every regular file whose name does not start with '.' is read, whatever its
  extension: operators name manifests `*.yaml`, `*.json`, `*.manifest` or nothing at
  all, and upstream accepts them all. The cost is that an editor backup such as
  `web.yaml~` is read too; it then carries the same pod name as `web.yaml` and the merge
  drops it as a duplicate, keeping the first file by name (the original).
- No recursion into subdirectories; symlinks are followed; other file types (FIFOs,
  sockets) are skipped, since opening a FIFO would block the scan.
- A missing directory is an empty snapshot: the source still becomes ready and the
  node runs no static pods. A directory that exists but cannot be listed produces no
  snapshot (the last good set stays), because an empty set would remove every pod.
- A bad file (too large, unreadable, unparsable, invalid) is left out of the snapshot
  and reported once per change of its content or error, in the log with its path and
  in `klet_pod_source_manifest_errors_total`; the other files are unaffected.

The scan does blocking file I/O and YAML parsing, so it runs in a worker thread
(`asyncio.to_thread`); this module is the adapter that owns that blocking work. A file
is decoded again only when its stat (inode, size, mtime, ctime) changes, so a poll of
an unchanged directory costs a listing and a stat per file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from klet.model.records import SourceName
from klet.model.types import JSON
from klet.obs import OnceLogger
from klet.pod_source.inbox import Inbox
from klet.pod_source.manifests import ManifestError, Reason, pod_from_file
from klet.pod_source.metrics import Metrics
from klet.pod_source.sources.inotify import DirWatcher, InotifyUnavailable
from klet.pod_source.validation import MAX_MANIFEST_BYTES

log = logging.getLogger(__name__)

# Decoded files by path, with the stat they were decoded at: (dev, ino, size, mtime, ctime).
DecodeCache = dict[str, tuple[tuple[int, ...], "JSON | BadManifest"]]

# After an inotify wake-up, wait this long for the rest of a burst (an editor's
# write + rename + chmod) so one change is one scan.
DEBOUNCE_S = 0.05


@dataclass(frozen=True)
class BadManifest:
    """A file left out of the snapshot; `fingerprint` changes when its content does."""

    path: str
    reason: Reason
    message: str
    fingerprint: str

    @property
    def report_key(self) -> tuple[str, str, str]:
        return (self.reason, self.message, self.fingerprint)


@dataclass(frozen=True)
class Scan:
    """One listing of the path: its pods (in file-name order) and its bad files."""

    status: Literal["ok", "missing", "unreadable"]
    pods: list[JSON] = field(default_factory=list)
    bad: dict[str, BadManifest] = field(default_factory=dict)
    note: str = ""
    cache: DecodeCache = field(default_factory=dict)  # for the next scan

    @property
    def complete(self) -> bool:
        """Whether this scan is a trustworthy full snapshot."""
        return self.status != "unreadable"


def scan(root: Path, *, node_name: str, cache: DecodeCache | None = None) -> Scan:
    """List `root` (a directory or one file) and decode every manifest (blocking).

    `cache` is the previous scan's: a file whose stat did not change is not read again.
    """
    previous = cache or {}
    try:
        root_stat = root.stat()
    except FileNotFoundError:
        return Scan("missing", note=f"{root} does not exist")
    except OSError as err:
        return Scan("unreadable", note=f"cannot stat {root}: {err.strerror or err}")
    if stat.S_ISDIR(root_stat.st_mode):
        try:
            names = sorted(os.listdir(root))
        except FileNotFoundError:
            return Scan("missing", note=f"{root} does not exist")
        except OSError as err:
            return Scan("unreadable", note=f"cannot list {root}: {err.strerror or err}")
        candidates = [root / name for name in names if not name.startswith(".")]
    elif stat.S_ISREG(root_stat.st_mode):
        candidates = [root]
    else:
        return Scan("unreadable", note=f"{root} is neither a directory nor a regular file")

    pods: list[JSON] = []
    bad: dict[str, BadManifest] = {}
    next_cache: DecodeCache = {}
    for path in candidates:
        outcome = _read_one(path, node_name=node_name, previous=previous, cache=next_cache)
        if isinstance(outcome, BadManifest):
            bad[outcome.path] = outcome
        elif outcome is not None:
            pods.append(outcome)
    return Scan("ok", pods=pods, bad=bad, cache=next_cache)


def _read_one(
    path: Path, *, node_name: str, previous: DecodeCache, cache: DecodeCache
) -> JSON | BadManifest | None:
    where = str(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        return None  # removed since the listing (or a dangling symlink)
    except OSError as err:
        return BadManifest(where, "read", f"cannot stat: {err.strerror or err}", "")
    if not stat.S_ISREG(st.st_mode):
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    cached = previous.get(where)
    if cached is not None and cached[0] == key:
        cache[where] = cached
        return cached[1]
    outcome = _decode_file(path, where, st, node_name=node_name)
    # Read errors are not cached: they are usually transient (permissions being fixed).
    if not (isinstance(outcome, BadManifest) and outcome.reason == "read") and outcome is not None:
        cache[where] = (key, outcome)
    return outcome


def _decode_file(
    path: Path, where: str, st: os.stat_result, *, node_name: str
) -> JSON | BadManifest | None:
    if st.st_size > MAX_MANIFEST_BYTES:
        return BadManifest(
            where,
            "too_large",
            f"{st.st_size} bytes, more than {MAX_MANIFEST_BYTES}",
            f"{st.st_size}:{st.st_mtime_ns}",
        )
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)  # the file may have grown since stat
    except FileNotFoundError:
        return None
    except OSError as err:
        return BadManifest(where, "read", f"cannot read: {err.strerror or err}", "")
    try:
        return pod_from_file(data, path=where, node_name=node_name)
    except ManifestError as err:
        return BadManifest(where, err.reason, err.message, hashlib.sha256(data).hexdigest())
    except Exception as err:  # noqa: BLE001 - manifests.py converts; one file never ends the scan
        message = f"{type(err).__name__}: {err}"
        return BadManifest(where, "parse", message, hashlib.sha256(data).hexdigest())


class FileSource:
    """Polls the static-pod path and offers a snapshot when its pods change."""

    def __init__(
        self,
        *,
        path: Path,
        node_name: str,
        period_s: float,
        inbox: Inbox,
        metrics: Metrics,
        use_inotify: bool = True,
    ) -> None:
        self._path = path
        self._node_name = node_name
        self._period_s = period_s
        self._inbox = inbox
        self._metrics = metrics
        self._use_inotify = use_inotify
        self._last: list[JSON] | None = None
        self._cache: DecodeCache = {}
        self._once = OnceLogger(log, level=logging.WARNING)
        self._path_note = ""

    @property
    def name(self) -> SourceName:
        return "file"

    async def run(self) -> None:
        watcher = self._open_watcher()
        try:
            while True:
                self._ensure_watch(watcher)
                await self.run_once()
                await self._wait(watcher)
        finally:
            if watcher is not None:
                watcher.close()

    async def run_once(self) -> None:
        """One scan: report new problems, offer the snapshot if it changed."""
        result = await asyncio.to_thread(
            scan, self._path, node_name=self._node_name, cache=self._cache
        )
        self._cache = result.cache
        self._metrics.file_scans.inc()
        self._report(result)
        if result.complete and result.pods != self._last:
            self._last = result.pods
            self._metrics.snapshots.labels(source="file").inc()
            self._inbox.offer("file", result.pods)
        else:
            self._inbox.polled()

    def _report(self, result: Scan) -> None:
        if result.note != self._path_note:
            self._path_note = result.note
            if result.status == "missing":
                log.info("static pod path missing; no static pods", extra={"path": str(self._path)})
            elif result.status == "unreadable":
                log.warning(
                    "static pod path unreadable; keeping the last set",
                    extra={"path": str(self._path), "error": result.note},
                )
        for path, bad in result.bad.items():
            if self._once.error(
                path,
                f"bad static pod manifest {path}: {bad.message}",
                cause=bad.report_key,
                path=path,
                reason=bad.reason,
                error=bad.message,
            ):
                self._metrics.manifest_errors.labels(source="file", reason=bad.reason).inc()
        if result.complete:
            for gone in [p for p in self._once.active() if p not in result.bad]:
                self._once.clear(gone, "static pod manifest no longer refused", path=gone)

    def _open_watcher(self) -> DirWatcher | None:
        if not self._use_inotify:
            return None
        try:
            watcher = DirWatcher()
        except InotifyUnavailable as err:
            log.warning(
                "inotify unavailable; polling the static pod path only",
                extra={"error": str(err), "period_s": self._period_s},
            )
            return None
        watcher.attach(asyncio.get_running_loop())
        return watcher

    def _ensure_watch(self, watcher: DirWatcher | None) -> None:
        if watcher is None:
            return
        # A single manifest file is watched through its directory: editors replace files
        # by rename, which would leave a watch on the file itself on the old inode.
        target = self._path if self._path.is_dir() else self._path.parent
        try:
            watcher.watch(target)
        except InotifyUnavailable as err:
            if not self._use_inotify:
                return
            self._use_inotify = False  # log once; the poll carries on
            log.warning(
                "cannot watch the static pod path; polling only",
                extra={"path": str(target), "error": str(err)},
            )

    async def _wait(self, watcher: DirWatcher | None) -> None:
        if watcher is None or not watcher.watching or not self._use_inotify:
            await asyncio.sleep(self._period_s)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._period_s):
                await watcher.changed.wait()
            await asyncio.sleep(DEBOUNCE_S)
        watcher.changed.clear()
