"""Service environment variables (environment/servicelinks.py), their place in a
container's environment (envvars.container_env) and how they are read (kubeobjects).

Covers: the variables of a Service in upstream's Docker-links form (host, first port,
named ports, `_PORT` URLs per port and protocol, `_PROTO`/`_PORT`/`_ADDR`; names
upper-cased with `-` as `_`; an IPv6 cluster IP bracketed in URLs); Services without a
cluster IP or ports give none; which Services a pod sees: its namespace's with
enableServiceLinks (the default), only the master `kubernetes` Service of `default`
without it, and its own `kubernetes` Service over the master one; the container's own
variables win and `$(VAR)` expansion falls back to the service variables (the
[NodeConformance] "Pods should contain environment variables for services" test);
env_sources lists the pod's namespace and `default`, skips the former when links are
off, and a failed list makes the environment fail.
"""

from __future__ import annotations

from typing import Any

from klet.model.types import JSON
from klet.syncloop.environment.envvars import EnvError, EnvSources, NodeFacts, container_env
from klet.syncloop.environment.kubeobjects import ApiObjects, env_sources
from klet.syncloop.environment.servicelinks import service_env, visible_services

from tests.unit.syncloop.test_images import Kube


def svc(name: str, namespace: str, ip: str, *ports: dict[str, Any]) -> JSON:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": ip, "ports": list(ports)},
    }


FOOSERVICE = svc(
    "fooservice", "ns", "10.0.0.12", {"port": 8765, "protocol": "TCP", "targetPort": 8080}
)
MASTER = svc("kubernetes", "default", "10.0.0.1", {"name": "https", "port": 443, "protocol": "TCP"})


def test_variables_of_a_service() -> None:
    assert dict(service_env([FOOSERVICE])) == {
        "FOOSERVICE_SERVICE_HOST": "10.0.0.12",
        "FOOSERVICE_SERVICE_PORT": "8765",
        "FOOSERVICE_PORT": "tcp://10.0.0.12:8765",
        "FOOSERVICE_PORT_8765_TCP": "tcp://10.0.0.12:8765",
        "FOOSERVICE_PORT_8765_TCP_PROTO": "tcp",
        "FOOSERVICE_PORT_8765_TCP_PORT": "8765",
        "FOOSERVICE_PORT_8765_TCP_ADDR": "10.0.0.12",
    }


def test_named_ports_protocols_dashes_and_ipv6() -> None:
    multi = svc(
        "my-dns",
        "ns",
        "fd00::10",
        {"name": "dns-udp", "port": 53, "protocol": "UDP"},
        {"name": "metrics", "port": 9153},
    )
    env = dict(service_env([multi]))
    assert env["MY_DNS_SERVICE_HOST"] == "fd00::10"
    assert env["MY_DNS_SERVICE_PORT"] == "53"
    assert env["MY_DNS_SERVICE_PORT_DNS_UDP"] == "53"
    assert env["MY_DNS_SERVICE_PORT_METRICS"] == "9153"
    assert env["MY_DNS_PORT"] == "udp://[fd00::10]:53"
    assert env["MY_DNS_PORT_53_UDP_PROTO"] == "udp"
    assert env["MY_DNS_PORT_9153_TCP"] == "tcp://[fd00::10]:9153"  # TCP by default
    assert env["MY_DNS_PORT_9153_TCP_ADDR"] == "fd00::10"


def test_services_without_a_cluster_ip_or_ports_give_nothing() -> None:
    headless = svc("headless", "ns", "None", {"port": 80})
    external = {"metadata": {"name": "ext", "namespace": "ns"}, "spec": {"type": "ExternalName"}}
    portless = svc("portless", "ns", "10.0.0.9")
    assert service_env([headless, external, portless]) == []


def names(services: list[JSON]) -> list[tuple[str, str]]:
    return [(s["metadata"]["namespace"], s["metadata"]["name"]) for s in services]


def test_which_services_a_pod_sees() -> None:
    other = svc("other", "default", "10.0.0.5", {"port": 80})
    own_kubernetes = svc("kubernetes", "ns", "10.0.0.20", {"port": 80})
    headless = svc("headless", "ns", "None", {"port": 80})
    master = [MASTER, other]
    own = [FOOSERVICE, headless]
    assert names(visible_services("ns", own=own, master=master, links=True)) == [
        ("ns", "fooservice"),
        ("default", "kubernetes"),
    ]
    assert names(visible_services("ns", own=own, master=master, links=False)) == [
        ("default", "kubernetes")
    ]
    assert names(visible_services("ns", own=[own_kubernetes], master=master, links=True)) == [
        ("ns", "kubernetes")
    ]


POD: JSON = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}


def test_container_variables_win_and_expansion_sees_service_variables() -> None:
    sources = EnvSources(service_env=tuple(service_env([FOOSERVICE, MASTER])))
    container = {
        "name": "c",
        "env": [
            {"name": "FOOSERVICE_SERVICE_PORT", "value": "mine"},
            {
                "name": "URL",
                "value": "http://$(FOOSERVICE_SERVICE_HOST):$(FOOSERVICE_SERVICE_PORT)",
            },
        ],
    }
    env = container_env(POD, container, pod_ips=(), node=NodeFacts(), sources=sources)
    as_dict = dict(env)
    assert as_dict["FOOSERVICE_SERVICE_PORT"] == "mine"
    assert as_dict["URL"] == "http://10.0.0.12:mine"
    assert as_dict["KUBERNETES_SERVICE_HOST"] == "10.0.0.1"
    assert as_dict["KUBERNETES_SERVICE_PORT_HTTPS"] == "443"
    assert [n for n, _ in env][:2] == ["FOOSERVICE_SERVICE_PORT", "URL"]  # own ones first
    assert len(env) == len(as_dict)


def test_a_failed_service_list_fails_the_environment() -> None:
    sources = EnvSources(services_failure="failed to list services: forbidden")
    try:
        container_env(POD, {"name": "c"}, pod_ips=(), node=NodeFacts(), sources=sources)
    except EnvError as err:
        assert str(err) == "failed to list services: forbidden"
    else:
        raise AssertionError("no EnvError")


NS_SERVICES = "/api/v1/namespaces/ns/services"
DEFAULT_SERVICES = "/api/v1/namespaces/default/services"


async def test_env_sources_list_the_namespace_and_default() -> None:
    kube = Kube(
        {
            NS_SERVICES: {"items": [FOOSERVICE]},
            DEFAULT_SERVICES: {"items": [MASTER]},
        }
    )
    sources = await env_sources(ApiObjects(kube), POD, {"name": "c"})
    assert sources is not None and sources.services_failure is None
    assert dict(sources.service_env)["FOOSERVICE_SERVICE_HOST"] == "10.0.0.12"
    assert dict(sources.service_env)["KUBERNETES_SERVICE_HOST"] == "10.0.0.1"
    assert sorted(kube.gets) == [DEFAULT_SERVICES, NS_SERVICES]

    kube.gets.clear()
    no_links = {**POD, "spec": {"enableServiceLinks": False}}
    sources = await env_sources(ApiObjects(kube), no_links, {"name": "c"})
    assert sources is not None
    assert {n for n, _ in sources.service_env} == {n for n, _ in service_env([MASTER])}
    assert kube.gets == [DEFAULT_SERVICES]


async def test_env_sources_report_a_failed_list() -> None:
    kube = Kube({DEFAULT_SERVICES: {"items": [MASTER]}}, forbidden=frozenset({NS_SERVICES}))
    sources = await env_sources(ApiObjects(kube), POD, {"name": "c"})
    assert sources is not None
    assert sources.services_failure == 'failed to list services: secrets "x" is forbidden: nope'


async def test_a_static_pod_starts_without_services_when_the_list_fails() -> None:
    kube = Kube({}, forbidden=frozenset({NS_SERVICES, DEFAULT_SERVICES}))
    static = {
        **POD,
        "metadata": {**POD["metadata"], "annotations": {"kubernetes.io/config.source": "file"}},
    }
    sources = await env_sources(ApiObjects(kube), static, {"name": "c"})
    assert sources is not None
    assert sources.services_failure is None
    assert sources.service_env == ()
    env = container_env(static, {"name": "c"}, pod_ips=(), node=NodeFacts(), sources=sources)
    assert not any(name.endswith("_SERVICE_HOST") for name, _ in env)
    # the same pod from the apiserver still waits for the Services
    sources = await env_sources(ApiObjects(kube), POD, {"name": "c"})
    assert sources is not None and sources.services_failure is not None
