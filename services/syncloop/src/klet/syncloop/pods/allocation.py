"""The allocated (and actuated) resources of each pod's containers, checkpointed under
the root directory, so a restarted syncloop, or a standby that becomes leader, neither
reverts an accepted resize nor applies it twice.

Why a file under `--root-dir` and not a bus table: every syncloop replica of a node
shares the root directory already (pod directories, volumes, `vol_data.json`), the file
survives a Redis that restarts empty (the bus tables are rebuilt from the sources and
CRI, and an allocation cannot be: it is the node's decision, not the spec's), and it is
where upstream keeps the same state (`allocated_pods_state`, `actuated_pods_state`).
klet uses its own file names (`klet_allocated_pods_state.json`,
`klet_actuated_pods_state.json`): upstream's format carries a checksum of Go's printed
form, which this file does not reproduce, and an upstream kubelet started on the node
must not misread it. Only the leader writes (standbys run no workers); a stalled former
leader is not fenced here, which is the same window as its CRI calls.

Format: `{"version": 1, "pods": {<uid>: {<container>: <resources>}}, "sha256": <hex of
the canonical JSON of "pods">}`, written whole to a temporary file, fsynced, then
renamed. A file that does not parse or whose digest differs is reported (the caller
logs it once) and treated as empty: the pods' specs are then taken as allocated, as
upstream does after losing its checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from klet.model.types import JSON

ALLOCATED_FILE = "klet_allocated_pods_state.json"
ACTUATED_FILE = "klet_actuated_pods_state.json"
VERSION = 1


class CheckpointError(Exception):
    """The checkpoint file is unreadable, malformed or fails its digest."""


def _canonical(pods: Mapping[str, Mapping[str, JSON]]) -> bytes:
    return json.dumps(pods, sort_keys=True, separators=(",", ":")).encode()


def encode(pods: Mapping[str, Mapping[str, JSON]]) -> bytes:
    body = _canonical(pods)
    doc = {"version": VERSION, "pods": pods, "sha256": hashlib.sha256(body).hexdigest()}
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def decode(raw: bytes, *, path: Path) -> dict[str, dict[str, JSON]]:
    """The pods of a checkpoint; CheckpointError naming the file and the cause."""
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise CheckpointError(f"{path}: not JSON: {err}") from err
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise CheckpointError(f"{path}: version: want {VERSION}, got {doc.get('version')!r}")
    pods = doc.get("pods")
    if not isinstance(pods, dict) or not all(
        isinstance(c, dict) and all(isinstance(r, dict) for r in c.values()) for c in pods.values()
    ):
        raise CheckpointError(f"{path}: pods: want an object of objects of objects")
    if hashlib.sha256(_canonical(pods)).hexdigest() != doc.get("sha256"):
        raise CheckpointError(f"{path}: sha256: the content does not match its digest")
    return pods


@dataclass
class Checkpoint:
    """One state file, kept in memory and written through on every change."""

    path: Path
    pods: dict[str, dict[str, JSON]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> tuple[Checkpoint, CheckpointError | None]:
        """The checkpoint at `path` (empty when missing), and the problem that made a
        present file count as empty."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path), None
        except OSError as err:
            return cls(path), CheckpointError(f"{path}: {err.strerror or err}")
        try:
            return cls(path, decode(raw, path=path)), None
        except CheckpointError as err:
            return cls(path), err

    def get(self, uid: str) -> dict[str, JSON] | None:
        return self.pods.get(uid)

    def put(self, uid: str, containers: Mapping[str, JSON]) -> None:
        if self.pods.get(uid) == containers:
            return
        self.pods[uid] = {k: dict(v) for k, v in containers.items()}
        self._write()

    def remove(self, uid: str) -> None:
        if self.pods.pop(uid, None) is not None:
            self._write()

    def keep_only(self, uids: set[str]) -> None:
        """upstream RemoveOrphanedPods: forget every pod not in `uids`."""
        gone = [u for u in self.pods if u not in uids]
        for uid in gone:
            del self.pods[uid]
        if gone:
            self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, encode(self.pods))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
