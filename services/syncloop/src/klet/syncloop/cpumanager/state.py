"""The CPU manager's state file, `<root-dir>/cpu_manager_state`, in upstream's format.

JSON `{"policyName": ..., "defaultCpuSet": "0-1", "entries": {<pod uid>: {<container>:
"1"}}, "checksum": N}` (entries left out when empty, as Go's omitempty), so a node
moved between klet and the upstream kubelet keeps its exclusive CPUs. The checksum is
upstream's checkpoint checksum: FNV-1a (32 bits) over the text go-spew prints with
dump.ForHash's configuration for the `*state.CPUManagerCheckpoint` value with its
checksum field at 0 (sorted map keys, strings bare, `<nil>` for a nil map); the scheme
of the device manager's checkpoint (devices/checkpoint.py), whose fnv32a is reused.
The unit tests check it against the vectors of upstream's own state_checkpoint_test.go.

A checksum of 0 is accepted unverified, as upstream does for old files. The v1 format
(entries keyed by container ID, written by kubelets before 1.18) is refused naming it:
migrating it needs the runtime's container IDs before the state is read.

Pure: bytes in, values out; the manager reads and writes the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from klet.model.cpuset import CPUSet, CPUSetError, format_cpus, parse_cpus
from klet.syncloop.devices.checkpoint import fnv32a

STATE_FILE = "cpu_manager_state"

Assignments = Mapping[str, Mapping[str, CPUSet]]
"""Pod UID → container name → its exclusive CPUs."""


class StateError(ValueError):
    """The file does not decode, does not verify or does not fit the policy; the
    message is upstream's where it has one."""


@dataclass(frozen=True)
class CPUState:
    policy: str
    default: CPUSet = frozenset()
    """The shared pool (upstream's defaultCpuSet)."""
    assignments: Assignments = field(default_factory=dict)


def _spew(policy: str, default: str, entries: Mapping[str, Mapping[str, str]] | None) -> str:
    if entries is None:
        text = "<nil>"
    else:
        pods = []
        for pod in sorted(entries):
            inner = entries[pod]
            body = " ".join(f"{c}:{inner[c]}" for c in sorted(inner))
            pods.append(f"{pod}:map[{body}]")
        text = "map[" + " ".join(pods) + "]"
    return (
        f"(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} "
        f"DefaultCPUSet:(string){default} "
        f"Entries:(map[string]map[string]string){text} Checksum:(checksum.Checksum)0}}"
    )


def _v1_checksum(policy: str, default: str) -> int:
    """The checksum of a v1 file without entries (Go reads it as v1 first, and checks
    it under v2's type name with v1's map type), which upstream accepts."""
    text = _spew(policy, default, {}).replace(
        "(map[string]map[string]string)", "(map[string]string)"
    )
    return fnv32a(text.encode())


def checksum(policy: str, default: str, entries: Mapping[str, Mapping[str, str]] | None) -> int:
    return fnv32a(_spew(policy, default, entries).encode())


def _entries(state: CPUState) -> dict[str, dict[str, str]]:
    return {
        pod: {c: format_cpus(cpus) for c, cpus in containers.items()}
        for pod, containers in state.assignments.items()
    }


def encode(state: CPUState) -> bytes:
    default = format_cpus(state.default)
    entries = _entries(state)
    doc: dict[str, object] = {"policyName": state.policy, "defaultCpuSet": default}
    if entries:
        doc["entries"] = {p: dict(sorted(c.items())) for p, c in sorted(entries.items())}
    doc["checksum"] = checksum(state.policy, default, entries)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _field(doc: Mapping[str, object], name: str) -> object:
    """Go's encoding/json matches field names case-insensitively."""
    for key, value in doc.items():
        if key.lower() == name.lower():
            return value
    return None


def decode(blob: bytes, *, policy: str) -> CPUState:
    """The state in `blob`, for the configured `policy`; raises StateError."""
    try:
        doc = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as err:
        raise StateError(f"not JSON: {err}") from err
    if not isinstance(doc, dict):
        raise StateError("not a JSON object")
    name, default_text = _field(doc, "policyName") or "", _field(doc, "defaultCpuSet") or ""
    raw_entries = _field(doc, "entries")
    if not isinstance(name, str) or not isinstance(default_text, str):
        raise StateError("policyName and defaultCpuSet must be strings")
    entries: dict[str, dict[str, str]] | None = (
        {} if "entries" not in {k.lower() for k in doc} else None
    )
    if raw_entries is not None:
        if not isinstance(raw_entries, dict):
            raise StateError("entries: not an object")
        entries = {}
        for pod, containers in raw_entries.items():
            if isinstance(containers, str):
                raise StateError(
                    "entries are keyed by container ID (the v1 state format of kubelets "
                    "before 1.18), which klet does not migrate"
                )
            if not isinstance(containers, dict) or not all(
                isinstance(v, str) for v in containers.values()
            ):
                raise StateError(f"entries[{_q(pod)}]: not an object of strings")
            entries[pod] = dict(containers)
    expected = _field(doc, "checksum")
    if expected not in (None, 0):
        actual = checksum(name, default_text, entries)
        if expected != actual and not (
            not entries and expected == _v1_checksum(name, default_text)
        ):
            raise StateError(
                f"checkpoint is corrupted: checksum {expected!r} in the file, {actual} of its data"
            )
    if name != policy:
        raise StateError(
            f"configured policy {_q(policy)} differs from state checkpoint policy {_q(name)}"
        )
    try:
        default = parse_cpus(default_text)
    except CPUSetError as err:
        raise StateError(f"could not parse default cpu set {_q(default_text)}: {err}") from err
    assignments: dict[str, dict[str, CPUSet]] = {}
    for pod, containers in (entries or {}).items():
        assignments[pod] = {}
        for container, text in containers.items():
            try:
                assignments[pod][container] = parse_cpus(text)
            except CPUSetError as err:
                raise StateError(
                    f"could not parse cpuset {_q(text)} for container {_q(container)} in pod "
                    f"{_q(pod)}: {err}"
                ) from err
    return CPUState(policy=name, default=default, assignments=assignments)


def _q(value: object) -> str:
    """Go's %q of a string: double-quoted, escaped."""
    return json.dumps(str(value), ensure_ascii=False)
