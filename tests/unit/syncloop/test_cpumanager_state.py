"""The CPU manager's state file (klet.syncloop.cpumanager.state) in upstream's format:
the files of upstream's own state_checkpoint_test.go decode here with their checksums
(v2, and v1's without entries), a bad checksum, another policy, an unparsable cpuset
and the v1 entries are refused with upstream's messages, and what klet writes is
upstream's JSON with a checksum upstream verifies."""

from __future__ import annotations

import json

import pytest
from klet.syncloop.cpumanager.state import CPUState, StateError, checksum, decode, encode


def test_upstreams_files_verify() -> None:
    state = decode(
        b'{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 354655845}',
        policy="none",
    )
    assert state == CPUState(policy="none", default=frozenset({4, 5, 6}))
    state = decode(
        b'{"policyName": "none", "defaultCPUSet": "1-3", "entries": {"pod": {"container1": '
        b'"4-6", "container2": "1-3"}}, "checksum": 3610638499}',
        policy="none",
    )
    assert state.assignments == {"pod": {"container1": {4, 5, 6}, "container2": {1, 2, 3}}}
    assert state.default == {1, 2, 3}


def test_a_v1_file_without_entries_verifies_with_v1s_checksum() -> None:
    state = decode(
        b'{"policyName": "none", "defaultCPUSet": "1-3", "checksum": 1694838852}', policy="none"
    )
    assert state.default == {1, 2, 3}


def test_a_zero_checksum_is_accepted_as_upstream() -> None:
    assert decode(b'{"policyName":"static","defaultCpuSet":"0-1"}', policy="static").default == {
        0,
        1,
    }


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (
            b'{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 1337}',
            "checkpoint is corrupted",
        ),
        (b"{", "not JSON"),
        (
            b'{"policyName": "other", "defaultCPUSet": "1-3", "entries": {}, '
            b'"checksum": 1394507217}',
            'configured policy "none" differs from state checkpoint policy "other"',
        ),
        (
            b'{"policyName": "none", "defaultCPUSet": "1.3", "entries": {}, '
            b'"checksum": 3021697696}',
            'could not parse default cpu set "1.3"',
        ),
        (
            b'{"policyName": "none", "defaultCPUSet": "1-3", "entries": {"pod": {"container1": '
            b'"4-6", "container2": "asd"}}, "checksum": 962272150}',
            'could not parse cpuset "asd" for container "container2" in pod "pod"',
        ),
        (
            b'{"policyName": "none", "defaultCPUSet": "1-3", "entries": {"containerID1": '
            b'"4-6"}, "checksum": 3680390589}',
            "v1 state format",
        ),
    ],
)
def test_bad_files_are_refused_with_upstreams_messages(blob: bytes, message: str) -> None:
    with pytest.raises(StateError, match=message):
        decode(blob, policy="none")


def test_klet_writes_upstreams_json_and_checksum() -> None:
    state = CPUState(
        policy="static",
        default=frozenset({0}),
        assignments={"uid-1": {"app": frozenset({1})}},
    )
    blob = encode(state)
    doc = json.loads(blob)
    assert list(doc) == ["policyName", "defaultCpuSet", "entries", "checksum"]
    assert doc["defaultCpuSet"] == "0"
    assert doc["entries"] == {"uid-1": {"app": "1"}}
    assert doc["checksum"] == checksum("static", "0", {"uid-1": {"app": "1"}})
    assert decode(blob, policy="static") == state
    # no entries: left out, as Go's omitempty
    empty = json.loads(encode(CPUState(policy="none")))
    assert empty == {"policyName": "none", "defaultCpuSet": "", "checksum": empty["checksum"]}
    assert decode(encode(CPUState(policy="none")), policy="none") == CPUState(policy="none")
