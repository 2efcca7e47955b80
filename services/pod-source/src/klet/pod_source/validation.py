"""Validation of one static-pod manifest, as decoded from YAML or JSON.

Pure: takes the decoded document and returns every problem found, each naming the field
(`spec.containers[1].name`) so an operator can fix the file in one go. The checks are
the subset of upstream's ValidatePod that a node agent needs to run a pod safely and
that an operator most often gets wrong; everything else (resource quantities, volume
sources, probes) is left to the component that uses the field, which reports its own
error for that pod only.

Type checks come first and stop the descent into a malformed subtree: there is no point
reporting "containers[0].name is not a label" when `containers` is a string.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Files (and URL bodies) larger than this are refused before parsing: a YAML parser
# fed an arbitrarily large or hostile document can use far more memory than its size.
MAX_MANIFEST_BYTES = 10 * 1024 * 1024

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(rf"^{_LABEL}$")
_SUBDOMAIN_RE = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")

RESTART_POLICIES = ("Always", "OnFailure", "Never")
PROTOCOLS = ("TCP", "UDP", "SCTP")
CONTAINER_LISTS = ("initContainers", "containers")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest: the field path and what is wrong with it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def is_dns1123_label(value: str) -> bool:
    return len(value) <= DNS1123_LABEL_MAX and _LABEL_RE.match(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    return len(value) <= DNS1123_SUBDOMAIN_MAX and _SUBDOMAIN_RE.match(value) is not None


def validate_pod(doc: Any, *, node_name: str) -> list[Problem]:
    """Every problem of one Pod manifest; empty when it can be normalised and run.

    `node_name` is needed because a static pod is renamed `<name>-<node>`: the name
    must still be a valid subdomain after the suffix is added.
    """
    if not isinstance(doc, Mapping):
        return [Problem("<root>", f"expected a Pod object, got {_kind_of(doc)}")]
    problems: list[Problem] = []
    api_version = doc.get("apiVersion")
    if api_version != "v1":
        problems.append(Problem("apiVersion", f"{api_version!r} is not supported, want 'v1'"))
    kind = doc.get("kind")
    if kind != "Pod":
        problems.append(Problem("kind", f"{kind!r} is not supported, want 'Pod'"))
    problems += _validate_metadata(doc.get("metadata"), node_name=node_name)
    problems += _validate_spec(doc.get("spec"))
    return problems


def _validate_metadata(meta: Any, *, node_name: str) -> list[Problem]:
    if not isinstance(meta, Mapping):
        return [Problem("metadata", f"expected an object, got {_kind_of(meta)}")]
    problems: list[Problem] = []
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        problems.append(Problem("metadata.name", "required"))
    elif not is_dns1123_subdomain(name):
        problems.append(Problem("metadata.name", f"{name!r} {_SUBDOMAIN_HELP}"))
    else:
        full = f"{name}-{node_name.lower()}"
        if len(full) > DNS1123_SUBDOMAIN_MAX:
            problems.append(
                Problem(
                    "metadata.name",
                    f"{name!r} is too long: with the node suffix it has {len(full)} "
                    f"characters, at most {DNS1123_SUBDOMAIN_MAX} are allowed",
                )
            )
    namespace = meta.get("namespace")
    if namespace is not None and namespace != "":
        if not isinstance(namespace, str) or not is_dns1123_label(namespace):
            problems.append(Problem("metadata.namespace", f"{namespace!r} {_LABEL_HELP}"))
    for key in ("labels", "annotations"):
        problems += _validate_string_map(meta.get(key), f"metadata.{key}")
    return problems


def _validate_string_map(value: Any, path: str) -> list[Problem]:
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [Problem(path, f"expected an object of strings, got {_kind_of(value)}")]
    return [
        Problem(f"{path}[{k}]", f"value must be a string, got {_kind_of(v)}")
        for k, v in value.items()
        if not isinstance(v, str)
    ]


def _validate_spec(spec: Any) -> list[Problem]:
    if not isinstance(spec, Mapping):
        return [Problem("spec", f"expected an object, got {_kind_of(spec)}")]
    problems: list[Problem] = []
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in RESTART_POLICIES:
        problems.append(
            Problem("spec.restartPolicy", f"{policy!r} is not one of {', '.join(RESTART_POLICIES)}")
        )
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and (not _is_int(grace) or grace < 0):
        problems.append(
            Problem(
                "spec.terminationGracePeriodSeconds", f"{grace!r} is not a non-negative integer"
            )
        )
    seen_names: dict[str, str] = {}
    for list_name in CONTAINER_LISTS:
        containers = spec.get(list_name)
        if containers is None:
            if list_name == "containers":
                problems.append(Problem("spec.containers", "required: at least one container"))
            continue
        if not isinstance(containers, list):
            problems.append(
                Problem(f"spec.{list_name}", f"expected a list, got {_kind_of(containers)}")
            )
            continue
        if list_name == "containers" and not containers:
            problems.append(Problem("spec.containers", "required: at least one container"))
        for i, container in enumerate(containers):
            problems += _validate_container(container, f"spec.{list_name}[{i}]", seen_names)
    return problems


def _validate_container(c: Any, path: str, seen_names: dict[str, str]) -> list[Problem]:
    if not isinstance(c, Mapping):
        return [Problem(path, f"expected an object, got {_kind_of(c)}")]
    problems: list[Problem] = []
    name = c.get("name")
    if not isinstance(name, str) or not name:
        problems.append(Problem(f"{path}.name", "required"))
    elif not is_dns1123_label(name):
        problems.append(Problem(f"{path}.name", f"{name!r} {_LABEL_HELP}"))
    elif name in seen_names:
        # Init and regular containers share one namespace: both end up as CRI
        # containers labelled with this name in the same sandbox.
        problems.append(Problem(f"{path}.name", f"{name!r} duplicates {seen_names[name]}.name"))
    else:
        seen_names[name] = path
    image = c.get("image")
    if not isinstance(image, str) or not image.strip():
        problems.append(Problem(f"{path}.image", "required: a non-empty image reference"))
    ports = c.get("ports")
    if ports is not None:
        if not isinstance(ports, list):
            problems.append(Problem(f"{path}.ports", f"expected a list, got {_kind_of(ports)}"))
        else:
            for j, port in enumerate(ports):
                problems += _validate_port(port, f"{path}.ports[{j}]")
    return problems


def _validate_port(p: Any, path: str) -> list[Problem]:
    if not isinstance(p, Mapping):
        return [Problem(path, f"expected an object, got {_kind_of(p)}")]
    problems: list[Problem] = []
    cport = p.get("containerPort")
    if cport is None:
        problems.append(Problem(f"{path}.containerPort", "required"))
    elif not _is_int(cport) or not 1 <= cport <= 65535:
        problems.append(Problem(f"{path}.containerPort", f"{cport!r} is not between 1 and 65535"))
    hport = p.get("hostPort")
    # 0 means "no host port", as in the API.
    if hport is not None and (not _is_int(hport) or not 0 <= hport <= 65535):
        problems.append(Problem(f"{path}.hostPort", f"{hport!r} is not between 0 and 65535"))
    protocol = p.get("protocol")
    if protocol is not None and protocol not in PROTOCOLS:
        problems.append(
            Problem(f"{path}.protocol", f"{protocol!r} is not one of {', '.join(PROTOCOLS)}")
        )
    return problems


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind_of(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


_LABEL_HELP = (
    "is not a DNS-1123 label (at most 63 lowercase letters, digits or '-', "
    "starting and ending with a letter or digit)"
)
_SUBDOMAIN_HELP = (
    "is not a DNS-1123 subdomain (at most 253 lowercase letters, digits, '-' or '.', "
    "each part starting and ending with a letter or digit)"
)
