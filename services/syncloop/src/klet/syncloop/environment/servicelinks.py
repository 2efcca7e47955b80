"""Service environment variables ("service links"), as pure functions of the Services.

Upstream's kubelet gives every container, besides its own variables, a set per Service
it can see, in the Docker-links form clients of the 2014 era read:

    <NAME>_SERVICE_HOST=<clusterIP>              <NAME>_SERVICE_PORT=<first port>
    <NAME>_SERVICE_PORT_<PORT NAME>=<port>       (each named port)
    <NAME>_PORT=<proto>://<clusterIP>:<first port>
    <NAME>_PORT_<port>_<PROTO>=<proto>://<clusterIP>:<port>
    <NAME>_PORT_<port>_<PROTO>_PROTO / _PORT / _ADDR

where NAME is the Service's name upper-cased with `-` as `_`, and an IPv6 clusterIP is
bracketed in the URLs. The Services seen are those of the pod's namespace when
`enableServiceLinks` is true (the API's default), and always the master Service
`kubernetes` of the `default` namespace (unless the pod's namespace has its own Service
of that name and links are on). Services without a cluster IP (headless, ExternalName)
give nothing.

The container's own variables win: these only fill names it does not define, and they
serve `$(VAR)` expansion of its `env` values after its own (envvars.container_env).
"""

from __future__ import annotations

from collections.abc import Iterable

from klet.model.types import JSON

MASTER_NAMESPACE = "default"
MASTER_SERVICES = frozenset({"kubernetes"})


def links_enabled(pod: JSON) -> bool:
    """spec.enableServiceLinks, true unless set to false."""
    return (pod.get("spec") or {}).get("enableServiceLinks") is not False


def has_cluster_ip(service: JSON) -> bool:
    ip = str((service.get("spec") or {}).get("clusterIP") or "")
    return ip not in ("", "None")


def visible_services(
    namespace: str, *, own: Iterable[JSON], master: Iterable[JSON], links: bool
) -> list[JSON]:
    """The Services whose variables a pod in `namespace` gets: `own` (its namespace's,
    when `links`) by name, then master Services of the default namespace whose name is
    not taken; each with a cluster IP."""
    by_name: dict[str, JSON] = {}
    if links:
        for svc in own:
            meta = svc.get("metadata") or {}
            if (meta.get("namespace") or namespace) == namespace and has_cluster_ip(svc):
                by_name[str(meta.get("name", ""))] = svc
    for svc in master:
        meta = svc.get("metadata") or {}
        name = str(meta.get("name", ""))
        if (
            meta.get("namespace") == MASTER_NAMESPACE
            and name in MASTER_SERVICES
            and has_cluster_ip(svc)
        ):
            by_name.setdefault(name, svc)
    return [by_name[name] for name in sorted(by_name)]


def _var_name(text: str) -> str:
    return text.replace("-", "_").upper()


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def service_env(services: Iterable[JSON]) -> list[tuple[str, str]]:
    """The variables of `services` (each with a cluster IP and at least one port)."""
    out: list[tuple[str, str]] = []
    for svc in services:
        spec = svc.get("spec") or {}
        ports = list(spec.get("ports") or [])
        if not has_cluster_ip(svc) or not ports:
            continue
        ip = str(spec["clusterIP"])
        prefix = _var_name(str((svc.get("metadata") or {}).get("name", "")))
        out.append((f"{prefix}_SERVICE_HOST", ip))
        out.append((f"{prefix}_SERVICE_PORT", str(int(ports[0].get("port", 0)))))
        for port in ports:
            if port.get("name"):
                out.append(
                    (f"{prefix}_SERVICE_PORT_{_var_name(str(port['name']))}", str(port["port"]))
                )
        for i, port in enumerate(ports):
            number = int(port.get("port", 0))
            protocol = str(port.get("protocol") or "TCP")
            url = f"{protocol.lower()}://{_host_port(ip, number)}"
            if i == 0:
                out.append((f"{prefix}_PORT", url))
            base = f"{prefix}_PORT_{number}_{protocol.upper()}"
            out += [
                (base, url),
                (f"{base}_PROTO", protocol.lower()),
                (f"{base}_PORT", str(number)),
                (f"{base}_ADDR", ip),
            ]
    return out
