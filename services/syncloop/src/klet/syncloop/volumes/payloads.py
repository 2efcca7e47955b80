"""What the content volumes hold, as pure functions of the pod and the objects read.

configMap, secret and downwardAPI volumes, and the sources of a projected volume, each
become a payload (path → bytes and mode) that `atomic.write` puts on disk. The rules
and messages are upstream's:

- configMap/secret without `items`: every key (a ConfigMap's `data` and `binaryData`)
  becomes a file of that name with `defaultMode`; with `items`, only the listed keys,
  each at its `path` with its own `mode` or `defaultMode`. A listed key that the object
  lacks is an error (`configmap references non-existent config key: k`, `references
  non-existent secret key: k`) unless the source is `optional`; an absent object is an
  error too (the caller's, `configmap "x" not found`) unless optional, and then the
  volume is empty.
- downwardAPI: `fieldRef` of metadata.name/namespace/uid, labels, annotations (the whole
  maps as sorted `key="value"` lines) or one label/annotation; `resourceFieldRef` of a
  named container's limits/requests (an unset limit is the node's capacity). The field
  lookups are the environment's own (`envvars`), shared rather than repeated.
- modes: `defaultMode` defaults to 0644 (the API's default, for static pods that were
  never defaulted); a service-account token gets 0600 when the pod sets fsGroup or a
  common runAsUser (upstream then widens it to 0640 for the group, and makes the user
  its owner).

Values in the API are base64 (Secret `data`, ConfigMap `binaryData`); files get the
decoded bytes.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Any

from klet.model.types import JSON
from klet.syncloop.environment import envvars
from klet.syncloop.volumes import emptydir
from klet.syncloop.volumes.atomic import FileProjection
from klet.syncloop.volumes.base import VolumeError

DEFAULT_MODE = 0o644
DEFAULT_TOKEN_EXPIRATION_S = 3600
TOKEN_MODE_WITH_OWNER = 0o600

# The only fieldPaths the API accepts in a downwardAPI volume (besides keyed
# labels/annotations); status and spec fields are for the environment only.
VOLUME_FIELD_PATHS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "metadata.labels",
        "metadata.annotations",
    }
)


def aggregate(messages: list[str]) -> str:
    """Several errors in one message, as upstream's error aggregate prints them."""
    return messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"


def mode_of(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


def _decode(value: Any) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        return str(value).encode()


def configmap_files(configmap: JSON) -> dict[str, bytes]:
    """Every key of a ConfigMap: `data` as UTF-8, `binaryData` decoded."""
    files = {str(k): str(v).encode() for k, v in (configmap.get("data") or {}).items()}
    for k, v in (configmap.get("binaryData") or {}).items():
        files[str(k)] = _decode(v)
    return files


def secret_files(secret: JSON) -> dict[str, bytes]:
    """Every key of a Secret, decoded."""
    return {str(k): _decode(v) for k, v in (secret.get("data") or {}).items()}


def keyed_payload(
    files: dict[str, bytes] | None,
    *,
    items: Iterable[JSON] | None,
    default_mode: int,
    optional: bool,
    missing_key: str,
) -> dict[str, FileProjection]:
    """The payload of a configMap or secret source.

    `files` is the object's keys (None: the object is absent and the source optional,
    so nothing is projected); `missing_key` is the message prefix for an item whose key
    the object lacks.
    """
    payload: dict[str, FileProjection] = {}
    if files is None:
        return payload
    items = list(items or [])
    if not items:
        for key, data in files.items():
            payload[key] = FileProjection(data, default_mode)
        return payload
    for item in items:
        key = str(item.get("key", ""))
        if key not in files:
            if optional:
                continue
            raise VolumeError(f"{missing_key}: {key}")
        payload[str(item.get("path", ""))] = FileProjection(
            files[key], mode_of(item.get("mode"), default_mode)
        )
    return payload


def configmap_payload(
    configmap: JSON | None, source: JSON, *, default_mode: int
) -> dict[str, FileProjection]:
    return keyed_payload(
        None if configmap is None else configmap_files(configmap),
        items=source.get("items"),
        default_mode=default_mode,
        optional=bool(source.get("optional")),
        missing_key="configmap references non-existent config key",
    )


def secret_payload(
    secret: JSON | None, source: JSON, *, default_mode: int
) -> dict[str, FileProjection]:
    return keyed_payload(
        None if secret is None else secret_files(secret),
        items=source.get("items"),
        default_mode=default_mode,
        optional=bool(source.get("optional")),
        missing_key="references non-existent secret key",
    )


def _container(pod: JSON, name: str) -> JSON | None:
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if c.get("name") == name:
            return dict(c)
    return None


def _sort_lines(value: str) -> str:
    return "\n".join(sorted(value.split("\n")))


def downward_payload(
    items: Iterable[JSON], pod: JSON, *, node: envvars.NodeFacts, default_mode: int
) -> dict[str, FileProjection]:
    """The files of a downwardAPI volume or source; `VolumeError` lists every field
    that could not be read."""
    payload: dict[str, FileProjection] = {}
    errors: list[str] = []
    for item in items:
        path = str(item.get("path", ""))
        mode = mode_of(item.get("mode"), default_mode)
        value: str | None = None
        if item.get("fieldRef") is not None:
            field_path = str(item["fieldRef"].get("fieldPath", ""))
            if field_path in VOLUME_FIELD_PATHS or field_path.startswith(
                ("metadata.labels[", "metadata.annotations[")
            ):
                value = envvars.field_ref(pod, field_path, pod_ips=(), node=node)
            if value is None:
                errors.append(f"unsupported fieldPath: {field_path}")
                continue
        elif item.get("resourceFieldRef") is not None:
            ref = item["resourceFieldRef"]
            container_name = str(ref.get("containerName", ""))
            container = _container(pod, container_name)
            if container is None:
                errors.append(f"container {container_name} not found")
                continue
            value = envvars.resource_field_ref(container, ref, node, pod=pod)
            if value is None:
                errors.append(f"unsupported container resource : {ref.get('resource', '')}")
                continue
        payload[path] = FileProjection(_sort_lines(value or "").encode(), mode)
    if errors:
        raise VolumeError(aggregate(errors))
    return payload


def fs_user(pod: JSON) -> int | None:
    """The user every container runs as, when they all name the same one (upstream's
    FsUserFrom); None when one of them leaves it to the image or two differ."""
    spec = pod.get("spec") or {}
    pod_user = (spec.get("securityContext") or {}).get("runAsUser")
    found: int | None = None
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        user = (c.get("securityContext") or {}).get("runAsUser", pod_user)
        if not isinstance(user, int) or (found is not None and found != user):
            return None
        found = user
    return found


def token_mode(pod: JSON, default_mode: int) -> int:
    if emptydir.fs_group(pod) is not None or fs_user(pod) is not None:
        return TOKEN_MODE_WITH_OWNER
    return default_mode
