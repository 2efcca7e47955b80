"""Pod DNS as upstream's kubelet forms it: resolv.conf parsing, every dnsPolicy with and
without the host network, the MissingClusterDNS fallback, dnsConfig merging, the
nameserver and search-path limits with their DNSConfigForming messages, the pod's
hostname and domain (truncation, labels, setHostnameAsFQDN), the sandbox config that
carries them, and PodSyncer creating the sandbox with them (or refusing to, with
FailedCreatePodSandBox, when the node's resolver file cannot be read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.cri.types import DNSConfig
from klet.syncloop.containers import criconfig
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.environment import dns
from klet.syncloop.environment.dns import DNSSettings, PodDNSError, ResolvConf
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.pods.syncpod import PodSyncer
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import RecordedEvents, pod, wire

HOST = ResolvConf(
    servers=("192.168.1.1", "192.168.1.2"),
    searches=("corp.example", "example"),
    options=("timeout:2", "rotate"),
)
CLUSTER = DNSSettings(
    cluster_dns=("10.96.0.10",), cluster_domain="cluster.local", resolv_conf="/etc/resolv.conf"
)
CLUSTER_SEARCH = ("ns1.svc.cluster.local", "svc.cluster.local", "cluster.local")
HOST_CFG = DNSConfig(HOST.servers, HOST.searches, HOST.options)
CLUSTER_CFG = DNSConfig(("10.96.0.10",), (*CLUSTER_SEARCH, *HOST.searches), ("ndots:5",))


def a_pod(**spec: Any) -> dict[str, Any]:
    p = pod("app", **spec)
    p["metadata"]["namespace"] = "ns1"
    return p


# -- resolv.conf ----------------------------------------------------------------------------


def test_parse_resolv_conf() -> None:
    text = (
        "# generated\n"
        "nameserver 1.1.1.1\n"
        "search a.example b.example\n"
        "  nameserver 8.8.8.8  # second\n"
        "options ndots:2\n"
        "search c.example. d.example\n"
        "options attempts:3 edns0\n"
        "domain ignored.example\n"
    )
    assert dns.parse_resolv_conf(text) == ResolvConf(
        servers=("1.1.1.1", "8.8.8.8"),
        searches=("c.example", "d.example"),  # the last line wins; trailing dot dropped
        options=("attempts:3", "edns0"),
    )


def test_parse_resolv_conf_refuses_an_empty_nameserver() -> None:
    with pytest.raises(PodDNSError, match="^nameserver list is empty $"):
        dns.parse_resolv_conf("nameserver 1.1.1.1\nnameserver\n")


def test_load_host_config(tmp_path: Path) -> None:
    f = tmp_path / "resolv.conf"
    f.write_text("nameserver 9.9.9.9\nsearch x.example\n")
    assert dns.load_host_config(str(f)) == ResolvConf(("9.9.9.9",), ("x.example",), ())
    assert dns.load_host_config("") == ResolvConf()
    with pytest.raises(PodDNSError) as err:
        dns.load_host_config(str(tmp_path / "missing"))
    assert str(err.value) == f"open {tmp_path / 'missing'}: no such file or directory"


# -- policies -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, CLUSTER_CFG),  # the API default is ClusterFirst
        ({"dnsPolicy": "ClusterFirst"}, CLUSTER_CFG),
        ({"dnsPolicy": "ClusterFirst", "hostNetwork": True}, HOST_CFG),
        ({"dnsPolicy": "ClusterFirstWithHostNet", "hostNetwork": True}, CLUSTER_CFG),
        ({"dnsPolicy": "ClusterFirstWithHostNet"}, CLUSTER_CFG),
        ({"dnsPolicy": "Default"}, HOST_CFG),
        ({"dnsPolicy": "Default", "hostNetwork": True}, HOST_CFG),
        ({"dnsPolicy": "None"}, DNSConfig()),
        ({"dnsPolicy": "None", "hostNetwork": True}, DNSConfig()),
        ({"dnsPolicy": "Bogus"}, CLUSTER_CFG),  # upstream falls back to ClusterFirst
    ],
)
def test_policies(spec: dict[str, Any], expected: DNSConfig) -> None:
    planned = dns.pod_dns(a_pod(**spec), settings=CLUSTER, host=HOST)
    assert planned == dns.PodDNS(expected)


def test_cluster_first_without_cluster_dns_falls_back_to_default_with_a_warning() -> None:
    p = a_pod(dnsPolicy="ClusterFirst")
    planned = dns.pod_dns(p, settings=DNSSettings(cluster_domain="cluster.local"), host=HOST)
    assert planned.config == HOST_CFG
    assert planned.warnings == (
        (
            "MissingClusterDNS",
            'pod: "web-node1_ns1(u1)". kubelet does not have ClusterDNS IP configured and '
            'cannot create Pod using "ClusterFirst" policy. Falling back to "Default" policy.',
        ),
    )
    # ClusterFirstWithHostNet falls back the same way; Default never warns
    warned = dns.pod_dns(
        a_pod(dnsPolicy="ClusterFirstWithHostNet", hostNetwork=True),
        settings=DNSSettings(),
        host=HOST,
    )
    assert [r for r, _ in warned.warnings] == ["MissingClusterDNS"]
    assert dns.pod_dns(a_pod(dnsPolicy="Default"), settings=DNSSettings(), host=HOST).warnings == ()


def test_cluster_first_without_a_cluster_domain_keeps_the_host_searches() -> None:
    settings = DNSSettings(cluster_dns=("10.96.0.10",))
    planned = dns.pod_dns(a_pod(), settings=settings, host=HOST)
    assert planned.config == DNSConfig(("10.96.0.10",), HOST.searches, ("ndots:5",))


def test_cluster_search_has_no_duplicates_of_host_searches() -> None:
    host = ResolvConf(searches=("cluster.local", "example"))
    planned = dns.pod_dns(a_pod(), settings=CLUSTER, host=host)
    assert planned.config.searches == (*CLUSTER_SEARCH, "example")


@pytest.mark.parametrize(
    ("node_ips", "servers"),
    [
        ((), ("127.0.0.1",)),
        (("10.0.0.5",), ("127.0.0.1",)),
        (("fd00::5",), ("::1",)),
        (("10.0.0.5", "fd00::5"), ("127.0.0.1", "::1")),
    ],
)
def test_an_empty_resolv_conf_means_a_local_resolver(
    node_ips: tuple[str, ...], servers: tuple[str, ...]
) -> None:
    settings = DNSSettings(resolv_conf="")
    planned = dns.pod_dns(
        a_pod(dnsPolicy="Default"), settings=settings, host=ResolvConf(), node_ips=node_ips
    )
    assert planned.config == DNSConfig(servers, (".",), ())


# -- dnsConfig ------------------------------------------------------------------------------


def test_dns_config_alone_with_policy_none() -> None:
    p = a_pod(
        dnsPolicy="None",
        dnsConfig={
            "nameservers": ["1.2.3.4"],
            "searches": ["my.dns.search.suffix"],
            "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}],
        },
    )
    planned = dns.pod_dns(p, settings=CLUSTER, host=HOST)
    assert planned.config == DNSConfig(
        ("1.2.3.4",), ("my.dns.search.suffix",), ("ndots:2", "edns0")
    )


def test_dns_config_is_appended_and_options_merged_by_name() -> None:
    p = a_pod(
        dnsConfig={
            "nameservers": ["10.96.0.10", "1.2.3.4"],
            "searches": ["svc.cluster.local", "extra.example"],
            "options": [
                {"name": "ndots", "value": "1"},
                {"name": "single-request-reopen"},
                {"name": "timeout", "value": "3"},
            ],
        }
    )
    planned = dns.pod_dns(p, settings=CLUSTER, host=HOST)
    assert planned.config == DNSConfig(
        ("10.96.0.10", "1.2.3.4"),
        (*CLUSTER_SEARCH, *HOST.searches, "extra.example"),
        ("ndots:1", "single-request-reopen", "timeout:3"),
    )


@pytest.mark.parametrize(
    ("existing", "pod_options", "merged"),
    [
        ([], [], []),
        (["ndots:5"], [{"name": "ndots", "value": "2"}], ["ndots:2"]),
        (["rotate", "timeout:2"], [{"name": "timeout"}], ["rotate", "timeout"]),
        (["edns0"], [{"name": "attempts", "value": "4"}], ["edns0", "attempts:4"]),
        ([], [{"name": "ndots", "value": "1"}, {"name": "ndots", "value": "3"}], ["ndots:3"]),
    ],
)
def test_merge_options(existing: list[str], pod_options: list[Any], merged: list[str]) -> None:
    assert dns.merge_options(existing, pod_options) == merged


# -- limits ---------------------------------------------------------------------------------


def test_at_most_three_nameservers() -> None:
    p = a_pod(dnsPolicy="Default", dnsConfig={"nameservers": ["1.1.1.1", "2.2.2.2"]})
    planned = dns.pod_dns(p, settings=CLUSTER, host=HOST)
    assert planned.config.servers == ("192.168.1.1", "192.168.1.2", "1.1.1.1")
    assert planned.warnings == (
        (
            "DNSConfigForming",
            "Nameserver limits were exceeded, some nameservers have been omitted, "
            "the applied nameserver line is: 192.168.1.1 192.168.1.2 1.1.1.1",
        ),
    )


LONG = [f"{i:02d}" + "y" * 248 for i in range(9)]  # 250 characters each


def _search_warning(line: list[str]) -> tuple[str, str]:
    return (
        "DNSConfigForming",
        "Search Line limits were exceeded, some search paths have been omitted, "
        f"the applied search line is: {' '.join(line)}",
    )


@pytest.mark.parametrize(
    ("searches", "kept"),
    [
        ([f"d{i}.example" for i in range(32)], None),  # exactly at the limit: all kept
        ([f"d{i}.example" for i in range(40)], [f"d{i}.example" for i in range(32)]),
        (["a.example", "x" * 254, "b.example"], ["a.example", "b.example"]),
        (["a.example", "x" * 253], None),  # 253 characters is still a subdomain
        # 2048 characters exactly fits; one more drops domains from the end
        (LONG[:8] + ["z" * 40], None),
        (LONG[:8] + ["z" * 41], LONG[:8]),
        (LONG[:9], LONG[:8]),
    ],
)
def test_search_limits(searches: list[str], kept: list[str] | None) -> None:
    p = a_pod(dnsPolicy="None", dnsConfig={"searches": searches})
    planned = dns.pod_dns(p, settings=CLUSTER, host=HOST)
    if kept is None:
        assert planned.config.searches == tuple(searches)
        assert planned.warnings == ()
    else:
        assert planned.config.searches == tuple(kept)
        assert planned.warnings == (_search_warning(kept),)
    assert len(" ".join(planned.config.searches)) <= dns.MAX_SEARCH_LIST_CHARS


def test_the_cluster_search_counts_towards_the_limits() -> None:
    host = ResolvConf(searches=tuple(f"h{i}.example" for i in range(31)))
    planned = dns.pod_dns(a_pod(), settings=CLUSTER, host=host)
    assert planned.config.searches == (*CLUSTER_SEARCH, *host.searches[:29])
    assert planned.warnings == (_search_warning(list(planned.config.searches)),)


# -- hostname and domain --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "spec", "expected"),
    [
        ("web", {}, ("web", "")),
        ("web", {"hostname": "db-0"}, ("db-0", "")),
        ("web", {"hostname": "db-0", "subdomain": "db"}, ("db-0", "db.ns1.svc.cluster.local")),
        ("web", {"subdomain": "db"}, ("web", "db.ns1.svc.cluster.local")),
        ("a" * 70, {}, ("a" * 63, "")),
        # cut at 63 characters, then no trailing '-' or '.'
        ("a" * 61 + "-.b" + "c" * 10, {}, ("a" * 61, "")),
        ("a" * 62 + "-bcd", {}, ("a" * 62, "")),
    ],
)
def test_hostname_and_domain(name: str, spec: dict[str, Any], expected: tuple[str, str]) -> None:
    p = a_pod(**spec)
    p["metadata"]["name"] = name
    assert dns.hostname_and_domain(p, cluster_domain="cluster.local") == expected


_LABEL_REGEX_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"hostname": "Web"},
            f'pod Hostname "Web" is not a valid DNS label: {_LABEL_REGEX_MESSAGE}',
        ),
        ({"hostname": "a.b"}, 'pod Hostname "a.b" is not a valid DNS label: must not contain dots'),
        (
            {"hostname": "h" * 64},
            f'pod Hostname "{"h" * 64}" is not a valid DNS label: '
            "must be no more than 63 characters",
        ),
        (
            {"subdomain": "x_y"},
            f'pod Subdomain "x_y" is not a valid DNS label: {_LABEL_REGEX_MESSAGE}',
        ),
    ],
)
def test_invalid_hostname_or_subdomain(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(PodDNSError) as err:
        dns.hostname_and_domain(a_pod(**spec), cluster_domain="cluster.local")
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"subdomain": "db"}, "web-node1"),
        ({"setHostnameAsFQDN": True}, "web-node1"),  # no subdomain: no FQDN
        ({"subdomain": "db", "setHostnameAsFQDN": False}, "web-node1"),
        ({"subdomain": "db", "setHostnameAsFQDN": True}, "web-node1.db.ns1.svc.cluster.local"),
    ],
)
def test_kernel_hostname(spec: dict[str, Any], expected: str) -> None:
    assert dns.kernel_hostname(a_pod(**spec), cluster_domain="cluster.local") == expected


def test_an_fqdn_longer_than_64_characters_is_refused() -> None:
    p = a_pod(hostname="h" * 40, subdomain="db", setHostnameAsFQDN=True)
    fqdn = "h" * 40 + ".db.ns1.svc.cluster.local"
    with pytest.raises(PodDNSError) as err:
        dns.kernel_hostname(p, cluster_domain="cluster.local")
    assert str(err.value) == (
        "failed to construct FQDN from pod hostname and cluster domain, FQDN "
        f"{fqdn} is too long (64 characters is the max, {len(fqdn)} characters requested)"
    )


def test_the_sandbox_carries_hostname_and_dns() -> None:
    cfg = DNSConfig(("10.96.0.10",), CLUSTER_SEARCH, ("ndots:5",))
    p = a_pod(hostname="db-0", subdomain="db", setHostnameAsFQDN=True)
    sandbox = criconfig.sandbox_config(
        p,
        attempt=0,
        pod_logs_dir="/logs",
        cgroup_parent="",
        cluster_domain="cluster.local",
        dns_config=cfg,
    )
    assert sandbox.hostname == "db-0.db.ns1.svc.cluster.local"
    assert sandbox.dns == cfg
    # a host-network pod keeps the node's hostname: the sandbox names none
    host_net = criconfig.sandbox_config(
        a_pod(hostNetwork=True, hostname="db-0"), attempt=0, pod_logs_dir="/l", cgroup_parent=""
    )
    assert host_net.hostname == ""


# -- through PodSyncer on the fake runtime ----------------------------------------------------


def _syncer(
    tmp_path: Path, settings: DNSSettings
) -> tuple[PodSyncer, FakeRuntimeService, RecordedEvents]:
    cri = FakeRuntimeService()
    cri.add_image("registry.klet.test/busybox:1.36", 1_000_000)
    events = RecordedEvents()
    sync = SyncSettings(
        pod_logs_dir=tmp_path / "logs",
        root_dir=tmp_path / "root",
        node=NodeFacts(host_ips=("10.0.0.5",)),
        dns=settings,
    )
    syncer = wire(tmp_path, cri, events=events, sync=sync).controller.syncer
    return syncer, cri, events


async def test_the_syncer_creates_the_sandbox_with_the_pods_dns(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 192.168.1.1\nsearch corp.example\n")
    settings = DNSSettings(
        cluster_dns=("10.96.0.10",), cluster_domain="cluster.local", resolv_conf=str(resolv)
    )
    syncer, cri, events = _syncer(tmp_path, settings)
    p = a_pod(hostname="db-0")
    await syncer.sync(p, await syncer.runtime.get("u1"))
    [sandbox] = cri.sandboxes.values()
    assert sandbox.config.dns == DNSConfig(
        ("10.96.0.10",), (*CLUSTER_SEARCH, "corp.example"), ("ndots:5",)
    )
    assert sandbox.config.hostname == "db-0"
    assert "FailedCreatePodSandBox" not in events.reasons()


async def test_an_unreadable_resolv_conf_fails_the_sandbox(tmp_path: Path) -> None:
    missing = tmp_path / "nope.conf"
    syncer, cri, events = _syncer(
        tmp_path, DNSSettings(cluster_dns=("10.96.0.10",), resolv_conf=str(missing))
    )
    result = await syncer.sync(a_pod(), await syncer.runtime.get("u1"))
    assert cri.sandboxes == {}
    assert result.waiting == {"app": ("ContainerCreating", "")}
    assert events.message("FailedCreatePodSandBox") == (
        f"Failed to create pod sandbox: open {missing}: no such file or directory"
    )


async def test_a_too_long_fqdn_fails_the_sandbox(tmp_path: Path) -> None:
    syncer, cri, events = _syncer(tmp_path, DNSSettings(resolv_conf=""))
    p = a_pod(hostname="h" * 60, subdomain="db", setHostnameAsFQDN=True)
    await syncer.sync(p, await syncer.runtime.get("u1"))
    assert cri.sandboxes == {}
    assert "is too long (64 characters is the max" in events.message("FailedCreatePodSandBox")


async def test_warnings_become_pod_events(tmp_path: Path) -> None:
    syncer, cri, events = _syncer(tmp_path, DNSSettings(resolv_conf=""))
    await syncer.sync(a_pod(), await syncer.runtime.get("u1"))
    [sandbox] = cri.sandboxes.values()
    assert sandbox.config.dns == DNSConfig(("127.0.0.1",), (".",), ())
    assert [(e.type, e.reason) for e in events.of("MissingClusterDNS")] == [
        ("Warning", "MissingClusterDNS")
    ]
