"""The runtime handler a pod's sandbox runs under: its RuntimeClass's `handler`.

A pod without `runtimeClassName` (or with an empty one) runs on the runtime's default
handler (""), as upstream. Otherwise the RuntimeClass is read from the apiserver when
the sandbox is about to be created (through `ApiObjects`, whose short cache spares a
pod's retries the round trip); a class that does not exist, or cannot be read, fails
the sandbox creation with a message naming it, and the pod waits in
ContainerCreating and is retried, as upstream's kubelet does. A handler the runtime
does not have is the runtime's refusal of RunPodSandbox, reported the same way.

Standalone (no apiserver), a pod that names a RuntimeClass is refused at admission
(admission/admit.py) instead of running on the default handler.

The class's `overhead` is not read here: the apiserver's RuntimeClass admission copies
it into the pod's `spec.overhead` at creation, which the pod cgroup and admission count.
"""

from __future__ import annotations

from typing import Protocol

from klet.model.types import JSON
from klet.syncloop.environment.kubeobjects import ObjectUnavailable


class RuntimeClasses(Protocol):
    async def get_runtime_class(self, name: str) -> JSON | None:
        """The RuntimeClass, or None when it does not exist; raises
        `ObjectUnavailable` when it cannot be read."""
        ...


class RuntimeClassError(Exception):
    """The pod's RuntimeClass could not be resolved to a handler."""


async def runtime_handler(pod: JSON, classes: RuntimeClasses | None) -> str:
    """The handler for `pod`'s sandbox ("" is the runtime's default)."""
    name = str((pod.get("spec") or {}).get("runtimeClassName") or "")
    if not name:
        return ""
    if classes is None:
        raise RuntimeClassError(
            f'RuntimeClass "{name}" cannot be looked up: this node has no API server'
        )
    try:
        found = await classes.get_runtime_class(name)
    except ObjectUnavailable as err:
        raise RuntimeClassError(f'failed to get RuntimeClass "{name}": {err}') from err
    if found is None:
        raise RuntimeClassError(f'runtimeclasses.node.k8s.io "{name}" not found')
    handler = found.get("handler")
    if not isinstance(handler, str) or not handler:
        raise RuntimeClassError(f'RuntimeClass "{name}" has no handler')
    return handler
