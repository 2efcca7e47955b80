"""A container's environment and `$(VAR)` expansion, as pure functions (upstream rules).

Expansion: `$(NAME)` becomes NAME's value when NAME is defined, and stays exactly as
written when it is not; `$$` is an escaped `$` (so `$$(NAME)` yields the literal
`$(NAME)`); any other `$` is kept. Each `env` entry may refer to the entries before it;
command and args are expanded with the finished environment.

Sources: `value`, `valueFrom.fieldRef` (metadata.name/namespace/uid, labels['k'],
annotations['k'], spec.nodeName, spec.serviceAccountName, status.hostIP(s),
status.podIP(s)) and `valueFrom.resourceFieldRef` (limits/requests of cpu, memory,
ephemeral-storage, with a divisor; an unset limit falls back to the node's capacity as
upstream does), `valueFrom.configMapKeyRef` / `secretKeyRef` and `envFrom` (ConfigMap
or Secret, with a prefix). The referenced objects are read by the caller (through the
apiserver, `kubeobjects.py`) and passed in as `EnvSources`; a reference that cannot be
resolved fails the whole environment with upstream's message (`EnvError`), unless it is
optional and the object or key is merely missing. Without an apiserver (standalone) any
reference fails, as upstream's does without an API client. envFrom keys are taken as
they are: since Kubernetes 1.30 the kubelet no longer skips keys that are not C
identifiers (the apiserver validates names).

Secret values are bytes. Upstream hands them to the runtime unchanged, but the CRI
carries an environment value as a protobuf string, which must be UTF-8 (our protobuf
runtime refuses anything else), so a value that is not UTF-8 can only be changed
(replacement characters: a different secret, silently) or refused. It is refused: the
container waits with CreateContainerConfigError naming the variable, the Secret and
the key. `kubeobjects` keeps such bytes as lone surrogates (`surrogateescape`), so
nothing is lost before this check; a Secret volume gets the exact bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from klet.model import pod as podmodel
from klet.model.types import JSON
from klet.model.units import parse_quantity


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
    cpu_millis: int = 1000
    """The node's allocatable CPU, millicores: a container's `limits.cpu` where neither it
    nor the pod sets one (upstream's MergeContainerResourceLimits)."""
    memory_bytes: int = 0
    """The node's allocatable memory: likewise for `limits.memory`, and the size of a
    memory-backed emptyDir without a limit."""


_KEYED = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")

_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def go_quote(text: str) -> str:
    """`text` as a double-quoted string the way Go's `%q` writes it (strconv.Quote)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def format_map(values: Mapping[str, str]) -> str:
    """Labels or annotations as the downward API writes them: `key="value"` lines sorted
    by key, values quoted as Go's `%q` does, no newline after the last."""
    return "\n".join(f"{k}={go_quote(str(values[k]))}" for k in sorted(values))


def field_ref(pod: JSON, path: str, *, pod_ips: tuple[str, ...], node: NodeFacts) -> str | None:
    """The value of a downward API `fieldPath` (env and volumes), None if unsupported."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    keyed = _KEYED.match(path)
    if keyed:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        return format_map(meta.get(path.partition(".")[2]) or {})
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


def resource_field_ref(
    container: JSON, ref: JSON, node: NodeFacts, *, pod: JSON | None = None
) -> str | None:
    """A downward API `resourceFieldRef`: the container's own value; for a limit it does
    not set, the pod-level limit (PodLevelResources, upstream's
    defaultPodLimitsForDownwardAPI), else the node's."""
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or name not in ("cpu", "memory", "ephemeral-storage"):
        return None
    res = container.get("resources") or {}
    raw = (res.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (res.get("limits") or {}).get(name)  # the API defaults requests to limits
    if raw is None and kind == "limits" and pod is not None:
        raw = podmodel.pod_level(pod)[1].get(name) or None
    if raw is not None:
        value = parse_quantity(str(raw))
    elif name == "cpu":
        value = Decimal(node.cpu_millis) / 1000
    elif name == "memory":
        value = Decimal(node.memory_bytes)
    else:
        return None
    # The apiserver writes an unset divisor as the zero Quantity ("0"), which upstream
    # reads as 1, as it does a missing one.
    divisor = parse_quantity(str(ref.get("divisor") or "0"))
    if divisor == 0:
        divisor = Decimal(1)
    if divisor < 0:
        return None
    return str(math.ceil(value / divisor))  # upstream rounds up (1m of CPU → "1")


class EnvError(Exception):
    """The environment cannot be built; the message is upstream's, and the container
    waits with CreateContainerConfigError."""


@dataclass(frozen=True)
class EnvSources:
    """The ConfigMaps and Secrets (of the pod's namespace) a container refers to, as read
    from the apiserver: `data` by name (Secret values decoded). A referenced name in
    neither map and not in `failures` does not exist; `failures` holds why an object
    could not be read at all, by `("configmap" | "secret", name)`."""

    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Secret values as text; bytes that are not UTF-8 as lone surrogates
    (`bytes.decode("utf-8", "surrogateescape")`), so they can be told apart."""
    failures: Mapping[tuple[str, str], str] = field(default_factory=dict)
    service_env: tuple[tuple[str, str], ...] = ()
    """The service variables of the Services the pod sees (servicelinks.py), in order."""
    services_failure: str | None = None
    """Why the Services could not be listed (the container then cannot start)."""


def references(container: JSON) -> tuple[list[str], list[str]]:
    """The ConfigMap and Secret names the container's `envFrom` and `env` use, in order."""
    config_maps: list[str] = []
    secrets: list[str] = []

    def add(names: list[str], ref: JSON | None) -> None:
        name = str((ref or {}).get("name", ""))
        if ref is not None and name not in names:
            names.append(name)

    for source in container.get("envFrom") or []:
        add(config_maps, source.get("configMapRef"))
        add(secrets, source.get("secretRef"))
    for var in container.get("env") or []:
        value_from = var.get("valueFrom") or {}
        add(config_maps, value_from.get("configMapKeyRef"))
        add(secrets, value_from.get("secretKeyRef"))
    return config_maps, secrets


_LABELS = {"configmap": ("configMap", "ConfigMap"), "secret": ("secret", "Secret")}


class _Objects:
    """Upstream's lookups of referenced objects, with its messages."""

    def __init__(self, namespace: str, sources: EnvSources | None) -> None:
        self.namespace = namespace
        self.sources = sources

    def data(self, kind: str, ref: JSON) -> Mapping[str, str] | None:
        """The object's data; None when it is missing and the reference is optional."""
        name = str(ref.get("name", ""))
        if self.sources is None:
            # Upstream checks for an API client before it looks at `optional`.
            raise EnvError(
                f"couldn't get {_LABELS[kind][0]} {self.namespace}/{name}, no kubeClient defined"
            )
        found = (self.sources.config_maps if kind == "configmap" else self.sources.secrets).get(
            name
        )
        if found is not None:
            return found
        failure = self.sources.failures.get((kind, name))
        if failure is not None:
            raise EnvError(failure)  # only "not found" is excused by `optional`
        if ref.get("optional"):
            return None
        raise EnvError(f'{kind} "{name}" not found')

    def key(self, kind: str, ref: JSON) -> str | None:
        data = self.data(kind, ref)
        if data is None:
            return None
        key = str(ref.get("key", ""))
        if key in data:
            return data[key]
        if ref.get("optional"):
            return None
        raise EnvError(
            f"couldn't find key {key} in {_LABELS[kind][1]} {self.namespace}/{ref.get('name', '')}"
        )


def container_env(
    pod: JSON,
    container: JSON,
    *,
    pod_ips: tuple[str, ...],
    node: NodeFacts,
    sources: EnvSources | None = None,
) -> list[tuple[str, str]]:
    """The container's variables, in upstream's order of resolution.

    `envFrom` first (each source's keys with its prefix; later sources win), then `env`
    in order, each entry replacing what came before and expanding `$(VAR)` with every
    variable defined so far, then the service variables of `sources` (service links)
    under the names still free; expansion falls back to them too. `sources` are the
    referenced ConfigMaps and Secrets and the service variables; None means there is no
    apiserver to read them from. Raises `EnvError` when a reference that is not optional
    cannot be resolved, or the Services could not be listed.
    """
    objects = _Objects(_namespace(pod), sources)
    values: dict[str, str] = {}
    order: list[str] = []
    if sources is not None and sources.services_failure is not None:
        raise EnvError(sources.services_failure)
    services = dict(sources.service_env) if sources is not None else {}

    def lookup(name: str) -> str | None:
        return values.get(name, services.get(name))

    def put(name: str, value: str) -> None:
        if name not in values:
            order.append(name)
        values[name] = value

    for env_from in container.get("envFrom") or []:
        prefix = str(env_from.get("prefix") or "")
        if env_from.get("configMapRef") is not None:
            data = objects.data("configmap", env_from["configMapRef"])
        elif env_from.get("secretRef") is not None:
            data = objects.data("secret", env_from["secretRef"])
        else:
            continue
        for key in sorted(data or {}):
            text = (data or {})[key]
            if env_from.get("secretRef") is not None:
                _require_utf8(text, var=prefix + key, key=key, objects=objects, ref=env_from)
            put(prefix + key, text)
    for var in container.get("env") or []:
        name = str(var.get("name", ""))
        source = var.get("valueFrom") or {}
        value: str | None
        if var.get("value") or not source:
            value = expand(str(var.get("value") or ""), lookup)
        elif "fieldRef" in source:
            value = field_ref(
                pod, str(source["fieldRef"].get("fieldPath", "")), pod_ips=pod_ips, node=node
            )
        elif "resourceFieldRef" in source:
            value = resource_field_ref(container, source["resourceFieldRef"], node, pod=pod)
        elif "configMapKeyRef" in source:
            value = objects.key("configmap", source["configMapKeyRef"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = objects.key("secret", ref)
            if value is not None:
                key = str(ref.get("key", ""))
                _require_utf8(value, var=name, key=key, objects=objects, ref={"secretRef": ref})
        else:
            value = None
        if value is not None:
            put(name, value)
    # the service variables fill only the names the container left undefined
    for name, value in sources.service_env if sources is not None else ():
        if name not in values:
            put(name, value)
    return [(name, values[name]) for name in order]


def _require_utf8(value: str, *, var: str, key: str, objects: _Objects, ref: JSON) -> None:
    """Refuse a Secret value that is not UTF-8 (see the module docstring); `ref` holds
    the `secretRef`."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        name = str((ref.get("secretRef") or {}).get("name", ""))
        raise EnvError(
            f"environment variable {var}: key {key} of Secret {objects.namespace}/{name} "
            "is not valid UTF-8, and the container runtime takes environment values as "
            "UTF-8 strings; mount the Secret as a volume to read its exact bytes"
        ) from None


def _namespace(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def expand_all(items: list[str], env: Mapping[str, str]) -> list[str]:
    return [expand(item, env.get) for item in items]
