"""The runtime handler of a pod's sandbox (klet.syncloop.pods.runtimeclass): "" without
a class; the class's handler; a class that is missing, unreadable or has no handler,
and a lookup without an apiserver, each an error naming the class."""

from __future__ import annotations

import pytest
from klet.model.types import JSON
from klet.syncloop.environment.kubeobjects import ObjectUnavailable
from klet.syncloop.pods.runtimeclass import RuntimeClassError, runtime_handler


class Classes:
    def __init__(self, **known: JSON) -> None:
        self.known = known
        self.asked: list[str] = []

    async def get_runtime_class(self, name: str) -> JSON | None:
        self.asked.append(name)
        if name == "broken":
            raise ObjectUnavailable('runtimeclasses.node.k8s.io "broken" is forbidden')
        return self.known.get(name)


def pod(runtime_class: str | None) -> JSON:
    spec: JSON = {"containers": [{"name": "c"}]}
    if runtime_class is not None:
        spec["runtimeClassName"] = runtime_class
    return {"metadata": {"name": "p"}, "spec": spec}


async def test_no_class_is_the_default_handler_and_asks_nothing() -> None:
    classes = Classes()
    assert await runtime_handler(pod(None), classes) == ""
    assert await runtime_handler(pod(""), classes) == ""
    assert await runtime_handler(pod(None), None) == ""
    assert classes.asked == []


async def test_the_class_names_the_handler() -> None:
    classes = Classes(gvisor={"metadata": {"name": "gvisor"}, "handler": "runsc"})
    assert await runtime_handler(pod("gvisor"), classes) == "runsc"


@pytest.mark.parametrize(
    ("name", "classes", "message"),
    [
        ("gone", Classes(), 'runtimeclasses.node.k8s.io "gone" not found'),
        ("broken", Classes(), 'failed to get RuntimeClass "broken": runtimeclasses.node'),
        ("empty", Classes(empty={"metadata": {"name": "empty"}}), '"empty" has no handler'),
        ("any", None, 'RuntimeClass "any" cannot be looked up: this node has no API server'),
    ],
)
async def test_what_cannot_be_resolved_is_an_error_naming_the_class(
    name: str, classes: Classes | None, message: str
) -> None:
    with pytest.raises(RuntimeClassError, match=message.replace(".", r"\.")):
        await runtime_handler(pod(name), classes)
