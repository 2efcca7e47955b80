"""A container's environment and `$(VAR)` expansion, as pure functions (upstream rules).

Expansion: `$(NAME)` becomes NAME's value when NAME is defined, and stays exactly as
written when it is not; `$$` is an escaped `$` (so `$$(NAME)` yields the literal
`$(NAME)`); any other `$` is kept. Each `env` entry may refer to the entries before it;
command and args are expanded with the finished environment.

Sources: `value`, `valueFrom.fieldRef` (metadata.name/namespace/uid, labels['k'],
annotations['k'], spec.nodeName, spec.serviceAccountName, status.hostIP(s),
status.podIP(s)) and `valueFrom.resourceFieldRef` (limits/requests of cpu, memory,
ephemeral-storage, with a divisor; an unset limit falls back to the node's capacity as
upstream does). ConfigMap and Secret references (`configMapKeyRef`, `secretKeyRef`,
`envFrom`) need the apiserver and are not resolved yet: such a variable is left out,
which `unresolved()` reports so the caller can say so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from klet.config.units import parse_quantity
from klet.model.types import JSON


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":  # escaped dollar
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:  # no closing paren: the rest is literal
                out.append(text[i:])
                break
            name = text[i + 2 : close]
            value = lookup(name)
            out.append(value if value is not None else text[i : close + 1])
            i = close + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class NodeFacts:
    """What the environment may need to know about the node."""

    host_ips: tuple[str, ...] = ()
    cpu_count: int = 1
    memory_bytes: int = 0


_KEYED = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: JSON, path: str, *, pod_ips: tuple[str, ...], node: NodeFacts) -> str | None:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    keyed = _KEYED.match(path)
    if keyed:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    simple: dict[str, str] = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", "default"),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": node.host_ips[0] if node.host_ips else "",
        "status.hostIPs": ",".join(node.host_ips),
        "status.podIP": pod_ips[0] if pod_ips else "",
        "status.podIPs": ",".join(pod_ips),
    }
    return simple.get(path)


def resource_field_ref(container: JSON, ref: JSON, node: NodeFacts) -> str | None:
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or name not in ("cpu", "memory", "ephemeral-storage"):
        return None
    res = container.get("resources") or {}
    raw = (res.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (res.get("limits") or {}).get(name)  # the API defaults requests to limits
    if raw is not None:
        value = parse_quantity(str(raw))
    elif name == "cpu":
        value = Decimal(node.cpu_count)
    elif name == "memory":
        value = Decimal(node.memory_bytes)
    else:
        return None
    divisor = parse_quantity(str(ref.get("divisor") or "1"))
    if divisor <= 0:
        return None
    return str(math.ceil(value / divisor))  # upstream rounds up (1m of CPU → "1")


def container_env(
    pod: JSON, container: JSON, *, pod_ips: tuple[str, ...], node: NodeFacts
) -> list[tuple[str, str]]:
    """The container's variables in order, each expanded with those before it."""
    values: dict[str, str] = {}
    order: list[str] = []
    for var in container.get("env") or []:
        name = str(var.get("name", ""))
        source = var.get("valueFrom") or {}
        value: str | None
        if "value" in var or not source:
            value = expand(str(var.get("value") or ""), values.get)
        elif "fieldRef" in source:
            value = field_ref(
                pod, str(source["fieldRef"].get("fieldPath", "")), pod_ips=pod_ips, node=node
            )
        elif "resourceFieldRef" in source:
            value = resource_field_ref(container, source["resourceFieldRef"], node)
        else:
            value = None  # configMapKeyRef / secretKeyRef: see unresolved()
        if value is None:
            continue
        if name not in values:
            order.append(name)
        values[name] = value
    return [(name, values[name]) for name in order]


def unresolved(container: JSON) -> list[str]:
    """Variables this module cannot resolve yet (ConfigMap/Secret sources)."""
    names = [
        str(v.get("name", ""))
        for v in container.get("env") or []
        if {"configMapKeyRef", "secretKeyRef"} & set((v.get("valueFrom") or {}).keys())
    ]
    if container.get("envFrom"):
        names.append("envFrom")
    return names


def expand_all(items: list[str], env: Mapping[str, str]) -> list[str]:
    return [expand(item, env.get) for item in items]
