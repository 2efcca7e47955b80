"""Pod validation that protects the node: upstream's ValidatePod rules the agent relies on.

Pure, no I/O. One module used twice: by pod-source on every static manifest (file and
URL) before it is published, and by syncloop on every desired pod it reads from the bus
before it acts on it, so a record written to Redis by anything other than pod-source
(or by an older pod-source) is held to the same rules.

The rules are a subset of upstream's `ValidatePod` (pkg/apis/core/validation), chosen
for what a node agent turns into host paths, files, cgroup values and runtime calls:
names that become path components (pod UID, volume and container names), paths inside
volumes (item paths, subPath), host paths, integers that end up in int32/int64 fields,
resource quantities, probe and lifecycle handlers, env names, /etc/hosts and
resolv.conf content (hostAliases, dnsConfig). Because API pods are checked again in
syncloop, every rule must be one the apiserver enforces too, so a pod the cluster
accepted is never refused here. The exceptions, all stricter than upstream and all
about the node's own safety, are documented where they are checked:

- a supplied `metadata.uid` must be a safe path component (upstream keeps a static
  pod's manifest UID unchecked and joins it into `<root-dir>/pods/<uid>`);
- a hostPath must be absolute (a relative one would resolve against the agent's
  working directory);
- integers must fit the API's int64 (a JSON or YAML number may be arbitrarily large);
- resource quantities must be below 2^63 in their base unit (they become cgroup
  values and CRI int64 fields).

Every problem names its field (`spec.volumes[2].name`) so an operator can fix a file
in one go. The checks never raise on any JSON-shaped input: a field of the wrong type
is reported and its subtree skipped. Unknown fields are left alone (as upstream's
decoder drops them), so a pod using an API field newer than this module still runs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from klet.model.units import parse_quantity

DNS1123_LABEL_MAX: Final = 63
DNS1123_SUBDOMAIN_MAX: Final = 253
INT32_MAX: Final = 2**31 - 1
INT64_MAX: Final = 2**63 - 1
INT64_MIN: Final = -(2**63)
UID_MAX: Final = 128
ANNOTATIONS_MAX_BYTES: Final = 256 * 1024
FILE_MODE_MAX: Final = 0o777

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(rf"^{_LABEL}$")
_SUBDOMAIN_RE = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
# A UID as a path component: apiserver UIDs (UUIDs) and static-pod UIDs (md5 hex) both
# match; '/', NUL, '.', '..' and anything starting with '.' or '-' do not.
_UID_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{UID_MAX - 1}}}$")
_QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_IANA_SVC_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_IANA_HAS_LETTER_RE = re.compile(r"[a-z]")
_CONFIG_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")

RESTART_POLICIES: Final = ("Always", "OnFailure", "Never")
PROTOCOLS: Final = ("TCP", "UDP", "SCTP")
CONTAINER_LISTS: Final = ("initContainers", "containers")
PULL_POLICIES: Final = ("Always", "Never", "IfNotPresent")
DNS_POLICIES: Final = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
TERMINATION_MESSAGE_POLICIES: Final = ("File", "FallbackToLogsOnError")
MOUNT_PROPAGATIONS: Final = ("None", "HostToContainer", "Bidirectional")
HOST_PATH_TYPES: Final = (
    "",
    "DirectoryOrCreate",
    "Directory",
    "FileOrCreate",
    "File",
    "Socket",
    "CharDevice",
    "BlockDevice",
)
URI_SCHEMES: Final = ("HTTP", "HTTPS")
TOLERATION_OPERATORS: Final = ("", "Exists", "Equal")
TAINT_EFFECTS: Final = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
PROBE_HANDLERS: Final = ("exec", "httpGet", "tcpSocket", "grpc")
LIFECYCLE_HANDLERS: Final = ("exec", "httpGet", "tcpSocket", "sleep")
ENV_SOURCES: Final = (
    "fieldRef",
    "resourceFieldRef",
    "configMapKeyRef",
    "secretKeyRef",
    "fileKeyRef",
)
PROJECTION_SOURCES: Final = (
    "secret",
    "configMap",
    "downwardAPI",
    "serviceAccountToken",
    "clusterTrustBundle",
    "podCertificate",
)
MIN_TOKEN_EXPIRATION_S: Final = 600
MAX_TOKEN_EXPIRATION_S: Final = 2**32
MAX_DNS_NAMESERVERS: Final = 3
MAX_DNS_SEARCHES: Final = 32
MAX_DNS_SEARCH_CHARS: Final = 2048


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a pod: the field path and what is wrong with it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class UnsafePathComponent(ValueError):
    """A value about to be joined into a host path is not a single safe component."""


def is_dns1123_label(value: str) -> bool:
    return len(value) <= DNS1123_LABEL_MAX and _LABEL_RE.match(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    return len(value) <= DNS1123_SUBDOMAIN_MAX and _SUBDOMAIN_RE.match(value) is not None


def is_valid_uid(value: str) -> bool:
    """Whether `value` can be a pod UID, which the node uses as a directory name."""
    return _UID_RE.match(value) is not None


def checked_component(value: str, *, what: str) -> str:
    """`value` if it is safe to join into a host path as ONE component, else raises.

    The defence at the join itself (pod directories, volume directories, log
    directories): whatever validation a caller did or forgot, a name holding '/',
    NUL, or being '.' or '..' never leaves the directory it is joined under.
    """
    if (
        not isinstance(value, str)
        or value in ("", ".", "..")
        or "/" in value
        or "\0" in value
        or len(value) > 255
    ):
        raise UnsafePathComponent(f"{what} {value!r} is not a safe path component")
    return value


def is_local_descending_path(value: str) -> bool:
    """Relative and without a `..` element (upstream's subPath rule)."""
    return not value.startswith("/") and ".." not in value.split("/")


def is_local_non_reserved_path(value: str) -> bool:
    """A descending path that does not start with `..` (volume item paths; those names
    belong to the atomic writer's `..data` links)."""
    return is_local_descending_path(value) and not value.startswith("..")


def pod_problems(pod: Any, *, require_uid: bool = False) -> list[Problem]:
    """Every problem of one pod object; empty when the node may act on it.

    `require_uid`: the pod must carry its UID (pods on the bus always do; a static
    manifest usually does not, pod-source then derives one).
    """
    checker = _Checker()
    if not isinstance(pod, Mapping):
        checker.add("<root>", f"expected a Pod object, got {kind_of(pod)}")
        return checker.problems
    checker.metadata(pod.get("metadata"), require_uid=require_uid)
    checker.spec(pod.get("spec"))
    return checker.problems


def kind_of(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Checker:
    """Walks one pod and collects problems; each method checks one part of the spec."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    # -- generic shapes ------------------------------------------------------------

    def mapping(self, value: Any, path: str, *, required: bool = False) -> Mapping[str, Any]:
        """`value` as an object; {} (after reporting) when it is absent or not one."""
        if value is None:
            if required:
                self.add(path, "required")
            return {}
        if not isinstance(value, Mapping):
            self.add(path, f"expected an object, got {kind_of(value)}")
            return {}
        return value

    def items(self, value: Any, path: str) -> list[tuple[str, Mapping[str, Any]]]:
        """The objects of a list, each with its path; non-objects are reported."""
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(path, f"expected a list, got {kind_of(value)}")
            return []
        out = []
        for i, item in enumerate(value):
            if isinstance(item, Mapping):
                out.append((f"{path}[{i}]", item))
            else:
                self.add(f"{path}[{i}]", f"expected an object, got {kind_of(item)}")
        return out

    def string(self, value: Any, path: str, *, required: bool = False) -> str | None:
        if value is None or (value == "" and required):
            if required:
                self.add(path, "required")
            return None
        if not isinstance(value, str):
            self.add(path, f"expected a string, got {kind_of(value)}")
            return None
        return value

    def boolean(self, value: Any, path: str) -> None:
        if value is not None and not isinstance(value, bool):
            self.add(path, f"expected a boolean, got {kind_of(value)}")

    def integer(self, value: Any, path: str, lo: int, hi: int) -> int | None:
        if value is None:
            return None
        if not is_int(value):
            self.add(path, f"expected an integer, got {kind_of(value)}")
            return None
        if not lo <= value <= hi:
            self.add(path, f"{_short(value)} is not between {lo} and {hi}")
            return None
        return int(value)

    def one_of(self, value: Any, path: str, allowed: tuple[str, ...]) -> None:
        if value is not None and value not in allowed:
            shown = ", ".join(repr(a) for a in allowed)
            self.add(path, f"{_short(value)} is not one of {shown}")

    def label(self, value: Any, path: str, *, required: bool = True) -> str | None:
        text = self.string(value, path, required=required)
        if text is not None and text != "" and not is_dns1123_label(text):
            self.add(path, f"{_short(text)} {LABEL_HELP}")
            return None
        return text

    def subdomain(self, value: Any, path: str, *, required: bool = True) -> str | None:
        text = self.string(value, path, required=required)
        if text is not None and text != "" and not is_dns1123_subdomain(text):
            self.add(path, f"{_short(text)} {SUBDOMAIN_HELP}")
            return None
        return text

    def mode(self, value: Any, path: str) -> None:
        if value is not None and (not is_int(value) or not 0 <= value <= FILE_MODE_MAX):
            self.add(path, f"{_short(value)} must be a number between 0 and 0777 (octal)")

    def quantity(self, value: Any, path: str) -> Decimal | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            self.add(path, f"expected a quantity, got {kind_of(value)}")
            return None
        try:
            parsed = parse_quantity(str(value))
        except (ValueError, ArithmeticError):
            self.add(path, f"{_short(value)} is not a valid quantity")
            return None
        if parsed < 0:
            self.add(path, f"{_short(value)} must be greater than or equal to 0")
            return None
        # klet-specific bound: quantities become int64 cgroup and CRI values, counted
        # in millicores for CPU.
        if parsed * 1000 > INT64_MAX:
            self.add(path, f"{_short(value)} is too large")
            return None
        return parsed

    def string_map(self, value: Any, path: str, *, keys: str) -> Mapping[str, Any]:
        found = self.mapping(value, path)
        for key, item in found.items():
            if keys == "qualified" and not _is_qualified_name(str(key)):
                self.add(f"{path}[{_key(key)}]", f"{QUALIFIED_HELP}")
            if not isinstance(item, str):
                self.add(f"{path}[{_key(key)}]", f"value must be a string, got {kind_of(item)}")
        return found

    # -- metadata ------------------------------------------------------------------

    def metadata(self, value: Any, *, require_uid: bool) -> None:
        meta = self.mapping(value, "metadata", required=True)
        if not isinstance(value, Mapping):
            return
        self.subdomain(meta.get("name"), "metadata.name")
        self.label(meta.get("namespace"), "metadata.namespace", required=False)
        uid = meta.get("uid")
        if uid is None or uid == "":
            if require_uid:
                self.add("metadata.uid", "required")
        elif not isinstance(uid, str) or not is_valid_uid(uid):
            # Stricter than upstream, which keeps a manifest's UID unchecked: the UID
            # names the pod's directories on the host.
            self.add(
                "metadata.uid",
                f"{_short(uid)} is not a valid UID (at most {UID_MAX} letters, digits, "
                "'-', '_' or '.', starting with a letter or digit)",
            )
        labels = self.string_map(meta.get("labels"), "metadata.labels", keys="qualified")
        for key, item in labels.items():
            if isinstance(item, str) and (len(item) > 63 or not _LABEL_VALUE_RE.match(item)):
                self.add(f"metadata.labels[{_key(key)}]", f"{_short(item)} {LABEL_VALUE_HELP}")
        annotations = self.string_map(
            meta.get("annotations"), "metadata.annotations", keys="qualified"
        )
        size = sum(len(str(k)) + len(v) for k, v in annotations.items() if isinstance(v, str))
        if size > ANNOTATIONS_MAX_BYTES:
            self.add(
                "metadata.annotations",
                f"too long: {size} bytes, at most {ANNOTATIONS_MAX_BYTES} are allowed",
            )

    # -- spec ----------------------------------------------------------------------

    def spec(self, value: Any) -> None:
        spec = self.mapping(value, "spec", required=True)
        if not isinstance(value, Mapping):
            return
        self.one_of(spec.get("restartPolicy"), "spec.restartPolicy", RESTART_POLICIES)
        self.one_of(spec.get("dnsPolicy"), "spec.dnsPolicy", DNS_POLICIES)
        self.integer(
            spec.get("terminationGracePeriodSeconds"),
            "spec.terminationGracePeriodSeconds",
            0,
            INT64_MAX,
        )
        self.integer(spec.get("activeDeadlineSeconds"), "spec.activeDeadlineSeconds", 1, INT32_MAX)
        self.integer(spec.get("priority"), "spec.priority", -(2**31), INT32_MAX)
        for key in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"):
            self.boolean(spec.get(key), f"spec.{key}")
        self.subdomain(spec.get("nodeName"), "spec.nodeName", required=False)
        self.subdomain(spec.get("serviceAccountName"), "spec.serviceAccountName", required=False)
        self.label(spec.get("hostname"), "spec.hostname", required=False)
        self.label(spec.get("subdomain"), "spec.subdomain", required=False)
        self.string_map(spec.get("nodeSelector"), "spec.nodeSelector", keys="qualified")
        volumes = self.volumes(spec.get("volumes"))
        self.containers(spec, volumes, host_network=spec.get("hostNetwork") is True)
        self.pod_security_context(spec.get("securityContext"))
        self.host_aliases(spec.get("hostAliases"))
        self.dns_config(spec.get("dnsConfig"))
        self.tolerations(spec.get("tolerations"))
        for path, ref in self.items(spec.get("imagePullSecrets"), "spec.imagePullSecrets"):
            self.string(ref.get("name"), f"{path}.name")

    def containers(self, spec: Mapping[str, Any], volumes: set[str], *, host_network: bool) -> None:
        seen: dict[str, str] = {}
        for list_name in CONTAINER_LISTS:
            raw = spec.get(list_name)
            if list_name == "containers" and (raw is None or raw == []):
                self.add("spec.containers", "required: at least one container")
                continue
            for path, container in self.items(raw, f"spec.{list_name}"):
                self.container(container, path, seen, volumes, host_network=host_network)

    def container(
        self,
        c: Mapping[str, Any],
        path: str,
        seen: dict[str, str],
        volumes: set[str],
        *,
        host_network: bool,
    ) -> None:
        name = self.label(c.get("name"), f"{path}.name")
        if name:
            if name in seen:
                # Init and regular containers share one namespace: both become CRI
                # containers labelled with this name in the same sandbox.
                self.add(f"{path}.name", f"{_short(name)} duplicates {seen[name]}.name")
            else:
                seen[name] = path
        image = c.get("image")
        if not isinstance(image, str) or not image.strip():
            self.add(f"{path}.image", "required: a non-empty image reference")
        self.one_of(c.get("imagePullPolicy"), f"{path}.imagePullPolicy", PULL_POLICIES)
        self.one_of(
            c.get("terminationMessagePolicy"),
            f"{path}.terminationMessagePolicy",
            TERMINATION_MESSAGE_POLICIES,
        )
        self.string(c.get("terminationMessagePath"), f"{path}.terminationMessagePath")
        self.string(c.get("workingDir"), f"{path}.workingDir")
        for key in ("command", "args"):
            raw = c.get(key)
            if raw is not None and (
                not isinstance(raw, list) or not all(isinstance(a, str) for a in raw)
            ):
                self.add(f"{path}.{key}", "expected a list of strings")
        for key in ("stdin", "stdinOnce", "tty"):
            self.boolean(c.get(key), f"{path}.{key}")
        self.ports(c.get("ports"), f"{path}.ports", host_network=host_network)
        self.env(c.get("env"), f"{path}.env")
        for epath, source in self.items(c.get("envFrom"), f"{path}.envFrom"):
            prefix = self.string(source.get("prefix"), f"{epath}.prefix")
            if prefix and not _is_env_name(prefix):
                self.add(f"{epath}.prefix", f"{_short(prefix)} {ENV_NAME_HELP}")
            refs = [k for k in ("configMapRef", "secretRef") if source.get(k) is not None]
            if len(refs) != 1:
                self.add(epath, "exactly one of configMapRef or secretRef must be set")
            for ref in refs:
                self.string(
                    self.mapping(source[ref], f"{epath}.{ref}").get("name"), f"{epath}.{ref}.name"
                )
        self.volume_mounts(c.get("volumeMounts"), f"{path}.volumeMounts", volumes)
        self.resources(c.get("resources"), f"{path}.resources")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            self.probe(c.get(probe), f"{path}.{probe}", single_success=probe != "readinessProbe")
        lifecycle = self.mapping(c.get("lifecycle"), f"{path}.lifecycle")
        for hook in ("postStart", "preStop"):
            handler = self.mapping(lifecycle.get(hook), f"{path}.lifecycle.{hook}")
            if handler:
                self.handler(handler, f"{path}.lifecycle.{hook}", LIFECYCLE_HANDLERS)
        self.security_context(c.get("securityContext"), f"{path}.securityContext")

    def ports(self, value: Any, path: str, *, host_network: bool) -> None:
        names: set[str] = set()
        for ppath, port in self.items(value, path):
            container_port = port.get("containerPort")
            if container_port is None:
                self.add(f"{ppath}.containerPort", "required")
            else:
                container_port = self.integer(container_port, f"{ppath}.containerPort", 1, 65535)
            host_port = self.integer(port.get("hostPort"), f"{ppath}.hostPort", 0, 65535)
            if host_network and host_port and container_port and host_port != container_port:
                self.add(f"{ppath}.hostPort", "must match containerPort when hostNetwork is true")
            self.one_of(port.get("protocol"), f"{ppath}.protocol", PROTOCOLS)
            name = self.string(port.get("name"), f"{ppath}.name")
            if name:
                if not _is_iana_svc_name(name):
                    self.add(f"{ppath}.name", f"{_short(name)} {PORT_NAME_HELP}")
                elif name in names:
                    self.add(f"{ppath}.name", f"duplicate port name {_short(name)}")
                names.add(name)
            host_ip = self.string(port.get("hostIP"), f"{ppath}.hostIP")
            if host_ip and not _is_ip(host_ip):
                self.add(f"{ppath}.hostIP", f"{_short(host_ip)} is not a valid IP address")

    def env(self, value: Any, path: str) -> None:
        for epath, var in self.items(value, path):
            name = self.string(var.get("name"), f"{epath}.name", required=True)
            if name is not None and not _is_env_name(name):
                self.add(f"{epath}.name", f"{_short(name)} {ENV_NAME_HELP}")
            text = self.string(var.get("value"), f"{epath}.value")
            source = self.mapping(var.get("valueFrom"), f"{epath}.valueFrom")
            if source:
                if text:
                    self.add(f"{epath}.valueFrom", "may not be specified when value is not empty")
                set_ = [k for k in ENV_SOURCES if source.get(k) is not None]
                if len(set_) > 1:
                    self.add(f"{epath}.valueFrom", "may not have more than one field specified")
                for key in set_:
                    ref = self.mapping(source[key], f"{epath}.valueFrom.{key}")
                    if key == "fieldRef":
                        self.string(
                            ref.get("fieldPath"),
                            f"{epath}.valueFrom.fieldRef.fieldPath",
                            required=True,
                        )
                    elif key == "resourceFieldRef":
                        self.string(
                            ref.get("resource"),
                            f"{epath}.valueFrom.resourceFieldRef.resource",
                            required=True,
                        )
                        self.quantity(
                            ref.get("divisor"), f"{epath}.valueFrom.resourceFieldRef.divisor"
                        )
                    elif key in ("configMapKeyRef", "secretKeyRef"):
                        self.string(ref.get("key"), f"{epath}.valueFrom.{key}.key", required=True)
                        self.string(ref.get("name"), f"{epath}.valueFrom.{key}.name")

    def volume_mounts(self, value: Any, path: str, volumes: set[str]) -> None:
        mount_paths: set[str] = set()
        for mpath, mount in self.items(value, path):
            name = self.string(mount.get("name"), f"{mpath}.name", required=True)
            if name and name not in volumes:
                self.add(f"{mpath}.name", f"{_short(name)} not found among spec.volumes")
            target = self.string(mount.get("mountPath"), f"{mpath}.mountPath", required=True)
            if target:
                if target in mount_paths:
                    self.add(f"{mpath}.mountPath", f"{_short(target)} must be unique")
                mount_paths.add(target)
            self.boolean(mount.get("readOnly"), f"{mpath}.readOnly")
            sub = self.string(mount.get("subPath"), f"{mpath}.subPath")
            expr = self.string(mount.get("subPathExpr"), f"{mpath}.subPathExpr")
            if sub and expr:
                self.add(f"{mpath}.subPathExpr", "subPathExpr and subPath are mutually exclusive")
            for key, text in (("subPath", sub), ("subPathExpr", expr)):
                if text and not is_local_descending_path(text):
                    self.add(f"{mpath}.{key}", f"{_short(text)} {DESCENDING_HELP}")
            self.one_of(
                mount.get("mountPropagation"), f"{mpath}.mountPropagation", MOUNT_PROPAGATIONS
            )

    def resources(self, value: Any, path: str) -> None:
        res = self.mapping(value, path)
        parsed: dict[str, dict[str, Decimal]] = {}
        for kind in ("limits", "requests"):
            found = self.mapping(res.get(kind), f"{path}.{kind}")
            parsed[kind] = {}
            for name, qty in found.items():
                if not _is_qualified_name(str(name).split("/", 1)[-1]):
                    self.add(f"{path}.{kind}[{_key(name)}]", "is not a valid resource name")
                    continue
                amount = self.quantity(qty, f"{path}.{kind}[{_key(name)}]")
                if amount is not None:
                    parsed[kind][str(name)] = amount
        for name, request in parsed["requests"].items():
            limit = parsed["limits"].get(name)
            if limit is not None and request > limit:
                self.add(
                    f"{path}.requests[{name}]",
                    f"must be less than or equal to {name} limit of {res['limits'][name]}",
                )

    def probe(self, value: Any, path: str, *, single_success: bool) -> None:
        probe = self.mapping(value, path)
        if not probe:
            return
        self.handler(probe, path, PROBE_HANDLERS)
        for key in (
            "initialDelaySeconds",
            "timeoutSeconds",
            "periodSeconds",
            "successThreshold",
            "failureThreshold",
        ):
            self.integer(probe.get(key), f"{path}.{key}", 0, INT32_MAX)
        success = probe.get("successThreshold")
        if single_success and is_int(success) and success not in (0, 1):
            self.add(f"{path}.successThreshold", "must be 1")
        self.integer(
            probe.get("terminationGracePeriodSeconds"),
            f"{path}.terminationGracePeriodSeconds",
            1,
            INT64_MAX,
        )

    def handler(self, handler: Mapping[str, Any], path: str, kinds: tuple[str, ...]) -> None:
        present = [k for k in kinds if handler.get(k) is not None]
        if not present:
            self.add(path, f"must specify a handler type ({', '.join(kinds)})")
            return
        if len(present) > 1:
            self.add(f"{path}.{present[1]}", "may not specify more than 1 handler type")
            return
        kind = present[0]
        body = self.mapping(handler[kind], f"{path}.{kind}")
        if kind == "exec":
            command = body.get("command")
            if command is not None and (
                not isinstance(command, list) or not all(isinstance(a, str) for a in command)
            ):
                self.add(f"{path}.exec.command", "expected a list of strings")
        elif kind in ("httpGet", "tcpSocket"):
            self.port_ref(body.get("port"), f"{path}.{kind}.port")
            self.string(body.get("host"), f"{path}.{kind}.host")
            if kind == "httpGet":
                self.string(body.get("path"), f"{path}.httpGet.path")
                self.one_of(body.get("scheme"), f"{path}.httpGet.scheme", URI_SCHEMES)
                for hpath, header in self.items(
                    body.get("httpHeaders"), f"{path}.httpGet.httpHeaders"
                ):
                    name = self.string(header.get("name"), f"{hpath}.name", required=True)
                    if name and not re.fullmatch(r"[-A-Za-z0-9]+", name):
                        self.add(f"{hpath}.name", f"{_short(name)} is not a valid HTTP header name")
                    value = self.string(header.get("value"), f"{hpath}.value")
                    if value and ("\n" in value or "\r" in value):
                        self.add(f"{hpath}.value", "must not contain line breaks")
        elif kind == "grpc":
            port = body.get("port")
            if port is None:
                self.add(f"{path}.grpc.port", "required")
            self.integer(port, f"{path}.grpc.port", 1, 65535)
            self.string(body.get("service"), f"{path}.grpc.service")
        elif kind == "sleep":
            self.integer(body.get("seconds"), f"{path}.sleep.seconds", 0, INT64_MAX)

    def port_ref(self, value: Any, path: str) -> None:
        if value is None or value == "":
            self.add(path, "required")
        elif is_int(value):
            self.integer(value, path, 1, 65535)
        elif isinstance(value, str):
            if value.isdigit():
                self.add(path, f"{_short(value)} must be a number, not a numeric string")
            elif not _is_iana_svc_name(value):
                self.add(path, f"{_short(value)} {PORT_NAME_HELP}")
        else:
            self.add(path, f"expected a port number or name, got {kind_of(value)}")

    def security_context(self, value: Any, path: str) -> None:
        ctx = self.mapping(value, path)
        for key in ("runAsUser", "runAsGroup"):
            self.integer(ctx.get(key), f"{path}.{key}", 0, INT32_MAX)
        for key in (
            "privileged",
            "runAsNonRoot",
            "readOnlyRootFilesystem",
            "allowPrivilegeEscalation",
        ):
            self.boolean(ctx.get(key), f"{path}.{key}")
        profile = self.mapping(ctx.get("seccompProfile"), f"{path}.seccompProfile")
        local = self.string(
            profile.get("localhostProfile"), f"{path}.seccompProfile.localhostProfile"
        )
        if local and not is_local_descending_path(local):
            self.add(
                f"{path}.seccompProfile.localhostProfile", f"{_short(local)} {DESCENDING_HELP}"
            )

    def pod_security_context(self, value: Any) -> None:
        path = "spec.securityContext"
        self.security_context(value, path)
        ctx = self.mapping(value, path)
        self.integer(ctx.get("fsGroup"), f"{path}.fsGroup", 0, INT32_MAX)
        groups = ctx.get("supplementalGroups")
        if groups is not None:
            if not isinstance(groups, list):
                self.add(f"{path}.supplementalGroups", f"expected a list, got {kind_of(groups)}")
            else:
                for i, gid in enumerate(groups):
                    self.integer(gid, f"{path}.supplementalGroups[{i}]", 0, INT32_MAX)
        for spath, sysctl in self.items(ctx.get("sysctls"), f"{path}.sysctls"):
            name = self.string(sysctl.get("name"), f"{spath}.name", required=True)
            if name and not re.fullmatch(
                r"([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?", name
            ):
                self.add(f"{spath}.name", f"{_short(name)} is not a valid sysctl name")
            self.string(sysctl.get("value"), f"{spath}.value")

    def host_aliases(self, value: Any) -> None:
        # These lines go into the pod's /etc/hosts: an address or name with a line
        # break or a space would add entries of its own.
        for hpath, alias in self.items(value, "spec.hostAliases"):
            ip = self.string(alias.get("ip"), f"{hpath}.ip", required=True)
            if ip and not _is_ip(ip):
                self.add(f"{hpath}.ip", f"{_short(ip)} must be a valid IP address")
            names = alias.get("hostnames")
            if names is not None and not isinstance(names, list):
                self.add(f"{hpath}.hostnames", f"expected a list, got {kind_of(names)}")
                continue
            for i, name in enumerate(names or []):
                self.subdomain(name, f"{hpath}.hostnames[{i}]")

    def dns_config(self, value: Any) -> None:
        path = "spec.dnsConfig"
        cfg = self.mapping(value, path)
        servers = cfg.get("nameservers")
        if servers is not None:
            if not isinstance(servers, list):
                self.add(f"{path}.nameservers", f"expected a list, got {kind_of(servers)}")
            else:
                if len(servers) > MAX_DNS_NAMESERVERS:
                    self.add(
                        f"{path}.nameservers",
                        f"must not have more than {MAX_DNS_NAMESERVERS} nameservers",
                    )
                for i, server in enumerate(servers):
                    if not isinstance(server, str) or not _is_ip(server):
                        self.add(
                            f"{path}.nameservers[{i}]",
                            f"{_short(server)} must be a valid IP address",
                        )
        searches = cfg.get("searches")
        if searches is not None:
            if not isinstance(searches, list):
                self.add(f"{path}.searches", f"expected a list, got {kind_of(searches)}")
            else:
                if len(searches) > MAX_DNS_SEARCHES:
                    self.add(
                        f"{path}.searches",
                        f"must not have more than {MAX_DNS_SEARCHES} search paths",
                    )
                total = 0
                for i, search in enumerate(searches):
                    text = (
                        search[:-1] if isinstance(search, str) and search.endswith(".") else search
                    )
                    if self.subdomain(text, f"{path}.searches[{i}]") and isinstance(search, str):
                        total += len(search)
                if total + max(0, len(searches) - 1) > MAX_DNS_SEARCH_CHARS:
                    self.add(
                        f"{path}.searches",
                        f"must not have more than {MAX_DNS_SEARCH_CHARS} characters in total",
                    )
        for opath, option in self.items(cfg.get("options"), f"{path}.options"):
            name = self.string(option.get("name"), f"{opath}.name", required=True)
            text = self.string(option.get("value"), f"{opath}.value")
            for key, item in (("name", name), ("value", text)):
                if item and any(ch.isspace() for ch in item):
                    self.add(f"{opath}.{key}", "must not contain white space")

    def tolerations(self, value: Any) -> None:
        for tpath, toleration in self.items(value, "spec.tolerations"):
            key = self.string(toleration.get("key"), f"{tpath}.key")
            if key and not _is_qualified_name(key.split("/", 1)[-1]):
                self.add(f"{tpath}.key", QUALIFIED_HELP)
            self.one_of(toleration.get("operator"), f"{tpath}.operator", TOLERATION_OPERATORS)
            self.one_of(toleration.get("effect"), f"{tpath}.effect", TAINT_EFFECTS)
            self.string(toleration.get("value"), f"{tpath}.value")
            self.integer(
                toleration.get("tolerationSeconds"),
                f"{tpath}.tolerationSeconds",
                INT64_MIN,
                INT64_MAX,
            )

    # -- volumes -------------------------------------------------------------------

    def volumes(self, value: Any) -> set[str]:
        """Check spec.volumes; return the names of the volumes that mounts may use."""
        names: set[str] = set()
        for vpath, volume in self.items(value, "spec.volumes"):
            name = self.label(volume.get("name"), f"{vpath}.name")
            if name:
                if name in names:
                    self.add(f"{vpath}.name", f"duplicate volume name {_short(name)}")
                names.add(name)
            sources = [k for k in volume if k != "name" and volume[k] is not None]
            if not sources:
                self.add(vpath, "must specify a volume type")
                continue
            if len(sources) > 1:
                self.add(f"{vpath}.{sources[1]}", "may not specify more than 1 volume type")
                continue
            kind = sources[0]
            body = self.mapping(volume[kind], f"{vpath}.{kind}")
            self.volume_source(str(kind), body, f"{vpath}.{kind}")
        return names

    def volume_source(self, kind: str, body: Mapping[str, Any], path: str) -> None:
        if kind == "hostPath":
            host = self.string(body.get("path"), f"{path}.path", required=True)
            if host is not None:
                if not host.startswith("/"):
                    # Stricter than upstream: relative paths would be relative to the
                    # agent's working directory.
                    self.add(f"{path}.path", f"{_short(host)} must be an absolute path")
                if ".." in host.split("/"):
                    self.add(f"{path}.path", f"{_short(host)} must not contain '..'")
                if "\0" in host:
                    self.add(f"{path}.path", "must not contain NUL")
            self.one_of(body.get("type"), f"{path}.type", HOST_PATH_TYPES)
        elif kind == "emptyDir":
            self.string(body.get("medium"), f"{path}.medium")
            self.quantity(body.get("sizeLimit"), f"{path}.sizeLimit")
        elif kind == "secret":
            self.string(body.get("secretName"), f"{path}.secretName", required=True)
            self.mode(body.get("defaultMode"), f"{path}.defaultMode")
            self.key_to_paths(body.get("items"), f"{path}.items", set())
        elif kind == "configMap":
            self.string(body.get("name"), f"{path}.name", required=True)
            self.mode(body.get("defaultMode"), f"{path}.defaultMode")
            self.key_to_paths(body.get("items"), f"{path}.items", set())
        elif kind == "downwardAPI":
            self.mode(body.get("defaultMode"), f"{path}.defaultMode")
            self.downward_items(body.get("items"), f"{path}.items", set())
        elif kind == "projected":
            self.projected(body, path)
        elif kind == "persistentVolumeClaim":
            self.string(body.get("claimName"), f"{path}.claimName", required=True)

    def item_path(self, value: Any, path: str, seen: set[str]) -> None:
        text = self.string(value, path, required=True)
        if text is None:
            return
        if not is_local_non_reserved_path(text):
            self.add(path, f"{_short(text)} {NON_RESERVED_HELP}")
        elif "\0" in text:
            self.add(path, "must not contain NUL")
        elif text in seen:
            self.add(path, f"conflicting duplicate path {_short(text)}")
        seen.add(text)

    def key_to_paths(self, value: Any, path: str, seen: set[str]) -> None:
        for ipath, item in self.items(value, path):
            key = self.string(item.get("key"), f"{ipath}.key", required=True)
            if key and (len(key) > DNS1123_SUBDOMAIN_MAX or not _CONFIG_KEY_RE.match(key)):
                self.add(f"{ipath}.key", f"{_short(key)} is not a valid ConfigMap or Secret key")
            self.item_path(item.get("path"), f"{ipath}.path", seen)
            self.mode(item.get("mode"), f"{ipath}.mode")

    def downward_items(self, value: Any, path: str, seen: set[str]) -> None:
        for ipath, item in self.items(value, path):
            self.item_path(item.get("path"), f"{ipath}.path", seen)
            self.mode(item.get("mode"), f"{ipath}.mode")
            field_ref = item.get("fieldRef")
            resource_ref = item.get("resourceFieldRef")
            if (field_ref is None) == (resource_ref is None):
                self.add(ipath, "exactly one of fieldRef and resourceFieldRef is required")
            if field_ref is not None:
                ref = self.mapping(field_ref, f"{ipath}.fieldRef")
                self.string(ref.get("fieldPath"), f"{ipath}.fieldRef.fieldPath", required=True)
            if resource_ref is not None:
                ref = self.mapping(resource_ref, f"{ipath}.resourceFieldRef")
                self.string(
                    ref.get("resource"), f"{ipath}.resourceFieldRef.resource", required=True
                )
                self.quantity(ref.get("divisor"), f"{ipath}.resourceFieldRef.divisor")

    def projected(self, body: Mapping[str, Any], path: str) -> None:
        self.mode(body.get("defaultMode"), f"{path}.defaultMode")
        seen: set[str] = set()  # paths must be unique across all the projections
        for spath, source in self.items(body.get("sources"), f"{path}.sources"):
            kinds = [k for k in PROJECTION_SOURCES if source.get(k) is not None]
            if len(kinds) > 1:
                self.add(f"{spath}.{kinds[1]}", "may not specify more than 1 volume type")
                continue
            if not kinds:
                continue  # a newer projection type: left to the volume plugin
            kind = kinds[0]
            proj = self.mapping(source[kind], f"{spath}.{kind}")
            if kind in ("secret", "configMap"):
                self.key_to_paths(proj.get("items"), f"{spath}.{kind}.items", seen)
            elif kind == "downwardAPI":
                self.downward_items(proj.get("items"), f"{spath}.downwardAPI.items", seen)
            elif kind == "serviceAccountToken":
                self.item_path(proj.get("path"), f"{spath}.serviceAccountToken.path", seen)
                self.integer(
                    proj.get("expirationSeconds"),
                    f"{spath}.serviceAccountToken.expirationSeconds",
                    MIN_TOKEN_EXPIRATION_S,
                    MAX_TOKEN_EXPIRATION_S,
                )
                self.string(proj.get("audience"), f"{spath}.serviceAccountToken.audience")
            elif kind == "clusterTrustBundle":
                self.item_path(proj.get("path"), f"{spath}.clusterTrustBundle.path", seen)
            elif kind == "podCertificate":
                for key in ("credentialBundlePath", "keyPath", "certificateChainPath"):
                    if proj.get(key):
                        self.item_path(proj.get(key), f"{spath}.podCertificate.{key}", seen)


def _is_qualified_name(value: str) -> bool:
    """`[prefix/]name` as upstream's IsQualifiedName: a subdomain prefix, a name of at
    most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric."""
    prefix, _, name = value.rpartition("/")
    if "/" in value and (not prefix or not is_dns1123_subdomain(prefix)):
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME_RE.match(name) is not None


def _is_env_name(value: str) -> bool:
    """Upstream's relaxed rule (RelaxedEnvironmentVariableValidation): printable ASCII
    other than '='."""
    return bool(value) and all(" " <= ch <= "~" and ch != "=" for ch in value)


def _is_iana_svc_name(value: str) -> bool:
    return (
        len(value) <= 15
        and _IANA_SVC_NAME_RE.match(value) is not None
        and "--" not in value
        and _IANA_HAS_LETTER_RE.search(value) is not None
    )


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _key(value: Any) -> str:
    """A map key for a field path: as written, cut to a readable length."""
    text = str(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _short(value: Any) -> str:
    """`value` for a message: repr, cut to a readable length."""
    if is_int(value) and value.bit_length() > 128:
        return f"a {value.bit_length()}-bit number"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


LABEL_HELP = (
    "is not a DNS-1123 label (at most 63 lowercase letters, digits or '-', "
    "starting and ending with a letter or digit)"
)
SUBDOMAIN_HELP = (
    "is not a DNS-1123 subdomain (at most 253 lowercase letters, digits, '-' or '.', "
    "each part starting and ending with a letter or digit)"
)
QUALIFIED_HELP = (
    "key is not a qualified name (an optional DNS subdomain prefix and '/', then at most "
    "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
)
LABEL_VALUE_HELP = (
    "is not a valid label value (at most 63 letters, digits, '-', '_' or '.', "
    "starting and ending with a letter or digit)"
)
PORT_NAME_HELP = (
    "is not a valid port name (at most 15 lowercase letters, digits or '-', with at "
    "least one letter, no '--', not starting or ending with '-')"
)
ENV_NAME_HELP = "is not a valid environment variable name (printable ASCII other than '=')"
DESCENDING_HELP = "must be a relative path without '..' elements"
NON_RESERVED_HELP = "must be a relative path without '..' elements, not starting with '..'"
