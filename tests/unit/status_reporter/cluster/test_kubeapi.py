"""KubeApi's retry policy (cluster/kubeapi.py) as the apiserver client's metrics see it.

Covers: an `Unavailable` answer is retried up to the policy's attempts, each call made
inside its attempt number (1, 2, 3), while another error (NotFound) goes to the caller
after one attempt; over the real KubeClient (its REST client answering 503, 503, then
200), RestClientMetrics on a fresh registry counts three requests and two retries,
each by its own answer's code (client-go's rest_client_request_retries_total counts
attempts 2..n so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.kube import KubeSettings, NotFound, Unavailable
from klet.kube.observing import attempt_number
from klet.obs.restclient import RestClientMetrics
from klet.status_reporter.cluster.kubeapi import KubeApi, RetryPolicy
from prometheus_client import CollectorRegistry

from tests.unit.test_kube_tokens import kubeconfig

NOW = RetryPolicy(attempts=3, initial_s=0.0, max_s=0.0)


class Numbered:
    """A Kube whose GETs note the attempt they were made as, failing with `errors` first."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.attempts: list[int] = []

    async def get(self, path: str, **params: Any) -> Any:
        self.attempts.append(attempt_number())
        if self.errors:
            raise self.errors.pop(0)
        return {"metadata": {"name": path.rsplit("/", 1)[-1]}}

    async def create(self, path: str, body: Any) -> Any:
        raise AssertionError("not used")

    async def replace(self, path: str, body: Any) -> Any:
        raise AssertionError("not used")

    async def patch(self, path: str, body: Any, *, kind: str = "strategic") -> Any:
        raise AssertionError("not used")

    async def delete(self, path: str, body: Any = None) -> Any:
        raise AssertionError("not used")


async def test_each_attempt_of_a_retried_call_is_numbered() -> None:
    kube = Numbered([Unavailable("down"), Unavailable("down")])
    node = await KubeApi(kube, retry=NOW).get_node("n1")
    assert node["metadata"]["name"] == "n1"
    assert kube.attempts == [1, 2, 3]
    assert attempt_number() == 1  # the number ends with the call

    answered = Numbered([NotFound("gone", status=404)])
    with pytest.raises(NotFound):
        await KubeApi(answered, retry=NOW).get_node("n1")
    assert answered.attempts == [1]


class Answer:
    def __init__(self, status: int) -> None:
        self.status = status

    def read(self) -> bytes:
        return b'{"kind":"Node"}' if self.status == 200 else b'{"kind":"Status"}'


async def test_retries_reach_rest_client_request_retries_total(tmp_path: Path) -> None:
    from klet.kube.client import KubeClient

    registry = CollectorRegistry()
    client = KubeClient(
        KubeSettings(kubeconfig=kubeconfig(tmp_path, {"token": "t"})),
        observer=RestClientMetrics(registry),
    )
    answers = [Answer(503), Answer(503), Answer(200)]

    def request(method: str, url: str, **_: Any) -> Answer:
        return answers.pop(0)

    client._rest.request = request  # type: ignore[method-assign,assignment]
    host = client.host.split("://", 1)[1]
    try:
        assert await KubeApi(client, retry=NOW).get_node("n1") == {"kind": "Node"}
    finally:
        await client.close()

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"host": host, **labels})

    assert sample("rest_client_requests_total", code="503", method="GET") == 2
    assert sample("rest_client_requests_total", code="200", method="GET") == 1
    assert sample("rest_client_request_retries_total", code="503", verb="GET") == 1
    assert sample("rest_client_request_retries_total", code="200", verb="GET") == 1
