"""Authorization attributes of a kubelet API request, as upstream's kubelet computes them.

Pure functions (STYLE rule 4), table-tested. Every request is authorized as an action on
the `nodes` resource named after this node, in the core group, version v1:

- the verb comes from the HTTP method: POST create, GET get, PUT update, PATCH patch,
  DELETE delete; any other method has the empty verb (which no RBAC rule grants);
- except on `/exec`, `/attach`, `/portForward` and `/run`, which are `create` whatever
  the method. Stricter than upstream, which authorizes a WebSocket exec, attach or
  port-forward (an upgraded GET) as `get`: there, a role that may only read
  `nodes/proxy` (for logs or metrics) can run commands in every container of the node.
  A user who execs through the apiserver is unaffected (the apiserver's own
  identity calls the kubelet); one who calls 10250 directly needs `create`;
- the subresource comes from the path: `/stats/...` stats, `/metrics...` metrics,
  `/logs/...` log, `/checkpoint/...` checkpoint, anything else proxy (so exec, attach,
  portForward, run and containerLogs all need `nodes/proxy`);
- with the KubeletFineGrainedAuthz feature gate (beta, on by default since 1.33)
  `/pods` and `/runningpods/` are first tried as `pods`, `/healthz` as `healthz` and
  `/configz` as `configz`, and fall back to `proxy`: a request is allowed when any of
  the attribute sets is.

Path matching is upstream's "is subpath": the path equals the prefix or continues it
with a "/", so `/metricsfoo` is `proxy`, not `metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

_VERBS = {"POST": "create", "GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
# Paths that run something in a container or open a stream into it: `create` always.
_ACTING = ("/exec", "/attach", "/portForward", "/run")

_FINE_GRAINED = (
    ("/pods", "pods"),
    ("/healthz", "healthz"),
    ("/configz", "configz"),
    ("/runningpods/", "pods"),
)
_COARSE = (
    ("/stats/", "stats"),
    ("/metrics", "metrics"),
    ("/logs/", "log"),
    ("/checkpoint/", "checkpoint"),
)


@dataclass(frozen=True)
class User:
    """An authenticated identity (upstream's user.Info)."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True)
class Attributes:
    """One authorization question: may `user` do `verb` on nodes/`subresource` `name`?"""

    user: User
    verb: str
    subresource: str
    name: str
    path: str
    resource: str = "nodes"
    api_version: str = "v1"


def verb_for(method: str, path: str = "") -> str:
    """The verb of a request: `create` on the acting paths, else by the method."""
    if any(is_subpath(path, prefix) for prefix in _ACTING):
        return "create"
    return _VERBS.get(method.upper(), "")


def is_subpath(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/")
    return path == prefix or (
        path.startswith(prefix) and path[len(prefix) : len(prefix) + 1] == "/"
    )


def subresources_for(path: str, *, fine_grained: bool = True) -> tuple[str, ...]:
    """The subresources to try, in order, for a request path."""
    found: list[str] = []
    if fine_grained:
        for prefix, sub in _FINE_GRAINED:
            if is_subpath(path, prefix):
                found.append(sub)
                break
    for prefix, sub in _COARSE:
        if is_subpath(path, prefix):
            found.append(sub)
            break
    else:
        found.append("proxy")
    return tuple(found)


def request_attributes(
    user: User, method: str, path: str, *, node_name: str, fine_grained: bool = True
) -> list[Attributes]:
    """The attribute sets of one request; allowed when any one of them is."""
    verb = verb_for(method, path)
    return [
        Attributes(user=user, verb=verb, subresource=sub, name=node_name, path=path)
        for sub in subresources_for(path, fine_grained=fine_grained)
    ]


def forbidden_message(attrs: list[Attributes]) -> str:
    """The 403 body, worded as upstream's (Go's %v of the subresource list)."""
    first = attrs[0]
    subs = " ".join(a.subresource for a in attrs)
    return (
        f"Forbidden (user={first.user.name}, verb={first.verb}, resource={first.resource}, "
        f"subresource(s)=[{subs}])\n"
    )


def authorization_error_message(attrs: Attributes) -> str:
    """The 500 body when the authorizer itself failed."""
    return (
        f"Authorization error (user={attrs.user.name}, verb={attrs.verb}, "
        f"resource={attrs.resource}, subresource={attrs.subresource})"
    )
