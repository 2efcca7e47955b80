"""The CPU manager's configuration (klet.config.validation, klet.config.support):
cpuManagerPolicy static loads with reserved CPUs and is refused without any (upstream's
condition), reservedSystemCPUs must parse and becomes system-reserved cpu (kube-reserved
cpu dropped) as upstream's kubelet does at start, cpuManagerPolicyOptions takes
upstream's names with Go booleans, only under the static policy, and the options klet
does not implement are refused by name when turned on."""

from __future__ import annotations

import dataclasses

import pytest
from klet.config import KubeletConfiguration
from klet.config.support import unimplemented_problems
from klet.config.validation import validate_problems, with_reserved_system_cpus


def _problems(**fields: object) -> list[str]:
    cfg = dataclasses.replace(KubeletConfiguration(), **fields)  # type: ignore[arg-type]
    return [str(p) for p in validate_problems(cfg)]


@pytest.mark.parametrize(
    "fields",
    [
        {"cpu_manager_policy": "static", "kube_reserved": {"cpu": "500m"}},
        {"cpu_manager_policy": "static", "system_reserved": {"cpu": "1"}},
        {"cpu_manager_policy": "static", "reserved_system_cpus": "0"},
        {
            "cpu_manager_policy": "static",
            "reserved_system_cpus": "0",
            "cpu_manager_policy_options": {"full-pcpus-only": "true"},
        },
        {"cpu_manager_policy": "none"},
    ],
)
def test_accepted(fields: dict[str, object]) -> None:
    assert _problems(**fields) == []


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"cpu_manager_policy": "static"}, "cpuManagerPolicy: static needs reserved CPUs"),
        ({"cpu_manager_policy": "dynamic"}, "cpuManagerPolicy: must be one of none, static"),
        ({"reserved_system_cpus": "0-a"}, "reservedSystemCPUs: invalid CPU list '0-a'"),
        (
            {
                "cpu_manager_policy": "static",
                "reserved_system_cpus": "0",
                "cpu_manager_policy_options": {"bogus": "true"},
            },
            "cpuManagerPolicyOptions.bogus: unknown CPU Manager Policy option",
        ),
        (
            {
                "cpu_manager_policy": "static",
                "reserved_system_cpus": "0",
                "cpu_manager_policy_options": {"full-pcpus-only": "yes"},
            },
            "cpuManagerPolicyOptions.full-pcpus-only: must be true or false",
        ),
        (
            {"cpu_manager_policy_options": {"full-pcpus-only": "true"}},
            "cpuManagerPolicyOptions: None policy: received unsupported options",
        ),
    ],
)
def test_refused(fields: dict[str, object], problem: str) -> None:
    assert any(p.startswith(problem) for p in _problems(**fields)), _problems(**fields)


@pytest.mark.parametrize(
    ("option", "refused"),
    [
        ("distribute-cpus-across-numa", True),
        ("prefer-align-cpus-by-uncorecache", True),
        ("align-by-socket", True),
        ("full-pcpus-only", False),
        ("strict-cpu-reservation", False),
        ("distribute-cpus-across-cores", False),
    ],
)
def test_options_klet_lacks_are_refused_by_name(option: str, refused: bool) -> None:
    cfg = dataclasses.replace(
        KubeletConfiguration(),
        cpu_manager_policy="static",
        reserved_system_cpus="0",
        cpu_manager_policy_options={option: "true"},
    )
    problems = [": ".join(map(str, p)) for p in unimplemented_problems(cfg)]
    assert bool(problems) == refused, problems
    if refused:
        assert problems[0].startswith("cpuManagerPolicyOptions: not implemented by klet: ")
        assert option in problems[0]
    off = dataclasses.replace(cfg, cpu_manager_policy_options={option: "false"})
    assert unimplemented_problems(off) == []


def test_reserved_system_cpus_become_system_reserved_cpu() -> None:
    cfg = dataclasses.replace(
        KubeletConfiguration(),
        reserved_system_cpus="0,2-3",
        kube_reserved={"cpu": "500m", "memory": "1Gi"},
        system_reserved={"cpu": "100m"},
    )
    out = with_reserved_system_cpus(cfg)
    assert out.system_reserved == {"cpu": "3"}
    assert out.kube_reserved == {"memory": "1Gi"}
    plain = KubeletConfiguration()
    assert with_reserved_system_cpus(plain) is plain
