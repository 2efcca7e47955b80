"""The memory manager's state file (klet.syncloop.memorymanager.state) in upstream's
format: a file upstream's own MarshalCheckpoint wrote (two NUMA nodes, memory and
hugepages tables, one container's blocks) decodes and is written back byte for byte;
the file upstream's state_checkpoint_test.go restores verifies; the None policy's empty
file matches upstream's; a changed byte, bad JSON and wrong types are refused naming
the field; nil and empty lists keep their own checksums, as Go's."""

from __future__ import annotations

import pytest
from klet.syncloop.memorymanager.state import (
    Block,
    MemoryState,
    MemoryTable,
    NodeState,
    StateError,
    checksum,
    decode,
    encode,
)

# Written by upstream v1.34.4's MemoryManagerCheckpoint.MarshalCheckpoint (a Go program
# over k8s.io/kubernetes/pkg/kubelet/cm/memorymanager/state, built from the module cache).
UPSTREAM_STATIC = (
    b'{"policyName":"Static","machineState":{"0":{"numberOfAssignments":2,"memoryMap":'
    b'{"hugepages-2Mi":{"total":0,"systemReserved":0,"allocatable":0,"reserved":0,"free":0},'
    b'"memory":{"total":8000000000,"systemReserved":1000000000,"allocatable":7000000000,'
    b'"reserved":104857600,"free":6895142400}},"cells":[0]},"1":{"numberOfAssignments":0,'
    b'"memoryMap":{"memory":{"total":8000000000,"systemReserved":0,"allocatable":8000000000,'
    b'"reserved":0,"free":8000000000}},"cells":[1]}},"entries":{"pod-uid-1":{"app":'
    b'[{"numaAffinity":[0],"type":"memory","size":104857600},{"numaAffinity":[0],'
    b'"type":"hugepages-2Mi","size":0}]}},"checksum":1074221736}'
)
UPSTREAM_NONE = b'{"policyName":"None","machineState":{},"checksum":4236770233}'


def test_upstreams_file_decodes_and_is_written_back_byte_for_byte() -> None:
    state = decode(UPSTREAM_STATIC)
    assert state.policy == "Static"
    assert state.machine is not None
    node0 = state.machine[0]
    assert node0.number_of_assignments == 2 and node0.cells == [0]
    assert node0.memory_map is not None
    assert node0.memory_map["memory"] == MemoryTable(
        8000000000, 1000000000, 7000000000, 104857600, 6895142400
    )
    assert state.blocks("pod-uid-1", "app") == [
        Block([0], "memory", 104857600),
        Block([0], "hugepages-2Mi", 0),
    ]
    assert encode(state) == UPSTREAM_STATIC


def test_the_none_policys_file_is_upstreams() -> None:
    assert decode(UPSTREAM_NONE) == MemoryState("None", {}, {})
    assert encode(MemoryState("None")) == UPSTREAM_NONE


def test_upstreams_restore_test_file_verifies() -> None:
    raw = (
        b'{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":'
        b'{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,'
        b'"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],'
        b'"type":"memory","size":512}]}},"checksum": 4215593881}'
    )
    state = decode(raw)
    assert state.machine is not None and state.machine[0].cells == []
    assert state.blocks("pod", "container1") == [Block([0], "memory", 512)]


def test_a_changed_value_fails_the_checksum() -> None:
    with pytest.raises(StateError, match="checkpoint is corrupted"):
        decode(UPSTREAM_STATIC.replace(b'"size":104857600', b'"size":104857601'))


def test_a_zero_checksum_is_not_checked() -> None:
    assert decode(b'{"policyName":"None","machineState":{}}').policy == "None"


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"{", "not JSON"),
        (b'{"policyName":1}', "policyName"),
        (b'{"policyName":"Static","machineState":{"x":{}}}', "machineState"),
        (b'{"policyName":"Static","machineState":{"0":{"cells":"0"}}}', "machineState.0.cells"),
        (
            b'{"policyName":"Static","entries":{"p":{"c":[{"size":-1}]}}}',
            r"entries.p.c\[0\].size",
        ),
    ],
)
def test_bad_files_are_refused_naming_the_field(raw: bytes, where: str) -> None:
    with pytest.raises(StateError, match=where):
        decode(raw)


def test_nil_and_empty_cells_hash_differently_as_in_go() -> None:
    empty = MemoryState("Static", {0: NodeState(0, {}, [])}, {})
    nil = MemoryState("Static", {0: NodeState(0, {}, None)}, {})
    assert checksum(empty) != checksum(nil)
    assert decode(encode(nil)) == nil
    assert decode(encode(empty)) == empty
