"""The memory manager's state file, `<root-dir>/memory_manager_state`, in upstream's format.

JSON `{"policyName": "Static", "machineState": {"0": {"numberOfAssignments": N,
"memoryMap": {"memory": {"total", "systemReserved", "allocatable", "reserved",
"free"}, "hugepages-2Mi": {...}}, "cells": [0]}}, "entries": {pod UID: {container:
[{"numaAffinity": [0], "type": "memory", "size": N}]}}, "checksum": N}`, `entries` left
out when empty (Go's omitempty), so a node moved between klet and the upstream kubelet
keeps its NUMA assignments.

The checksum is upstream's checkpoint checksum: FNV-1a (32 bits) over the text go-spew
prints (`dump.ForHash`) for the `*MemoryManagerCheckpoint` with its checksum at 0. That
text is rebuilt here for this one type; its shape (pointers inside maps printed `<*>`,
struct fields typed, map and slice elements bare, keys sorted, `<nil>` apart from empty)
was read from the output of upstream's own code, and tests/unit/syncloop's sample is a
file upstream's MarshalCheckpoint wrote. Go's nil and empty differ in that text, so the
model keeps `None` apart from empty lists and maps.

Pure: bytes in, values out; the manager reads and writes the file.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from klet.syncloop.devices.checkpoint import fnv32a

__all__ = [
    "STATE_FILE",
    "Block",
    "MemoryState",
    "MemoryTable",
    "NodeState",
    "StateError",
    "checksum",
    "decode",
    "encode",
    "spew_text",
]

STATE_FILE = "memory_manager_state"


class StateError(ValueError):
    """The file does not decode or does not verify; the message says where."""


@dataclass
class MemoryTable:
    """One memory type on one NUMA node, in bytes (upstream's MemoryTable)."""

    total: int
    system_reserved: int
    allocatable: int
    reserved: int
    free: int


@dataclass
class NodeState:
    """One NUMA node: its memory by type and the node group it is assigned with."""

    number_of_assignments: int = 0
    memory_map: dict[str, MemoryTable] | None = field(default_factory=dict)
    cells: list[int] | None = field(default_factory=list)


@dataclass
class Block:
    """Memory of one type given to one container, on these NUMA nodes."""

    numa_affinity: list[int] | None
    type: str
    size: int


@dataclass
class MemoryState:
    policy: str
    machine: dict[int, NodeState] | None = field(default_factory=dict)
    entries: dict[str, dict[str, list[Block]]] | None = field(default_factory=dict)
    """Pod UID → container name → its blocks."""

    def clone(self) -> MemoryState:
        return copy.deepcopy(self)

    def blocks(self, uid: str, container: str) -> list[Block] | None:
        return (self.entries or {}).get(uid, {}).get(container)


# -- go-spew text and checksum ---------------------------------------------------------


def _ints(values: list[int] | None) -> str:
    return "<nil>" if values is None else "[" + " ".join(str(v) for v in values) + "]"


def _table(t: MemoryTable) -> str:
    return (
        f"<*>{{TotalMemSize:(uint64){t.total} SystemReserved:(uint64){t.system_reserved} "
        f"Allocatable:(uint64){t.allocatable} Reserved:(uint64){t.reserved} "
        f"Free:(uint64){t.free}}}"
    )


def _node(n: NodeState) -> str:
    if n.memory_map is None:
        mm = "<nil>"
    else:
        mm = "map[" + " ".join(f"{k}:{_table(n.memory_map[k])}" for k in sorted(n.memory_map)) + "]"
    return (
        f"<*>{{NumberOfAssignments:(int){n.number_of_assignments} "
        f"MemoryMap:(map[v1.ResourceName]*state.MemoryTable){mm} Cells:([]int){_ints(n.cells)}}}"
    )


def _block(b: Block) -> str:
    return (
        f"{{NUMAAffinity:([]int){_ints(b.numa_affinity)} Type:(v1.ResourceName){b.type} "
        f"Size:(uint64){b.size}}}"
    )


def spew_text(s: MemoryState) -> str:
    """What upstream's dump.ForHash prints for the checkpoint with checksum 0."""
    if s.machine is None:
        machine = "<nil>"
    else:
        machine = "map[" + " ".join(f"{k}:{_node(s.machine[k])}" for k in sorted(s.machine)) + "]"
    if s.entries is None:
        entries = "<nil>"
    else:
        pods = []
        for uid in sorted(s.entries):
            containers = s.entries[uid]
            inner = []
            for name in sorted(containers):
                blocks = containers[name]
                text = "<nil>" if blocks is None else "[" + " ".join(map(_block, blocks)) + "]"
                inner.append(f"{name}:{text}")
            pods.append(f"{uid}:map[" + " ".join(inner) + "]")
        entries = "map[" + " ".join(pods) + "]"
    return (
        f"(*state.MemoryManagerCheckpoint){{PolicyName:(string){s.policy} "
        f"MachineState:(state.NUMANodeMap){machine} "
        f"Entries:(state.ContainerMemoryAssignments){entries} Checksum:(checksum.Checksum)0}}"
    )


def checksum(s: MemoryState) -> int:
    return fnv32a(spew_text(s).encode())


# -- JSON ------------------------------------------------------------------------------


def _table_json(t: MemoryTable) -> dict[str, int]:
    return {
        "total": t.total,
        "systemReserved": t.system_reserved,
        "allocatable": t.allocatable,
        "reserved": t.reserved,
        "free": t.free,
    }


def _node_json(n: NodeState) -> dict[str, Any]:
    return {
        "numberOfAssignments": n.number_of_assignments,
        "memoryMap": None
        if n.memory_map is None
        else {k: _table_json(n.memory_map[k]) for k in sorted(n.memory_map)},
        "cells": n.cells,
    }


def encode(s: MemoryState) -> bytes:
    doc: dict[str, Any] = {"policyName": s.policy}
    doc["machineState"] = (
        None
        if s.machine is None
        else {str(k): _node_json(s.machine[k]) for k in sorted(s.machine, key=str)}
    )
    if s.entries:
        doc["entries"] = {
            uid: {
                name: None
                if blocks is None
                else [
                    {"numaAffinity": b.numa_affinity, "type": b.type, "size": b.size}
                    for b in blocks
                ]
                for name, blocks in sorted(containers.items())
            }
            for uid, containers in sorted(s.entries.items())
        }
    doc["checksum"] = checksum(s)
    return json.dumps(doc, separators=(",", ":")).encode()


def _uint(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StateError(f"{where}: not an unsigned integer: {value!r}")
    return value


def _int_list(value: object, where: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise StateError(f"{where}: not a list: {value!r}")
    return [_uint(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _obj(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise StateError(f"{where}: not an object: {value!r}")
    return value


def _decode_node(raw: object, where: str) -> NodeState:
    n = _obj(raw, where)
    mm_raw = n.get("memoryMap")
    memory_map: dict[str, MemoryTable] | None = None
    if mm_raw is not None:
        memory_map = {}
        for name, t_raw in _obj(mm_raw, f"{where}.memoryMap").items():
            w = f"{where}.memoryMap.{name}"
            t = _obj(t_raw, w)
            memory_map[name] = MemoryTable(
                total=_uint(t.get("total", 0), f"{w}.total"),
                system_reserved=_uint(t.get("systemReserved", 0), f"{w}.systemReserved"),
                allocatable=_uint(t.get("allocatable", 0), f"{w}.allocatable"),
                reserved=_uint(t.get("reserved", 0), f"{w}.reserved"),
                free=_uint(t.get("free", 0), f"{w}.free"),
            )
    return NodeState(
        number_of_assignments=_uint(
            n.get("numberOfAssignments", 0), f"{where}.numberOfAssignments"
        ),
        memory_map=memory_map,
        cells=_int_list(n.get("cells"), f"{where}.cells"),
    )


def decode(raw: bytes) -> MemoryState:
    """The state in a file's bytes. Raises StateError naming the field, or upstream's
    "checkpoint is corrupted" when the checksum does not match (a checksum of 0 is
    not checked, as upstream's Verify)."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise StateError(f"not JSON: {err}") from None
    doc = _obj(doc, "the file")
    policy = doc.get("policyName", "")
    if not isinstance(policy, str):
        raise StateError(f"policyName: not a string: {policy!r}")
    machine: dict[int, NodeState] | None = None
    if doc.get("machineState") is not None:
        machine = {}
        for key, node in _obj(doc["machineState"], "machineState").items():
            try:
                node_id = int(key)
            except ValueError:
                raise StateError(f"machineState: NUMA node {key!r} is not an integer") from None
            machine[node_id] = _decode_node(node, f"machineState.{key}")
    entries: dict[str, dict[str, list[Block]]] | None = {}
    if "entries" in doc:
        raw_entries = doc["entries"]
        entries = None if raw_entries is None else {}
        for uid, containers in _obj(raw_entries or {}, "entries").items():
            assert entries is not None
            entries[uid] = {}
            for name, blocks in _obj(containers, f"entries.{uid}").items():
                if not isinstance(blocks, list):
                    raise StateError(f"entries.{uid}.{name}: not a list")
                entries[uid][name] = []
                for i, b_raw in enumerate(blocks):
                    w = f"entries.{uid}.{name}[{i}]"
                    b = _obj(b_raw, w)
                    kind = b.get("type", "")
                    if not isinstance(kind, str):
                        raise StateError(f"{w}.type: not a string: {kind!r}")
                    entries[uid][name].append(
                        Block(
                            numa_affinity=_int_list(b.get("numaAffinity"), f"{w}.numaAffinity"),
                            type=kind,
                            size=_uint(b.get("size", 0), f"{w}.size"),
                        )
                    )
    state = MemoryState(policy=policy, machine=machine, entries=entries)
    expected = _uint(doc.get("checksum", 0), "checksum")
    if expected != 0 and expected != checksum(state):
        raise StateError(
            f"checkpoint is corrupted: checksum {expected} in the file, {checksum(state)} "
            "of its data"
        )
    return state
