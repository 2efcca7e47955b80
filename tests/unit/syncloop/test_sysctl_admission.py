"""Sysctl admission (admission/sysctls.py and its place in AdmissionLedger.decide).

Covers: the safe sysctls are allowed and any other is rejected with upstream's reason
and message (`SysctlForbidden`, `forbidden sysctl: "kernel.msgmax" not allowlisted`,
the [NodeConformance] Sysctls test); slash-separated names are normalized first;
allowedUnsafeSysctls adds names and `prefix*` patterns, an entry of an unknown
namespace is left out; a network sysctl is refused to a hostNetwork pod and an IPC one
to a hostIPC pod even when allowed; the first sysctl not allowed is the one reported;
through AdmissionLedger the check runs after node pressure and before the resource
predicates, and a rejected pod is Failed with "Pod was rejected: ..." through
PodController without a sandbox.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.model.types import JSON
from klet.syncloop.admission.admit import AdmissionLedger, NodeInfo, Verdict
from klet.syncloop.admission.sysctls import SysctlAllowlist, namespace_of

from tests.unit.syncloop.test_admission import READY, World, rec


def pod(*sysctls: tuple[str, str], **spec: Any) -> JSON:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "containers": [{"name": "c", "image": "i"}],
            "securityContext": {"sysctls": [{"name": n, "value": v} for n, v in sysctls]},
            **spec,
        },
    }


SAFE = SysctlAllowlist.of()


@pytest.mark.parametrize(
    ("sysctls", "spec", "want"),
    [
        ((), {}, None),
        ((("kernel.shm_rmid_forced", "1"),), {}, None),
        ((("kernel/shm_rmid_forced", "1"),), {}, None),  # slashes as separators
        ((("net.ipv4.ip_local_port_range", "1024 65000"),), {}, None),
        (
            (("kernel.msgmax", "10000000000"),),
            {},
            'forbidden sysctl: "kernel.msgmax" not allowlisted',
        ),
        (
            (
                ("kernel.shm_rmid_forced", "1"),
                ("net.core.somaxconn", "1024"),
                ("kernel.msgmax", "1"),
            ),
            {},
            'forbidden sysctl: "net.core.somaxconn" not allowlisted',
        ),
        (
            (("net.ipv4.tcp_syncookies", "1"),),
            {"hostNetwork": True},
            'forbidden sysctl: "net.ipv4.tcp_syncookies" not allowed with host Net enabled',
        ),
        (
            (("kernel.shm_rmid_forced", "1"),),
            {"hostIPC": True},
            'forbidden sysctl: "kernel.shm_rmid_forced" not allowed with host IPC enabled',
        ),
        ((("kernel.shm_rmid_forced", "1"),), {"hostNetwork": True}, None),
    ],
)
def test_safe_sysctls(sysctls: tuple[tuple[str, str], ...], spec: JSON, want: str | None) -> None:
    assert SAFE.check(pod(*sysctls, **spec)) == want


def test_allowed_unsafe_sysctls_add_names_and_prefixes() -> None:
    allow = SysctlAllowlist.of(["kernel.msg*", "net/core/somaxconn", "vm.swappiness"])
    assert allow.check(pod(("kernel.msgmax", "1"), ("kernel.msgmnb", "1"))) is None
    assert allow.check(pod(("net.core.somaxconn", "1024"))) is None
    # vm.* is not namespaced: the entry is left out
    assert allow.check(pod(("vm.swappiness", "1"))) == (
        'forbidden sysctl: "vm.swappiness" not allowlisted'
    )
    assert allow.check(pod(("kernel.msgmax", "1"), hostIPC=True)) == (
        'forbidden sysctl: "kernel.msgmax" not allowed with host IPC enabled'
    )


@pytest.mark.parametrize(
    ("name", "ns"),
    [
        ("kernel.sem", "IPC"),
        ("kernel.shm", "IPC"),
        ("fs.mqueue.msg_max", "IPC"),
        ("net.ipv6.conf.all.forwarding", "Net"),
        ("kernel.panic", None),
        ("network", None),
    ],
)
def test_namespace_of(name: str, ns: str | None) -> None:
    assert namespace_of(name) == ns


def test_ledger_checks_sysctls_after_pressure_and_before_resources() -> None:
    node = NodeInfo(name="n", labels={}, allocatable={"pods": 0})
    ledger = AdmissionLedger(node)
    bad = pod(("kernel.msgmax", "1"))
    # node pressure wins over the sysctl check
    assert ledger.decide("a", bad, others=[], pressure=["DiskPressure"]).reason == "Evicted"
    # the sysctl check wins over the resources (no pod fits: pods 0)
    assert ledger.decide("b", bad, others=[]) == Verdict(
        False, "SysctlForbidden", 'forbidden sysctl: "kernel.msgmax" not allowlisted'
    )
    assert ledger.decide("c", pod(), others=[]).reason == "OutOfpods"


async def test_a_pod_with_a_forbidden_sysctl_fails_without_a_sandbox(tmp_path: Path) -> None:
    w = World(tmp_path)
    record = rec("s", 1, securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]})
    w.controller.apply_desired({"s": record}, READY, read_from=0)
    await w.controller.sync_once("s")
    status = w.controller.publisher.get("s")
    assert status is not None
    assert (status["phase"], status["reason"]) == ("Failed", "SysctlForbidden")
    assert status["message"] == (
        'Pod was rejected: forbidden sysctl: "kernel.msgmax" not allowlisted'
    )
    assert not w.cri.sandboxes
